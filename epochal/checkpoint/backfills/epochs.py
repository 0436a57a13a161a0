"""A backfill's position in the log-store phase: the committed epochs a backfilling view writes one
by one after its snapshot, and the in-flight ones a changed view writes ahead to switch.

Each function runs inside the caller's transaction, with the backfill the caller has checked it owns
(``BackfillLog._check_owner``), so a runner that lost its claim never moves the position.
"""

from __future__ import annotations

import time

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import split_rows as backfill_splits
from epochal.checkpoint.backfills.state import Backfill, BackfillPhase
from epochal.checkpoint.records import EpochAborted, EpochState, InvariantViolation
from epochal.meta.backend import Cursor


def next_committed(cur: Cursor, after: int | None) -> int | None:
    """The first committed epoch after ``after``: where the log-store position moves next."""
    return cur.execute("SELECT min(epoch) FROM epochs WHERE state = 'COMMITTED' AND epoch > ?", [after]).fetchone()[0]


def next_epoch(cur: Cursor, b: Backfill | None) -> int | None:
    """The next committed epoch the view has to write, or None when it has written the committed
    epoch (or is not in the log-store phase)."""
    if b is None or b.phase is not BackfillPhase.LOG_STORE:
        return None
    return next_committed(cur, b.caught_up_epoch)


def _check_next(cur: Cursor, b: Backfill, epoch: int, doing: str) -> None:
    expected = next_committed(cur, b.caught_up_epoch)
    if expected != epoch:
        raise InvariantViolation(
            f"backfill of {b.view} {doing} epoch {epoch}, but the next committed epoch after "
            f"{b.caught_up_epoch} is {expected}"
        )


def _advance(cur: Cursor, view: str, epoch: int, rows_in: int, rows_out: int) -> None:
    # The splits of the SOURCEs it read from the connector move on with the epoch it takes.
    backfill_splits.on_epoch(cur, view, epoch)
    now = time.time()
    cur.execute(
        "UPDATE backfills SET caught_up_epoch = ?, rows_read = rows_read + ?, rows_written = rows_written + ?, "
        "updated_at = ?, heartbeat_at = ? WHERE view_name = ?",
        [epoch, rows_in, rows_out, now, now, view],
    )


def _insert_collected(
    cur: Cursor, view: str, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
) -> None:
    cur.execute(
        "INSERT INTO collected VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, 'backfill', ?)",
        [epoch, view, location, rows_in, rows_out, seconds, time.time()],
    )


def record(
    cur: Cursor, b: Backfill, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
) -> None:
    """The view's change for committed ``epoch`` is written: recorded as its collected output for
    that epoch, which must be the one after the last it wrote, and the position moves there."""
    if b.phase is not BackfillPhase.LOG_STORE:
        raise InvariantViolation(f"backfill of {b.view} writes epoch {epoch} in phase {b.phase.value}")
    _check_next(cur, b, epoch, "writes")
    cur.execute("DELETE FROM collected WHERE epoch = ? AND asset = ?", [epoch, b.view])
    _insert_collected(cur, b.view, epoch, location, rows_in, rows_out, seconds)
    _advance(cur, b.view, epoch, rows_in, rows_out)


def adopt(cur: Cursor, b: Backfill, epoch: int) -> bool:
    """The next committed ``epoch`` already has the view's change, written ahead while it was in
    flight (``record_ahead``): the position moves over it instead of computing it again. False when
    it has none."""
    row = cur.execute(
        "SELECT rows_in, rows_out FROM collected WHERE epoch = ? AND asset = ?", [epoch, b.view]
    ).fetchone()
    if row is None or b.phase is not BackfillPhase.LOG_STORE:
        return False
    _check_next(cur, b, epoch, "adopts")
    _advance(cur, b.view, epoch, row[0] or 0, row[1] or 0)
    return True


def record_ahead(
    cur: Cursor, b: Backfill, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
) -> None:
    """The view's change for ``epoch``, not committed yet, written ahead of its log-store position:
    a changed view's step writes its new statement's last epochs so that it can switch now.
    Recorded like the epoch's other tables (recovery drops it with an aborted epoch); the position
    moves only when the epoch has committed (``adopt``)."""
    if b.phase is not BackfillPhase.LOG_STORE or b.caught_up_epoch is None:
        raise InvariantViolation(f"backfill of {b.view} writes epoch {epoch} ahead in phase {b.phase.value}")
    if q.epoch_record(cur, epoch).state is EpochState.ABORTED:
        raise EpochAborted(f"epoch {epoch} was aborted by a recovery while {b.view} wrote it ahead")
    unwritten = cur.execute(
        "SELECT min(epoch) FROM epochs WHERE epoch > ? AND epoch <= ? AND state <> 'ABORTED' "
        "AND epoch NOT IN (SELECT epoch FROM collected WHERE asset = ?)",
        [b.caught_up_epoch, epoch, b.view],
    ).fetchone()[0]
    if unwritten != epoch:
        raise InvariantViolation(
            f"backfill of {b.view} writes epoch {epoch} ahead, but the first epoch it has not written is {unwritten}"
        )
    _insert_collected(cur, b.view, epoch, location, rows_in, rows_out, seconds)
