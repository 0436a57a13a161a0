"""The DuckDB sink on real Parquet files and a real DuckDB target: exactly once, upserts, schema checks."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochal.errors import EpochalError
from epochal.sinks.duckdb_sink import DuckDBSink, SinkSchemaError


def change(tmp_path: Path, name: str, rows: list[tuple[int, str, int]]) -> list[str]:
    """One epoch's change file: (id, name, _weight) rows."""
    table = pa.table({
        "id": pa.array([r[0] for r in rows], pa.int64()),
        "name": pa.array([r[1] for r in rows], pa.string()),
        "_weight": pa.array([r[2] for r in rows], pa.int64()),
    })
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return [str(path)]


def target(sink: DuckDBSink) -> list[tuple]:
    with duckdb.connect(str(sink.database), read_only=True) as con:
        return con.execute(f"SELECT * FROM {sink.table} ORDER BY ALL").fetchall()


def make(tmp_path: Path, **options: str) -> DuckDBSink:
    opts = {"database": "out.duckdb", "table": "t", **options}
    return DuckDBSink("s", opts, ["id", "name"], tmp_path)


def test_append_only_delivers_each_epoch_once(tmp_path: Path) -> None:
    sink = make(tmp_path)
    files = change(tmp_path, "e1", [(1, "a", 1), (2, "b", 1)])
    assert sink.deliver(10, files).rows_inserted == 2
    assert sink.deliver(10, files).skipped  # a re-run of the same epoch
    assert sink.deliver(9, files).skipped  # an older epoch
    sink.deliver(11, change(tmp_path, "e2", [(1, "a", 1)]))
    assert target(sink) == [(1, "a"), (1, "a"), (2, "b")]
    assert sink.delivered_epoch() == 11


def test_append_only_refuses_retractions(tmp_path: Path) -> None:
    sink = make(tmp_path)
    with pytest.raises(EpochalError, match="append-only.*type = 'upsert'"):
        sink.deliver(1, change(tmp_path, "e1", [(1, "a", -1)]))
    assert sink.delivered_epoch() is None  # nothing half delivered


def test_upsert_applies_updates_and_deletes(tmp_path: Path) -> None:
    sink = make(tmp_path, type="upsert", primary_key="id")
    sink.deliver(1, change(tmp_path, "e1", [(1, "a", 1), (2, "b", 1), (3, "c", 1)]))
    # id 1 updated (old row out, new row in), id 2 deleted, id 4 inserted.
    sink.deliver(2, change(tmp_path, "e2", [(1, "a", -1), (1, "A", 1), (2, "b", -1), (4, "d", 1)]))
    assert target(sink) == [(1, "A"), (3, "c"), (4, "d")]


def test_upsert_refuses_two_rows_for_one_key_instead_of_keeping_either(tmp_path: Path) -> None:
    """The loader proves the sink key unique in its view; an epoch that breaks that is an error
    (whichever row an upsert kept would be arbitrary), and nothing of the epoch is delivered."""
    sink = make(tmp_path, type="upsert", primary_key="id")
    sink.deliver(1, change(tmp_path, "e1", [(1, "a", 1)]))
    for rows in ([(4, "d", 1), (4, "e", 1)], [(4, "d", 1), (4, "d", 1)]):
        with pytest.raises(EpochalError, match=r"key\(s\) of \(id\) have more than one row"):
            sink.deliver(2, change(tmp_path, f"e2-{rows[1][1]}", rows))
    assert target(sink) == [(1, "a")] and sink.delivered_epoch() == 1


def test_incompatible_existing_table_is_an_error_not_a_cast(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t (id VARCHAR, name VARCHAR)")
    sink = make(tmp_path)
    with pytest.raises(SinkSchemaError, match="column id is VARCHAR, the sink writes BIGINT.*drop or rename"):
        sink.deliver(1, change(tmp_path, "e1", [(1, "a", 1)]))
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_upsert_needs_the_key_on_an_existing_table(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "out.duckdb")) as con:
        con.execute("CREATE TABLE t (id BIGINT, name VARCHAR)")
    sink = make(tmp_path, type="upsert", primary_key="id")
    with pytest.raises(SinkSchemaError, match="PRIMARY KEY"):
        sink.deliver(1, change(tmp_path, "e1", [(1, "a", 1)]))
