"""The state read path: a table's rows as seen inside an epoch, from its newest snapshot and the
change files after it, optionally restricted to a few keys (read at their vnodes only), through the
warm snapshot cache. Views, keyed sources, compaction and `EpochRuntime.state` all read state here,
so how state is stored (change files, vnode snapshots, the cache) is decided in this one place."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import reduce
from typing import TYPE_CHECKING, Any, Protocol

from epochal.errors import EpochalError
from epochal.sql import quote
from epochal.storage import driver_lookup
from epochal.storage.changes import net_rows
from epochal.storage.driver_lookup import DriverLookup
from epochal.storage.parts import Snapshot, StateCatalog, StateCompacted, StateParts
from epochal.storage.schemas import aligned
from epochal.storage.state_cache import SnapshotPlan, StateCache
from epochal.storage.warehouse import WEIGHT, Warehouse

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


#: Restricted to more keys than this, a snapshot is read whole rather than by the keys' vnodes:
#: with 2,048 keys hashed over 256 vnodes, each vnode is untouched with odds of about e^-8, so the job that
#: would find the touched vnodes (a pass over every key; 2.6 s of a 300,000-row source epoch)
#: prunes nothing. The restriction's semi-join still keeps only the keys' rows.
PRUNE_VNODES_KEYS = 2048


class SourceRows(Protocol):
    """A SOURCE's rows read back from its connector (``epochal.runtime.source_history.SourceHistory``)."""

    def covers(self, table: str) -> bool: ...

    def records(self, table: str, epoch: int, inclusive: bool) -> int | None: ...

    def change(self, table: str, epoch: int) -> DataFrame: ...

    def read(self, table: str, epoch: int, inclusive: bool) -> tuple[DataFrame, int]: ...


class StateReader:
    def __init__(
        self,
        spark: Callable[[], SparkSession],
        catalog: StateCatalog,
        warehouse: Warehouse,
        cache: StateCache,
        schema_of: Callable[[str], StructType],
        history: SourceRows | None = None,
        lookup: DriverLookup | None = None,
        declared: Callable[[str], StructType | None] | None = None,
    ):
        self._spark = spark
        #: answers a few keys' rows of a large snapshot without Spark scanning it (driver_lookup.py)
        self.lookup = lookup
        self.catalog = catalog
        self.warehouse = warehouse
        self.cache = cache
        #: a table's columns and types, for a table that has no file yet
        self.schema_of = schema_of
        #: where a SOURCE's rows come from once its change files are gone (epochal/runtime/source_history.py)
        self.history = history
        #: a source's columns as declared now, which its stored rows may predate (``aligned``); None
        #: for a view
        self.declared = declared or (lambda table: None)

    @property
    def spark(self) -> SparkSession:
        return self._spark()

    def read_state(
        self,
        table: str,
        epoch: int,
        inclusive: bool,
        restrict: tuple[tuple[str, ...], DataFrame] | None = None,
        cached: bool = True,
        keys_at_most: int | None = None,
    ) -> tuple[DataFrame, int]:
        """``table``'s rows as seen inside ``epoch`` (with that epoch's change when ``inclusive``),
        and how many stored rows were read to get them; a table without change files
        (none ran, or every one was idle) is empty, with its columns.

        The rows are the newest snapshot at or before the epoch plus the change files after it
        (committed or in flight, ``SnapshotCatalog.state_parts``), never older change files.
        ``restrict = (columns, keys)`` keeps only rows whose ``columns`` equal (null-safe) a row of
        the small DataFrame ``keys``; it is applied before netting, and when ``columns`` is the
        snapshot's distribution key only the keys' vnode directories of the snapshot are read.
        ``cached`` False: the snapshot is scanned from its files even where the warm snapshot cache
        would take it (a one-off read, such as a backfill's: filling the cache scans every column
        and keeps them all, for a read that does not come back). ``keys_at_most``: a bound on the
        restriction's keys, when the caller knows one (see ``PRUNE_VNODES_KEYS``)."""
        try:
            parts = self.catalog.state_parts(table, epoch, inclusive)
        except StateCompacted:
            if self.history is None or not self.history.covers(table):
                raise
            # A SOURCE that stores nothing: its connector reads the records again.
            rows, records = self.history.read(table, epoch, inclusive)
            return (rows if restrict is None else semi_join(rows, restrict)), records
        weighted, rows_read = self.read_weighted(parts, restrict, cached, self.declared(table), keys_at_most)
        if weighted is None:
            # No change file yet (every epoch so far was idle, or none ran): the table is empty.
            return self.spark.createDataFrame([], self.schema_of(table)), 0
        if WEIGHT not in weighted.columns:
            return weighted, rows_read  # a snapshot alone is already net: no aggregation
        return net_rows(weighted), rows_read

    def read_vnode_range(
        self, table: str, epoch: int, key: tuple[str, ...], lo: int, hi: int
    ) -> tuple[DataFrame, int] | None:
        """``table``'s rows at ``epoch`` (its change included) whose vnode, hashing ``key`` as the
        snapshots do (``vnode_column``), is in [``lo``, ``hi``), and the stored rows read: only those
        vnode directories of its snapshot are opened. None when its snapshot is not laid out by
        ``key`` (or there is none): the caller reads the table and filters."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        from epochal.storage.vnode import vnode_column

        try:
            parts = self.catalog.state_parts(table, epoch, inclusive=True)
        except StateCompacted:
            return None  # (read_state reads it, from a SOURCE's connector)
        snapshot = parts.snapshot
        if snapshot is None:
            return None
        schema = StructType.fromJson(json.loads(snapshot.spark_schema))
        laid_out = tuple(snapshot.distribution_key) or tuple(schema.fieldNames())
        if laid_out != (tuple(key) or tuple(schema.fieldNames())):
            return None
        spans = [span for span in self.warehouse.snapshot_dirs(snapshot.location) if span[0] < hi and span[1] >= lo]
        files, rows_read, wider = [], 0, False
        for first, last, directory in spans:
            found = self.warehouse.parquet_files(directory)
            files += found
            # a directory of a run of vnodes that passes the range: its share of the rows is read
            overlap = min(last, hi - 1) - max(first, lo) + 1
            wider = wider or overlap < last - first + 1
            if snapshot.rows:
                rows_read += self.warehouse.files_row_count(found) * overlap // (last - first + 1)
        base = self._parquet_rows(schema, files) if snapshot.rows else self.spark.createDataFrame([], schema)
        if wider:
            base = base.where(vnode_column(schema, snapshot.distribution_key).between(lo, hi - 1))
        declared = self.declared(table)
        base = aligned(base, declared)
        if not parts.changes:
            return base, rows_read
        changes, change_rows, deletes = self.warehouse.read_changes(self.spark, [loc for _, loc in parts.changes])
        changes = changes.where(vnode_column(schema, snapshot.distribution_key).between(lo, hi - 1))
        changes = aligned(changes, declared)
        if not deletes:  # only inserts since the snapshot: their union, nothing to net
            return base.unionByName(changes.drop(WEIGHT)), rows_read + change_rows
        weighted = base.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(changes)
        return net_rows(weighted), rows_read + change_rows

    def read_weighted(
        self,
        parts: StateParts,
        restrict: tuple[tuple[str, ...], DataFrame] | None,
        cached: bool = True,
        declared: StructType | None = None,
        keys_at_most: int | None = None,
    ) -> tuple[DataFrame | None, int]:
        """The rows ``parts`` add up to, not yet netted, with rows read. Without change files this is
        the snapshot as it is (no ``_weight`` column: every row counts once), and so it is when no
        change file deletes a row (an append-only table): the snapshot's rows followed by the
        inserted ones, already net. Otherwise the snapshot rows with weight +1 followed by the
        changes. ``declared``: a source's columns now, which each part is laid out as (``aligned``)."""
        from pyspark.sql import functions as F

        if parts.snapshot is None and not parts.changes:
            return None, 0
        base, rows_read = (
            (None, 0) if parts.snapshot is None else self._read_snapshot(parts.snapshot, restrict, cached, keys_at_most)
        )
        base = None if base is None else aligned(base, declared)
        if not parts.changes:
            return base, rows_read
        locations = [loc for _, loc in parts.changes]
        changes, change_rows, deletes = self.warehouse.read_changes(self.spark, locations)
        changes = aligned(changes, declared)
        rows_read += change_rows
        if restrict is not None:
            changes = semi_join(changes, restrict)
        if not deletes:
            inserted = changes.drop(WEIGHT)
            return (inserted if base is None else base.unionByName(inserted)), rows_read
        if base is not None:
            changes = base.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(changes)
        return changes, rows_read

    def _read_snapshot(
        self,
        snapshot: Snapshot,
        restrict: tuple[tuple[str, ...], DataFrame] | None,
        cached: bool = True,
        keys_at_most: int | None = None,
    ) -> tuple[DataFrame, int]:
        from pyspark.sql.types import StructType

        from epochal.storage.vnode import vnode_column

        schema = StructType.fromJson(json.loads(snapshot.spark_schema))
        if snapshot.rows == 0:
            return self.spark.createDataFrame([], schema), 0
        if restrict is not None:
            check_restriction(snapshot.table, schema, restrict[0], restrict[1])
            small = self.cache.small_and_cached(snapshot.table, snapshot.location, snapshot.rows, self.snapshot_rows)
            if small is not None:
                return semi_join(small, restrict), snapshot.rows
            found = self._looked_up(snapshot, schema, restrict, keys_at_most)
            if found is not None:
                return found, snapshot.rows
        dirs = self.warehouse.vnode_dirs(snapshot.location)
        chosen: list[int] | None = None  # None: every vnode
        prune = keys_at_most is None or keys_at_most <= PRUNE_VNODES_KEYS
        if (
            prune
            and restrict is not None
            and tuple(restrict[0]) == tuple(snapshot.distribution_key or schema.fieldNames())
        ):
            # At most 256 small ints come to the driver: which vnode directories hold the keys.
            columns, keys = restrict
            typed = _typed_keys(schema, columns, keys, names=list(columns))
            vnodes = [r[0] for r in typed.select(vnode_column(schema, snapshot.distribution_key)).distinct().collect()]
            chosen = [v for v in sorted(vnodes) if v in dirs]
            if not chosen:
                return self.spark.createDataFrame([], schema), 0
        every = list(dict.fromkeys(d for v in sorted(dirs) for d in dirs[v]))
        # (the restriction's semi-join below drops the other vnodes of a directory of a run)
        wanted = every if chosen is None else list(dict.fromkeys(d for v in chosen for d in dirs[v]))
        if cached and self.cache.worth_caching(len(wanted), len(every)):
            # Most of the snapshot is read anyway: scan it from memory (filled on first use).
            rows = self.cache.get(snapshot.table, snapshot.location, self.snapshot_rows)
            if rows is None:
                files = self.warehouse.all_snapshot_files(snapshot.location)
                rows = self.cache.put(
                    snapshot.table,
                    snapshot.location,
                    self._parquet_rows(schema, files),
                    SnapshotPlan(snapshot.spark_schema, tuple(files)),
                    self.snapshot_rows,
                )
            rows_read = snapshot.rows
        else:
            files = [f for d in wanted for f in self.warehouse.parquet_files(d)]
            rows_read = snapshot.rows if chosen is None else self.warehouse.files_row_count(files)
            rows = self._parquet_rows(schema, files)
        return (rows if restrict is None else semi_join(rows, restrict)), rows_read

    def _looked_up(
        self,
        snapshot: Snapshot,
        schema: Any,
        restrict: tuple[tuple[str, ...], DataFrame],
        keys_at_most: int | None = None,
    ) -> DataFrame | None:
        """The restricted rows of a large snapshot found by DuckDB on the driver, or None when the
        lookup does not apply (``DriverLookup``): then Spark reads them."""
        columns, keys = restrict
        if self.lookup is None or snapshot.rows <= driver_lookup.MIN_SNAPSHOT_ROWS:
            return None
        if not self.warehouse.is_local or not self.lookup.takes(schema, tuple(columns), keys_at_most):
            return None  # decided without listing the snapshot (a LIST per epoch on an object store)
        files = self.warehouse.all_snapshot_files(snapshot.location)
        if not self.lookup.applies(schema, tuple(columns), files):
            return None
        typed = _typed_keys(schema, tuple(columns), keys, names=list(columns))
        return self.lookup.read(self.spark, schema, files, tuple(columns), typed)

    def snapshot_rows(self, plan: SnapshotPlan) -> DataFrame:
        """A snapshot's rows read as the cache read them: the same plan, so Spark matches it to
        the cached data (what releases a snapshot another run left cached on the server)."""
        from pyspark.sql.types import StructType

        return self._parquet_rows(StructType.fromJson(json.loads(plan.schema_json)), list(plan.files))

    def release_snapshots(self, locations: list[str]) -> None:
        """Snapshots about to be deleted: out of the cache first (``StateCache.release_locations``)."""
        self.cache.release_locations(locations, self.snapshot_rows, lambda: self.spark)

    def _parquet_rows(self, schema: Any, files: list[str]) -> DataFrame:
        if not files:
            return self.spark.createDataFrame([], schema)
        # Files, not directories: no partition discovery (a vnode is not a column) and no listing.
        return self.spark.read.schema(schema).parquet(*files).select(*quoted(schema.fieldNames()))


def quoted(names: list[str] | tuple[str, ...]) -> list[str]:
    return [quote(n) for n in names]


def check_restriction(table: str, schema: Any, columns: tuple[str, ...], keys: DataFrame) -> None:
    unknown = [c for c in columns if c not in schema.fieldNames()]
    if not columns or unknown:
        raise EpochalError(f"cannot restrict {table} by columns {list(columns)}: {unknown or 'none given'}")
    missing = [c for c in columns if c not in keys.columns]
    if missing:
        raise EpochalError(f"the restriction keys of {table} lack column(s) {missing}")


def _typed_keys(schema: Any, columns: tuple[str, ...], keys: DataFrame, names: list[str]) -> DataFrame:
    """``keys`` cast to the table's column types: the vnode hash and the null-safe comparison
    must see the same values as when the rows were written."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in schema.fields}
    return keys.select(*[F.col(quote(c)).cast(types[c]).alias(n) for c, n in zip(columns, names, strict=True)])


def semi_join(rows: DataFrame, restrict: tuple[tuple[str, ...], DataFrame]) -> DataFrame:
    """The rows whose restriction columns equal (null-safe) some row of the keys: a left-semi join
    against the broadcast keys, so the state is filtered where it is scanned, without a shuffle."""
    from pyspark.sql import functions as F

    columns, keys = restrict
    check_restriction("the table", rows.schema, tuple(columns), keys)
    names = [f"__epochal_key_{i}" for i in range(len(columns))]
    typed = _typed_keys(rows.schema, tuple(columns), keys, names)
    condition = reduce(
        lambda a, b: a & b,
        [rows[quote(c)].eqNullSafe(typed[n]) for c, n in zip(columns, names, strict=True)],
    )
    return rows.join(F.broadcast(typed), condition, "left_semi")
