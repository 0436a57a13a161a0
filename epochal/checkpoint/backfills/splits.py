"""Source backfill, per split: the states of one split of a SOURCE that a new view reads, with
the one rule per transition (RisingWave's ``stream_source_backfill_executor.rs``, in epochs).

A SOURCE's history lives in its connector, not in Epochal's storage: a view added to a running
pipeline reads each split of it from the connector, from where the source's history starts up to
the offset the source had committed at the backfill's snapshot epoch (the split's *target*). The
view's other inputs are read at that same epoch, so the snapshot is one consistent cut; the
epochs after it reach the view through the log-store phase, as for any backfill.

* ``BACKFILLING(offset)``: records ``[origin, offset)`` are read; reading goes on in chunks,
  each persisted with its offset, so a killed backfill resumes at ``offset``.
* ``SOURCE_CACHING_UP(offset)``: the split's history at the snapshot epoch is read (offset is
  the target). Its later records reach the view through the epochs after the snapshot epoch,
  which may show it only records at or after ``offset`` (the seed's filter: those before were
  read by the backfill).
* ``FINISHED``: the view has taken an epoch whose range of the split starts at or after
  ``offset`` (or has joined): every later record of the split is visible to it.

A split that first appears in an epoch after the snapshot epoch (added during the backfill)
starts BACKFILLING at the first offset of that epoch's range: it had nothing at the snapshot
epoch, so it is caught up at once and its records come with the epochs. The snapshot phase is
done once every split is SOURCE_CACHING_UP or FINISHED, so an idle split never holds it back.

Plain data and rules: the meta-store side is :mod:`epochal.checkpoint.backfills.split_rows`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from epochal.checkpoint.records import InvariantViolation
from epochal.connectors.base import SplitRange


class SplitPhase(enum.Enum):
    BACKFILLING = "BACKFILLING"
    SOURCE_CACHING_UP = "SOURCE_CACHING_UP"
    FINISHED = "FINISHED"

    @property
    def shown(self) -> str:
        return {"BACKFILLING": "backfilling", "SOURCE_CACHING_UP": "caching_up", "FINISHED": "finished"}[self.value]


#  BACKFILLING       -> BACKFILLING       : a chunk below the target is read (the offset moves up).
#  BACKFILLING       -> SOURCE_CACHING_UP : the chunk read reaches the target.
#  SOURCE_CACHING_UP -> FINISHED          : an epoch's range starts at or after the offset, or the view joins.
#  FINISHED is final.
SPLIT_TRANSITIONS: dict[SplitPhase, frozenset[SplitPhase]] = {
    SplitPhase.BACKFILLING: frozenset({SplitPhase.BACKFILLING, SplitPhase.SOURCE_CACHING_UP}),
    SplitPhase.SOURCE_CACHING_UP: frozenset({SplitPhase.FINISHED}),
    SplitPhase.FINISHED: frozenset(),
}


def check_split_transition(view: str, state: SplitBackfill, new: SplitPhase) -> None:
    if new not in SPLIT_TRANSITIONS[state.phase]:
        raise InvariantViolation(
            f"split {state.split} of {state.source} in the backfill of {view} cannot move from "
            f"{state.phase.value} to {new.value}"
        )


@dataclass(frozen=True)
class SplitBackfill:
    """One split of one source in one view's backfill, as the meta store holds it."""

    source: str
    split: str
    phase: SplitPhase
    #: records before it are read (BACKFILLING) or were read by the backfill (the later phases)
    offset: int
    #: the source's committed end of the split at the snapshot epoch: where reading stops
    target: int
    #: records read from the connector for it (malformed lines are not counted: they are dead letters)
    rows: int = 0

    def __post_init__(self) -> None:
        if self.offset > self.target:
            raise InvariantViolation(
                f"split {self.split} of {self.source} is read up to {self.offset}, past its target {self.target}"
            )

    @property
    def done_reading(self) -> bool:
        return self.phase is not SplitPhase.BACKFILLING

    def as_status(self) -> dict:
        return {"phase": self.phase.shown, "offset": self.offset, "target": self.target, "rows": self.rows}


def start(view: str, source: str, split: str, origin: int, target: int) -> SplitBackfill:
    """A split's state when its backfill starts: BACKFILLING from where the source's history of it
    starts, or already SOURCE_CACHING_UP when there is nothing to read (an idle or new split)."""
    state = SplitBackfill(source, split, SplitPhase.BACKFILLING, origin, target)
    return state if origin < target else _move(view, state, SplitPhase.SOURCE_CACHING_UP)


def next_chunk(state: SplitBackfill, max_rows: int) -> SplitRange | None:
    """The next records to read for ``state``, at most ``max_rows`` of them; None once it is read."""
    if state.phase is not SplitPhase.BACKFILLING:
        return None
    return SplitRange(state.split, state.offset, min(state.target, state.offset + max(1, max_rows)))


def after_read(view: str, state: SplitBackfill, chunk: SplitRange, rows: int) -> SplitBackfill:
    """``chunk`` was read and persisted: the offset moves to its end; reaching the target ends reading."""
    if state.phase is not SplitPhase.BACKFILLING:
        raise InvariantViolation(f"the backfill of {view} read split {state.split} of {state.source} after it was read")
    if (
        chunk.split != state.split
        or chunk.start != state.offset
        or chunk.end > state.target
        or chunk.end <= chunk.start
    ):
        raise InvariantViolation(
            f"the backfill of {view} read [{chunk.start}, {chunk.end}) of split {chunk.split} of {state.source}, "
            f"but its next records are [{state.offset}, {state.target}) of split {state.split}"
        )
    moved = replace(state, offset=chunk.end, rows=state.rows + rows)
    return _move(view, moved, SplitPhase.SOURCE_CACHING_UP) if chunk.end == state.target else moved


def after_epoch(view: str, state: SplitBackfill, epoch_range: SplitRange) -> SplitBackfill:
    """The view takes an epoch after the snapshot epoch whose range of this split is ``epoch_range``.
    A split still BACKFILLING cannot: its history is not all read. A range starting before the
    offset would show the view records the backfill read (twice); at or after it, the split is
    FINISHED (after it: the records between came with the epochs the view took before)."""
    if state.phase is SplitPhase.FINISHED:
        return state
    if state.phase is SplitPhase.BACKFILLING:
        raise InvariantViolation(
            f"the backfill of {view} takes an epoch of {state.source} while split {state.split} is still "
            f"backfilling at offset {state.offset} of {state.target}"
        )
    if epoch_range.start < state.offset:
        raise InvariantViolation(
            f"split {state.split} of {state.source} was read by the backfill of {view} up to {state.offset}, "
            f"but an epoch after its snapshot starts it at {epoch_range.start}: those records would count twice"
        )
    return _move(view, state, SplitPhase.FINISHED)


def after_join(view: str, state: SplitBackfill) -> SplitBackfill:
    """The view joins the live flow: every later epoch starts where the committed ones ended, which
    is at or after each split's offset, so every split is FINISHED."""
    if state.phase is SplitPhase.BACKFILLING:
        raise InvariantViolation(
            f"{view} joins while split {state.split} of {state.source} is still backfilling at {state.offset}"
        )
    return state if state.phase is SplitPhase.FINISHED else _move(view, state, SplitPhase.FINISHED)


def reading_done(states: Iterable[SplitBackfill]) -> bool:
    """Every split is SOURCE_CACHING_UP or FINISHED: the snapshot phase may go on (an idle split,
    whose target is where it already is, never holds it back)."""
    return all(s.done_reading for s in states)


def _move(view: str, state: SplitBackfill, new: SplitPhase) -> SplitBackfill:
    check_split_transition(view, state, new)
    return replace(state, phase=new)
