"""A small sink batch written from the run's own process instead of by Spark writer tasks.

An epoch of the demo hands each sink a few hundred rows. Through Spark that is a job that reads the
change files, shuffles them to the writers and runs each writer in a Python worker on the server.
Over Spark Connect every run is a new session, and Spark (4.3) starts Python workers per session
and never stops them (SPARK-54055): each run left three idle worker processes behind on the
managed server, and paid their start (importing pyarrow and Epochal) in its sink steps, 1.3-1.9 s
of the first sink's write against 0.2-0.3 s in a warm session (docs/performance.md).

Here the change files are read with pyarrow, netted per row (upsert) and handed to the target's own
:meth:`SinkTarget.write` as one writer covering every vnode, the same call a Spark task makes. The
two-phase commit is unchanged: the target pre-commits, the coordinator persists PENDING, then
commits. It applies only where it is exact and cheap; otherwise it says None and Spark writes:
- the target writes through :meth:`SinkTarget.write` (one with its own Spark writer keeps it);
- the files are on this machine's filesystem (an object store goes to Spark's readers);
- every column has a type pyarrow reads back as Spark wrote it (no nested or collated types);
- the batch is at most ``max_rows`` rows and MAX_FILE_BYTES of Parquet, by the files' footers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from epochal.sinks.base import WEIGHT, BatchId, CountedBatches, SinkTarget, WriterResult, WriterTask
from epochal.storage.driver_lookup import plain_type  # the same types survive pyarrow's read
from epochal.storage.vnode import VNODE_COUNT

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Most bytes of Parquet (compressed, as on disk) a batch may have to be written from the driver.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: The one writer of a batch written here covers every vnode, so it holds every row of every key.
ALL_VNODES = (0, VNODE_COUNT - 1)


def _local_paths(files: Sequence[str]) -> list[str] | None:
    paths = []
    for file in files:
        if "://" in file and not file.startswith("file://"):
            return None
        paths.append(file.removeprefix("file://"))
    return paths


class DriverWriter:
    """Writes small sink batches in this process (see the module's text)."""

    def __init__(self, max_rows: int):
        #: most rows a batch written here may have; 0 turns it off
        self.max_rows = max_rows
        #: batches written here, and ones left to Spark's writer tasks (shown by tests and benchmarks)
        self.answered = 0
        self.declined = 0

    def write(
        self, target: SinkTarget, batch: BatchId, files: Sequence[str], schema: StructType
    ) -> list[WriterResult] | None:
        """Pre-commit ``batch`` (the change rows in ``files``, typed by the upstream ``schema``) with
        one writer over every vnode; None, having written nothing, when Spark's writers must."""
        if self.max_rows <= 0 or not files or type(target).spark_write is not SinkTarget.spark_write:
            return None
        paths = _local_paths(files)
        types = {f.name: f.dataType for f in schema.fields}
        if paths is None or not all(c in types and plain_type(types[c]) for c in target.columns):
            return self._decline()
        import pyarrow.parquet as pq

        try:
            rows = sum(pq.read_metadata(p).num_rows for p in paths)
            if rows > self.max_rows or sum(os.path.getsize(p) for p in paths) > MAX_FILE_BYTES:
                return self._decline()
            table = _read(paths, _arrow_schema(schema, target.columns))
            if target.type == "upsert":
                table = _net(table, target.columns)
        except Exception as exc:  # noqa: BLE001 - not readable here (another machine's disk?): Spark can
            log.warning("sink %s: pyarrow could not read %s (%s): Spark's writers take the batch", target.name,
                        paths[0], exc)
            return self._decline()
        counted = CountedBatches(table.to_batches())
        metadata = target.write(WriterTask(batch, 0, 1, ALL_VNODES), iter(counted))
        self.answered += 1
        return [WriterResult(0, ALL_VNODES, counted.rows, metadata)]

    def _decline(self) -> None:
        self.declined += 1
        return None


def _arrow_schema(schema: StructType, columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema of a writer task's batches: the target's columns as Spark converts them
    (timestamps in UTC, as Spark writes them), then the weight as int64."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    fields = {f.name: f for f in schema.fields}
    arrow = to_arrow_schema(StructType([fields[c] for c in columns]), timezone="UTC")
    return pa.schema([*arrow, pa.field(WEIGHT, pa.int64())])


def _read(paths: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of ``paths`` in ``schema``. A column a file lacks (written before the view had it)
    reads as NULL, as Spark's read with that schema does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        present = set(pq.read_schema(path).names)
        read = pq.read_table(path, columns=[n for n in schema.names if n in present])
        arrays = [
            read.column(field.name).cast(field.type) if field.name in present else pa.nulls(read.num_rows, field.type)
            for field in schema
        ]
        tables.append(pa.Table.from_arrays(arrays, schema=schema))
    return pa.concat_tables(tables)


def _net(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Each distinct row once with the sum of its weights, rows that cancel out dropped, deletes
    first: what Spark's writers get for an upsert sink (a key's delete and its new value may sit in
    different epochs of one batch)."""
    import pyarrow.compute as pc

    summed = table.group_by(list(columns), use_threads=False).aggregate([(WEIGHT, "sum")])
    summed = summed.rename_columns([*columns, WEIGHT]).select([*columns, WEIGHT])
    kept = summed.filter(pc.not_equal(summed.column(WEIGHT), 0))
    return kept.sort_by([(WEIGHT, "ascending")]).cast(table.schema)
