"""Netting weighted changes into rows, and into the unit changes tables store. Real Spark."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from epochal.storage.changes import net_rows, unit_changes
from epochal.storage.warehouse import SPARK_SCHEMA_KEY, Warehouse
from tests.consistency import frame, multiset

DDL = "k BIGINT, name STRING, x DOUBLE"


def test_unit_changes_expand_net_weights(spark) -> None:
    weighted = frame(
        spark, [(1, "a", 1.0, 3), (1, "a", 1.0, -1), (2, "b", None, -2), (3, None, 0.0, 1), (3, None, 0.0, -1)],
        f"{DDL}, _weight BIGINT",
    )
    units = multiset(unit_changes(weighted).collect())
    assert units == multiset([(1, "a", 1.0, 1), (1, "a", 1.0, 1), (2, "b", None, -1), (2, "b", None, -1)])
    assert multiset(net_rows(weighted).collect()) == multiset([(1, "a", 1.0), (1, "a", 1.0)])


def test_change_files_are_read_with_the_schema_spark_wrote_and_no_job_of_their_own(spark, tmp_path) -> None:
    """Reading a change file used to start a Spark job to infer its schema (70 ms and one job per
    read). The footer's record gives the same schema, types and nesting included, without one."""
    warehouse = Warehouse(str(tmp_path / "warehouse"))
    rows = spark.sql(
        "SELECT 1L AS id, CAST(9.5 AS DECIMAL(12,2)) AS price, TIMESTAMP'2026-01-01 10:00:00' AS at, "
        "TIMESTAMP_NTZ'2026-01-01 10:00:00' AS local, array(1.0D, 2.0D) AS kept, map('a', 1) AS tags, "
        "named_struct('name', 'ann', 'n', 3) AS who, 1L AS _weight"
    )
    old, new = warehouse.new_location("t", 1), warehouse.new_location("t", 2)
    warehouse.write(rows, old)
    warehouse.write(rows.withColumn("extra", rows.id * 2), new)
    inferred = spark.read.parquet(new).schema

    tracker = spark.sparkContext.statusTracker()
    jobs_before = max(tracker.getJobIdsForGroup(), default=-1)
    read = warehouse.read(spark, [old, new])
    schema = read.schema
    assert max(tracker.getJobIdsForGroup(), default=-1) == jobs_before, "reading planned a Spark job"
    # the newest file's schema (older files lack "extra": Spark reads it as NULL there)
    assert schema == inferred
    assert [r.extra for r in read.orderBy("extra").collect()] == [None, 2]  # nulls first
    counted, rows = warehouse.read_counted(spark, [old, new])  # the same read, with the footers' row count
    assert counted.schema == inferred and rows == 2
    # a location Spark did not write (no record in its footer), or whose record names a type this
    # pyspark does not know, is inferred by Spark as before
    unknown = b'{"type": "struct", "fields": [{"name": "id", "type": "wibble", "nullable": true, "metadata": {}}]}'
    for name, metadata in (("foreign", None), ("newer", {SPARK_SCHEMA_KEY: unknown})):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": [1, 2]}).replace_schema_metadata(metadata), tmp_path / name / "part-0.parquet")
        assert warehouse.written_schema([str(tmp_path / name)]) is None
        assert [r.id for r in warehouse.read(spark, [str(tmp_path / name)]).collect()] == [1, 2]


def test_change_files_say_whether_they_delete_from_their_footers(spark, tmp_path) -> None:
    """A state whose changes since its snapshot only insert is read as their union, without netting
    (a shuffle of the whole table). Whether a file deletes comes from its ``_weight`` statistics;
    a file without them (or without the column) counts as deleting, so nothing is left un-netted."""
    warehouse = Warehouse(str(tmp_path / "warehouse"))
    schema = "k BIGINT, _weight BIGINT"
    inserts, mixed, empty = (warehouse.new_location("t", e) for e in (1, 2, 3))
    warehouse.write(frame(spark, [(1, 1), (1, 1), (2, 1)], schema), inserts)
    warehouse.write(frame(spark, [(3, 1), (1, -1)], schema), mixed)
    warehouse.write(frame(spark, [], schema), empty)
    assert not warehouse.may_delete([inserts]) and not warehouse.may_delete([empty, inserts])
    assert warehouse.may_delete([mixed]) and warehouse.may_delete([inserts, mixed])
    rows, count, deletes = warehouse.read_changes(spark, [inserts, empty])
    assert (count, deletes) == (3, False) and multiset(rows.collect()) == multiset([(1, 1), (1, 1), (2, 1)])
    assert warehouse.read_changes(spark, [inserts, mixed])[1:] == (5, True)
    for name, table, options in (
        ("no_stats", pa.table({"k": [1], "_weight": [1]}), {"write_statistics": False}),
        ("no_weight", pa.table({"k": [1]}), {}),
    ):
        (tmp_path / name).mkdir()
        pq.write_table(table, tmp_path / name / "part-0.parquet", **options)
        assert warehouse.may_delete([str(tmp_path / name)]), name
