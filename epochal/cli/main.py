"""The `epochal` command: status, query, changes, produce, recover, compact, pause, resume, backfill, settings,
validate, spark.

Every command exits non-zero with one clear line on bad input; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from epochal.cli.status_view import splits_shown, status_lines, with_epoch_times
from epochal.errors import EpochalError

EXIT_USAGE = 2
EXIT_ERROR = 1


def _runtime():  # noqa: ANN202 - imported lazily so `epochal --help` stays instant
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings
    from epochal.spark.attach import session_for

    settings = Settings.from_env()
    pipeline = load_pipeline(settings.pipeline_dir)

    def spark():  # noqa: ANN202 - only `produce`/`query` never need it
        return session_for(settings, "epochal-cli")

    return EpochRuntime(settings, pipeline, spark)


def cmd_status(args: argparse.Namespace) -> int:
    from epochal.incremental.state_needs import sources_storing_nothing
    from epochal.redaction import redact_url

    runtime = _runtime()
    status = runtime.controller.status()
    # CREATE SOURCEs no view reads as state: their rows are read back from their connectors
    status["sources_storing_nothing"] = sorted(sources_storing_nothing(runtime.pipeline))
    # The store's URL may carry a password (user:pw@ or ?password=): never print it.
    status["meta_store"] = redact_url(str(status.get("meta_store", "")))
    # every source, with none as zero: the dead letters of its committed epochs
    found = status.get("dead_letters", {})
    status["dead_letters"] = {
        source: found.get(source, {"records": 0, "epochs": 0, "last_epoch": None})
        for source in runtime.pipeline.sources
    }
    from epochal.runtime.cdc_status import cdc_status

    status["cdc"] = cdc_status(runtime)  # per postgres-cdc source: its slot's and server's LSNs, lag
    with_epoch_times(status)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    print("\n".join(status_lines(status)))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from epochal.query.cut import run_query

    columns, rows, epoch = run_query(_runtime(), args.sql, args.as_of)
    _print_rows(args.format, columns, rows, f"at committed epoch {epoch}")
    return 0


def cmd_changes(args: argparse.Namespace) -> int:
    from epochal.query.changes import table_changes

    change = table_changes(_runtime(), args.table, args.start, args.end)
    where = f"of {change.table} from epoch {change.start} to {change.end}"
    _print_rows(args.format, change.columns, change.rows, where)
    return 0


def _print_rows(format: str, columns: list[str], rows: list[tuple], where: str) -> None:
    out = sys.stdout
    if format == "json":
        json.dump([dict(zip(columns, r, strict=True)) for r in rows], out, default=str, indent=None)
        out.write("\n")
    elif format == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        cells = [[("NULL" if v is None else str(v)) for v in r] for r in rows]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for r in cells:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''} {where})", file=sys.stderr)


def cmd_produce(args: argparse.Namespace) -> int:
    from epochal.connectors.log import append_records, check_records, parse_log_options, record_lines
    from epochal.pipeline.loader import load_pipeline
    from epochal.settings import Settings

    settings = Settings.from_env()
    pipeline = load_pipeline(settings.pipeline_dir)
    source = pipeline.sources.get(args.source.lower())
    if source is None or source.connector != "log":
        logs = [n for n, s in pipeline.sources.items() if s.connector == "log"]
        raise EpochalError(
            f"{args.source} is not a log source of this pipeline: produce appends to connector = 'log' sources "
            f"({', '.join(logs) or 'there are none'})"
        )
    config, problems = parse_log_options(source.options, settings.home)
    if config is None:  # the loader already validated the options; this guards direct use
        raise EpochalError("; ".join(problems))
    directory = config.directory
    # bytes, split on \n only, as the reader splits: str.splitlines() also split at U+2028 and
    # friends, which JSON allows inside a string, and made one record two dead letters
    if args.file and args.file != "-":
        try:
            with open(args.file, "rb") as fh:
                lines = record_lines(fh.read(), args.file)
        except OSError as exc:
            raise EpochalError(f"cannot read {args.file}: {exc.strerror}") from None
    else:
        lines = record_lines(sys.stdin.buffer.read(), "standard input")
    spelled = {c.name: c.key for c in source.columns}
    keys = [spelled[k] for k in source.primary_key]
    check_records(lines, source.options.get("format", "json"), keys)  # a bad record refuses the batch
    count = append_records(directory, lines, args.split)
    print(f"appended {count} record(s) to {source.name} split {args.split or '0'} ({directory})")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    report = _runtime().recover("ad-hoc (epochal recover)")
    print(
        f"recovered to committed epoch {report.committed_epoch}: aborted {report.aborted or 'nothing'}, "
        f"discarded {len(report.discarded_locations)} location(s) in {report.seconds:.2f}s"
        + ("; injection is paused" if report.paused else "")
    )
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    runtime = _runtime()
    tables = None
    if args.table:
        # names are case-insensitive, as in Spark; the loader keeps them lowercased
        args.table = {t.lower(): t for t in runtime.pipeline.tables}.get(args.table.lower(), args.table)
        if args.table not in runtime.pipeline.tables:
            raise EpochalError(f"{args.table} is not a table of this pipeline ({', '.join(runtime.pipeline.tables)})")
        tables = [args.table]
    # Asked for explicitly: every table with any committed change after its snapshot, not only those
    # past EPOCHAL_COMPACT_EVERY.
    report = runtime.compact(tables=tables, every=1)
    for key, value in report.metadata.items():
        print(f"{key:<28} {value}")
    failures = report.metadata["failures"]
    if failures != "none":
        raise EpochalError(f"compaction failed: {failures}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    controller = _runtime().controller
    if args.on_next_start:
        controller.set_pause_on_next_start(True)
        print("injection will pause at the next start (recovery); `epochal resume` undoes it")
    else:
        controller.pause()
        print("injection paused: in-flight epochs finish, no new ones start; `epochal resume` to go on")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    controller = _runtime().controller
    controller.resume()
    controller.set_pause_on_next_start(False)
    print("injection resumed")
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    from epochal.settings import settings_markdown, settings_text

    print(settings_markdown() if args.markdown else settings_text())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from epochal.pipeline.loader import load_pipeline
    from epochal.settings import Settings

    settings = Settings.from_env()
    started = time.time()
    pipeline = load_pipeline(settings.pipeline_dir)
    print(f"{settings.pipeline_dir}: ok in {time.time() - started:.2f}s")
    if not args.no_spark:
        # Every plan analysed by Spark over empty inputs (no job), as a run's first step does; a
        # pass is remembered in EPOCHAL_HOME, so that run does not analyse again.
        from epochal.incremental.analysis import check_pipeline
        from epochal.spark.attach import session_for

        def spark():  # noqa: ANN202
            return session_for(settings, "epochal-validate")

        seconds = check_pipeline(spark, pipeline, home=settings.home)
        analysed = "analysed before (same plans)" if seconds is None else f"analysed by Spark in {seconds:.2f}s"
        print(f"  plans: {analysed}")
    for name, s in pipeline.sources.items():
        print(f"  {s.kind:<6} {name} ({s.connector}) {s.location}")  # table or source, as declared
    for name in pipeline.view_order():
        print(f"  view   {name} <- {', '.join(pipeline.views[name].upstreams)} {pipeline.views[name].location}")
    for name, s in pipeline.sinks.items():
        print(f"  sink   {name} <- {s.from_table} ({s.connector}) {s.location}")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    runtime = _runtime()
    controller = runtime.controller
    if args.view is None:
        shown = controller.backfill_status()
        if args.json:
            print(json.dumps(shown, indent=2, default=str))
        elif not shown:
            print("no backfill: a view backfills when it is added to a pipeline that has committed epochs")
        for view, b in shown.items() if not args.json else ():
            print(
                f"{view:<28} {b['phase']:<9} vnodes {b['vnodes_done']}/{b['vnodes_total']}  rows {b['rows']}  "
                f"epochs behind {b['epochs_behind'] if b['epochs_behind'] is not None else '-'}"
                + splits_shown(b)
                + (f"  rate limit {b['rate_limit']:g}/s" if b["rate_limit"] is not None else "")
                + (f"  last error: {b['error']}" if b["error"] else "")
                + (f"  stages: {', '.join(f'{s} {p}' for s, p in b['stages'].items())}" if b.get("stages") else "")
            )
        return 0
    if args.view not in runtime.pipeline.views:
        raise EpochalError(f"{args.view} is not a view of the pipeline (views: {', '.join(runtime.pipeline.views)})")
    from epochal.checkpoint.statements import rebuilds

    rebuild = controller.rebuild(args.view)
    # A changed view's new statement backfills under its shadow name: the commands act on that.
    target = rebuild.shadow if rebuild is not None and rebuild.state is rebuilds.RebuildState.SERVING_OLD else None
    if args.cancel and target is not None:
        raise EpochalError(
            f"{args.view} is being rebuilt from its changed statement while its old rows serve; a rebuild is not "
            "cancelled, the statement decides: put the old statement back (the rebuild then switches to the same "
            f"rows), or pause it with `epochal backfill {args.view} --rate-limit 0`"
        )
    if args.cancel:
        backfill, garbage = controller.cancel_backfill(args.view)
        runtime.warehouse.delete(garbage, prune_parents=True)
        runtime.warehouse.delete([runtime.warehouse.backfill_root(args.view, backfill.snapshot_epoch)])
        print(f"cancelled the backfill of {args.view}; its partial state is deleted. `--restart` starts it again")
        return 0
    if args.rebuild:
        pipeline = runtime.pipeline
        # The view with the planner's internal stages of it: they change with it.
        targets = [args.view, *(v for v, d in pipeline.views.items() if d.internal_of == args.view)]
        readers = [v for v, d in pipeline.views.items() if v not in targets and set(targets) & set(d.upstreams)]
        readers += [s for s, d in pipeline.sinks.items() if d.from_table in targets]
        for target in targets:
            garbage = controller.rebuild_backfill(target, readers)
            runtime.warehouse.delete(garbage, prune_parents=True)
        print(f"{args.view} is rebuilt from its current statement, by a backfill that starts at the next epoch")
        return 0
    if args.restart:
        before = controller.backfill(target or args.view)
        garbage = controller.restart_backfill(target or args.view)
        runtime.warehouse.delete(garbage, prune_parents=True)
        if before is not None:  # with what no row names: ranges and source chunks of an unpublished snapshot
            runtime.warehouse.delete([runtime.warehouse.backfill_root(before.view, before.snapshot_epoch)])
        print(f"the backfill of {args.view} starts again from a new snapshot at the next epoch")
        return 0
    if args.rate_limit is not None:
        rate = None if args.rate_limit.lower() in ("", "none") else float(args.rate_limit)
        controller.set_backfill_rate_limit(target or args.view, rate)
        print(f"backfill rate limit of {args.view}: {args.rate_limit} rows/s (0 pauses)")
    if args.run:
        from epochal.backfill.runner import BackfillRunner

        for progress in BackfillRunner(runtime).advance(views=[args.view]):
            print(json.dumps(progress.metadata(), default=str))
    b = controller.backfill_status().get(args.view)
    if b is None:
        print(f"{args.view} has no backfill")
    elif args.rate_limit is None and not args.run:
        print(json.dumps({args.view: b}, indent=2, default=str))
    return 0


def _rate(text: str) -> str:
    if text.lower() in ("", "none"):
        return text
    try:
        if float(text) < 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not rows per second (a number >= 0; 0 pauses, none: unlimited)"
        ) from None
    return text


def cmd_spark(args: argparse.Namespace) -> int:
    from epochal.settings import Settings
    from epochal.spark import server as spark_server

    settings = Settings.from_env()
    if args.action == "start":
        current, started = spark_server.start(spark_server.ServerConfig.from_settings(settings))
        verb = "started" if started else "already running:"
        used = "runs use it" if settings.spark_mode == "server" else "runs use it with EPOCHAL_SPARK_MODE=server"
        print(f"Spark server {verb} {current.url} (pid {current.pid}); {used}", flush=True)
        epochs = settings.spark_warmup_epochs if args.warm_up is None else args.warm_up
        if started and epochs > 0 and not settings.spark_master.startswith("local"):
            # a cluster's executors could not read a scratch home on this machine
            print(
                f"Spark server not warmed up: EPOCHAL_SPARK_MASTER={settings.spark_master} is not local",
                file=sys.stderr,
            )
        elif started and epochs > 0:
            from epochal.runtime.one_epoch import demo_epochs
            from epochal.spark.warmup import warm_up

            try:
                report = warm_up(
                    current.connect_url,
                    epochs,
                    demo_epochs,
                    current.pid,
                    progress=lambda line: print(line, flush=True),
                    conf=settings.spark_conf,
                )
            except Exception as exc:  # speed only: the server is up and serves runs all the same
                print(
                    f"Spark server not warmed up ({type(exc).__name__}: {exc}); it runs and serves runs cold",
                    file=sys.stderr,
                )
            else:
                print(f"Spark server {report.describe()}")
        return 0
    if args.action == "stop":
        stopped = spark_server.stop(settings.home)
        print("no Spark server was running" if stopped is None else f"stopped the Spark server (pid {stopped.pid})")
        return 0
    current = spark_server.status(settings.home)
    if args.json:
        print(json.dumps(None if current is None else current.to_json(), indent=2))
    else:
        print(spark_server.describe(current))
    # scripts can test health by the exit code: 0 healthy, 1 not running or not healthy
    return 0 if current is not None and current.healthy else EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochal", description="Epochs, barriers and checkpoints on Dagster + Spark.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="committed epoch, in-flight epochs, tables, pause, last recovery")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("query", help="read-only SQL (DuckDB) over every table at the committed epoch")
    p.add_argument("sql")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument(
        "--as-of",
        metavar="EPOCH|TIMESTAMP",
        help="read every table at this committed epoch, or the last one at or before an ISO timestamp "
        "(inside EPOCHAL_TIME_TRAVEL_S)",
    )
    p.set_defaults(fn=cmd_query)
    p = sub.add_parser("changes", help="net change of a table between two retained epochs (op: insert/delete)")
    p.add_argument("table")
    p.add_argument("--from", dest="start", required=True, metavar="EPOCH|TIMESTAMP", help="excluded")
    p.add_argument("--to", dest="end", metavar="EPOCH|TIMESTAMP", help="included (default: the committed epoch)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(fn=cmd_changes)
    p = sub.add_parser("produce", help="append JSON Lines records to a log source (from --file or stdin)")
    p.add_argument("source")
    p.add_argument("--file", "-f", help="file of JSON lines; '-' or absent: stdin")
    p.add_argument("--split", help="split to append to (default 0)")
    p.set_defaults(fn=cmd_produce)
    p = sub.add_parser("recover", help="ad-hoc recovery: abort in-flight epochs, back to the committed epoch")
    p.set_defaults(fn=cmd_recover)
    p = sub.add_parser("compact", help="snapshot tables' committed state now and delete change files no one needs")
    p.add_argument("--table", help="only this table (default: every table with changes after its snapshot)")
    p.set_defaults(fn=cmd_compact)
    p = sub.add_parser("pause", help="stop injecting new epochs")
    p.add_argument("--on-next-start", action="store_true", help="pause when the next recovery (start) happens")
    p.set_defaults(fn=cmd_pause)
    p = sub.add_parser("resume", help="inject epochs again")
    p.set_defaults(fn=cmd_resume)
    p = sub.add_parser("backfill", help="backfills of views added to a running pipeline: progress and control")
    p.add_argument("view", nargs="?", help="the view (default: list every backfill)")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--rate-limit", type=_rate, help="rows per second while it runs (0 pauses, none: unlimited)")
    action.add_argument("--cancel", action="store_true", help="stop it and delete its partial state")
    action.add_argument("--restart", action="store_true", help="forget it; the next epoch starts it again")
    action.add_argument(
        "--rebuild", action="store_true", help="a joined view whose statement changed: backfill it again in place"
    )
    p.add_argument("--run", action="store_true", help="advance it now, in this process (as backfill_job does)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_backfill)
    p = sub.add_parser("settings", help="list the EPOCHAL_* settings: variable, default, meaning")
    p.add_argument("--markdown", action="store_true", help="print the settings table of docs/reference.md")
    p.set_defaults(fn=cmd_settings)
    p = sub.add_parser("validate", help="load the pipeline and report every error, without running anything")
    p.add_argument("--no-spark", action="store_true", help="check with sqlglot only: no JVM, plans not analysed")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("spark", help="the local Spark server that runs attach to: start, stop, status")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.add_argument(
        "--warm-up",
        type=int,
        metavar="EPOCHS",
        default=None,
        help="start: epochs of the demo run against a new server first (default EPOCHAL_SPARK_WARMUP_EPOCHS; 0: none)",
    )
    p.set_defaults(fn=cmd_spark)
    from epochal.cli.checks_cmd import add_parser as add_checks_parser

    add_checks_parser(sub, _runtime)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except EpochalError as exc:
        print(f"epochal: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`epochal query ... | head`): as any Unix tool, stop without a trace
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
