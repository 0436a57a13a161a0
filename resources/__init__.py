"""Dagster resources: Spark, and the checkpoint controller with the epoch runtime."""

from resources.checkpoint import CheckpointControllerResource
from resources.spark import EpochalSparkResource

__all__ = ["CheckpointControllerResource", "EpochalSparkResource"]
