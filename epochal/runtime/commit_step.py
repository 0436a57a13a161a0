"""The commit step of an epoch: commit it (with every older epoch that is ready) once every table
has collected it, or wait for order behind older epochs that other runs are still working on.
Nothing fails for waiting; only an older epoch that cannot finish, or a table that cannot write
the epoch, ends the step with an error that says what to do."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from epochal.checkpoint.records import EpochAborted, EpochState, OrderWaitAbandoned
from epochal.epoch import epoch_physical_ms
from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.runtime.report import StepReport

if TYPE_CHECKING:
    from epochal.runtime.context import StepContext

# How long a commit step waits for an older epoch (owned by another, live run) to commit first, so
# that this run's sinks deliver its epoch. Past it the step ends without error: the epoch is
# collected by every table, and the run that commits the older epochs commits it with them.
COMMIT_WAIT_S = 120.0


def lag_seconds(epoch: int | None) -> float | None:
    """How far ``epoch`` is behind the wall clock, in seconds (None for no epoch)."""
    return None if epoch is None else round(time.time() - epoch_physical_ms(epoch) / 1000, 3)


class CommitStep:
    def __init__(self, ctx: StepContext, retire_removed: Callable[[], list[str]]):
        self.ctx = ctx
        #: retires the tables the SQL files no longer name (``PipelineEdits.retire_removed``)
        self._retire_removed = retire_removed

    def run(self, epoch: int) -> StepReport:
        controller = self.ctx.controller
        started = time.time()
        by_this_call: list[int] = []
        delay = 0.05
        rechecked = retired_unknown = False
        while True:
            # The step's questions and, when it is done, the end of its claim: one transaction.
            # A barrier still waiting for its checkpoint is then bounded by the epoch timeout,
            # not by this process staying alive.
            step = controller.commit_step(epoch)
            if step.committed:
                fault_point("committed")
            by_this_call += step.committed
            record = step.record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(f"epoch {epoch} was aborted by a recovery before it could commit")
            if step.missing and record.state is not EpochState.COMMITTED:
                unknown = [t for t in step.missing if t not in self.ctx.pipeline.tables]
                if unknown and not retired_unknown:
                    # Not in this run's files: removed from them (no injection has retired it yet,
                    # e.g. the sensor's tick read the files before), or joined since they were read.
                    retired_unknown = True
                    self._retire_removed()
                    continue
                if unknown:
                    raise EpochalError(
                        f"epoch {epoch} cannot commit: {', '.join(unknown)} joined the pipeline after this run "
                        "read its SQL files, and this run cannot write them. A recovery takes the epoch back, "
                        "and the next run, which reads the files afresh, computes it with them"
                    )
                if not self._written_by_live_runner(epoch, step.missing):
                    if not rechecked:  # (its runner may have written it, and let go, since this step read)
                        rechecked = True
                        continue
                    raise EpochalError(self._missing_message(epoch, step.missing))
            if step.released:
                break  # committed, or a barrier that commits with the next checkpoint
            # Collected by every table, behind older epochs that other runs are still working on.
            # Waiting for order is never a failure: only an older epoch that cannot finish ends it.
            stuck = controller.blocked_by(epoch)
            if stuck:
                raise OrderWaitAbandoned(
                    f"epoch {epoch} is collected but cannot commit before an older epoch that cannot finish "
                    f"({stuck}); the recovery this calls for aborts it. Run epoch_job without a partition to go on"
                )
            if time.time() - started > COMMIT_WAIT_S:
                controller.release(epoch)
                break  # the older epochs' runs commit it with theirs
            time.sleep(delay)
            delay = min(1.0, delay * 1.5)
        committed, in_flight = step.committed_epoch, step.in_flight
        return StepReport(
            "epoch_commit",
            epoch,
            {
                "epoch": epoch,
                "state": record.state.value,
                "kind": record.kind.value,
                "committed_epoch": committed,
                "committed_by_this_step": ", ".join(map(str, by_this_call)) or "none",
                "in_flight": len(in_flight),
                "lag_seconds": lag_seconds(committed),
                "tables": len(controller.tables),
            },
        )

    def _written_by_live_runner(self, epoch: int, missing: list[str]) -> bool:
        """Whether every table ``epoch`` misses joined by backfill while it was in flight, and a
        live runner holds each one's backfill: the runner writes such epochs right after the join
        (and its collect commits the epoch), so this is a wait for order, not a failure."""
        handed = self.ctx.controller.backfills_joined_before(missing, epoch)
        return set(handed) == set(missing) and self.ctx.controller.backfills_held(handed) == sorted(handed)

    def _missing_message(self, epoch: int, missing: list[str]) -> str:
        """Why ``epoch`` cannot commit. A view that joined by backfill while the epoch was in flight
        had its live step skipped; its runner writes that epoch, and one killed first left it
        unwritten: no partition run can mend that, a recovery re-runs the epoch with the view."""
        handed = self.ctx.controller.backfills_joined_before(missing, epoch)
        if handed:
            return (
                f"epoch {epoch} cannot commit: {', '.join(handed)} joined the live flow while it was in flight, and "
                "the backfill runner that writes such epochs stopped before writing it. A recovery (the next run, "
                "or `epochal recover`) takes the epoch back and re-runs it with them"
            )
        return f"epoch {epoch} cannot commit: {', '.join(missing)} have not written it; materialize them first"
