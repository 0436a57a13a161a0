"""Which process works on an epoch: the claim a run takes on the epochs waiting for it, and the
heartbeat it renews while it works, so that recovery tells a slow run from a dead one. Part of the
epoch log (``EpochLog`` inherits it); every change is one conditional UPDATE, so runs race freely.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import Owner
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT, Lease
from epochal.meta.backend import Backend, Cursor
from epochal.settings import Settings

log = logging.getLogger("epochal.controller")


class EpochClaims:
    settings: Settings
    backend: Backend

    def take_waiting(self, run_id: str | None) -> list[int]:
        """Claim for this process every epoch that is waiting for a run: injected, not failed, and
        held by no process (the sensor injects unclaimed; a step run from the UI releases its claim).
        The claim is one conditional UPDATE, so two runs never take one epoch. Returns the epochs
        taken, oldest first: a run processes them in order, the order their steps need anyway."""

        def take(cur: Cursor) -> list[int]:
            rows = cur.execute(
                "UPDATE epochs SET owner_host = ?, owner_pid = ?, owner_run = ?, heartbeat_at = ? "
                "WHERE state = 'INJECTED' AND failure IS NULL AND owner_pid IS NULL RETURNING epoch",
                [Owner.host, os.getpid(), run_id, time.time()],
            ).fetchall()
            return sorted(r[0] for r in rows)

        taken = self.backend.transaction(take)
        if taken:
            log.info("run %s takes waiting epoch(s) %s", run_id, taken)
        return taken

    def waiting(self) -> list[int]:
        """Epochs injected and held by no process: a run started now would take them."""
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT epoch FROM epochs WHERE state = 'INJECTED' AND failure IS NULL AND owner_pid IS NULL "
                "ORDER BY epoch"
            ).fetchall()
        )
        return [r[0] for r in rows]

    def hold(self, epochs: Iterable[int]) -> Lease:
        """``with log.hold(epochs):`` renews the heartbeat of every epoch a run has taken while it works
        on the first: the ones waiting their turn in the run are alive too, not stuck."""
        held = sorted(epochs)
        interval = max(0.05, self.settings.epoch_timeout_s / LEASE_RENEWALS_PER_TIMEOUT)
        return Lease(f"epochs {held}", lambda: self.renew_all(held), interval)

    def lease(self, epoch: int) -> Lease:
        """``with log.lease(epoch):`` renews the epoch's heartbeat while the block runs, so recovery
        does not take a step that runs longer than ``EPOCHAL_EPOCH_TIMEOUT_S`` for a dead one."""
        return self.hold([epoch])

    def renew(self, epoch: int) -> bool:
        """Move the epoch's heartbeat to now; False when it is no longer in flight."""
        return self.renew_all([epoch])

    def renew_all(self, epochs: list[int]) -> bool:
        """Move the heartbeat of those of ``epochs`` still in flight to now; False when none is."""

        def touch(cur: Cursor) -> bool:
            marks = ", ".join("?" for _ in epochs)
            rows = cur.execute(
                f"UPDATE epochs SET heartbeat_at = ? WHERE epoch IN ({marks}) AND state IN {q.IN_FLIGHT} "
                "RETURNING epoch",
                [time.time(), *epochs],
            ).fetchall()
            return bool(rows)

        return self.backend.transaction(touch)

    def release(self, epoch: int) -> None:
        """End this process's claim on ``epoch`` (it waits for others now, not for this run)."""
        self.backend.transaction(lambda cur: self._release(cur, epoch))

    def release_all(self, epochs: Iterable[int]) -> None:
        """End this process's claim on each of ``epochs``: they wait for a run again."""

        def release(cur: Cursor) -> None:
            for epoch in epochs:
                self._release(cur, epoch)

        self.backend.transaction(release)

    @staticmethod
    def _release(cur: Cursor, epoch: int) -> None:
        # The epoch now waits for other steps, bounded by the epoch timeout, not by this process.
        cur.execute(
            "UPDATE epochs SET owner_pid = NULL, heartbeat_at = ? WHERE epoch = ? AND owner_pid = ? AND owner_host = ?",
            [time.time(), epoch, os.getpid(), Owner.host],
        )
