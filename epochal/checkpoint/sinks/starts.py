"""Where a sink starts (``sink_starts``): decided once, at its first delivery, then kept, so later
runs, recoveries and a changed ``snapshot`` option see the same start. A sink added to a table with
history starts with a snapshot batch of the table's state at the last committed epoch before it
joined, or (``snapshot = 'false'``) after that history. Each function runs inside the caller's
transaction."""

from __future__ import annotations

import time

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import InvariantViolation
from epochal.checkpoint.sinks.batches import SinkStart
from epochal.checkpoint.statements import sinks as sink_declarations
from epochal.meta.backend import Cursor


def _live_batches(cur: Cursor, sink: str) -> int:
    """Batches the target holds or will hold (PENDING or COMMITTED)."""
    return cur.execute(
        "SELECT count(*) FROM sink_batches WHERE sink = ? AND state IN ('PENDING', 'COMMITTED')", [sink]
    ).fetchone()[0]


def decide(
    cur: Cursor,
    sink: str,
    snapshot: bool,
    join_epoch: int,
    declaration: str | None,
    loaded_at: float | None,
    recipe: str | None = None,
) -> SinkStart:
    """The start of ``sink``, recorded now if this is its first delivery. The history is the committed
    epochs before ``join_epoch``; a sink that already has batches (from before starts were recorded)
    has none. ``declaration`` is checked against the recorded one first: a sink moved to another
    target under the same name raises ``SinkTargetChanged``."""
    known = q.sink_start(cur, sink)
    batches = _live_batches(cur, sink)
    if declaration is not None:
        sink_declarations.check_sink(cur, sink, declaration, loaded_at, known is not None or batches > 0)
        if recipe is not None:
            sink_declarations.record_recipe(cur, sink, recipe)
    if known is not None:
        return SinkStart(*known)
    upto = None
    if not batches:
        upto = cur.execute(
            "SELECT max(epoch) FROM epochs WHERE state = 'COMMITTED' AND epoch < ?", [join_epoch]
        ).fetchone()[0]
    # Two runs' first steps may decide at once: the first insert wins, both return it.
    cur.execute(
        "INSERT INTO sink_starts VALUES (?, ?, ?, ?) ON CONFLICT (sink) DO NOTHING",
        [sink, snapshot, upto, time.time()],
    )
    decided = q.sink_start(cur, sink)
    if decided is None:
        raise InvariantViolation(f"sink {sink}: its start was recorded but cannot be read back")
    return SinkStart(*decided)


def move_snapshot(cur: Cursor, sink: str, stale: int, epoch: int) -> SinkStart:
    """Move a snapshot start at ``stale`` to ``epoch``, only while no snapshot batch is PENDING or
    COMMITTED (the target then holds or will hold it). Returns the start as it is now."""
    if not _live_batches(cur, sink):
        cur.execute(
            "UPDATE sink_starts SET history_upto = ? WHERE sink = ? AND snapshot AND history_upto = ?",
            [epoch, sink, stale],
        )
    start = q.sink_start(cur, sink)
    if start is None:
        raise InvariantViolation(f"sink {sink}: a snapshot start to move, but none is recorded")
    return SinkStart(*start)
