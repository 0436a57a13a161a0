"""Backfill benchmark (issue 15): a new grouped aggregation over a table with history, against plain
Spark doing the same work, and live epochs while a backfill runs, against the same epochs without.

    python benchmarks/bench_backfill.py                 # 10M rows
    python benchmarks/bench_backfill.py --rows 1000000  # smoke run
    python benchmarks/bench_backfill.py --kind source   # t is a CREATE SOURCE: read per split

1. Snapshot backfill. t(id, k, v, note) of --rows rows is ingested by Epochal (one epoch) and
   compacted into a vnode snapshot. A view `agg` (GROUP BY k: count, sum, min, max) is added and
   backfilled (snapshot phase, log-store phase, join) by the BackfillRunner in this process, on one
   warm SparkSession. Baseline, in the same run: Spark reads the same snapshot files, aggregates
   the same way and writes Parquet. Target: Epochal's rows per second at least 0.5x Spark's.
   With ``--kind source`` t is a CREATE SOURCE, whose history is its connector's: the backfill
   reads it split by split from the JSON log, and the baseline reads the same JSON files.
2. Live epochs during a backfill. Epochs of --change new rows through the existing views (`big`,
   a filter, and `agg`), timed alone, then while backfills of --backfills new views run one after
   another in another thread (the way a backfill_job run shares the machine with epoch runs); only
   epochs that ended before the backfills did count, unless none did. Target: at most 1.5x.
   An epoch's time is that of the views it had alone (a backfilled view that joined makes every
   later epoch do more; it is not timed), after --warmup untimed epochs per arm.
   Epochs run back to back (a pipeline catching up), or one every ``--interval`` seconds as the
   barrier sensor starts them (EPOCHAL_BARRIER_INTERVAL_MS, 10 s by default).
   ``--arms default,pool-only,neither`` measures it with Epochal's defaults (backfills in their
   own Spark pool, and waiting for live epochs in flight before each range), with the pool only,
   and with neither (how backfills shared Spark before), each against its own epochs alone.
   ``--spark server`` runs everything on Epochal's Spark Connect server, each backfill as an
   `epochal backfill VIEW --run` process of its own: the way runs share a machine by default
   (``local``, one process and one in-process Spark, also shares Python's GIL).

Ratios only: the machine is shared and noisy, so both sides are measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness
from harness import log
from inprocess import epoch, runtime_for, write_rows

AGG = "SELECT k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM t GROUP BY k"
SECOND = "SELECT k, count(*) AS n FROM t WHERE v > 500000 GROUP BY k"
#: part 2's arms: Epochal's defaults (backfills in their own Spark pool, waiting for live epochs in
#: flight between ranges), the pool alone, and neither (how backfills shared Spark before)
ARMS = {
    "default": {},
    "pool-only": {"EPOCHAL_BACKFILL_YIELD_S": "0"},
    "neither": {"EPOCHAL_BACKFILL_POOL": "default", "EPOCHAL_BACKFILL_YIELD_S": "0"},
}


def knobs_of(args: argparse.Namespace) -> dict[str, str]:
    """The settings the command line sets; the rest keep their defaults."""
    given = {
        "EPOCHAL_BACKFILL_RANGE_ROWS": args.range_rows,
        "EPOCHAL_BACKFILL_CHUNK_ROWS": args.chunk_rows,
        "EPOCHAL_SNAPSHOT_DIRECTORY_ROWS": args.directory_rows,
    }
    return {key: str(value) for key, value in given.items() if value is not None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--groups", type=int, default=100_000)
    p.add_argument("--change", type=int, default=10_000, help="rows per live epoch (default 10,000)")
    p.add_argument("--epochs", type=int, default=5, help="live epochs timed per side (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed live epochs before each arm's (default 2)")
    p.add_argument("--range-rows", type=int, help="EPOCHAL_BACKFILL_RANGE_ROWS (default: the setting's)")
    p.add_argument("--chunk-rows", type=int, help="EPOCHAL_BACKFILL_CHUNK_ROWS (default: the setting's)")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--kind", choices=("table", "source"), default="table", help="how t is declared")
    p.add_argument(
        "--directory-rows",
        type=int,
        help="EPOCHAL_SNAPSHOT_DIRECTORY_ROWS (0: a directory per vnode, the layout before runs of vnodes)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="part 2: start a live epoch every this many seconds, as the barrier sensor does (default 0: "
        "back to back, a pipeline catching up)",
    )
    p.add_argument(
        "--arms",
        default="default",
        help=f"comma-separated settings to measure part 2 with, in turn, each against its own epochs alone: {ARMS}",
    )
    p.add_argument(
        "--backfills", type=int, default=3, help="new views backfilled one after another while live epochs run"
    )
    p.add_argument(
        "--spark",
        choices=("local", "server"),
        default="local",
        help="Spark in this process (local), or Epochal's Connect server with each backfill a process of its own",
    )
    p.add_argument("--snapshot-only", action="store_true", help="measure the snapshot backfill only (part 1)")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_backfill-<time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = p.parse_args(argv)
    unknown = sorted(set(args.arms.split(",")) - set(ARMS))
    if unknown:
        p.error(f"unknown --arms {unknown}: choose from {', '.join(ARMS)}")
    knobs = knobs_of(args)
    log(harness.header("Epochal backfill benchmark"))
    with harness.workdir("bench_backfill", args.keep) as root:
        return measure(args, knobs, root)


def measure(args: argparse.Namespace, knobs: dict[str, str], root: Path) -> int:
    from pyspark.sql import functions as F

    from epochal.backfill.runner import BackfillRunner
    from epochal.spark.session import build_spark_session

    home = root / "home"
    url = None
    if args.spark == "server":
        # Epochal's managed Spark Connect server, as `dagster dev` and the CLI use by default
        from epochal.spark.server import ServerConfig, ensure

        conf = {"spark.driver.memory": args.driver_memory}
        server = ensure(ServerConfig(home, 0, "local[*]", conf, 3600.0))
        url = server.connect_url  # with its token: never logged
        log(f"Spark Connect server at {server.url}")
    spark = build_spark_session("local[*]", "bench-backfill", {"spark.driver.memory": args.driver_memory}, url)
    result: dict = {
        "rows": args.rows,
        "groups": args.groups,
        "change": args.change,
        "kind": args.kind,
        "directory_rows": args.directory_rows,
        "settings": knobs,
        "spark": args.spark,
        "interval": args.interval,
    }
    try:
        log_dir, pipeline = root / "log" / "t", root / "pipeline"
        pipeline.mkdir(parents=True)
        per_file = 1_000_000
        for i, first in enumerate(range(0, args.rows, per_file)):
            write_rows(log_dir, first, min(per_file, args.rows - first), args.groups, f"a-{i:04d}.jsonl")
        (pipeline / "01.sql").write_text(
            f"CREATE {args.kind.upper()} t (id BIGINT, k BIGINT, v BIGINT, note STRING) "
            f"WITH (connector = 'log', path = '{log_dir}', format = 'json');\n"
            "CREATE MATERIALIZED VIEW big AS SELECT id, k, v FROM t WHERE v > 990000;\n"
        )
        runtime = runtime_for(home, pipeline, spark, knobs)
        log(f"ingesting {args.rows:,} rows")
        result["ingest_s"] = epoch(runtime)
        runtime.compact(every=1)

        # -- 1: snapshot backfill of a new aggregation vs Spark read -> aggregate -> write
        (pipeline / "02.sql").write_text(f"CREATE MATERIALIZED VIEW agg AS {AGG};\n")
        runtime = runtime_for(home, pipeline, spark, knobs)
        write_rows(log_dir, args.rows, args.change, args.groups, "b-0000.jsonl")
        epoch(runtime)  # registers the backfill; commits without it
        snapshot = runtime.controller.catalog.snapshots("t")[-1]
        files = runtime.warehouse.snapshot_files(snapshot.location)
        out = root / "spark-agg"

        def spark_baseline() -> float:
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            if args.kind == "source":  # the history the backfill reads: the log's first files
                frame = spark.read.schema("id BIGINT, k BIGINT, v BIGINT, note STRING").json(str(log_dir / "a-*.jsonl"))
            else:
                frame = spark.read.parquet(*files)
            frame.groupBy("k").agg(
                F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"), F.min("v").alias("lo"), F.max("v").alias("hi")
            ).write.parquet(str(out))
            return time.perf_counter() - started

        log("Spark baseline (read, aggregate, write)")
        baseline = [spark_baseline()]
        log(f"backfill of agg over {snapshot.rows:,} rows")
        started = time.perf_counter()
        progress = BackfillRunner(runtime).advance()
        backfill_s = time.perf_counter() - started
        baseline.append(spark_baseline())
        status = runtime.controller.status()["backfills"]["agg"]
        if status["phase"] != "done":
            raise SystemExit(f"the backfill did not finish: {status}")
        spark_s = statistics.median(baseline)
        result["backfill"] = {
            "seconds": backfill_s,
            "rows": snapshot.rows,
            "rows_per_second": snapshot.rows / backfill_s,
            "spark_seconds": baseline,
            "spark_rows_per_second": snapshot.rows / spark_s,
            "ratio": (snapshot.rows / backfill_s) / (snapshot.rows / spark_s),
            "ranges": [p.metadata() for p in progress],
        }

        if args.snapshot_only:
            return _report(args, result)

        # -- 2: live epochs alone, then while backfills of new views run, for each --arms arm
        clock = {"next": 0.0}  # when the next live epoch starts (one every --interval seconds)

        def live(n: int, tag: str) -> list[float]:
            times = []
            for i in range(n):
                time.sleep(max(0.0, clock["next"] - time.perf_counter()))
                clock["next"] = time.perf_counter() + args.interval
                first = args.rows + args.change * (i + 1)
                write_rows(log_dir, first, args.change, args.groups, f"c-{tag}-{i:04d}.jsonl")
                times.append(epoch(runtime_for(home, pipeline, spark, knobs), live_views))
            return times

        # the views every timed epoch maintains: the ones before part 2's backfills
        live_views = frozenset(runtime_for(home, pipeline, spark, knobs).pipeline.views)

        result["live"] = {}
        for number, arm in enumerate(args.arms.split(",")):
            arm_knobs = {**knobs, **ARMS[arm]}
            log(f"[{arm}] live epochs without a backfill")
            # (the first epochs of a run are slower while Spark warms up: 4.1 s, then 3.3, 3.5, 2.4 s)
            live(args.warmup, f"warmup-{arm}")
            alone = live(args.epochs, f"alone-{arm}")
            views = [f"second_{number}_{i}" for i in range(args.backfills)]
            # (each its own threshold: different views, the same work)
            queries = [SECOND.replace("500000", str(500000 + i)) for i in range(len(views))]
            (pipeline / "03.sql").write_text(
                "".join(f"CREATE MATERIALIZED VIEW {v} AS {q};\n" for v, q in zip(views, queries, strict=True))
            )
            epoch(runtime_for(home, pipeline, spark, knobs))  # registers them
            done = threading.Event()
            window: dict[str, float] = {}

            def backfill(
                arm_knobs: dict[str, str] = arm_knobs, window: dict[str, float] = window, views: list[str] = views
            ) -> None:
                try:
                    window["start"] = time.perf_counter()
                    if url is None:
                        BackfillRunner(runtime_for(home, pipeline, spark, arm_knobs)).advance()
                        return
                    # a process of its own on the same server, as a backfill_job run beside epoch runs
                    env = {
                        **os.environ,
                        "EPOCHAL_HOME": str(home),
                        "EPOCHAL_PIPELINE": str(pipeline),
                        "EPOCHAL_SPARK_REMOTE": url,
                        "EPOCHAL_BACKFILL_RUN_S": "100000",
                        **arm_knobs,
                    }
                    for view in views:
                        command = [sys.executable, "-m", "epochal.cli", "backfill", view, "--run"]
                        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                finally:
                    window["end"] = time.perf_counter()
                    done.set()

            log(f"[{arm}] live epochs while {len(views)} backfills run")
            worker = threading.Thread(target=backfill, daemon=True)
            worker.start()
            during: list[float] = []
            inside: list[float] = []  # the epochs that ended before the backfills did
            while not done.is_set() or not during:
                during += live(1, f"during-{arm}-{len(during)}")
                if not done.is_set():
                    inside.append(during[-1])
            worker.join()
            status = runtime_for(home, pipeline, spark, knobs).controller.status()["backfills"]
            if any(status[v]["phase"] != "done" for v in views):
                raise SystemExit(f"the backfills did not finish: {status}")
            counted = inside or during
            result["live"][arm] = {
                "settings": ARMS[arm],
                "alone": alone,
                "during_backfill": during,
                "inside_backfill": inside,
                "backfill_seconds": window["end"] - window["start"],
                "ratio": statistics.median(counted) / statistics.median(alone),
            }
            (pipeline / "03.sql").unlink()
            epoch(runtime_for(home, pipeline, spark, knobs))  # retires them
    finally:
        spark.stop()
        if url is not None:
            from epochal.spark.server import stop

            stop(home)

    return _report(args, result)


def _report(args: argparse.Namespace, result: dict) -> int:
    b = result["backfill"]
    print(f"rows {args.rows:,}, groups {args.groups:,}, live change {args.change:,} rows/epoch")
    print(f"snapshot backfill   : {b['rows_per_second']:>12,.0f} rows/s  ({b['seconds']:.1f} s)")
    runs = len(b["spark_seconds"])
    print(f"Spark read+agg+write: {b['spark_rows_per_second']:>12,.0f} rows/s  (median of {runs})")
    print(f"ratio               : {b['ratio']:.2f}x  (target >= 0.5x)")
    for arm, lv in result.get("live", {}).items():
        arm = f"{arm:<9}"
        inside, during = lv["inside_backfill"], lv["during_backfill"]
        alone = lv["alone"]
        print(f"[{arm}] live epoch alone    : {statistics.median(alone):.2f} s (median of {len(alone)})")
        print(
            f"[{arm}] live epoch, backfill: {statistics.median(inside or during):.2f} s (median of "
            f"{len(inside or during)}{'' if inside else ', none ended inside the backfills'}; "
            f"backfills {lv['backfill_seconds']:.1f} s)"
        )
        print(f"[{arm}] ratio               : {lv['ratio']:.2f}x  (target <= 1.5x)")
    log(f"result: {harness.save(harness.result_path('bench_backfill', args.json), result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
