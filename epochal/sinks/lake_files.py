"""What the Delta Lake and Iceberg sinks share: Parquet files written on the executors under names
that say which sink and batch they belong to, the netting of weighted rows into rows to write and
keys to delete, and the copy-on-write of a file without some keys.

A lake table only shows the files its log (Delta) or its snapshots (Iceberg) list, so a writer can
put its files straight into the table's directory: they stay invisible until the driver commits
them, and a file no commit lists is an orphan that :func:`batch_of` lets abort find by its name.
Every name is ``epochal-<sink>-<batch token>_<part>.parquet``; the sink name is reduced to
``[A-Za-z0-9_]`` and the token (``first-last-attempt[-nonce]``) ends at the first ``_``, so one sink
or batch never matches another's prefix.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochal.sinks.base import WEIGHT, BatchId, PrecommitLost, SinkError, WriterTask, deletes_refused

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

#: Directory (inside a Delta table, beside Iceberg's data) for the keys an upsert batch deletes: a
#: name starting with '_' is never read as table data by Delta readers or vacuumed by delta-rs.
STAGING_DIR = "_epochal_staging"
#: Roll to a new data file past this many bytes of Arrow data (Parquet compresses it several-fold).
TARGET_FILE_BYTES = 512 * 1024 * 1024
#: Buffer this many bytes of Arrow data per Parquet row group: Spark hands a writer batches of 10,000
#: rows, and a row group per batch doubles the file size (measured) and the footer's stats.
ROW_GROUP_BYTES = 64 * 1024 * 1024
#: String min/max longer than this are left out of Delta stats: a truncated max would be wrong.
_MAX_STAT_STRING = 64

_NAME = re.compile(r"^epochal-(?P<sink>[A-Za-z0-9_]+?)-(?P<token>[0-9]+-[0-9]+-[0-9]+(?:-[^_/]+)?)_")


def safe_sink_name(sink: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", sink)


def sink_prefix(sink: str) -> str:
    return f"epochal-{safe_sink_name(sink)}-"


def batch_prefix(batch: BatchId) -> str:
    return f"{sink_prefix(batch.sink)}{batch.token}_"


def data_file_name(batch: BatchId, part: str) -> str:
    """A new file of ``batch``; the uuid keeps a retried Spark task from overwriting the first try."""
    return f"{batch_prefix(batch)}{part}_{uuid.uuid4().hex[:16]}.parquet"


def batch_of(file_name: str, sink: str) -> str | None:
    """The batch token of one of ``sink``'s files, or None when ``file_name`` is not ``sink``'s."""
    match = _NAME.match(file_name)
    if match is None or match["sink"] != safe_sink_name(sink):
        return None
    return match["token"]


def utc_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every zoned timestamp labelled UTC. Delta and Iceberg only store UTC instants;
    relabelling keeps each value's instant (Arrow stores UTC either way), so it is not a cast."""
    import pyarrow as pa

    fields = []
    for f in schema:
        if pa.types.is_timestamp(f.type) and f.type.tz is not None and f.type.tz != "UTC":
            f = f.with_type(pa.timestamp(f.type.unit, tz="UTC"))
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def sink_schema(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """The table schema a sink writes: ``columns`` of ``schema`` (never the weight), zones as UTC."""
    import pyarrow as pa

    return utc_schema(pa.schema([schema.field(c) for c in columns]))


def spelled_otherwise(column: str, in_table: str) -> str:
    """The schema problem of a table column spelled in other letter case than the sink's: Delta's and
    Iceberg's readers match a data file's columns by exact name (Delta's rows read back NULL,
    measured with delta-rs 1.6; pyiceberg refuses the files at the commit)."""
    return (
        f"column {column} is spelled {in_table} in the table, and its readers match a file's columns by exact "
        f"name: alias the view's column as the table spells it ({column} AS {in_table})"
    )


def _relabel(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema``, which differs at most by :func:`utc_schema`'s relabelling."""
    import pyarrow as pa

    if batch.schema.equals(schema):
        return batch
    return pa.RecordBatch.from_arrays([batch.column(i).cast(schema.field(i).type) for i in range(len(schema))],
                                      schema=schema)


# ---------------------------------------------------------------------------------------- writing


@dataclass
class WrittenFile:
    """One Parquet file a writer left in the table directory (path relative to that directory)."""

    path: str
    size: int
    rows: int
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "rows": self.rows, "stats": self.stats}


class RollingParquetWriter:
    """Writes batches into ``directory`` as one or more Parquet files named by ``name()``."""

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        directory: str,
        relative: str,
        name: Callable[[], str],
        schema: pa.Schema | None = None,
    ):
        self.filesystem = filesystem
        self.directory = directory.rstrip("/")
        #: prefix of the returned paths: "" in the table directory, "data/" under an Iceberg table, ...
        self.relative = relative
        #: taken from the first batch when not given: on an executor the rows say what they are
        self.schema = schema
        self.name = name
        self.files: list[WrittenFile] = []
        self._writer = None
        self._out = None
        self._bytes = 0
        self._rows = 0
        self._current = ""
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0

    def write(self, batch: pa.RecordBatch) -> None:
        import pyarrow.parquet as pq

        if batch.num_rows == 0:
            return
        if self.schema is None:
            self.schema = utc_schema(batch.schema)
        if self._writer is None:
            self._current = self.name()
            self.filesystem.create_dir(self.directory, recursive=True)
            self._out = self.filesystem.open_output_stream(f"{self.directory}/{self._current}")
            self._writer = pq.ParquetWriter(self._out, self.schema, compression="zstd")
        self._buffer.append(_relabel(batch, self.schema))
        self._buffered += batch.nbytes
        self._bytes += batch.nbytes
        self._rows += batch.num_rows
        if self._buffered >= ROW_GROUP_BYTES:
            self._flush()
        if self._bytes >= TARGET_FILE_BYTES:
            self._roll()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._buffer:
            table = pa.Table.from_batches(self._buffer, schema=self.schema)
            self._writer.write_table(table, row_group_size=table.num_rows)
        self._buffer, self._buffered = [], 0

    def _roll(self) -> None:
        if self._writer is None:
            return
        self._flush()
        self._writer.close()
        metadata = self._writer.writer.metadata
        size = self._out.tell()
        self._out.close()
        self.files.append(WrittenFile(f"{self.relative}{self._current}", size, self._rows, delta_stats(metadata,
                                                                                                      self.schema)))
        self._writer = self._out = None
        self._bytes = self._rows = 0

    def close(self) -> list[WrittenFile]:
        self._roll()
        return self.files


def delta_stats(metadata, schema: pa.Schema) -> dict[str, Any]:
    """Delta ``stats`` (numRecords, nullCount, minValues, maxValues) from a Parquet footer, for the
    types whose JSON form is unambiguous (integers, finite floats, short strings, dates): a missing
    bound only costs data skipping, a wrong one returns wrong query results."""
    import math

    import pyarrow as pa

    stats: dict[str, Any] = {"numRecords": metadata.num_rows, "nullCount": {}, "minValues": {}, "maxValues": {}}
    for index, f in enumerate(schema):
        t = f.type
        nulls = 0
        low = high = None
        usable = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or \
            pa.types.is_large_string(t) or pa.types.is_date32(t)
        for rg in range(metadata.num_row_groups):
            s = metadata.row_group(rg).column(index).statistics
            if s is None or not s.has_null_count:
                nulls = None
                usable = False
                break
            nulls += s.null_count
            if not usable:
                continue
            if not s.has_min_max:
                if s.null_count < metadata.row_group(rg).num_rows:
                    usable = False
                continue
            low = s.min if low is None else min(low, s.min)
            high = s.max if high is None else max(high, s.max)
        if nulls is not None:
            stats["nullCount"][f.name] = nulls
        if not usable or low is None:
            continue
        if pa.types.is_floating(t) and not (math.isfinite(low) and math.isfinite(high)):
            continue
        if isinstance(low, str) and max(len(low), len(high)) > _MAX_STAT_STRING:
            continue
        if pa.types.is_date32(t):
            low, high = low.isoformat(), high.isoformat()
        stats["minValues"][f.name] = low
        stats["maxValues"][f.name] = high
    return stats


def check_precommit(batch: BatchId, files: Sequence[str], where: str) -> None:
    """Raise :class:`PrecommitLost` when any of a PENDING batch's files (URIs or absolute paths) is
    gone: committing add actions for a missing file would break the table for every reader."""
    import pyarrow.fs as pafs

    missing = []
    for uri in files:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
            missing.append(uri)
    if missing:
        raise PrecommitLost(
            f"{batch.describe()}: {len(missing)} of the files its writers wrote into {where} are gone (first: "
            f"{missing[0]}) and the table does not hold the batch: the coordinator aborts it and delivers its "
            "epochs again"
        )


# ---------------------------------------------------------------------------------------- netting


@dataclass
class WriterOutput:
    files: list[WrittenFile]
    rows: int
    #: keys the batch touches (deleted or written again), deduplicated; None for append-only
    keys: pa.Table | None


def write_task_rows(
    task: WriterTask,
    batches: Iterator[pa.RecordBatch],
    sink_type: str,
    columns: Sequence[str],
    primary_key: Sequence[str],
    writer: RollingParquetWriter,
) -> WriterOutput:
    """Write a task's weighted rows: append-only writes a row of weight n n times; upsert writes the
    rows of positive weight and collects the key of every row (deleted or written) for the commit to
    drop from the table's existing files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = 0
    written_keys: list[pa.RecordBatch] = []
    deleted_keys: list[pa.RecordBatch] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if WEIGHT not in batch.schema.names:
            raise SinkError(f"{task.batch.describe()}: writer {task.writer} got rows without a {WEIGHT} column: "
                            "this is a bug in Epochal, please report it")
        weight = batch.column(WEIGHT).cast(pa.int64())
        data = pa.RecordBatch.from_arrays([batch.column(c) for c in columns], names=list(columns))
        if sink_type == "append-only":
            lowest = pc.min(weight).as_py()
            if lowest < 0:
                negative = pc.sum(pc.less(weight, 0)).as_py()
                raise deletes_refused(task.batch.describe(), negative)
            if pc.max(weight).as_py() > 1:
                data = data.take(pa.array(np.repeat(np.arange(batch.num_rows), weight.to_numpy())))
            writer.write(data)
            rows += data.num_rows
            continue
        if pc.max(weight).as_py() > 1:
            raise _duplicate_key_error(task.batch, primary_key)
        positive = pc.greater(weight, 0)
        data = _relabel(data, utc_schema(data.schema))
        keys = data.select(list(primary_key))
        inserted = data.filter(positive)
        writer.write(inserted)
        rows += inserted.num_rows
        written_keys.append(keys.filter(positive))
        deleted_keys.append(keys.filter(pc.invert(positive)))
    files = writer.close()
    if sink_type == "append-only" or not written_keys:
        return WriterOutput(files, rows, None)
    key_schema = written_keys[0].schema
    written = _table(written_keys, key_schema)
    # The loader proved the key unique and the coordinator nets each row, so a key has at most one
    # row to write per batch; more is a planner bug, and writing it would keep an arbitrary row.
    if written.num_rows and written.group_by(list(primary_key)).aggregate([]).num_rows < written.num_rows:
        raise _duplicate_key_error(task.batch, primary_key)
    touched = pa.concat_tables([written, _table(deleted_keys, key_schema)])
    return WriterOutput(files, rows, distinct(touched, primary_key))


def distinct(keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    if keys.num_rows == 0:
        return keys
    return keys.group_by(list(primary_key), use_threads=False).aggregate([]).select(list(primary_key))


def _table(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_batches([_relabel(b, schema) for b in batches], schema=schema)


def _duplicate_key_error(batch: BatchId, primary_key: Sequence[str]) -> SinkError:
    return SinkError(
        f"{batch.describe()}: a key of ({', '.join(primary_key)}) has more than one row to write although the "
        "key was proven unique at load: this is a bug in Epochal, please report it"
    )


def write_keys(filesystem: pafs.FileSystem, directory: str, batch: BatchId, writer: int, keys: pa.Table) -> str:
    """Store an upsert writer's keys as ``<directory>/<name>``; returns the name."""
    import pyarrow.parquet as pq

    name = data_file_name(batch, f"w{writer}").replace(".parquet", ".keys.parquet")
    filesystem.create_dir(directory, recursive=True)
    with filesystem.open_output_stream(f"{directory.rstrip('/')}/{name}") as out:
        pq.write_table(keys, out, compression="zstd")
    return name


def read_keys(filesystem: pafs.FileSystem, paths: Iterable[str], primary_key: Sequence[str]) -> pa.Table | None:
    """The union of the keys files at ``paths`` (None when there are none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        with filesystem.open_input_file(path) as f:
            tables.append(pq.read_table(f))
    if not tables:
        return None
    return distinct(pa.concat_tables(tables, promote_options="permissive").select(list(primary_key)), primary_key)


def rows_matching(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """A boolean mask of the rows of ``rows`` whose key is in ``keys``, NULL matching NULL (as the
    DuckDB sink's IS NOT DISTINCT FROM). DuckDB runs the semi join on the Arrow data in place, and
    only the positions come back, so the rows keep their exact Arrow types."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from epochal.sql import DUCKDB, quote

    positioned = rows.select(list(primary_key)).append_column("__epochal_row", pa.array(np.arange(rows.num_rows)))
    match = " AND ".join(f"r.{quote(k, DUCKDB)} IS NOT DISTINCT FROM k.{quote(k, DUCKDB)}" for k in primary_key)
    with duckdb.connect() as con:
        con.register("r", positioned)
        con.register("k", keys)
        hits = con.execute(f"SELECT r.__epochal_row AS row FROM r SEMI JOIN k ON {match}").fetchnumpy()["row"]
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[np.asarray(hits, dtype=np.int64)] = True
    return pa.array(mask)


def key_ranges(keys: pa.Table, primary_key: Sequence[str]) -> dict[str, tuple[Any, Any, bool]]:
    """Per key column: (min, max, has_null) of ``keys``, to skip files whose stats rule them out."""
    import pyarrow.compute as pc

    ranges = {}
    for k in primary_key:
        column = keys.column(k)
        bounds = pc.min_max(column).as_py()
        ranges[k] = (bounds["min"], bounds["max"], column.null_count > 0)
    return ranges
