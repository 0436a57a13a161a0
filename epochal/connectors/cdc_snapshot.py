"""A CDC table's snapshot, staged under ``EPOCHAL_HOME/cdc/<table>/`` (postgres-cdc, mysql-cdc).

The upstream table's rows are read once, in a transaction whose snapshot sits exactly at a known
log position (a PostgreSQL LSN, a binlog offset), and written as Parquet. An epoch's range then
starts with them: changes before the position are in the snapshot, those at or after it apply on
top. The rows must be on the disk before the marker names them, and the marker is written last
(atomically), so a snapshot killed half-way is no snapshot and is taken again; a staged one is read
the same by every re-run of the epoch that plans it.
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

from epochal.storage.durability import sync_tree

if TYPE_CHECKING:
    import pyarrow as pa

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
