"""Which process works on an epoch: the claim a run takes on the epochs waiting for it, and the
heartbeat it renews while it works, so that recovery tells a slow run from a dead one. Part of the
epoch log (``EpochLog`` inherits it); every change is one conditional UPDATE, so runs race freely.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import Owner
from epochal.epoch import shown_epoch
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT, Lease
from epochal.meta.backend import Backend, Cursor
from epochal.settings import Settings

log = logging.getLogger("epochal.checkpoint.controller")

#: How often a standing-by run asks whether a working run is done: the gap it leaves between runs.
STANDBY_POLL_S = 0.25


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
                [Owner.token(), os.getpid(), run_id, time.time()],
            ).fetchall()
            return sorted(r[0] for r in rows)

        taken = self.backend.transaction(take)
        if taken:
            log.info("run %s takes waiting epoch(s) %s", run_id, ", ".join(map(shown_epoch, taken)))
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

    def working_runs(self) -> list[str]:
        """The other processes working on epochs: each holds an in-flight epoch, is not known dead
        (same host, pid gone) and renewed its heartbeat within the epoch timeout. A run that has
        committed its epochs holds none, even while its sinks deliver."""
        now = time.time()
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT owner_host, owner_pid, owner_run, max(heartbeat_at) FROM epochs "
                f"WHERE state IN {q.IN_FLIGHT} AND owner_pid IS NOT NULL "
                "GROUP BY owner_host, owner_pid, owner_run ORDER BY owner_run"
            ).fetchall()
        )
        working = []
        for host, pid, run, heartbeat in rows:
            if host == Owner.token() and pid == os.getpid():
                continue
            if Owner.dead(host, pid):
                continue
            if heartbeat is not None and now - heartbeat > self.settings.epoch_timeout_s:
                continue
            working.append(f"run {run}" if run else f"pid {pid} on {Owner.hostname(host)}")
        return working

    def stand_by(self, runs: int, on_wait: Callable[[list[str]], None] | None = None) -> float:
        """Wait while ``runs`` or more other processes work on epochs; returns the seconds waited.

        A run the barrier sensor starts ahead calls this before it takes the waiting epochs: its
        process start, imports and Spark attach overlap the working run, and it takes the epochs
        the moment that run has committed its own, instead of a new run being launched then. Never
        longer than the epoch timeout: past it, a silent run is recovery's business, not ours."""
        started = time.time()
        working = self.working_runs()
        if len(working) < runs:
            return 0.0
        if on_wait is not None:
            on_wait(working)
        while len(working) >= runs and time.time() - started < self.settings.epoch_timeout_s:
            time.sleep(STANDBY_POLL_S)
            working = self.working_runs()
        waited = time.time() - started
        log.info("stood by %.1fs; %s", waited, f"still working: {working}" if working else "taking the waiting epochs")
        return waited

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
            [time.time(), epoch, os.getpid(), Owner.token()],
        )
