"""User-facing errors.

Every error a user can cause (bad SQL, a config typo, a server that is down) is an
``EpochalError``: its message names the problem *and* the fix, and the CLI prints it as one
line instead of a stack trace.
"""

from __future__ import annotations

from dataclasses import dataclass


class EpochalError(Exception):
    """An error caused by input or environment, with a message that says how to fix it."""


@dataclass(frozen=True)
class PipelineIssue:
    """One problem in a pipeline definition, located to a file and line."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class PipelineError(EpochalError):
    """The pipeline directory cannot be loaded. Carries every problem found, not just the first."""

    def __init__(self, issues: list[PipelineIssue]):
        self.issues = list(issues)
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"pipeline has {len(self.issues)} error(s):\n{lines}")


class ConfigError(EpochalError):
    """An environment variable or setting is wrong."""


class JavaMissingError(EpochalError):
    """Spark cannot start because Java 17+ is not available."""


class InternalError(Exception):
    """An invariant of Epochal's own code is broken: a bug, never the user's input. Raised where an
    ``assert`` would do, because ``python -O`` removes asserts and the code would go on wrongly."""


def require(condition: object, what: str) -> None:
    """Raise :class:`InternalError` naming ``what`` (the invariant) unless ``condition`` holds."""
    if not condition:
        raise InternalError(f"internal invariant broken: {what}; this is a bug in Epochal, please report it")
