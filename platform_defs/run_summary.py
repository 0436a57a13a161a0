"""The one line a run of epoch_job ends with: the epochs it committed, the records its sources read,
the views it wrote, what its sinks delivered and the time it took, from the materializations its
steps reported. Runs print at INFO by default (``console_run_config``): Dagster's own events, about 140
lines an epoch, are DEBUG, so the console shows Epochal's messages, warnings and this line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epochal.epoch import epoch_time_text, shown_epoch

#: (asset, partition, metadata as plain values) of one materialization
Materialized = tuple[str, str | None, Mapping[str, Any]]


def plain_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Dagster's MetadataValues as the plain values the steps reported."""
    return {key: getattr(value, "value", value) for key, value in metadata.items()}


def console_run_config(log_level: str) -> dict[str, Any]:
    """A job's default run config: its console logger at ``log_level`` (EPOCHAL_LOG_LEVEL). A run config
    that sets ``loggers.console.config.log_level`` overrides it; Dagster merges the rest of a run config
    with this default."""
    return {"loggers": {"console": {"config": {"log_level": log_level}}}}


def run_summary(materialized: Iterable[Materialized], seconds: float, commit_asset: str = "epoch_commit") -> str:
    epochs: set[int] = set()
    records = sinks_rows = 0
    views: set[str] = set()
    sinks: set[str] = set()
    for asset, partition, metadata in materialized:
        if asset == commit_asset and partition is not None and metadata.get("state") == "COMMITTED":
            epochs.add(int(partition))
        elif "records_read" in metadata:  # a source's step
            records += int(metadata["records_read"] or 0)
        elif "rows_delivered" in metadata:  # a sink's step
            sinks.add(asset)
            sinks_rows += int(metadata["rows_delivered"] or 0)
        elif "mode" in metadata and "__" not in asset:  # a view's step (not a planner's stage)
            views.add(asset)
    if not epochs:
        committed = "no epoch committed"
    elif len(epochs) == 1:
        committed = f"epoch {shown_epoch(min(epochs))} committed"
    else:
        first, last = min(epochs), max(epochs)
        span = f"{first}..{last}, {epoch_time_text(first)}..{epoch_time_text(last)}"
        committed = f"{len(epochs)} epochs committed ({span})"
    return (
        f"epoch_job: {committed}; {records} record(s) read, {len(views)} view(s) written, "
        f"{len(sinks)} sink(s) delivered {sinks_rows} row(s); {seconds:.1f}s"
    )
