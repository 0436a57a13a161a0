"""The controller's epoch methods (``EpochLog``): injection, a step's life (begin, lease, collect,
fail), the commit, the order of epochs in flight, and the runs' claims on them. Each is one
meta-store transaction, except the waits, which poll one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.checkpoint.epoch_log import CollectResult, CommitStep, EpochLog
    from epochal.checkpoint.records import Collected, EpochRecord, StepStart
    from epochal.connectors.base import SplitRange
    from epochal.lease import Lease


class EpochMethods:
    epoch_log: EpochLog

    # ------------------------------------------------------------------ reading

    def committed_epoch(self) -> int | None:
        """The newest committed epoch, or None before the first commit."""
        return self.epoch_log.committed_epoch()

    def epoch(self, epoch: int) -> EpochRecord:
        """``epoch``'s record (state, kind, when it was injected and committed)."""
        return self.epoch_log.epoch(epoch)

    def offsets(self, epoch: int, source: str) -> list[SplitRange]:
        """The ranges ``epoch`` fixed for ``source``'s splits at injection."""
        return self.epoch_log.offsets(epoch, source)

    def in_flight(self) -> list[EpochRecord]:
        """Epochs injected and neither committed nor aborted, oldest first."""
        return self.epoch_log.in_flight()

    def waiting(self) -> list[int]:
        """Epochs injected and held by no process: a run started now would take them."""
        return self.epoch_log.waiting()

    def recovery_reason(self) -> str | None:
        """Why a recovery is needed before injecting more, or None."""
        return self.epoch_log.recovery_reason()

    def can_inject(self) -> str | None:
        """None if an epoch can be injected now, else the reason it cannot (paused, too many in flight)."""
        return self.epoch_log.can_inject()

    # ------------------------------------------------------------------ injection and pause

    def inject(
        self, plan: Callable[[str, Mapping[str, int]], list[SplitRange]], run_id: str | None = None, claim: bool = False
    ) -> EpochRecord:
        """Allocate the next epoch and fix the offsets each source split covers in it (``plan``)."""
        return self.epoch_log.inject(plan, run_id, claim)

    def pause(self) -> None:
        """Stop injecting: epochs in flight finish, no new one starts."""
        self.epoch_log.pause()

    def resume(self) -> None:
        """Inject again after ``pause``."""
        self.epoch_log.resume()

    def set_pause_on_next_start(self, value: bool) -> None:
        """Whether the next recovery leaves injection paused (RisingWave's pause on bootstrap)."""
        self.epoch_log.set_pause_on_next_start(value)

    # ------------------------------------------------------------------ a step's life

    def begin_step(
        self, epoch: int, run_id: str | None, source: str | None = None, table: str | None = None, claim: bool = True
    ) -> StepStart:
        """Claim ``epoch`` for this process and read what a step needs: the epoch, a source's offsets,
        what has been collected, and whether ``table`` has written before."""
        return self.epoch_log.begin_step(epoch, run_id, source, table, claim)

    def lease(self, epoch: int) -> Lease:
        """``with controller.lease(epoch):`` renews the epoch's heartbeat while a step runs, so a slow
        step is not taken for a dead one."""
        return self.epoch_log.lease(epoch)

    def wait_for_order(self, epoch: int, tables: Iterable[str], what: str) -> float:
        """Wait until every live epoch before ``epoch`` is collected by each of ``tables``; returns the
        seconds waited, and raises when an older epoch cannot finish."""
        return self.epoch_log.wait_for_order(epoch, tables, what)

    def collect(self, epoch: int, collected: Collected, release: bool = False) -> CollectResult:
        """Record a table's output for ``epoch`` and commit what is ready, in one transaction."""
        return self.epoch_log.collect(epoch, collected, release)

    def fail(self, epoch: int, error: str) -> bool:
        """A step failed on ``epoch``: if it is in flight, record why and ask for a recovery."""
        return self.epoch_log.fail(epoch, error)

    def commit_step(self, epoch: int) -> CommitStep:
        """Commit every epoch that is ready, oldest first, and read where ``epoch`` stands."""
        return self.epoch_log.commit_step(epoch)

    def blocked_by(self, epoch: int) -> str | None:
        """Why an epoch older than ``epoch`` cannot finish (failed, its run died or hung), or None."""
        return self.epoch_log.blocked_by(epoch)

    # ------------------------------------------------------------------ runs' claims

    def take_waiting(self, run_id: str | None) -> list[int]:
        """Claim for this process every epoch that is waiting for a run."""
        return self.epoch_log.take_waiting(run_id)

    def stand_by(self, runs: int, on_wait: Callable[[list[str]], None] | None = None) -> float:
        """Wait while ``runs`` or more other processes work on epochs; returns the seconds waited."""
        return self.epoch_log.stand_by(runs, on_wait)

    def hold(self, epochs: Iterable[int]) -> Lease:
        """``with controller.hold(epochs):`` renews the heartbeat of every epoch a run has taken while it
        works through them, so the ones waiting their turn are not taken for stuck."""
        return self.epoch_log.hold(epochs)

    def release(self, epoch: int) -> None:
        """End this process's claim on ``epoch``: it waits for a run again."""
        self.epoch_log.release(epoch)

    def release_all(self, epochs: Iterable[int]) -> None:
        """End this process's claim on each of ``epochs``."""
        self.epoch_log.release_all(epochs)
