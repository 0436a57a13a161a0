"""The asset graph: sources -> views -> epoch_commit -> sinks, every asset partitioned by epoch.

Materializing a partition in the UI runs that epoch's step for the asset. The epoch must have been
injected by the checkpoint controller (epoch_job or the barrier sensor do that); the partition
keys mirror the meta store.
"""


from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    DynamicPartitionsDefinition,
    MaterializeResult,
    asset,
)

from assets.materialization import to_metadata
from epochal.pipeline.model import Pipeline
from resources.checkpoint import EPOCHS_PARTITIONS, CheckpointControllerResource

EPOCHS = DynamicPartitionsDefinition(name=EPOCHS_PARTITIONS)
COMMIT_ASSET = "epoch_commit"


def _epoch(context: AssetExecutionContext) -> int:
    return int(context.partition_key)


def _source_asset(name: str, description: str) -> AssetsDefinition:
    @asset(name=name, partitions_def=EPOCHS, group_name="sources", kinds={"spark", "parquet"}, description=description)
    def _source(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.run_source(_epoch(context), name, context.run_id, release=True)
        return MaterializeResult(metadata=to_metadata(report))

    return _source


def _view_asset(name: str, upstreams: tuple[str, ...], description: str) -> AssetsDefinition:
    @asset(
        name=name,
        deps=list(upstreams),
        partitions_def=EPOCHS,
        group_name="views",
        kinds={"spark", "parquet"},
        description=description,
    )
    def _view(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.run_view(_epoch(context), name, context.run_id, release=True)
        return MaterializeResult(metadata=to_metadata(report))

    return _view


def _commit_asset(tables: list[str]) -> AssetsDefinition:
    @asset(
        name=COMMIT_ASSET,
        deps=tables,
        partitions_def=EPOCHS,
        group_name="checkpoint",
        description="Commits the epoch for every table at once, after all of them have written it "
        "(commit alignment). Readers and sinks only ever see committed epochs.",
    )
    def _commit(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.commit(_epoch(context))
        checkpoint.retire_partitions(context.instance)
        return MaterializeResult(metadata=to_metadata(report))

    return _commit


def _sink_asset(name: str, upstream: str, description: str) -> AssetsDefinition:
    @asset(
        name=name,
        deps=[COMMIT_ASSET, upstream],
        partitions_def=EPOCHS,
        group_name="sinks",
        kinds={"duckdb"},
        description=description,
    )
    def _sink(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.run_sink(_epoch(context), name, context.run_id)
        return MaterializeResult(metadata=to_metadata(report))

    return _sink


def _fenced(sql: str) -> str:
    return f"```sql\n{sql.strip()}\n```"


def build_epoch_assets(pipeline: Pipeline) -> list[AssetsDefinition]:
    assets: list[AssetsDefinition] = []
    for name, source in pipeline.sources.items():
        columns = ", ".join(f"{c.name} {c.type}" for c in source.columns)
        options = ", ".join(f"{k} = '{v}'" for k, v in source.options.items())
        assets.append(
            _source_asset(
                name,
                f"Source `{name}` ({source.location}).\n\n"
                + _fenced(f"CREATE SOURCE {name} ({columns})\nWITH ({options})"),
            )
        )
    for name in pipeline.view_order():
        view = pipeline.views[name]
        assets.append(
            _view_asset(
                name,
                view.upstreams,
                f"Materialized view `{name}` ({view.location}), "
                "maintained from its upstreams' changes:\n\n" + _fenced(view.query),
            )
        )
    assets.append(_commit_asset(pipeline.tables))
    for name, sink in pipeline.sinks.items():
        options = ", ".join(f"{k} = '{v}'" for k, v in sink.options.items())
        assets.append(
            _sink_asset(
                name,
                sink.from_table,
                f"Sink `{name}` ({sink.location}): "
                f"delivers committed epochs of `{sink.from_table}` exactly once.\n\n"
                + _fenced(f"CREATE SINK {name} FROM {sink.from_table}\nWITH ({options})"),
            )
        )
    return assets
