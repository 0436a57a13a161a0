"""Driving one epoch through a runtime in this process, one step at a time, without Dagster: for the
warm-up of a new Spark server (``spark_warmup``) and for tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime


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
