"""The barrier sensor: injects an epoch every barrier interval and requests its run.

It is the barrier worker's timer. It recovers first when something failed, skips a tick when
injection is paused or the in-flight limit is reached, and uses the epoch as run_key so a tick
that is evaluated twice can never start one epoch twice.
"""

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.epoch_assets import EPOCHS
from epochal.backfill.runner import BackfillRunner
from epochal.settings import Settings
from platform_defs.jobs import PARTITION_TAG
from resources.checkpoint import CheckpointControllerResource


def build_barrier_sensor(settings: Settings, epoch_job: JobDefinition, backfill_job: JobDefinition) -> SensorDefinition:
    @sensor(
        name="barrier_sensor",
        jobs=[epoch_job, backfill_job],
        minimum_interval_seconds=max(1, settings.barrier_interval_ms // 1000),
        default_status=DefaultSensorStatus.STOPPED,
        description=f"Injects an epoch every {settings.barrier_interval_ms} ms (EPOCHAL_BARRIER_INTERVAL_MS), "
        f"at most {settings.max_in_flight} in flight (EPOCHAL_MAX_IN_FLIGHT), and requests a backfill_job run "
        "while a view added to the pipeline is backfilling (one at a time).",
    )
    def barrier_sensor(context: SensorEvaluationContext, checkpoint: CheckpointControllerResource):
        runtime = checkpoint.runtime
        reason = runtime.controller.epoch_log.recovery_reason()
        if reason:
            report = runtime.recover(reason)
            context.log.warning(
                f"recovered ({reason}): committed epoch {report.committed_epoch}, aborted {report.aborted}"
            )
        requests = _backfill_request(context, runtime, backfill_job.name)
        blocked = runtime.controller.epoch_log.can_inject()
        if blocked:
            return SensorResult(run_requests=requests) if requests else SkipReason(blocked)
        record = runtime.controller.epoch_log.inject(runtime.plan)
        key = str(record.epoch)
        return SensorResult(
            run_requests=[RunRequest(run_key=key, job_name=epoch_job.name, tags={PARTITION_TAG: key}), *requests],
            dynamic_partitions_requests=[EPOCHS.build_add_request([key])],
        )

    return barrier_sensor


_ACTIVE = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


def _backfill_request(context: SensorEvaluationContext, runtime, job_name: str) -> list[RunRequest]:  # noqa: ANN001
    """A backfill_job run while a backfill is pending and none is queued or running: never two at
    once (each view is also claimed in the meta store, so a second run would only wait)."""
    if not BackfillRunner(runtime).pending():
        return []
    running = context.instance.get_run_records(RunsFilter(job_name=job_name, statuses=_ACTIVE), limit=1)
    if running:
        return []
    return [RunRequest(run_key=None, job_name=job_name, tags={"epochal/kind": "backfill"})]
