"""postgres-cdc's snapshot in key chunks, read as Spark tasks and resumed after a kill, against the
real PostgreSQL server; the table is checked against ``SELECT *`` upstream read with psycopg."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from epochal.connectors import postgres_cdc
from epochal.connectors.cdc_chunks import Chunk, KeyFilter, StagedChunk, chunks_of, integer_boundaries
from epochal.runtime.cdc_status import cdc_lines, cdc_status
from tests.connectors.cdc_oracle import create_pg_database, drop_pg_database, pg_dsn
from tests.epochal_harness import make_harness

DB = "epochal_cdc_chunks_test"
SLOT = "epochal_cdc_chunks_slot"
PIPELINE = f"""
CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
  username = 'postgres', database.name = '{DB}', slot.name = '{SLOT}', snapshot.chunk.rows = '10',
  snapshot.epoch.rows = '30');
CREATE TABLE nums (id INT, v STRING, n INT, PRIMARY KEY (id)) FROM shop TABLE 'nums';
CREATE TABLE names (code STRING, n INT, PRIMARY KEY (code)) FROM shop TABLE 'names';
"""
#: mixed case: byte order ('B' < 'a') differs from a linguistic collation's, where the chunks split
CODES = [f"{c}{i:02d}" for i in range(15) for c in ("a", "B")]


@pytest.fixture
def upstream():
    create_pg_database(DB)
    with psycopg.connect(pg_dsn(DB), autocommit=True) as conn:
        conn.execute("CREATE TABLE nums (id int PRIMARY KEY, v text, n int)")
        conn.execute('CREATE TABLE names (code text COLLATE "en-x-icu" PRIMARY KEY, n int)')
        conn.execute("INSERT INTO nums SELECT g, 'v' || g, g FROM generate_series(1, 60) g")
        conn.cursor().executemany("INSERT INTO names VALUES (%s, %s)", [(c, i) for i, c in enumerate(CODES)])
        yield conn
    drop_pg_database(DB)


def _changes(conn: psycopg.Connection, round_: int) -> None:
    """Updates, deletes, inserts and key changes across the chunks (nums: ids < 31 are the first
    three chunks of 10, staged before the kill; names: the first two chunks by byte order)."""
    with conn.transaction():
        conn.execute("UPDATE nums SET v = %s, n = n + 100 WHERE id IN (2, 15, 45, 58)", [f"u{round_}"])
        conn.execute("DELETE FROM nums WHERE id IN (%s, %s)", [5 + round_, 50 + round_])
        # key changes: from a staged chunk to one read later, and back
        conn.execute("UPDATE nums SET id = %s WHERE id = %s", [80 + round_, 3 + round_ * 10])
        conn.execute("UPDATE nums SET id = %s WHERE id = %s", [-round_, 48 - round_])
        conn.execute("INSERT INTO nums VALUES (%s, 'new', 0)", [200 + round_])
        conn.execute("UPDATE names SET n = n + 1000 WHERE code IN ('B01', 'a13')")
        conn.execute("UPDATE names SET code = %s WHERE code = %s", [f"z{round_}", CODES[round_]])
        conn.execute("DELETE FROM names WHERE code = %s", [CODES[-1 - round_]])


def _equal(runtime, conn: psycopg.Connection, nums_below: int | None = None) -> None:  # noqa: ANN001
    """Each table equals upstream; ``nums`` only in its applied chunks (ids below ``nums_below``)."""
    for table in ("nums", "names"):
        got = Counter(tuple(r) for r in runtime.state(table).collect())
        want = Counter(conn.execute(f"SELECT * FROM {table}").fetchall())
        if table == "nums" and nums_below is not None:
            want = Counter({r: n for r, n in want.items() if r[0] < nums_below})
        assert got == want, (table, sorted(got - want), sorted(want - got))


def test_chunked_snapshot_spreads_over_epochs_resumes_after_a_kill_and_equals_upstream(
    spark, tmp_path: Path, upstream, monkeypatch
) -> None:
    h = make_harness(tmp_path, {"shop.sql": PIPELINE})
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")
    real = postgres_cdc.stage_chunks
    calls: list[tuple[str, list[int]]] = []

    def killed_after_two_chunks(spark, stage_one, chunks, directory, label, total):  # noqa: ANN001, ANN202
        calls.append((label, [c.index for c in chunks]))
        real(spark, stage_one, chunks[:2], directory, label, total)  # two chunks staged and recorded
        raise RuntimeError("killed while staging the snapshot")

    monkeypatch.setattr(postgres_cdc, "stage_chunks", killed_after_two_chunks)
    # injection reads no row, however large the table: each epoch applies 30 rows' worth of chunks
    epoch = runtime.controller.epoch_log.inject(runtime.plan).epoch
    assert [r.count for r in runtime.controller.offsets(epoch, "nums") if r.split.endswith("#snapshot")] == [3]
    assert calls == [] and not (h.home / "cdc" / "nums" / "chunks").exists()  # nor the chunk plan
    with pytest.raises(RuntimeError, match="killed"):
        runtime.run_source(epoch, "nums")
    _changes(upstream, 1)  # in staged chunks and in chunks not read yet

    def counted(*a):  # noqa: ANN002, ANN202
        calls.append((a[4], [c.index for c in a[2]]))
        return real(*a)

    monkeypatch.setattr(postgres_cdc, "stage_chunks", counted)
    runtime = h.runtime(spark)  # a new process: nothing of the first one's in memory
    runtime.recover("test: the run died staging the snapshot")

    def run_epoch() -> dict:
        number = runtime.controller.epoch_log.inject(runtime.plan).epoch
        report = runtime.run_source(number, "nums")
        runtime.run_source(number, "names")
        runtime.commit(number)
        return report.metadata

    # the re-run read only the chunk not staged, at a later snapshot than the two staged
    first = run_epoch()
    nums = [c for label, c in calls if "(public.nums)" in label]
    assert nums == [[0, 1, 2], [2]], calls
    chunks = runtime.connector("nums").staged()
    assert chunks[0].position == chunks[1].position < chunks[2].position and len(chunks) == 3
    assert first["snapshot_chunks"] == "3/6"  # shown in the source step's asset metadata and in status
    assert any(line.startswith("  nums ") and "snapshot 3/6 chunks" in line for line in cdc_lines(cdc_status(runtime)))
    # a partly applied table holds exactly upstream's rows in its applied chunks (ids below 31):
    # a change to a key of a chunk not applied yet is left for that chunk's rows
    _equal(runtime, upstream, nums_below=31)

    _changes(upstream, 2)
    # the rest through Dagster's epoch_job: the table's backfill__ asset plots the snapshot's progress
    result = h.run_in_process(dg.DagsterInstance.ephemeral())
    assert result.success
    assert [c for label, c in calls if "(public.nums)" in label][-1] == [3, 4, 5]
    (progress,) = [
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("backfill__nums")
    ]
    assert progress["snapshot_chunks_applied"].value == 6 and progress["snapshot_done_pct"].value == 100.0
    assert progress["snapshot_chunks_read"].value == 3 and progress["snapshot_rows_staged"].value > 0
    assert "backfill__nums" in {k.to_user_string() for k in h.definitions().resolve_asset_graph().get_all_asset_keys()}
    runtime = h.runtime(spark)
    _equal(runtime, upstream)
    _changes(upstream, 3)  # after the snapshot: from the log only
    run_epoch()
    _equal(runtime, upstream)


def test_key_filter_applies_a_record_only_on_top_of_its_keys_chunk() -> None:
    bounds = integer_boundaries(1, 60, 60, 10)
    assert bounds == [("11",), ("21",), ("31",), ("41",), ("51",)]
    chunks = chunks_of(bounds)
    assert chunks[0] == Chunk(0, None, ("11",)) and chunks[-1] == Chunk(5, ("51",), None)
    staged = [StagedChunk(c, 100 if c.index == 0 else 200, 10, "") for c in chunks]  # 0 before a kill
    keep = KeyFilter(staged, lambda bound: tuple(int(v) for v in bound)).keep
    assert keep((10,), 100) and not keep((10,), 99)  # at the chunk's position: not in its rows
    assert keep((10,), 150) and not keep((11,), 150)  # a boundary key is its upper chunk's
    assert not keep((31,), 150) and not keep((10**9,), 199) and keep((-(10**9),), 150)
    # a key change from 5 (read at 100) to 55 (read at 200) at 150: the delete applies, the upsert
    # is in chunk 5's rows already; from 55 back to 5 at 150: the delete is skipped (55 was not
    # there at 200), the upsert applies
    assert keep((5,), 150) and not keep((55,), 150)
    assert all(keep((k,), 200) for k in (-5, 5, 11, 55))  # at or after every chunk: all apply
    # chunks 0-2 applied so far: a key of chunk 3 on is left for that chunk's rows, at any position
    partial = KeyFilter(staged[:3], lambda bound: tuple(int(v) for v in bound)).keep
    assert partial((30,), 200) and not partial((31,), 200) and not partial((10**9,), 10**9)
    with pytest.raises(ValueError, match="not the plan's first chunks"):
        KeyFilter(staged[1:], lambda bound: tuple(int(v) for v in bound))


def test_a_table_whose_snapshot_was_staged_whole_plans_no_snapshot_chunks(tmp_path: Path) -> None:
    """A table that an Epochal before the snapshot split staged whole at its first injection has a
    WAL offset and no snapshot split: it plans no chunks (they were all applied in its first epoch)."""
    from types import SimpleNamespace

    options = {"hostname": "h", "username": "u", "database.name": "d", "slot.name": "s", "table.name": "public.t"}
    config, problems = postgres_cdc.parse_options({"connector": "postgres-cdc", **options})
    assert not problems
    connector = postgres_cdc.PostgresCdcSource(config, SimpleNamespace(name="t"), tmp_path)
    assert connector._snapshot_range({"public.t": 1234}) == []
    # a new table plans its first chunks before it has a chunk plan (the first read makes it)
    assert [(r.start, r.end) for r in connector._snapshot_range({})] == [(0, 10)]


def test_a_chunk_staged_twice_keeps_its_first_record_and_its_file(tmp_path: Path) -> None:
    """Two runs (or a Spark task's retry) staging one chunk: the first record stands, every reader
    sees one position, and the file it names is never deleted, even when both wrote that file."""
    from epochal.connectors.cdc_chunks import chunk_file_path, record_chunk, staged_chunks

    chunk = Chunk(0, None, None)
    first, second = (chunk_file_path(tmp_path, 0, at) for at in (100, 200))
    for path in (first, second):
        path.write_bytes(b"rows")
    assert record_chunk(tmp_path, StagedChunk(chunk, 100, 5, str(first))).position == 100
    standing = record_chunk(tmp_path, StagedChunk(chunk, 200, 5, str(second)))  # a later run: it loses
    assert standing.position == 100 and standing.file == str(first) and first.exists() and not second.exists()
    retried = record_chunk(tmp_path, StagedChunk(chunk, 100, 5, str(first)))  # a retry at the same position
    assert retried.file == str(first) and first.exists()
    replaced = record_chunk(tmp_path, StagedChunk(chunk, 200, 5, str(first)), replace=True)  # a stale chunk
    assert staged_chunks(tmp_path, [chunk])[0] == replaced
