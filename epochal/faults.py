"""Fault injection for crash tests: EPOCHAL_FAULT=<point> SIGKILLs the process at that point.

A real SIGKILL at a precise place (not an exception) is the only honest way to test that nothing
is half committed: no finally blocks, no atexit, no flush.
"""

from __future__ import annotations

import os
import signal
import sys

#: The places a run can be killed, in the order an epoch passes them.
FAULT_POINTS = (
    "source-written",  # a source wrote and collected its epoch; nothing committed
    "committed",  # the epoch is committed; no sink has run
    "sink-midway",  # a sink inserted rows in its open transaction; not yet committed
    "sink-prepared",  # a sink's writers pre-committed their rows; PENDING not persisted
    "sink-pending",  # the sink batch is PENDING in the meta store; nothing committed in the target
    "sink-commit-midway",  # the target committed some of a batch's writers (PostgreSQL: 1st COMMIT PREPARED)
    "sink-committed",  # the target committed the whole batch; the meta store not marked COMMITTED
)


def fault_point(point: str) -> None:
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}: one of {', '.join(FAULT_POINTS)}")
    if os.environ.get("EPOCHAL_FAULT") == point:
        sys.stderr.write(f"EPOCHAL_FAULT: killing pid {os.getpid()} at {point}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
