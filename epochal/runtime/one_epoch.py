"""Driving one epoch through a runtime in this process, one step at a time, without Dagster: for the
warm-up of a new Spark server (``epochal.spark.warmup``) and for tests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from epochal.pipeline.loader import load_pipeline
from epochal.runtime.facade import EpochRuntime
from epochal.settings import DEMO_PIPELINE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.settings import Settings

log = logging.getLogger(__name__)


def run_epoch(runtime: EpochRuntime, epoch: int | None = None) -> int:
    """What epoch_job does: inject (unless ``epoch`` is given), sources, views in order, commit, sinks."""
    if epoch is None:
        epoch = runtime.start_epoch(None, None)[0].epoch
    for name in runtime.pipeline.sources:
        runtime.run_source(epoch, name)
    for name in runtime.pipeline.view_order():
        runtime.run_view(epoch, name)
    runtime.commit(epoch)
    for name in runtime.pipeline.sinks:
        runtime.run_sink(epoch, name)
    return epoch


@contextmanager
def demo_epochs(settings: Settings, spark: Callable[[], SparkSession]) -> Iterator[Callable[[], int]]:
    """The demo pipeline's runtime on ``settings`` (a scratch home) and ``spark``, recovered and
    ready; yields a callable that runs one epoch. On exit the runtime and its Spark session are
    released (a Connect session: released on the server, which stays up)."""
    runtime = EpochRuntime(settings, load_pipeline(DEMO_PIPELINE), spark)
    try:
        runtime.recover("bootstrap")
        yield lambda: run_epoch(runtime)
    finally:
        try:
            runtime.close()
            if "spark" in runtime.__dict__:
                runtime.spark.stop()
        except Exception:  # the warm-up is speed only: its clean-up never fails the start
            log.warning("could not release the warm-up's Spark session", exc_info=True)
