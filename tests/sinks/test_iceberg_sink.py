"""The Iceberg sink on real tables on disk, with its catalog in SQLite and in the real PostgreSQL
server. The target is called as the coordinator does (write on "executors", commit on the driver);
the table is read back through a fresh pyiceberg SqlCatalog, as another tool would open it."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkError,
    SinkSchemaError,
    WriterTask,
    vnode_ranges,
)
from epochal.sinks.iceberg_sink import IcebergTarget
from epochal.sinks.lake_files import STAGING_DIR

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


@pytest.fixture(params=["sqlite", "postgresql"])
def meta_url(request):
    """No meta URL: the catalog is a SQLite file under the home; a PostgreSQL meta store: the catalog
    lives in that database (a fresh one on the real server, dropped afterwards)."""
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def targets():
    made: list[IcebergTarget] = []
    yield made
    for t in made:
        t.close()


def make(targets, tmp_path: Path, meta_url: str | None = None, sink_type: str = "append-only",
         key: str = "k", columns=SCHEMA.names) -> IcebergTarget:
    options = {"table": "orders", "namespace": "sales", "type": sink_type}
    if sink_type == "upsert":
        options["primary_key"] = key
    t = IcebergTarget("orders_out", options, columns, tmp_path, meta_url)
    targets.append(t)
    return t


def rows(*values: tuple, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    columns = list(zip(*values, strict=True)) if values else [[] for _ in range(len(schema) + 1)]
    arrays = [pa.array(list(c), f.type) for c, f in zip(columns, schema, strict=False)]
    return pa.RecordBatch.from_arrays([*arrays, pa.array(list(columns[-1]), pa.int64())],
                                      names=[*schema.names, WEIGHT])


def write(t: IcebergTarget, batch: BatchId, *writer_rows: list[pa.RecordBatch]) -> list[dict]:
    ranges = vnode_ranges(len(writer_rows))
    # each writer gets the target as an executor would: pickled, without the driver's catalog
    metadata = [
        dict(pickle.loads(pickle.dumps(t)).write(WriterTask(batch, i, len(writer_rows), ranges[i]), iter(b)))
        for i, b in enumerate(writer_rows)
    ]
    json.dumps(metadata)
    return metadata


def deliver(t: IcebergTarget, batch: BatchId, *writer_rows: list[pa.RecordBatch]) -> list[dict]:
    metadata = write(t, batch, *writer_rows)
    t.commit(batch, metadata)
    return metadata


def reopen(t: IcebergTarget):
    """The table as another tool opens it: a fresh SqlCatalog on the same URI and warehouse."""
    catalog = SqlCatalog(t.catalog_name, uri=t.catalog_uri, warehouse=t.warehouse)
    try:
        return catalog.load_table("sales.orders")
    finally:
        catalog.close()


def table_rows(t: IcebergTarget) -> list[dict]:
    return sorted(reopen(t).scan().to_arrow().to_pylist(), key=lambda r: (r["k"] is None, r["k"] or 0, r["name"]))


def sink_files(t: IcebergTarget) -> set[str]:
    location = Path(reopen(t).location())
    return {p.name for p in (location / "data").glob("epochal-*")} | {
        f"{STAGING_DIR}/{p.name}" for p in (location / STAGING_DIR).glob("*")
    }


def test_append_only_is_one_snapshot_per_batch_and_opens_in_a_fresh_catalog(tmp_path, meta_url, targets):
    t = make(targets, tmp_path, meta_url)
    if meta_url is None:
        assert t.catalog_uri == f"sqlite:///{tmp_path.resolve() / 'iceberg-catalog.db'}"
    else:
        assert t.catalog_uri == meta_url.replace("postgresql://", "postgresql+psycopg://")
    assert t.warehouse == str(tmp_path.resolve() / "iceberg-warehouse")
    t.prepare_target(SCHEMA)
    t.prepare_target(SCHEMA)  # a second run finds the table
    assert t.delivered_epoch() is None and t.row_count() == 0
    first = BatchId("orders_out", 1, 2, nonce="r1")
    deliver(t, first, [rows((1, "a", 1.5, 1), (2, "b", 2.0, 2))], [rows((3, "c", None, 1))])
    second = BatchId("orders_out", 3, 3, nonce="r1")
    metadata = deliver(t, second, [rows((4, "d", 4.0, 1))], [])
    assert table_rows(t) == [
        {"k": 1, "name": "a", "amount": 1.5},
        {"k": 2, "name": "b", "amount": 2.0},
        {"k": 2, "name": "b", "amount": 2.0},
        {"k": 3, "name": "c", "amount": None},
        {"k": 4, "name": "d", "amount": 4.0},
    ]
    assert t.delivered_epoch() == 3 and t.row_count() == 5

    t.commit(first, metadata)  # replays after a crash: skipped
    t.commit(second, metadata)
    table = reopen(t)
    summaries = [s.summary for s in table.snapshots()]
    assert [(s["epochal.sink"], s["epochal.first_epoch"], s["epochal.epoch"]) for s in summaries] == [
        ("orders_out", "1", "2"),
        ("orders_out", "3", "3"),
    ]
    assert [s["added-records"] for s in summaries] == ["4", "1"]
    assert table.properties["epochal.sink.orders_out.epoch"] == "3"
    assert len(table_rows(t)) == 5
    if meta_url is not None:
        # the catalog is in the meta database itself, where any Iceberg SQL/JDBC catalog finds it
        with psycopg.connect(meta_url) as conn:
            found = conn.execute("SELECT catalog_name, table_namespace, table_name FROM iceberg_tables").fetchall()
        assert found == [("epochal", "sales", "orders")]


@pytest.mark.parametrize("sink_type", ["append-only", "upsert"])
def test_two_committers_of_one_batch_land_it_once(tmp_path, targets, sink_type):
    """After a claim takeover two runs commit the same PENDING batch. The second loads the table
    before the first commits, so its delivered check says no; its catalog commit must not then land
    the batch a second time on the new head (pyiceberg's own retry would)."""
    first = make(targets, tmp_path, sink_type=sink_type)
    first.prepare_target(SCHEMA)
    deliver(first, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1), (5, "e", 5.0, 1))])
    batch = BatchId("orders_out", 2, 2, nonce="r1")
    metadata = write(first, batch, [rows((1, "a2", 1.5, 1), (2, "b", 2.0, 1))] if sink_type == "upsert" else
                     [rows((2, "b", 2.0, 1), (3, "c", 3.0, 1))])
    second = make(targets, tmp_path, sink_type=sink_type)
    loaded = second._open(batch)  # the second committer's view: the batch is not there yet

    def stale_open(b: BatchId):  # noqa: ANN202
        # the first committer lands the batch between the second's load and its commit
        if not landed:
            landed.append(True)
            first.commit(batch, metadata)
            return loaded
        return second._load()

    landed: list[bool] = []
    second._open = stale_open  # type: ignore[method-assign]
    second.commit(batch, metadata)
    table = reopen(first)
    assert [s.summary["epochal.epoch"] for s in table.snapshots()] == ["1", "2"], "the batch landed once"
    expected = [1, 2, 5] if sink_type == "upsert" else [1, 2, 3, 5]
    assert [r["k"] for r in table_rows(first)] == expected
    assert table.properties["commit.retry.num-retries"] == "0"


def test_an_empty_batch_records_its_epoch_without_a_snapshot(tmp_path, targets):
    t = make(targets, tmp_path)
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1))])
    deliver(t, BatchId("orders_out", 2, 4), [rows()], [])
    assert t.delivered_epoch() == 4
    assert len(reopen(t).snapshots()) == 1
    deliver(t, BatchId("orders_out", 2, 4), [rows((9, "late", 9.0, 1))])  # a replay: skipped
    assert len(table_rows(t)) == 1


def test_append_only_refuses_deletes(tmp_path, targets):
    t = make(targets, tmp_path)
    t.prepare_target(SCHEMA)
    with pytest.raises(SinkError, match=r"sink orders_out, epoch 5: .*append-only.*type = 'upsert'"):
        write(t, BatchId("orders_out", 5, 5), [rows((1, "a", 1.0, -1))])


def test_upsert_deletes_and_writes_in_one_overwrite_snapshot(tmp_path, meta_url, targets):
    t = make(targets, tmp_path, meta_url, "upsert")
    t.prepare_target(SCHEMA)
    deliver(
        t,
        BatchId("orders_out", 1, 1),
        [rows((1, "a", 1.0, 1), (2, "b", 2.0, 1))],
        [rows((10, "x", 10.0, 1), (11, "y", 11.0, 1))],
    )
    upsert = BatchId("orders_out", 2, 3)
    metadata = deliver(t, upsert, [rows((2, "b", 2.0, -1), (1, "a", 1.0, -1), (1, "a2", 1.25, 1), (3, "c", 3.0, 1))])
    assert metadata[0]["keys"] == 3 and "_epochal_staging" in metadata[0]["keys_file"]
    assert table_rows(t) == [
        {"k": 1, "name": "a2", "amount": 1.25},
        {"k": 3, "name": "c", "amount": 3.0},
        {"k": 10, "name": "x", "amount": 10.0},
        {"k": 11, "name": "y", "amount": 11.0},
    ]
    table = reopen(t)
    last = table.current_snapshot().summary
    assert len(table.snapshots()) == 2
    assert (last.operation.value, last["deleted-data-files"], last["added-data-files"]) == ("overwrite", "1", "1")
    assert last["epochal.epoch"] == "3"
    assert not [f for f in sink_files(t) if f.startswith(STAGING_DIR)]  # keys files go after the commit

    t.commit(upsert, metadata)
    assert len(reopen(t).snapshots()) == 2

    # a file keeping some rows is written again without the changed key
    deliver(t, BatchId("orders_out", 4, 4), [rows((10, "x", 10.0, -1))])
    assert [r["k"] for r in table_rows(t)] == [1, 3, 11]
    last = reopen(t).current_snapshot().summary
    assert (last["deleted-data-files"], last["added-data-files"], last["deleted-records"]) == ("1", "1", "2")
    # a batch that only inserts new keys touches no file: a plain append
    deliver(t, BatchId("orders_out", 5, 5), [rows((20, "n", 20.0, 1))])
    assert reopen(t).current_snapshot().summary.operation.value == "append"
    assert t.row_count() == 4 and t.delivered_epoch() == 5


def test_upsert_on_a_composite_key_matches_null_to_null(tmp_path, targets):
    t = make(targets, tmp_path, sink_type="upsert", key="k, name")
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, None, 1.0, 1), (1, "a", 2.0, 1), (None, "z", 3.0, 1))])
    deliver(t, BatchId("orders_out", 2, 2), [rows((1, None, 1.0, -1), (None, "z", 3.0, -1), (None, "z", 4.0, 1))])
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 2.0}, {"k": None, "name": "z", "amount": 4.0}]


def test_abort_and_abort_orphans_remove_only_uncommitted_files(tmp_path, targets):
    t = make(targets, tmp_path, sink_type="upsert")
    t.prepare_target(SCHEMA)
    first = BatchId("orders_out", 1, 1)
    deliver(t, first, [rows((1, "a", 1.0, 1), (2, "b", 2.0, 1))])
    deliver(t, BatchId("orders_out", 2, 2), [rows((1, "a", 1.0, -1))])  # replaces batch 1's file
    committed = sink_files(t)

    aborted = BatchId("orders_out", 3, 3, nonce="x")
    aborted_meta = write(t, aborted, [rows((2, "b", 2.0, -1), (5, "e", 5.0, 1))])
    assert len(sink_files(t) - committed) == 2
    t.abort(aborted, aborted_meta)
    t.abort(aborted, aborted_meta)
    assert sink_files(t) == committed

    write(t, first, [rows((7, "retry", 7.0, 1))])  # a retried task's file no snapshot lists
    pending = BatchId("orders_out", 3, 3, nonce="a")
    pending_meta = write(t, pending, [rows((3, "c", 3.0, 1))])
    pending_files = {f for f in sink_files(t) - committed if "-3-3-1-a_" in f}
    write(t, BatchId("orders_out", 3, 3, nonce="b"), [rows((9, "z", 9.0, -1))])  # a killed run's batch
    foreign = Path(reopen(t).location()) / "data" / "00000-0-foreign.parquet"
    foreign.write_bytes(b"another writer's")
    assert t.abort_orphans([pending]) == 3
    assert sink_files(t) == committed | pending_files and foreign.exists()
    t.commit(pending, pending_meta)
    assert table_rows(t) == [{"k": 2, "name": "b", "amount": 2.0}, {"k": 3, "name": "c", "amount": 3.0}]
    # time travel to batch 1's snapshot still reads its (replaced) file
    table = reopen(t)
    assert table.scan(snapshot_id=table.snapshots()[0].snapshot_id).to_arrow().num_rows == 2
    assert t.abort_orphans([]) == 0


@pytest.mark.parametrize("lost", ["data", "keys"])
def test_a_commit_whose_files_are_gone_raises_precommit_lost_and_changes_nothing(tmp_path, targets, lost):
    t = make(targets, tmp_path, sink_type="upsert")
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1))])
    batch = BatchId("orders_out", 2, 2)
    metadata = write(t, batch, [rows((1, "a", 1.0, -1), (2, "b", 2.0, 1))])
    Path(metadata[0]["files"][0]["path"] if lost == "data" else metadata[0]["keys_file"]).unlink()
    with pytest.raises(PrecommitLost, match=r"sink orders_out, epoch 2: 1 of the files .* are gone"):
        t.commit(batch, metadata)
    assert len(reopen(t).snapshots()) == 1 and t.delivered_epoch() == 1
    t.abort(batch, metadata)
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 1.0}]


def existing_table(t: IcebergTarget, schema: pa.Schema) -> None:
    """The sink's table as another tool made it first, with ``schema``."""
    catalog = SqlCatalog(t.catalog_name, uri=t.catalog_uri, warehouse=t.warehouse)
    try:
        catalog.create_namespace("sales")
        catalog.create_table("sales.orders", schema=schema)
    finally:
        catalog.close()


def test_an_existing_table_with_another_schema_is_refused(tmp_path, targets):
    t = make(targets, tmp_path)
    existing_table(t, pa.schema([("k", pa.int32()), ("name", pa.string()), ("extra", pa.bool_())]))
    with pytest.raises(SinkSchemaError) as caught:
        t.prepare_target(SCHEMA)
    message = str(caught.value)
    assert "sink orders_out" in message and "never casts" in message
    assert "column k is int, the sink writes long" in message
    assert "missing column amount double" in message
    assert "extra column extra boolean" in message


def test_an_existing_table_spelling_a_column_in_another_case_is_refused(tmp_path, targets):
    """Matched ignoring case, the table passed the check and refused the batch at its commit, after
    PENDING ("PyArrow table contains more columns"), every later run again."""
    t = make(targets, tmp_path)
    existing_table(t, pa.schema([("K", pa.int64()), ("name", pa.string()), ("amount", pa.float64())]))
    with pytest.raises(SinkSchemaError, match=r"column k is spelled K in the table.*\(k AS K\)"):
        t.prepare_target(SCHEMA)


def test_an_executor_built_before_prepare_target_finds_the_table_in_the_catalog(tmp_path, targets):
    t = make(targets, tmp_path)
    t.prepare_target(SCHEMA)
    fresh = make(targets, tmp_path)  # as built on another host from the sink's options
    batch = BatchId("orders_out", 1, 1)
    metadata = [dict(fresh.write(WriterTask(batch, 0, 1, (0, 255)), iter([rows((1, "a", 1.0, 1))])))]
    t.commit(batch, metadata)
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 1.0}]


def test_zoned_timestamps_are_stored_as_utc(tmp_path, targets):
    schema = pa.schema([("k", pa.int64()), ("at", pa.timestamp("us", tz="Europe/Paris"))])
    t = make(targets, tmp_path, columns=schema.names)
    t.prepare_target(schema)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, 0, 1), schema=schema)])
    table = reopen(t)
    assert str(table.schema().find_field("at").field_type) == "timestamptz"
    assert table.scan().to_arrow().column("at").cast(pa.int64()).to_pylist() == [0]


def test_an_unreachable_catalog_is_a_config_error_without_the_password(tmp_path):
    t = IcebergTarget("orders_out", {"table": "orders", "catalog.uri": "postgresql://alice:s3cret@127.0.0.1:1/meta"},
                      SCHEMA.names, tmp_path, None)
    assert t.catalog_uri == "postgresql+psycopg://alice:s3cret@127.0.0.1:1/meta"
    assert "s3cret" not in t.describe()
    with pytest.raises(SinkConfigError) as caught:
        t.prepare_target(SCHEMA)
    assert "sink orders_out" in str(caught.value) and "alice:***@127.0.0.1:1" in str(caught.value)
    assert "s3cret" not in str(caught.value)
