"""The barrier sensor: injects an epoch every barrier interval and requests its run.

It is the barrier worker's timer. It recovers first when something failed, and injects on the
barrier interval's grid (``platform_defs.barrier_schedule``) unless injection is paused or the in-flight
limit is reached. Runs take every epoch waiting for a run when
they start, so it requests a run only when none is queued: a run that starts late processes the
epochs that queued up behind it, in order, in one process. One run more than EPOCHAL_MAX_EPOCH_RUNS
may be going: it stands by, warm, until a working run has committed, then takes what waits. The
newest waiting epoch is the run_key, so a tick that is evaluated twice can never start two runs for
the same epochs.
"""

import time

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    sensor,
)

from assets.epoch_assets import EPOCHS
from epochal.backfill.runner import BackfillRunner
from epochal.settings import Settings
from platform_defs.barrier_schedule import BarrierSchedule, SensorCursor
from platform_defs.jobs import PARTITION_TAG, TAKE_WAITING_TAG
from resources.checkpoint import CheckpointControllerResource

#: the sensor's clock (tests set it)
_clock = time.time


#: What ``define_asset_job`` returns (Dagster does not export its type, UnresolvedAssetJobDefinition).
AssetJob = object
#: The asset job that ties barrier_sensor to the assets it drives in the UI (see build_barrier_sensor).
DRIVEN_ASSETS_JOB = "epoch_assets"


def driven_assets_job() -> AssetJob:
    """Every epoch asset, by epoch partition: what epoch_job and backfill_job materialize. Dagster
    lists a sensor as an asset's automation when it targets a job holding the asset, and epoch_job is
    an op graph (``platform_defs.jobs`` says why), so the sensor targets this job too. It never
    requests a run of it: every RunRequest names epoch_job or backfill_job. Launched by hand with a
    partition it is the UI's "Materialize" of that epoch."""
    return define_asset_job(
        DRIVEN_ASSETS_JOB,
        selection=AssetSelection.all(),
        partitions_def=EPOCHS,
        description="The epoch assets barrier_sensor drives (through epoch_job and backfill_job), by epoch.",
    )


def build_barrier_sensor(
    settings: Settings,
    epoch_job: JobDefinition,
    backfill_job: JobDefinition,
    driven: AssetJob | None = None,
) -> SensorDefinition:
    """``driven`` (``driven_assets_job()``): targeted only so that the UI shows the sensor as the
    automation of the assets; the sensor's runs are epoch_job's and backfill_job's."""
    schedule = BarrierSchedule(settings.barrier_interval_ms / 1000)

    @sensor(
        name="barrier_sensor",
        jobs=[epoch_job, backfill_job, *([driven] if driven is not None else [])],
        minimum_interval_seconds=schedule.minimum_interval_seconds(),
        default_status=DefaultSensorStatus.STOPPED,
        description=f"Injects an epoch every {settings.barrier_interval_ms} ms (EPOCHAL_BARRIER_INTERVAL_MS), "
        f"at most {settings.max_in_flight} in flight (EPOCHAL_MAX_IN_FLIGHT); requests an epoch_job run, at most "
        f"{settings.max_epoch_runs} at once (EPOCHAL_MAX_EPOCH_RUNS), that takes every waiting epoch; requests a "
        "backfill_job run "
        "while a view added to the pipeline is backfilling (one at a time).",
    )
    def barrier_sensor(context: SensorEvaluationContext, checkpoint: CheckpointControllerResource):
        runtime = checkpoint.runtime
        reason = runtime.controller.recovery_reason()
        if reason:
            report = runtime.recover(reason)
            context.log.warning(
                f"recovered ({reason}): committed epoch {report.committed_epoch}, aborted {report.aborted}"
            )
        requests = _backfill_request(context, runtime, backfill_job.name)
        controller = runtime.controller
        cursor = SensorCursor.parse(context.cursor)
        now = _clock()
        partitions = []
        if schedule.due(cursor.next_barrier, now):
            runtime.apply_pipeline_changes()  # (a view removed from the files: its runs could not commit)
            blocked = controller.can_inject() or runtime.waiting_for_an_edit()
            if blocked is None:
                key = str(controller.inject(runtime.plan).epoch)
                partitions.append(key)
                cursor = SensorCursor(cursor.requested, schedule.after_injection(cursor.next_barrier, now))
            else:
                context.log.info(blocked)
        else:
            blocked = f"the next barrier is due in {cursor.next_barrier - now:.1f}s"
        waiting = controller.waiting()
        # A run queued or starting takes every waiting epoch when it starts (its barrier op runs
        # after this tick's injection); else one run for all of them, keyed by the newest, once.
        if waiting and str(waiting[-1]) != cursor.requested and _room_for_a_run(context, epoch_job.name, settings):
            newest = waiting[-1]
            requests.insert(0, RunRequest(run_key=str(newest), job_name=epoch_job.name, tags=_epoch_tags(newest)))
            cursor = SensorCursor(str(newest), cursor.next_barrier)
        if not requests and not partitions:
            return SkipReason(blocked or "the epochs waiting have a run requested")
        return SensorResult(
            run_requests=requests,
            cursor=cursor.serialize(),
            dynamic_partitions_requests=[EPOCHS.build_add_request(partitions)] if partitions else None,
        )

    return barrier_sensor


_QUEUED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
_ACTIVE = [*_QUEUED, DagsterRunStatus.STARTED]


def _room_for_a_run(context: SensorEvaluationContext, job_name: str, settings: Settings) -> bool:
    """Whether a new run would take the waiting epochs: no run of ``job_name`` is queued or starting
    (its first op will see this tick's epoch), and fewer than EPOCHAL_MAX_EPOCH_RUNS are going, plus
    one that stands by (EPOCHAL_STANDBY_RUN): it starts while they work and takes the epochs waiting
    once one of them has committed, so no launch gap opens between runs. Runs side by side share
    the cores: on a laptop one run taking several epochs beats several runs."""
    active = context.instance.get_run_records(RunsFilter(job_name=job_name, statuses=_ACTIVE))
    queued = [r for r in active if r.dagster_run.status in _QUEUED]
    return not queued and len(active) < settings.max_epoch_runs + int(settings.standby_run)


def _epoch_tags(epoch: int) -> dict[str, str]:
    return {PARTITION_TAG: str(epoch), TAKE_WAITING_TAG: "waiting"}


def _backfill_request(context: SensorEvaluationContext, runtime, job_name: str) -> list[RunRequest]:  # noqa: ANN001
    """A backfill_job run while a backfill is pending and none is queued or running: never two at
    once (each view is also claimed in the meta store, so a second run would only wait)."""
    if not BackfillRunner(runtime).pending():
        return []
    running = context.instance.get_run_records(RunsFilter(job_name=job_name, statuses=_ACTIVE), limit=1)
    if running:
        return []
    return [RunRequest(run_key=None, job_name=job_name, tags={"epochal/kind": "backfill"})]
