"""Spark's cache of compiled whole-stage code against the demo's epochs (issue 17): Spark's default
of 100 classes against Epochal's `spark.sql.codegen.cache.maxEntries` (DEFAULT_CONF).

    python benchmarks/bench_codegen_cache.py                  # 6 epochs a run, 2 runs a setting
    python benchmarks/bench_codegen_cache.py --epochs 8 --runs 3

Each run is a process of its own with a local Spark (the cache is per JVM and fixed when Spark
starts), the bundled demo (13 views, 10,000 bids and 2,000 auctions an epoch) in a fresh home, and
the epochs driven by the runtime directly (no Dagster: the Spark work alone). The settings alternate
run by run. Per epoch it records the wall time and, from Spark's own log, how many classes Janino
compiled and how long that took. It prints, per setting, the medians over the epochs after the
first two (the first epochs fill the caches), and the ratio of the two.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

import harness
from harness import log

WARM_UP = 2
COMPILED = re.compile(r"CodeGenerator: Code generated in ([\d.]+) ms")
MARK = "=== epoch "


def child(home: str, epochs: int, entries: str) -> None:
    """One run: the demo's epochs on a local Spark whose codegen cache holds ``entries`` classes."""
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings
    from epochal.spark.session import build_spark_session

    spark = build_spark_session("local[2]", "bench-codegen", {"spark.sql.codegen.cache.maxEntries": entries})
    jvm = spark._jvm  # the compile log line is INFO: the only per-compile count Spark gives
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator", jvm.org.apache.logging.log4j.Level.INFO
    )
    settings = Settings.from_env({"EPOCHAL_HOME": home, "EPOCHAL_SPARK_MODE": "local"})
    runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), lambda: spark)
    runtime.recover("bootstrap")
    from inprocess import epoch

    for i in range(epochs):
        print(f"{MARK}{i} {epoch(runtime):.3f}", file=sys.stderr, flush=True)
    spark.stop()


def run(epochs: int, entries: str) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bench_codegen-") as home:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", home, str(epochs), entries],
            cwd=harness.REPO,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"run failed: {proc.stderr[-3000:]}")
    figures, compiled = [], []
    for line in proc.stderr.splitlines():
        found = COMPILED.search(line)
        if found:
            compiled.append(float(found.group(1)))
        elif line.startswith(MARK):
            seconds = float(line.split()[3])
            figures.append({"seconds": seconds, "compiles": len(compiled), "compile_ms": sum(compiled)})
            compiled = []
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--runs", type=int, default=2, help="runs per setting, alternated (default 2)")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_codegen_cache-<time>.json)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return 0

    from epochal.spark.session import DEFAULT_CONF

    log(harness.header("Spark's codegen cache against the demo's epochs"))

    settings = {"Spark's default (100)": "100", "Epochal's": DEFAULT_CONF["spark.sql.codegen.cache.maxEntries"]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    for i in range(args.runs):
        for name, entries in settings.items() if i % 2 == 0 else reversed(list(settings.items())):
            epochs = run(args.epochs, entries)[WARM_UP:]
            results[name] += epochs
            log(f"run {i + 1}, {name}: epochs "
                + ", ".join(f"{e['seconds']:.1f}s/{e['compiles']:.0f} compiled" for e in epochs))
    print()
    print(f"== the demo's epochs after {WARM_UP} warm-up epochs, local[2], {args.runs} run(s) per setting")
    medians = {}
    for name, entries in settings.items():
        epochs = results[name]
        medians[name] = {k: statistics.median(e[k] for e in epochs) for k in ("seconds", "compiles", "compile_ms")}
        m = medians[name]
        print(
            f"{name:<22} maxEntries {entries:>5}: epoch {m['seconds']:.2f}s, {m['compiles']:.0f} classes compiled "
            f"({m['compile_ms']:.0f} ms of Janino), median of {len(epochs)} epochs"
        )
    base, ours = (medians[n] for n in settings)
    print(f"epoch time, Epochal's / Spark's default: {ours['seconds'] / base['seconds']:.2f}x")
    out = harness.result_path("bench_codegen_cache", args.json)
    harness.save(out, {"args": vars(args), "results": results, "medians": medians})
    log(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
