"""Sustained epochs from the Dagster daemon (issue 17, goal 1): `dagster dev` on the demo pipeline,
`barrier_sensor` on, for a fixed time, against a warm Spark server Epochal manages.

    python benchmarks/bench_daemon.py                    # 10 minutes at the 10 s barrier interval
    python benchmarks/bench_daemon.py --minutes 3        # a shorter look
    python benchmarks/bench_daemon.py --spark-mode local # every run starts its own JVM, for the ratio
    python benchmarks/bench_daemon.py --standby both --minutes 6  # without, then with, the standby run

It starts, in a temporary directory: Epochal's Spark Connect server (`epochal spark start`, which first
warms it with `--warm-up` epochs of the demo in a scratch home, 8 by default, timed apart), then
`dagster dev` with its own DAGSTER_HOME (webserver, daemon, code server: what a user runs), turns the
sensor on through the webserver's GraphQL API, and lets the daemon drive epochs. Every 2 s it samples
the Spark server's resident memory. At the end it reads what happened from the two stores of record:
the meta store (epochs injected and committed, recoveries, sink batches) and the Dagster instance
(epoch_job runs: how long each took, how many failed). It prints:

* epochs committed per minute, against the barrier interval's 60/interval (the target: one epoch
  committed per interval, sustained);
* the duration of epoch_job runs, and how many epochs each took (a run that starts late takes the
  epochs waiting for it);
* event-to-sink freshness per epoch: from its injection to the last sink having committed it
  (target: at most 30 s); and both figures again for the epochs after the first `--settle-minutes`
  (2), while a fresh server still compiles Spark: shown apart, never instead;
* CPU seconds per committed epoch by part (the Spark server, the runs, its Python workers, the
  daemon, the code server, ...), sampled from /proc: where the two cores go;
* the number of Python worker processes of the Spark server at the end (bounded: Spark 4.3 keeps a
  Connect session's workers until it stops, so a run that starts some leaves them behind);
* the Spark server's peak and final resident memory, and its memory at the end of each minute
  (bounded: the last minutes do not keep growing);
* with `--standby both`, the same measured twice in one invocation, without the standby run
  (EPOCHAL_STANDBY_RUN=off) and then with it, and the ratios of the two.

Results also go to a JSON file under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import harness
from harness import REPO, log

from tests.dagster_dev import LOCATION, dagster_dev, free_port, isolated_env

PY = sys.executable
START_SENSOR = """
mutation($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { id sensorState { status } }
    ... on PythonError { message }
  }
}"""
STOP_SENSOR = """
mutation($id: String) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}"""
RUNS_IN_FLIGHT = """
query {
  runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED]}) {
    __typename
    ... on Runs { results { runId } }
  }
}"""
#: after the measured minutes, how long the runs the sensor started may take to finish: stopping
#: `dagster dev` under a run would count its interruption as a failed run
DRAIN_S = 180.0


def spark_server(command: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PY, "-m", "epochal.cli", "spark", command, *args], env=env, cwd=REPO, check=True, capture_output=True,
        text=True,
    )
    return done.stdout


class MemorySampler(threading.Thread):
    """Resident memory of the Spark server, every ``interval_s``, from /proc (no Spark call)."""

    def __init__(self, home: Path, interval_s: float = 2.0):
        super().__init__(daemon=True)
        self.home, self.interval_s = home, interval_s
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()

    def run(self) -> None:
        from epochal.spark import server as spark_server

        while not self._done.wait(self.interval_s):
            current = spark_server.status(self.home)
            if current is not None and current.rss_bytes:
                self.samples.append((time.time(), current.rss_bytes))

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


#: how a process's command line names its part, first match wins
CPU_PARTS = (
    ("spark server", ("org.apache.spark",)),
    # the code server starts each run in a process of its own through multiprocessing's spawn
    ("epoch_job runs", ("execute_run", "execute_step", "multiprocessing.spawn import spawn_main")),
    ("spark python workers", ("pyspark.daemon", "pyspark.worker")),
    ("daemon", ("dagster-daemon", "dagster._daemon", "daemon run")),
    ("webserver", ("dagster-webserver", "dagster_webserver")),
    ("code server", ("grpc", "code-server", "code_server")),
    ("meta store (postgres)", ("postgres",)),
    ("dagster dev", ("dagster dev",)),
    # its own sampling of /proc every second: measurement cost, shown apart from the system measured
    ("this benchmark", ("bench_daemon.py",)),
    ("compute log tails", ("tail -F", "watch_orphans.py")),
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _part(cmdline: str) -> str:
    if not cmdline.strip():  # kworkers and the like: the kernel's share of the I/O, mostly
        return "kernel threads"
    for part, needles in CPU_PARTS:
        if any(needle in cmdline for needle in needles):
            return part
    return "other"


class CpuSampler(threading.Thread):
    """CPU seconds (user + system) of every process on the machine, by part, from /proc: where the
    cores went. A process's last sample before it exits stands for its total, so a short-lived run
    loses at most ``interval_s`` of CPU."""

    def __init__(self, interval_s: float = 1.0):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.latest: dict[int, tuple[str, float]] = {}
        #: the command lines behind "other", by pid, so a large share can be named
        self.other_commands: dict[int, str] = {}
        self._done = threading.Event()

    def _sample(self) -> dict[int, tuple[str, float]]:
        seen: dict[int, tuple[str, float]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            part = _part(cmdline)
            if part == "other":
                self.other_commands[int(entry.name)] = cmdline[:120]
            seen[int(entry.name)] = (part, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
        return seen

    def run(self) -> None:
        self.first = {pid: cpu for pid, (_, cpu) in self._sample().items()}
        while not self._done.wait(self.interval_s):
            self.latest = self._sample()
            self.last.update(self.latest)

    def alive(self, part: str) -> int:
        """How many processes of ``part`` the latest sample found."""
        return sum(1 for name, _ in self.latest.values() if name == part)

    def stop(self) -> dict[str, float]:
        """CPU seconds by part since the sampler started."""
        self._done.set()
        self.join(timeout=10)
        by_part: dict[str, float] = {}
        for pid, (part, cpu) in self.last.items():
            by_part[part] = by_part.get(part, 0.0) + cpu - self.first.get(pid, 0.0)
        return {part: round(cpu, 1) for part, cpu in sorted(by_part.items(), key=lambda kv: -kv[1])}

    def top_other(self, count: int = 5) -> list[tuple[str, float]]:
        """The command lines that spent the most of "other" (CPU seconds since the sampler started)."""
        by_command: dict[str, float] = {}
        for pid, command in self.other_commands.items():
            if pid in self.last:
                by_command[command] = by_command.get(command, 0.0) + self.last[pid][1] - self.first.get(pid, 0.0)
        return sorted(((c, round(v, 1)) for c, v in by_command.items()), key=lambda kv: -kv[1])[:count]


def meta_store_figures(env: dict[str, str], since: float, until: float) -> dict[str, Any]:
    """Epochs, recoveries and sink deliveries as the meta store recorded them."""
    from epochal.meta.backend import open_backend
    from epochal.pipeline.loader import load_pipeline
    from epochal.settings import Settings

    settings = Settings.from_env(env)
    backend = open_backend(settings.meta_url)

    def read(cur):  # noqa: ANN001, ANN202
        epochs = cur.execute(
            "SELECT epoch, state, injected_at, committed_at FROM epochs WHERE injected_at >= ? ORDER BY epoch",
            [since],
        ).fetchall()
        batches = cur.execute(
            "SELECT sink, first_epoch, last_epoch, updated_at FROM sink_batches WHERE state = 'COMMITTED'"
        ).fetchall()
        recoveries = cur.execute(
            "SELECT reason, started_at FROM recoveries WHERE started_at >= ? ORDER BY started_at", [since]
        ).fetchall()
        return epochs, batches, recoveries

    epochs, batches, recoveries = backend.transaction(read)
    sinks = sorted(load_pipeline(settings.pipeline_dir).sinks)  # a sink that never delivered counts too
    committed = [e for e in epochs if e[1] == "COMMITTED" and e[3] is not None and e[3] <= until]
    freshness, fresh_injected = [], []
    for epoch, _state, injected, _committed in committed:
        delivered = []
        for sink in sinks:
            times = [b[3] for b in batches if b[0] == sink and b[1] <= epoch <= b[2]]
            if times:
                delivered.append(min(times))
        if len(delivered) == len(sinks) and delivered:
            freshness.append(max(delivered) - injected)
            fresh_injected.append(injected - since)
    return {
        "injected": len([e for e in epochs if e[2] <= until]),
        "committed": len(committed),
        "aborted": len([e for e in epochs if e[1] == "ABORTED"]),
        "recoveries": [r[0] for r in recoveries],
        "sinks": sinks,
        "freshness_s": freshness,
        # seconds after the sensor went on: the epoch of each freshness figure was injected, and
        # each epoch committed (for the figures after the start-up minutes)
        "freshness_injected_s": fresh_injected,
        "committed_at_s": [e[3] - since for e in committed],
        "commit_latency_s": [e[3] - e[2] for e in committed],
    }


def run_figures(dagster_home: Path) -> dict[str, Any]:
    """epoch_job runs from the Dagster instance: durations, outcomes, epochs per run."""
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    with DagsterInstance.get() as instance:
        records = instance.get_run_records(RunsFilter(job_name="epoch_job"))
        durations, statuses = [], {}
        for record in records:
            statuses[record.dagster_run.status.value] = statuses.get(record.dagster_run.status.value, 0) + 1
            if record.dagster_run.status == DagsterRunStatus.SUCCESS and record.start_time and record.end_time:
                durations.append(record.end_time - record.start_time)
        taken, stood_by = [], []
        for record in records:
            events = instance.all_logs(record.dagster_run.run_id)
            partitions = {
                e.dagster_event.step_materialization_data.materialization.partition
                for e in events
                if e.dagster_event is not None
                and e.dagster_event.is_step_materialization
                and e.dagster_event.step_materialization_data.materialization.asset_key.path == ["epoch_commit"]
            }
            taken.append(len(partitions))
            stood = [
                float(e.user_message.split()[2].rstrip("s")) for e in events if e.user_message.startswith("stood by ")
            ]
            stood_by.append(stood[0] if stood else 0.0)
        # why a run failed: its failed steps' errors, or the run's own failure message
        failures = []
        for record in records:
            if record.dagster_run.status != DagsterRunStatus.FAILURE:
                continue
            reasons = [
                f"{e.step_key}: {e.dagster_event.step_failure_data.error.message.strip()[:300]}"
                if e.dagster_event.is_step_failure and e.dagster_event.step_failure_data.error
                else (e.dagster_event.message or "")[:300]
                for e in instance.all_logs(record.dagster_run.run_id)
                if e.dagster_event is not None and (e.dagster_event.is_step_failure or e.dagster_event.is_run_failure)
            ]
            failures.append(
                {"run_id": record.dagster_run.run_id, "tags": dict(record.dagster_run.tags), "reasons": reasons}
            )
    return {
        "statuses": statuses,
        "durations_s": durations,
        "epochs_per_run": taken,
        "stood_by_s": stood_by,
        "failures": failures,
    }


def describe(values: list[float], unit: str = "s") -> str:
    if not values:
        return "none"
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
    return (
        f"median {statistics.median(values):.1f}{unit}, p90 {p90:.1f}{unit}, max {values[-1]:.1f}{unit} "
        f"(n={len(values)})"
    )


def measure(args: argparse.Namespace, standby: str) -> dict[str, Any]:
    """One measurement: a new home, the Spark server, `dagster dev` with the sensor on for
    ``args.minutes``, then the figures from the meta store and the Dagster instance."""
    with harness.workdir("bench_daemon", args.keep) as root:
        return measure_in(args, standby, root)


def measure_in(args: argparse.Namespace, standby: str, root: Path) -> dict[str, Any]:
    env = isolated_env(root)
    env.update(
        {
            "EPOCHAL_SPARK_MODE": args.spark_mode,
            "EPOCHAL_SPARK_PORT": str(free_port()),
            "EPOCHAL_BARRIER_INTERVAL_MS": str(args.interval_ms),
            "EPOCHAL_STANDBY_RUN": standby,
        }
    )
    if args.spark_conf:  # the calling shell's EPOCHAL_* are dropped (harness): the conf comes from here
        env["EPOCHAL_SPARK_CONF"] = args.spark_conf
    home = Path(env["EPOCHAL_HOME"])
    log(
        f"root {root}; Spark {args.spark_mode}; barrier every {args.interval_ms} ms for {args.minutes} min; "
        f"standby run {standby}"
    )
    if args.spark_mode == "server":
        started = time.time()
        out = spark_server("start", env, "--warm-up", str(args.warm_up))
        warmed = [line for line in out.splitlines() if "warmed up" in line]
        log(f"Spark server started in {time.time() - started:.1f}s{(': ' + warmed[-1]) if warmed else ''}")
    sampler = MemorySampler(home)
    sampler.start()
    result: dict[str, Any] = {"args": vars(args), "standby": standby, "root": str(root)}
    try:
        command = [PY, "-m", "dagster", "dev", "-w", "workspace.yaml"]
        with dagster_dev(command, env, root / "dagster_dev.log") as server:
            selector = {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "sensorName": "barrier_sensor",
            }
            started = server.graphql(START_SENSOR, {"selector": selector})["startSensor"]
            if started["__typename"] != "Sensor":
                raise RuntimeError(f"could not start barrier_sensor: {started}")
            since = time.time()
            cpu = CpuSampler()
            cpu.start()
            log("barrier_sensor on")
            deadline = since + args.minutes * 60
            minute_marks: list[tuple[float, int | None]] = []
            while time.time() < deadline:
                time.sleep(min(60.0, max(0.0, deadline - time.time())))
                rss = sampler.samples[-1][1] if sampler.samples else None
                minute_marks.append((time.time() - since, rss))
                figures = meta_store_figures(env, since, time.time())
                log(
                    f"{(time.time() - since) / 60:.1f} min: {figures['committed']} committed, "
                    f"{len(figures['recoveries'])} recoveries, server RSS "
                    f"{rss / 2**20 if rss else float('nan'):.0f} MiB"
                )
            until = time.time()
            result["python_workers_at_end"] = cpu.alive("spark python workers")
            result["cpu_s"] = cpu.stop()
            result["cpu_other_top"] = cpu.top_other()
            stopped = server.graphql(STOP_SENSOR, {"id": started["id"]})["stopSensor"]
            if stopped["__typename"] != "StopSensorMutationResult":
                log(f"could not stop barrier_sensor: {stopped}")
            drain_until = time.time() + DRAIN_S
            while time.time() < drain_until:
                flying = server.graphql(RUNS_IN_FLIGHT, {})["runsOrError"].get("results", [])
                if not flying:
                    break
                time.sleep(2.0)
            log(f"sensor off; runs in flight drained in {time.time() - until:.0f}s (not counted in the figures)")
        result["meta"] = meta_store_figures(env, since, until)
        result["runs"] = run_figures(Path(env["DAGSTER_HOME"]))
        result["minutes"] = (until - since) / 60
        result["memory_mib"] = [(round(t, 1), round(b / 2**20)) for t, b in minute_marks if b]
    finally:
        sampler.stop()
        if args.spark_mode == "server":
            spark_server("stop", env)
    peak = max((b for _, b in sampler.samples), default=None)
    result["server_peak_mib"] = round(peak / 2**20) if peak else None
    return result


def report(args: argparse.Namespace, result: dict[str, Any]) -> float:
    """Print one measurement's figures; returns its epochs committed per minute."""
    meta, runs = result["meta"], result["runs"]
    per_minute = meta["committed"] / result["minutes"]
    goal = 60_000 / args.interval_ms
    print()
    print(
        f"== {args.minutes:g} min of barrier_sensor at {args.interval_ms} ms, Spark {args.spark_mode}, "
        f"standby run {result['standby']}"
    )
    print(
        f"epochs: {meta['injected']} injected, {meta['committed']} committed, {meta['aborted']} aborted; "
        f"{per_minute:.2f} committed/min against {goal:.2f}/min at the interval ({per_minute / goal:.2f}x)"
    )
    print(f"recoveries: {len(meta['recoveries'])} {meta['recoveries'][:3]}")
    print(f"epoch_job runs: {runs['statuses']}; durations {describe(runs['durations_s'])}")
    if any(runs["stood_by_s"]):
        print(f"  of which standing by for the working run: {describe(runs['stood_by_s'])}")
    for failure in runs["failures"]:
        print(f"  failed run {failure['run_id'][:8]}: " + (" | ".join(failure["reasons"]) or "no failure event"))
    print(f"epochs per run: {describe([float(n) for n in runs['epochs_per_run']], '')}")
    print(f"injection to commit: {describe(meta['commit_latency_s'])}")
    print(f"event-to-sink freshness ({', '.join(meta['sinks'])}): {describe(meta['freshness_s'])} (target <= 30s)")
    settle = args.settle_minutes
    if result["minutes"] > settle + 1 and "committed_at_s" in meta:
        # A fresh server spends its first minutes compiling Spark itself (performance.md): shown
        # apart, never instead of the figures over the whole time above.
        late = [t for t in meta["committed_at_s"] if t >= settle * 60]
        pairs = zip(meta["freshness_s"], meta["freshness_injected_s"], strict=True)
        fresh = [f for f, t in pairs if t >= settle * 60]
        print(
            f"after the first {settle:g} min: {len(late) / (result['minutes'] - settle):.2f} committed/min; "
            f"freshness {describe(fresh)}"
        )
    if result.get("cpu_s"):
        total = sum(result["cpu_s"].values())
        epochs = max(meta["committed"], 1)
        cores = os.cpu_count() or 1
        print(
            f"CPU over the measured minutes: {total:.0f} s of the {cores * 60 * result['minutes']:.0f} core-s of "
            f"{cores} cores; per committed epoch: "
            + ", ".join(f"{part} {cpu / epochs:.1f} s" for part, cpu in result["cpu_s"].items())
        )
        if result.get("cpu_other_top"):
            print("  'other', the most: " + "; ".join(f"{c} ({v:.0f} s)" for c, v in result["cpu_other_top"]))
    if "python_workers_at_end" in result:
        print(f"Spark server's Python worker processes at the end: {result['python_workers_at_end']}")
    if result["server_peak_mib"]:
        print(
            f"Spark server RSS: peak {result['server_peak_mib']} MiB; by minute "
            + ", ".join(f"{m} MiB" for _, m in result["memory_mib"])
        )
    return per_minute


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long the sensor drives epochs (default 10)")
    p.add_argument("--interval-ms", type=int, default=10_000, help="EPOCHAL_BARRIER_INTERVAL_MS (default 10000)")
    p.add_argument("--spark-mode", choices=["server", "local"], default="server")
    p.add_argument(
        "--settle-minutes",
        type=float,
        default=2.0,
        help="also report the figures after this many minutes of a fresh server (default 2)",
    )
    p.add_argument(
        "--warm-up",
        type=int,
        default=8,
        help="epochs of the demo `epochal spark start` runs against the new server before the sensor goes on "
        "(EPOCHAL_SPARK_WARMUP_EPOCHS's default, 8; 0: a cold server)",
    )
    p.add_argument(
        "--standby",
        choices=["on", "off", "both"],
        default="on",
        help="EPOCHAL_STANDBY_RUN; both: measure off, then on, and print the ratios (default on)",
    )
    p.add_argument("--json", help="result file (default benchmarks/results/bench_daemon-<time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--spark-conf",
        help="EPOCHAL_SPARK_CONF of the runs and the server (e.g. spark.sql.adaptive.enabled=false); the calling "
        "shell's EPOCHAL_* variables are not passed on",
    )
    args = p.parse_args(argv)
    log(harness.header("Sustained epochs from the Dagster daemon"))

    modes = ["off", "on"] if args.standby == "both" else [args.standby]
    results = [measure(args, mode) for mode in modes]
    rates = [report(args, result) for result in results]
    if len(results) == 2:
        fresh = [
            statistics.median(r["meta"]["freshness_s"]) if r["meta"]["freshness_s"] else float("nan") for r in results
        ]
        print()
        print(
            f"standby on / off, same invocation: committed/min {rates[1]:.2f} / {rates[0]:.2f} = "
            f"{rates[1] / rates[0]:.2f}x; freshness median {fresh[1]:.1f}s / {fresh[0]:.1f}s = "
            f"{fresh[1] / fresh[0]:.2f}x"
        )
    out = harness.save(harness.result_path("bench_daemon", args.json), results[0] if len(results) == 1 else
                       {"standby_off": results[0], "standby_on": results[1]})
    log(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
