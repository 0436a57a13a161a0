"""The states of a backfill and of its vnode ranges, with the one rule per transition.

Plain data: the meta-store side is :mod:`epochal.checkpoint.backfills.log`, the work
:mod:`epochal.backfill.runner`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
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
#: ... growing at most this much from one range to the next while only one range was measured
RANGE_GROWTH = 4.0
#: ... and at most this much once two were: the cost model then says where the time goes
MODELLED_GROWTH = RANGE_GROWTH**2
#: vnodes left that fit in this many ranges of the wanted width are done in one range
ONE_MORE_RANGE = 1.5


def range_cost(history: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(fixed seconds, seconds per vnode) of a range, from the last two ranges of different widths
    in ``history`` ((width, seconds), oldest first); None before there are two. A range's fixed part
    is its job's overhead and, where the input is not laid out by the view's key, a scan of all of
    it whatever the width; the part per vnode is what the range's share of the rows costs."""
    last_width, last_seconds = history[-1]
    for width, seconds in reversed(history[:-1]):
        if width != last_width:
            # (noise can make the wider range faster: then nothing is seen to grow with width)
            per_vnode = max(0.0, (last_seconds - seconds) / (last_width - width))
            return max(0.0, last_seconds - per_vnode * last_width), per_vnode
    return None


def grown_width(history: Sequence[tuple[int, float]], left: int, target: float = RANGE_SECONDS) -> int:
    """The next range's width after the ranges in ``history`` ((width, seconds), oldest first), with
    ``left`` vnodes not done.

    After one range its time is taken as proportional to its width (an upper bound) and the width
    grows towards ranges of about ``target`` seconds: at most RANGE_GROWTH times, and at least twice
    however slow the range was, since the second width is what tells the fixed cost apart. After two,
    the ranges' fixed and per-vnode costs (``range_cost``) size it: long enough that the fixed part is
    at most half of each range (when every range scans the whole input, few wide ranges, not one scan
    per narrow one), at most MODELLED_GROWTH times a step, never narrower than the first. The rest is
    done in one range when it is within ONE_MORE_RANGE of the width, else evened over the vnodes
    left (two ranges of 51, not 100 and a sliver of 2), which may take a few vnodes off.

    The first range's width comes from EPOCHAL_BACKFILL_RANGE_ROWS."""
    width, seconds = history[-1]
    if left <= 0:
        return width
    cost = range_cost(history)
    if cost is None:
        # (at least twice as wide, however slow: a second width is what tells fixed costs apart)
        factor = RANGE_GROWTH if seconds <= 0 else max(2.0, min(RANGE_GROWTH, target / seconds))
        wanted = int(width * factor)
    else:
        fixed, per_vnode = cost
        budget = max(target, 2 * fixed) - fixed
        most = int(width * MODELLED_GROWTH)
        wanted = most if per_vnode <= 0 else min(most, int(budget / per_vnode))
    return evened(max(history[0][0], wanted), left)


def evened(wanted: int, left: int) -> int:
    """A range width of about ``wanted`` vnodes with ``left`` to do: all of them when they are within
    ONE_MORE_RANGE of it, else evened over them (two ranges of 51, not 100 and a sliver of 2)."""
    if wanted * ONE_MORE_RANGE >= left:
        return left
    ranges = -(-left // max(1, wanted))
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
