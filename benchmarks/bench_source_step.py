"""A log source's step of one big epoch against Spark reading the same lines into Parquet (issue 58, goal 3).

    python benchmarks/bench_source_step.py                         # 300,000 lines, keyed and append-only
    python benchmarks/bench_source_step.py --rows 300000,3000000   # both of the issue's sizes
    python benchmarks/bench_source_step.py --quick                 # 50,000 lines, 1 repeat

Two pipelines of one log TABLE each, t(id, k, v, note): `keyed` (id BIGINT PRIMARY KEY: records
upsert, resolved against the table's earlier rows) and `append` (no key: records are rows). Each
repeat appends N lines of fresh ids as a new split file, then, alternating which goes first:

* Epochal's source step for the epoch that reads them (``EpochRuntime.run_source``: read, parse,
  dead-letter check, upsert resolution, Parquet write, collect), in-process on the warm session,
  with the driver path off (``EPOCHAL_DRIVER_ROWS=0``: these are Spark's epochs). The epoch is then
  committed and compacted as a pipeline would, untimed, so the keyed step of repeat i resolves
  against a snapshot of the i*N rows before it;
* the floor: ``spark.read.schema(DDL).json(file).write.parquet(dir)`` of the same file.

Printed per size and kind: the medians and the median of the paired ratios epochal/floor, with the
load average at the time. ``--bad`` puts one malformed line in each epoch, to price a dead letter.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

import harness
from harness import fmt_s, fmt_x, log, median, paired_ratio, table
from inprocess import write_rows

COLUMNS = "id BIGINT, k BIGINT, v BIGINT, note STRING"
KINDS = {"keyed": "id BIGINT PRIMARY KEY, k BIGINT, v BIGINT, note STRING", "append": COLUMNS}


class Pipe:
    """One TABLE over its own log directory, driven epoch by epoch in-process."""

    def __init__(self, root: Path, kind: str, spark: Any):
        from inprocess import runtime_for

        self.kind = kind
        self.logs = root / kind / "log"
        self.logs.mkdir(parents=True)
        pipeline = root / kind / "pipeline"
        pipeline.mkdir()
        (pipeline / "01_sources.sql").write_text(
            f"CREATE TABLE t ({KINDS[kind]})\nWITH (connector = 'log', path = '{self.logs}', format = 'json');\n"
        )
        self.runtime = runtime_for(root / kind / "home", pipeline, spark, {"EPOCHAL_DRIVER_ROWS": "0"})
        self.next_id = 0
        self.splits = 0
        self.cpu = (0.0, 0.0)

    def append(self, rows: int, bad: bool) -> Path:
        """N lines of fresh ids as a new split file (and, with ``bad``, one malformed line)."""
        name = f"{self.splits:04d}.jsonl"
        write_rows(self.logs, self.next_id, rows, max(rows // 10, 1), name)
        if bad:
            with open(self.logs / name, "a") as f:
                f.write('{"id": 1, "k": \n')
        self.next_id += rows
        self.splits += 1
        return self.logs / name

    def step(self, profile: bool = False) -> tuple[float, dict[str, Any]]:
        """The source step of one epoch, timed; then its commit and compaction, untimed. With
        ``profile``, the step's Spark jobs and the driver's hottest functions are printed."""
        rt = self.runtime
        record, _ = rt.start_epoch(None, None)
        spark = rt.spark
        scheduler = spark.sparkContext._jsc.sc().dagScheduler()
        first_job = scheduler.numTotalJobs() - 1
        profiler = cProfile.Profile() if profile else None
        cpu_before = harness.driver_cpu_reading(spark)
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        report = rt.run_source(record.epoch, "t")
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - started
        #: the step's driver CPU seconds: this process's, and the driver JVM's outside tasks
        self.cpu = harness.driver_cpu_since(spark, cpu_before)
        if profiler is not None:
            from views_common import job_times

            spent = job_times(spark, first_job, [("step", scheduler.numTotalJobs() - 1)], seconds)
            log(f"{self.kind} step {seconds:.2f} s: jobs {spent['jobs_s']:.2f} s, driver {spent['driver_s']:.2f} s")
            for job in spent["jobs"]:
                log(f"  job {job['id']}: {job['s']} s, {job.get('tasks')} tasks, {job.get('input_rows')} rows in, ")
                log(f"    {job['name']}")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        rt.commit(record.epoch)
        rt.compact(record.epoch, every=1)
        return seconds, dict(report.metadata)


def floor(spark: Any, path: Path, out: Path) -> float:
    started = time.perf_counter()
    spark.read.schema(COLUMNS).json(str(path)).write.parquet(str(out))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="300000", help="comma-separated epoch sizes (lines)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default="keyed,append")
    parser.add_argument("--bad", action="store_true", help="one malformed line per epoch (a dead letter)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--quick", action="store_true", help="--rows 50000 --repeats 1")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print each step's Spark jobs and driver profile")
    parser.add_argument("--conf", action="append", default=[], help="a Spark conf key=value (repeatable)")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_source_step-<time>.json)")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = "50000", 1
    sizes = [int(s) for s in args.rows.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    log(harness.header("A log source's step of a big epoch against spark.read.json -> write.parquet"))

    from epochal.spark.session import build_spark_session

    spark = build_spark_session(
        master="local[2]",
        app_name="bench_source_step",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.memory": args.driver_memory,
            "spark.ui.showConsoleProgress": "false",
            **dict(c.split("=", 1) for c in args.conf),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    results: list[dict[str, Any]] = []
    rows_out: list[list[str]] = []
    with harness.workdir("bench_source_step", args.keep) as root:
        for size in sizes:
            for kind in kinds:
                pipe = Pipe(root / f"n{size}", kind, spark)
                # warm-up: one small epoch and one read by executors (more than
                # log_lines.SPARK_DRIVER_READ_BYTES), so the session has run this plan's shapes once
                # and its Python workers are up, as in a long-lived process
                pipe.append(1000, False)
                pipe.step()
                pipe.append(120_000, False)
                pipe.step()
                ours: list[float] = []
                base: list[float] = []
                python_cpu: list[float] = []
                jvm_cpu: list[float] = []
                loads: list[str] = []
                for i in range(args.repeats):
                    path = pipe.append(size, args.bad)
                    out = root / f"n{size}" / kind / f"floor{i}"
                    order = ("epochal", "floor") if i % 2 == 0 else ("floor", "epochal")
                    for which in order:
                        if which == "epochal":
                            seconds, meta = pipe.step(args.profile)
                            expected_dead = 1 if args.bad else 0
                            if meta["records_read"] != size + expected_dead or meta["dead_letters"] != expected_dead:
                                raise SystemExit(f"{kind}: unexpected step {meta}")
                            ours.append(seconds)
                            python_cpu.append(pipe.cpu[0])
                            jvm_cpu.append(pipe.cpu[1])
                        else:
                            base.append(floor(spark, path, out))
                    loads.append(harness.load_now())
                    log(
                        f"{kind} {size:,}: epochal {ours[-1]:.2f} s (driver CPU: Python {python_cpu[-1]:.2f} s, "
                        f"JVM {jvm_cpu[-1]:.2f} s), floor {base[-1]:.2f} s (load {loads[-1]})"
                    )
                ratio = paired_ratio(ours, base)
                results.append(
                    {
                        "rows": size,
                        "kind": kind,
                        "epochal": ours,
                        "floor": base,
                        "ratio": ratio,
                        "loads": loads,
                        "driver_python_cpu_s": python_cpu,
                        "driver_jvm_cpu_s": jvm_cpu,
                    }
                )
                rows_out.append(
                    [
                        f"{size:,}",
                        kind,
                        fmt_s(median(ours)),
                        fmt_s(median(base)),
                        fmt_x(ratio),
                        fmt_s(median(python_cpu)),
                        fmt_s(median(jvm_cpu)),
                        " / ".join(loads),
                    ]
                )
        headers = ["rows", "kind", "epochal step", "floor", "ratio", "driver CPU: Python", "JVM", "load"]
        print(table(headers, rows_out), flush=True)
    spark.stop()
    out_file = harness.save(
        harness.result_path("bench_source_step", args.json), {"args": vars(args), "results": results}
    )
    log(f"result: {out_file}")


if __name__ == "__main__":
    main()
