"""The managed Spark server's files in ``EPOCHAL_HOME/spark``: its lock, its state (``server.json``)
and its Connect token (owner-only), each read and written whole (:mod:`epochal.spark.server`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from epochal.errors import EpochalError


class SparkServerError(EpochalError):
    """The managed Spark Connect server cannot be started, reached or stopped."""


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def new_token(directory: Path) -> str:
    """A new random token for a server about to start, kept in ``directory/token`` (owner-only)."""
    token = secrets.token_urlsafe(32)
    path = directory / "token"
    path.unlink(missing_ok=True)  # O_EXCL below: a file someone else made (other mode) is never reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token)
    return token


def read_token(directory: Path) -> str:
    try:
        return (directory / "token").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise SparkServerError(
            f"cannot read the Spark server's token {directory / 'token'} ({exc.strerror}): runs of another "
            "user cannot use this EPOCHAL_HOME's server; run as its owner, or `epochal spark stop` and start again"
        ) from None


def read_state(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "server.json").read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError) as exc:
        raise SparkServerError(
            f"{directory / 'server.json'} is unreadable ({exc}): stop the server by hand if one runs, then delete it"
        ) from None


def write_state(directory: Path, state: dict) -> None:
    temporary = directory / "server.json.tmp"
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(directory / "server.json")  # readers never see half a file
