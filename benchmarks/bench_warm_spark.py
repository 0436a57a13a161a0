"""A warm Spark server vs a JVM per run: `dagster job execute` of epoch_job, wall time with process start.

    python benchmarks/bench_warm_spark.py                 # 3 timed pairs per epoch size
    python benchmarks/bench_warm_spark.py --reps 5 --data small
    python benchmarks/bench_warm_spark.py --dagster-home     # runs on a persistent Dagster instance

Each pair runs the same epoch_job twice, interleaved A B A B on one EPOCHAL_HOME (the machine is
shared and noisy: the ratio is the median of the per-pair ratios):

A. local   EPOCHAL_SPARK_MODE=local: a run starts Spark in its process when a step
           first needs it.
B. server  EPOCHAL_SPARK_MODE=server, the default: the run attaches to the Spark Connect server
           Epochal manages, started (and timed) once before the pairs by `epochal spark start`.

Epoch sizes (--data): ``empty`` (a Nexmark source with max.events.per.epoch = 0: no new records) and
``small`` (100 Nexmark events an epoch: ~92 bids through a view into a DuckDB sink). One untimed run
of each mode comes first (it creates the tables). Then a breakdown of a run's fixed costs, each in a
fresh process: the interpreter, importing Dagster's CLI, loading the definitions, and a Spark
session's first query (attach to the warm server vs start a local JVM), plus the steps' own times
from the last server run's log. Everything lives in a temp dir, removed at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import REPO, log

PY = sys.executable
BID = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP, extra STRING"
EVENTS = {"empty": 0, "small": 100}


def pipeline(directory: Path, events: int) -> None:
    directory.mkdir(parents=True)
    (directory / "01_sources.sql").write_text(
        f"CREATE SOURCE bid ({BID})\nWITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid', "
        f"'nexmark.split.num' = '2', 'max.events.per.epoch' = '{events}');\n"
    )
    (directory / "02_views.sql").write_text(
        "CREATE MATERIALIZED VIEW big_bids AS\n"
        "SELECT auction, bidder, price * 0.908 AS price_eur, date_time FROM bid WHERE price > 1000;\n"
    )
    (directory / "03_sinks.sql").write_text(
        "CREATE SINK big_bids_out FROM big_bids\nWITH (connector = 'duckdb', database = 'out/sink.duckdb', "
        "table = 'big_bids', type = 'append-only');\n"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def timed(command: list[str], env: dict[str, str], cwd: Path, log: Path | None = None) -> float:
    started = time.perf_counter()
    run = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    if log is not None:
        log.write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        raise SystemExit(f"failed ({run.returncode}): {' '.join(command)}\n{(run.stdout + run.stderr)[-3000:]}")
    return seconds


def job(env: dict[str, str], cwd: Path, log: Path | None = None) -> float:
    return timed([PY, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job"], env, cwd, log)


def python(code: str, env: dict[str, str], cwd: Path) -> float:
    return timed([PY, "-c", code], env, cwd)


def step_times(log: Path) -> dict[str, float]:
    found = {}
    for match in re.finditer(r'Finished execution of step "([^"]+)" in ([\d.]+)(ms|s)', log.read_text()):
        found[match.group(1)] = float(match.group(2)) / (1000 if match.group(3) == "ms" else 1)
    return found


def med(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}s"


def bench(kind: str, root: Path, reps: int, dagster_home: bool) -> dict[str, Any]:
    home, pipe = root / kind / "home", root / kind / "pipeline"
    pipeline(pipe, EVENTS[kind])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_HOME", "SPARK_REMOTE"))}
    base |= {"EPOCHAL_HOME": str(home), "EPOCHAL_PIPELINE": str(pipe), "EPOCHAL_SPARK_PORT": str(free_port()),
             "PYTHONPATH": str(REPO)}
    if dagster_home:  # a persistent instance, as `dagster dev` runs have; else each run makes a temporary one
        (root / kind / "dagster_home").mkdir(parents=True)
        base["DAGSTER_HOME"] = str(root / kind / "dagster_home")
    env = {"local": {**base, "EPOCHAL_SPARK_MODE": "local"}, "server": {**base, "EPOCHAL_SPARK_MODE": "server"}}
    cwd = root / kind
    instance = "persistent DAGSTER_HOME" if dagster_home else "no DAGSTER_HOME: a temporary instance per run"
    print(f"\n== {kind} epoch ({EVENTS[kind]} Nexmark events an epoch), {reps} pairs, {instance}", flush=True)
    # no warm-up epochs: the figure is the server's own start, as a run starting it on first use pays
    start = timed([PY, "-m", "epochal.cli", "spark", "start", "--warm-up", "0"], env["server"], cwd)
    print(f"server start (cold, `epochal spark start --warm-up 0`): {start:.2f}s", flush=True)
    try:
        job(env["local"], cwd), job(env["server"], cwd)  # untimed: the first epoch creates the tables
        walls: dict[str, list[float]] = {"local": [], "server": []}
        last = cwd / "last-server-run.log"
        for rep in range(reps):
            walls["local"].append(job(env["local"], cwd))
            walls["server"].append(job(env["server"], cwd, last))
            print(f"  pair {rep + 1}: local {walls['local'][-1]:.2f}s  server {walls['server'][-1]:.2f}s", flush=True)
        ratio = statistics.median(a / b for a, b in zip(walls["local"], walls["server"], strict=True))
        print(f"epoch_job wall, median: local {med(walls['local'])}  warm server {med(walls['server'])}  "
              f"local/server {ratio:.2f}x", flush=True)

        print("where a warm-server run's time goes (medians, each in a fresh process):", flush=True)
        # (timed, never called: the module `dagster job execute` loads first, so its import cost is
        # the CLI's; no public name stands for it)
        parts = {
            "interpreter start": "pass",
            "+ import Dagster's CLI": "import dagster._cli.job",
            "+ load definitions (platform_defs)": "import dagster._cli.job, platform_defs",
            "a process: Spark session + 1st query, warm server": "from epochal.settings import Settings\n"
            "from epochal.spark.attach import session_for\n"
            "session_for(Settings.from_env(), 'bench').range(1).count()",
        }
        measured = {}
        for label, code in parts.items():
            measured[label] = statistics.median(python(code, env["server"], cwd) for _ in range(reps))
            print(f"  {label:<50} {measured[label]:6.2f}s", flush=True)
        definitions = measured["+ load definitions (platform_defs)"]
        local_spark = "from epochal.settings import Settings\nfrom epochal.spark.attach import session_for\n" \
                      "session_for(Settings.from_env(), 'bench').range(1).count()"
        print(f"  {'a process: Spark session + 1st query, local JVM':<50} "
              f"{med([python(local_spark, env['local'], cwd) for _ in range(min(reps, 2))])}", flush=True)
        steps = step_times(last)
        print(f"  steps of the last server run: {sum(steps.values()):.2f}s  "
              + ", ".join(f"{name} {s:.2f}s" for name, s in steps.items()), flush=True)
        print(f"  the rest of that run (Dagster's instance, run and event storage): "
              f"{walls['server'][-1] - definitions - sum(steps.values()):.2f}s", flush=True)
        return {"server_start_s": start, "walls_s": walls, "ratio": ratio, "parts_s": measured,
                "last_server_run_steps_s": steps}
    finally:
        stop = timed([PY, "-m", "epochal.cli", "spark", "stop"], env["server"], cwd)
        print(f"server stop: {stop:.2f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data", choices=("empty", "small", "both"), default="both")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--dagster-home", action="store_true", help="runs use a persistent DAGSTER_HOME")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_warm_spark-<time>.json)")
    args = parser.parse_args()
    log(harness.header("A warm Spark server against a JVM per run"))
    result: dict[str, Any] = {"args": vars(args)}
    with harness.workdir("bench_warm_spark", args.keep) as root:
        log(f"state under {root}")
        for kind in ("empty", "small") if args.data == "both" else (args.data,):
            result[kind] = bench(kind, root, args.reps, args.dagster_home)
    log(f"result: {harness.save(harness.result_path('bench_warm_spark', args.json), result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
