"""The pipeline's checks (``CREATE CHECK``, docs/checks.md) as Dagster asset checks on their table's
epoch partitions.

The core evaluates and records them (:mod:`epochal.runtime.check_step`); here each becomes an
``@asset_check`` that answers a partition from the recorded result (evaluating it if the epoch has
none yet), and :func:`check_evaluation` turns a result the commit step recorded into the event
epoch_job logs for the partition.
"""

import json
import warnings

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    asset_check,
)

from assets.epoch_assets import COMMIT_ASSET, EPOCHS
from epochal.checkpoint.checks import CheckResult
from epochal.pipeline.checks import CheckDef
from epochal.pipeline.model import Pipeline
from resources.checkpoint import CheckpointControllerResource


def _metadata(result: CheckResult) -> dict:
    return {
        "failed_rows": MetadataValue.int(result.failed_rows),
        "sample": MetadataValue.json(json.loads(json.dumps(result.sample, default=str))),
        "severity": result.severity,
        "released_by": result.released_by or "",
    }


def _description(result: CheckResult) -> str:
    if result.passed:
        return f"no offending rows in {result.table} at epoch {result.epoch}"
    hold = " and holds the sinks downstream" if result.holds else ""
    return f"{result.failed_rows} offending row(s) in {result.table} at epoch {result.epoch}{hold}"


def _severity(result: CheckResult) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if result.severity == "error" else AssetCheckSeverity.WARN


def check_evaluation(result: CheckResult) -> AssetCheckEvaluation:
    """The event of ``result`` on its table's epoch partition."""
    return AssetCheckEvaluation(
        asset_key=AssetKey(result.table),
        check_name=result.check,
        passed=result.passed,
        severity=_severity(result),
        partition=str(result.epoch),
        metadata=_metadata(result),
        description=_description(result),
    )


def _check(check: CheckDef) -> AssetChecksDefinition:
    # (no ``from __future__ import annotations`` here: Dagster reads the context's annotation as a type)
    with warnings.catch_warnings():
        # partitioned asset checks are a Dagster preview; they are what puts a check on an epoch
        warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")
        return _partitioned_check(check)


def _partitioned_check(check: CheckDef) -> AssetChecksDefinition:
    @asset_check(
        asset=check.table,
        name=check.name,
        partitions_def=EPOCHS,
        additional_deps=[COMMIT_ASSET],
        description=f"{'Built-in' if check.builtin else 'Check'} ({check.location}), severity {check.severity}: "
        f"the rows of `{check.table}` it returns at a committed epoch are offending."
        + (" A failure holds that epoch back from every sink downstream." if check.holds_sinks else "")
        + f"\n\n```sql\n{check.query}\n```",
    )
    def _evaluate(context: AssetCheckExecutionContext, checkpoint: CheckpointControllerResource) -> AssetCheckResult:
        result = checkpoint.runtime.check_steps.evaluate(check, int(context.partition_key))
        return AssetCheckResult(
            passed=result.passed,
            severity=_severity(result),
            metadata=_metadata(result),
            description=_description(result),
        )

    return _evaluate


def build_check_assets(pipeline: Pipeline) -> list[AssetChecksDefinition]:
    return [_check(check) for check in pipeline.checks.values()]
