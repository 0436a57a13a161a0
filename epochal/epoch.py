"""Epoch arithmetic, in RisingWave's encoding.

An epoch is physical milliseconds since 2021-04-01T00:00:00Z shifted left by 16 bits. The low 16
bits are a sequence number, so two epochs allocated in the same millisecond (or after a clock step
backwards) still strictly grow: ``next_epoch`` never returns a value <= its input.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from datetime import UTC, datetime

EPOCH_ORIGIN_MS = int(datetime(2021, 4, 1, tzinfo=UTC).timestamp() * 1000)
PHYSICAL_SHIFT = 16
SEQUENCE_MASK = (1 << PHYSICAL_SHIFT) - 1


def epoch_from_ms(unix_ms: int) -> int:
    return (unix_ms - EPOCH_ORIGIN_MS) << PHYSICAL_SHIFT


def epoch_physical_ms(epoch: int) -> int:
    """Unix milliseconds at which the epoch was allocated."""
    return (epoch >> PHYSICAL_SHIFT) + EPOCH_ORIGIN_MS


def epoch_datetime(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch_physical_ms(epoch) / 1000, tz=UTC)


def epoch_time_text(epoch: int) -> str:
    """The epoch's wall-clock time (its barrier), to the second in UTC: ``2026-12-07 10:00:01Z``."""
    return f"{epoch_datetime(epoch):%Y-%m-%d %H:%M:%S}Z"


def shown_epoch(epoch: int | None) -> str:
    """An epoch as users meet it in logs, status and the UI: its id (what every command takes) and
    its wall-clock time beside it, ``1175... (2026-12-07 10:00:01Z)``; ``none`` for no epoch."""
    return "none" if epoch is None else f"{epoch} ({epoch_time_text(epoch)})"


def epoch_age_s(epoch: int, now: float) -> float:
    """Seconds from the epoch's barrier (its wall-clock time) to ``now`` (Unix seconds)."""
    return round(now - epoch_physical_ms(epoch) / 1000, 3)


def now_epoch() -> int:
    return epoch_from_ms(int(time.time() * 1000))


def next_epoch(prev: int | None, now_ms: int | None = None) -> int:
    """The epoch after ``prev``: the current time, or ``prev + 1`` if the clock has not moved past it."""
    candidate = epoch_from_ms(int(time.time() * 1000) if now_ms is None else now_ms)
    if prev is not None and candidate <= prev:
        return prev + 1
    return candidate


class BarrierKind(enum.Enum):
    #: first barrier after start or recovery; carries no data from before it
    INITIAL = "initial"
    #: data boundary, committed together with the next checkpoint
    BARRIER = "barrier"
    #: every ``checkpoint_frequency``-th barrier: the only ones committed durably
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Barrier:
    """(prev, curr]: data between the two barriers belongs to ``curr``, the epoch it closes."""

    prev: int | None
    curr: int
    kind: BarrierKind

    def __post_init__(self) -> None:
        if self.prev is not None and self.prev >= self.curr:
            raise ValueError(f"a barrier's epochs only grow: prev {self.prev} is not before curr {self.curr}")


def barrier_kind(sequence: int, checkpoint_frequency: int) -> BarrierKind:
    """Kind of the ``sequence``-th barrier since the last recovery (1-based; 0 is the initial one)."""
    if sequence == 0:
        return BarrierKind.INITIAL
    if sequence % checkpoint_frequency == 0:
        return BarrierKind.CHECKPOINT
    return BarrierKind.BARRIER
