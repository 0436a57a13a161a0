"""The executor of `epoch_job`: one epoch as `dagster job execute` from a cold process, with the
in-process executor (as shipped) against the multiprocess executor (every step a process).

    python benchmarks/bench_executor.py                  # 3 pairs of empty epochs; 5-8 min here
    python benchmarks/bench_executor.py --reps 1         # one pair
    python benchmarks/bench_executor.py --data 100k

The pipeline is epoch_pipeline.py's, in a temp DAGSTER_HOME with telemetry off, bootstrapped by one
untimed in-process run first. A runs `dagster job execute -m platform_defs -j epoch_job`; B runs
`dagster job execute -f benchmarks/multiprocess_defs.py -j epoch_job_multiprocess` (the same graph
with the multiprocess executor: epoch_job pins its executor, so run config cannot switch it). A B A B.
Per run: wall time (process start to exit), Spark driver JVMs among its descendants (/proc polled
every 0.2 s), the JVM's log lines (one per SparkContext: the cross-check), the processes that emitted
step events, the processes seen, process start to RUN_START, step spawn (STEP_WORKER_STARTING ->
STEP_START, summed) and each step's duration. A step's first Spark call starts its process's JVM, so
JVM start-up is inside the source step (and, with multiprocess, inside the view step again).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from epoch_pipeline import EVENTS_FOR_100K_BIDS, BenchPipeline, Budget, empty_source_options
from harness import BENCH_DIR, Comparison, log, median, table

MULTIPROCESS_DEFS = BENCH_DIR / "multiprocess_defs.py"


def fmt_s(x: float) -> str:
    return f"{x:8.3f} s" if x == x else "      n/a"


def _children(parents: dict[int, int] | None = None) -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree[ppid].append(int(entry))
        if parents is not None:
            parents[int(entry)] = ppid
    return tree


def _descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    tree, out, todo = _children(parents), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class CliRun:
    wall: float
    spark_jvms: int  # java ... org.apache.spark.deploy.SparkSubmit among the run's descendants
    helper_jvms: int  # other java processes seen (spark-class launcher, `java -version`); polling may miss some
    jvm_log_lines: int  # "Setting default log level to" lines: Spark prints one per SparkContext
    step_processes: int  # distinct pids that emitted step events
    processes_seen: int  # distinct descendant processes seen by polling (misses some short-lived ones)
    startup: float  # process start -> RUN_START: interpreter, imports, definitions, instance
    steps: dict[str, float]  # step -> STEP_START..STEP_SUCCESS
    step_spawn: float  # multiprocess: sum over steps of STEP_WORKER_STARTING -> STEP_START


def run_cli(kind: str, env: dict[str, str], cwd: Path, dagster_home: Path, n: int) -> CliRun:
    from dagster import DagsterEventType, DagsterInstance

    if kind == "in_process":
        target = ["-m", "platform_defs", "-j", "epoch_job"]
    else:
        target = ["-f", str(MULTIPROCESS_DEFS), "-j", "epoch_job_multiprocess"]
    out_path, err_path = cwd / f"cli-{kind}-{n}.out", cwd / f"cli-{kind}-{n}.err"
    seen: dict[int, str] = {}
    parents: dict[int, int] = {}
    with open(out_path, "w") as out, open(err_path, "w") as err:
        started_wall = time.time()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "job", "execute", *target], cwd=cwd, env=env, stdout=out, stderr=err
        )
        while proc.poll() is None:
            for pid in _descendants(proc.pid, parents):
                # re-read: spark-class is a bash script that execs the JVM under the same pid
                seen[pid] = _cmdline(pid) or seen.get(pid, "")
            time.sleep(0.2)
        wall = time.perf_counter() - started
    text = err_path.read_text(errors="replace") + out_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"dagster job execute ({kind}) failed with {proc.returncode}:\n{text[-4000:]}")
    javas = {pid: cmd for pid, cmd in seen.items() if cmd.split(" ", 1)[0].rsplit("/", 1)[-1] == "java"}
    # The driver JVM runs SparkSubmit. Not JVMs of their own: the short launcher JVM spark-class runs
    # first (org.apache.spark.launcher.Main, with SparkSubmit as its argument), and the JVM's own
    # children (Hadoop forks `chmod`), which show the JVM's command line until they exec.
    drivers = {
        pid
        for pid, cmd in javas.items()
        if "org.apache.spark.deploy.SparkSubmit" in cmd and "org.apache.spark.launcher.Main" not in cmd
    }
    spark_jvms = sum(parents.get(pid) not in drivers for pid in drivers)
    (cwd / f"cli-{kind}-{n}.processes").write_text(
        "\n".join(f"{pid} (parent {parents.get(pid)}) {cmd}" for pid, cmd in sorted(seen.items()))
    )

    instance = DagsterInstance.from_config(str(dagster_home))
    try:
        run = instance.get_runs(limit=1)[0]
        records = instance.all_logs(run.run_id)
    finally:
        instance.dispose()
    first: dict[tuple[str | None, str], float] = {}
    step_pids: set[int] = set()
    for rec in records:
        ev = rec.dagster_event
        if ev is None:
            continue
        first.setdefault((ev.step_key, ev.event_type_value), rec.timestamp)
        if ev.step_key and ev.event_type_value != DagsterEventType.STEP_WORKER_STARTING.value and ev.pid:
            step_pids.add(ev.pid)
    run_start = first.get((None, DagsterEventType.RUN_START.value), started_wall)
    steps, spawn = {}, 0.0
    for (step, etype), ts in first.items():
        if step and etype == DagsterEventType.STEP_START.value:
            end = first.get((step, DagsterEventType.STEP_SUCCESS.value))
            if end is not None:
                steps[step.split("[", 1)[0]] = end - ts  # a mapped step: view__v[e<epoch>]
            worker = first.get((step, DagsterEventType.STEP_WORKER_STARTING.value))
            if worker is not None:
                spawn += ts - worker
    return CliRun(
        wall=wall,
        spark_jvms=spark_jvms,
        helper_jvms=len(javas) - spark_jvms,
        jvm_log_lines=text.count("Setting default log level to"),
        step_processes=len(step_pids),
        processes_seen=len(seen),
        startup=run_start - started_wall,
        steps=steps,
        step_spawn=spawn,
    )


def bench_executors(
    root: Path, pipe: BenchPipeline, reps: int, budget: Budget
) -> tuple[Comparison, list[CliRun], list[CliRun]]:
    import dagster as dg

    dagster_home = root / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # (harness dropped the shell's EPOCHAL_* and put this checkout on PYTHONPATH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    env.update(pipe.env)
    env.update({"EPOCHAL_SPARK_MASTER": "local[2]", "DAGSTER_HOME": str(dagster_home)})
    # Bootstrap the home (its first run recovers from "bootstrap") outside the measurement.
    pipe.load()
    pipe.run_job(dg.DagsterInstance.ephemeral())
    comparison = Comparison("", "A  in_process executor", "B  multiprocess executor")
    a_runs, b_runs = [], []
    for i in range(reps):
        if i >= 1 and not budget.allows_another(comparison):
            log(f"  [executor] stopping after {i} of {reps} rep(s): the time budget is spent (--budget)")
            comparison.cut = f"cut from {reps} to {i} rep(s) by --budget"
            break
        a = run_cli("in_process", env, root, dagster_home, i)
        log(f"  [executor] {i + 1}/{reps}: A in_process {a.wall:.1f} s, {a.spark_jvms} Spark JVM(s)")
        b = run_cli("multiprocess", env, root, dagster_home, i)
        log(f"  [executor] {i + 1}/{reps}: B multiprocess {b.wall:.1f} s, {b.spark_jvms} Spark JVM(s)")
        comparison.a.append(a.wall)
        comparison.b.append(b.wall)
        a_runs.append(a)
        b_runs.append(b)
    return comparison, a_runs, b_runs


def render_executors(c: Comparison, a_runs: list[CliRun], b_runs: list[CliRun], data: str) -> str:
    def med(runs: list[CliRun], f: Callable[[CliRun], float]) -> float:
        return median([f(r) for r in runs])

    rows = []
    for name, runs in ((c.a_name, a_runs), (c.b_name, b_runs)):
        rows.append(
            [
                name,
                str(len(runs)),
                fmt_s(med(runs, lambda r: r.wall)),
                f"{med(runs, lambda r: r.spark_jvms):g}",
                f"{med(runs, lambda r: r.jvm_log_lines):g}",
                f"{med(runs, lambda r: r.step_processes):g}",
                f"{med(runs, lambda r: r.processes_seen):g}",
                fmt_s(med(runs, lambda r: r.startup)),
                fmt_s(med(runs, lambda r: r.step_spawn)),
                fmt_s(med(runs, lambda r: sum(r.steps.values()))),
            ]
        )
    headers = [
        "",
        "n",
        "wall",
        "Spark JVMs",
        "JVM log lines",
        "step procs",
        "procs seen",
        "to RUN_START",
        "step spawn",
        "sum of steps",
    ]
    names = {s for r in a_runs + b_runs for s in r.steps}

    def rank(step: str) -> tuple[int, str]:
        order = ("take_epochs", "barrier", "source__", "view__", "commit", "sink__", "compaction")
        return next((i for i, prefix in enumerate(order) if step.startswith(prefix)), len(order)), step

    step_rows = [
        [step] + [fmt_s(median([r.steps.get(step, float("nan")) for r in runs])) for runs in (a_runs, b_runs)]
        for step in sorted(names, key=rank)
    ]
    pairs = [b / a for a, b in zip(c.a, c.b, strict=True)]
    return "\n".join(
        [
            f"== executor: one epoch ({data}) as `dagster job execute`, A B A B" + (f"  [{c.cut}]" if c.cut else ""),
            table(headers, rows),
            f"ratio B/A (multiprocess over in-process): median of paired ratios {median(pairs):.2f}x "
            f"(pairs: {', '.join(f'{x:.2f}' for x in pairs)}); difference of medians "
            f"{median(c.b) - median(c.a):+.1f} s",
            "",
            "step durations inside the run (STEP_START -> STEP_SUCCESS, median; a step's first Spark call",
            "starts its process's JVM, so that time is inside the step):",
            table(["step", "in_process", "multiprocess"], step_rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="pairs (default 3)")
    parser.add_argument("--data", choices=["empty", "100k"], default="empty", help="the epoch's size")
    parser.add_argument("--budget", type=float, default=480,
                        help="seconds the run may take before pairs are cut (default 480); one pair always runs")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_executor-<time>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (per-run logs, process listings)")
    parser.add_argument("--verbose", action="store_true", help="let Dagster/Spark log to the terminal")
    args = parser.parse_args(argv)
    header = f"{harness.header('Epochal executor benchmark')}; {args.reps} pair(s), {args.data} epoch"
    log(header)
    budget = Budget(args.budget, {"executor": 1.0})
    with harness.workdir("bench_executor", args.keep) as root:
        with harness.stderr_to(root / "stderr.log", not args.verbose):
            empty_opts, _ = empty_source_options(root)
            opts = empty_opts if args.data == "empty" else f"'max.events.per.epoch' = '{EVENTS_FOR_100K_BIDS}'"
            pipe = BenchPipeline(root, f"executor-{args.data}", opts)
            c, a_runs, b_runs = bench_executors(root, pipe, args.reps, budget)
    label = "empty" if args.data == "empty" else f"{EVENTS_FOR_100K_BIDS:,} events, ~100k bids"
    result: dict[str, Any] = {"header": header, "args": vars(args), "comparison": c.to_json(),
                              "in_process": [vars(r) for r in a_runs], "multiprocess": [vars(r) for r in b_runs]}
    path = harness.save(harness.result_path("bench_executor", args.json), result)
    print()
    print(header)
    print(render_executors(c, a_runs, b_runs, label))
    log(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
