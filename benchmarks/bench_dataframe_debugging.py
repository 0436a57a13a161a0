"""PySpark's DataFrame call-site capture against the demo's epochs (issue 17): Spark's default
(`spark.python.sql.dataFrameDebugging.enabled` true) against Epochal's (false, DEFAULT_CONF).

    python benchmarks/bench_dataframe_debugging.py              # 6 pairs
    python benchmarks/bench_dataframe_debugging.py --pairs 10

With the capture on, every DataFrame, Column and function call of classic PySpark asks the JVM for
the active session and a conf, walks the Python stack and sets and clears the call site in the JVM:
four or five Py4J round trips around each call Epochal makes while it builds an epoch's plans.

One process, one local Spark, the bundled demo (13 views, 10,000 bids and 2,000 auctions an epoch)
in a fresh home, epochs driven by the runtime directly (no Dagster). PySpark reads the setting once
per process and caches it, so the benchmark flips that cache (``pyspark.errors.utils``) between
epochs, alternating A B, B A. It prints, per side, the median epoch and Py4J calls per epoch, and the
median of the paired ratios.
"""

from __future__ import annotations

import argparse
import statistics

import harness
from harness import log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=6, help="timed epoch pairs (default 6)")
    p.add_argument("--warmup", type=int, default=3, help="untimed epochs first (default 3)")
    args = p.parse_args(argv)

    import py4j.clientserver
    import pyspark.errors.utils as origin
    from inprocess import epoch

    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings
    from epochal.spark.session import build_spark_session

    calls = [0]
    send = py4j.clientserver.ClientServerConnection.send_command

    def counted(self, command):  # noqa: ANN001, ANN202
        calls[0] += 1
        return send(self, command)

    py4j.clientserver.ClientServerConnection.send_command = counted

    log(harness.header("PySpark's DataFrame call-site capture against the demo's epochs"))
    with harness.workdir("bench_dataframe_debugging") as root:
        home = str(root)
        spark = build_spark_session("local[2]", "bench-dataframe-debugging", {})
        spark.sparkContext.setLogLevel("ERROR")
        settings = Settings.from_env({"EPOCHAL_HOME": home, "EPOCHAL_SPARK_MODE": "local"})
        runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), lambda: spark)
        runtime.recover("bootstrap")
        sides = {"on": True, "off": False}
        times: dict[str, list[float]] = {s: [] for s in sides}
        py4j_calls: dict[str, list[int]] = {s: [] for s in sides}
        for i in range(args.warmup):
            origin._enable_debugging_cache = i % 2 == 0
            log(f"warm-up epoch: {epoch(runtime):.2f} s")
        for i in range(args.pairs):
            for side in ("on", "off") if i % 2 == 0 else ("off", "on"):
                origin._enable_debugging_cache = sides[side]
                calls[0] = 0
                times[side].append(epoch(runtime))
                py4j_calls[side].append(calls[0])
                log(f"capture {side:3}: {times[side][-1]:.2f} s, {calls[0]:,} Py4J calls")
        spark.stop()

    paired = [off / on for off, on in zip(times["off"], times["on"], strict=True)]
    for side in sides:
        print(
            f"capture {side:3}: epoch {statistics.median(times[side]):.2f} s (median of {len(times[side])}), "
            f"{statistics.median(py4j_calls[side]):,.0f} Py4J calls per epoch"
        )
    print(f"off / on: {statistics.median(paired):.3f}x (median of paired ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
