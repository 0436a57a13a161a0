"""Chaos run (issue 16, part 10): everything at once for a while, then settle and check.

For ``--seconds`` (default 600) it runs, all at once, against one pipeline in a temp EPOCHAL_HOME:

* producers appending records continuously to an append-only log source (``events``) and a keyed
  one (``accounts``: upserts and deletes), two splits each, with a few malformed records;
* two loops of ``dagster job execute -m platform_defs -j epoch_job``, each starting its next run
  when the previous one ends;
* the real ``barrier_sensor`` of ``platform_defs``, evaluated every EPOCHAL_BARRIER_INTERVAL_MS,
  each RunRequest started as ``dagster job execute --tags '{"dagster/partition": ...}'``;
* ``epochal recover`` at random;
* SIGKILL of a random running run (its whole process group: the run and its JVM) at random;
* the pipeline changing under it, as a user edits its SQL files (``--no-changes`` leaves it alone):
  at 30 % of the chaos a view and an upsert sink over it are added (the view backfills while epochs
  go on; a loop of ``dagster job execute -j backfill_job`` advances it, and its runs are killed at
  random too), at 55 % a view's statement changes under its upsert sink (rebuilt while the old one
  serves, then switched), and at 75 % a view nothing reads is dropped.

Then it stops the producers, the kills and the recoveries, kills what still runs, and settles:
``epochal recover``, then ``epoch_job`` runs (and ``backfill_job`` runs while a backfill or a
changed view's switch is pending) until the committed epoch has read every produced line, one
more, and every sink's delivery. Three checks follow, against an oracle that shares no code
with what it checks (plain Python resolves the produced records; DuckDB runs each view's SQL as a
batch query over them):

1. every produced record is in its source exactly once, keys resolved (last record per key wins,
   deletes remove), and every malformed record is in the source's dead letters exactly once;
2. every view equals its SQL run over the oracle's source rows (a changed view its new SQL; a
   dropped view is gone, with its files);
3. every sink's table holds exactly its view (and has delivered the committed epoch).

It prints runs (started, succeeded, failed and why, killed), sensor ticks, recoveries (by reason),
epochs committed and aborted and records produced, then the checks, and exits 1 when a check fails.

    python benchmarks/chaos.py --seconds 120            # a short run to see it work
    python benchmarks/chaos.py                          # 10 minutes, PostgreSQL meta store
    python benchmarks/chaos.py --meta duckdb --keep     # the embedded meta store; keep the temp dir
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from chaos_oracle import (
    ADDED_VIEW_SQL,
    CHANGED_REGION_STATS,
    DROPPED_VIEW,
    PIPELINE,
    SPLITS,
    Produced,
    account_line,
    check,
    event_line,
)
from harness import log

POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# Exceptions a run may legitimately fail with under chaos (a recovery aborted its epoch, the
# in-flight limit was reached, ...); anything else in a failed run's log is printed as suspect.
EXPECTED_FAILURES = {"EpochAborted", "OrderWaitAbandoned", "InjectionBlocked"}
_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][\w.]*?(?:Error|Exception|Aborted|Abandoned|Blocked|Violation|Compacted)): (.*)$", re.MULTILINE
)
_STEP_START = re.compile(r'Started execution of step "([^"]+)"')


# ------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    number: int
    kind: str  # loop, sensor, settle
    partition: str | None
    proc: subprocess.Popen
    log_path: Path
    started: float
    killed: bool = False
    killed_in: str | None = None
    at_end: bool = False
    returncode: int | None = None
    ended: float | None = None
    error: str | None = None
    #: every exception the failed run's log names
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.killed:
            return "killed"
        return "succeeded" if self.returncode == 0 else "failed"


def last_step(log_path: Path) -> str:
    try:
        steps = _STEP_START.findall(log_path.read_text(errors="replace"))
    except OSError:
        return "?"
    return steps[-1] if steps else "(before the first step)"


def failures_in(log_path: Path) -> list[tuple[str, str]]:
    """Every exception a failed run's log names (short class name, message), first seen first,
    without Dagster's and click's wrappers."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return [("?", "no log")]
    found: dict[str, str] = {}
    for m in _EXCEPTION_LINE.finditer(text):
        if not m.group(1).startswith(("dagster", "click")):
            found.setdefault(m.group(1).rsplit(".", 1)[-1], m.group(2)[:300])
    return list(found.items()) or [("?", text.strip().splitlines()[-1] if text.strip() else "empty log")]


def failure_of(failures: list[tuple[str, str]]) -> str:
    """Why a run failed: the abort it met if it met one (an epoch aborted under a running step
    also breaks that step's reads, whose errors are then a consequence), else its first exception."""
    expected = [f for f in failures if f[0] in EXPECTED_FAILURES]
    name, message = (expected or failures)[0]
    return f"{name}: {message}"


class Chaos:
    def __init__(self, args: argparse.Namespace, root: Path, env: dict[str, str]):
        self.args = args
        self.root = root
        self.env = env
        self.home = Path(env["EPOCHAL_HOME"])
        self.runs_dir = root / "runs"
        self.runs_dir.mkdir()
        self.lock = threading.Lock()
        self.runs: list[Run] = []
        self.stop = threading.Event()  # ends the chaos phase: producers, loops, sensor, kills, recoveries
        self.rng = random.Random(args.seed)
        self.produced = {"events": Produced(), "accounts": Produced()}
        self.kills: list[tuple[float, str, str]] = []  # (time, run kind, step it was in)
        self.recovers: list[tuple[float, int, str]] = []  # (seconds, returncode, last line)
        self.sensor = Counter()
        self.sensor_errors: list[str] = []
        self.thread_errors: list[str] = []
        self.changes: list[tuple[float, str]] = []  # (seconds into the chaos, what changed in the pipeline)
        self.epochs_seen: dict[int, str] = {}  # every epoch the monitor saw, and its last state
        self.at_chaos_end: Counter = Counter()  # epochs by state when the chaos phase ended
        self.started = time.time()

    # --------------------------------------------------------------------------------------- runs

    def start_run(self, kind: str, partition: str | None = None) -> Run:
        job = "backfill_job" if kind.startswith("backfill") else "epoch_job"
        cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", job]
        if partition is not None:
            cmd += ["--tags", json.dumps({"dagster/partition": partition})]
        with self.lock:
            number = len(self.runs) + 1
            log_path = self.runs_dir / f"{number:04d}-{kind}.log"
            with open(log_path, "wb") as out:
                # A session of its own: a kill takes the run's process group, its JVM included.
                proc = subprocess.Popen(
                    cmd,
                    cwd=self.runs_dir,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            run = Run(number, kind, partition, proc, log_path, time.time())
            self.runs.append(run)
        # Reaped at once: a zombie would look alive to the controller's liveness check until then.
        threading.Thread(target=self._wait, args=(run,), name=f"wait-{number}", daemon=True).start()
        return run

    def _wait(self, run: Run) -> None:
        run.returncode = run.proc.wait()
        run.ended = time.time()
        if run.returncode != 0 and not run.killed:
            run.failures = failures_in(run.log_path)
            run.error = failure_of(run.failures)

    def running(self, kind: str | None = None) -> list[Run]:
        with self.lock:
            return [r for r in self.runs if r.returncode is None and (kind is None or r.kind == kind)]

    def kill(self, run: Run, at_end: bool = False) -> bool:
        with self.lock:
            if run.returncode is not None or run.proc.poll() is not None:
                return False
            run.killed, run.at_end = True, at_end
            run.killed_in = last_step(run.log_path)
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
        if not at_end:
            self.kills.append((time.time() - self.started, run.kind, run.killed_in))
        return True

    def wait_run(self, run: Run, timeout: float) -> None:
        deadline = time.time() + timeout
        while run.returncode is None and time.time() < deadline:
            time.sleep(0.5)
        if run.returncode is None:
            self.kill(run, at_end=True)
            while run.returncode is None:
                time.sleep(0.2)

    # ---------------------------------------------------------------------------------- threads

    def guarded(self, name: str, body: Callable[[], None]) -> threading.Thread:
        def target() -> None:
            try:
                body()
            except Exception:
                self.thread_errors.append(f"{name}: {traceback.format_exc()}")
                log(f"thread {name} crashed:\n{traceback.format_exc()}")

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def producer(self, source: str, split: str, rate: float) -> None:
        from epochal.connectors.log import append_records

        rng = random.Random(f"{self.args.seed}-{source}-{split}")
        directory = self.home / "data" / source
        lines = self.produced[source].lines[split]
        next_id = int(split)  # event ids are unique across splits: even ones in split 0, odd in 1
        while not self.stop.is_set():
            batch = []
            for _ in range(rng.randint(1, 6)):
                if source == "events":
                    batch.append(event_line(rng, next_id))
                    next_id += len(SPLITS)
                else:
                    batch.append(account_line(rng, split))
            append_records(directory, [b.text for b in batch], split)
            lines.extend(batch)  # after the write: the file holds at least what the oracle knows
            self.stop.wait(rng.expovariate(rate / len(batch)) if rate > 0 else 1.0)

    def loop(self, name: str) -> None:
        while not self.stop.is_set():
            run = self.start_run(name)
            while run.returncode is None and not self.stop.is_set():
                time.sleep(0.5)
            if run.returncode not in (None, 0):
                self.stop.wait(2.0)  # a run refused at once (in-flight limit): do not spin

    def barrier_sensor(self) -> None:
        import dagster as dg

        from epochal.settings import Settings
        from platform_defs.definitions import build_definitions

        defs = build_definitions(Settings.from_env(self.env))
        sensor = defs.get_sensor_def("barrier_sensor")
        instance = dg.DagsterInstance.ephemeral()
        interval = int(self.env["EPOCHAL_BARRIER_INTERVAL_MS"]) / 1000
        while not self.stop.wait(interval):
            if len(self.running("sensor")) >= self.args.sensor_runs:
                self.sensor["ticks skipped (sensor runs at their cap)"] += 1
                continue
            self.sensor["ticks"] += 1
            try:
                with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
                    result = sensor(context)
            except Exception as exc:
                self.sensor["tick errors"] += 1
                self.sensor_errors.append(f"{type(exc).__name__}: {exc}"[:400])
                continue
            if isinstance(result, dg.SkipReason):
                reason = (result.skip_message or "").split(":")[0]
                self.sensor[f"skipped: {reason[:60]}"] += 1
                continue
            for request in result.run_requests or []:
                if request.job_name == "backfill_job":  # requested while a backfill is pending
                    self.sensor["backfill run requests"] += 1
                    # the daemon starts one at a time (the sensor sees its runs; this instance does not)
                    if not self.running("backfill-sensor"):
                        self.start_run("backfill-sensor")
                    continue
                self.sensor["run requests"] += 1
                self.start_run("sensor", request.tags["dagster/partition"])

    def changer(self) -> None:
        """Edit the pipeline's SQL files at set points of the chaos phase, as a user would while it runs."""
        pipeline = Path(self.env["EPOCHAL_PIPELINE"])
        views_file = pipeline / "02_views.sql"
        region_stats = re.compile(r"SELECT region, count\(\*\).*?GROUP BY region;", re.S)
        top_events = re.compile(r"-- top-N per group\nCREATE MATERIALIZED VIEW top_events AS.*?WHERE rn <= 3;\n", re.S)
        steps = [
            (
                0.30,
                "added view account_totals and sink account_totals_out",
                lambda: (pipeline / "04_added.sql").write_text(ADDED_VIEW_SQL),
            ),
            (
                0.55,
                "changed the statement of region_stats (WHERE tier >= 2)",
                lambda: views_file.write_text(region_stats.sub(CHANGED_REGION_STATS, views_file.read_text(), count=1)),
            ),
            (
                0.75,
                f"dropped view {DROPPED_VIEW}",
                lambda: views_file.write_text(top_events.sub("", views_file.read_text(), count=1)),
            ),
        ]
        for share, what, change in steps:
            if self.stop.wait(max(0.0, self.started + share * self.args.seconds - time.time())):
                return
            before = views_file.read_text()
            change()
            if "changed" in what or "dropped" in what:
                if views_file.read_text() == before:
                    raise RuntimeError(f"the chaos could not edit the pipeline: {what}")
            self.changes.append((time.time() - self.started, what))
            log(f"pipeline changed: {what}")

    def backfill_loop(self) -> None:
        """``backfill_job`` one run after another once a view was added, as the sensor requests it."""
        while not self.stop.is_set():
            if not self.changes:
                self.stop.wait(2.0)
                continue
            run = self.start_run("backfill")
            while run.returncode is None and not self.stop.is_set():
                time.sleep(0.5)
            self.stop.wait(2.0)

    def killer(self) -> None:
        rng = random.Random(f"{self.args.seed}-kill")
        while not self.stop.wait(rng.uniform(*self.args.kill_every)):
            candidates = self.running()
            if candidates:
                self.kill(rng.choice(candidates))

    def recover_once(self) -> tuple[int, str]:
        started = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "epochal.cli", "recover"],
            cwd=self.runs_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = (done.stdout + done.stderr).strip().splitlines()
        last = lines[-1] if lines else ""
        self.recovers.append((time.time() - started, done.returncode, last))
        return done.returncode, last

    def recoverer(self) -> None:
        rng = random.Random(f"{self.args.seed}-recover")
        while not self.stop.wait(rng.uniform(*self.args.recover_every)):
            code, last = self.recover_once()
            if code != 0:
                log(f"epochal recover failed ({code}): {last}")

    def monitor(self, runtime: Any, until: threading.Event) -> None:
        """Every epoch the meta store shows, with its newest state (rows of old epochs may be pruned
        later), and a progress line now and then."""
        last_print = 0.0
        while not until.wait(2.0):
            try:
                rows = runtime.controller.backend.transaction(
                    lambda cur: cur.execute("SELECT epoch, state FROM epochs").fetchall()
                )
            except Exception as exc:  # the store is being hammered: the next poll will do
                log(f"monitor: {type(exc).__name__}: {exc}")
                continue
            self.epochs_seen.update(dict(rows))
            if time.time() - last_print >= 30:
                last_print = time.time()
                log(self.progress(runtime))

    def progress(self, runtime: Any) -> str:
        states = Counter(self.epochs_seen.values())
        with self.lock:
            outcomes = Counter(r.outcome if r.returncode is not None else "running" for r in self.runs)
        frontier = committed_frontier(runtime)
        read = {s: sum(frontier.get((s, p), 0) for p in SPLITS) for s in self.produced}
        produced = {s: p.count() for s, p in self.produced.items()}
        return (
            f"t={time.time() - self.started:.0f}s runs {dict(outcomes)} epochs {dict(states)} "
            f"committed/produced lines {', '.join(f'{s} {read[s]}/{produced[s]}' for s in produced)} "
            f"recoveries(cli) {len(self.recovers)} kills {len(self.kills)}"
        )


def committed_frontier(runtime: Any) -> dict[tuple[str, str], int]:
    """(source, split) -> end of its committed records."""
    rows = runtime.controller.backend.transaction(
        lambda cur: cur.execute("SELECT source, split, committed_end FROM split_frontier").fetchall()
    )
    return {(source, split): end or 0 for source, split, end in rows}


# ------------------------------------------------------------------------------------------------
# settle (the checks: chaos_oracle.py)


def unfinished_changes(runtime: Any) -> list[str]:
    """Backfills not joined yet and changed views not switched yet: what settling still waits for."""
    status = runtime.controller.status()
    waiting = []
    for view, entry in status.get("backfills", {}).items():
        if entry.get("phase") not in ("done", "cancelled"):
            waiting.append(f"{view} {entry.get('phase')}")
        rebuild = entry.get("rebuild") or {}
        if rebuild and rebuild.get("state") not in (None, "done"):
            waiting.append(f"{view} rebuild {rebuild.get('state')}")
    return waiting


def settle(chaos: Chaos, runtime: Any, budget_s: float) -> tuple[bool, int, float]:
    """Recover, then run epoch_job (and backfill_job while a backfill or a switch is pending) until
    every produced line is committed and every change to the pipeline is done, one more run, and
    every sink's delivery. Returns (settled, runs, seconds)."""
    started = time.time()
    code, last = chaos.recover_once()
    log(f"settle: epochal recover -> {code}: {last}")
    runs = 0
    extra_done = False
    while time.time() - started < budget_s:
        frontier = committed_frontier(runtime)
        behind = {
            (source, split): len(p.lines[split]) - frontier.get((source, split), 0)
            for source, p in chaos.produced.items()
            for split in SPLITS
            if len(p.lines[split]) != frontier.get((source, split), 0)
        }
        pending = unfinished_changes(runtime)
        if not behind and not pending:
            if extra_done:
                break
            extra_done = True  # one more epoch, so every sink catches up in a run too
        if pending:
            run = chaos.start_run("backfill-settle")
            chaos.wait_run(run, timeout=max(60.0, budget_s - (time.time() - started)))
            runs += 1
            log(f"settle backfill run {run.number}: {run.outcome}; waiting for {pending}")
        run = chaos.start_run("settle")
        chaos.wait_run(run, timeout=max(60.0, budget_s - (time.time() - started)))
        runs += 1
        log(
            f"settle run {run.number}: {run.outcome}{' (' + run.error + ')' if run.error else ''}; "
            f"lines not committed yet {sum(behind.values()) if behind else 0}"
        )
    else:
        return False, runs, time.time() - started
    committed = runtime.controller.epoch_log.committed_epoch()
    for sink in runtime.pipeline.sinks:
        runtime.run_sink(committed, sink, run_id="chaos-settle")  # DuckDB only: no Spark
    return True, runs, time.time() - started


# ------------------------------------------------------------------------------------------------
# report


def classify_recovery(reason: str) -> str:
    if reason.startswith("ad-hoc"):
        return "epochal recover"
    if "died" in reason:
        return "a run died"
    if "no progress" in reason:
        return "epoch timeout"
    if "failed:" in reason:
        name = reason.split("failed:", 1)[1].strip().split(":")[0]
        return f"an epoch failed ({name})"
    return reason[:40]


def report(chaos: Chaos, runtime: Any, chaos_seconds: float, settle_result: tuple[bool, int, float]) -> None:
    status = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "status", "--json"],
        cwd=chaos.runs_dir,
        env=chaos.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    recoveries = runtime.controller.backend.transaction(
        lambda cur: cur.execute("SELECT reason, error FROM recoveries ORDER BY id").fetchall()
    )
    rows = runtime.controller.backend.transaction(lambda cur: cur.execute("SELECT epoch, state FROM epochs").fetchall())
    chaos.epochs_seen.update(dict(rows))

    print()
    print("=" * 100)
    print(
        f"chaos run: {chaos_seconds:.0f} s of chaos, settle {settle_result[2]:.0f} s in {settle_result[1]} run(s) "
        f"({'settled' if settle_result[0] else 'DID NOT SETTLE'}); meta store {chaos.args.meta}; seed {chaos.args.seed}"
    )
    a = chaos.args
    print(
        f"settings: records/s per split events {a.events_rate}, accounts {a.accounts_rate}; max.events.per.epoch "
        f"{a.events_per_epoch}/{a.accounts_per_epoch}; kill every {a.kill_every[0]:.0f}-{a.kill_every[1]:.0f} s, "
        f"recover every {a.recover_every[0]:.0f}-{a.recover_every[1]:.0f} s; barrier interval "
        f"{a.barrier_interval_ms} ms, {a.sensor_runs} sensor run(s) at most; epoch timeout {a.epoch_timeout_s} s; "
        f"compact every {a.compact_every}; partition window {a.partition_window}; checkpoint frequency "
        f"{a.checkpoint_frequency}"
    )
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    with chaos.lock:
        runs = list(chaos.runs)
    print("runs (dagster job execute):")
    for kind in ("loop1", "loop2", "sensor", "backfill", "backfill-sensor", "settle", "backfill-settle"):
        mine = [r for r in runs if r.kind == kind]
        if not mine:
            continue
        outcomes = Counter(r.outcome for r in mine)
        at_end = sum(r.at_end for r in mine)
        durations = sorted((r.ended or time.time()) - r.started for r in mine if r.outcome == "succeeded")
        median = f", median successful run {durations[len(durations) // 2]:.0f} s" if durations else ""
        print(
            f"  {kind:<7} started {len(mine):>3}: succeeded {outcomes['succeeded']}, failed {outcomes['failed']}, "
            f"killed {outcomes['killed'] - at_end} (+{at_end} at the end of the chaos){median}"
        )
    failures = Counter(r.error.split(":")[0] for r in runs if r.outcome == "failed" and r.error)
    print(f"  failed runs by exception: {dict(failures) or 'none'}")
    suspect = [r for r in runs if r.outcome == "failed" and r.error and r.error.split(":")[0] not in EXPECTED_FAILURES]
    for r in suspect[:10]:
        print(f"    SUSPECT run {r.number} ({r.kind}): {r.error}  [{r.log_path}]")
    others: dict[str, list[Run]] = {}
    for r in runs:
        for name, _ in r.failures:
            if name not in EXPECTED_FAILURES:
                others.setdefault(name, []).append(r)
    for name, with_it in others.items():
        message = dict(with_it[0].failures)[name]
        aborted = sum(r.error.split(":")[0] in EXPECTED_FAILURES for r in with_it if r.error)
        print(
            f"    also {name} in {len(with_it)} failed run(s), {aborted} of them aborted (run {with_it[0].number}: "
            f"{message[:160]})"
        )
    print(f"  kills at random: {len(chaos.kills)}, by step: {dict(Counter(step for _, _, step in chaos.kills))}")
    for at, what in chaos.changes:
        print(f"pipeline changed at {at:.0f} s: {what}")
    print(f"barrier sensor: {dict(chaos.sensor)}")
    for e in chaos.sensor_errors[:5]:
        print(f"    sensor error: {e}")
    ok_recovers = sum(1 for _, code, _ in chaos.recovers if code == 0)
    print(f"epochal recover (subprocess): {len(chaos.recovers)} run, {ok_recovers} succeeded")
    for _, code, last in [r for r in chaos.recovers if r[1] != 0][:5]:
        print(f"    recover failed ({code}): {last}")
    by_reason = Counter(classify_recovery(reason) for reason, _ in recoveries)
    failed_recoveries = [(reason, error) for reason, error in recoveries if error]
    print(f"recoveries (meta store): {len(recoveries)}: {dict(by_reason)}; failed: {len(failed_recoveries)}")
    for reason, error in failed_recoveries[:5]:
        print(f"    recovery FAILED ({reason}): {error[:300]}")
    states = Counter(chaos.epochs_seen.values())
    print(
        f"epochs (every one the monitor saw): {len(chaos.epochs_seen)}: {dict(states)}; when the chaos ended: "
        f"{dict(chaos.at_chaos_end)}"
    )
    if status.returncode == 0:
        st = json.loads(status.stdout)
        last = st.get("last_recovery") or {}
        print(
            f"epochal status --json: committed epoch {st['committed_epoch']}, epoch_counts {st['epoch_counts']}, "
            f"in flight {len(st['in_flight'])}, sinks {st['sinks']}, last recovery #{last.get('id')} "
            f"({last.get('reason')})"
        )
    else:
        print(f"epochal status --json FAILED: {status.stderr.strip()[-400:]}")
    for source, p in chaos.produced.items():
        good = sum(1 for lines in p.lines.values() for line in lines if line.record is not None)
        print(
            f"records produced to {source:<9}: {p.count()} lines ({good} records, {p.count() - good} malformed), "
            f"per split {', '.join(f'{s}: {len(v)}' for s, v in p.lines.items())}"
        )
    for error in chaos.thread_errors:
        print(f"THREAD ERROR: {error}")


# ------------------------------------------------------------------------------------------------
# main


def create_postgres_db() -> tuple[str, str]:
    import psycopg

    name = f"epochal_chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_postgres_db(name: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def pair(text: str) -> tuple[float, float]:
        low, _, high = text.partition(",")
        return float(low), float(high or low)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600, help="length of the chaos phase (default 600)")
    p.add_argument(
        "--meta",
        choices=("postgresql", "duckdb"),
        default="postgresql",
        help="meta store: a fresh database on the local PostgreSQL server (default), or DuckDB",
    )
    p.add_argument("--seed", type=int, default=16, help="random seed (default 16)")
    p.add_argument("--events-rate", type=float, default=2.0, help="events records per second per split")
    p.add_argument("--accounts-rate", type=float, default=1.0, help="accounts records per second per split")
    p.add_argument("--events-per-epoch", type=int, default=1500, help="max.events.per.epoch of events")
    p.add_argument("--accounts-per-epoch", type=int, default=800, help="max.events.per.epoch of accounts")
    p.add_argument("--sensor-runs", type=int, default=2, help="most sensor-requested runs at once (default 2)")
    p.add_argument("--kill-every", type=pair, default=(120.0, 300.0), help="seconds between kills: low,high")
    p.add_argument("--recover-every", type=pair, default=(150.0, 400.0), help="seconds between recovers: low,high")
    p.add_argument("--barrier-interval-ms", type=int, default=5000)
    p.add_argument("--epoch-timeout-s", type=int, default=120)
    p.add_argument("--compact-every", type=int, default=4, help="EPOCHAL_COMPACT_EVERY (default 4: compaction runs)")
    p.add_argument(
        "--partition-window",
        type=int,
        default=32,
        help="EPOCHAL_PARTITION_WINDOW (default 32: old epochs' rows are pruned during the run)",
    )
    p.add_argument("--checkpoint-frequency", type=int, default=1)
    p.add_argument("--settle-seconds", type=float, default=2400, help="most time the settle may take")
    p.add_argument("--no-changes", action="store_true", help="leave the pipeline's SQL as it is for the whole run")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (and the PostgreSQL database)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in [k for k in os.environ if k.startswith("DAGSTER_")]:
        del os.environ[name]  # each run a temporary Dagster instance (harness dropped EPOCHAL_*)
    log(harness.header("Chaos run"))
    outcome: dict[str, Any] = {"keep": args.keep}
    with harness.workdir("chaos", keep=lambda: outcome["keep"]) as root:
        return run(args, root, outcome)


def run(args: argparse.Namespace, root: Path, outcome: dict[str, Any]) -> int:
    pipeline_dir = root / "pipeline"
    pipeline_dir.mkdir()
    for name, text in PIPELINE.items():
        (pipeline_dir / name).write_text(
            text.replace("{events_per_epoch}", str(args.events_per_epoch)).replace(
                "{accounts_per_epoch}", str(args.accounts_per_epoch)
            )
        )
    home = root / "home"
    db_name = None
    if args.meta == "postgresql":
        db_name, meta_url = create_postgres_db()
    else:
        meta_url = f"duckdb:///{home / 'meta.duckdb'}"
    env = {
        "EPOCHAL_HOME": str(home),
        "EPOCHAL_PIPELINE": str(pipeline_dir),
        "EPOCHAL_META_URL": meta_url,
        "EPOCHAL_BARRIER_INTERVAL_MS": str(args.barrier_interval_ms),
        "EPOCHAL_EPOCH_TIMEOUT_S": str(args.epoch_timeout_s),
        "EPOCHAL_COMPACT_EVERY": str(args.compact_every),
        "EPOCHAL_PARTITION_WINDOW": str(args.partition_window),
        "EPOCHAL_CHECKPOINT_FREQUENCY": str(args.checkpoint_frequency),
        "EPOCHAL_SPARK_MASTER": "local[2]",
        # up to four JVMs at once on this machine: keep each one's heap modest
        "EPOCHAL_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
        # last_step() reads Dagster's step events from each run's log; they are DEBUG
        "EPOCHAL_LOG_LEVEL": "DEBUG",
    }
    os.environ.update(env)
    full_env = dict(os.environ)  # (harness put this checkout on PYTHONPATH)
    log(f"work dir {root}, meta store {args.meta}, chaos for {args.seconds:.0f} s")

    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings

    def no_spark() -> Any:
        raise RuntimeError("the chaos driver and its checks must not need Spark")

    settings = Settings.from_env(env)
    runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), no_spark)
    chaos = Chaos(args, root, full_env)
    problems: list[str] = []
    keep = args.keep
    try:
        monitor_stop = threading.Event()
        threads = [chaos.guarded("monitor", lambda: chaos.monitor(runtime, monitor_stop))]
        chaos_threads = []
        for source, rate in (("events", args.events_rate), ("accounts", args.accounts_rate)):
            for split in SPLITS:
                chaos_threads.append(
                    chaos.guarded(
                        f"produce-{source}-{split}", lambda s=source, p=split, r=rate: chaos.producer(s, p, r)
                    )
                )
        chaos_threads += [chaos.guarded(name, lambda n=name: chaos.loop(n)) for name in ("loop1", "loop2")]
        chaos_threads += [
            chaos.guarded("sensor", chaos.barrier_sensor),
            chaos.guarded("killer", chaos.killer),
            chaos.guarded("recoverer", chaos.recoverer),
        ]
        if not args.no_changes:
            chaos_threads += [chaos.guarded("changer", chaos.changer), chaos.guarded("backfill", chaos.backfill_loop)]
        chaos.stop.wait(args.seconds)
        chaos.stop.set()
        chaos_seconds = time.time() - chaos.started
        chaos.at_chaos_end = Counter(chaos.epochs_seen.values())
        log("chaos over: stopping producers, kills, recoveries; killing every run still going")
        for run in chaos.running():
            chaos.kill(run, at_end=True)
        for thread in chaos_threads:
            thread.join(timeout=660)
        for run in chaos.running():  # one a loop or the sensor started while the first sweep ran
            chaos.kill(run, at_end=True)
        while chaos.running():
            time.sleep(0.2)
        log(chaos.progress(runtime))
        # The pipeline as its files say now: the driver checks what the runs were told to build.
        runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), no_spark)
        settle_result = settle(chaos, runtime, args.settle_seconds)
        monitor_stop.set()
        threads[0].join()
        report(chaos, runtime, chaos_seconds, settle_result)
        print("checks:")
        if not settle_result[0]:
            problems.append(f"the pipeline did not settle in {args.settle_seconds:.0f} s")
        problems += check(chaos.produced, home, not args.no_changes, runtime)
        problems += [f"thread error: {e.splitlines()[0]}" for e in chaos.thread_errors]
    except BaseException:
        keep = True
        for run in chaos.running():
            chaos.kill(run, at_end=True)
        raise
    finally:
        # The runs attached to the managed Spark server (started on first use): it would otherwise
        # live on, idle, until its idle timeout, beside whatever runs next on the machine.
        from epochal.spark import server as spark_server

        stopped = spark_server.stop(home)
        if stopped is not None:
            print(f"stopped the run's Spark server (pid {stopped.pid})")
        outcome["keep"] = bool(problems or keep)
        if outcome["keep"] and db_name:
            print(f"kept PostgreSQL database {db_name}")
        elif db_name:
            drop_postgres_db(db_name)
    if problems:
        print("FAILED:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
