"""When the barrier sensor injects: on a fixed grid of the barrier interval, at the daemon tick
nearest each point of it.

Dagster's sensor daemon evaluates sensors on a 5-second loop and counts a sensor's minimum interval
from the start of its previous tick. With the minimum interval set to the barrier interval, a tick
that started a little after its loop turn makes the next turn, exactly one interval later, fall a
hair short, so the sensor waits another turn: at 10 s it injected every 10 or 15 s, about 5 epochs a
minute instead of 6. The schedule instead asks to be evaluated half a loop early and injects when a
point of the grid is within half a loop; the points do not move when a tick is late, so the rate
over time is the barrier interval's, at the loop's granularity. Intervals under the loop inject once
a loop: the daemon cannot evaluate sooner.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

#: dagster/_daemon/sensor.py: MIN_INTERVAL_LOOP_TIME, how often the daemon evaluates sensors at most.
DAEMON_LOOP_S = 5.0


@dataclass(frozen=True)
class BarrierSchedule:
    interval_s: float
    loop_s: float = DAEMON_LOOP_S

    @property
    def tolerance_s(self) -> float:
        """How early a tick may inject: half a loop, so the tick nearest the grid point injects."""
        return min(self.loop_s, self.interval_s) / 2

    def minimum_interval_seconds(self) -> int:
        """The sensor's ``minimum_interval_seconds``: the loop turn nearest a grid point must pass it."""
        return max(1, math.floor(self.interval_s - self.tolerance_s))

    def due(self, next_barrier: float | None, now: float) -> bool:
        return next_barrier is None or now >= next_barrier - self.tolerance_s

    def after_injection(self, next_barrier: float | None, now: float) -> float:
        """The grid point after an injection at ``now``. A tick more than an interval late (injection
        was paused, blocked at the in-flight limit, or the sensor was off) starts a new grid at now
        rather than injecting a burst to catch up: an epoch is a barrier, not a quota."""
        if next_barrier is None or now - next_barrier >= self.interval_s:
            return now + self.interval_s
        return next_barrier + self.interval_s


@dataclass(frozen=True)
class SensorCursor:
    """The barrier sensor's cursor: the newest epoch a run was requested for (the run key, so a tick
    evaluated twice never requests two runs for the same epochs) and the next grid point."""

    requested: str | None = None
    next_barrier: float | None = None

    @classmethod
    def parse(cls, cursor: str | None) -> SensorCursor:
        if not cursor:
            return cls()
        try:
            data = json.loads(cursor)
        except ValueError:
            return cls(requested=cursor)
        if not isinstance(data, dict):  # a cursor written before the schedule: the epoch alone
            return cls(requested=cursor)
        next_barrier = data.get("next_barrier")
        return cls(
            requested=data.get("requested"),
            next_barrier=float(next_barrier) if next_barrier is not None else None,
        )

    def serialize(self) -> str:
        return json.dumps({"requested": self.requested, "next_barrier": self.next_barrier})
