"""How a run takes its epochs: the partition it names, a newly injected epoch, or every epoch
waiting for a run, held under the run's lease until it closes. Split from the runtime, which
delegates here."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint.records import EpochAborted, EpochRecord, EpochState, RecoveryReport
from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime

log = logging.getLogger("epochal.runtime")


@dataclass(frozen=True)
class RunEpochs:
    """What a run of epoch_job takes: its epochs (oldest first) and the recovery it ran, if any."""

    epochs: list[int]
    recovery: RecoveryReport | None = None
    #: how long the run stood by for a working run before it took its epochs
    stood_by_s: float = 0.0


class EpochTaking:
    def __init__(self, runtime: EpochRuntime):
        self._rt = runtime
        #: the run-long lease on the epochs ``take_epochs`` took; ended by ``close``
        self._held = ExitStack()

    def close(self) -> None:
        self._held.close()

    def start_epoch(self, run_id: str | None, partition: str | None) -> tuple[EpochRecord, RecoveryReport | None]:
        """The epoch a run works on: the one its partition names, or a newly injected one.

        Without a partition this is the barrier worker's loop body: recover if anything needs it,
        then inject the next epoch, claimed by this process so its death is noticed."""
        if partition is not None:
            try:
                epoch = int(partition)
            except ValueError:
                raise EpochalError(f"partition key {partition!r} is not an epoch number") from None
            record = self._rt.controller.epoch_log.begin_step(epoch, run_id).record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery and cannot run again: its records are re-read "
                    "by a later epoch. Run epoch_job without a partition to go on"
                )
            self._rt.check_plans()
            return record, None
        self._rt.check_plans()  # before injecting: a plan Spark refuses is an error, never a failed epoch
        report = None
        reason = self._rt.controller.epoch_log.recovery_reason()
        if reason:
            report = self._rt.recover(reason)
        self._rt.apply_pipeline_changes()
        return self._rt.controller.epoch_log.inject(self._rt.plan, run_id=run_id, claim=True), report

    def take_epochs(self, run_id: str | None, partition: str | None, waiting: bool) -> RunEpochs:
        """The epochs a run of epoch_job works on, oldest first.

        ``waiting`` (the barrier sensor's runs): every epoch injected and held by no process, the
        partition's own among them if nobody took it first. A run that starts late thus takes the
        epochs queued behind it and processes them in order, and the runs requested for those find
        nothing left and end at once. Without ``waiting``, a partition is run (or re-run) alone,
        and a run without one recovers if needed, injects an epoch and takes the waiting ones too
        (which its own epoch's steps would otherwise wait for). The run's ``hold`` keeps every
        epoch it took alive while it works through them."""
        if partition is not None and not waiting:
            record, recovery = self.start_epoch(run_id, partition)
            return RunEpochs([record.epoch], recovery)
        epoch_log = self._rt.controller.epoch_log
        recovery = None
        own: list[int] = []
        stood_by = 0.0
        if partition is None:
            record, recovery = self.start_epoch(run_id, None)
            own = [record.epoch]
        elif self._rt.settings.standby_run:
            stood_by = epoch_log.stand_by(self._rt.settings.max_epoch_runs, on_wait=self._warm_up)
        taken = sorted({*own, *epoch_log.take_waiting(run_id)})
        if not taken:
            return RunEpochs([], recovery, stood_by)  # without the plans' check: a run with nothing to do ends now
        try:
            self._rt.check_plans()  # before any step: a plan Spark refuses is an error, never a failed epoch
        except BaseException:
            epoch_log.release_all(taken)  # waiting again (for a run with a fixed pipeline), not dead
            raise
        self._held.enter_context(epoch_log.hold(taken))
        return RunEpochs(taken, recovery, stood_by)

    def _warm_up(self, working: list[str]) -> None:
        """While standing by for ``working``: do what the run's first step would, so the run starts
        warm when it takes its epochs (a refused plan fails it here, before it takes any)."""
        log.info("standing by while %s work(s) on epochs: warming up", ", ".join(working))
        self._rt.check_plans()
        self._rt.spark  # noqa: B018 (attaching to Spark is the point)
