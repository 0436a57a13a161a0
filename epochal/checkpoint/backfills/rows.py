"""A backfill's rows in the meta store: reading them, the one place its phase changes, and
forgetting a view's backfill and state. Every function runs in the caller's transaction; the
steps a runner takes are :mod:`epochal.checkpoint.backfills.log`, the user's controls
:mod:`epochal.checkpoint.backfills.control`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from epochal.checkpoint.backfills import split_rows as backfill_splits
from epochal.checkpoint.backfills.state import Backfill, BackfillPhase, check_transition
from epochal.checkpoint.records import InvariantViolation
from epochal.meta.backend import Cursor
from epochal.pipeline.model import OLD_VERSION_SEPARATOR

COLUMNS = (
    "view_name, upstreams, phase, snapshot_epoch, caught_up_epoch, vnodes_done, rows_read, rows_written, "
    "rate_limit, started_at, updated_at, joined_epoch, error, snapshot_location"
)


def _record(row: tuple) -> Backfill:
    return Backfill(
        view=row[0],
        upstreams=tuple(json.loads(row[1])),
        phase=BackfillPhase(row[2]),
        snapshot_epoch=row[3],
        caught_up_epoch=row[4],
        vnodes_done=row[5],
        rows_read=row[6],
        rows_written=row[7],
        rate_limit=row[8],
        started_at=row[9],
        updated_at=row[10],
        joined_epoch=row[11],
        error=row[12],
        snapshot_location=row[13],
    )


def read(cur: Cursor, view: str) -> Backfill | None:
    row = cur.execute(f"SELECT {COLUMNS} FROM backfills WHERE view_name = ?", [view]).fetchone()
    return _record(row) if row else None


def all_backfills(cur: Cursor) -> list[Backfill]:
    return [
        _record(r) for r in cur.execute(f"SELECT {COLUMNS} FROM backfills ORDER BY started_at, view_name").fetchall()
    ]


def outside_alignment(cur: Cursor) -> set[str]:
    """Views that are not committed with the others: backfilling, or cancelled."""
    return {
        r[0]
        for r in cur.execute(
            "SELECT view_name FROM backfills WHERE phase <> ?", [BackfillPhase.JOINED.value]
        ).fetchall()
    }


def joined_before(cur: Cursor, tables: Iterable[str], epoch: int) -> list[str]:
    """Of ``tables``, the views that joined by backfill while ``epoch`` was in flight: its live
    step ran before the join and skipped them, and their runner writes it instead."""
    names = list(tables)
    if not names:
        return []
    marks = ", ".join("?" for _ in names)
    rows = cur.execute(
        f"SELECT b.view_name FROM backfills b JOIN epochs e ON e.epoch = ? WHERE b.view_name IN ({marks}) "
        "AND b.phase = ? AND b.joined_epoch < ? AND b.joined_at IS NOT NULL AND e.injected_at <= b.joined_at",
        [epoch, *names, BackfillPhase.JOINED.value, epoch],
    ).fetchall()
    return sorted(r[0] for r in rows)


def aligned(cur: Cursor, tables: Iterable[str]) -> list[str]:
    """The tables an epoch's commit waits for: ``tables`` and every other table the meta store
    commits, without the views outside alignment and the tables retired from the pipeline.

    A run that loaded the pipeline before a table was removed still names it; its commit must not
    wait for a table nobody writes any more. A run that loaded it before a table was added (a view
    that has since backfilled and joined, a source) does not name it; its commit must wait for it
    all the same, or that table would be left behind at an older epoch than the others."""
    outside = outside_alignment(cur) | set(retired(cur))
    # (the old version of a view being rebuilt is maintained by its view's step, not committed)
    rows = cur.execute("SELECT table_name FROM table_epochs").fetchall()
    known = [r[0] for r in rows if OLD_VERSION_SEPARATOR not in r[0]]
    return [t for t in dict.fromkeys([*tables, *known]) if t not in outside]


def retired(cur: Cursor) -> dict[str, float]:
    """Tables retired from the pipeline, and when."""
    return dict(cur.execute("SELECT table_name, retired_at FROM retired_tables").fetchall())


def is_retired(cur: Cursor, table: str) -> bool:
    return cur.execute("SELECT 1 FROM retired_tables WHERE table_name = ?", [table]).fetchone() is not None


def bring_back(cur: Cursor, tables: Iterable[str], loaded_at: float) -> list[str]:
    """Tables named again by a pipeline loaded after they were retired: live again (they start
    as new tables: a view backfills). A pipeline loaded before the retirement is stale: it keeps
    naming the table, but does not bring it back. Returns the tables brought back."""
    back = [t for t, at in retired(cur).items() if t in set(tables) and loaded_at > at]
    for table in back:
        cur.execute("DELETE FROM retired_tables WHERE table_name = ?", [table])
    return back


def forget(cur: Cursor, tables: Iterable[str]) -> list[str]:
    """Delete the backfill rows of views that left the pipeline; returns the files only they name
    (the chunks read from a SOURCE's splits)."""
    tables = list(tables)
    garbage = backfill_splits.forget(cur, tables)
    for table in tables:
        cur.execute("DELETE FROM backfill_chunks WHERE view_name = ?", [table])
        cur.execute("DELETE FROM backfills WHERE view_name = ?", [table])
    return garbage


def transition(cur: Cursor, view: str, old: BackfillPhase, new: BackfillPhase, **extra: object) -> None:
    """The only place a backfill's phase changes: checked against the table, and against the row."""
    check_transition(view, old, new)
    sets = ", ".join(f"{k} = ?" for k in extra)
    done = cur.execute(
        f"UPDATE backfills SET phase = ?, updated_at = ?{', ' + sets if sets else ''} "
        "WHERE view_name = ? AND phase = ? RETURNING view_name",
        [new.value, time.time(), *extra.values(), view, old.value],
    ).fetchall()
    if not done:
        raise InvariantViolation(f"backfill of {view} is not in phase {old.value} any more")


def needed_from(cur: Cursor, table: str) -> int | None:
    """The oldest epoch whose state of ``table`` an active backfill still reads (its snapshot epoch,
    or in the log-store phase the newest epoch it wrote), or None: retention keeps what follows."""
    row = cur.execute(
        "SELECT min(CASE WHEN phase = 'LOG_STORE' THEN caught_up_epoch ELSE snapshot_epoch END) FROM backfills "
        "WHERE phase IN ('WAITING', 'SNAPSHOT', 'LOG_STORE') AND upstreams LIKE ?",
        [f'%"{table}"%'],
    ).fetchone()
    return row[0] if row else None


def view_files(cur: Cursor, view: str) -> list[str]:
    rows = cur.execute(
        "SELECT location FROM collected WHERE asset = ? AND location IS NOT NULL "
        "UNION SELECT location FROM snapshots WHERE table_name = ?",
        [view, view],
    ).fetchall()
    return [r[0] for r in rows]


def drop_state(cur: Cursor, view: str) -> None:
    """Forget every row of ``view``'s state: its change files, snapshots, retention, alignment."""
    cur.execute("DELETE FROM collected WHERE asset = ?", [view])
    cur.execute("DELETE FROM snapshots WHERE table_name = ?", [view])
    cur.execute("DELETE FROM table_retention WHERE table_name = ?", [view])
    cur.execute("DELETE FROM table_epochs WHERE table_name = ?", [view])


def rename_state(cur: Cursor, table: str, to: str) -> None:
    """Move ``table``'s state rows (change files, snapshots, retention, alignment) to the name ``to``,
    which has none, and forget its backfill, so that ``table`` starts anew. The files stay where
    they are (rows name them by location): a backfill's directory is not listed for deletion, since
    the snapshot it published and the change files it wrote live there."""
    cur.execute("UPDATE collected SET asset = ? WHERE asset = ?", [to, table])
    cur.execute("UPDATE snapshots SET table_name = ? WHERE table_name = ?", [to, table])
    cur.execute("UPDATE table_retention SET table_name = ? WHERE table_name = ?", [to, table])
    cur.execute("UPDATE table_epochs SET table_name = ? WHERE table_name = ?", [to, table])
    _list_dropped(cur, table, forget(cur, [table]))  # what its backfill read from a SOURCE's splits


def _list_dropped(cur: Cursor, table: str, locations: Iterable[str]) -> None:
    """Files for the next run to delete (a transaction cannot: it may roll back)."""
    now = time.time()
    for location in locations:
        cur.execute(
            "INSERT INTO dropped_files (table_name, location, backfill_epoch, dropped_at) VALUES (?, ?, NULL, ?)",
            [table, location, now],
        )


def drop_for_rebuild(cur: Cursor, view: str) -> None:
    """Forget ``view``'s state and backfill so that it backfills afresh, listing the files they
    named, and its backfill's directory, in ``dropped_files``: the transaction cannot delete files
    (it may roll back), so the next run deletes them (``dropped_files`` / ``clear_dropped``)."""
    backfill = read(cur, view)
    garbage = view_files(cur, view)
    drop_state(cur, view)
    garbage += forget(cur, [view])
    _list_dropped(cur, view, garbage)
    if backfill is not None:
        cur.execute(
            "INSERT INTO dropped_files (table_name, location, backfill_epoch, dropped_at) VALUES (?, NULL, ?, ?)",
            [view, backfill.snapshot_epoch, time.time()],
        )


def dropped_files(cur: Cursor) -> tuple[list[str], list[tuple[str, int]]]:
    """What ``drop_for_rebuild`` listed: file locations, and ``(view, snapshot epoch)`` of backfill
    directories. A new backfill of the view at the same snapshot epoch works in the same directory:
    that entry is forgotten here instead."""
    active = {b.view: b.snapshot_epoch for b in all_backfills(cur)}
    for view, epoch in active.items():
        cur.execute("DELETE FROM dropped_files WHERE table_name = ? AND backfill_epoch = ?", [view, epoch])
    rows = cur.execute("SELECT table_name, location, backfill_epoch FROM dropped_files").fetchall()
    locations = [r[1] for r in rows if r[1] is not None]
    roots = sorted({(r[0], r[2]) for r in rows if r[2] is not None})
    return locations, roots


def clear_dropped(cur: Cursor, locations: Iterable[str], roots: Iterable[tuple[str, int]]) -> None:
    """Forget the entries whose files were deleted."""
    for location in locations:
        cur.execute("DELETE FROM dropped_files WHERE location = ?", [location])
    for view, epoch in roots:
        cur.execute("DELETE FROM dropped_files WHERE table_name = ? AND backfill_epoch = ?", [view, epoch])


def retire(cur: Cursor, tables: Iterable[str]) -> list[str]:
    """Views that left the pipeline: every meta-store row of theirs goes; returns their file
    locations for deletion."""
    garbage: list[str] = []
    for table in tables:
        garbage += view_files(cur, table)
        drop_state(cur, table)
        garbage += forget(cur, [table])
        cur.execute("DELETE FROM table_definitions WHERE table_name = ?", [table])
        cur.execute("DELETE FROM source_declarations WHERE source_name = ?", [table])
        cur.execute("DELETE FROM dropped_files WHERE table_name = ?", [table])  # its whole directory goes
    return garbage


def mark_retired(cur: Cursor, tables: Iterable[str]) -> None:
    """``tables`` left the pipeline (their rows go with ``retire``): runs that loaded the pipeline
    before now still name them, and skip them (``aligned``, ``is_retired``)."""
    for table in tables:
        cur.execute("DELETE FROM retired_tables WHERE table_name = ?", [table])
        cur.execute("INSERT INTO retired_tables VALUES (?, ?)", [table, time.time()])
