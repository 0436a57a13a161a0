"""A step's rows on the driver: change files read and written as Arrow tables, and a table's state at
a few keys read by DuckDB straight from its Parquet files.

The driver path (``epochal.driver``) writes exactly what Spark would have written, so every other
reader (Spark steps, compaction, sinks, ``epochal query``) cannot tell the two apart:

- the table's columns then ``_weight``, one row per unit of change, typed as Spark types them;
- Spark's own schema record in the footer (``org.apache.spark.sql.parquet.row.metadata``), so
  ``Warehouse.read`` takes the schema from it as it does for Spark's files;
- the footer's column statistics, which ``Warehouse.may_delete`` reads.

Only types whose values travel Parquet -> Arrow -> Python -> Arrow -> Parquet unchanged are taken
(``arrow_type``); a table with any other column stays on Spark. A TIMESTAMP is an instant: Spark
writes it as INT96, which Arrow and DuckDB read as a naive time holding UTC; it is taken as UTC,
in microseconds (a cast that would drop a digit raises), and written as UTC microseconds, which
Spark reads as TIMESTAMP.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from epochal.sql import DUCKDB, duckdb_parquet, quote, string_literal
from epochal.storage.mirror import MIRROR_TABLE, existing_mirror
from epochal.storage.parts import StateParts
from epochal.storage.warehouse import SPARK_SCHEMA_KEY, WEIGHT, Warehouse

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql.types import DataType, StructType


class NotOnDriver(Exception):
    """This step cannot be computed on the driver with Spark's exact result: Spark computes it."""


_connections = threading.local()
_MIRROR_ALIAS = "_mirror_"


@contextmanager
def connect() -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection for one step, this thread's (opening one costs about 15 ms, a good part
    of a small step): every core for a scan of a large state; time zone UTC, so that a TIMESTAMP
    read from Spark's INT96 (a naive UTC time) compares with an instant as the instant it is, and
    instants come out labelled UTC. What a step registers is gone when it ends."""
    import duckdb

    con = getattr(_connections, "con", None)
    if con is None:
        con = duckdb.connect(config={"threads": max(1, min(4, os.cpu_count() or 1))})
        con.execute("SET TimeZone = 'UTC'")
        _connections.con = con
    try:
        yield con
    finally:
        for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
            con.unregister(name)
        # a snapshot's mirror is let go with the step: retention may delete the snapshot later
        for (name,) in con.execute("SELECT database_name FROM duckdb_databases() WHERE NOT internal").fetchall():
            if name.startswith(_MIRROR_ALIAS):
                con.execute(f"DETACH {name}")


def arrow_type(data_type: DataType) -> pa.DataType:
    """The Arrow type that holds ``data_type``'s values exactly, as Spark writes them to Parquet;
    raises NotOnDriver for types the driver path leaves to Spark (FLOAT: 32-bit rounding through
    Python; maps, structs, binary, intervals, variants)."""
    from pyspark.sql import types as T

    simple = {
        T.BooleanType: pa.bool_(),
        T.ByteType: pa.int8(),
        T.ShortType: pa.int16(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.DoubleType: pa.float64(),
        T.DateType: pa.date32(),
    }
    for kind, arrow in simple.items():
        if type(data_type) is kind:
            return arrow
    if type(data_type) is T.TimestampType:
        # an instant: Spark writes INT96 (read back naive, holding UTC), written here as UTC micros
        return pa.timestamp("us", tz="UTC")
    if type(data_type) is T.TimestampNTZType:
        return pa.timestamp("us")
    if type(data_type) is T.StringType and getattr(data_type, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None):
        return pa.string()
    if isinstance(data_type, T.DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        return pa.list_(arrow_type(data_type.elementType))
    raise NotOnDriver(f"a column of type {data_type.simpleString()} is computed by Spark")


def duck_type(data_type: DataType) -> str:
    """DuckDB's name of the type that holds ``data_type``'s values (the types ``arrow_type`` takes)."""
    arrow = arrow_type(data_type)
    if pa.types.is_list(arrow):
        from pyspark.sql.types import ArrayType

        if isinstance(data_type, ArrayType):
            return f"{duck_type(data_type.elementType)}[]"
    if pa.types.is_decimal(arrow):
        return f"DECIMAL({arrow.precision}, {arrow.scale})"
    names = {
        pa.bool_(): "BOOLEAN",
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float64(): "DOUBLE",
        pa.date32(): "DATE",
        pa.string(): "VARCHAR",
        pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
        pa.timestamp("us"): "TIMESTAMP",
    }
    return names[arrow]


def arrow_schema(schema: StructType) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in schema.fields])


def with_weight(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([*schema.fields, StructField(WEIGHT, LongType())])


def conformed(table: pa.Table, schema: StructType) -> pa.Table:
    """``table`` with ``schema``'s columns (matched by name, as Spark does without regard to case),
    in its order and of its Arrow types; a column it lacks is NULL (a source's column declared after
    the rows were written). Casts only widen, relabel (large_string -> string, naive INT96 -> UTC) or
    narrow integers that fit: a value that would change raises NotOnDriver."""
    have = {name.lower(): i for i, name in enumerate(table.column_names)}
    columns = []
    for field in schema.fields:
        target = arrow_type(field.dataType)
        index = have.get(field.name.lower())
        if index is None:
            columns.append(pa.nulls(table.num_rows, target))
            continue
        column = table.column(index)
        if column.type != target:
            if not _widens(column.type, target):
                raise NotOnDriver(f"column {field.name} came out as {column.type}, where Spark has {target}")
            if pa.types.is_timestamp(column.type) and column.type.tz != target.tz:
                column = column.cast(pa.timestamp(column.type.unit, tz=target.tz))
            try:
                column = column.cast(target)  # safe: raises rather than truncate or overflow
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise NotOnDriver(f"column {field.name} does not fit {target}: {error}") from error
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=arrow_schema(schema))


def _widens(source: pa.DataType, target: pa.DataType) -> bool:
    if pa.types.is_null(source):
        return True
    if pa.types.is_integer(source) and pa.types.is_integer(target):
        # a narrower Spark type (TINYINT + 1 is TINYINT in Spark, INTEGER in DuckDB): the safe cast
        # raises where the value does not fit, as Spark's ANSI arithmetic does
        return True
    if (pa.types.is_string(source) or pa.types.is_large_string(source)) and pa.types.is_string(target):
        return True
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        # naive INT96 holds UTC; a cast to microseconds raises rather than drop nanoseconds
        if target.tz is None:  # TIMESTAMP_NTZ: a wall time, never an instant
            return source.tz is None
        return source.tz in (None, "UTC", "+00:00", "Etc/UTC")
    if pa.types.is_list(target) and (pa.types.is_list(source) or pa.types.is_large_list(source)):
        return _widens(source.value_type, target.value_type)
    return False


def read_change(warehouse: Warehouse, location: str, schema: StructType) -> pa.Table:
    """The change files at ``location`` as ``schema`` plus ``_weight``."""
    files = warehouse.parquet_files(location)
    tables = [pq.read_table(warehouse.file_path(f), filesystem=warehouse.fs) for f in files]
    full = with_weight(schema)
    if not tables:
        return arrow_schema(full).empty_table()
    return pa.concat_tables([conformed(t, full) for t in tables])


def write_change(warehouse: Warehouse, rows: pa.Table, schema: StructType, location: str) -> int:
    """Write ``rows`` (``schema``'s columns and ``_weight``) as the complete content of
    ``location``, as Spark's writer would; returns the rows written."""
    import json

    full = with_weight(schema)
    table = conformed(rows, full)
    # Spark reads its own record of the schema from the footer; it says every column may be NULL.
    record = json.dumps(full.jsonValue() | {"fields": [dict(f, nullable=True) for f in full.jsonValue()["fields"]]})
    table = table.replace_schema_metadata({SPARK_SCHEMA_KEY: record.encode()})
    directory = warehouse.file_path(location)
    warehouse.fs.create_dir(directory, recursive=True)
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    # Written under a hidden name, then renamed: a listing never sees half a file.
    hidden = f"{directory}/.{name}.tmp"
    # No statistics or dictionary for floating point: Arrow leaves NaN out of a column's min/max, and
    # Spark's reader then skips a row group holding NaN for `d > x`; its dictionary filter drops
    # -0.0 for `d = 0.0` (both measured, tests/driver/test_driver_tables.py). Spark's own files are read right.
    plain = [f.name for f in table.schema if not _holds_float(f.type)]
    pq.write_table(
        table,
        hidden,
        filesystem=warehouse.fs,
        compression="snappy",
        write_statistics=plain,
        use_dictionary=plain,
    )
    warehouse.fs.move(hidden, f"{directory}/{name}")
    return table.num_rows


def _holds_float(data_type: pa.DataType) -> bool:
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _holds_float(data_type.value_type)
    return pa.types.is_floating(data_type)


def state_at(
    con: duckdb.DuckDBPyConnection,
    warehouse: Warehouse,
    parts: StateParts,
    schema: StructType,
    restrict: tuple[Sequence[str], pa.Table] | None,
) -> tuple[pa.Table, int]:
    """A table's net rows made of ``parts`` (its snapshot and the change files after it), as
    ``schema``, keeping only the rows whose ``restrict`` columns equal (null-safe) a row of the keys
    when given; and the stored rows read. DuckDB scans the files with the keys as a semi-join, a
    large snapshot from its DuckDB mirror (``storage.mirror``) when it has one."""
    scans: list[tuple[str, str]] = []  # (a relation of the rows, the weight of each of its rows)
    rows_read = 0
    if parts.snapshot is not None and parts.snapshot.rows:
        rows_read += parts.snapshot.rows
        mirror = existing_mirror(warehouse.file_path(parts.snapshot.location))
        if mirror is not None:
            alias = f"{_MIRROR_ALIAS}{hashlib.sha1(mirror.encode()).hexdigest()[:12]}"
            con.execute(f"ATTACH IF NOT EXISTS {string_literal(mirror)} AS {alias} (READ_ONLY)")
            scans.append((f"{alias}.{MIRROR_TABLE}", "1::BIGINT"))
        else:
            files = warehouse.all_snapshot_files(parts.snapshot.location)
            scans.append((duckdb_parquet(files, union_by_name=True), "1::BIGINT"))
    changes = [f for _, location in parts.changes for f in warehouse.parquet_files(location)]
    if changes:
        rows_read += warehouse.files_row_count(changes)
        scans.append((duckdb_parquet(changes, union_by_name=True), quote(WEIGHT, DUCKDB)))
    if not scans:
        return arrow_schema(schema).empty_table(), 0
    names = [f.name for f in schema.fields]
    rows = " UNION ALL ".join(
        f"SELECT {', '.join(_column_or_null(con, relation, schema))}, {weight} AS {quote(WEIGHT, DUCKDB)} "
        f"FROM {relation}"
        for relation, weight in scans
    )
    where = ""
    if restrict is not None:
        columns, keys = restrict
        con.register("_epochal_keys", keys)
        equal = " AND ".join(f"s.{quote(c, DUCKDB)} IS NOT DISTINCT FROM k.{quote(c, DUCKDB)}" for c in columns)
        where = f" WHERE EXISTS (SELECT 1 FROM _epochal_keys AS k WHERE {equal})"
    listed = ", ".join(quote(n, DUCKDB) for n in names)
    net = (
        f"SELECT {listed}, sum({quote(WEIGHT, DUCKDB)}) AS _n FROM ({rows}) AS s{where} "
        f"GROUP BY ALL HAVING sum({quote(WEIGHT, DUCKDB)}) > 0"
    )
    # A row held n times comes back n times (a table is a multiset; usually n is 1).
    found = con.sql(f"SELECT {listed} FROM ({net}) AS n, range(n._n::BIGINT)").to_arrow_table()
    return conformed(found, schema), rows_read


def _column_or_null(con: duckdb.DuckDBPyConnection, relation: str, schema: StructType) -> Iterable[str]:
    """Each of ``schema``'s columns as ``relation`` holds it, or NULL when it has none (a partial
    aggregate's kept values written before it kept any, a source column declared later)."""
    present = {row[0].lower() for row in con.sql(f"DESCRIBE SELECT * FROM {relation}").fetchall()}
    for field in schema.fields:
        name = quote(field.name, DUCKDB)
        yield name if field.name.lower() in present else f"NULL AS {name}"


def run_sql(con: duckdb.DuckDBPyConnection, query: str, frames: Mapping[str, pa.Table]) -> pa.Table:
    for name, frame in frames.items():
        con.register(name, frame)
    try:
        return con.sql(query).to_arrow_table()
    finally:
        for name in frames:
            con.unregister(name)


def semi_joined(con: duckdb.DuckDBPyConnection, rows: pa.Table, restrict: tuple[list[str], pa.Table]) -> pa.Table:
    columns, keys = restrict
    equal = " AND ".join(f"r.{quote(c, DUCKDB)} IS NOT DISTINCT FROM k.{quote(c, DUCKDB)}" for c in columns)
    return run_sql(
        con,
        f"SELECT r.* FROM _rows AS r WHERE EXISTS (SELECT 1 FROM _k AS k WHERE {equal})",
        {"_rows": rows, "_k": keys},
    )


def netted(con: duckdb.DuckDBPyConnection, old: pa.Table, change: pa.Table) -> pa.Table:
    """The rows ``old`` holds after ``change`` (a multiset: a row as often as its net weight)."""
    if change.num_rows == 0:
        return old
    weighted = pa.concat_tables(
        [
            old.append_column(WEIGHT, pa.array([1] * old.num_rows, pa.int64())),
            change.select(old.column_names + [WEIGHT]),
        ]
    )
    listed = ", ".join(quote(n, DUCKDB) for n in old.column_names)
    net = f"SELECT {listed}, sum({WEIGHT}) AS _n FROM _w GROUP BY ALL HAVING sum({WEIGHT}) > 0"
    found = run_sql(con, f"SELECT {listed} FROM ({net}) AS n, range(n._n::BIGINT)", {"_w": weighted})
    return found.cast(old.schema)
