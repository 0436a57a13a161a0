"""The Delta Lake sink on real tables on disk: the target is called as the coordinator does (write on
"executors", commit on the driver) and the table is read back with deltalake, not through the sink."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkDataError,
    SinkError,
    SinkSchemaError,
    WriterTask,
    vnode_ranges,
)
from epochal.sinks.delta_sink import DeltaTarget
from epochal.sinks.lake_files import STAGING_DIR

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


def target(tmp_path: Path, sink_type: str = "append-only", key: str = "k") -> DeltaTarget:
    options = {"location": "out/table", "type": sink_type}
    if sink_type == "upsert":
        options["primary_key"] = key
    return DeltaTarget("orders_out", options, SCHEMA.names, tmp_path, None)


def rows(*values: tuple, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    """A batch of (columns..., weight) tuples."""
    columns = list(zip(*values, strict=True)) if values else [[] for _ in range(len(schema) + 1)]
    arrays = [pa.array(list(c), f.type) for c, f in zip(columns, schema, strict=False)]
    return pa.RecordBatch.from_arrays([*arrays, pa.array(list(columns[-1]), pa.int64())],
                                      names=[*schema.names, WEIGHT])


def deliver(t: DeltaTarget, batch: BatchId, *writer_rows: list[pa.RecordBatch]) -> list[dict]:
    """Run one writer per entry of ``writer_rows``, then commit; returns the writers' metadata."""
    ranges = vnode_ranges(len(writer_rows))
    # each writer gets the target as an executor would: pickled
    metadata = [
        dict(pickle.loads(pickle.dumps(t)).write(WriterTask(batch, i, len(writer_rows), ranges[i]), iter(batches)))
        for i, batches in enumerate(writer_rows)
    ]
    json.dumps(metadata)  # the coordinator persists it as JSON
    t.commit(batch, metadata)
    return metadata


def table_rows(t: DeltaTarget) -> list[dict]:
    return sorted(DeltaTable(t.location).to_pyarrow_table().to_pylist(), key=lambda r: (r["k"] is None, r["k"]))


def commits(t: DeltaTarget) -> list[dict]:
    return [h for h in DeltaTable(t.location).history() if h["operation"] != "CREATE TABLE"]


def log_actions(t: DeltaTarget, version: int) -> list[str]:
    """The kinds of the actions in one Delta commit, read from the log itself."""
    lines = (Path(t.location) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return sorted(next(iter(json.loads(line))) for line in lines)


def sink_files(t: DeltaTarget) -> set[str]:
    root = Path(t.location)
    return {p.name for p in root.glob("epochal-*.parquet")} | {
        f"{STAGING_DIR}/{p.name}" for p in (root / STAGING_DIR).glob("*")
    }


def test_append_only_writes_weighted_copies_in_one_commit_per_batch(tmp_path):
    t = target(tmp_path)
    t.prepare_target(SCHEMA)
    assert t.describe() == f"delta:{tmp_path / 'out' / 'table'}"
    assert t.delivered_epoch() is None and t.row_count() == 0
    first = BatchId("orders_out", 1, 2, nonce="r1")
    deliver(t, first, [rows((1, "a", 1.5, 1), (2, "b", 2.0, 2))], [rows((3, "c", None, 1))])
    assert table_rows(t) == [
        {"k": 1, "name": "a", "amount": 1.5},
        {"k": 2, "name": "b", "amount": 2.0},
        {"k": 2, "name": "b", "amount": 2.0},
        {"k": 3, "name": "c", "amount": None},
    ]
    second = BatchId("orders_out", 3, 3, nonce="r1")
    metadata = deliver(t, second, [rows((4, "d", 4.0, 1))], [])
    assert metadata[1] == {"files": [], "rows": 0, "keys_file": None, "keys": 0}
    assert DeltaTable(t.location).transaction_version("orders_out") == 3 == t.delivered_epoch()
    assert t.row_count() == 5

    # A replayed commit (the coordinator crashed after committing) changes nothing.
    version = DeltaTable(t.location).version()
    t.commit(first, metadata)
    t.commit(second, metadata)
    assert DeltaTable(t.location).version() == version
    assert len(table_rows(t)) == 5
    history = commits(t)
    assert len(history) == 2
    assert {(h["epochal.first_epoch"], h["epochal.last_epoch"]) for h in history} == {(1, 2), (3, 3)}
    # stats land in the log, so other engines can skip files and count without reading them
    add = DeltaTable(t.location).get_add_actions(flatten=True)
    assert pa.table(add).column("num_records").null_count == 0
    assert sorted(pa.table(add).column("max.k").to_pylist()) == [2, 3, 4]


def test_an_empty_batch_records_its_epoch(tmp_path):
    t = target(tmp_path)
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows()], [])
    assert t.delivered_epoch() == 1 and table_rows(t) == [] and len(commits(t)) == 1


def test_append_only_refuses_deletes(tmp_path):
    t = target(tmp_path)
    t.prepare_target(SCHEMA)
    batch = BatchId("orders_out", 5, 5)
    with pytest.raises(SinkError, match=r"sink orders_out, epoch 5: .*append-only .* 1 row\(s\).*type = 'upsert'"):
        t.write(WriterTask(batch, 0, 1, (0, 255)), iter([rows((1, "a", 1.0, 1), (2, "b", 1.0, -1))]))


def test_upsert_rewrites_the_files_holding_changed_keys_in_the_same_commit(tmp_path):
    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    deliver(
        t,
        BatchId("orders_out", 1, 1),
        [rows((1, "a", 1.0, 1), (2, "b", 2.0, 1))],
        [rows((10, "x", 10.0, 1), (11, "y", 11.0, 1))],
    )
    before = set(pa.table(DeltaTable(t.location).get_add_actions()).column("path").to_pylist())
    # key 2 deleted, key 1 updated (its old row goes, its new one comes), key 3 new; 10, 11 untouched
    upsert = BatchId("orders_out", 2, 4)
    metadata = deliver(
        t, upsert, [rows((2, "b", 2.0, -1), (1, "a", 1.0, -1), (1, "a2", 1.25, 1), (3, "c", 3.0, 1))]
    )
    assert metadata[0]["keys"] == 3 and metadata[0]["keys_file"].startswith(f"{STAGING_DIR}/")
    assert "keys" not in json.dumps(metadata[0]["files"])  # the keys travel in the file, not the metadata
    assert table_rows(t) == [
        {"k": 1, "name": "a2", "amount": 1.25},
        {"k": 3, "name": "c", "amount": 3.0},
        {"k": 10, "name": "x", "amount": 10.0},
        {"k": 11, "name": "y", "amount": 11.0},
    ]
    history = commits(t)
    assert len(history) == 2
    # one commit: the file of keys 1, 2 removed (nothing of it stays), the new rows' file added
    assert log_actions(t, DeltaTable(t.location).version()) == ["add", "commitInfo", "remove", "txn"]
    after = set(pa.table(DeltaTable(t.location).get_add_actions()).column("path").to_pylist())
    assert len(before & after) == 1  # the file of keys 10, 11 was pruned by its stats, not rewritten
    assert not list((Path(t.location) / STAGING_DIR).glob("*"))
    assert t.delivered_epoch() == 4

    version = DeltaTable(t.location).version()
    t.commit(upsert, metadata)
    assert DeltaTable(t.location).version() == version and len(table_rows(t)) == 4

    # a file keeping some rows is written again without the changed key
    deliver(t, BatchId("orders_out", 5, 5), [rows((10, "x", 10.0, -1))])
    assert [r["k"] for r in table_rows(t)] == [1, 3, 11]
    assert log_actions(t, DeltaTable(t.location).version()) == ["add", "commitInfo", "remove", "txn"]


def test_upsert_on_a_composite_key_matches_null_to_null(tmp_path):
    schema = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    t = DeltaTarget("orders_out", {"location": "t", "type": "upsert", "primary_key": "k, name"}, schema.names,
                    tmp_path, None)
    t.prepare_target(schema)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, None, 1.0, 1), (1, "a", 2.0, 1), (None, "z", 3.0, 1))])
    deliver(t, BatchId("orders_out", 2, 2), [rows((1, None, 1.0, -1), (None, "z", 3.0, -1), (None, "z", 4.0, 1))])
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 2.0}, {"k": None, "name": "z", "amount": 4.0}]


def test_upsert_takes_its_key_in_any_case(tmp_path):
    t = target(tmp_path, "upsert", key="K")
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1), (2, "b", 2.0, 1))])
    deliver(t, BatchId("orders_out", 2, 2), [rows((1, "a", 1.0, -1), (1, "A", 3.0, 1))])
    assert [(r["k"], r["name"]) for r in table_rows(t)] == [(1, "A"), (2, "b")]


def test_upsert_refuses_two_rows_for_one_key(tmp_path):
    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    with pytest.raises(SinkError, match="more than one row to write"):
        t.write(WriterTask(BatchId("orders_out", 1, 1), 0, 1, (0, 255)), iter([rows((1, "a", 1.0, 1))] * 2))


def test_abort_removes_only_the_batch_s_uncommitted_files(tmp_path):
    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1))])
    committed = sink_files(t)
    batch = BatchId("orders_out", 2, 2, nonce="run2")
    metadata = [dict(t.write(WriterTask(batch, 0, 1, (0, 255)), iter([rows((1, "a", 1.0, -1), (2, "b", 2.0, 1))])))]
    assert len(sink_files(t) - committed) == 2  # a data file and a keys file
    t.abort(batch, metadata)
    t.abort(batch, metadata)  # idempotent
    assert sink_files(t) == committed
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 1.0}]


@pytest.mark.parametrize("lost", ["data", "keys"])
def test_a_commit_whose_files_are_gone_raises_precommit_lost_and_changes_nothing(tmp_path, lost):
    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1))])
    batch = BatchId("orders_out", 2, 2)
    metadata = [dict(t.write(WriterTask(batch, 0, 1, (0, 255)), iter([rows((1, "a", 1.0, -1), (2, "b", 2.0, 1))])))]
    gone = metadata[0]["files"][0]["path"] if lost == "data" else metadata[0]["keys_file"]
    (Path(t.location) / gone).unlink()
    version = DeltaTable(t.location).version()
    with pytest.raises(PrecommitLost, match=r"sink orders_out, epoch 2: 1 of the files .* are gone"):
        t.commit(batch, metadata)
    assert DeltaTable(t.location).version() == version and t.delivered_epoch() == 1
    t.abort(batch, metadata)
    assert table_rows(t) == [{"k": 1, "name": "a", "amount": 1.0}]


def test_abort_orphans_keeps_pending_batches_and_every_committed_file(tmp_path):
    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    first = BatchId("orders_out", 1, 1)
    deliver(t, first, [rows((1, "a", 1.0, 1), (2, "b", 2.0, 1))])
    # batch 2 rewrites batch 1's file: the removed file stays for time travel, never an orphan
    deliver(t, BatchId("orders_out", 2, 2), [rows((1, "a", 1.0, -1))])
    committed = sink_files(t)
    # a retried Spark task of batch 1 left a file that no commit lists
    t.write(WriterTask(first, 0, 1, (0, 255)), iter([rows((7, "retry", 7.0, 1))]))
    pending = BatchId("orders_out", 3, 3, nonce="a")
    pending_meta = [dict(t.write(WriterTask(pending, 0, 1, (0, 255)), iter([rows((3, "c", 3.0, 1))])))]
    pending_files = sink_files(t) - committed - {f for f in sink_files(t) if "-1-1-1_" in f}
    killed = BatchId("orders_out", 3, 3, nonce="b")  # a run killed before it persisted PENDING
    t.write(WriterTask(killed, 0, 1, (0, 255)), iter([rows((9, "z", 9.0, -1))]))
    # a foreign file in the table directory is never touched
    write_deltalake(t.location + "_other", pa.table({"x": [1]}))
    (Path(t.location) / "notes.parquet").write_bytes(b"not ours")

    assert t.abort_orphans([pending]) == 3  # the retried file, the killed batch's data and keys files
    assert sink_files(t) == committed | pending_files
    assert (Path(t.location) / "notes.parquet").exists()
    t.commit(pending, pending_meta)
    assert table_rows(t) == [{"k": 2, "name": "b", "amount": 2.0}, {"k": 3, "name": "c", "amount": 3.0}]
    # time travel still reads the version batch 2 replaced
    assert DeltaTable(t.location, version=1).to_pyarrow_table().num_rows == 2
    assert t.abort_orphans([]) == 0


def test_an_existing_table_with_another_schema_is_refused(tmp_path):
    t = target(tmp_path)
    write_deltalake(t.location, pa.table({"k": pa.array([1], pa.int32()), "name": ["a"], "extra": [True]}))
    with pytest.raises(SinkSchemaError) as caught:
        t.prepare_target(SCHEMA)
    message = str(caught.value)
    assert "sink orders_out" in message
    assert "column k is integer, the sink writes long" in message
    assert "missing column amount double" in message
    assert "extra column extra boolean" in message
    assert "never casts" in message


def test_an_existing_table_spelling_a_column_in_another_case_is_refused(tmp_path):
    """Matched ignoring case, the table took the batch, and every column of its rows read back NULL:
    Delta readers match a file's columns by exact name."""
    t = target(tmp_path)
    write_deltalake(t.location, pa.table({"K": [0], "name": ["seed"], "Amount": [0.5]}))
    with pytest.raises(SinkSchemaError) as caught:
        t.prepare_target(SCHEMA)
    message = str(caught.value)
    assert "column k is spelled K in the table" in message and "(amount AS Amount)" in message
    assert "name is spelled" not in message


def test_an_existing_table_with_the_same_columns_is_used(tmp_path):
    t = target(tmp_path)
    # another tool made it, columns in another order: Delta reads by name
    write_deltalake(t.location, pa.table({"amount": [0.5], "k": [0], "name": ["seed"]}))
    t.prepare_target(SCHEMA)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, "a", 1.0, 1))])
    assert [r["k"] for r in table_rows(t)] == [0, 1]


def table_with_rules(t: DeltaTarget) -> None:
    """A table another tool made with every kind of row rule Delta leaves to its writers: a CHECK
    constraint, a column invariant and a generated column (delta-rs's own writer enforces them)."""
    from deltalake.schema import Field, PrimitiveType, Schema

    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "amount < 100"}})}
    DeltaTable.create(
        t.location,
        Schema([
            Field("k", PrimitiveType("long"), True),
            Field("name", PrimitiveType("string"), True, {"delta.generationExpression": "upper(concat('n', k))"}),
            Field("amount", PrimitiveType("double"), True, invariant),
        ]),
    )  # fmt: skip
    DeltaTable(t.location).alter.add_constraint({"k_positive": "k > 0"})


def precommit(t: DeltaTarget, batch: BatchId, *writer_rows: list[pa.RecordBatch]) -> list[dict]:
    ranges = vnode_ranges(len(writer_rows))
    return [
        dict(t.write(WriterTask(batch, i, len(writer_rows), ranges[i]), iter(batches)))
        for i, batches in enumerate(writer_rows)
    ]


def test_rows_breaking_the_table_s_rules_are_refused_before_the_commit(tmp_path):
    """Epochal writes the files and commits them with delta-rs's transaction API, which checks no
    rule: the sink checks them over the staged files before the batch is PENDING. NULL breaks a rule."""
    t = target(tmp_path)
    table_with_rules(t)
    t.prepare_target(SCHEMA)
    good = BatchId("orders_out", 1, 1, 1, "ok")
    metadata = precommit(t, good, [rows((1, "N1", 5.0, 1), (2, "N2", 99.0, 2))])
    t.check_rows(good, metadata)
    t.commit(good, metadata)
    assert [(r["k"], r["name"]) for r in table_rows(t)] == [(1, "N1"), (2, "N2"), (2, "N2")]

    cases = {
        "CHECK constraint k_positive (k > 0)": [(-3, "N-3", 1.0, 1)],
        "CHECK constraint k_positive": [(None, None, 1.0, 1)],  # NULL is not TRUE
        "invariant amount (amount < 100)": [(4, "N4", 100.0, 1)],
        "generated column name (upper(concat('n', k)))": [(5, "n5", 1.0, 1)],
    }
    for epoch, (rule, values) in enumerate(cases.items(), start=2):
        batch = BatchId("orders_out", epoch, epoch, 1, f"b{epoch}")
        # two writers, one of them with a breaking row
        metadata = precommit(t, batch, [rows((10 + epoch, f"N{10 + epoch}", 1.0, 1))], [rows(*values)])
        with pytest.raises(SinkDataError) as caught:
            t.check_rows(batch, metadata)
        message = str(caught.value)
        assert message.startswith(f"sink orders_out, epoch {epoch}: the Delta table at delta:"), message
        assert f"1 row(s) break its {rule}" in message and "Nothing of the batch was committed" in message
        t.abort(batch, metadata)
    assert len(table_rows(t)) == 3 and len(commits(t)) == 2  # the rules' ALTER and the good batch
    assert sink_files(t) and all(f.startswith("epochal-orders_out-1-1-1-ok") for f in sink_files(t)), sink_files(t)


def test_a_rule_the_sink_cannot_evaluate_is_a_config_error_naming_it(tmp_path):
    t = target(tmp_path)
    write_deltalake(t.location, pa.table({"k": [1], "name": ["a"], "amount": [1.0]}))
    # DataFusion's own function: delta-rs takes the constraint, DuckDB has no such function
    DeltaTable(t.location).alter.add_constraint({"typed": "arrow_typeof(k) = 'Int64'"})
    t.prepare_target(SCHEMA)
    batch = BatchId("orders_out", 1, 1)
    metadata = precommit(t, batch, [rows((2, "b", 2.0, 1))])
    with pytest.raises(SinkConfigError, match=r"cannot evaluate that expression .*rewrite or drop the rule"):
        t.check_rows(batch, metadata)


def test_tables_whose_values_the_writer_must_generate_are_refused(tmp_path):
    """An append-only table cannot take an upsert's rewrites; an identity column's values and
    high-water mark are the writer's to generate."""
    from deltalake.schema import Field, PrimitiveType, Schema

    t = target(tmp_path, "upsert")
    write_deltalake(
        t.location, pa.table({"k": [1], "name": ["a"], "amount": [1.0]}), configuration={"delta.appendOnly": "true"}
    )
    with pytest.raises(SinkSchemaError, match=r"append-only \(delta.appendOnly = true\).*type = 'append-only'"):
        t.prepare_target(SCHEMA)
    target(tmp_path).prepare_target(SCHEMA)  # an append-only sink takes the same table

    t = target(tmp_path / "i")
    identity = {"delta.identity.start": 1, "delta.identity.step": 1, "delta.identity.allowExplicitInsert": False}
    fields = [Field("k", PrimitiveType("long"), True, identity), Field("name", PrimitiveType("string"), True),
              Field("amount", PrimitiveType("double"), True)]  # fmt: skip
    DeltaTable.create(t.location, Schema(fields))
    with pytest.raises(SinkSchemaError, match=r"column k is an identity column"):
        t.prepare_target(SCHEMA)


def test_zoned_timestamps_are_stored_as_utc(tmp_path):
    schema = pa.schema([("k", pa.int64()), ("at", pa.timestamp("us", tz="Europe/Paris"))])
    t = DeltaTarget("orders_out", {"location": "t"}, schema.names, tmp_path, None)
    t.prepare_target(schema)
    deliver(t, BatchId("orders_out", 1, 1), [rows((1, 0, 1), schema=schema)])
    table = DeltaTable(t.location).to_pyarrow_table()
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert table.column("at").cast(pa.int64()).to_pylist() == [0]


def test_append_only_batches_are_written_by_spark_itself_and_committed_once(tmp_path, spark):
    """Through the coordinator's writer path: Spark's own Parquet writer writes an append-only
    batch (weights as copies), the files move into the table under the batch's names, one commit."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from epochal.sinks.spark_writers import run_writers

    t = target(tmp_path)
    t.prepare_target(SCHEMA)
    change = tmp_path / "change.parquet"
    pq.write_table(pa.Table.from_batches([rows((1, "a", 1.5, 1), (2, "b", 2.5, 2), (3, None, None, 1))]), change)
    spark_schema = StructType(
        [StructField("k", LongType()), StructField("name", StringType()), StructField("amount", DoubleType())]
    )
    batch = BatchId("orders_out", 7, 7, 1, "n1")
    results = run_writers(spark, t, batch, [str(change)], spark_schema, 3)
    assert [r.vnodes for r in results] == [(0, 255)] and results[0].rows == 4
    assert not (Path(t.location) / STAGING_DIR / "epochal-orders_out-7-7-1-n1_spark").exists()
    assert table_rows(t) == [], "nothing is visible before the commit"
    t.commit(batch, [r.metadata for r in results])
    got = sorted((r["k"], r["name"], r["amount"]) for r in table_rows(t))
    assert got == [(1, "a", 1.5), (2, "b", 2.5), (2, "b", 2.5), (3, None, None)]
    assert len(commits(t)) == 1 and DeltaTable(t.location).transaction_version("orders_out") == 7

    # a retraction in an append-only batch fails the whole Spark job, naming the sink and epoch
    pq.write_table(pa.Table.from_batches([rows((1, "a", 1.5, -1))]), change)
    with pytest.raises(Exception, match=r"sink orders_out, epoch 8: the sink is append-only"):
        run_writers(spark, t, BatchId("orders_out", 8, 8, 1, "n2"), [str(change)], spark_schema, 2)
    assert t.abort_orphans([]) == 1  # the failed job's staging directory
    assert len(commits(t)) == 1


def test_upsert_batches_copy_on_write_on_the_executors_in_one_commit(tmp_path, spark):
    """Through the coordinator's writer path: an upsert batch's files are written by Spark, and the
    table's files holding touched keys are rewritten by Spark too (no row through the driver); one
    commit removes them and adds the rest. NULL keys match NULL keys."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from epochal.sinks.spark_writers import run_writers

    t = target(tmp_path, "upsert")
    t.prepare_target(SCHEMA)
    spark_schema = StructType(
        [StructField("k", LongType()), StructField("name", StringType()), StructField("amount", DoubleType())]
    )
    change = tmp_path / "change.parquet"

    def batch(epoch: int, *values: tuple) -> None:
        pq.write_table(pa.Table.from_batches([rows(*values)]), change)
        b = BatchId("orders_out", epoch, epoch, 1, f"n{epoch}")
        results = run_writers(spark, t, b, [str(change)], spark_schema, 2)
        t.commit(b, [r.metadata for r in results])

    batch(1, (1, "a", 1.0, 1), (2, "b", 2.0, 1), (3, "c", 3.0, 1), (None, "null-key", 0.0, 1))
    batch(2, (4, "d", 4.0, 1), (5, "e", 5.0, 1))  # a second file no later batch touches
    # 1 updated, 2 deleted, the NULL key updated, 6 inserted; 3, 4 and 5 untouched
    batch(3, (1, "a", 1.0, -1), (1, "A", 10.0, 1), (2, "b", 2.0, -1), (None, "null-key", 0.0, -1),
          (None, "NULL-KEY", 9.0, 1), (6, "f", 6.0, 1))  # fmt: skip
    got = sorted(((r["k"] is None, r["k"]), r["name"], r["amount"]) for r in table_rows(t))
    assert got == [
        ((False, 1), "A", 10.0), ((False, 3), "c", 3.0), ((False, 4), "d", 4.0), ((False, 5), "e", 5.0),
        ((False, 6), "f", 6.0), ((True, None), "NULL-KEY", 9.0),
    ]  # fmt: skip
    assert len(commits(t)) == 3
    last = DeltaTable(t.location).version()
    assert log_actions(t, last).count("remove") >= 1 and "add" in log_actions(t, last)
    # batch 2's file held no touched key: it was not rewritten
    assert any("-2-2-1-n2_" in f for f in DeltaTable(t.location).file_uris())
