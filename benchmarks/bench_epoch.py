"""What an epoch costs on top of its Spark work: `epoch_job` in-process against the same Spark work
done directly, for an empty epoch and an epoch of ~100,000 rows.

    python benchmarks/bench_epoch.py                 # both sizes, 5 timed pairs each; 5-6 min here
    python benchmarks/bench_epoch.py --quick         # 2 timed pairs each; 2.5-3 min on an idle machine
    python benchmarks/bench_epoch.py --sizes empty --reps 4

The pipeline (epoch_pipeline.py): a Nexmark `bid` source, a filter view, an append-only DuckDB sink.

A  epoch_job.execute_in_process on one ephemeral Dagster instance kept for all runs, with the Spark
   resource handing every run the already running SparkSession (local[2]): barrier (recover/inject)
   -> source -> view -> commit -> sink.
B  the same Spark work directly: the connector's plan and read -> Parquet, the view's SQL ->
   Parquet, one DuckDB insert. No Dagster, no meta store.

Interleaved A B A B after one untimed warm-up pair; the ratio is the median of the per-pair ratios
A_i/B_i. It also prints where the median A run's time goes (functions wrapped in this process), B by
phase, and the Spark jobs per epoch. Meta-store transactions alone: bench_meta_txn.py; the executor
(`dagster job execute`, in-process against multiprocess): bench_executor.py.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from epoch_pipeline import EVENTS_FOR_100K_BIDS, BenchPipeline, Budget, empty_source_options
from harness import Comparison, log, median, table


def fmt_s(x: float) -> str:
    return f"{x:8.3f} s" if x == x else "      n/a"


# ------------------------------------------------------------------------------------- profiler


class Profiler:
    """Inclusive wall time and call counts of chosen functions, per run (monkeypatched wrappers).

    A wrapper costs about a microsecond; an epoch makes a few hundred wrapped calls."""

    def __init__(self) -> None:
        self.time: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.current = "outside the ops"  # the top-level label being run, for "label @ op" counts

    def reset(self) -> None:
        self.time = defaultdict(float)
        self.count = defaultdict(int)

    def wrap(self, owner: Any, attr: str, label: str | Callable[[tuple], str]) -> None:
        original = getattr(owner, attr)
        profiler = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = label(args) if callable(label) else label
            outer = profiler.current
            if not name.startswith(" "):
                profiler.current = name.split(":")[0].split(" (")[0]
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                profiler.current = outer
                profiler.time[name] += elapsed
                profiler.count[name] += 1
                if name.startswith(" "):
                    key = f"{name.strip()} @ {outer}"
                    profiler.time[key] += elapsed
                    profiler.count[key] += 1

        setattr(owner, attr, wrapper)

    def snapshot(self) -> dict[str, tuple[int, float]]:
        return {k: (self.count[k], self.time[k]) for k in self.time}


PROFILER = Profiler()

# label -> (indent, description); the order is the order printed
LABELS = {
    "runtime init (load pipeline, meta schema txn)": (0, ""),
    "op barrier: recover/inject (start_epoch)": (0, ""),
    "op source: run_source": (0, ""),
    "op view: run_view": (0, ""),
    "op commit: commit": (0, ""),
    "op sink: run_sink": (0, ""),
    "dagster: dynamic partitions (ensure/retire)": (0, ""),
    "dagster: event log writes (handle_new_event)": (0, ""),
    "  SparkSession getOrCreate (lazy: first Spark op)": (1, ""),
    "  `java -version` check inside getOrCreate": (1, ""),
    "  Spark: Parquet writes + footer counts (Warehouse.write)": (1, ""),
    "  Spark: Parquet read/schema (Warehouse.read)": (1, ""),
    "  meta-store transactions (meta.duckdb)": (1, ""),
    "  sink DuckDB transactions (sink file)": (1, ""),
}
TOP_LEVEL = [k for k, (indent, _) in LABELS.items() if indent == 0]


def install_probes() -> None:
    from dagster import DagsterInstance

    import epochal.spark.session as spark_session
    import resources.spark as spark_resource
    from epochal.meta.backend import DuckDBBackend
    from epochal.runtime.epoch_taking import EpochTaking
    from epochal.runtime.facade import EpochRuntime
    from epochal.storage.warehouse import Warehouse
    from resources.checkpoint import CheckpointControllerResource

    p = PROFILER
    p.wrap(spark_session, "check_java", "  `java -version` check inside getOrCreate")
    # resources.spark imported build_spark_session by name: patch the name it calls.
    p.wrap(spark_resource, "build_spark_session", "  SparkSession getOrCreate (lazy: first Spark op)")
    p.wrap(EpochRuntime, "__init__", "runtime init (load pipeline, meta schema txn)")
    # The class that runs it: epoch_job's take_epochs calls it there, not through the runtime.
    p.wrap(EpochTaking, "start_epoch", "op barrier: recover/inject (start_epoch)")
    p.wrap(EpochRuntime, "run_source", "op source: run_source")
    p.wrap(EpochRuntime, "run_view", "op view: run_view")
    p.wrap(EpochRuntime, "commit", "op commit: commit")
    p.wrap(EpochRuntime, "run_sink", "op sink: run_sink")
    p.wrap(Warehouse, "write", "  Spark: Parquet writes + footer counts (Warehouse.write)")
    p.wrap(Warehouse, "read", "  Spark: Parquet read/schema (Warehouse.read)")
    p.wrap(
        DuckDBBackend,
        "transaction",
        lambda args: (
            "  meta-store transactions (meta.duckdb)"
            if args[0].path.name == "meta.duckdb"
            else "  sink DuckDB transactions (sink file)"
        ),
    )
    p.wrap(CheckpointControllerResource, "ensure_partition", "dagster: dynamic partitions (ensure/retire)")
    p.wrap(CheckpointControllerResource, "retire_partitions", "dagster: dynamic partitions (ensure/retire)")
    p.wrap(DagsterInstance, "handle_new_event", "dagster: event log writes (handle_new_event)")


def spark_job_ids(spark: Any) -> set[int]:
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup())


@dataclass
class InProcessResult:
    comparison: Comparison
    profiles: list[dict[str, tuple[int, float]]]
    direct_phases: list[dict[str, float]]
    spark_jobs_a: list[int]
    spark_jobs_b: list[int]
    rows_per_epoch: int
    definitions_s: float


def bench_in_process(pipe: BenchPipeline, spark: Any, reps: int, title: str, budget: Budget) -> InProcessResult:
    import dagster as dg

    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime

    definitions_s = pipe.load()
    instance = dg.DagsterInstance.ephemeral()
    comparison = Comparison(title, "A  epoch_job, in-process", "B  same Spark work, direct")
    profiles, phases, jobs_a, jobs_b = [], [], [], []
    for i in range(reps + 1):
        warmup = i == 0
        if i > 2 and not budget.allows_another(comparison):
            comparison.cut = f"cut from {reps} to {i - 1} timed reps by --budget"
            log(f"  [{pipe.name}] {comparison.cut}")
            break
        PROFILER.reset()
        before = spark_job_ids(spark)
        a = pipe.run_job(instance)
        after = spark_job_ids(spark)
        profile = PROFILER.snapshot()
        b, direct = pipe.run_direct(spark)
        jobs_b_run = len(spark_job_ids(spark) - after)
        tag = "warm-up, not counted" if warmup else f"{i}/{reps}"
        log(f"  [{pipe.name}] {tag}: A {a:.3f} s, B {b:.3f} s")
        if warmup:
            continue
        comparison.a.append(a)
        comparison.b.append(b)
        profile["(total)"] = (1, a)
        profiles.append(profile)
        phases.append(direct)
        jobs_a.append(len(after - before))
        jobs_b.append(jobs_b_run)
    settings = pipe.settings()
    runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), lambda: spark)
    rows = runtime.controller.epoch_log.collected(runtime.controller.epoch_log.committed_epoch())["bid"].rows_out or 0
    return InProcessResult(comparison, profiles, phases, jobs_a, jobs_b, rows, definitions_s)


def render_in_process(r: InProcessResult) -> str:
    """The comparison, then a breakdown of the median A run: one real run, so its rows add up
    (medians of the rows over all runs, in the last column, need not)."""
    c = r.comparison
    m = sorted(range(len(c.a)), key=lambda i: c.a[i])[(len(c.a) - 1) // 2]
    run, a_run = r.profiles[m], c.a[m]

    def secs(label: str, profile: dict[str, tuple[int, float]] = run) -> float:
        return profile.get(label, (0, 0.0))[1]

    lines = [f"== {c.title}  (bid rows per epoch: {r.rows_per_epoch:,})", c.render(), ""]
    rows = []
    for label in LABELS:
        rows.append(
            [
                label,
                f"{run.get(label, (0, 0.0))[0]:g}",
                fmt_s(secs(label)),
                f"{100 * secs(label) / a_run:5.1f} %",
                fmt_s(median([secs(label, p) for p in r.profiles])),
            ]
        )
    ops = sum(secs(k) for k in LABELS if k.startswith("op "))
    nested = sum(secs(k) for k, (indent, _) in LABELS.items() if indent == 1 and "java -version" not in k)
    rest = a_run - sum(secs(k) for k, (indent, _) in LABELS.items() if indent == 0)
    rows.append(
        [
            "  rest of the ops (Spark planning/reads, footers, ...)",
            "",
            fmt_s(ops - nested),
            f"{100 * (ops - nested) / a_run:5.1f} %",
            "",
        ]
    )
    rows.append(
        ["rest: Dagster run/step machinery, plan, logging", "", fmt_s(rest), f"{100 * rest / a_run:5.1f} %", ""]
    )
    lines.append(
        f"where A's time goes, in the median A run ({a_run:.3f} s, pair {m + 1}); indented rows are part of "
        "the op rows above them:"
    )
    lines.append(table(["", "calls", "seconds", "of A", "all runs: median"], rows))
    meta = "meta-store transactions (meta.duckdb)"
    by_op = [(k.split(" @ ", 1)[1], n, t) for k, (n, t) in run.items() if k.startswith(f"{meta} @ ")]
    lines.append(
        "meta-store transactions by caller (calls, seconds): " + ", ".join(f"{op} {n} ({t:.3f})" for op, n, t in by_op)
    )
    lines.append("")
    phases = r.direct_phases[m]
    lines.append(f"B by phase, same pair ({c.b[m]:.3f} s):")
    lines.append(
        table(
            ["", "seconds", "all runs: median"],
            [[k, fmt_s(v), fmt_s(median([p[k] for p in r.direct_phases]))] for k, v in phases.items()],
        )
    )
    lines.append(
        f"Spark jobs per epoch: A {median(r.spark_jobs_a):g}, B {median(r.spark_jobs_b):g}.  "
        f"build_definitions (once per process, not timed): {r.definitions_s:.3f} s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 timed repetitions a size instead of 5")
    parser.add_argument("--reps", type=int, help="timed repetitions a size (default 5, --quick 2)")
    parser.add_argument("--sizes", default="empty,100k", help="comma list of empty, 100k (default both)")
    parser.add_argument("--budget", type=float,
                        help="seconds the whole run may take before repetitions are cut (default 330, --quick 120); "
                        "at least 2 timed repetitions always run")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_epoch-<time>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, warehouse, meta store)")
    parser.add_argument("--verbose", action="store_true", help="let Dagster/Spark log to the terminal")
    args = parser.parse_args(argv)
    sizes = [s for s in ("empty", "100k") if s in args.sizes.split(",")]
    if not sizes:
        parser.error("--sizes: empty and/or 100k")
    reps = args.reps or (2 if args.quick else 5)
    budget = Budget(args.budget or (120 if args.quick else 330), {"empty": 0.4, "100k": 0.6})
    header = f"{harness.header('Epochal epoch benchmark')}; {reps} timed reps + 1 warm-up a size"
    log(header)
    result: dict[str, Any] = {"header": header, "args": vars(args)}
    with harness.workdir("bench_epoch", args.keep) as root:
        stderr_log = root / "stderr.log"
        try:
            with harness.stderr_to(stderr_log, not args.verbose):
                reports = measure(root, sizes, reps, budget, result)
        except Exception:
            import traceback

            traceback.print_exc()
            if stderr_log.exists():
                print(f"--- last lines of {stderr_log} ---\n{stderr_log.read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
            return 1
    log("")
    log(header)
    for report in reports:
        print()
        print(report)
    print()
    log(f"load average at end {harness.load_now()}")
    log(f"result: {harness.save(harness.result_path('bench_epoch', args.json), result)}")
    return 0


def measure(root: Path, sizes: list[str], reps: int, budget: Budget, result: dict[str, Any]) -> list[str]:
    import pyspark

    from resources.spark import EpochalSparkResource

    install_probes()
    started = time.perf_counter()
    spark = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False).spark_session
    log(f"JVM + SparkSession start (not timed): {time.perf_counter() - started:.1f} s; pyspark {pyspark.__version__}")
    reports = []
    try:
        empty_opts, empty_note = empty_source_options(root)
        options = {"empty": empty_opts, "100k": f"'max.events.per.epoch' = '{EVENTS_FOR_100K_BIDS}'"}
        titles = {"empty": f"empty epoch ({empty_note})", "100k": f"100k-row epoch (max.events.per.epoch = "
                  f"{EVENTS_FOR_100K_BIDS})"}
        for size in sizes:
            log(titles[size])
            budget.start_part(size)
            r = bench_in_process(BenchPipeline(root, size, options[size]), spark, reps, titles[size], budget)
            reports.append(render_in_process(r))
            result[size] = {"comparison": r.comparison.to_json(), "rows_per_epoch": r.rows_per_epoch,
                            "spark_jobs_a": r.spark_jobs_a, "spark_jobs_b": r.spark_jobs_b,
                            "profiles": r.profiles, "direct_phases": r.direct_phases}
    finally:
        spark.stop()
    return reports


if __name__ == "__main__":
    sys.exit(main())
