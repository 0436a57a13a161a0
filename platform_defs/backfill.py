"""``backfill_job``: advances every pending backfill (views added to a running pipeline).

An op job like epoch_job, so it runs without a partition; it reports each view's progress as a
materialization of its ``backfill__<view>`` asset, at the epoch partition the view has reached, so
the UI plots rows per second and epochs behind across runs.
"""

from dagster import JobDefinition, OpExecutionContext, in_process_executor, job, op

from assets.epoch_assets import backfill_asset_name
from assets.materialization import record_materialization
from epochal.backfill.runner import BackfillRunner
from epochal.checkpoint.statements.rebuilds import rebuilt_view
from epochal.runtime.facade import StepReport
from platform_defs.run_summary import console_run_config
from resources.checkpoint import CheckpointControllerResource

BACKFILL_JOB = "backfill_job"


@op(
    description="Advance every pending backfill for at most EPOCHAL_BACKFILL_RUN_S seconds: snapshot "
    "phase, log-store catch-up, join."
)
def advance_backfills(context: OpExecutionContext, checkpoint: CheckpointControllerResource) -> None:
    runtime = checkpoint.runtime
    runner = BackfillRunner(runtime)
    pending = runner.pending()
    if not pending:
        context.log.info("no backfill is pending")
        return
    context.log.info(f"advancing {len(pending)} backfill(s): {', '.join(b.view for b in pending)}")
    views = runtime.pipeline.views
    for progress in runner.advance():
        rebuilt = rebuilt_view(progress.view)
        if rebuilt is not None:
            # A changed view's new statement, under its shadow name: reported as the view's backfill.
            epoch = progress.caught_up_epoch or progress.snapshot_epoch or 0
            checkpoint.ensure_partition(context.instance, epoch)
            metadata = {**progress.metadata(), "rebuild": "new statement; the old one serves until the switch"}
            record_materialization(context, StepReport(backfill_asset_name(rebuilt), epoch, metadata))
            continue
        if views[progress.view].internal_of is not None:
            # An internal stage: logged; its view's asset reports the backfill the user asked for.
            context.log.info(f"stage {progress.view}: {progress.metadata()}")
            continue
        epoch = progress.caught_up_epoch or progress.snapshot_epoch or 0
        checkpoint.ensure_partition(context.instance, epoch)
        record_materialization(context, StepReport(backfill_asset_name(progress.view), epoch, progress.metadata()))


def build_backfill_job(log_level: str = "INFO") -> JobDefinition:
    @job(
        name=BACKFILL_JOB,
        executor_def=in_process_executor,
        config=console_run_config(log_level),
        tags={"epochal/kind": "backfill"},
        description="Advance every pending backfill of a view added to the running pipeline: snapshot, "
        "change-log catch-up, then the join. Live epochs keep committing meanwhile.",
    )
    def backfill_job() -> None:
        advance_backfills()

    return backfill_job


__all__ = ["BACKFILL_JOB", "build_backfill_job"]
