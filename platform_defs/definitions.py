"""Everything Dagster loads, assembled in one place from the settings and the pipeline's SQL.

Loading fails with the pipeline's errors (file:line and the fix) before any epoch can run.
"""

from __future__ import annotations

from dagster import Definitions

from assets.check_assets import build_check_assets
from assets.epoch_assets import build_epoch_assets
from epochal.pipeline.loader import load_pipeline
from epochal.settings import Settings
from platform_defs.backfill import build_backfill_job
from platform_defs.executor import threaded_executor_def
from platform_defs.jobs import build_epoch_job
from platform_defs.sensors import build_barrier_sensor, driven_assets_job
from resources.checkpoint import CheckpointControllerResource
from resources.spark import EpochalSparkResource


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or Settings.from_env()
    pipeline = load_pipeline(settings.pipeline_dir)
    spark = EpochalSparkResource.from_settings(settings)
    checkpoint = CheckpointControllerResource(
        spark=spark, home=str(settings.home), pipeline_dir=str(settings.pipeline_dir)
    )
    job = build_epoch_job(pipeline, settings.step_threads, settings.log_level)
    backfill = build_backfill_job(settings.log_level)
    driven = driven_assets_job()
    return Definitions(
        assets=build_epoch_assets(pipeline),
        asset_checks=build_check_assets(pipeline),
        jobs=[job, backfill, driven],
        sensors=[build_barrier_sensor(settings, job, backfill, driven)],
        resources={"spark": spark, "checkpoint": checkpoint},
        # Asset materializations from the UI run in one process too (one Spark attach per run, not
        # per step), their ready steps on threads.
        executor=threaded_executor_def(settings.step_threads),
    )
