"""What a step of an epoch reports: the asset, the epoch, and metadata for logs, status and Dagster."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochal.epoch import epoch_age_s, shown_epoch

if TYPE_CHECKING:
    from epochal.checkpoint.checks import CheckResult

log = logging.getLogger("epochal.runtime")


@dataclass
class StepReport:
    asset: str
    epoch: int
    #: plain values (int/float/str/bool/None) for logs, status and Dagster metadata
    metadata: dict[str, Any] = field(default_factory=dict)
    #: the checks evaluated at the epoch by this step (the commit step), for Dagster's asset checks
    checks: list[CheckResult] = field(default_factory=list)

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.metadata.items())
        return f"{self.asset} epoch {shown_epoch(self.epoch)}: {shown}"


def retired_report(epoch: int, name: str) -> StepReport:
    """The step of a table another process retired after this one read the pipeline: nothing to
    do (the epoch commits without it; the next run, with the pipeline as it is now, has no step)."""
    log.info(
        "%s left the pipeline after this run read it: its step for epoch %s does nothing", name, shown_epoch(epoch)
    )
    return StepReport(name, epoch, {"epoch": epoch, "mode": "retired: no longer in the pipeline"})


def measured(report: StepReport, now: float | None = None) -> StepReport:
    """``report`` with what the Dagster UI plots epoch over epoch, added in place:

    - ``freshness_s``: seconds from the epoch's barrier (its wall-clock time) to the step's output:
      a source's or view's change written (readable at the commit right after), the epoch
      committed (epoch_commit), or, for a sink, the newest epoch it holds delivered;
    - ``rows_per_second``: the records a source read, or the rows a view's inputs changed, per
      second of the step (a sink reports its own, of the rows it delivered).

    A step that did nothing (retired, waiting for a backfill, not committed yet) gets neither."""
    now = time.time() if now is None else now
    m = report.metadata
    if report.asset == "epoch_commit":
        if m.get("state") == "COMMITTED":
            m["freshness_s"] = epoch_age_s(report.epoch, now)
        return report
    if "rows_delivered" in m:  # a sink's step
        if m.get("delivered_epoch") is not None:
            m["freshness_s"] = epoch_age_s(m["delivered_epoch"], now)
        return report
    seconds = m.get("seconds")
    if seconds is None:
        return report
    m["freshness_s"] = epoch_age_s(report.epoch, now)
    rows = m.get("records_read", m.get("rows_in"))
    if rows is not None:
        m["rows_per_second"] = round(rows / seconds, 1) if seconds > 0 else 0.0
    return report
