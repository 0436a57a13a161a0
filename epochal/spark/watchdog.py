"""The watchdog process started with the managed Spark server: it stops the server once its lease
(``idle``) is older than EPOCHAL_SPARK_IDLE_STOP_S, and exits when the server is gone.
``python -m epochal.spark.watchdog HOME PID LIMIT_S``."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from epochal.spark import server as spark_server
from epochal.spark.idle import RENEW_S, idle_seconds, should_stop

log = logging.getLogger("epochal.spark.idle")


def watch(home: Path, pid: int, limit_s: float, poll_s: float | None = None) -> str:
    """Stop the server ``pid`` of ``home`` once its lease is older than ``limit_s``; returns why the
    watch ended: "stopped" (idle) or "gone" (the server stopped, died or was replaced)."""
    directory = spark_server.server_directory(home)
    poll_s = poll_s if poll_s is not None else min(RENEW_S, max(1.0, limit_s / 4))
    while True:
        time.sleep(poll_s)
        if not spark_server.is_running(home, pid):
            return "gone"
        if should_stop(idle_seconds(directory), limit_s):
            idle = idle_seconds(directory)
            if spark_server.stop_if(home, pid, lambda: should_stop(idle_seconds(directory), limit_s)):
                log.warning("stopped Epochal's Spark server (pid %d): unused for %.0f s (limit %.0f s)",
                            pid, idle or 0.0, limit_s)
                return "stopped"


def main(argv: list[str]) -> int:
    """``python -m epochal.spark.watchdog HOME PID LIMIT_S``: the watchdog the server is started with."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    home, pid, limit_s = Path(argv[0]), int(argv[1]), float(argv[2])
    log.info("watching Epochal's Spark server (pid %d): it stops after %.0f s unused", pid, limit_s)
    log.info("watch ended: %s", watch(home, pid, limit_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
