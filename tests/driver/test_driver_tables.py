"""Change files written on the driver read back by Spark as Spark's own, and Spark's files read on the
driver as Spark reads them (epochal/driver/tables.py): every type the driver takes, NULLs, a
TIMESTAMP (Spark's INT96), kept MIN/MAX values; a table's state at a few keys read by DuckDB from a
snapshot and the change files after it, netted as Spark nets them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

from epochal.checkpoint.records import Snapshot, StateParts
from epochal.driver.tables import NotOnDriver, arrow_type, read_change, state_at, write_change
from epochal.storage import mirror
from epochal.storage.warehouse import WEIGHT, Warehouse

SCHEMA = (
    "b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, d DOUBLE, s STRING, day DATE, "
    "ts TIMESTAMP, ntz TIMESTAMP_NTZ, dec DECIMAL(12, 3), kept ARRAY<BIGINT>"
)
UTC = dt.UTC
ROWS = [
    (
        True,
        -128,
        32767,
        -(2**31),
        2**63 - 1,
        -0.0,
        "é日本",
        dt.date(1900, 1, 1),
        dt.datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=UTC),
        dt.datetime(2026, 1, 1, 10, 0),
        Decimal("-123456789.125"),
        [3, 1],
    ),
    (None, None, None, None, None, None, None, None, None, None, None, None),
    (
        False,
        0,
        0,
        0,
        0,
        float("inf"),
        "",
        dt.date(2026, 12, 6),
        dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        dt.datetime(2000, 2, 29, 0, 0, 1),
        Decimal("0.001"),
        [],
    ),
]


def _spark_schema(spark):
    return spark.createDataFrame([], SCHEMA).schema


def test_a_change_written_on_the_driver_reads_in_spark_as_written(spark, tmp_path) -> None:
    warehouse = Warehouse(str(tmp_path))
    schema = _spark_schema(spark)
    names = schema.fieldNames()
    table = pa.Table.from_pylist(
        [dict(zip([*names, WEIGHT], [*row, w], strict=True)) for row, w in zip(ROWS, (1, -1, 1), strict=True)]
    )
    location = warehouse.new_location("t", 1)
    assert write_change(warehouse, table, schema, location) == 3
    read = warehouse.read(spark, [location])  # the schema comes from the footer's Spark record
    assert [(f.name, f.dataType) for f in read.schema] == [(f.name, f.dataType) for f in schema] + [
        (WEIGHT, spark.createDataFrame([], "w BIGINT").schema["w"].dataType)
    ]
    got = sorted((tuple(r) for r in read.collect()), key=repr)
    expected = sorted(
        (
            tuple(
                v if not isinstance(v, dt.datetime) or v.tzinfo is None else v.astimezone().replace(tzinfo=None)
                for v in row
            )
            + (w,)
            for row, w in zip(ROWS, (1, -1, 1), strict=True)
        ),
        key=repr,
    )
    assert got == expected
    # statistics in the footer: the reader sees that the file deletes
    assert warehouse.may_delete([location])


def test_spark_s_own_change_files_read_on_the_driver_as_spark_reads_them(spark, tmp_path) -> None:
    warehouse = Warehouse(str(tmp_path))
    frame = spark.createDataFrame(ROWS, SCHEMA).selectExpr("*", f"CAST(1 AS BIGINT) AS {WEIGHT}")
    location = warehouse.new_location("t", 1)
    warehouse.write(frame, location)  # Spark's writer: TIMESTAMP as INT96
    table = read_change(warehouse, location, _spark_schema(spark))
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    rows = sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)
    assert rows == sorted(((*row, 1) for row in ROWS), key=repr)


@pytest.mark.parametrize("mirrored", [False, True], ids=["parquet", "mirror"])
def test_state_at_keys_nets_the_snapshot_and_the_changes_after_it(spark, tmp_path, monkeypatch, mirrored) -> None:
    warehouse = Warehouse(str(tmp_path))
    schema = spark.createDataFrame([], "k BIGINT, v STRING, kept ARRAY<BIGINT>").schema
    snapshot_location = warehouse.new_snapshot_location("t", 1)
    spark.createDataFrame([(1, "a", [1]), (2, "b", [2]), (3, None, None), (3, None, None)], schema).write.parquet(
        f"{snapshot_location}/_vnodes=0-255"
    )
    weighted = "k BIGINT, v STRING, kept ARRAY<BIGINT>, _weight BIGINT"
    first = warehouse.new_location("t", 2)
    warehouse.write(spark.createDataFrame([(1, "a", [1], -1), (1, "a2", [1, 5], 1)], weighted), first)
    second = warehouse.new_location("t", 3)
    pa_change = pa.table({"k": [2, 4], "v": ["b", "d"], "kept": [[2], None], WEIGHT: [-1, 1]})
    write_change(warehouse, pa_change, schema, second)
    snapshot = Snapshot("t", 1, snapshot_location, ("k",), schema.json(), 4, 1)
    parts = StateParts(snapshot, [(2, first), (3, second)])
    if mirrored:  # the snapshot's rows copied into DuckDB (as compaction does for a large one)
        monkeypatch.setattr(mirror, "MIN_MIRROR_ROWS", 1)
        files = warehouse.all_snapshot_files(snapshot_location)
        assert mirror.build_mirror(warehouse.file_path(snapshot_location), files, 4)
    with duckdb.connect() as con:
        keys = pa.table({"k": pa.array([1, 2, 3, 4, None], pa.int64())})
        rows, read = state_at(con, warehouse, parts, schema, (["k"], keys))
        assert read == 4 + 2 + 2
        assert sorted(tuple(r.values()) for r in rows.to_pylist()) == sorted(
            [(1, "a2", [1, 5]), (3, None, None), (3, None, None), (4, "d", None)], key=repr
        )
        only = pa.table({"k": pa.array([3], pa.int64())})
        rows, _ = state_at(con, warehouse, parts, schema, (["k"], only))
        assert rows.num_rows == 2  # a row held twice comes back twice
        attached = [r[0] for r in con.sql("SELECT database_name FROM duckdb_databases()").fetchall()]
        assert any(name.startswith("_mirror_") for name in attached) == mirrored, attached


def test_types_the_driver_leaves_to_spark_are_named(spark) -> None:
    schema = spark.createDataFrame([], "f FLOAT, m MAP<STRING, INT>, st STRUCT<a: INT>, bin BINARY").schema
    for field in schema.fields:
        with pytest.raises(NotOnDriver, match="computed by Spark"):
            arrow_type(field.dataType)


def test_spark_s_filters_over_driver_written_doubles_keep_nan_and_negative_zero(spark, tmp_path) -> None:
    """Arrow leaves NaN out of a column's statistics and Spark's reader skips row groups by them
    (and drops -0.0 through the dictionary for `d = 0.0`): the driver writes no statistics or
    dictionary for floating point, so Spark's pushed filters see every row."""
    warehouse = Warehouse(str(tmp_path))
    schema = spark.createDataFrame([], "i BIGINT, d DOUBLE, kept ARRAY<DOUBLE>").schema
    values = [1.0, 2.0, float("nan"), -0.0, 5.0]
    table = pa.table({"i": list(range(5)), "d": values, "kept": [[v] for v in values], WEIGHT: [1] * 5})
    location = warehouse.new_location("t", 1)
    write_change(warehouse, table, schema, location)
    rows = warehouse.read(spark, [location])
    assert sorted(r.i for r in rows.where("d > 1e300D").collect()) == [2]  # NaN is above every double
    assert sorted(r.i for r in rows.where("d = 0.0D").collect()) == [3]  # -0.0 = 0.0
