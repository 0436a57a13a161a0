"""A CDC table's snapshot rows and log records as one keyed batch (postgres-cdc, mysql-cdc), and
mysql-cdc's snapshot, staged whole under ``EPOCHAL_HOME/cdc/<table>/``.

mysql-cdc reads the upstream table's rows once, in a transaction whose snapshot sits exactly at a
known binlog position, and writes them as Parquet. Its first range then starts with them: changes
before the position are in the snapshot, those at or after it apply on top. The rows are on the
disk before the marker names them, and the marker is written last (atomically), so a snapshot
killed half-way is no snapshot and is taken again; a staged one is read the same by every re-run
of the epoch that plans it. (postgres-cdc stages its snapshot in key chunks over several epochs:
``cdc_chunks``, ``pg_cdc_snapshot``.) ``snapshot_rows``, ``log_rows`` and ``keyed_batch`` build
what both connectors' ``read`` returns: snapshot rows as upserts, then the log's records.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.connectors.base import SourceBatch, SplitRange
from epochal.storage.durability import sync_tree
from epochal.storage.upsert import OFFSET_COLUMN, OP_COLUMN, SPLIT_COLUMN, UNCHANGED_COLUMN, UPSERT

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from epochal.pipeline.model import Column

log = logging.getLogger("epochal.connectors.cdc")

MARKER = "snapshot.json"


@dataclass(frozen=True)
class Snapshot:
    #: the log position the snapshot is exactly at: changes from here on apply on top of its rows
    position: int
    files: tuple[str, ...]
    rows: int


def staged_snapshot(stage: Path) -> Snapshot | None:
    """The snapshot staged in ``stage``, or None when none was finished there."""
    marker = stage / MARKER
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return Snapshot(int(data["position"]), tuple(data["files"]), int(data["rows"]))


def stage_snapshot(
    stage: Path,
    position: int,
    columns: tuple[Column, ...],
    batches: Iterable[Sequence[Sequence[Any]]],
    typed: Callable[[Sequence[Any]], Sequence[Any]],
    label: str,
) -> Snapshot:
    """Write ``batches`` (rows as the server gave them; ``typed`` turns one into the declared
    columns' values) as the snapshot at ``position``, durably, then its marker; ``label`` names the
    table in the progress log."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema(columns)
    directory = stage / f"snapshot-{position}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "rows.parquet"
    rows = 0
    with pq.ParquetWriter(path, schema) as writer:
        for batch in batches:
            values = [dict(zip(schema.names, typed(row), strict=True)) for row in batch]
            writer.write_table(pa.Table.from_pylist(values, schema))
            rows += len(batch)
            log.info("%s: snapshot: %d rows staged", label, rows)
    sync_tree(str(directory), stop_at=str(stage))
    marker, tmp = stage / MARKER, stage / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"position": position, "files": [str(path)], "rows": rows}))
    sync_tree(str(tmp))
    os.replace(tmp, marker)
    sync_tree(str(stage))
    return Snapshot(position, (str(path),), rows)


def arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema a snapshot's rows are staged with: the declared columns' types."""
    import pyarrow as pa

    simple = {
        "BIGINT": pa.int64(),
        "INT": pa.int32(),
        "SMALLINT": pa.int16(),
        "TINYINT": pa.int8(),
        "DOUBLE": pa.float64(),
        "FLOAT": pa.float32(),
        "BOOLEAN": pa.bool_(),
        "STRING": pa.string(),
        "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    }
    fields = []
    for c in columns:
        decimal = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", c.type.replace(" ", ""))
        fields.append(pa.field(c.name, pa.decimal128(int(decimal[1]), int(decimal[2])) if decimal else simple[c.type]))
    return pa.schema(fields)


def cdc_batch(
    spark: SparkSession,
    columns: tuple[Column, ...],
    ranges: list[SplitRange],
    snapshot: Callable[[], Snapshot],
    records: Callable[[int, int], list[tuple]],
) -> SourceBatch:
    """The keyed records of ``ranges`` of one CDC table: in a table's first range (its start is 0)
    the ``snapshot``'s rows as upserts (staged by the first read that asks for it, at position P),
    then ``records(end, lower)`` of the log (the declared columns and ``_op``) from ``lower = max(start,
    P)`` on, in log order: a change before P is in the snapshot's rows, in whichever epoch's range it
    falls (the snapshot is staged after the first range was planned, so P may lie past its end)."""
    frames: list[DataFrame] = []
    count = 0
    partial = False
    staged = snapshot()
    for r in ranges:
        if r.start == 0:
            count += staged.rows
            frames.append(snapshot_rows(spark, columns, staged.files, r.split))
        lower = max(r.start, staged.position)
        found = records(r.end, lower) if lower < r.end else []
        count += len(found)
        frame, unchanged = log_rows(spark, columns, found, r.split)
        frames.append(frame)
        partial = partial or unchanged
    return keyed_batch(frames, count, partial)


def snapshot_rows(spark: SparkSession, columns: tuple[Column, ...], files: Sequence[str], split: str) -> DataFrame:
    """Staged snapshot rows (Parquet ``files``) as upserts of ``split``, before its log records."""
    from pyspark.sql import functions as F

    ddl = ", ".join(f"`{c.name}` {c.type}" for c in columns)
    return (
        spark.read.schema(ddl)
        .parquet(*files)
        .select(
            *[F.col(f"`{c.name}`") for c in columns],
            F.lit(UPSERT).alias(OP_COLUMN),
            F.lit(split).alias(SPLIT_COLUMN),
            F.lit(-1).cast("bigint").alias(OFFSET_COLUMN),
        )
    )


def log_rows(
    spark: SparkSession, columns: tuple[Column, ...], found: Sequence[tuple], split: str
) -> tuple[DataFrame, bool]:
    """Log records (the declared columns and ``_op``) of ``split`` in log order, and whether one
    names columns an update left unchanged and did not send (postgres-cdc's unchanged TOASTed
    values): then the batch needs UNCHANGED_COLUMN, which ``upsert_changes`` fills from the row's
    earlier value."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    schema = arrow_schema(columns).append(pa.field(OP_COLUMN, pa.string()))
    width = len(schema.names)
    rows = pa.Table.from_pylist([dict(zip(schema.names, rec[:width], strict=True)) for rec in found], schema)
    rows = rows.append_column(SPLIT_COLUMN, pa.array([split] * len(found), pa.string()))
    rows = rows.append_column(OFFSET_COLUMN, pa.array(range(len(found)), pa.int64()))
    unchanged = [list(rec[width]) if len(rec) > width else None for rec in found]
    rows = rows.append_column(UNCHANGED_COLUMN, pa.array(unchanged, pa.list_(pa.string())))
    frame = spark.createDataFrame(rows).select(
        *[F.col(f"`{c.name}`").cast(c.type) for c in columns], OP_COLUMN, SPLIT_COLUMN, OFFSET_COLUMN, UNCHANGED_COLUMN
    )
    return frame, any(u is not None for u in unchanged)


def keyed_batch(frames: Sequence[DataFrame], count: int, partial: bool) -> SourceBatch:
    """``frames`` (``snapshot_rows`` and ``log_rows``) in order, as one batch of ``count`` records."""
    batch = frames[0]
    for frame in frames[1:]:
        batch = batch.unionByName(frame, allowMissingColumns=True)
    # without an unchanged value the column is left out: upsert_changes then skips filling it
    return SourceBatch(rows=batch if partial else batch.drop(UNCHANGED_COLUMN), records=count)
