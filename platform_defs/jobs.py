"""``epoch_job``: moves the pipeline one epoch forward, or runs/re-runs the epoch its partition names.

It is an op graph rather than an asset job because it must run without a partition (Dagster refuses
to run a partitioned asset job without one); its ops report partitioned materializations of the
same assets, so the UI's partition view shows its epochs like any other materialization.
"""

from dagster import In, JobDefinition, Nothing, OpDefinition, OpExecutionContext, Out, in_process_executor, job, op

from assets.epoch_assets import COMMIT_ASSET, COMPACTION_ASSET
from assets.materialization import record_materialization
from epochal.pipeline.model import Pipeline
from resources.checkpoint import CheckpointControllerResource

PARTITION_TAG = "dagster/partition"


@op(
    out=Out(int), description="Recover if needed, then inject the next epoch (or take the one the partition tag names)."
)
def barrier(context: OpExecutionContext, checkpoint: CheckpointControllerResource) -> int:
    runtime = checkpoint.runtime
    record, recovery = runtime.start_epoch(context.run_id, context.run.tags.get(PARTITION_TAG))
    if recovery is not None:
        context.log.warning(
            f"recovery ({recovery.reason}): back to committed epoch {recovery.committed_epoch}, aborted "
            f"{recovery.aborted or 'nothing'}, discarded {len(recovery.discarded_locations)} location(s), "
            f"{recovery.attempts} attempt(s), {recovery.seconds:.2f}s"
        )
    checkpoint.ensure_partition(context.instance, record.epoch)
    context.log.info(f"epoch {record.epoch}: {record.kind.value} barrier after {record.prev}, {record.state.value}")
    return record.epoch


def _step_op(op_name: str, asset: str, step: str) -> OpDefinition:
    @op(name=op_name, ins={"epoch": In(int), "after": In(Nothing)}, out=Out(int))
    def _step(context: OpExecutionContext, checkpoint: CheckpointControllerResource, epoch: int) -> int:
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
        record_materialization(context, report)
        return epoch

    return _step


def build_epoch_job(pipeline: Pipeline) -> JobDefinition:
    sources = {name: _step_op(f"source__{name}", name, "source") for name in pipeline.sources}
    views = {name: _step_op(f"view__{name}", name, "view") for name in pipeline.views}
    commit = _step_op("commit", COMMIT_ASSET, "commit")
    sinks = {name: _step_op(f"sink__{name}", name, "sink") for name in pipeline.sinks}
    compaction = _step_op("compaction", COMPACTION_ASSET, "compaction")

    # In-process: one epoch is one process and one JVM, however many steps it has. The
    # multiprocess executor would start a JVM per step (measured in the README).
    @job(
        name="epoch_job",
        executor_def=in_process_executor,
        tags={"epochal/kind": "epoch"},
        description="Recover if needed, inject the next epoch and process it to commit and into the sinks. "
        "With a dagster/partition tag: run or re-run that epoch.",
    )
    def epoch_job() -> None:
        epoch = barrier()
        done = {name: op_def(epoch=epoch) for name, op_def in sources.items()}
        for name in pipeline.view_order():
            done[name] = views[name](epoch=epoch, after=[done[u] for u in pipeline.views[name].upstreams])
        committed = commit(epoch=epoch, after=list(done.values()))
        compaction(epoch=committed)  # parallel to the sinks: neither waits for the other
        for name, op_def in sinks.items():
            op_def(epoch=committed, after=[done[pipeline.sinks[name].from_table]])

    return epoch_job


__all__ = ["build_epoch_job"]
