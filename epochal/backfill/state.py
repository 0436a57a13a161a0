"""The states of a backfill and of its vnode ranges, with the one rule per transition.

Plain data: the meta-store side is :mod:`epochal.checkpoint.backfill_log`, the work
:mod:`epochal.backfill.runner`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from epochal.checkpoint.records import InvariantViolation

#: vnodes of the key space a snapshot phase walks (the same count as snapshots use)
VNODES_TOTAL = 256


class BackfillPhase(enum.Enum):
    #: an upstream is itself backfilling and has not reached this backfill's snapshot epoch yet
    WAITING = "WAITING"
    #: the view's rows at the snapshot epoch are computed, one vnode range at a time
    SNAPSHOT = "SNAPSHOT"
    #: the view consumes its inputs' committed change logs, epoch by epoch, up to the committed epoch
    LOG_STORE = "LOG_STORE"
    #: caught up at an epoch boundary: committed with every other table from then on
    JOINED = "JOINED"
    #: `epochal backfill VIEW --cancel`: the view's partial state is deleted; it stays out of the flow
    CANCELLED = "CANCELLED"

    @property
    def active(self) -> bool:
        return self in (BackfillPhase.WAITING, BackfillPhase.SNAPSHOT, BackfillPhase.LOG_STORE)

    @property
    def shown(self) -> str:
        """The phase as `epochal status --json` names it."""
        return {
            BackfillPhase.WAITING: "waiting",
            BackfillPhase.SNAPSHOT: "snapshot",
            BackfillPhase.LOG_STORE: "log_store",
            BackfillPhase.JOINED: "done",
            BackfillPhase.CANCELLED: "cancelled",
        }[self]


# The only legal moves, each with the reason it is allowed (``check_transition`` is the one rule):
#  WAITING   -> SNAPSHOT  : every backfilling upstream has caught up to the snapshot epoch.
#  SNAPSHOT  -> LOG_STORE : every vnode range of the snapshot is written and the snapshot published.
#  LOG_STORE -> JOINED    : the view has written every committed epoch, in the join transaction.
#  any active -> CANCELLED: the user cancelled it.
#  JOINED, CANCELLED are final (a new definition under the same name starts a new backfill row).
BACKFILL_TRANSITIONS: dict[BackfillPhase, frozenset[BackfillPhase]] = {
    BackfillPhase.WAITING: frozenset({BackfillPhase.SNAPSHOT, BackfillPhase.CANCELLED}),
    BackfillPhase.SNAPSHOT: frozenset({BackfillPhase.LOG_STORE, BackfillPhase.CANCELLED}),
    BackfillPhase.LOG_STORE: frozenset({BackfillPhase.JOINED, BackfillPhase.CANCELLED}),
    BackfillPhase.JOINED: frozenset(),
    BackfillPhase.CANCELLED: frozenset(),
}


def check_transition(view: str, old: BackfillPhase, new: BackfillPhase) -> None:
    if new not in BACKFILL_TRANSITIONS[old]:
        raise InvariantViolation(f"backfill of {view} cannot move from {old.value} to {new.value}")


class ChunkState(enum.Enum):
    """A vnode range of the snapshot phase. PENDING ranges have no recorded rows (files a dead
    runner left for one are deleted before it is written again); DONE is final."""

    PENDING = "PENDING"
    DONE = "DONE"


@dataclass(frozen=True)
class VnodeRange:
    lo: int
    hi: int  # exclusive

    def __post_init__(self) -> None:
        if not 0 <= self.lo < self.hi <= VNODES_TOTAL:
            raise InvariantViolation(f"vnode range [{self.lo}, {self.hi}) is not inside [0, {VNODES_TOTAL})")

    @property
    def size(self) -> int:
        return self.hi - self.lo


#: About how long a snapshot range takes once ranges have grown: the work a killed runner loses
RANGE_SECONDS = 10.0
#: ... growing at most this much from one range to the next
RANGE_GROWTH = 4.0


def grown_width(width: int, left: int, seconds: float, target: float = RANGE_SECONDS) -> int:
    """The next range's width after a range of ``width`` vnodes took ``seconds``: grown towards
    ranges of about ``target`` seconds (at most RANGE_GROWTH times a step; a slow range does not
    shrink the next), then evened over the ``left`` vnodes not done (two ranges of 51, not 100
    and a sliver of 2), which may take a few vnodes off.

    The first range's width comes from EPOCHAL_BACKFILL_CHUNK_ROWS. A range costs a Spark job and
    its fixed costs, and when the input is not laid out by the range's key it scans the whole
    input whatever its width: fixed-size ranges of a few seconds then cost one full scan each."""
    if left <= 0:
        return width
    factor = RANGE_GROWTH if seconds <= 0 else max(1.0, min(RANGE_GROWTH, target / seconds))
    wanted = max(width, int(width * factor))
    if wanted >= left:
        return left
    ranges = -(-left // wanted)
    return -(-left // ranges)


def next_range(done: list[VnodeRange], width: int) -> VnodeRange | None:
    """The first vnode range not yet done, at most ``width`` vnodes wide; None when all are."""
    covered = sorted((r.lo, r.hi) for r in done)
    at = 0
    for lo, hi in covered:
        if lo > at:
            return VnodeRange(at, min(lo, at + width))
        at = max(at, hi)
    return VnodeRange(at, min(VNODES_TOTAL, at + width)) if at < VNODES_TOTAL else None


@dataclass(frozen=True)
class Backfill:
    """A backfill as the meta store holds it."""

    view: str
    upstreams: tuple[str, ...]
    phase: BackfillPhase
    snapshot_epoch: int
    #: the newest epoch whose change the view has written (the snapshot epoch after the snapshot phase)
    caught_up_epoch: int | None
    vnodes_done: int
    rows_read: int
    rows_written: int
    rate_limit: float | None
    started_at: float
    updated_at: float
    joined_epoch: int | None = None
    error: str | None = None
    snapshot_location: str | None = None

    def as_status(self, epochs_behind: int | None) -> dict:
        return {
            "phase": self.phase.shown,
            "vnodes_done": self.vnodes_done,
            "vnodes_total": VNODES_TOTAL,
            "rows": self.rows_read,
            "rows_written": self.rows_written,
            "snapshot_epoch": self.snapshot_epoch,
            "caught_up_epoch": self.caught_up_epoch,
            "joined_epoch": self.joined_epoch,
            "rate_limit": self.rate_limit,
            "epochs_behind": epochs_behind,
            "error": self.error,
        }
