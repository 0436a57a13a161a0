"""What a step of an epoch reports: the asset, the epoch, and metadata for logs, status and Dagster."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("epochal.runtime")


@dataclass
class StepReport:
    asset: str
    epoch: int
    #: plain values (int/float/str/bool/None) for logs, status and Dagster metadata
    metadata: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.asset}@{self.epoch}: " + ", ".join(f"{k}={v}" for k, v in self.metadata.items())


def retired_report(epoch: int, name: str) -> StepReport:
    """The step of a table another process retired after this one read the pipeline: nothing to
    do (the epoch commits without it; the next run, with the pipeline as it is now, has no step)."""
    log.info("%s left the pipeline after this run read it: its step for epoch %s does nothing", name, epoch)
    return StepReport(name, epoch, {"epoch": epoch, "mode": "retired: no longer in the pipeline"})
