"""What a backfill's phases share with the runner that drives them: the progress they report, and
``PhaseRunner``, what a phase may ask of the runner (its runtime and controller, the time budget,
the rate limit). The phases (``snapshot_phase``, ``source_splits``) depend on this, not on
``BackfillRunner``, which implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from epochal.checkpoint.backfills.state import VNODES_TOTAL

if TYPE_CHECKING:
    from epochal.checkpoint.controller import CheckpointController
    from epochal.runtime.facade import EpochRuntime


@dataclass
class Progress:
    """What one runner did for one view, for logs and the backfill asset's metadata."""

    view: str
    phase: str = ""
    vnodes_done: int = 0
    rows_read: int = 0
    rows_written: int = 0
    epochs_written: int = 0
    epochs_behind: int | None = None
    seconds: float = 0.0
    joined_epoch: int | None = None
    note: str = ""
    caught_up_epoch: int | None = None
    snapshot_epoch: int | None = None
    #: splits of the SOURCE inputs read from their connector that are done reading, of how many
    splits_done: int = 0
    splits_total: int = 0
    #: seconds spent waiting for live epochs in flight to commit (EPOCHAL_BACKFILL_YIELD_S)
    yielded_s: float = 0.0

    def metadata(self) -> dict[str, Any]:
        rate = round(self.rows_read / self.seconds, 1) if self.seconds > 0 else 0.0
        return {
            "phase": self.phase,
            "vnodes_done": self.vnodes_done,
            "vnodes_total": VNODES_TOTAL,
            "splits_done": self.splits_done,
            "splits_total": self.splits_total,
            "rows_read": self.rows_read,
            "rows_written": self.rows_written,
            "rows_per_second": rate,
            "epochs_written": self.epochs_written,
            "epochs_behind": self.epochs_behind,
            "snapshot_epoch": self.snapshot_epoch,
            "caught_up_epoch": self.caught_up_epoch,
            "joined_epoch": self.joined_epoch,
            "seconds": round(self.seconds, 3),
            "seconds_yielded": round(self.yielded_s, 3),
            "note": self.note,
        }


class PhaseRunner(Protocol):
    runtime: EpochRuntime
    controller: CheckpointController

    def rate_limit(self, view: str) -> float | None:
        """Rows per second the backfill may read (None: unlimited, 0: paused)."""
        ...

    def must_stop(self, view: str, deadline: float, progress: Progress, resumes: str, live_first: bool = False) -> bool:
        """Whether to stop before the next piece of work (time budget used, or paused)."""
        ...

    def throttle(self, view: str, rows: int, seconds: float, deadline: float) -> bool:
        """Sleep so the rows read stay within the rate limit; False when paused."""
        ...
