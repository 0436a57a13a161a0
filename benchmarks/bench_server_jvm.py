"""The managed Spark server's JVM flags: where a warmed server's CPU goes on the demo, per flag set.

    python benchmarks/bench_server_jvm.py                 # the default flags against the JVM's own
    python benchmarks/bench_server_jvm.py --epochs 10 --warm-up 8
    python benchmarks/bench_server_jvm.py --variant c1-small='-XX:+UseParallelGC -XX:TieredStopAtLevel=1'

For each flag set, one after another on this machine (it is shared and noisy: read the ratios,
measured in the same run, not the seconds): `epochal spark start --warm-up N` in a scratch home with
``spark.driver.extraJavaOptions`` set to the flags, then ``--epochs`` more epochs of the built-in demo
against that server (``epochal.spark.warmup.warm_up``, a scratch home of its own), then stop. It
reports, per epoch after the warm-up: the server's CPU, split by JVM thread (compiler threads, task
threads, GC, gRPC; from /proc/<pid>/task), and the epoch's wall time. The first variant, ``jvm``
(no flags: G1 and tiered C2, the JVM's defaults), is the baseline the ratios are against.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
from harness import REPO, log

from epochal.runtime.one_epoch import demo_epochs
from epochal.spark.server import SERVER_JAVA_OPTIONS
from epochal.spark.warmup import warm_up

#: JVM thread names, digits folded, grouped into what they do
GROUPS = (
    ("compiler", re.compile(r"^C\d CompilerThre|^Sweeper")),
    ("tasks", re.compile(r"^Executor task")),
    ("gc", re.compile(r"^GC Thread|^G\d |^VM Thread")),
    ("grpc", re.compile(r"^grpc-")),
    ("scheduler", re.compile(r"^dag-scheduler|^spark-listener|^dispatcher|^task-result")),
)


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """CPU seconds of each thread of ``pid``, by thread id: (name, seconds)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[tid] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return threads


def by_group(before: dict, after: dict) -> dict[str, float]:
    spent: dict[str, float] = collections.Counter()
    for tid, (name, seconds) in after.items():
        used = seconds - before.get(tid, (name, 0.0))[1]
        group = next((g for g, pattern in GROUPS if pattern.search(name)), "other")
        spent[group] += used
    return dict(spent)


def run_variant(name: str, flags: str, warm_up_epochs: int, epochs: int) -> dict:
    with harness.workdir(f"bench_server_jvm-{name}") as home:
        return measure_variant(home, flags, warm_up_epochs, epochs)


def measure_variant(home: Path, flags: str, warm_up_epochs: int, epochs: int) -> dict:
    env = {
        **os.environ,
        "EPOCHAL_HOME": str(home),
        "EPOCHAL_SPARK_CONF": json.dumps({"spark.driver.extraJavaOptions": flags}),
        "EPOCHAL_SPARK_PORT": "0",
    }
    cli = [sys.executable, "-m", "epochal.cli", "spark"]
    try:
        started = time.monotonic()
        out = subprocess.run([*cli, "start", "--warm-up", str(warm_up_epochs)], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise SystemExit(f"{flags or 'the JVM defaults'}: the server did not start:\n{out.stdout}\n{out.stderr}")
        start_s = time.monotonic() - started
        described = json.loads(subprocess.run([*cli, "status", "--json"], env=env, cwd=REPO, capture_output=True,
                                              text=True, check=True).stdout)
        pid, url = described["pid"], described["url"]
        before = thread_cpu(pid)
        report = warm_up(url, epochs, demo_epochs, pid, progress=lambda line: None)
        groups = by_group(before, thread_cpu(pid))
        return {
            "flags": flags,
            "start_and_warm_up_s": start_s,
            "warm_up_line": out.stdout.strip().splitlines()[-1],
            "epoch_s": report.epoch_s,
            "server_cpu_s": report.server_cpu_s,
            "cpu_per_epoch": {group: seconds / epochs for group, seconds in groups.items()},
            "rss_mib": (described.get("rss_bytes") or 0) / 2**20,
        }
    finally:
        subprocess.run([*cli, "stop"], env=env, cwd=REPO, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-up", type=int, default=8, help="warm-up epochs before the measured ones")
    parser.add_argument("--epochs", type=int, default=6, help="measured epochs per variant")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="more flag sets to compare (repeatable)")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_server_jvm-<time>.json)")
    args = parser.parse_args()
    log(harness.header("The managed Spark server's JVM flags"))
    variants = {"jvm": "", "epochal": SERVER_JAVA_OPTIONS}
    for item in args.variant:
        key, _, flags = item.partition("=")
        variants[key] = flags
    results = {}
    for name, flags in variants.items():
        log(f"{name}: {flags or '(the JVM defaults)'}")
        results[name] = run_variant(name, flags, args.warm_up, args.epochs)
        print(f"  {results[name]['warm_up_line']}", flush=True)
    base = statistics.median(results["jvm"]["server_cpu_s"])
    base_wall = statistics.median(results["jvm"]["epoch_s"])
    groups = [g for g, _ in GROUPS] + ["other"]
    print(f"\n{args.epochs} epochs of the demo after {args.warm_up} warm-up epochs; per epoch, medians:")
    header = f"{'variant':<12} {'server CPU':>10} {'ratio':>6} {'wall':>6} {'ratio':>6}  "
    print(header + " ".join(f"{g:>9}" for g in groups))
    for name, result in results.items():
        cpu = statistics.median(result["server_cpu_s"])
        wall = statistics.median(result["epoch_s"])
        split = " ".join(f"{result['cpu_per_epoch'].get(g, 0.0):>8.2f}s" for g in groups)
        print(f"{name:<12} {cpu:>9.2f}s {cpu / base:>5.2f}x {wall:>5.2f}s {wall / base_wall:>5.2f}x  {split}")
    path = harness.save(harness.result_path("bench_server_jvm", args.json), {"args": vars(args), "results": results})
    log(f"result: {path}")


if __name__ == "__main__":
    main()
