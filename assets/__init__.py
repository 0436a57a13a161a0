"""Epoch-partitioned assets: one per source, view and sink, plus the epoch commit."""

from assets.epoch_assets import EPOCHS, build_epoch_assets

__all__ = ["EPOCHS", "build_epoch_assets"]
