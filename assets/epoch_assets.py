"""The asset graph: sources -> views -> epoch_commit -> sinks, every asset partitioned by epoch.

Materializing a partition in the UI runs that epoch's step for the asset. The epoch must have been
injected by the checkpoint controller (epoch_job or the barrier sensor do that); the partition
keys mirror the meta store.
"""

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    DynamicPartitionsDefinition,
    MaterializeResult,
    asset,
)

from assets.materialization import (
    DEAD_LETTERS_CHECK,
    backfill_asset_name,
    dead_letters_check_spec,
    dead_letters_evaluation,
    dead_letters_warning,
    snapshot_backfill_materialization,
    to_metadata,
)
from epochal.connectors.postgres_cdc import NAME as POSTGRES_CDC
from epochal.options import clause_sql, with_options
from epochal.pipeline.model import Pipeline, ViewDef
from epochal.runtime.facade import StepReport
from epochal.sinks.spec import shown_options
from resources.checkpoint import EPOCHS_PARTITIONS, CheckpointControllerResource

EPOCHS = DynamicPartitionsDefinition(name=EPOCHS_PARTITIONS)
COMMIT_ASSET = "epoch_commit"
COMPACTION_ASSET = "epoch_compaction"


def _epoch(context: AssetExecutionContext) -> int:
    return int(context.partition_key)


def _source_asset(name: str, description: str) -> AssetsDefinition:
    @asset(
        name=name,
        partitions_def=EPOCHS,
        group_name="sources",
        kinds={"spark", "parquet"},
        description=description,
        check_specs=[dead_letters_check_spec(name)],
    )
    def _source(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.run_source(_epoch(context), name, context.run_id, release=True)
        context.log.info(str(report))  # (the step's line, its epoch with its wall-clock time, as epoch_job logs)
        warning = dead_letters_warning(report)
        if warning:
            context.log.warning(warning)
        evaluation = dead_letters_evaluation(report)
        # the declared check is always answered: a step with nothing to read (a retired source) passes
        check = AssetCheckResult(check_name=DEAD_LETTERS_CHECK, passed=True, description="no records read")
        if evaluation is not None:
            check = AssetCheckResult(
                check_name=DEAD_LETTERS_CHECK,
                passed=evaluation.passed,
                severity=evaluation.severity,
                metadata=evaluation.metadata,
                description=evaluation.description,
            )
        backfill = snapshot_backfill_materialization(report)
        if backfill is not None:  # a CDC table's snapshot progressed: plotted as a view's backfill is
            context.log_event(backfill)
        return MaterializeResult(metadata=to_metadata(report), check_results=[check])

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
        context.log.info(str(report))
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
        context.log.info(str(report))
        if report.checks:  # the pipeline's checks at the committed epoch, on their tables' partitions
            from assets.check_assets import check_evaluation

            for result in report.checks:
                context.log_event(check_evaluation(result))
        checkpoint.retire_partitions(context.instance)
        return MaterializeResult(metadata=to_metadata(report))

    return _commit


def _compaction_asset() -> AssetsDefinition:
    @asset(
        name=COMPACTION_ASSET,
        deps=[COMMIT_ASSET],
        partitions_def=EPOCHS,
        group_name="checkpoint",
        description="After the epoch commits: snapshots every table with EPOCHAL_COMPACT_EVERY committed epochs "
        "of changes since its last snapshot, and deletes change files no reader or sink needs. Never changes "
        "what a reader sees; a failure is reported here and does not fail the epoch.",
    )
    def _compaction(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        report = checkpoint.runtime.compact(_epoch(context))
        if report.metadata["failures"] != "none":
            context.log.warning(f"compaction failed (the epoch is committed): {report.metadata['failures']}")
        return MaterializeResult(metadata=to_metadata(report))

    return _compaction


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
        context.log.info(str(report))
        return MaterializeResult(metadata=to_metadata(report))

    return _sink


def _backfill_asset(view: str, upstreams: tuple[str, ...], stages: list[str]) -> AssetsDefinition:
    @asset(
        name=backfill_asset_name(view),
        deps=list(upstreams),
        partitions_def=EPOCHS,
        group_name="backfill",
        kinds={"spark"},
        description=f"Backfill of `{view}` when it is added to a pipeline that has committed epochs: its "
        "inputs at a snapshot epoch, range by range of 256 vnodes, then their change logs up to the committed "
        "epoch, then the join. Each materialization reports its phase, vnodes done, rows read, rows per "
        "second and epochs behind; `backfill_job` and the barrier sensor advance it.",
    )
    def _backfill(context: AssetExecutionContext, checkpoint: CheckpointControllerResource) -> MaterializeResult:
        import time

        from epochal.backfill.runner import BackfillRunner

        runtime = checkpoint.runtime
        deadline = time.monotonic() + runtime.settings.backfill_run_s
        runner = BackfillRunner(runtime)
        for stage in stages:  # what the view reads: first
            runner.advance_view(stage, deadline)
        progress = runner.advance_view(view, deadline)
        return MaterializeResult(
            metadata=to_metadata(StepReport(context.asset_key.path[-1], _epoch(context), progress.metadata()))
        )

    return _backfill


def _snapshot_backfill_spec(table: str) -> AssetSpec:
    """A postgres-cdc table's snapshot, applied over its first epochs by the table's own step, which
    reports each epoch's progress here (no run of its own: the spec is not materialized by a job)."""
    return AssetSpec(
        backfill_asset_name(table),
        deps=[table],
        partitions_def=EPOCHS,
        group_name="backfill",
        kinds={"postgres"},
        description=f"Snapshot backfill of CDC table `{table}`: the upstream table read in primary-key chunks, "
        "a few per epoch (`snapshot.epoch.rows`) while live changes keep flowing. Each epoch that applies "
        "chunks reports chunks applied of the total, percent done and rows staged.",
    )


def _fenced(sql: str) -> str:
    return f"```sql\n{sql.strip()}\n```"


def build_epoch_assets(pipeline: Pipeline) -> list[AssetsDefinition | AssetSpec]:
    assets: list[AssetsDefinition | AssetSpec] = []
    for name, source in pipeline.sources.items():
        if source.connector == POSTGRES_CDC:
            assets.append(_snapshot_backfill_spec(name))
        columns = ", ".join(f"{c.name} {c.type}" for c in source.columns)
        if source.primary_key:
            columns += f", PRIMARY KEY ({', '.join(source.primary_key)})"
        options = ", ".join(f"{k} = '{v}'" for k, v in with_options(source.options).items())
        clause = clause_sql(source.options)  # FORMAT ... ENCODE ..., kept among the options
        # as declared: a TABLE or a SOURCE (both are stored today, see SourceDef.stored)
        assets.append(
            _source_asset(
                name,
                f"{source.kind.capitalize()} `{name}` ({source.location}).\n\n"
                + _fenced(f"CREATE {source.kind.upper()} {name} ({columns})\nWITH ({options}){clause}"),
            )
        )
    for name in pipeline.view_order():
        view = pipeline.views[name]
        assets.append(_view_asset(name, view.upstreams, _view_description(view)))
    for name in pipeline.view_order():
        view = pipeline.views[name]
        if view.internal_of is None:  # a view's internal stages backfill with it, under its asset
            stages = [s for s in pipeline.view_order() if pipeline.views[s].internal_of == name]
            assets.append(_backfill_asset(name, view.upstreams, stages))
    assets.append(_commit_asset(pipeline.tables))
    assets.append(_compaction_asset())
    for name, sink in pipeline.sinks.items():
        # a password written into the pipeline's file is masked; a ${ENV} reference is shown as is
        options = ", ".join(f"{k} = '{v}'" for k, v in shown_options(sink.connector, sink.options).items())
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


def _view_description(view: ViewDef) -> str:
    """The view's SQL and how it is maintained: which operator keeps which state."""
    if view.internal_of:
        head = f"Internal stage of view `{view.internal_of}` ({view.location}): the planner keeps it as a table"
    else:
        head = f"Materialized view `{view.name}` ({view.location})"
    if view.refresh == "full":
        how = "Maintained by recomputing it over its inputs every epoch and diffing (`refresh = 'full'`)."
    elif view.plan is None:
        how = "Maintained from its upstreams' changes."
    else:
        how = "Incremental plan:\n\n" + _fenced(view.plan.describe())
    return f"{head}.\n\n" + _fenced(view.query) + "\n\n" + how
