"""One demo epoch through `dagster job execute` with the run's steps one at a time against several
at once on threads (EPOCHAL_STEP_THREADS), on the same warm managed Spark server (issue 17).

    python benchmarks/bench_step_threads.py                 # 4 alternated pairs, 1 thread vs 2
    python benchmarks/bench_step_threads.py --threads 1,2,3 --pairs 3

A fresh Epochal home with the bundled demo (10,000 bids and 2,000 auctions an epoch, 13 views, 2
sinks) and its own Dagster home; the managed Spark server is started first and a warm-up epoch
runs. Then the settings alternate run by run (A B A B ...), each run `dagster job execute -m
platform_defs -j epoch_job` as a user types it, so each moves the pipeline one epoch. It prints the
run's wall time (process start to exit), its span in the event log (first to last event) and the
steps' summed time, per setting, and the median of the ratios of each pair against the first
setting (a pair shares the machine's momentary load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
from harness import REPO, log

from tests.dagster_dev import free_port, isolated_env

PY = sys.executable


def run_epoch(env: dict[str, str], threads: int) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job"],
        cwd=REPO,
        env={**env, "EPOCHAL_STEP_THREADS": str(threads)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"epoch_job failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {"wall_s": wall, **run_span(env)}


def run_span(env: dict[str, str]) -> dict[str, float]:
    """The newest epoch_job run's span and summed step time, from the Dagster instance."""
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    from dagster import DagsterInstance, RunsFilter

    with DagsterInstance.get() as instance:
        record = instance.get_run_records(RunsFilter(job_name="epoch_job"), limit=1)[0]
        logs = instance.all_logs(record.dagster_run.run_id)
        starts: dict[str, float] = {}
        steps = 0.0
        for entry in logs:
            event = entry.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.is_step_start:
                starts[event.step_key] = entry.timestamp
            elif (event.is_step_success or event.is_step_failure) and event.step_key in starts:
                steps += entry.timestamp - starts[event.step_key]
        return {"span_s": logs[-1].timestamp - logs[0].timestamp, "steps_s": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="EPOCHAL_STEP_THREADS values, the first is the baseline")
    p.add_argument("--pairs", type=int, default=4, help="alternated rounds (default 4)")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_step_threads-<time>.json)")
    args = p.parse_args(argv)
    settings = [int(t) for t in args.threads.split(",")]
    log(harness.header("Step threads against one demo epoch"))
    with harness.workdir("bench_step_threads") as root:
        results = measure(args, settings, root)

    base = settings[0]
    print()
    print(f"== one demo epoch through `dagster job execute`, warm managed server, {args.pairs} rounds")
    for threads in settings:
        runs = results[threads]
        line = (
            f"{threads} thread(s): wall median {statistics.median(r['wall_s'] for r in runs):.1f}s, run span "
            f"{statistics.median(r['span_s'] for r in runs):.1f}s, steps summed "
            f"{statistics.median(r['steps_s'] for r in runs):.1f}s"
        )
        if threads != base:
            for key in ("wall_s", "span_s"):
                ratios = [r[key] / b[key] for r, b in zip(runs, results[base], strict=True)]
                line += f"; {key[:-2]} / {base} thread(s) {statistics.median(ratios):.2f}x"
        print(line)
    out = harness.save(harness.result_path("bench_step_threads", args.json), {"args": vars(args), "results": results})
    log(f"result: {out}")
    return 0


def measure(args: argparse.Namespace, settings: list[int], root: Path) -> dict[int, list[dict[str, float]]]:
    env = isolated_env(root)
    env.update({"EPOCHAL_SPARK_MODE": "server", "EPOCHAL_SPARK_PORT": str(free_port())})
    subprocess.run([PY, "-m", "epochal.cli", "spark", "start"], env=env, cwd=REPO, check=True, capture_output=True)
    results: dict[int, list[dict[str, float]]] = {t: [] for t in settings}
    try:
        log(f"root {root}; warm-up epoch")
        run_epoch(env, settings[0])
        for round_ in range(args.pairs):
            for threads in settings if round_ % 2 == 0 else list(reversed(settings)):
                figures = run_epoch(env, threads)
                results[threads].append(figures)
                log(
                    f"round {round_ + 1}, {threads} thread(s): wall {figures['wall_s']:.1f}s, run span "
                    f"{figures['span_s']:.1f}s, steps {figures['steps_s']:.1f}s"
                )
    finally:
        subprocess.run([PY, "-m", "epochal.cli", "spark", "stop"], env=env, cwd=REPO, capture_output=True)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
