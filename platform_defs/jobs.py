"""``epoch_job``: moves the pipeline one epoch forward, or runs/re-runs the epoch its partition names.

A run may process several epochs: one started from the shell takes the epochs injected and waiting
for a run along with its own, and the barrier sensor's runs take every waiting epoch, so a run that
started late catches up in one process instead of one process (and one Spark attach) per epoch.

The barrier maps the graph over its epochs (a dynamic output per epoch, steps ``view__v[e<epoch>]``):
each epoch's views, commit and sinks are steps of their own, so an epoch commits and reaches its
sinks as soon as its own views are written, not after the last epoch of the run. The executor runs
the oldest epoch's steps first and a table's step only after the same table's step of the epoch
before it (``platform_defs.executor``); each step reports its epoch partition's materialization.

It is an op graph rather than an asset job because it must run without a partition (Dagster refuses
to run a partitioned asset job without one); its ops report partitioned materializations of the
same assets, so the UI's partition view shows its epochs like any other materialization.
"""

from dagster import (
    DagsterLogManager,
    DynamicOut,
    DynamicOutput,
    In,
    JobDefinition,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    job,
    op,
)

from assets.epoch_assets import COMMIT_ASSET, COMPACTION_ASSET
from assets.materialization import record_materialization
from epochal.checkpoint.records import RecoveryReport
from epochal.pipeline.model import Pipeline
from platform_defs.executor import mapping_key, threaded_executor_def
from platform_defs.run_summary import console_run_config
from resources.checkpoint import CheckpointControllerResource

PARTITION_TAG = "dagster/partition"
#: On the barrier sensor's runs: take every epoch waiting for a run, not only the partition's.
TAKE_WAITING_TAG = "epochal/take"


@op(
    out=DynamicOut(int),
    description="Recover if needed, then take the epochs this run processes: a newly injected one (no partition), "
    "the partition's (a re-run), or, for the barrier sensor's runs, every epoch waiting for a run, in order.",
)
def barrier(context: OpExecutionContext, checkpoint: CheckpointControllerResource):  # noqa: ANN201 (a generator of DynamicOutput)
    runtime = checkpoint.runtime
    tags = context.run.tags
    taken = runtime.take_epochs(
        context.run_id, tags.get(PARTITION_TAG), waiting=tags.get(TAKE_WAITING_TAG) == "waiting"
    )
    recovery = taken.recovery
    if recovery is not None:
        log_recovery(context.log, recovery)
    if taken.stood_by_s:
        context.log.info(f"stood by {taken.stood_by_s:.1f}s while another run worked on its epochs")
    for epoch in taken.epochs:
        checkpoint.ensure_partition(context.instance, epoch)
    if not taken.epochs:
        context.log.info(
            f"no epoch is waiting: epoch {tags.get(PARTITION_TAG)} was taken by an earlier run with the epochs "
            "before it; nothing to do"
        )
    elif len(taken.epochs) > 1:
        context.log.info(f"epochs {taken.epochs}: taken by this run, processed in order")
    else:
        context.log.info(f"epoch {taken.epochs[0]}")
    for epoch in taken.epochs:
        yield DynamicOutput(epoch, mapping_key=mapping_key(epoch))


def log_recovery(log: DagsterLogManager, recovery: RecoveryReport) -> None:
    """A recovery that threw work away is a WARNING; one that found nothing to undo (every first
    run's bootstrap, a clean restart) is routine, so INFO."""
    message = (
        f"recovery ({recovery.reason}): back to committed epoch {recovery.committed_epoch}, aborted "
        f"{recovery.aborted or 'nothing'}, discarded {len(recovery.discarded_locations)} location(s), "
        f"{recovery.attempts} attempt(s), {recovery.seconds:.2f}s"
    )
    if recovery.aborted or recovery.discarded_locations:
        log.warning(message)
    else:
        log.info(message)


def _step_op(op_name: str, asset: str, step: str, after: int = 0) -> OpDefinition:
    """One step of one epoch; ``after`` Nothing inputs order it behind the steps it reads (Dagster
    does not take a fan-in list of outputs downstream of a dynamic output, named inputs it does)."""

    @op(name=op_name, ins={"epoch": In(int), **{f"after_{i}": In(Nothing) for i in range(after)}}, out=Out(Nothing))
    def _step(context: OpExecutionContext, checkpoint: CheckpointControllerResource, epoch: int) -> None:
        runtime = checkpoint.runtime
        if step == "source":
            report = runtime.run_source(epoch, asset, context.run_id)
        elif step == "view":
            report = runtime.run_view(epoch, asset, context.run_id)
        elif step == "commit":
            report = runtime.commit(epoch)
            checkpoint.retire_partitions(context.instance)
        elif step == "compaction":
            # After the commit, outside it and without the epoch's claim; a failure is reported in
            # the metadata and logged, never raised: the epoch is committed whatever happens here.
            report = runtime.compact(epoch)
            if report.metadata["failures"] != "none":
                context.log.warning(f"compaction failed (the epoch is committed): {report.metadata['failures']}")
        else:
            report = runtime.run_sink(epoch, asset, context.run_id)
        record_materialization(context, report)  # the epoch partition's materialization

    return _step


def build_epoch_job(pipeline: Pipeline, step_threads: int = 1, log_level: str = "INFO") -> JobDefinition:
    sources = {name: _step_op(f"source__{name}", name, "source") for name in pipeline.sources}
    views = {
        name: _step_op(f"view__{name}", name, "view", len(view.upstreams)) for name, view in pipeline.views.items()
    }
    commit = _step_op("commit", COMMIT_ASSET, "commit", len(pipeline.tables))
    sinks = {name: _step_op(f"sink__{name}", name, "sink", 2) for name in pipeline.sinks}
    compaction = _step_op("compaction", COMPACTION_ASSET, "compaction", 1)

    def one_epoch(epoch):  # noqa: ANN001, ANN202 (Dagster's composition types)
        done = {name: op_def(epoch=epoch) for name, op_def in sources.items()}
        for name in pipeline.view_order():
            upstreams = pipeline.views[name].upstreams
            done[name] = views[name](epoch=epoch, **{f"after_{i}": done[u] for i, u in enumerate(upstreams)})
        committed = commit(epoch=epoch, **{f"after_{i}": done[t] for i, t in enumerate(pipeline.tables)})
        compaction(epoch=epoch, after_0=committed)  # parallel to the sinks: neither waits for the other
        for name, op_def in sinks.items():
            op_def(epoch=epoch, after_0=committed, after_1=done[pipeline.sinks[name].from_table])

    # One process, one Spark attach, however many steps: the multiprocess executor would attach
    # (or start a JVM) and load the pipeline per step. Steps whose inputs are ready run on threads
    # (EPOCHAL_STEP_THREADS), so one view's driver work overlaps another's Spark job.
    @job(
        name="epoch_job",
        executor_def=threaded_executor_def(step_threads),
        config=console_run_config(log_level),
        tags={"epochal/kind": "epoch"},
        description="Recover if needed, inject the next epoch and process it, with any epochs waiting for a run, "
        "to commit and into the sinks. "
        "With a dagster/partition tag: run or re-run that epoch.",
    )
    def epoch_job() -> None:
        barrier().map(one_epoch)

    return epoch_job


__all__ = ["build_epoch_job"]
