"""Turning a runtime step report into what the Dagster UI shows."""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetMaterialization, MetadataValue, OpExecutionContext

from epochal.epoch import epoch_datetime
from epochal.runtime.facade import StepReport


def to_metadata(report: StepReport) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, value in report.metadata.items():
        if value is None:
            continue
        if key in ("epoch", "committed_epoch", "delivered_epoch", "snapshot_epoch") and isinstance(value, int):
            # Epochs exceed GraphQL's 32-bit Int; show them as text, with their wall-clock time.
            metadata[key] = MetadataValue.text(f"{value} ({epoch_datetime(value):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC)")
        else:
            metadata[key] = value
    return metadata


def record_materialization(context: OpExecutionContext, report: StepReport) -> None:
    """For the op-based epoch_job: a materialization of the asset's epoch partition."""
    context.log_event(
        AssetMaterialization(
            asset_key=AssetKey(report.asset), partition=str(report.epoch), metadata=to_metadata(report)
        )
    )
    context.log.info(str(report))
