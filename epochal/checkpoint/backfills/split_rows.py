"""The meta-store side of source backfill: per view, which SOURCE inputs it reads from their
splits, each split's state (:mod:`epochal.checkpoint.backfills.splits`) and the files its chunks went to.

Every function runs inside the caller's transaction. A chunk's files and the split's new offset
are recorded in one transaction (``record_read``), so a runner killed midway leaves files no row
names (deleted before the split is read again) and resumes at the recorded offset.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from epochal.checkpoint.backfills.splits import SplitBackfill, SplitPhase, after_epoch, after_join, after_read, start
from epochal.checkpoint.records import InvariantViolation
from epochal.connectors.base import SplitRange
from epochal.meta.backend import Cursor

_COLUMNS = "source, split, phase, read_offset, target, rows_read"


def _state(row: tuple) -> SplitBackfill:
    source, split, phase, offset, target, rows = row
    return SplitBackfill(source, split, SplitPhase(phase), offset, target, rows)


def sources(cur: Cursor, view: str) -> list[str] | None:
    """The inputs ``view`` reads from their splits, or None while that is not decided yet."""
    row = cur.execute("SELECT split_sources FROM backfills WHERE view_name = ?", [view]).fetchone()
    return None if row is None or row[0] is None else json.loads(row[0])


def states(cur: Cursor, view: str) -> list[SplitBackfill]:
    rows = cur.execute(
        f"SELECT {_COLUMNS} FROM backfill_splits WHERE view_name = ? ORDER BY source, split", [view]
    ).fetchall()
    return [_state(r) for r in rows]


def begin(cur: Cursor, view: str, snapshot_epoch: int, candidates: Iterable[str], vnodes_started: bool) -> list[str]:
    """Decide, once, which of ``candidates`` (the view's SOURCE inputs) it reads from their splits,
    and start their splits: BACKFILLING from where the source's history starts (``first_offset``)
    to the offset committed at the snapshot epoch (``epoch_offsets``, which retention keeps from
    the snapshot epoch on while the backfill is active). A source whose history start is unknown
    (a store from before it was recorded), or a backfill whose vnode ranges were written before
    this existed, reads the source's stored rows instead."""
    decided = sources(cur, view)
    if decided is not None:
        return decided
    chosen: list[str] = []
    for source in [] if vnodes_started else candidates:
        ranges = cur.execute(
            "SELECT o.split, f.first_offset, o.end_offset FROM epoch_offsets o "
            "LEFT JOIN split_frontier f ON f.source = o.source AND f.split = o.split "
            "WHERE o.epoch = ? AND o.source = ? ORDER BY o.split",
            [snapshot_epoch, source],
        ).fetchall()
        if any(origin is None for _, origin, _ in ranges):
            continue
        for split, origin, target in ranges:
            _write(cur, view, start(view, source, split, origin, target))
        chosen.append(source)
    cur.execute("UPDATE backfills SET split_sources = ? WHERE view_name = ?", [json.dumps(chosen), view])
    return chosen


def record_read(
    cur: Cursor, view: str, state: SplitBackfill, chunk: SplitRange, rows: int, location: str
) -> SplitBackfill:
    """``chunk`` of ``state``'s split is written to ``location``: recorded with the new offset."""
    current = {(s.source, s.split): s for s in states(cur, view)}.get((state.source, state.split))
    if current != state:
        raise InvariantViolation(
            f"the backfill of {view} read split {state.split} of {state.source} from a state the meta store "
            f"no longer has ({current}): another runner moved it"
        )
    moved = after_read(view, state, chunk, rows)
    cur.execute(
        "INSERT INTO backfill_split_chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
        [view, state.source, state.split, chunk.start, chunk.end, rows, location],
    )
    _write(cur, view, moved)
    now = time.time()
    cur.execute(
        "UPDATE backfills SET rows_read = rows_read + ?, updated_at = ?, heartbeat_at = ? WHERE view_name = ?",
        [rows, now, now, view],
    )
    return moved


def chunk_locations(cur: Cursor, view: str, source: str | None = None) -> list[str]:
    query = "SELECT location FROM backfill_split_chunks WHERE view_name = ?"
    params = [view]
    if source is not None:
        query += " AND source = ?"
        params.append(source)
    return [r[0] for r in cur.execute(query + " ORDER BY source, split, start_offset", params).fetchall()]


def on_epoch(cur: Cursor, view: str, epoch: int) -> None:
    """The view takes committed ``epoch`` in its log-store phase: each split of it in the epoch's
    ranges moves on (``after_epoch``); a split the backfill has no state for appeared after the
    snapshot epoch, and starts (with nothing to read) and finishes here."""
    chosen = sources(cur, view)
    if not chosen:
        return
    known = {(s.source, s.split): s for s in states(cur, view)}
    for source in chosen:
        ranges = cur.execute(
            "SELECT split, start_offset, end_offset FROM epoch_offsets WHERE epoch = ? AND source = ?",
            [epoch, source],
        ).fetchall()
        for split, first, last in ranges:
            state = known.get((source, split))
            if state is None:
                state = start(view, source, split, first, first)
            moved = after_epoch(view, state, SplitRange(split, first, last))
            if moved != known.get((source, split)):
                _write(cur, view, moved)


def on_join(cur: Cursor, view: str) -> None:
    for state in states(cur, view):
        moved = after_join(view, state)
        if moved != state:
            _write(cur, view, moved)


def status(cur: Cursor, view: str) -> dict:
    """``{source: {split: {phase, offset, target, rows}}}`` for `epochal status --json`."""
    shown: dict[str, dict] = {}
    for state in states(cur, view):
        shown.setdefault(state.source, {})[state.split] = state.as_status()
    return shown


def forget(cur: Cursor, views: Iterable[str]) -> list[str]:
    """Delete the split rows of ``views``; returns the chunk files for deletion."""
    garbage: list[str] = []
    for view in views:
        garbage += chunk_locations(cur, view)
        cur.execute("DELETE FROM backfill_split_chunks WHERE view_name = ?", [view])
        cur.execute("DELETE FROM backfill_splits WHERE view_name = ?", [view])
    return garbage


def _write(cur: Cursor, view: str, state: SplitBackfill) -> None:
    cur.execute(
        f"INSERT INTO backfill_splits (view_name, {_COLUMNS}, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (view_name, source, split) DO UPDATE SET phase = excluded.phase, "
        "read_offset = excluded.read_offset, target = excluded.target, rows_read = excluded.rows_read, "
        "updated_at = excluded.updated_at",
        [view, state.source, state.split, state.phase.value, state.offset, state.target, state.rows, time.time()],
    )
