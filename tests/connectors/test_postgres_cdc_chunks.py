"""postgres-cdc's snapshot in key chunks, read as Spark tasks and resumed after a kill, against the
real PostgreSQL server; the table is checked against ``SELECT *`` upstream read with psycopg."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg
import pytest

from epochal.connectors import postgres_cdc
from epochal.connectors.cdc_chunks import Chunk, KeyFilter, StagedChunk, chunks_of, integer_boundaries
from tests.connectors.cdc_oracle import create_pg_database, drop_pg_database, pg_dsn
from tests.epochal_harness import make_harness

DB = "epochal_cdc_chunks_test"
SLOT = "epochal_cdc_chunks_slot"
PIPELINE = f"""
CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
  username = 'postgres', database.name = '{DB}', slot.name = '{SLOT}', snapshot.chunk.rows = '10');
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


def _equal(runtime, conn: psycopg.Connection) -> None:  # noqa: ANN001
    for table in ("nums", "names"):
        got = Counter(tuple(r) for r in runtime.state(table).collect())
        want = Counter(conn.execute(f"SELECT * FROM {table}").fetchall())
        assert got == want, (table, sorted(got - want), sorted(want - got))


def test_chunked_snapshot_resumes_after_a_kill_and_equals_upstream(
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
    with pytest.raises(RuntimeError, match="killed"):
        runtime.controller.epoch_log.inject(runtime.plan)
    _changes(upstream, 1)  # in staged chunks and in chunks not read yet

    def counted(*a):  # noqa: ANN002, ANN202
        calls.append((a[4], [c.index for c in a[2]]))
        return real(*a)

    monkeypatch.setattr(postgres_cdc, "stage_chunks", counted)
    runtime = h.runtime(spark)  # a new process: nothing of the first one's in memory
    epoch = runtime.controller.epoch_log.inject(runtime.plan).epoch

    # the resume read only the chunks not staged, at a later snapshot than the staged ones
    first = [c for label, c in calls if "(public.nums)" in label]
    assert first[0] == [0, 1, 2, 3, 4, 5] and first[1] == [2, 3, 4, 5], calls
    chunks = runtime.connector("nums").snapshot().chunks
    assert chunks[0].position == chunks[1].position < chunks[2].position == chunks[5].position
    report = runtime.run_source(epoch, "nums")
    assert report.metadata["snapshot_chunks"] == "6/6"  # shown in the source step's asset metadata
    runtime.run_source(epoch, "names")
    runtime.commit(epoch)
    _equal(runtime, upstream)
    # the changes between the kill and the resume are in the chunks read after it, and apply from
    # the log only in the two chunks staged before: updates of 2 and 15 (one record each), the
    # delete of 6 and of key 13 (moved to 81), the upsert of key -1 (moved from 47): 5 records on
    # top of 60 rows staged (20 before the changes, 40 after)
    assert report.metadata["records_read"] == 60 + 5

    _changes(upstream, 2)  # after the snapshot: from the log only
    second = runtime.controller.epoch_log.inject(runtime.plan).epoch
    runtime.run_source(second, "nums")
    runtime.run_source(second, "names")
    runtime.commit(second)
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
    with pytest.raises(ValueError, match="do not cover"):
        KeyFilter(staged[:-1], lambda bound: tuple(int(v) for v in bound))
