"""Turning a runtime step report into what the Dagster UI shows."""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    MetadataValue,
    OpExecutionContext,
)

from epochal.connectors.postgres_cdc import SNAPSHOT_CHUNKS_READ
from epochal.epoch import epoch_datetime, shown_epoch
from epochal.runtime.facade import StepReport
from epochal.storage.warehouse import dead_letter_table

#: The asset check every source carries: warns when an epoch had records it could not parse.
DEAD_LETTERS_CHECK = "dead_letters"


def dead_letters_check_spec(source: str) -> AssetCheckSpec:
    return AssetCheckSpec(
        DEAD_LETTERS_CHECK,
        asset=source,
        description=f"Warns when an epoch of {source} had records it could not read (dead letters); "
        f'read them with epochal query "SELECT * FROM {dead_letter_table(source)}".',
    )


def dead_letters_warning(report: StepReport) -> str | None:
    """What a run logs at WARNING when a source's epoch had dead letters: the source, how many,
    where they are and how to read them; None when it had none (or the step is not a source's)."""
    dead = report.metadata.get("dead_letters")
    if not dead:
        return None
    table = dead_letter_table(report.asset)
    return (
        f"source {report.asset} epoch {shown_epoch(report.epoch)}: {dead} record(s) could not be read and went to "
        f"the dead letters ({report.metadata.get('dead_letter_location')}); read them, with the reason for each, with "
        f'epochal query "SELECT * FROM {table}", fix them at the producer and produce them again'
    )


def dead_letters_evaluation(report: StepReport) -> AssetCheckEvaluation | None:
    """The source's dead_letters check for the epoch partition (None for a step that is not a source's)."""
    dead = report.metadata.get("dead_letters")
    if dead is None:
        return None
    return AssetCheckEvaluation(
        asset_key=AssetKey(report.asset),
        check_name=DEAD_LETTERS_CHECK,
        passed=dead == 0,
        severity=AssetCheckSeverity.WARN,
        partition=str(report.epoch),
        metadata={"dead_letters": dead, "dead_letter_table": dead_letter_table(report.asset)},
        description=dead_letters_warning(report) or "every record was read",
    )


def to_metadata(report: StepReport) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, value in report.metadata.items():
        if value is None:
            continue
        if key in ("epoch", "committed_epoch", "delivered_epoch", "snapshot_epoch") and isinstance(value, int):
            # Epochs exceed GraphQL's 32-bit Int; show them as text, with their wall-clock time.
            metadata[key] = MetadataValue.text(f"{value} ({epoch_datetime(value):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC)")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            metadata[key] = value
        elif isinstance(value, int):
            # typed numbers: the UI plots each over the epoch partitions (freshness_s, lag_records, ...)
            metadata[key] = MetadataValue.int(value)
        else:
            metadata[key] = MetadataValue.float(value)
    if isinstance(report.metadata.get("epoch"), int):
        # the partition key is the bare epoch id; its wall-clock time, sortable, beside it
        metadata["epoch_time"] = MetadataValue.timestamp(epoch_datetime(report.metadata["epoch"]))
    return metadata


def record_materialization(context: OpExecutionContext, report: StepReport) -> None:
    """For the op-based epoch_job: a materialization of the asset's epoch partition."""
    context.log_event(
        AssetMaterialization(
            asset_key=AssetKey(report.asset), partition=str(report.epoch), metadata=to_metadata(report)
        )
    )
    backfill = snapshot_backfill_materialization(report)
    if backfill is not None:  # a CDC table's snapshot progressed: plotted as a view's backfill is
        context.log_event(backfill)
    context.log.info(str(report))
    warning = dead_letters_warning(report)
    if warning:
        context.log.warning(warning)
    evaluation = dead_letters_evaluation(report)
    if evaluation is not None:
        context.log_event(evaluation)
    if report.checks:  # the commit step evaluated the pipeline's checks at the epoch (docs/checks.md)
        from assets.check_assets import check_evaluation

        for result in report.checks:
            context.log_event(check_evaluation(result))


def backfill_asset_name(table: str) -> str:
    return f"backfill__{table}"


def snapshot_backfill_materialization(report: StepReport) -> AssetMaterialization | None:
    """A CDC table's snapshot progress (its source step's ``snapshot_*`` metadata) as a
    materialization of its backfill asset at the step's epoch partition, when the epoch applied
    snapshot chunks; else None."""
    if not report.metadata.get(SNAPSHOT_CHUNKS_READ):
        return None
    asset = backfill_asset_name(report.asset)
    progress = {k: v for k, v in report.metadata.items() if k.startswith("snapshot_")}
    return AssetMaterialization(
        asset_key=asset, partition=str(report.epoch), metadata=to_metadata(StepReport(asset, report.epoch, progress))
    )
