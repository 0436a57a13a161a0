"""What a step of an epoch reports: the asset, the epoch, and metadata for logs, status and Dagster."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepReport:
    asset: str
    epoch: int
    #: plain values (int/float/str/bool/None) for logs, status and Dagster metadata
    metadata: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.asset}@{self.epoch}: " + ", ".join(f"{k}={v}" for k, v in self.metadata.items())
