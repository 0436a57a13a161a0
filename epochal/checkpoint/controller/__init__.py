"""The checkpoint controller (``core``) and its named methods, one concern per module."""

from epochal.checkpoint.controller.core import CheckpointController

__all__ = ["CheckpointController"]
