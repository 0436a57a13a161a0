"""A few keys' rows of a large snapshot, read by DuckDB on the driver straight from its Parquet files.

An epoch that changes 10,000 keys of a 10M-row table must find those keys' previous rows (a keyed
source's upserts, a keyed view's state). 10,000 random keys hash to every vnode, so Spark's read is
a scan of the whole snapshot from the warm cache: 2-3 s a step at 10M rows, growing with the table
(docs/performance.md, issue 17). DuckDB scans Parquet files with the keys as a semi-join in 0.14 s
at 10M rows on 2 cores (measured alone, on 16 files of 10M random rows), and the rows it finds go
back to Spark as a small local relation. Snapshots are immutable, so nothing is copied, indexed or
kept in step: every lookup reads the files the catalog names, whichever process asks.

It answers only what it can answer exactly, and says None otherwise so the caller reads with Spark:
- the files are on the driver's filesystem (the embedded warehouse; an object store goes to Spark);
- every column has a type whose value survives Parquet -> DuckDB -> Arrow -> Spark unchanged, and
  every key column one whose equality is the same in both (no floating point: Spark's join treats
  -0.0 and 0.0 as one key);
- the keys, and the rows they find, are at most ``max_rows`` (and the rows at most MAX_FOUND_BYTES).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from epochal.sql import DUCKDB, duckdb_parquet, quote
from epochal.storage.state_cache import SMALL_ROWS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger("epochal.storage")

#: Snapshots up to this many rows are left to Spark: the warm cache holds them, and a restricted
#: read filters the cached copy without a job of its own (``StateCache.small_and_cached``).
MIN_SNAPSHOT_ROWS = SMALL_ROWS
#: Most bytes of rows found that go back to Spark as a local relation (held by the driver, and sent
#: whole to a Spark Connect server): wide rows reach it before ``max_rows`` does.
MAX_FOUND_BYTES = 64 * 1024 * 1024
#: Key rows collected per distinct key allowed, before they are made distinct on the driver.
_RAW_KEYS_PER_KEY = 4


def plain_type(data_type: DataType, key: bool = False) -> bool:
    """Whether values of ``data_type`` come back from DuckDB as Spark wrote them (and, for a key
    column, compare equal in DuckDB exactly when they do in Spark)."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StringType):
        # a collated string compares by its collation in Spark, by bytes in DuckDB
        return getattr(data_type, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None)
    exact = (
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.DecimalType,
        T.DateType,
        T.TimestampNTZType,
        T.BinaryType,
    )
    if isinstance(data_type, exact):
        return True
    # A TIMESTAMP key: DuckDB reads Spark's INT96 as a naive TIMESTAMP and an adjusted INT64 as a
    # TIMESTAMPTZ, and compares the two only through its ICU extension, which may not be installed.
    return not key and isinstance(data_type, (T.FloatType, T.DoubleType, T.TimestampType))


class DriverLookup:
    """Restricted snapshot reads done by DuckDB on the driver (see the module's text)."""

    def __init__(self, max_rows: int, threads: int | None = None):
        #: most keys, and most rows found, a lookup takes; 0 turns the lookup off
        self.max_rows = max_rows
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        #: lookups answered here, and ones handed back to Spark (shown by benchmarks)
        self.answered = 0
        self.declined = 0
        #: (a snapshot's first file, columns) whose keys found more than ``max_rows`` rows, or whose
        #: files DuckDB could not read: not tried again (a join's state read by its join key finds
        #: many rows per key at every epoch). A new snapshot has new files, and is tried.
        self._left_to_spark: set[tuple[str, tuple[str, ...]]] = set()

    def takes(self, schema: StructType, columns: tuple[str, ...], keys_at_most: int | None = None) -> bool:
        """Whether rows of ``schema`` restricted by ``columns`` are ones to look up here at all:
        asked before the snapshot's files are listed. ``keys_at_most``, a bound on the keys when
        the caller knows one (a keyed epoch's lines): above ``max_rows`` it is a big epoch, and
        ``read`` would collect up to four times the limit of keys to the driver, usually only to
        decline (a 1M-line epoch: 400,001 keys); fewer distinct keys than lines go to Spark too."""
        if self.max_rows <= 0 or (keys_at_most is not None and keys_at_most > self.max_rows):
            return False
        return all(plain_type(f.dataType, key=f.name in columns) for f in schema.fields)

    def applies(self, schema: StructType, columns: tuple[str, ...], files: list[str]) -> bool:
        """Whether a read of ``columns``'s keys from the snapshot ``files`` is one to try here."""
        if not files or (files[0], tuple(columns)) in self._left_to_spark or not self.takes(schema, columns):
            return False
        return not any("://" in f and not f.startswith("file://") for f in files)

    def read(
        self, spark: SparkSession, schema: StructType, files: list[str], columns: tuple[str, ...], keys: DataFrame
    ) -> DataFrame | None:
        """The snapshot rows whose ``columns`` equal (null-safe) a row of ``keys``, which holds
        those columns already cast to the snapshot's types; None when there are more keys or rows
        than ``max_rows`` (or DuckDB cannot read the files), for the caller to read with Spark."""
        # Collected as they come and made distinct here: a distinct in Spark is a shuffle, two more
        # jobs per lookup. An epoch's records rarely repeat a key often.
        taken = keys.select(*[quote(c) for c in columns]).limit(_RAW_KEYS_PER_KEY * self.max_rows + 1).toArrow()
        wanted = taken.group_by(list(columns)).aggregate([]) if taken.num_rows else taken
        if taken.num_rows > _RAW_KEYS_PER_KEY * self.max_rows or wanted.num_rows > self.max_rows:
            self.declined += 1
            return None
        if wanted.num_rows == 0:
            self.answered += 1
            return spark.createDataFrame([], schema)
        try:
            found = self._scan(schema, [f.removeprefix("file://") for f in files], columns, wanted)
        except Exception as exc:  # a file DuckDB cannot read: Spark can, and is always right
            log.warning(
                "DuckDB could not look up %d key(s) in %s (%s): reading with Spark", wanted.num_rows, files[0], exc
            )
            found = None
        if found is None:
            self._left_to_spark.add((files[0], tuple(columns)))
            self.declined += 1
            return None
        self.answered += 1
        if found.num_rows == 0:
            return spark.createDataFrame([], schema)
        return spark.createDataFrame(found, schema=schema)

    def _scan(
        self, schema: StructType, files: list[str], columns: tuple[str, ...], wanted: pa.Table
    ) -> pa.Table | None:
        import duckdb

        condition = " AND ".join(f"s.{quote(c, DUCKDB)} IS NOT DISTINCT FROM k.{quote(c, DUCKDB)}" for c in columns)
        projected = ", ".join(f"s.{quote(f.name, DUCKDB)}" for f in schema.fields)
        with duckdb.connect(config={"threads": self.threads}) as con:
            con.register("k", wanted)
            found = con.sql(
                f"SELECT {projected} FROM {duckdb_parquet(files)} AS s SEMI JOIN k ON {condition} LIMIT $limit",
                params={"limit": self.max_rows + 1},
            ).to_arrow_table()
        if found.num_rows > self.max_rows or found.nbytes > MAX_FOUND_BYTES:
            return None
        return _as_instants(found, schema)


def _as_instants(found: pa.Table, schema: StructType) -> pa.Table:
    """Spark's TIMESTAMP columns as UTC instants. DuckDB reads an INT96 timestamp (Spark's default)
    as a naive one holding the UTC wall time; left naive, Spark would take it as its session's
    local time."""
    import pyarrow as pa
    from pyspark.sql import types as T

    for i, field in enumerate(schema.fields):
        column = found.column(i)
        if isinstance(field.dataType, T.TimestampType) and pa.types.is_timestamp(column.type):
            found = found.set_column(i, field.name, column.cast(pa.timestamp(column.type.unit, tz="UTC")))
    return found
