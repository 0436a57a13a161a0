"""One run delivers a sink at a time: the delivery claim, a row of ``sink_claims`` per sink.

A run takes the claim before it delivers, renews it while it works (a :class:`Lease`) and releases it
at the end. A claim not renewed for ``timeout_s`` belongs to a dead run and is taken over; a claim
whose owner is a process of this host that is gone is taken over at once. A run that finds the claim
held waits up to ``wait_s`` and then leaves the work to the holder. The state machine of the batches
checks the holder again in the transaction that makes a pre-commit PENDING (:meth:`holder`), so a
run whose claim was taken over never persists a pre-commit the new owner's recovery may have dropped.
"""

from __future__ import annotations

import logging
import time

from epochal.checkpoint.records import Owner
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT
from epochal.meta.backend import Backend, Cursor

log = logging.getLogger("epochal.sinks")


class SinkClaims:
    def __init__(self, backend: Backend, timeout_s: float = 600.0, wait_s: float = 30.0):
        self.backend = backend
        #: a delivery claim not renewed this long belongs to a dead run and is taken over
        self.timeout_s = timeout_s
        #: how long a delivery waits for another run's claim before it leaves the work to that run
        self.wait_s = wait_s

    @property
    def renew_interval(self) -> float:
        return max(0.05, self.timeout_s / LEASE_RENEWALS_PER_TIMEOUT)

    @staticmethod
    def holder(cur: Cursor, sink: str) -> str | None:
        """Who holds ``sink``'s claim, in the caller's transaction."""
        row = cur.execute("SELECT owner FROM sink_claims WHERE sink = ?", [sink]).fetchone()
        return None if row is None else row[0]

    def take(self, sink: str, owner: str) -> bool:
        """Take the sink's delivery claim if it is free, ours, or its owner stopped renewing it."""

        def take(cur: Cursor) -> bool:
            now = time.time()
            row = cur.execute("SELECT owner, heartbeat_at FROM sink_claims WHERE sink = ?", [sink]).fetchone()
            if row is None:
                cur.execute("INSERT INTO sink_claims VALUES (?, ?, ?)", [sink, owner, now])
                return True
            if row[0] != owner and now - row[1] <= self.timeout_s and owner_alive(row[0]):
                return False
            if row[0] != owner:
                log.warning("sink %s: taking over the claim of %s (dead, or silent %.0fs)", sink, row[0], now - row[1])
            cur.execute("UPDATE sink_claims SET owner = ?, heartbeat_at = ? WHERE sink = ?", [owner, now, sink])
            return True

        return self.backend.transaction(take)

    def wait_for(self, sink: str, owner: str) -> bool:
        """Take the claim, waiting up to ``wait_s`` for its holder; False if it is still held then."""
        deadline = time.monotonic() + self.wait_s
        delay = 0.05
        while not self.take(sink, owner):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        return True

    def renew(self, sink: str, owner: str) -> bool:
        """Renew our claim; False when it is no longer ours (taken over)."""
        return bool(
            self.backend.transaction(
                lambda cur: cur.execute(
                    "UPDATE sink_claims SET heartbeat_at = ? WHERE sink = ? AND owner = ? RETURNING sink",
                    [time.time(), sink, owner],
                ).fetchall()
            )
        )

    def release(self, sink: str, owner: str) -> None:
        self.backend.transaction(
            lambda cur: cur.execute("DELETE FROM sink_claims WHERE sink = ? AND owner = ?", [sink, owner])
        )


def owner_alive(owner: str) -> bool:
    """False when a claim's owner ("host:pid:nonce", host as ``Owner.token()`` wrote it) is a process
    known to be gone (``Owner.dead``): a killed run's claim is taken over at once, not after the timeout."""
    host, _, rest = owner.partition(":")
    return not Owner.dead(host, rest.partition(":")[0])
