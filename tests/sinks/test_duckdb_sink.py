"""The sink coordinator with the DuckDB target, on real Spark writer tasks, a real meta store and a
real DuckDB file: exactly once, batches of epochs, upserts, schema checks, aborted attempts,
recovery of PENDING batches and of orphaned pre-commits, racing runs."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from epochal.checkpoint.controller.core import ensure_schema
from epochal.checkpoint.records import InvariantViolation
from epochal.checkpoint.sinks.batches import SinkBatchState
from epochal.checkpoint.sinks.coordinator import SinkCoordinator
from epochal.meta.backend import open_backend
from epochal.sinks.base import (
    BatchId,
    SinkDataError,
    SinkError,
    SinkSchemaError,
    WriterResult,
    WriterTask,
    vnode_ranges,
)
from epochal.sinks.duckdb_sink import DuckDBTarget
from epochal.sinks.spark_writers import run_writers

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])


class Harness:
    def __init__(self, tmp_path: Path, spark, writers: int = 3, home: Path | None = None, **options: str):  # noqa: ANN001
        self.tmp_path, self.spark, self.writers = tmp_path, spark, writers
        self.target = DuckDBTarget(
            "s", {"database": "out.duckdb", "table": "t", **options}, ["id", "name"], home or tmp_path
        )
        backend = open_backend(f"duckdb:///{tmp_path / 'meta.duckdb'}")
        backend.transaction(ensure_schema)
        self.backend = backend
        # a run that finds the sink being delivered leaves at once instead of waiting for the claim
        self.coordinator = SinkCoordinator(backend, claim_timeout_s=600, claim_wait_s=0)
        self.files: dict[int, list[str]] = {}

    def change(self, epoch: int, rows: list[tuple[int, str, int]]) -> None:
        """Epoch ``epoch``'s change file: (id, name, _weight) rows."""
        table = pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "name": pa.array([r[1] for r in rows], pa.string()),
                "_weight": pa.array([r[2] for r in rows], pa.int64()),
            }
        )
        path = self.tmp_path / f"change-{epoch}-{len(self.files)}.parquet"
        pq.write_table(table, path)
        self.files[epoch] = [str(path)] if rows else []

    def write(self, batch: BatchId, payloads: list[list[str]]) -> list[WriterResult]:
        files = [f for p in payloads for f in p]
        if files:
            self.target.prepare_target(ARROW)
        return run_writers(self.spark if files else None, self.target, batch, files, SCHEMA, self.writers)

    def deliver(self, interval: int = 1, write=None):  # noqa: ANN001, ANN201
        epochs = sorted(self.files.items())
        return self.coordinator.deliver(self.target, epochs, interval, write or self.write)

    def rows(self) -> list[tuple]:
        if not self.target.database.exists():
            return []
        with duckdb.connect(str(self.target.database), read_only=True) as con:
            if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 't'").fetchone()[0]:
                return []
            return con.execute("SELECT * FROM t ORDER BY ALL").fetchall()

    def staged(self) -> list[Path]:
        return sorted(self.target.staging.rglob("*.parquet")) if self.target.staging.exists() else []

    def states(self) -> list[tuple[int, int, str]]:
        return [(b.id.first_epoch, b.id.last_epoch, b.state.value) for b in self.coordinator.batches("s")]


def test_epochs_are_delivered_once_by_parallel_writers(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark)
    h.change(1, [(i, f"n{i}", 1) for i in range(50)])
    report = h.deliver()
    assert report.epochs == 1 and report.rows == 50
    assert len(h.rows()) == 50
    # every writer ran and covered its vnodes, though only some had rows
    (batch,) = h.coordinator.batches("s")
    assert [r.vnodes for r in batch.results] == vnode_ranges(3)
    assert h.deliver().epochs == 0  # a re-run delivers nothing twice
    h.change(2, [(1, "n1", 2)])  # a weight of 2 is two copies in an append-only sink
    h.change(3, [])  # an idle epoch is delivered as nothing
    assert h.deliver().epochs == 2
    assert len(h.rows()) == 52 and h.target.delivered_epoch() == 3
    assert h.states() == [(1, 1, "COMMITTED"), (2, 2, "COMMITTED"), (3, 3, "COMMITTED")]
    assert h.staged() == []  # staged files go once committed


def test_a_staged_file_is_on_the_disk_before_its_writer_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch turns PENDING once its writers return; the commit may load their files after a
    power loss, so each one, and the directory entries naming it, are fsynced first."""
    import os

    target = DuckDBTarget("s", {"database": "out.duckdb", "table": "t"}, ["id", "name"], tmp_path)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    rows = pa.record_batch(
        [pa.array([1, 2], pa.int64()), pa.array(["a", "b"]), pa.array([1, 1], pa.int64())],
        names=["id", "name", "_weight"],
    )
    result = target.write(WriterTask(BatchId("s", 1, 1), 0, 1, (0, 255)), iter([rows]))
    staged = Path(result["file"])
    assert {str(staged), str(staged.parent), str(target.staging), str(target.staging.parent)} <= set(synced)
    assert target.write(WriterTask(BatchId("s", 2, 2), 0, 1, (0, 255)), iter([]))["file"] is None


@pytest.mark.parametrize("kind", ["append-only", "upsert"])
def test_a_home_path_with_key_value_directories_leaves_the_rows_as_written(
    tmp_path: Path,
    spark,  # noqa: ANN001
    kind: str,
) -> None:
    """Staged files live under the home: DuckDB must not read its `name=x` directory as a column."""
    options = {"type": kind, "primary_key": "id"} if kind == "upsert" else {}
    h = Harness(tmp_path, spark, home=tmp_path / "name=x" / "epochal", **options)
    h.change(1, [(i, f"n{i}", 1) for i in range(5)])
    assert h.deliver().epochs == 1
    assert h.rows() == [(i, f"n{i}") for i in range(5)]


def test_a_batch_waits_until_it_holds_commit_checkpoint_interval_epochs(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark, type="upsert", primary_key="id")
    h.change(1, [(1, "a", 1), (2, "b", 1), (3, "c", 1)])
    report = h.deliver(interval=2)
    assert report.epochs == 0 and report.lag_epochs == 1 and h.rows() == []
    # id 1 updated, id 2 deleted, id 4 inserted: netted across the batch's two epochs
    h.change(2, [(1, "a", -1), (1, "A", 1), (2, "b", -1), (4, "d", 1)])
    report = h.deliver(interval=2)
    assert report.epochs == 2 and report.batches == 1
    assert h.rows() == [(1, "A"), (3, "c"), (4, "d")]
    assert h.states() == [(1, 2, "COMMITTED")]


def test_append_only_refuses_retractions_and_commits_nothing(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark)
    h.change(7, [(1, "a", 1), (2, "b", -1)])
    with pytest.raises(SinkError, match=r"sink s, epoch 7.*append-only.*type = 'upsert'"):
        h.deliver()
    assert h.rows() == [] and h.target.delivered_epoch() is None
    assert h.states() == [(7, 7, "ABORTED")] and h.staged() == []
    assert "append-only" in h.coordinator.lag_of("s")["last_error"]


def test_upsert_refuses_two_rows_for_one_key_before_anything_is_pending(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark, type="upsert", primary_key="id")
    h.change(1, [(4, "d", 1), (4, "e", 1)])
    with pytest.raises(SinkError, match=r"key\(s\) of \(id\) have more than one row"):
        h.deliver()
    assert h.rows() == [] and [s for *_, s in h.states()] == ["ABORTED"]


def test_an_incompatible_existing_table_is_an_error_not_a_cast(tmp_path: Path, spark) -> None:  # noqa: ANN001
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t (id VARCHAR, name VARCHAR)")
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1)])
    with pytest.raises(SinkSchemaError, match="column id is VARCHAR, the sink writes BIGINT.*drop or rename"):
        h.deliver()
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_rows_the_table_s_own_rules_refuse_are_refused_before_anything_is_pending(
    tmp_path: Path,
    spark,  # noqa: ANN001
) -> None:
    """DuckDB enforces a table's CHECK and NOT NULL at the commit, which comes after PENDING, when the
    batch must commit: the sink runs the commit's load and rolls it back first. Nothing is retried
    (the same rows fail the same way), nothing is visible, and the error names the rule."""
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t (id BIGINT CHECK (id > 0), name VARCHAR NOT NULL)")
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1), (2, "b", 1)])
    assert h.deliver().epochs == 1
    h.change(2, [(3, "c", 1), (-4, "d", 1)])
    with pytest.raises(SinkDataError, match=r"sink s, epoch 2: DuckDB refused the rows for table t: .*CHECK.*"
                       r"Nothing of the batch was committed"):  # fmt: skip
        h.deliver()
    assert h.rows() == [(1, "a"), (2, "b")] and h.staged() == []
    assert h.states()[-1] == (2, 2, "ABORTED")
    assert "CHECK constraint failed" in h.coordinator.lag_of("s")["last_error"]
    h.files[2] = []
    h.change(2, [(3, None, 1)])
    with pytest.raises(SinkDataError, match="NOT NULL constraint failed"):
        h.deliver()
    # the user relaxes the table: the same epoch is delivered
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t2 AS SELECT * FROM t; DROP TABLE t; ALTER TABLE t2 RENAME TO t")
    assert h.deliver().epochs == 1 and h.rows() == [(1, "a"), (2, "b"), (3, None)]


def test_an_upsert_key_holding_null_is_refused_before_anything_is_pending(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark, type="upsert", primary_key="id")
    h.change(1, [(1, "a", 1)])
    h.deliver()
    h.change(2, [(None, "nobody", 1)])
    with pytest.raises(SinkDataError, match=r"sink s, epoch 2: 1 row\(s\) have a NULL in the key \(id\)"):
        h.deliver()
    assert h.rows() == [(1, "a")] and h.states()[-1] == (2, 2, "ABORTED") and h.staged() == []


def test_a_pending_batch_the_table_refuses_waits_for_the_table_with_its_error_shown(
    tmp_path: Path,
    spark,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rule added between the check and the commit: the batch is PENDING, so it must commit; it
    waits, its error on status, until the table takes it."""
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1), (-2, "b", 1)])
    check = DuckDBTarget.check_rows
    monkeypatch.setattr(DuckDBTarget, "check_rows", lambda self, batch, metadata: None)
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t (id BIGINT CHECK (id > 0), name VARCHAR)")
    for _ in range(2):  # every later run finds it PENDING and tries again
        with pytest.raises(SinkDataError, match=r"sink s, epoch 1: DuckDB refused .*The batch is PENDING"):
            h.deliver()
        assert h.states() == [(1, 1, "PENDING")] and h.rows() == []
    assert "The batch is PENDING" in h.coordinator.lag_of("s")["last_error"]
    monkeypatch.setattr(DuckDBTarget, "check_rows", check)
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t2 AS SELECT * FROM t; DROP TABLE t; ALTER TABLE t2 RENAME TO t")
    report = h.deliver()
    assert report.recommitted == 1 and h.rows() == [(-2, "b"), (1, "a")]
    assert h.states() == [(1, 1, "COMMITTED")] and h.coordinator.lag_of("s")["last_error"] is None


def test_a_reader_holding_the_file_open_is_named_with_the_fix(
    tmp_path: Path,
    spark,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DuckDB shell left open on the sink's file keeps the sink out even read-only; the error said
    the meta store was locked and to use a PostgreSQL meta store."""
    import subprocess
    import sys

    import epochal.meta.backend

    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1)])
    h.deliver()
    hold = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); print('open', flush=True); "
    reader = subprocess.Popen([sys.executable, "-c", hold + "time.sleep(60)", str(h.target.database)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert reader.stdout.readline().strip() == "open"
        monkeypatch.setattr(epochal.meta.backend, "LOCK_WAIT_SECONDS", 1.0)
        h.change(2, [(2, "b", 1)])
        with pytest.raises(SinkError) as caught:
            h.deliver()
    finally:
        reader.kill()
        reader.wait()
    message = str(caught.value)
    assert message.startswith("sink s, epoch 2:") and "sink s's DuckDB database" in message, message
    assert "a DuckDB shell or notebook reading the sink's table" in message and "meta store" not in message
    monkeypatch.setattr(epochal.meta.backend, "LOCK_WAIT_SECONDS", 120.0)
    assert h.deliver().epochs == 1 and h.rows() == [(1, "a"), (2, "b")]  # closed: the epoch waited, delivered


def test_writers_that_miss_vnodes_are_aborted_and_tried_again(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark)
    h.change(1, [(i, "x", 1) for i in range(20)])
    calls = []

    def flaky(batch: BatchId, payloads: list[list[str]]) -> list[WriterResult]:
        results = h.write(batch, payloads)
        calls.append(batch.attempt)
        return results[1:] if len(calls) == 1 else results  # the first attempt loses a writer

    report = h.deliver(write=flaky)
    assert calls == [1, 2] and report.aborted_attempts == 1
    assert [s for *_, s in h.states()] == ["ABORTED", "COMMITTED"]
    assert len(h.rows()) == 20  # the aborted attempt's staged rows never arrived
    assert h.staged() == []


def test_recovery_commits_a_pending_batch_and_drops_orphaned_precommits(tmp_path: Path, spark) -> None:  # noqa: ANN001
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1), (2, "b", 1)])
    # A run that died after persisting PENDING, before its commit:
    pending = BatchId("s", 1, 1, 1, "dead0001")
    h.coordinator._mark(pending, SinkBatchState.PENDING, results=h.write(pending, [h.files[1]]))
    # and one that died after its writers staged, before PENDING:
    orphan = BatchId("s", 1, 1, 1, "dead0002")
    h.write(orphan, [h.files[1]])
    assert h.rows() == []
    report = h.deliver()
    assert report.recommitted == 1 and report.orphans_aborted == 1 and report.epochs == 0
    assert h.rows() == [(1, "a"), (2, "b")] and h.staged() == []
    # committing the same batch again is a no-op: the target's progress row says it holds it
    h.target.commit(pending, [])
    assert h.rows() == [(1, "a"), (2, "b")]


def test_a_run_that_finds_the_sink_being_delivered_leaves_its_precommit_alone(tmp_path: Path, spark) -> None:  # noqa: ANN001
    """Two runs deliver the same sink (several epochs in flight): the second finds the first's claim
    and does nothing, above all no recovery, which would throw the first's pre-commit away."""
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1), (2, "b", 1)])
    seen = []

    def with_a_second_run(batch: BatchId, payloads: list[list[str]]) -> list[WriterResult]:
        results = h.write(batch, payloads)
        seen.append(h.deliver())  # the second run, while the first's writers have pre-committed
        return results

    report = h.deliver(write=with_a_second_run)
    assert seen[0].busy and seen[0].epochs == 0 and seen[0].orphans_aborted == 0
    assert report.epochs == 1 and not report.lost_race
    assert h.rows() == [(1, "a"), (2, "b")] and [s for *_, s in h.states()] == ["COMMITTED"]


def test_a_run_whose_claim_was_taken_over_never_persists_its_precommit(tmp_path: Path, spark) -> None:  # noqa: ANN001
    """A run silent past the claim timeout is taken for dead: another run takes the claim over,
    recovers (throwing the silent run's pre-commit away) and delivers. The silent run must not then
    persist its pre-commit as PENDING: each row arrives once."""
    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1)])
    impatient = SinkCoordinator(h.backend, claim_timeout_s=0, claim_wait_s=0)

    def overtaken(batch: BatchId, payloads: list[list[str]]) -> list[WriterResult]:
        results = h.write(batch, payloads)
        taken = impatient.deliver(h.target, sorted(h.files.items()), 1, h.write)
        assert taken.epochs == 1 and taken.orphans_aborted == 1
        return results

    report = h.deliver(write=overtaken)
    assert report.lost_race and report.epochs == 0
    assert h.rows() == [(1, "a")] and h.staged() == []
    assert [s for *_, s in h.states()] == ["COMMITTED"]


def test_a_batch_state_changes_only_along_its_transitions(tmp_path: Path) -> None:
    h = Harness(tmp_path, None)
    batch = BatchId("s", 1, 1, 1, "n")
    assert h.coordinator._mark(batch, SinkBatchState.PENDING)
    h.coordinator._mark(batch, SinkBatchState.COMMITTED)
    with pytest.raises(InvariantViolation, match="from COMMITTED to ABORTED"):
        h.coordinator._mark(batch, SinkBatchState.ABORTED)
    # a second attempt of delivered epochs cannot become PENDING
    assert not h.coordinator._mark(BatchId("s", 1, 1, 2, "m"), SinkBatchState.PENDING)


def test_the_claim_of_a_killed_run_is_taken_over_at_once(tmp_path: Path, spark) -> None:  # noqa: ANN001
    """A run SIGKILLed while delivering leaves its claim; the next run on this host sees its process
    is gone and delivers now, not after the epoch timeout."""
    import socket
    import subprocess
    import time

    h = Harness(tmp_path, spark)
    h.change(1, [(1, "a", 1)])
    dead = subprocess.Popen(["true"])
    dead.wait()
    h.backend.transaction(
        lambda cur: cur.execute(
            "INSERT INTO sink_claims VALUES (?, ?, ?)", ["s", f"{socket.gethostname()}:{dead.pid}:x", time.time()]
        )
    )
    assert h.deliver().epochs == 1 and h.rows() == [(1, "a")]
    # a live owner's fresh claim is respected: a run leaves the sink to it
    h.backend.transaction(
        lambda cur: cur.execute(
            "INSERT INTO sink_claims VALUES (?, ?, ?)", ["s", f"{socket.gethostname()}:1:y", time.time()]
        )
    )
    h.change(2, [(2, "b", 1)])
    report = h.deliver()
    assert report.busy and report.epochs == 0 and report.lag_epochs == 1
