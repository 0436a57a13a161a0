"""The controller's backfill methods (``BackfillLog``): a backfill's state, its runner's claim, the
snapshot and split phases' progress, the log-store epochs, the join, and a user's controls."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.checkpoint.backfills.log import BackfillLog
    from epochal.checkpoint.backfills.splits import SplitBackfill
    from epochal.checkpoint.backfills.state import Backfill, VnodeRange
    from epochal.connectors.base import SplitRange


class BackfillMethods:
    backfills: BackfillLog

    # ------------------------------------------------------------------ reading

    def backfill(self, view: str) -> Backfill | None:
        """``view``'s backfill, or None if it never backfilled."""
        return self.backfills.get(view)

    def all_backfills(self) -> list[Backfill]:
        """Every backfill the meta store holds, joined ones included."""
        return self.backfills.all()

    def outside_alignment(self) -> set[str]:
        """Views whose backfill has not joined: epochs commit without them."""
        return self.backfills.outside_alignment()

    def backfill_status(self) -> dict[str, dict]:
        """Per view, what `epochal status --json` shows under ``backfills``."""
        return self.backfills.status()

    def backfill_entry(self, view: str) -> dict:
        """``view``'s own status entry (a stage's or a shadow's too)."""
        return self.backfills.entry(view)

    def backfill_locations(self, view: str) -> list[str]:
        """Every change-file location recorded for ``view``'s backfill."""
        return self.backfills.recorded_locations(view)

    def backfill_done_ranges(self, view: str) -> list[tuple[VnodeRange, str]]:
        """The vnode ranges the snapshot phase has written, with their nonces."""
        return self.backfills.done_ranges(view)

    # ------------------------------------------------------------------ the runner's claim

    def claim_backfill(self, view: str) -> bool:
        """Take the view's backfill for this process if it is free, ours, or its owner went silent."""
        return self.backfills.claim(view)

    def renew_backfill(self, view: str) -> bool:
        """Renew this process's claim; False when another runner took it."""
        return self.backfills.renew(view)

    def release_backfill(self, view: str) -> None:
        """End this process's claim on the view's backfill."""
        self.backfills.release(view)

    def check_backfill_owner(self, view: str) -> Backfill:
        """The view's backfill, or BackfillLost if this runner no longer owns it."""
        return self.backfills.check_owner(view)

    def backfills_held(self, views: Iterable[str]) -> list[str]:
        """Of ``views``, those whose backfill a live runner holds now."""
        return self.backfills.held(views)

    # ------------------------------------------------------------------ snapshot and split phases

    def start_backfill_snapshot(self, view: str) -> bool:
        """WAITING -> SNAPSHOT once every backfilling upstream has written its snapshot epoch."""
        return self.backfills.start_snapshot(view)

    def refresh_backfill_snapshot(self, view: str) -> tuple[int, int] | None:
        """Before the snapshot phase wrote anything, move its snapshot epoch up to the newest epoch every
        input can be read at; returns (old, new) when it moved."""
        return self.backfills.refresh_snapshot(view)

    def record_backfill_chunk(
        self, view: str, vnodes: VnodeRange, nonce: str, rows_read: int, rows_written: int
    ) -> None:
        """A vnode range's rows are in place under ``nonce``: recorded DONE, with the progress."""
        self.backfills.record_chunk(view, vnodes, nonce, rows_read, rows_written)

    def finish_backfill_snapshot(
        self, view: str, location: str, distribution_key: tuple[str, ...], schema: str, rows: int, files: int
    ) -> None:
        """Publish the snapshot rows as the view's snapshot at the snapshot epoch and move to the
        log-store phase, in one transaction."""
        self.backfills.finish_snapshot(view, location, distribution_key, schema, rows, files)

    def begin_backfill_splits(self, view: str, candidates: list[str], vnodes_started: bool) -> list[str]:
        """The SOURCE inputs the view reads from their splits (decided once, splits started)."""
        return self.backfills.begin_splits(view, candidates, vnodes_started)

    def backfill_split_states(self, view: str) -> list[SplitBackfill]:
        """Every split's backfill state of the view."""
        return self.backfills.split_states(view)

    def backfill_split_chunks(self, view: str, source: str | None = None) -> list[str]:
        """The files of the chunks read from the splits (of ``source``) so far."""
        return self.backfills.split_chunks(view, source)

    def record_backfill_split_read(
        self, view: str, state: SplitBackfill, chunk: SplitRange, rows: int, location: str
    ) -> SplitBackfill:
        """A chunk of a split read and written to ``location``; returns the split's new state."""
        return self.backfills.record_split_read(view, state, chunk, rows, location)

    # ------------------------------------------------------------------ log-store phase and join

    def next_backfill_epoch(self, view: str) -> int | None:
        """The next committed epoch the view writes in the log-store phase, or None when it has
        written the committed epoch."""
        return self.backfills.next_epoch(view)

    def record_backfill_epoch(
        self, view: str, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
    ) -> None:
        """The view's change for committed ``epoch`` is written."""
        self.backfills.record_epoch(view, epoch, location, rows_in, rows_out, seconds)

    def adopt_backfill_written(self, view: str, epoch: int) -> bool:
        """Move over a committed epoch written ahead; False when it was not."""
        return self.backfills.adopt_written(view, epoch)

    def record_backfill_ahead(
        self, view: str, epoch: int, location: str | None, rows_in: int, rows_out: int, seconds: float
    ) -> None:
        """An in-flight epoch of the view written ahead of its position."""
        self.backfills.record_ahead(view, epoch, location, rows_in, rows_out, seconds)

    def join_backfill(self, view: str) -> tuple[bool, list[int]]:
        """LOG_STORE -> JOINED if the view has written the committed epoch, with the in-flight epochs it
        must now write itself."""
        return self.backfills.join(view)

    # ------------------------------------------------------------------ a user's controls

    def backfill_rate_limit(self, view: str) -> float | None:
        """Rows per second the backfill may read (None: unlimited, 0: paused)."""
        return self.backfills.rate_limit(view)

    def set_backfill_rate_limit(self, view: str, rows_per_second: float | None) -> Backfill:
        """Set the backfill's rate limit (None: unlimited, 0: pause)."""
        return self.backfills.set_rate_limit(view, rows_per_second)

    def record_backfill_error(self, view: str, error: str | None) -> None:
        """What stopped the backfill last (None: it went on)."""
        self.backfills.record_error(view, error)

    def cancel_backfill(self, view: str) -> tuple[Backfill, list[str]]:
        """Stop the backfill and forget its partial state; returns it and the locations to delete."""
        return self.backfills.cancel(view)

    def restart_backfill(self, view: str) -> list[str]:
        """Forget a cancelled (or stuck) backfill: the next injection starts it from a new snapshot."""
        return self.backfills.restart(view)

    def rebuild_backfill(self, view: str, readers: list[str]) -> list[str]:
        """Drop a joined view's state so the next injection backfills it again; refused while
        ``readers`` read it. Returns the locations to delete."""
        return self.backfills.rebuild(view, readers)
