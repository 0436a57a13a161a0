"""Epochal's change epochs against Spark's own incremental engines on the same data and changes:
Spark Declarative Pipelines' materialized views (sdp) and a Structured Streaming aggregation (ss).

    python benchmarks/bench_views_streaming.py --rows 10000000 --repeats 3     # both, changes of 0.1% and 1%
    python benchmarks/bench_views_streaming.py --rows 10000000 --change-rows 10000 --repeats 3 --warmup 1 \
        --only ss                                                                # issue 17: SS at 10M
    python benchmarks/bench_views_streaming.py --rows 200000 --repeats 1 --only ss   # smoke run

Epochal's side is bench_views.py's measurement (views_common.py) of the views compared: agg for ss,
--views (default agg,join) for sdp, each epoch paired with a Spark recompute as there. Then, on the
same changes, in processes of their own:

sdp   The views as Spark Declarative Pipelines materialized views over catalog tables t and d
      (spark-pipelines' own launcher: a local Spark Connect server and the pipelines client in one JVM
      + Python pair; sdp_driver.py). After the initial run, t is pointed at the same changed state
      and each view is refreshed alone; its refresh time (run start to run completed, from the
      pipeline's own events) against the Epochal epoch. Needs the Spark Connect client extras:
      BENCH_SDP_PYTHON names a Python that has them (benchmarks/README.md); without it the part
      reports why instead of a figure.
ss    The aggregation as a Structured Streaming query (RocksDB state store, update mode, foreachBatch
      writing batch <id> to its own Parquet directory with overwrite: an idempotent, exactly-once file
      output) over the same JSON Lines files, one micro-batch per epoch: events per second against
      Epochal's agg epochs. SS reads them as an insert-only stream (an update is one more row, a
      delete is dropped), so its aggregate is not exact; Epochal's is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import views_common as vc
from harness import BENCH_DIR, fmt_s, fmt_x, log, median, table
from views_common import ROCKSDB, SPARK_CONF, VIEWS, Data

SDP_DRIVER = BENCH_DIR / "sdp_driver.py"


# ------------------------------------------------------------------------------------- SDP


def sdp_environment() -> tuple[dict[str, str] | None, str]:
    """The environment spark-pipelines needs, or None and why it cannot run here."""
    import pyspark

    env = dict(os.environ)
    python = os.environ.get("BENCH_SDP_PYTHON") or sys.executable
    probe = subprocess.run(
        [python, "-c", "import pyspark.sql.connect, pyspark.pipelines.cli"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, (
            f"{python} cannot import the Spark Connect client that spark-pipelines needs: {last}. "
            "Install pyspark's pipelines extra (grpcio-status, googleapis-common-protos, zstandard), "
            "e.g. into a venv with --system-site-packages, and point BENCH_SDP_PYTHON at its python"
        )
    spark_home = Path(pyspark.__file__).parent
    env.update(
        {
            "SPARK_HOME": str(spark_home),
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env, str(spark_home / "bin" / "spark-class")


def run_sdp(args: Any, root: Path, data: Data, views: list[str]) -> dict[str, Any]:
    env, spark_class = sdp_environment()
    if env is None:
        return {"error": spark_class}
    work = root / "sdp"
    (work / "transformations").mkdir(parents=True)
    (work / "spark-pipeline.yml").write_text(
        "name: bench_views\n"
        f"storage: file://{work / 'storage'}\n"
        "configuration:\n"
        + "".join(f"  {k}: \"{v}\"\n" for k, v in SPARK_CONF.items())
        + "libraries:\n  - glob:\n      include: transformations/**\n"
    )
    for view in views:
        (work / "transformations" / f"{view}.sql").write_text(
            f"CREATE MATERIALIZED VIEW {view}_mv AS\n{VIEWS[view]};\n"
        )
    config = {
        "spec": str(work / "spark-pipeline.yml"),
        "views": [f"{v}_mv" for v in views],
        "initial_state": data.initial_state,
        "d": str(data.d_parquet),
        "changes": [{"fraction": c["fraction"], "state": c["state"]} for c in data.changes],
        "out": str(work / "result.json"),
        "warehouse": str(work / "warehouse"),
    }
    (work / "config.json").write_text(json.dumps(config))
    env["SPARK_DRIVER_MEMORY"] = args.driver_memory
    cmd = [
        spark_class,
        "org.apache.spark.deploy.SparkPipelines",
        str(SDP_DRIVER),
        str(work / "config.json"),
    ]
    log(f"  {' '.join(cmd)}")
    started = time.perf_counter()
    with open(work / "output.log", "w") as out:
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.sdp_timeout)
    wall = time.perf_counter() - started
    text = (work / "output.log").read_text(errors="replace")
    if proc.returncode != 0 or not (work / "result.json").exists():
        errors = [ln for ln in text.splitlines() if "Error" in ln or "Exception" in ln or "error" in ln]
        return {"error": f"spark-pipelines exited {proc.returncode}: " + " | ".join(errors[-5:])[-1500:],
                "log": str(work / "output.log")}
    result = json.loads((work / "result.json").read_text())
    result["process_wall_s"] = wall
    return result


# ------------------------------------------------------------------------------------- SS


def run_ss(args: Any, root: Path, data: Data) -> dict[str, Any]:
    """Structured Streaming in its own process (own JVM, same Spark conf as Epochal's)."""
    work = root / "ss"
    work.mkdir()
    steps = [{"name": "initial load", "files": [str(f) for f in data.initial_files], "events": data.rows}]
    for c in data.changes:
        steps.append({"name": f"change {c['number']}", "fraction": c["fraction"], "files": [c["file"]],
                      "events": c["events"], "warmup": c.get("warmup", False)})
    config = {"work": str(work), "steps": steps, "driver_memory": args.driver_memory}
    (work / "config.json").write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, __file__, "--ss-worker", str(work / "config.json")],
        capture_output=True, text=True, timeout=args.ss_timeout,
    )
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0 or not (work / "result.json").exists():
        tail = " | ".join(proc.stderr.strip().splitlines()[-6:])
        return {"error": f"Structured Streaming worker exited {proc.returncode}: {tail[-1500:]}"}
    return json.loads((work / "result.json").read_text())


def ss_worker(config_path: str) -> int:
    """One streaming aggregation over the steps' files, one availableNow run (one batch) per step."""
    from pyspark.sql import functions as F

    from epochal.spark.session import build_spark_session

    config = json.loads(Path(config_path).read_text())
    work = Path(config["work"])
    inbox, out, checkpoint = work / "inbox", work / "out", work / "checkpoint"
    inbox.mkdir()
    spark = build_spark_session(
        master="local[2]",
        app_name="bench-views-ss",
        conf={
            **SPARK_CONF,
            "spark.driver.memory": config["driver_memory"],
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = "id BIGINT, k BIGINT, v BIGINT, note STRING, _op STRING"
    # An insert-only stream: upserts arrive as new rows, deletes cannot retract anything and are dropped.
    events = spark.readStream.schema(schema).json(str(inbox)).where("_op IS NULL OR lower(_op) <> 'delete'")
    agg = events.groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("s"), F.avg("v").alias("a"),
        F.min("v").alias("lo"), F.max("v").alias("hi"),
    )

    def write_batch(batch: Any, batch_id: int) -> None:
        # Idempotent per batch id: a replayed batch (same offsets, same rows) overwrites its own output.
        batch.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    results = []
    for step in config["steps"]:
        for f in step["files"]:
            os.link(f, inbox / Path(f).name)
        started = time.perf_counter()
        query = (
            agg.writeStream.outputMode("update")
            .foreachBatch(write_batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
        rows = sum(p["numInputRows"] for p in progress)
        trigger = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        results.append({**{k: v for k, v in step.items() if k != "files"}, "batches": len(progress),
                        "input_rows": rows, "batch_s": trigger, "query_wall_s": wall,
                        "state_rows": (progress[-1]["stateOperators"][0]["numRowsTotal"] if progress else None)})
        print(f"  [ss] {step['name']}: {rows} rows in {len(progress)} batch(es), {trigger:.2f} s "
              f"(query wall {wall:.2f} s)", file=sys.stderr, flush=True)
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.stop()
    (work / "result.json").write_text(json.dumps({"steps": results, "state_store": provider}))
    return 0


# ------------------------------------------------------------------------------------- report


def render(result: dict[str, Any]) -> str:
    lines = []
    part1 = result.get("views", {})
    sdp = result.get("sdp", {})
    if sdp and "error" in sdp:
        lines.append(f"== SDP: could not run: {sdp['error']}")
    elif sdp:
        rows = []
        for key, s in part1.items():
            view, mode = key.split("/")
            for fraction, epochs in s["epochs"].items():
                ep = [e["epoch"] for e in epochs]
                sdp_times = [r["run_s"] for r in sdp.get("refresh", [])
                             if r["view"] == f"{view}_mv" and r["fraction"] == float(fraction)]
                if sdp_times:
                    rows.append([view, mode, f"{float(fraction):.2%}", f"{s['events'][fraction]:,}", fmt_s(median(ep)),
                                 fmt_s(median(sdp_times)), fmt_x(median(ep) / median(sdp_times))])
        lines.append("== Epochal change epochs against an SDP refresh of the same view (medians, ratio of medians)")
        if rows:
            lines.append(table(["view", "mode", "change", "events", "Epochal epoch", "SDP refresh", "epoch/SDP"], rows))
        flows: dict[str, list[float]] = {}
        for r in sdp.get("refresh", []):
            flows.setdefault(r["view"], []).extend(r["flow_s"].values())
        lines.append(
            f"SDP: initial run of all views {fmt_s(sdp.get('initial_run_s'))}; 'SDP refresh' = one pipeline run "
            f"refreshing one materialized view, StartRun to its last event (flow RUNNING->COMPLETED alone, median: "
            + ", ".join(f"{v} {fmt_s(median(x))}" for v, x in flows.items())
            + f"); spark-pipelines process wall, JVM start included, {fmt_s(sdp.get('process_wall_s'))}"
        )
    ss = result.get("ss")
    if ss:
        lines.append("")
        if "error" in ss:
            lines.append(f"== Structured Streaming: could not run: {ss['error']}")
        else:
            agg_epochs = result.get("ss_epochal", {})
            headers = ["step", "events", "n", "Epochal s", "Epochal ev/s", "SS batch s", "SS ev/s", "Epochal/SS ev/s",
                       "Epochal/SS time"]
            rows = []
            for label, ep_times, ss_times, events in ss_table(ss, agg_epochs):
                e, b = median(ep_times) if ep_times else None, median(ss_times) if ss_times else None
                rows.append([label, f"{events:,}", f"{len(ep_times)}/{len(ss_times)}", fmt_s(e),
                             f"{events / e:,.0f}" if e else "n/a", fmt_s(b), f"{events / b:,.0f}" if b else "n/a",
                             fmt_x(b / e) if e and b else "n/a", fmt_x(e / b) if e and b else "n/a"])
            lines.append(f"== agg as Structured Streaming ({ss.get('state_store')}, update mode, foreachBatch "
                         "idempotent Parquet per batch id) against Epochal's agg epochs, same files; medians")
            lines.append(table(headers, rows))
            lines.append(
                "SS reads the same JSON Lines files as an insert-only stream: an update arrives as one more row of"
                " its key (the old row is never retracted), a delete is dropped, so its aggregate drifts from the"
                " view's true value; Epochal retracts and replaces. Epochal's time is the whole agg epoch"
                " (source step + view step + commit); SS's is the micro-batch's triggerExecution. n = epochs/batches"
                " in the medians (warm-ups left out); the two run one after the other, not interleaved, so"
                " Epochal/SS time is a ratio of medians (target for a change: <= 1.0x)."
            )
            warm = [s_["batch_s"] for s_ in ss["steps"][1:] if s_.get("warmup")]
            if warm:
                lines.append(f"SS warm-up batch(es), not in the medians: {', '.join(fmt_s(x) for x in warm)}")
    lines.append("")
    lines.append(vc.render_part1(result))
    return "\n".join(lines)


def ss_table(ss: dict[str, Any], agg_epochs: dict[str, Any]) -> list[tuple[str, list[float], list[float], int]]:
    out = []
    steps = ss["steps"]
    out.append(("initial load", [agg_epochs["initial"]] if "initial" in agg_epochs else [],
                [steps[0]["batch_s"]], steps[0]["events"]))
    timed = [s for s in steps[1:] if not s.get("warmup")]
    fractions = sorted({s["fraction"] for s in timed})
    for f in fractions:
        chosen = [s for s in timed if s["fraction"] == f]
        out.append((f"change {f:.1%}", agg_epochs.get("changes", {}).get(str(f), []),
                    [s["batch_s"] for s in chosen], chosen[0]["events"]))
    return out


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = vc.parser(__doc__)
    p.add_argument("--only", default="sdp,ss", help="comma list of sdp, ss (default both)")
    p.add_argument("--views", default="agg,join", help="the views SDP refreshes (default agg,join); ss is agg's")
    p.add_argument("--sdp-timeout", type=int, default=3600)
    p.add_argument("--ss-timeout", type=int, default=3600)
    p.add_argument("--ss-worker", help=argparse.SUPPRESS)
    if "--ss-worker" in (argv if argv is not None else sys.argv[1:]):
        return ss_worker(p.parse_args(argv).ss_worker)
    args = vc.parse(p, argv)
    parts = {x.strip() for x in args.only.split(",") if x.strip()}
    if not parts or parts - {"sdp", "ss"}:
        p.error("--only: sdp and/or ss")
    sdp_views = [v for v in ("agg", "join") if v in args.views.split(",")] if "sdp" in parts else []
    views = sorted({*sdp_views, *(["agg"] if "ss" in parts else [])})

    def measure(root: Path, result: dict[str, Any], save: Any) -> None:
        import pyspark

        data = vc.new_data(args, root, args.rows)
        modes = vc.modes_for(args, root, data, result)
        spark = vc.spark_session(args, "bench-views")
        try:
            log(f"Epochal ({', '.join(modes)}) {', '.join(views)}; pyspark {pyspark.__version__}")
            result["views"] = vc.part1_result(vc.run_part1(args, root, data, spark, modes, views), data)
        finally:
            spark.stop()
        result["changes"] = data.changes
        agg = next((v for k, v in result["views"].items() if k.startswith("agg/")), None)
        if agg:
            result["ss_epochal"] = {
                "mode": agg["mode"], "initial": agg["initial"]["epoch"],
                "changes": {f: [e["epoch"] for e in eps] for f, eps in agg["epochs"].items()},
            }
        save()
        if "sdp" in parts:
            log("Spark Declarative Pipelines (spark-pipelines): materialized views, refresh after each change")
            result["sdp"] = run_sdp(args, root, data, sdp_views)
            log(f"  {'error: ' + result['sdp']['error'] if 'error' in result['sdp'] else 'done'}")
            save()
        if "ss" in parts:
            log("Structured Streaming (RocksDB state store), same files, one batch per epoch")
            result["ss"] = run_ss(args, root, data)
            log(f"  {'error: ' + result['ss']['error'] if 'error' in result['ss'] else 'done'}")
            save()

    return vc.run("bench_views_streaming", "Epochal against SDP and Structured Streaming", args, measure, render)


if __name__ == "__main__":
    sys.exit(main())
