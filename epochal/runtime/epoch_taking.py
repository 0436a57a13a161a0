"""How a run takes its epochs: the partition it names, a newly injected epoch, or every epoch
waiting for a run, held under the run's lease until it closes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epochal.checkpoint.records import EpochAborted, EpochRecord, EpochState, RecoveryReport
from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.checkpoint.controller import CheckpointController
    from epochal.connectors.base import SplitRange
    from epochal.settings import Settings

log = logging.getLogger("epochal.runtime")


@dataclass(frozen=True)
class RunEpochs:
    """What a run of epoch_job takes: its epochs (oldest first) and the recovery it ran, if any."""

    epochs: list[int]
    recovery: RecoveryReport | None = None
    #: how long the run stood by for a working run before it took its epochs
    stood_by_s: float = 0.0


class EpochTaking:
    def __init__(
        self,
        controller: CheckpointController,
        settings: Settings,
        check_plans: Callable[[], None],
        recover: Callable[[str], RecoveryReport],
        apply_pipeline_changes: Callable[[], None],
        plan: Callable[[str, Mapping[str, int]], list[SplitRange]],
        attach_spark: Callable[[], Any],
    ):
        self.controller = controller
        self.settings = settings
        #: Spark's analysis of every plan, once per runtime (``EpochRuntime.check_plans``)
        self._check_plans = check_plans
        self._recover = recover
        #: retire what left the SQL files and delete dropped views' files, before injecting
        self._apply_pipeline_changes = apply_pipeline_changes
        #: the offsets a source's splits cover in a new epoch
        self._plan = plan
        self._attach_spark = attach_spark
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
            record = self.controller.begin_step(epoch, run_id).record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery and cannot run again: its records are re-read "
                    "by a later epoch. Run epoch_job without a partition to go on"
                )
            self._check_plans()
            return record, None
        self._check_plans()  # before injecting: a plan Spark refuses is an error, never a failed epoch
        report = None
        reason = self.controller.recovery_reason()
        if reason:
            report = self._recover(reason)
        self._apply_pipeline_changes()
        return self.controller.inject(self._plan, run_id=run_id, claim=True), report

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
        controller = self.controller
        recovery = None
        own: list[int] = []
        stood_by = 0.0
        if partition is None:
            record, recovery = self.start_epoch(run_id, None)
            own = [record.epoch]
        elif self.settings.standby_run:
            stood_by = controller.stand_by(self.settings.max_epoch_runs, on_wait=self._warm_up)
        taken = sorted({*own, *controller.take_waiting(run_id)})
        if not taken:
            return RunEpochs([], recovery, stood_by)  # without the plans' check: a run with nothing to do ends now
        try:
            self._check_plans()  # before any step: a plan Spark refuses is an error, never a failed epoch
        except BaseException:
            controller.release_all(taken)  # waiting again (for a run with a fixed pipeline), not dead
            raise
        self._held.enter_context(controller.hold(taken))
        return RunEpochs(taken, recovery, stood_by)

    def _warm_up(self, working: list[str]) -> None:
        """While standing by for ``working``: do what the run's first step would, so the run starts
        warm when it takes its epochs (a refused plan fails it here, before it takes any)."""
        log.info("standing by while %s work(s) on epochs: warming up", ", ".join(working))
        self._check_plans()
        self._attach_spark()
