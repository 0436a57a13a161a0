"""Rebuilding a view whose statement changed, while its old rows keep serving (the meta-store side;
the work is :mod:`epochal.runtime.rebuild_step` and the shadow's backfill).

A view that has committed epochs and whose statement changes is not dropped. Its stored rows stay
what readers, sinks and the views built on it see, and its live steps keep maintaining them with the
old statement (``OldRows.MAINTAINED``), found by its fingerprint in ``view_statements``. Where that
cannot be (the old statement was split into internal stages, reads a table that left the pipeline
or is being rebuilt itself), they serve frozen at the last epoch they were maintained
(``OldRows.FROZEN``). The new statement backfills under a shadow name
(``shadow_name(view)``), from a snapshot and the change log, like any new view. Once the shadow has
written the epoch before an epoch J, the view's own step of J switches: its change at J is the new
rows at J minus the old rows at J-1, and a snapshot of the new rows at J is its state from J on.
Readers, sinks and downstream views therefore move from the old version to the new one at one
epoch boundary, and receive exactly the difference. If J is aborted, recovery takes the switch back.

States, one row per view in ``view_rebuilds``, with the one rule per transition (``check_rebuild``):

* SERVING_OLD -> SWITCHED: the view's step of epoch J wrote the difference and the snapshot.
* SWITCHED -> SERVING_OLD: recovery aborted J; the next epoch switches again.
* SWITCHED -> DONE: J committed; the shadow's rows and files go, the new statement is the view's.
* a new row replaces a DONE one when the statement changes again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass

from epochal.checkpoint import retired_files
from epochal.checkpoint.records import InvariantViolation
from epochal.meta.backend import Cursor
from epochal.pipeline.model import REBUILD_SEPARATOR


def shadow_name(view: str) -> str:
    return f"{view}{REBUILD_SEPARATOR}"


def rebuilt_view(name: str) -> str | None:
    """The view ``name`` is the shadow of, or None."""
    return name[: -len(REBUILD_SEPARATOR)] if name.endswith(REBUILD_SEPARATOR) else None


class RebuildState(enum.Enum):
    #: the old rows serve (frozen); the new statement backfills under the shadow name
    SERVING_OLD = "SERVING_OLD"
    #: the view's step of ``switched_epoch`` wrote new - old and the new snapshot; not committed yet
    SWITCHED = "SWITCHED"
    #: the switch committed: the new statement is the view's, the shadow is gone
    DONE = "DONE"

    @property
    def active(self) -> bool:
        return self is not RebuildState.DONE


REBUILD_TRANSITIONS: dict[RebuildState, frozenset[RebuildState]] = {
    RebuildState.SERVING_OLD: frozenset({RebuildState.SWITCHED}),
    RebuildState.SWITCHED: frozenset({RebuildState.SERVING_OLD, RebuildState.DONE}),
    RebuildState.DONE: frozenset(),
}


def check_rebuild(view: str, old: RebuildState, new: RebuildState) -> None:
    if new not in REBUILD_TRANSITIONS[old]:
        raise InvariantViolation(f"the rebuild of {view} cannot move from {old.value} to {new.value}")


class OldRows(enum.Enum):
    """How the old rows serve while the new statement backfills. A version is consistent only if
    every epoch since the change was applied to it: once frozen, the old rows never resume."""

    #: no step has served them yet: the first decides
    PENDING = "PENDING"
    #: each epoch's step runs the old statement: readers and sinks see it move
    MAINTAINED = "MAINTAINED"
    #: the rows of the last epoch they were maintained at (a rebuild from before maintenance too)
    FROZEN = "FROZEN"


OLD_ROWS_TRANSITIONS: dict[OldRows, frozenset[OldRows]] = {
    OldRows.PENDING: frozenset({OldRows.MAINTAINED, OldRows.FROZEN}),
    OldRows.MAINTAINED: frozenset({OldRows.FROZEN}),
    OldRows.FROZEN: frozenset(),
}


def set_old_rows(cur: Cursor, view: str, old: OldRows, new: OldRows) -> None:
    """The only place the old rows' mode changes: checked against the table and against the row."""
    if new not in OLD_ROWS_TRANSITIONS[old]:
        raise InvariantViolation(f"the old rows of {view} cannot move from {old.value} to {new.value}")
    # (a row from before the column existed holds NULL, which reads as FROZEN and never moves)
    done = cur.execute(
        "UPDATE view_rebuilds SET old_rows = ?, updated_at = ? WHERE view_name = ? AND old_rows = ? "
        "RETURNING view_name",
        [new.value, time.time(), view, old.value],
    ).fetchall()
    if not done:
        raise InvariantViolation(f"the old rows of {view} are not {old.value} any more")


def decide_old_rows(cur: Cursor, view: str, wanted: OldRows) -> OldRows:
    """Move the old rows to ``wanted`` if that is a move from what the row holds now, in this
    transaction; returns what they hold afterwards. Steps of several epochs (other runs) may ask at
    once, each having read PENDING: the first decides, and the others take its decision rather
    than fail (MAINTAINED then FROZEN is still a move; FROZEN never becomes MAINTAINED)."""
    found = read(cur, view)
    if found is None:
        raise InvariantViolation(f"the old rows of {view} serve no rebuild any more")
    if found.old_rows is wanted or wanted not in OLD_ROWS_TRANSITIONS[found.old_rows]:
        return found.old_rows
    set_old_rows(cur, view, found.old_rows, wanted)
    return wanted


@dataclass(frozen=True)
class Rebuild:
    view: str
    state: RebuildState
    #: the fingerprint of the statement the stored rows come from, and of the one being built
    old_fingerprint: str
    new_fingerprint: str
    #: the committed epoch when the statement changed (frozen old rows are those of it, or later)
    frozen_epoch: int
    switched_epoch: int | None
    #: the new statement's snapshot of the view at ``switched_epoch``
    switch_snapshot: str | None
    started_at: float
    #: why the switch is held (the view keeps serving its old rows), or None
    held: str | None = None
    old_rows: OldRows = OldRows.FROZEN
    #: when ``new_fingerprint`` was set (None: a rebuild recorded before this was kept)
    fingerprint_at: float | None = None

    @property
    def shadow(self) -> str:
        return shadow_name(self.view)

    @property
    def new_statement(self) -> tuple[str, float]:
        """The statement being built, and when it was recorded (a rebuild kept from before that
        time was recorded: when it started)."""
        return self.new_fingerprint, self.fingerprint_at or self.started_at

    def as_status(self) -> dict:
        return {
            "state": self.state.value.lower(),
            "serving": "old statement" if self.state is RebuildState.SERVING_OLD else "new statement",
            "frozen_epoch": self.frozen_epoch,
            "switched_epoch": self.switched_epoch,
            "held": self.held,
            "old_rows": self.old_rows.value.lower(),
        }


_COLUMNS = (
    "view_name, state, old_fingerprint, new_fingerprint, frozen_epoch, switched_epoch, switch_snapshot, started_at, "
    "held, old_rows, fingerprint_at"
)


def _record(row: tuple) -> Rebuild:
    old_rows = OldRows(row[9]) if row[9] else OldRows.FROZEN
    return Rebuild(
        row[0], RebuildState(row[1]), row[2], row[3], row[4], row[5], row[6], row[7], row[8], old_rows, row[10]
    )


def read(cur: Cursor, view: str) -> Rebuild | None:
    row = cur.execute(f"SELECT {_COLUMNS} FROM view_rebuilds WHERE view_name = ?", [view]).fetchone()
    return _record(row) if row else None


def active(cur: Cursor) -> dict[str, Rebuild]:
    rows = cur.execute(f"SELECT {_COLUMNS} FROM view_rebuilds WHERE state <> ?", [RebuildState.DONE.value])
    return {r.view: r for r in map(_record, rows.fetchall())}


def hold(cur: Cursor, view: str, reason: str | None) -> None:
    """Record why the view's switch waits (None: nothing holds it). Not a state: the old rows serve
    as in SERVING_OLD, and the switch goes ahead once a new statement removes the reason."""
    cur.execute(
        "UPDATE view_rebuilds SET held = ? WHERE view_name = ? AND state = ? AND held IS DISTINCT FROM ?",
        [reason, view, RebuildState.SERVING_OLD.value, reason],
    )


def _move(cur: Cursor, view: str, old: RebuildState, new: RebuildState, **extra: object) -> None:
    """The only place a rebuild's state changes: checked against the table, and against the row."""
    check_rebuild(view, old, new)
    sets = "".join(f", {k} = ?" for k in extra)
    done = cur.execute(
        f"UPDATE view_rebuilds SET state = ?, updated_at = ?{sets} WHERE view_name = ? AND state = ? "
        "RETURNING view_name",
        [new.value, time.time(), *extra.values(), view, old.value],
    ).fetchall()
    if not done:
        raise InvariantViolation(f"the rebuild of {view} is not {old.value} any more")


def start(cur: Cursor, view: str, old_fingerprint: str, new_fingerprint: str, frozen_epoch: int) -> None:
    now = time.time()
    cur.execute("DELETE FROM view_rebuilds WHERE view_name = ?", [view])
    cur.execute(
        f"INSERT INTO view_rebuilds ({_COLUMNS}, updated_at) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, NULL, ?, ?, ?)",
        [
            view,
            RebuildState.SERVING_OLD.value,
            old_fingerprint,
            new_fingerprint,
            frozen_epoch,
            now,
            OldRows.PENDING.value,
            now,
            now,
        ],
    )


def restart(cur: Cursor, view: str, new_fingerprint: str) -> None:
    """The statement changed again while the shadow was backfilling: it starts over from it."""
    now = time.time()
    cur.execute(
        "UPDATE view_rebuilds SET new_fingerprint = ?, held = NULL, updated_at = ?, fingerprint_at = ? "
        "WHERE view_name = ? AND state = ?",
        [new_fingerprint, now, now, view, RebuildState.SERVING_OLD.value],
    )


def switch(cur: Cursor, view: str, epoch: int, snapshot: str, rows: int, files: int) -> None:
    """SERVING_OLD -> SWITCHED at ``epoch``: the new rows' snapshot (announced WRITING at
    ``snapshot``) becomes the view's state at that epoch, READY in this transaction; readers of
    earlier epochs still see the old rows. Taken back by ``revert_aborted`` if the epoch is aborted.
    An earlier attempt of the same step (its run retried it) leaves a snapshot that a step of a
    later epoch, in another run, may be scanning: it is retired, not deleted (see retired_files)."""
    rebuild = read(cur, view)
    if rebuild is None:
        raise InvariantViolation(f"{view} switches to its new statement without a rebuild")
    if rebuild.state is RebuildState.SWITCHED and rebuild.switched_epoch == epoch and rebuild.switch_snapshot:
        # The same step again: the earlier attempt's snapshot is replaced.
        cur.execute("DELETE FROM snapshots WHERE location = ?", [rebuild.switch_snapshot])
        retired_files.retire(cur, view, [rebuild.switch_snapshot])
        _move(cur, view, RebuildState.SWITCHED, RebuildState.SERVING_OLD, switched_epoch=None, switch_snapshot=None)
    published = cur.execute(
        "UPDATE snapshots SET state = 'READY', rows_out = ?, files_out = ?, finished_at = ?, owner_pid = NULL "
        "WHERE location = ? AND state = 'WRITING' RETURNING location",
        [rows, files, time.time(), snapshot],
    ).fetchall()
    if not published:
        raise InvariantViolation(
            f"the snapshot of {view}'s new statement at epoch {epoch} was reaped while it was written (its lease "
            "ran out): the step fails, and the epoch's retry writes it again"
        )
    _move(cur, view, RebuildState.SERVING_OLD, RebuildState.SWITCHED, switched_epoch=epoch, switch_snapshot=snapshot)


#: The most epochs a view's step writes of its new statement to switch at once (``switch_gap``).
#: A busy pipeline keeps epochs in flight, and the shadow's backfill writes committed epochs only:
#: without writing the last ones itself, the step would never find the shadow caught up.
SWITCH_GAP_MAX = 4


def switch_gap(cur: Cursor, view: str, epoch: int, inputs: Iterable[str]) -> list[int] | None:
    """Whether the view's step of ``epoch`` can switch, and the epochs before it that the new
    statement must first write (in order): the non-aborted epochs after the shadow's log-store
    position that it has not written, committed or in flight. None when it cannot switch yet: the
    shadow is not in its log-store phase, the gap is over ``SWITCH_GAP_MAX``, or an input has not
    written a gap epoch (its step may still be running). A switched step that is run again can."""
    rebuild = read(cur, view)
    if rebuild is None or not rebuild.state.active:
        return None
    if rebuild.state is RebuildState.SWITCHED:
        return [] if rebuild.switched_epoch == epoch else None
    row = cur.execute("SELECT phase, caught_up_epoch FROM backfills WHERE view_name = ?", [rebuild.shadow]).fetchone()
    if row is None or row[0] != "LOG_STORE" or row[1] is None:
        return None
    gap = [
        e
        for (e,) in cur.execute(
            "SELECT epoch FROM epochs WHERE epoch > ? AND epoch < ? AND state <> 'ABORTED' "
            "AND epoch NOT IN (SELECT epoch FROM collected WHERE asset = ?) ORDER BY epoch",
            [row[1], epoch, rebuild.shadow],
        ).fetchall()
    ]
    if len(gap) > SWITCH_GAP_MAX:
        return None
    needed = sorted(set(inputs))
    if gap and needed:
        # Every (gap epoch, input) pair must have a collected row: one count over both lists.
        epochs_in = ", ".join("?" * len(gap))
        assets_in = ", ".join("?" * len(needed))
        (written,) = cur.execute(
            f"SELECT count(*) FROM (SELECT DISTINCT epoch, asset FROM collected "
            f"WHERE epoch IN ({epochs_in}) AND asset IN ({assets_in})) AS written",
            [*gap, *needed],
        ).fetchone()
        if written < len(gap) * len(needed):
            return None
    return gap


def revert_aborted(cur: Cursor, committed: int | None) -> list[str]:
    """Recovery: a switch at an epoch that was aborted is taken back (its snapshot row goes; the
    locations returned are deleted). The old rows serve again, and a later epoch switches."""
    garbage: list[str] = []
    for rebuild in active(cur).values():
        if rebuild.state is not RebuildState.SWITCHED:
            continue
        if committed is not None and rebuild.switched_epoch is not None and rebuild.switched_epoch <= committed:
            continue
        if rebuild.switch_snapshot:
            cur.execute("DELETE FROM snapshots WHERE location = ?", [rebuild.switch_snapshot])
            garbage.append(rebuild.switch_snapshot)
        back = {"switched_epoch": None, "switch_snapshot": None}
        _move(cur, rebuild.view, RebuildState.SWITCHED, RebuildState.SERVING_OLD, **back)
    return garbage


def finish_committed(cur: Cursor, committed: int | None) -> list[str]:
    """SWITCHED -> DONE for every switch whose epoch committed, with the new fingerprint as the
    view's definition; returns the shadows, whose rows and files the caller retires."""
    if committed is None:
        return []
    done = []
    for rebuild in active(cur).values():
        if rebuild.state is RebuildState.SWITCHED and rebuild.switched_epoch is not None:
            if rebuild.switched_epoch <= committed:
                _move(cur, rebuild.view, RebuildState.SWITCHED, RebuildState.DONE)
                # (its columns are filled in by the next injection, which knows the new statement's)
                cur.execute(
                    # (recorded when the new statement was: a process that read its files since holds it)
                    "UPDATE table_definitions SET fingerprint = ?, columns = NULL, recorded_at = ? "
                    "WHERE table_name = ?",
                    [*rebuild.new_statement, rebuild.view],
                )
                done.append(rebuild.shadow)
    return done


def forget(cur: Cursor, views: Iterable[str]) -> None:
    for view in views:
        cur.execute("DELETE FROM view_rebuilds WHERE view_name = ?", [view])
