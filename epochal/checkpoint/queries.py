"""Reads and writes of the meta store that several parts of the controller share, each on a cursor
inside the caller's transaction (so a caller composes them into one consistent decision)."""

from __future__ import annotations

from epochal.checkpoint.records import (
    TRANSITIONS,
    Collected,
    CommitAlignmentError,
    EpochRecord,
    EpochState,
    InvariantViolation,
    UnknownEpoch,
)
from epochal.connectors.base import SplitRange
from epochal.epoch import BarrierKind
from epochal.meta.backend import Cursor
from epochal.sinks.base import SNAPSHOT_FIRST_EPOCH

EPOCH_COLUMNS = "epoch, prev_epoch, kind, state, injected_at, committed_at, failure"
IN_FLIGHT = "('INJECTED', 'COLLECTED')"


def transition(cur: Cursor, epoch: int, old: EpochState, new: EpochState, **extra: object) -> None:
    """Move ``epoch`` from ``old`` to ``new``: the one place an epoch's state changes. The move must
    be in the transition table, and the row must really be in ``old``: exactly one row changes."""
    if new not in TRANSITIONS[old]:
        raise InvariantViolation(f"illegal epoch transition {old.name} -> {new.name} for epoch {epoch}")
    sets = ", ".join(["state = ?", *(f"{k} = ?" for k in extra)])
    changed = cur.execute(
        f"UPDATE epochs SET {sets} WHERE epoch = ? AND state = ? RETURNING epoch",
        [new.value, *extra.values(), epoch, old.value],
    ).fetchall()
    if len(changed) != 1:
        raise InvariantViolation(
            f"epoch {epoch} was to move {old.name} -> {new.name}, but {len(changed)} row(s) were in {old.name}: "
            "another process changed it outside a transaction, or the meta store was edited"
        )


def get_flag(cur: Cursor, key: str, default: str | None = None) -> str | None:
    row = cur.execute("SELECT value FROM controller WHERE key = ?", [key]).fetchone()
    return row[0] if row else default


def set_flag(cur: Cursor, key: str, value: str | None) -> None:
    cur.execute("DELETE FROM controller WHERE key = ?", [key])
    if value is not None:
        cur.execute("INSERT INTO controller VALUES (?, ?)", [key, value])


def record(row: tuple) -> EpochRecord:
    return EpochRecord(
        epoch=row[0],
        prev=row[1],
        kind=BarrierKind(row[2]),
        state=EpochState(row[3]),
        injected_at=row[4],
        committed_at=row[5],
        failure=row[6],
    )


def committed_epoch(cur: Cursor) -> int | None:
    row = cur.execute("SELECT max(epoch) FROM epochs WHERE state = 'COMMITTED'").fetchone()
    return row[0] if row else None


def in_flight(cur: Cursor) -> list[EpochRecord]:
    rows = cur.execute(f"SELECT {EPOCH_COLUMNS} FROM epochs WHERE state IN {IN_FLIGHT} ORDER BY epoch").fetchall()
    return [record(r) for r in rows]


def epoch_record(cur: Cursor, epoch: int) -> EpochRecord:
    row = cur.execute(f"SELECT {EPOCH_COLUMNS} FROM epochs WHERE epoch = ?", [epoch]).fetchone()
    if row is None:
        raise UnknownEpoch(
            f"epoch {epoch} was never injected by the checkpoint controller (or its records were pruned as "
            "history): run epoch_job without a partition (or let the barrier sensor run) to inject epochs"
        )
    return record(row)


def offsets(cur: Cursor, epoch: int, source: str) -> list[SplitRange]:
    rows = cur.execute(
        "SELECT split, start_offset, end_offset FROM epoch_offsets WHERE epoch = ? AND source = ? ORDER BY split",
        [epoch, source],
    ).fetchall()
    return [SplitRange(split, start, end) for split, start, end in rows]


def collected(cur: Cursor, epoch: int) -> dict[str, Collected]:
    rows = cur.execute(
        "SELECT asset, location, rows_in, rows_out, dead_letters, dead_letter_location, seconds, run_id "
        "FROM collected WHERE epoch = ?",
        [epoch],
    ).fetchall()
    return {r[0]: Collected(*r) for r in rows}


def reserved_starts(cur: Cursor) -> dict[str, dict[str, int]]:
    """Where each source split's next epoch starts: the end of the newest epoch that is not aborted
    (in-flight epochs keep their ranges reserved, aborted ones hand theirs back). One row per split,
    kept by injection, commit and recovery, so injecting never scans the offsets' history."""
    starts: dict[str, dict[str, int]] = {}
    for source, split, end in cur.execute("SELECT source, split, reserved_end FROM split_frontier").fetchall():
        starts.setdefault(source, {})[split] = end
    return starts


def check_alignment(cur: Cursor, tables: list[str], committed: int | None) -> None:
    """Commit alignment: every table of the pipeline is committed at the pipeline's committed epoch.
    A table that disagrees is reported, never guessed around. Checked by recovery, and before every
    injection, so a view added to a running pipeline is refused before it runs without its history."""
    if committed is None:
        return
    rows = dict(cur.execute("SELECT table_name, committed_epoch FROM table_epochs").fetchall())
    wrong = {t: rows.get(t) for t in tables if rows.get(t) != committed}
    if not wrong:
        return
    listing = ", ".join(f"{t}={e}" for t, e in sorted(wrong.items(), key=lambda kv: kv[0]))
    new = [t for t, e in wrong.items() if e is None]
    hint = (
        f"table(s) {', '.join(sorted(new))} joined the pipeline after epochs were committed, and this "
        "controller was opened without what they read, so it cannot start their backfill: open it "
        "through the pipeline (EpochRuntime, epoch_job), which backfills a new view"
        if new and len(new) == len(wrong)
        else "the meta store was edited or damaged; restore it from a backup"
    )
    raise CommitAlignmentError(
        f"commit alignment violated: the pipeline is committed at epoch {committed} but {listing}: {hint}"
    )


def sink_delivered(cur: Cursor, sink: str) -> int | None:
    """The last epoch ``sink`` delivered: the end of its newest COMMITTED batch."""
    return cur.execute(
        "SELECT max(last_epoch) FROM sink_batches WHERE sink = ? AND state = 'COMMITTED'", [sink]
    ).fetchone()[0]


def sink_start(cur: Cursor, sink: str) -> tuple[bool, int | None] | None:
    """(snapshot, history_upto) as decided at the sink's first delivery, or None when undecided."""
    row = cur.execute("SELECT snapshot, history_upto FROM sink_starts WHERE sink = ?", [sink]).fetchone()
    return None if row is None else (bool(row[0]), row[1])


def sink_progress(cur: Cursor, sink: str) -> int | None:
    """The newest epoch ``sink`` holds or never will: what it delivered, or, before its first batch,
    the history a ``snapshot = 'false'`` start skips. The epochs after it are what the sink lags."""
    delivered = sink_delivered(cur, sink)
    if delivered is not None:
        return delivered
    start = sink_start(cur, sink)
    return start[1] if start is not None and not start[0] else None


def sink_retention_floor(cur: Cursor, sink: str) -> int | None:
    """The newest epoch whose change files ``sink`` no longer needs (retention may drop them), -1
    when it needs every one, or None when it needs none of the existing ones. A sink that will start
    with a snapshot batch reads the table's state through its snapshot (any epoch it picks), not
    change files, so it holds nothing back until that batch is PENDING; then it needs the changes
    after the batch's epoch. An undecided sink may still deliver from the first epoch: it keeps all."""
    delivered = sink_delivered(cur, sink)
    if delivered is not None:
        return delivered
    start = sink_start(cur, sink)
    if start is None or start[1] is None:
        return -1
    if not start[0]:
        return start[1]
    pending = cur.execute(
        "SELECT max(last_epoch) FROM sink_batches WHERE sink = ? AND state = 'PENDING' AND first_epoch = ?",
        [sink, SNAPSHOT_FIRST_EPOCH],
    ).fetchone()[0]
    return pending


def source_history(cur: Cursor, source: str, epoch: int, inclusive: bool) -> list[SplitRange] | None:
    """Per split of ``source``, the offsets of every record the source took up to ``epoch``
    (its records included when ``inclusive``): from where the split's history starts to where
    ``epoch``'s range ends (or starts). None when ``epoch``'s offsets are not in the store (it was
    pruned, or never injected). What a SOURCE that stores nothing reads back from its connector."""
    ranges = offsets(cur, epoch, source) if _has_offsets(cur, epoch, source) else None
    if ranges is None:
        return None
    firsts = dict(
        cur.execute(
            "SELECT f.split, coalesce(f.first_offset, (SELECT min(o.start_offset) FROM epoch_offsets o "
            "WHERE o.source = f.source AND o.split = f.split)) FROM split_frontier f WHERE f.source = ?",
            [source],
        ).fetchall()
    )
    history = []
    for r in ranges:
        first = firsts.get(r.split)
        end = r.end if inclusive else r.start
        history.append(SplitRange(r.split, min(first if first is not None else r.start, end), end))
    return history


def _has_offsets(cur: Cursor, epoch: int, source: str) -> bool:
    row = cur.execute("SELECT state FROM epochs WHERE epoch = ?", [epoch]).fetchone()
    return row is not None and row[0] != "ABORTED"
