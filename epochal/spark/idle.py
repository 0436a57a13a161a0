"""The managed Spark server stops itself when nothing has used it for a while (EPOCHAL_SPARK_IDLE_STOP_S).

A warm server saves every run ~20 s of JVM start, but a JVM of 2-3 GiB left running by one try of
the demo, or one per home on a machine with many, is a cost nobody chose. So:

* every process that attaches to the server renews a lease, the mtime of ``$EPOCHAL_HOME/spark/in_use``:
  at once, then every ``RENEW_S`` from a daemon thread for as long as the process lives (a run, a
  CLI command, a notebook). A killed process stops renewing;
* a watchdog process, started with the server, stops it once the lease is older than the limit, and
  exits when the server is gone (stopped, dead, or replaced by another).

The stop happens under the server's lock after checking the lease again, so a run that is attaching
at that moment either renewed the lease first (the server stays) or starts a new server after it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from epochal.lease import Lease

log = logging.getLogger("epochal.spark.idle")

IN_USE = "in_use"
#: how often an attached process renews the lease; the idle limit must leave room for several
RENEW_S = 30.0

_renewing: set[Path] = set()
_renewing_lock = threading.Lock()


def touch(directory: Path) -> None:
    """Renew the lease now."""
    path = Path(directory) / IN_USE
    path.touch()


def idle_seconds(directory: Path, now: float | None = None) -> float | None:
    """Seconds since the lease was last renewed, or None when it never was."""
    try:
        renewed = (Path(directory) / IN_USE).stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - renewed)


def should_stop(idle_s: float | None, limit_s: float) -> bool:
    """Whether a server whose lease is ``idle_s`` old goes, under an idle limit of ``limit_s`` (0: never).
    A lease never renewed is not idle: the server is starting, or was started by hand."""
    return limit_s > 0 and idle_s is not None and idle_s > max(limit_s, 2 * RENEW_S)


def keep_alive(directory: Path) -> None:
    """Renew the lease now and, from a daemon thread, for as long as this process lives. Once per
    directory per process; renewing stops if the directory goes (its home was deleted)."""
    directory = Path(directory)
    touch(directory)
    with _renewing_lock:
        if directory in _renewing:
            return
        _renewing.add(directory)

    def renew() -> bool:
        try:
            touch(directory)
        except FileNotFoundError:  # the home is gone: nothing left to keep alive
            with _renewing_lock:
                _renewing.discard(directory)
            return False
        return True

    # entered and never left: the lease lasts as long as the process (its thread is a daemon)
    Lease(f"Spark server of {directory.parent}", renew, RENEW_S).__enter__()
