"""The checkpoint controller on a real DuckDB meta store: epochs, collect-then-commit, checkpoints,
recovery and concurrency. No Spark: the planner is a pure function here."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import (
    Collected,
    CommitAlignmentError,
    EpochAborted,
    EpochState,
    InjectionBlocked,
    Owner,
)
from epochal.connectors.base import SplitRange
from epochal.epoch import BarrierKind
from epochal.settings import Settings

SOURCES = ["src"]
VIEWS = ["v1", "v2"]


def settings(home: Path, meta_url: str | None = None, **env: str) -> Settings:
    extra = {"EPOCHAL_META_URL": meta_url} if meta_url else {}
    # (no time-travel window, as tests/conftest.py sets: the retention tests count what is released)
    return Settings.from_env({"EPOCHAL_HOME": str(home), "EPOCHAL_TIME_TRAVEL_S": "0", **extra, **env})


def controller(home: Path, meta_url: str | None = None, **env: str) -> CheckpointController:
    return CheckpointController(settings(home, meta_url, **env), SOURCES, VIEWS, sinks=["out"])


def mark_delivered(ctl: CheckpointController, sink: str, epoch: int) -> None:
    """Record that ``sink`` delivered every epoch up to ``epoch``, as the sink coordinator does."""
    from epochal.checkpoint.sinks.batches import SinkBatchState
    from epochal.sinks.base import BatchId

    batch = BatchId(sink, epoch, epoch, 1, "test")
    ctl.sink_coordinator._mark(batch, SinkBatchState.PENDING)
    ctl.sink_coordinator._mark(batch, SinkBatchState.COMMITTED)


def plan_ten(source: str, starts: dict[str, int]) -> list[SplitRange]:
    return [SplitRange(split, starts.get(split, 0), starts.get(split, 0) + 10) for split in ("0", "1")]


def collect_all(ctl: CheckpointController, epoch: int, tables=("src", "v1", "v2")) -> list[int]:
    committed: list[int] = []
    for t in tables:
        committed += ctl.epoch_log.collect(epoch, Collected(t, f"/loc/{t}/{epoch}")).committed
    return committed


def start(ctl: CheckpointController) -> None:
    reason = ctl.epoch_log.recovery_reason()
    assert reason == "bootstrap"
    ctl.recover(reason, discard=lambda locs: None)


def test_epochs_grow_and_offsets_continue(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    first = ctl.epoch_log.inject(plan_ten)
    second = ctl.epoch_log.inject(plan_ten)
    assert second.epoch > first.epoch and second.prev == first.epoch
    assert first.kind is BarrierKind.INITIAL and second.kind is BarrierKind.CHECKPOINT
    assert ctl.epoch_log.offsets(first.epoch, "src") == [SplitRange("0", 0, 10), SplitRange("1", 0, 10)]
    assert ctl.epoch_log.offsets(second.epoch, "src") == [SplitRange("0", 10, 20), SplitRange("1", 10, 20)]


def test_commit_waits_for_every_table_and_aligns_them(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e = ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, e, tables=("src", "v1")) == []
    assert ctl.epoch_log.epoch(e).state is EpochState.INJECTED
    assert collect_all(ctl, e, tables=("v2",)) == [e]
    status = ctl.status()
    assert status["committed_epoch"] == e
    assert status["tables"] == {"src": e, "v1": e, "v2": e}
    assert ctl.catalog.committed_locations("v1") == [(e, f"/loc/v1/{e}")]


def test_epochs_commit_in_order(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e1, e2 = ctl.epoch_log.inject(plan_ten).epoch, ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, e2) == []  # e1 is older and not collected: e2 must wait
    assert ctl.epoch_log.epoch(e2).state is EpochState.COLLECTED
    assert collect_all(ctl, e1) == [e1, e2]


def test_barriers_commit_with_the_next_checkpoint(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_CHECKPOINT_FREQUENCY="3", EPOCHAL_MAX_IN_FLIGHT="5")
    start(ctl)
    initial = ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, initial) == [initial]  # the initial barrier commits like a checkpoint
    b1, b2, ckpt = (ctl.epoch_log.inject(plan_ten) for _ in range(3))
    assert (b1.kind, b2.kind, ckpt.kind) == (BarrierKind.BARRIER, BarrierKind.BARRIER, BarrierKind.CHECKPOINT)
    assert collect_all(ctl, b1.epoch) == [] and collect_all(ctl, b2.epoch) == []
    assert ctl.epoch_log.committed_epoch() == initial
    assert collect_all(ctl, ckpt.epoch) == [b1.epoch, b2.epoch, ckpt.epoch]


def test_in_flight_limit_and_pause_block_injection(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_MAX_IN_FLIGHT="2")
    start(ctl)
    ctl.epoch_log.inject(plan_ten)
    ctl.epoch_log.inject(plan_ten)
    with pytest.raises(InjectionBlocked, match="EPOCHAL_MAX_IN_FLIGHT"):
        ctl.epoch_log.inject(plan_ten)


def test_pause_blocks_injection_until_resume(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    ctl.epoch_log.pause()
    with pytest.raises(InjectionBlocked, match="epochal resume"):
        ctl.epoch_log.inject(plan_ten)
    assert ctl.status()["paused"] is True
    ctl.epoch_log.resume()
    ctl.epoch_log.inject(plan_ten)


def test_recovery_aborts_in_flight_and_rereads_their_offsets(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e1 = ctl.epoch_log.inject(plan_ten).epoch
    collect_all(ctl, e1)
    e2 = ctl.epoch_log.inject(plan_ten).epoch
    ctl.epoch_log.collect(e2, Collected("src", "/loc/src/e2"))
    discarded: list[str] = []
    report = ctl.recover("test", discard=discarded.extend)
    assert report.aborted == [e2] and report.committed_epoch == e1
    assert discarded == ["/loc/src/e2"]
    assert ctl.epoch_log.epoch(e2).state is EpochState.ABORTED
    with pytest.raises(EpochAborted, match="aborted by a recovery"):
        ctl.epoch_log.collect(e2, Collected("v1", "/x"))
    e3 = ctl.epoch_log.inject(plan_ten)
    assert e3.kind is BarrierKind.INITIAL and e3.prev == e1
    # The aborted epoch's records are read again by the next one: nothing lost, nothing skipped.
    assert ctl.epoch_log.offsets(e3.epoch, "src") == ctl.epoch_log.offsets(e2, "src")


def test_many_splits_inject_commit_and_recover_at_each_splits_own_offset(tmp_path: Path, meta_url: str) -> None:
    """A log of hundreds of split files, each at its own offset, some idle: injection writes the
    ranges in batched statements and a commit moves every split's committed frontier at once, so a
    recovery sends each split back to exactly where its committed epoch ended."""
    splits = [f"s{i:03d}" for i in range(250)]  # more than one injection statement's rows

    def plan(source: str, starts: dict[str, int]) -> list[SplitRange]:
        # split i takes i % 4 records an epoch: a quarter of them never move
        return [SplitRange(s, starts.get(s, 0), starts.get(s, 0) + i % 4) for i, s in enumerate(splits)]

    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e1 = ctl.epoch_log.inject(plan).epoch
    collect_all(ctl, e1)
    e2 = ctl.epoch_log.inject(plan).epoch
    assert collect_all(ctl, e2) == [e2]
    e3 = ctl.epoch_log.inject(plan).epoch  # in flight, then aborted
    assert ctl.epoch_log.offsets(e3, "src") == [SplitRange(s, 2 * (i % 4), 3 * (i % 4)) for i, s in enumerate(splits)]
    ctl.recover("test", discard=lambda locations: None)
    e4 = ctl.epoch_log.inject(plan).epoch
    assert ctl.epoch_log.offsets(e4, "src") == ctl.epoch_log.offsets(e3, "src")


def test_collect_after_commit_is_not_recorded(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e = ctl.epoch_log.inject(plan_ten).epoch
    collect_all(ctl, e)
    result = ctl.epoch_log.collect(e, Collected("v1", "/elsewhere"))
    assert result.recorded is False
    assert ctl.catalog.committed_locations("v1") == [(e, f"/loc/v1/{e}")]


def test_begin_step_tells_a_view_whether_it_wrote_before(tmp_path: Path, meta_url: str) -> None:
    """A view's first epoch is never idle (an aggregate over all rows has a row even over nothing),
    so its step asks whether it wrote before. The answer comes with begin_step's transaction and
    must agree with the state the view would read: idle epochs and aborted epochs wrote nothing."""
    ctl = controller(tmp_path, meta_url)
    start(ctl)

    def written(epoch: int) -> bool:
        answer = ctl.epoch_log.begin_step(epoch, None, table="v1").written_before
        parts = ctl.catalog.state_parts("v1", epoch, inclusive=False)
        assert answer == (parts.snapshot is not None or bool(parts.changes)), epoch
        return answer

    idle = ctl.epoch_log.inject(plan_ten).epoch
    assert ctl.epoch_log.begin_step(idle, None).written_before is None  # no table named, no question asked
    assert not written(idle)
    for t in ("src", "v1", "v2"):
        ctl.epoch_log.collect(idle, Collected(t, None, 0, 0))  # idle epochs: no file
    aborted = ctl.epoch_log.inject(plan_ten).epoch
    assert not written(aborted)
    ctl.epoch_log.collect(aborted, Collected("v1", f"/loc/v1/{aborted}", 1, 1))
    ctl.recover("test", discard=lambda locations: None)
    first = ctl.epoch_log.inject(plan_ten).epoch
    assert not written(first)  # the aborted epoch's file is not the view's
    collect_all(ctl, first)
    after = ctl.epoch_log.inject(plan_ten).epoch
    assert written(after) and not written(first)
    # A snapshot alone (its change files gone to retention) is something written, too.
    ctl.catalog.begin_snapshot("v1", first, "/w/v1/snap", ("k",), "{}")
    assert ctl.catalog.publish_snapshot("/w/v1/snap", 10, 1, keep=1).recorded
    assert written(after)


def test_commit_step_commits_and_releases_in_one_transaction(tmp_path: Path, meta_url: str) -> None:
    """A run's commit step is one meta-store transaction, not one per question (every epoch pays
    it, idle ones too), and says what the run needs: what it committed, what is missing, whether
    the run is done with the epoch (then its claim is released in the same transaction)."""
    ctl = controller(tmp_path, meta_url, EPOCHAL_CHECKPOINT_FREQUENCY="2", EPOCHAL_MAX_IN_FLIGHT="5")
    start(ctl)
    transactions = 0
    begin = ctl.backend.transaction

    def counted(fn):  # noqa: ANN001, ANN202
        nonlocal transactions
        transactions += 1
        return begin(fn)

    ctl.backend.transaction = counted

    def owner(epoch: int) -> int | None:
        return begin(lambda cur: cur.execute("SELECT owner_pid FROM epochs WHERE epoch = ?", [epoch]).fetchone()[0])

    initial = ctl.epoch_log.inject(plan_ten, claim=True).epoch
    collect_all(ctl, initial, tables=("src", "v1"))
    transactions = 0
    waiting = ctl.epoch_log.commit_step(initial)
    assert transactions == 1
    assert waiting.missing == ["v2"] and not waiting.released and waiting.committed == []
    assert owner(initial) == os.getpid()  # not done: the claim stays, its death is noticed
    ctl.epoch_log.collect(initial, Collected("v2", None, 0, 0))  # the last collect commits
    done = ctl.epoch_log.commit_step(initial)
    assert done.released and done.record.state is EpochState.COMMITTED and done.committed_epoch == initial
    barrier = ctl.epoch_log.inject(plan_ten, claim=True)
    assert barrier.kind is BarrierKind.BARRIER
    collect_all(ctl, barrier.epoch)
    transactions = 0
    parked = ctl.epoch_log.commit_step(barrier.epoch)
    assert transactions == 1
    # A barrier commits with the next checkpoint: the run is done with it and lets it go.
    assert parked.released and parked.record.state is EpochState.COLLECTED and parked.committed == []
    assert [r.epoch for r in parked.in_flight] == [barrier.epoch] and parked.committed_epoch == initial
    assert owner(barrier.epoch) is None
    checkpoint = ctl.epoch_log.inject(plan_ten).epoch
    collect_all(ctl, checkpoint)
    assert ctl.epoch_log.commit_step(checkpoint).committed_epoch == checkpoint


def test_alignment_mismatch_names_the_tables(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    collect_all(ctl, ctl.epoch_log.inject(plan_ten).epoch)
    grown = CheckpointController(settings(tmp_path, meta_url), SOURCES, [*VIEWS, "v3"])
    with pytest.raises(CommitAlignmentError, match="v3=None.*backfill"):
        grown.recover("test", discard=lambda locs: None)
    assert "commit alignment" in grown.status()["last_recovery"]["error"]
    # Without a recovery in between, injection refuses too: a linear v3 reads no state, so it would
    # otherwise run from the next epoch on without its history, and nothing would notice.
    with pytest.raises(CommitAlignmentError, match="v3=None.*backfill"):
        grown.epoch_log.inject(plan_ten)


def test_dead_owner_and_failure_trigger_recovery(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e = ctl.epoch_log.inject(plan_ten).epoch
    assert ctl.epoch_log.recovery_reason() is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ctl.backend.transaction(
        lambda cur: cur.execute(
            "UPDATE epochs SET owner_pid = ?, owner_host = ? WHERE epoch = ?", [child.pid, Owner.host, e]
        )
    )
    assert ctl.epoch_log.recovery_reason() is None  # alive
    child.kill()
    child.wait()
    assert "died" in ctl.epoch_log.recovery_reason()
    ctl.recover("died", discard=lambda locs: None)
    e2 = ctl.epoch_log.inject(plan_ten).epoch
    ctl.epoch_log.fail(e2, "ValueError: boom")
    assert "boom" in ctl.epoch_log.recovery_reason()
    with pytest.raises(InjectionBlocked, match="recovery is pending"):
        ctl.epoch_log.inject(plan_ten)


def test_a_run_takes_every_waiting_epoch_once_and_keeps_them_alive(tmp_path: Path, meta_url: str) -> None:
    """The barrier sensor injects epochs no process holds; a run that starts late takes all of them
    (oldest first), a second run finds none left, and the run's hold keeps the epochs that wait their
    turn inside it from looking stuck to recovery."""
    ctl = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    start(ctl)
    injected = [ctl.epoch_log.inject(plan_ten).epoch for _ in range(3)]
    assert ctl.epoch_log.waiting() == injected
    ctl.epoch_log.fail(injected[2], "ValueError: boom")  # a failed epoch waits for recovery, not a run
    assert ctl.epoch_log.take_waiting("run-a") == injected[:2]
    assert ctl.epoch_log.take_waiting("run-b") == []
    assert ctl.epoch_log.waiting() == []
    ctl.epoch_log.release_all(injected[:2])  # run-a could not start (its plans were refused)
    assert ctl.epoch_log.waiting() == injected[:2]  # waiting for a run again, not dead
    assert ctl.epoch_log.take_waiting("run-b") == injected[:2]
    ctl.recover("boom", discard=lambda locs: None)

    injected = [ctl.epoch_log.inject(plan_ten).epoch for _ in range(2)]
    taken = ctl.epoch_log.take_waiting("run-c")
    assert taken == injected
    with ctl.epoch_log.hold(taken):
        time.sleep(1.6)  # past the epoch timeout, while the run works on its first epoch
        assert ctl.epoch_log.recovery_reason() is None
        collect_all(ctl, taken[0])
    time.sleep(1.6)  # the run let go without finishing the second: that one is stuck
    assert "no progress" in (ctl.epoch_log.recovery_reason() or "")


def test_a_standby_run_waits_for_the_working_run_then_takes_what_waits(tmp_path: Path, meta_url: str) -> None:
    """The sensor starts a run ahead of need: it stands by while another live process works on
    epochs, and takes the epochs waiting the moment that process has committed its own. A dead
    owner, a silent one, or room for more runs (EPOCHAL_MAX_EPOCH_RUNS) never makes it wait."""
    import threading

    ctl = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="30")
    start(ctl)
    working = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = ctl.epoch_log.inject(plan_ten).epoch
        ctl.backend.transaction(  # another process (the working run) took the first epoch
            lambda cur: cur.execute(
                "UPDATE epochs SET owner_host = ?, owner_pid = ?, owner_run = 'run-a', heartbeat_at = ? "
                "WHERE epoch = ?",
                [Owner.host, working.pid, time.time(), first],
            )
        )
        later = [ctl.epoch_log.inject(plan_ten).epoch for _ in range(2)]
        assert ctl.epoch_log.working_runs() == ["run run-a"]
        assert ctl.epoch_log.stand_by(2) == 0.0  # room for a second working run: no wait

        seen: list[list[str]] = []
        threading.Timer(1.0, lambda: collect_all(ctl, first)).start()  # run-a commits its epoch
        waited = ctl.epoch_log.stand_by(1, on_wait=seen.append)
        assert 0.9 < waited < 10 and seen == [["run run-a"]]
        assert ctl.epoch_log.working_runs() == []
        assert ctl.epoch_log.take_waiting("run-b") == later  # what waited, taken at once

        # this process's own claims never make it wait for itself
        assert ctl.epoch_log.stand_by(1) == 0.0
        for epoch in later:
            collect_all(ctl, epoch)

        # a dead owner is recovery's business: a standby run does not wait for it
        stuck = ctl.epoch_log.inject(plan_ten).epoch
        working.kill()
        working.wait()
        ctl.backend.transaction(
            lambda cur: cur.execute(
                "UPDATE epochs SET owner_host = ?, owner_pid = ?, owner_run = 'run-c', heartbeat_at = ? "
                "WHERE epoch = ?",
                [Owner.host, working.pid, time.time(), stuck],
            )
        )
        assert ctl.epoch_log.working_runs() == []
        assert ctl.epoch_log.stand_by(1) == 0.0
    finally:
        working.kill()


def test_a_failed_rerun_of_a_committed_epoch_requests_no_recovery(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    done = ctl.epoch_log.inject(plan_ten).epoch
    collect_all(ctl, done)
    ctl.epoch_log.inject(plan_ten)  # another run's epoch, in flight
    assert ctl.epoch_log.fail(done, "SinkSchemaError: re-run failed") is False
    assert ctl.epoch_log.recovery_reason() is None


def test_pause_on_next_start_pauses_once(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    ctl.epoch_log.set_pause_on_next_start(True)
    report = ctl.recover("bootstrap", discard=lambda locs: None)
    assert report.paused and ctl.status()["paused"]
    assert ctl.status()["pause_on_next_start"] is False
    ctl.epoch_log.resume()
    assert ctl.recover("again", discard=lambda locs: None).paused is False


def _race_commit(home: str, meta_url: str, epoch: int, barrier, out) -> None:
    ctl = controller(Path(home), meta_url)
    barrier.wait()
    out.put(ctl.epoch_log.collect(epoch, Collected("v2", f"/loc/v2/{os.getpid()}")).committed)


def test_racing_processes_commit_an_epoch_exactly_once(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    e = ctl.epoch_log.inject(plan_ten).epoch
    collect_all(ctl, e, tables=("src", "v1"))
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race_commit, args=(str(tmp_path), meta_url, e, barrier, out)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results = [out.get() for _ in procs]
    assert sorted(results, key=len) == [[]] * 5 + [[e]]
    assert ctl.epoch_log.epochs([EpochState.COMMITTED])[0].epoch == e


def _hammer(home: str, meta_url: str, n: int, out) -> None:
    # Every process injects and collects epochs while the others do the same: no lock error may
    # escape, and no offset range may be handed out twice.
    ctl = controller(Path(home), meta_url, EPOCHAL_MAX_IN_FLIGHT="1000")
    mine = []
    for _ in range(n):
        rec = ctl.epoch_log.inject(plan_ten)
        collect_all(ctl, rec.epoch)
        mine.append(rec.epoch)
    out.put(mine)


def test_meta_store_under_concurrent_processes(tmp_path: Path, meta_url: str) -> None:
    start(controller(tmp_path, meta_url))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), meta_url, 8, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    epochs = sorted(e for _ in procs for e in out.get())
    assert len(epochs) == len(set(epochs)) == 32
    ctl = controller(tmp_path, meta_url)
    assert [r.epoch for r in ctl.epoch_log.epochs([EpochState.COMMITTED])] == epochs
    ranges = [r for e in epochs for r in ctl.epoch_log.offsets(e, "src") if r.split == "0"]
    assert [(r.start, r.end) for r in ranges] == [(10 * i, 10 * i + 10) for i in range(32)]


def test_duckdb_meta_store_is_not_held_open_between_transactions(tmp_path: Path) -> None:
    """The DuckDB store is attached to a host kept for the process only for one transaction at a
    time: another process can open the file in between (read-write, as DuckDB allows one process),
    and our next transaction sees what it wrote. A failed transaction leaves nothing attached."""
    from epochal.meta.backend import DuckDBBackend

    path = tmp_path / "meta.duckdb"
    backend = DuckDBBackend(path)
    backend.transaction(lambda cur: cur.execute("CREATE TABLE t (v INTEGER)"))
    backend.transaction(lambda cur: cur.execute("INSERT INTO t VALUES (1)"))

    def boom(cur):
        cur.execute("INSERT INTO t VALUES (100)")
        raise RuntimeError("step failed mid-transaction")

    with pytest.raises(RuntimeError, match="mid-transaction"):
        backend.transaction(boom)
    other = (
        "import duckdb, sys\n"
        "con = duckdb.connect(sys.argv[1])\n"
        "assert con.execute('SELECT sum(v) FROM t').fetchone()[0] == 1, 'the failed insert was rolled back'\n"
        "con.execute('INSERT INTO t VALUES (2)')\n"
        "con.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", other, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert backend.transaction(lambda cur: cur.execute("SELECT sum(v) FROM t").fetchone()) == (3,)
    # a second store in the same process uses the same host, one file at a time
    second = DuckDBBackend(tmp_path / "other.duckdb")
    second.transaction(lambda cur: cur.execute("CREATE TABLE u AS SELECT 7 AS w"))
    assert backend.transaction(lambda cur: cur.execute("SELECT count(*) FROM t").fetchone()) == (2,)
    assert second.transaction(lambda cur: cur.execute("SELECT w FROM u").fetchone()) == (7,)


def test_postgres_meta_store_keeps_its_connection_and_replaces_one_the_server_closed(postgres_url: str) -> None:
    """Transactions reuse one connection (connecting costs ~10x a transaction). A failed one is
    rolled back before the connection is kept; one the server closed while idle is replaced
    without the caller noticing, and nothing runs twice."""
    import psycopg

    from epochal.meta.backend import PostgresBackend

    backend = PostgresBackend(postgres_url)
    backend.transaction(lambda cur: cur.execute("CREATE TABLE t (v INTEGER)"))
    session = backend.transaction(lambda cur: cur.execute("SELECT pg_backend_pid()").fetchone()[0])
    backend.transaction(lambda cur: cur.execute("INSERT INTO t VALUES (1)"))
    assert backend.transaction(lambda cur: cur.execute("SELECT pg_backend_pid()").fetchone()[0]) == session

    def boom(cur):
        cur.execute("INSERT INTO t VALUES (100)")
        raise RuntimeError("step failed mid-transaction")

    with pytest.raises(RuntimeError, match="mid-transaction"):
        backend.transaction(boom)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        state = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [session]).fetchone()
        assert state == ("idle",), "a kept connection holds no transaction"
        assert admin.execute("SELECT sum(v) FROM t").fetchone() == (1,), "the failed insert was rolled back"
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", [session])  # returns once it is gone

    backend.transaction(lambda cur: cur.execute("INSERT INTO t VALUES (2)"))
    assert backend.transaction(lambda cur: cur.execute("SELECT count(*), sum(v) FROM t").fetchone()) == (2, 3)
    assert backend.transaction(lambda cur: cur.execute("SELECT pg_backend_pid()").fetchone()[0]) != session


def test_postgres_meta_store_that_is_down_says_so_and_how_to_fix_it() -> None:
    from epochal.errors import EpochalError
    from epochal.meta.backend import PostgresBackend

    down = PostgresBackend("postgresql://epochal:secret@127.0.0.1:1/meta")  # nothing listens on port 1
    with pytest.raises(EpochalError, match="cannot reach the PostgreSQL meta store at") as raised:
        down.transaction(lambda cur: cur.execute("SELECT 1"))
    assert "start the server or fix EPOCHAL_META_URL" in str(raised.value)
    assert "secret" not in str(raised.value)  # the URL is shown without its credentials


def test_recovery_retries_a_transient_failure_and_records_one_it_gave_up_on(
    tmp_path: Path, meta_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while deleting aborted data (storage hiccup) is retried with backoff and the attempts
    are recorded; one that persists is given up after RECOVERY_ATTEMPTS, recorded with its error."""
    import epochal.checkpoint.recovery as recovery_module
    from epochal.errors import EpochalError

    monkeypatch.setattr(recovery_module, "RECOVERY_BASE_S", 0.001)
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    rec = ctl.epoch_log.inject(plan_ten)
    failures = iter([OSError("disk busy"), OSError("disk busy")])

    def flaky(locations: list[str]) -> None:
        if (failure := next(failures, None)) is not None:
            raise failure

    report = ctl.recover("test", discard=flaky)
    assert report.attempts == 3
    assert report.aborted == [rec.epoch], "the retry still reports what the first attempt aborted"
    assert ctl.status()["last_recovery"]["attempts"] == 3
    assert [r.epoch for r in ctl.epoch_log.epochs([EpochState.ABORTED])] == [rec.epoch]

    def broken(locations: list[str]) -> None:
        raise OSError("disk gone")

    with pytest.raises(EpochalError, match=f"recovery failed after {recovery_module.RECOVERY_ATTEMPTS} attempts"):
        ctl.recover("test", discard=broken)
    last = ctl.status()["last_recovery"]
    assert last["attempts"] == recovery_module.RECOVERY_ATTEMPTS and "disk gone" in last["error"]
