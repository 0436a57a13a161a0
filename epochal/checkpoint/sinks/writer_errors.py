"""A sink writer's error as the driver sees it: the kind of :class:`SinkError` it was, and one line
naming the sink, the epochs and the cause. A writer that raised inside a Spark task reaches the
driver as Spark's PythonException, under a Python and a Java stack trace; its own message is what
counts."""

from __future__ import annotations

import errno
import re

from epochal.redaction import redact_url
from epochal.sinks.base import (
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkDataError,
    SinkError,
    SinkSchemaError,
)

_WRITER_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(?P<kind>Sink\w*Error|PrecommitLost): (?P<message>.+)$", re.MULTILINE)
_KINDS: dict[str, type[SinkError]] = {
    k.__name__: k for k in (SinkError, SinkSchemaError, SinkConfigError, SinkDataError, PrecommitLost)
}


#: filesystem refusals that fail the same way however often a write is tried: not retried
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR})
_DENIED_TEXT = re.compile(r"\b(?:PermissionError|NotADirectoryError): |Read-only file system|\[Errno (?:13|30|20)\]")


def error_kind(error: Exception) -> type[SinkError]:
    """The SinkError class of ``error``, also when a writer raised it inside a Spark task. A
    permission or not-a-directory error is a :class:`SinkConfigError`: retrying cannot fix it."""
    if isinstance(error, SinkError):
        return type(error)
    found = _WRITER_ERROR.findall(str(error))
    if found:
        return _KINDS.get(found[-1][0], SinkError)
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in _DENIED_ERRNOS:
            return SinkConfigError
        cause = cause.__cause__ or cause.__context__
    return SinkConfigError if _DENIED_TEXT.search(str(error)) else SinkError


def describe_error(batch: BatchId, error: Exception) -> str:
    """One line naming the sink, the epochs and the cause, with any URL's password redacted."""
    text = str(error)
    found = _WRITER_ERROR.findall(text) if not isinstance(error, SinkError) else []
    if found:
        text = found[-1][1]
    else:
        text = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        if not isinstance(error, SinkError):
            text = f"{type(error).__name__}: {text}"
    bare = f"sink {batch.sink}:"
    if text.startswith(bare):  # a target's own error names the sink: add the epochs
        text = f"{batch.describe()}:{text[len(bare) :]}"
    elif not text.startswith(batch.describe()):
        text = f"{batch.describe()}: {text}"
    return redact_url(text)
