"""The barrier sensor: injects an epoch every barrier interval and requests its run.

It is the barrier worker's timer. It recovers first when something failed, skips a tick when
injection is paused or the in-flight limit is reached, and uses the epoch as run_key so a tick
that is evaluated twice can never start one epoch twice.
"""


from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.epoch_assets import EPOCHS
from epochal.settings import Settings
from platform_defs.jobs import PARTITION_TAG
from resources.checkpoint import CheckpointControllerResource


def build_barrier_sensor(settings: Settings, job_name: str = "epoch_job") -> SensorDefinition:
    @sensor(
        name="barrier_sensor",
        job_name=job_name,
        minimum_interval_seconds=max(1, settings.barrier_interval_ms // 1000),
        default_status=DefaultSensorStatus.STOPPED,
        description=f"Injects an epoch every {settings.barrier_interval_ms} ms (EPOCHAL_BARRIER_INTERVAL_MS), "
        f"at most {settings.max_in_flight} in flight (EPOCHAL_MAX_IN_FLIGHT).",
    )
    def barrier_sensor(context: SensorEvaluationContext, checkpoint: CheckpointControllerResource):
        runtime = checkpoint.runtime
        reason = runtime.controller.epoch_log.recovery_reason()
        if reason:
            report = runtime.recover(reason)
            context.log.warning(
                f"recovered ({reason}): committed epoch {report.committed_epoch}, aborted {report.aborted}"
            )
        blocked = runtime.controller.epoch_log.can_inject()
        if blocked:
            return SkipReason(blocked)
        record = runtime.controller.epoch_log.inject(runtime.plan)
        key = str(record.epoch)
        return SensorResult(
            run_requests=[RunRequest(run_key=key, tags={PARTITION_TAG: key})],
            dynamic_partitions_requests=[EPOCHS.build_add_request([key])],
        )

    return barrier_sensor
