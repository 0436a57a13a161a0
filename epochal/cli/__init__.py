"""The ``epochal`` command."""

from epochal.cli.main import main

__all__ = ["main"]
