"""The epoch runtime: what each node of the pipeline does for one epoch.

``EpochRuntime`` (``facade``) is what the Dagster shell and the CLI call; each kind of step lives in
a module of its own here.
"""

from epochal.runtime.facade import EpochRuntime
from epochal.runtime.report import StepReport

__all__ = ["EpochRuntime", "StepReport"]
