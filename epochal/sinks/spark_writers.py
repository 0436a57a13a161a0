"""Run a sink batch's writers as Spark tasks: the rows never pass through the driver.

The batch's change files are read by the executors, netted per row (upsert: a key's delete and its
new value may sit in different epochs of one batch), hashed to vnodes by the sink's key (the whole
row for append-only sinks) and spread over ``writers`` tasks, each covering a contiguous vnode
range. Every writer gets one *marker* row, so that a writer whose vnodes hold no rows still runs
and pre-commits (a target may need per-writer artifacts to cover its vnodes). Each task calls
:meth:`SinkTarget.write` with a stream of Arrow batches and returns only the target's metadata.

``mapInArrow`` works the same on local Spark, on a cluster and over Spark Connect (its function is
pickled to the executors; they import ``epochal``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    CountedBatches,
    SinkError,
    SinkTarget,
    WriterResult,
    WriterTask,
    vnode_ranges,
)
from epochal.sql import quote
from epochal.storage.vnode import VNODE_COUNT, vnode_column

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_WRITER = "_epochal_writer"
_MARKER = "_epochal_marker"
_RESULT_SCHEMA = "writer INT, first_vnode INT, last_vnode INT, rows BIGINT, metadata STRING"


def writer_of_vnode(writers: int) -> list[int]:
    """For each vnode, the index of the writer whose range holds it."""
    owner = [0] * VNODE_COUNT
    for writer, (first, last) in enumerate(vnode_ranges(writers)):
        owner[first : last + 1] = [writer] * (last - first + 1)
    return owner


def run_writers(
    spark: SparkSession | None,
    target: SinkTarget,
    batch: BatchId,
    files: Sequence[str],
    schema: StructType | None,
    writers: int,
) -> list[WriterResult]:
    """Pre-commit ``batch`` (the change rows in ``files``, typed by the upstream ``schema``) through
    ``writers`` tasks; their results, one per writer."""
    ranges = vnode_ranges(writers)
    if not files or spark is None or schema is None:
        if files:
            raise SinkError(f"{batch.describe()}: {len(files)} change file(s) to write but no Spark session")
        # An idle batch: no rows to move, so no Spark job; each writer still pre-commits (nothing).
        return [
            WriterResult(w, ranges[w], 0, target.write(WriterTask(batch, w, writers, ranges[w]), iter(())))
            for w in range(writers)
        ]
    from pyspark.sql import functions as F

    columns = [quote(c) for c in target.columns]
    change = spark.read.schema(_with_weight(schema)).parquet(*files).select(*columns, F.col(WEIGHT).cast("long"))
    return write_frame(spark, target, batch, change, schema, writers)


def write_frame(
    spark: SparkSession,
    target: SinkTarget,
    batch: BatchId,
    change: DataFrame,
    schema: StructType,
    writers: int,
) -> list[WriterResult]:
    """Pre-commit ``batch`` from ``change`` (the target's columns and :data:`WEIGHT`): the change
    files of its epochs, or for a snapshot batch the table's state, every row with weight 1."""
    from pyspark.sql import functions as F

    columns = [quote(c) for c in target.columns]
    if target.type == "upsert":
        change = change.groupBy(*columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)
    # A target whose pre-commit is plain files lets Spark write them as the rows lie: no vnode
    # spread, no shuffle (one job writes every partition or fails whole, so every vnode is covered).
    native = target.spark_write(change, batch, writers)
    if native is not None:
        return native
    owner = F.array(*[F.lit(w) for w in writer_of_vnode(writers)])
    rows = change.select(
        *columns,
        WEIGHT,
        F.element_at(owner, vnode_column(schema, target.primary_key) + 1).alias(_WRITER),
        F.lit(False).alias(_MARKER),
    )
    markers = spark.range(writers).select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields if f.name in target.columns],
        F.lit(0).cast("long").alias(WEIGHT),
        F.col("id").cast("int").alias(_WRITER),
        F.lit(True).alias(_MARKER),
    )
    spread = (
        rows.unionByName(markers)
        .repartition(writers, _WRITER)
        # each writer's rows contiguous within its partition (two writers may share one), markers first
        .sortWithinPartitions(_WRITER, F.col(_MARKER).desc())
    )
    written = spread.mapInArrow(_write_partition(target, batch, writers), _RESULT_SCHEMA).collect()
    return [
        WriterResult(r["writer"], (r["first_vnode"], r["last_vnode"]), r["rows"], json.loads(r["metadata"]))
        for r in sorted(written, key=lambda r: r["writer"])
    ]


def _with_weight(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([*schema.fields, StructField(WEIGHT, LongType())])


def _write_partition(target: SinkTarget, batch: BatchId, writers: int):  # noqa: ANN202 - pickled to executors
    ranges = vnode_ranges(writers)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for writer, group in itertools.groupby(_split_by_writer(batches), key=lambda item: item[0]):
            counted = CountedBatches(b for _, b in group)
            task = WriterTask(batch, writer, writers, ranges[writer])
            metadata = target.write(task, iter(counted))
            yield pa.RecordBatch.from_pydict(
                {
                    "writer": [writer],
                    "first_vnode": [ranges[writer][0]],
                    "last_vnode": [ranges[writer][1]],
                    "rows": [counted.rows],
                    "metadata": [json.dumps(dict(metadata))],
                },
                schema=pa.schema(
                    [
                        ("writer", pa.int32()),
                        ("first_vnode", pa.int32()),
                        ("last_vnode", pa.int32()),
                        ("rows", pa.int64()),
                        ("metadata", pa.string()),
                    ]
                ),
            )

    return run


def _split_by_writer(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(writer, rows of that writer without the helper columns), in order; a marker yields an empty
    batch so that the writer's group exists even without rows."""
    import numpy as np
    import pyarrow.compute as pc

    for record_batch in batches:
        writer_ids = record_batch.column(_WRITER).to_numpy(zero_copy_only=False)
        # the partition is sorted by writer: each run of equal ids is one writer's rows
        starts = [0, *(np.flatnonzero(np.diff(writer_ids)) + 1).tolist(), len(writer_ids)]
        for start, end in itertools.pairwise(starts):
            if start == end:
                continue
            part = record_batch.slice(start, end - start)
            part = part.filter(pc.invert(part.column(_MARKER)))
            yield int(writer_ids[start]), part.drop_columns([_WRITER, _MARKER])
