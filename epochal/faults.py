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
    "sink-prepared",  # a sink's writers pre-committed; PENDING not persisted
    "sink-pending",  # a sink batch is PENDING; nothing committed downstream
    "sink-commit-midway",  # some of a batch's writers are committed downstream, not all
    "sink-committed",  # the target committed the batch; COMMITTED not marked
    "backfill-split-read",  # a chunk of a source split is written for a backfill; its offset not recorded
    "backfill-split-recorded",  # that chunk and the split's new offset are recorded; the next not read
    "backfill-range-moved",  # a backfill range's files are in the snapshot directory; not recorded DONE
    "backfill-range-done",  # a backfill range is recorded DONE; the next not started
    "backfill-epoch-written",  # a backfill wrote a committed epoch's change file; not recorded
    "rebuild-switched",  # a changed view's step recorded its switch to the new statement; not collected
)


def fault_point(point: str) -> None:
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}: one of {', '.join(FAULT_POINTS)}")
    if os.environ.get("EPOCHAL_FAULT") == point:
        sys.stderr.write(f"EPOCHAL_FAULT: killing pid {os.getpid()} at {point}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
