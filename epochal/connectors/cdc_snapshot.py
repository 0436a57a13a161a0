"""A CDC table's snapshot, staged under ``EPOCHAL_HOME/cdc/<table>/`` (postgres-cdc, mysql-cdc).

The upstream table's rows are read once, in a transaction whose snapshot sits exactly at a known
log position (a PostgreSQL LSN, a binlog offset), and written as Parquet. An epoch's range then
starts with them: changes before the position are in the snapshot, those at or after it apply on
top. The rows must be on the disk before the marker names them, and the marker is written last
(atomically), so a snapshot killed half-way is no snapshot and is taken again; a staged one is read
the same by every re-run of the epoch that plans it. ``cdc_batch`` is what both connectors' ``read``
returns: the snapshot's rows (in a table's first range) followed by the log's records.
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
from epochal.connectors.cdc_chunks import StagedChunk, describe, from_description, write_durably
from epochal.errors import EpochalError
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
    #: a snapshot staged in key chunks (postgres-cdc): each at its own position (``position`` is
    #: the lowest); a record applies on top only per ``cdc_chunks.KeyFilter``. Empty: one position.
    chunks: tuple[StagedChunk, ...] = ()


def staged_snapshot(stage: Path) -> Snapshot | None:
    """The snapshot staged in ``stage``, or None when none was finished there."""
    marker = stage / MARKER
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    chunks = tuple(from_description(data.get("chunks", [])))
    return Snapshot(int(data["position"]), tuple(data["files"]), int(data["rows"]), chunks)


def write_marker(stage: Path, chunks: Sequence[StagedChunk]) -> Snapshot:
    """The marker of a snapshot staged in ``chunks`` (their files and records durable already):
    written last, atomically, it makes them the table's snapshot."""
    snapshot = Snapshot(
        min(c.position for c in chunks), tuple(c.file for c in chunks), sum(c.rows for c in chunks), tuple(chunks)
    )
    write_durably(
        stage / MARKER,
        {
            "position": snapshot.position,
            "files": list(snapshot.files),
            "rows": snapshot.rows,
            "chunks": describe(chunks),
        },
    )
    return snapshot


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
    snapshot: Callable[[], Snapshot | None],
    records: Callable[[int, int], list[tuple]],
    table: str,
    stage: Path,
) -> SourceBatch:
    """The keyed records of ``ranges`` of one CDC table: in a table's first range (its start is 0)
    the staged ``snapshot``'s rows as upserts, then ``records(end, start)`` of the log (the declared
    columns and ``_op``; from the snapshot's position in a first range), in log order. A record may
    end with the names of the columns an update left unchanged and did not send (postgres-cdc's
    unchanged TOASTed values): then the batch has UNCHANGED_COLUMN, which ``upsert_changes`` fills
    from the row's earlier value."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    frames: list[DataFrame] = []
    count = 0
    partial = False
    names = [c.name for c in columns]
    ddl = ", ".join(f"`{c.name}` {c.type}" for c in columns)
    for r in ranges:
        lower = r.start
        if r.start == 0:
            staged = snapshot()
            if staged is None or staged.position > r.end:
                raise EpochalError(
                    f"the snapshot of {table} that the epoch was planned with is gone from {stage}: "
                    "run `epochal recover` to plan it again"
                )
            lower = staged.position
            count += staged.rows
            frames.append(
                spark.read.schema(ddl)
                .parquet(*staged.files)
                .select(
                    *[F.col(f"`{n}`") for n in names],
                    F.lit(UPSERT).alias(OP_COLUMN),
                    F.lit(r.split).alias(SPLIT_COLUMN),
                    F.lit(-1).cast("bigint").alias(OFFSET_COLUMN),
                )
            )
        found = records(r.end, lower)
        count += len(found)
        schema = arrow_schema(columns).append(pa.field(OP_COLUMN, pa.string()))
        width = len(schema.names)
        rows = pa.Table.from_pylist([dict(zip(schema.names, rec[:width], strict=True)) for rec in found], schema)
        rows = rows.append_column(SPLIT_COLUMN, pa.array([r.split] * len(found), pa.string()))
        rows = rows.append_column(OFFSET_COLUMN, pa.array(range(len(found)), pa.int64()))
        unchanged = [list(rec[width]) if len(rec) > width else None for rec in found]
        rows = rows.append_column(UNCHANGED_COLUMN, pa.array(unchanged, pa.list_(pa.string())))
        frames.append(
            spark.createDataFrame(rows).select(
                *[F.col(f"`{n}`").cast(c.type) for n, c in zip(names, columns, strict=True)],
                OP_COLUMN,
                SPLIT_COLUMN,
                OFFSET_COLUMN,
                UNCHANGED_COLUMN,
            )
        )
        partial = partial or any(u is not None for u in unchanged)
    batch = frames[0]
    for frame in frames[1:]:
        batch = batch.unionByName(frame, allowMissingColumns=True)
    # without an unchanged value the column is left out: upsert_changes then skips filling it
    return SourceBatch(rows=batch if partial else batch.drop(UNCHANGED_COLUMN), records=count)
