"""What the meta store says of a sink's deliveries: its batches, its last delivered epoch, its lag and
how it started. Reads only, each inside the caller's transaction; the delivery protocol that writes
these rows is :mod:`epochal.checkpoint.sinks.coordinator`."""

from __future__ import annotations

import time
from typing import Any

from epochal.checkpoint import queries as q
from epochal.checkpoint.sinks.batches import BATCH_COLUMNS, SinkBatch, batch_from_row
from epochal.checkpoint.statements import sinks as sink_declarations
from epochal.meta.backend import Cursor
from epochal.sinks.base import SNAPSHOT_FIRST_EPOCH


def batches(cur: Cursor, sink: str) -> list[SinkBatch]:
    """Every attempt of every batch of ``sink``, in epoch order."""
    rows = cur.execute(
        f"SELECT {BATCH_COLUMNS} FROM sink_batches WHERE sink = ? ORDER BY first_epoch, attempt", [sink]
    ).fetchall()
    return [batch_from_row(r) for r in rows]


def lag(cur: Cursor, sink: str) -> dict[str, Any]:
    """How far ``sink`` is behind: the committed epochs it has not delivered, and the seconds since
    the oldest of them was committed."""
    progress = q.sink_progress(cur, sink)
    waiting, oldest = cur.execute(
        "SELECT count(*), min(committed_at) FROM epochs WHERE state = 'COMMITTED' AND epoch > ?",
        [-1 if progress is None else progress],
    ).fetchone()
    # a PENDING batch the target refused (it waits for the target to take its rows), else the
    # newest aborted attempt's
    last_error = cur.execute(
        "SELECT error, updated_at FROM sink_batches WHERE sink = ? AND error IS NOT NULL "
        "AND (state = 'ABORTED' OR state = 'PENDING') ORDER BY state = 'PENDING' DESC, updated_at DESC LIMIT 1",
        [sink],
    ).fetchone()
    pending = cur.execute("SELECT count(*) FROM sink_batches WHERE sink = ? AND state = 'PENDING'", [sink]).fetchone()[
        0
    ]
    return {
        "delivered_epoch": q.sink_delivered(cur, sink),
        "lag_epochs": waiting,
        "lag_seconds": round(time.time() - oldest, 3) if oldest is not None else 0.0,
        "pending_batches": pending,
        # (a delivery refused before any batch, for a target changed under the sink's name, first)
        "last_error": sink_declarations.refusal(cur, sink) or (last_error[0] if last_error else None),
        "start": start_status(cur, sink),
    }


def start_status(cur: Cursor, sink: str) -> dict[str, Any] | None:
    """How the sink started: its snapshot batch (epoch, rows, when committed), or the history it
    skipped; None before its first delivery decided it."""
    start = q.sink_start(cur, sink)
    if start is None:
        return None
    snapshot, upto = start
    if not snapshot:
        return {"snapshot": False, "skipped_upto": upto}
    row = cur.execute(
        "SELECT last_epoch, rows_written, updated_at FROM sink_batches WHERE sink = ? AND first_epoch = ? "
        "AND state = 'COMMITTED'",
        [sink, SNAPSHOT_FIRST_EPOCH],
    ).fetchone()
    return {
        "snapshot": True,
        # None: the sink was there from the first epoch, it delivers every epoch (no snapshot)
        "snapshot_epoch": row[0] if row else upto,
        "snapshot_delivered": row is not None,
        "snapshot_rows": row[1] if row else None,
        "snapshot_delivered_at": row[2] if row else None,
    }
