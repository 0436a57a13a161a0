"""The meta-store side of backfills: which views are backfilling, their progress, the epochs they
have written, and the join. Every step is one transaction, so a runner that dies between two of
them resumes at the last one; the work itself is :mod:`epochal.backfill.runner`.

How a backfill meets the live flow:

* A view with no committed epoch in a pipeline that has one is registered here, in the injection's
  transaction, with the committed epoch as its snapshot epoch. From then on it is outside commit
  alignment (``aligned``): epochs commit without it, and its live steps do nothing.
* Its snapshot rows become a READY snapshot of the view at the snapshot epoch, and every committed
  epoch after it gets a ``collected`` row written by the runner, in order (``record_epoch``).
* ``join`` makes it a table like any other, in the transaction that checks it has written the
  committed epoch: a commit is either before (the view had to write that epoch too) or after it
  (the epoch waits for the view's step).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import epochs as backfill_epochs
from epochal.checkpoint.backfills import split_rows as backfill_splits
from epochal.checkpoint.backfills.control import BackfillControl
from epochal.checkpoint.backfills.rows import COLUMNS, all_backfills, read, transition
from epochal.checkpoint.backfills.rows import aligned as aligned  # re-exported: the epoch log's commit rule
from epochal.checkpoint.backfills.rows import drop_state as drop_state
from epochal.checkpoint.backfills.rows import forget as forget
from epochal.checkpoint.backfills.rows import joined_before as joined_before
from epochal.checkpoint.backfills.rows import needed_from as needed_from
from epochal.checkpoint.backfills.rows import outside_alignment as outside_alignment
from epochal.checkpoint.backfills.rows import retire as retire
from epochal.checkpoint.backfills.splits import SplitBackfill
from epochal.checkpoint.backfills.state import (
    VNODES_TOTAL,
    Backfill,
    BackfillPhase,
    ChunkState,
    VnodeRange,
)
from epochal.checkpoint.records import InvariantViolation, Owner
from epochal.checkpoint.statements import rebuilds
from epochal.connectors.base import SplitRange
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor
from epochal.pipeline.model import STAGE_SEPARATOR

log = logging.getLogger("epochal.backfill")


def _list_old_directory(cur: Cursor, view: str, old_epoch: int) -> None:
    """A backfill's snapshot epoch moved up: its directory under the old one (what a runner killed
    before recording anything left) is deleted by the next injection (``dropped_files``)."""
    cur.execute(
        "INSERT INTO dropped_files (table_name, location, backfill_epoch, dropped_at) VALUES (?, NULL, ?, ?)",
        [view, old_epoch, time.time()],
    )


class BackfillLost(EpochalError):
    """Another runner took the backfill over (this one was silent too long): stop, it goes on."""


def register_new(
    cur: Cursor, tables: Iterable[str], upstreams: Mapping[str, tuple[str, ...]], committed: int | None
) -> list[str]:
    """Start a backfill for every view of ``tables`` (upstreams first) that has no committed epoch
    while the pipeline has one; a new source joins at once (its history is read by the next epoch,
    from its splits' start). Returns the views registered. ``upstreams``: every view's inputs."""
    if committed is None:
        return []
    known = {r[0] for r in cur.execute("SELECT table_name FROM table_epochs").fetchall()}
    backfilling = {b.view: b for b in all_backfills(cur)}
    started: list[str] = []
    now = time.time()
    for table in tables:
        if table in known or table in backfilling:
            continue
        if table not in upstreams:  # a source added to a running pipeline
            cur.execute(
                "INSERT INTO table_epochs (table_name, committed_epoch, registered_at, joined_epoch) "
                "VALUES (?, ?, ?, ?)",
                [table, committed, now, committed],
            )
            known.add(table)
            continue
        inputs = upstreams[table]
        missing = [u for u in inputs if u not in known and u not in backfilling]
        if missing:
            raise InvariantViolation(f"view {table} reads {missing}, which are neither committed nor backfilling")
        waits = any(u in backfilling and backfilling[u].phase.active for u in inputs)
        phase = BackfillPhase.WAITING if waits else BackfillPhase.SNAPSHOT
        cur.execute(
            f"INSERT INTO backfills ({COLUMNS}) VALUES (?, ?, ?, ?, NULL, 0, 0, 0, NULL, ?, ?, NULL, NULL, NULL)",
            [table, json.dumps(list(inputs)), phase.value, committed, now, now],
        )
        backfilling[table] = read(cur, table)  # type: ignore[assignment]
        started.append(table)
    if started:
        log.info("backfill started for %s at snapshot epoch %s", started, committed)
    return started


def status(cur: Cursor) -> dict[str, dict]:
    """Per view: phase, vnodes done, rows, epochs behind (committed epochs it has still to write),
    and the phase of each of its internal stages."""
    committed = q.committed_epoch(cur)
    shown = {b.view: _entry(cur, b, committed) for b in all_backfills(cur)}
    # A changed view's new statement backfills under its shadow name: shown as the view's entry.
    for view, rebuild in rebuilds.active(cur).items():
        if rebuild.shadow in shown:
            shown[view] = {**shown.pop(rebuild.shadow), "rebuild": rebuild.as_status()}
    # A view's internal stages backfill with it, under its asset: shown inside its entry, by phase,
    # with the source splits a stage reads (the stage that reads a SOURCE is the one reading it).
    for name in sorted(shown):
        view = name.split(STAGE_SEPARATOR)[0]
        if view != name and view in shown:
            stage, entry = shown.pop(name), shown[view]
            entry.setdefault("stages", {})[name] = stage["phase"]
            for source, splits in stage.get("splits", {}).items():
                for split, state in splits.items():
                    entry["splits"].setdefault(source, {}).setdefault(split, state)
            entry.update(_split_counts(entry["splits"]))
    return shown


def _entry(cur: Cursor, b: Backfill, committed: int | None) -> dict:
    """One backfill's own status: its progress, epochs behind and source splits."""
    behind = 0 if b.phase is BackfillPhase.JOINED else None
    if b.phase.active and committed is not None:
        since = b.caught_up_epoch if b.caught_up_epoch is not None else -1
        behind = cur.execute(
            "SELECT count(*) FROM epochs WHERE state = 'COMMITTED' AND epoch > ? AND epoch <= ?",
            [since, committed],
        ).fetchone()[0]
    return {**b.as_status(behind), **_split_status(cur, b.view)}


def _split_status(cur: Cursor, view: str) -> dict:
    """The splits of the SOURCEs the view reads from their connector, by source, and how many
    have finished reading (a split reading its history is the only one not done)."""
    splits = backfill_splits.status(cur, view)
    return {"splits": splits, **_split_counts(splits)}


def _split_counts(splits: dict[str, dict[str, dict]]) -> dict[str, int]:
    every = [s for by_split in splits.values() for s in by_split.values()]
    return {"splits_done": sum(1 for s in every if s["phase"] != "backfilling"), "splits_total": len(every)}


class BackfillLog(BackfillControl):
    def __init__(self, backend: Backend, claim_timeout_s: float):
        self.backend = backend
        self.claim_timeout_s = claim_timeout_s
        self.owner = Owner.tag(uuid.uuid4().hex[:8])

    # ------------------------------------------------------------------ reading

    def get(self, view: str) -> Backfill | None:
        return self.backend.transaction(lambda cur: read(cur, view))

    def all(self) -> list[Backfill]:
        return self.backend.transaction(all_backfills)

    def outside_alignment(self) -> set[str]:
        return self.backend.transaction(outside_alignment)

    def status(self) -> dict[str, dict]:
        """Per view, what `epochal status --json` shows under ``backfills``."""
        return self.backend.transaction(status)

    def entry(self, view: str) -> dict:
        """``view``'s own status (a stage's or a shadow's too, which ``status`` shows inside their
        view's entry); empty when it has no backfill."""

        def one(cur: Cursor) -> dict:
            b = read(cur, view)
            return {} if b is None else _entry(cur, b, q.committed_epoch(cur))

        return self.backend.transaction(one)

    def recorded_locations(self, view: str) -> list[str]:
        """Every change-file location recorded for ``view``."""
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT location FROM collected WHERE asset = ? AND location IS NOT NULL", [view]
            ).fetchall()
        )
        return [r[0] for r in rows]

    def done_ranges(self, view: str) -> list[tuple[VnodeRange, str]]:
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT vnode_lo, vnode_hi, nonce FROM backfill_chunks WHERE view_name = ? AND state = ? "
                "ORDER BY vnode_lo",
                [view, ChunkState.DONE.value],
            ).fetchall()
        )
        return [(VnodeRange(lo, hi), nonce) for lo, hi, nonce in rows]

    # ------------------------------------------------------------------ one runner per view

    def claim(self, view: str) -> bool:
        """Take the view's backfill for this process if it is free, ours, or its owner went silent."""

        def take(cur: Cursor) -> bool:
            row = cur.execute("SELECT owner, heartbeat_at FROM backfills WHERE view_name = ?", [view]).fetchone()
            if row is None:
                return False
            owner, beat = row
            if owner and owner != self.owner and self._alive(owner, beat):
                return False
            cur.execute(
                "UPDATE backfills SET owner = ?, heartbeat_at = ? WHERE view_name = ?", [self.owner, time.time(), view]
            )
            return True

        return self.backend.transaction(take)

    def _alive(self, owner: str | None, beat: float | None) -> bool:
        """Whether the runner ``owner``, which renewed its claim at ``beat``, still holds it: it
        renewed within the claim timeout and, on this host, its process is alive."""
        if not owner or beat is None or time.time() - beat > self.claim_timeout_s:
            return False
        host, _, rest = owner.partition(":")
        return not Owner.dead(host, rest.partition(":")[0])

    def held(self, views: Iterable[str]) -> list[str]:
        """Of ``views``, those whose backfill a live runner holds now (it may be writing one of
        their epochs)."""
        names = list(views)
        if not names:
            return []
        marks = ", ".join("?" for _ in names)
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                f"SELECT view_name, owner, heartbeat_at FROM backfills WHERE view_name IN ({marks})", names
            ).fetchall()
        )
        return sorted(r[0] for r in rows if self._alive(r[1], r[2]))

    def renew(self, view: str) -> bool:
        return bool(
            self.backend.transaction(
                lambda cur: cur.execute(
                    "UPDATE backfills SET heartbeat_at = ? WHERE view_name = ? AND owner = ? RETURNING view_name",
                    [time.time(), view, self.owner],
                ).fetchall()
            )
        )

    def release(self, view: str) -> None:
        self.backend.transaction(
            lambda cur: cur.execute(
                "UPDATE backfills SET owner = NULL WHERE view_name = ? AND owner = ?", [view, self.owner]
            )
        )

    def check_owner(self, view: str) -> Backfill:
        """The view's backfill, or BackfillLost if this runner no longer owns it."""
        return self.backend.transaction(lambda cur: self._check_owner(cur, view))

    def _check_owner(self, cur: Cursor, view: str) -> Backfill:
        row = cur.execute("SELECT owner FROM backfills WHERE view_name = ?", [view]).fetchone()
        if row is None or row[0] != self.owner:
            raise BackfillLost(f"the backfill of {view} was taken over by another runner (or cancelled)")
        found = read(cur, view)
        if found is None:
            raise BackfillLost(f"the backfill of {view} was cancelled")
        return found

    # ------------------------------------------------------------------ phases

    def start_snapshot(self, view: str) -> bool:
        """WAITING -> SNAPSHOT once every backfilling upstream has written the latest of its own
        snapshot epoch and theirs, which becomes its snapshot epoch (theirs may have moved up)."""

        def move(cur: Cursor) -> bool:
            b = self._check_owner(cur, view)
            if b.phase is not BackfillPhase.WAITING:
                return b.phase is BackfillPhase.SNAPSHOT
            backfilled = [o for o in (read(cur, u) for u in b.upstreams) if o is not None]
            # An input that was backfilled has state from its snapshot epoch on, which moved up if
            # its work began after this view was registered (``refresh_snapshot``), joined or not:
            # wait for the latest of them, which this view's snapshot epoch then moves to.
            target = max([b.snapshot_epoch, *(o.snapshot_epoch for o in backfilled)])
            for other in backfilled:
                if other.phase is BackfillPhase.JOINED:
                    continue
                if other.phase is BackfillPhase.CANCELLED:
                    raise EpochalError(
                        f"view {view} reads {other.view}, whose backfill was cancelled: restart it with "
                        f"`epochal backfill {other.view} --restart`, or remove {view}"
                    )
                if other.caught_up_epoch is None or other.caught_up_epoch < target:
                    return False
            transition(cur, view, BackfillPhase.WAITING, BackfillPhase.SNAPSHOT, snapshot_epoch=target)
            if target > b.snapshot_epoch:  # (as every move of it: the old epoch's directory goes)
                _list_old_directory(cur, view, b.snapshot_epoch)
            return True

        return self.backend.transaction(move)

    def refresh_snapshot(self, view: str) -> tuple[int, int] | None:
        """Before the snapshot phase has written anything, move its snapshot epoch up to the newest
        epoch every input can be read at: the committed epoch, or a backfilling input's last written
        one. Each epoch between registration and the first range would otherwise be one more epoch
        of the log-store phase, a Spark epoch each, where reading the inputs at a later epoch costs
        nothing more. Returns (old, new), or None when it stays. The old epoch's backfill directory
        (what a runner killed in its first range left) is listed for deletion in ``dropped_files``."""

        def move(cur: Cursor) -> tuple[int, int] | None:
            b = self._check_owner(cur, view)
            if b.phase is not BackfillPhase.SNAPSHOT:
                return None
            started = cur.execute(
                "SELECT (SELECT count(*) FROM backfill_chunks WHERE view_name = ?) "
                "+ (SELECT count(*) FROM backfill_splits WHERE view_name = ?)",
                [view, view],
            ).fetchone()[0]
            decided = cur.execute("SELECT split_sources FROM backfills WHERE view_name = ?", [view]).fetchone()[0]
            newest = q.committed_epoch(cur)
            if started or decided is not None or newest is None:
                return None  # (split offsets and written ranges are at the epoch they were read at)
            earliest = b.snapshot_epoch  # where every input can be read from
            for upstream in b.upstreams:
                other = read(cur, upstream)
                if other is None:
                    continue
                earliest = max(earliest, other.snapshot_epoch)  # (no state before it, joined or not)
                if other.phase is BackfillPhase.JOINED:
                    continue
                if other.phase is BackfillPhase.CANCELLED or other.caught_up_epoch is None:
                    return None
                newest = min(newest, other.caught_up_epoch)
            if newest < earliest:
                raise InvariantViolation(
                    f"backfill of {view} would read its inputs at epoch {newest}, before a backfilling "
                    f"input's snapshot epoch {earliest}"
                )
            if newest <= b.snapshot_epoch:
                return None
            now = time.time()
            cur.execute(
                "UPDATE backfills SET snapshot_epoch = ?, updated_at = ?, heartbeat_at = ? WHERE view_name = ?",
                [newest, now, now, view],
            )
            _list_old_directory(cur, view, b.snapshot_epoch)
            return b.snapshot_epoch, newest

        return self.backend.transaction(move)

    def record_chunk(self, view: str, vnodes: VnodeRange, nonce: str, rows_read: int, rows_written: int) -> None:
        """A vnode range's rows are in place under ``nonce``: recorded DONE, with the progress."""

        def record(cur: Cursor) -> None:
            b = self._check_owner(cur, view)
            if b.phase is not BackfillPhase.SNAPSHOT:
                raise InvariantViolation(f"backfill of {view} records a vnode range in phase {b.phase.value}")
            cur.execute(
                "INSERT INTO backfill_chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [view, vnodes.lo, vnodes.hi, ChunkState.DONE.value, nonce, rows_read, rows_written, time.time()],
            )
            cur.execute(
                "UPDATE backfills SET vnodes_done = vnodes_done + ?, rows_read = rows_read + ?, "
                "rows_written = rows_written + ?, updated_at = ?, heartbeat_at = ? WHERE view_name = ?",
                [vnodes.size, rows_read, rows_written, time.time(), time.time(), view],
            )

        self.backend.transaction(record)

    def finish_snapshot(
        self, view: str, location: str, distribution_key: tuple[str, ...], schema: str, rows: int, files: int
    ) -> None:
        """Publish the snapshot rows as the view's READY snapshot at the snapshot epoch and move to
        the log-store phase, in one transaction: a reader sees the view's state at that epoch."""

        def finish(cur: Cursor) -> None:
            b = self._check_owner(cur, view)
            done = cur.execute(
                "SELECT coalesce(sum(vnode_hi - vnode_lo), 0) FROM backfill_chunks WHERE view_name = ? AND state = ?",
                [view, ChunkState.DONE.value],
            ).fetchone()[0]
            if done != VNODES_TOTAL:
                raise InvariantViolation(f"backfill of {view} publishes its snapshot with {done} vnodes written")
            now = time.time()
            cur.execute("DELETE FROM snapshots WHERE table_name = ?", [view])
            cur.execute(
                "INSERT INTO snapshots (location, table_name, epoch, state, distribution_key, spark_schema, rows_out, "
                "files_out, owner_host, owner_pid, started_at, finished_at, heartbeat_at) "
                "VALUES (?, ?, ?, 'READY', ?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
                [location, view, b.snapshot_epoch, json.dumps(list(distribution_key)), schema, rows, files]
                + [b.started_at, now, now],
            )
            transition(
                cur,
                view,
                BackfillPhase.SNAPSHOT,
                BackfillPhase.LOG_STORE,
                caught_up_epoch=b.snapshot_epoch,
                snapshot_location=location,
            )

        self.backend.transaction(finish)

    # ------------------------------------------------------------------ source splits (backfill_splits)

    def begin_splits(self, view: str, candidates: list[str], vnodes_started: bool) -> list[str]:
        """The SOURCE inputs the view reads from their splits (decided once, splits started)."""

        def begin(cur: Cursor) -> list[str]:
            b = self._check_owner(cur, view)
            return backfill_splits.begin(cur, view, b.snapshot_epoch, candidates, vnodes_started)

        return self.backend.transaction(begin)

    def split_sources(self, view: str) -> list[str] | None:
        """The inputs the view reads from their splits; None while undecided."""
        return self.backend.transaction(lambda cur: backfill_splits.sources(cur, view))

    def split_states(self, view: str) -> list[SplitBackfill]:
        return self.backend.transaction(lambda cur: backfill_splits.states(cur, view))

    def split_chunks(self, view: str, source: str | None = None) -> list[str]:
        """The files of the chunks read from the splits (of ``source``) so far."""
        return self.backend.transaction(lambda cur: backfill_splits.chunk_locations(cur, view, source))

    def record_split_read(
        self, view: str, state: SplitBackfill, chunk: SplitRange, rows: int, location: str
    ) -> SplitBackfill:
        def record(cur: Cursor) -> SplitBackfill:
            b = self._check_owner(cur, view)
            if b.phase is not BackfillPhase.SNAPSHOT:
                raise InvariantViolation(f"backfill of {view} reads a source split in phase {b.phase.value}")
            return backfill_splits.record_read(cur, view, state, chunk, rows, location)

        return self.backend.transaction(record)

    def next_epoch(self, view: str) -> int | None:
        """The next committed epoch the view has to write in the log-store phase, or None when it
        has written the committed epoch."""
        return self.backend.transaction(lambda cur: backfill_epochs.next_epoch(cur, read(cur, view)))

    def record_epoch(
        self, view: str, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
    ) -> None:
        """The view's change for committed ``epoch`` is written (``backfill_epochs.record``)."""
        self.backend.transaction(
            lambda cur: backfill_epochs.record(
                cur, self._check_owner(cur, view), epoch, location, rows_in, rows_out, seconds
            )
        )

    def adopt_written(self, view: str, epoch: int) -> bool:
        """Move over a committed epoch written ahead (``backfill_epochs.adopt``); False when it was not."""
        return self.backend.transaction(lambda cur: backfill_epochs.adopt(cur, self._check_owner(cur, view), epoch))

    def record_ahead(
        self, view: str, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
    ) -> None:
        """An in-flight epoch of the view written ahead of its position (``backfill_epochs.record_ahead``)."""
        self.backend.transaction(
            lambda cur: backfill_epochs.record_ahead(
                cur, self._check_owner(cur, view), epoch, location, rows_in, rows_out, seconds
            )
        )

    def join(self, view: str) -> tuple[bool, list[int]]:
        """LOG_STORE -> JOINED if the view has written the committed epoch, with the in-flight epochs
        it must now write itself (their live step ran while it was outside alignment; from this
        transaction on their commit waits for it). (False, []) when an epoch committed meanwhile."""

        def attempt(cur: Cursor) -> tuple[bool, list[int]]:
            b = self._check_owner(cur, view)
            committed = q.committed_epoch(cur)
            if b.phase is not BackfillPhase.LOG_STORE or b.caught_up_epoch != committed:
                return False, []
            # In-flight epochs whose live step of the view already ran (and skipped it): its
            # inputs have written them. One whose inputs have not is still ahead of its live step,
            # which finds the view joined and runs it.
            pending = []
            for r in q.in_flight(cur):
                done = {a for (a,) in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [r.epoch]).fetchall()}
                if view not in done and set(b.upstreams) <= done:
                    pending.append(r.epoch)
            transition(cur, view, BackfillPhase.LOG_STORE, BackfillPhase.JOINED, joined_epoch=committed)
            cur.execute("UPDATE backfills SET joined_at = ? WHERE view_name = ?", [time.time(), view])
            backfill_splits.on_join(cur, view)
            cur.execute(
                "INSERT INTO table_epochs (table_name, committed_epoch) VALUES (?, ?) "
                "ON CONFLICT (table_name) DO UPDATE SET committed_epoch = excluded.committed_epoch",
                [view, committed],
            )
            return True, pending

        return self.backend.transaction(attempt)
