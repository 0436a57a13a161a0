"""Spark Connect sessions that outlive a run: a few numbered slots, each one server-side session,
each held by at most one process at a time.

Why: a run is a new process, and a new Connect session made its first epoch pay for a cold session on
the server: ~2 s of wall and ~3.5 s of the server's CPU a demo run (measured: the first epoch of a
process 10.7-11.7 s against 8.8-9.3 s when the process attached to a session an earlier process had
used). Spark 4.3 also starts Python workers per session and never stops them (SPARK-54055), so a new
session per run left processes behind without bound; with slots there are at most that many sessions'
worth (EPOCHAL_SPARK_SESSION_SLOTS: a working run, the one standing by, a backfill and one more).

Why slots and not one shared session: a session holds state that Epochal changes for a while (the FAIR
pool of a backfill, a sink's Parquet timestamp type) and puts back. Two processes on one session would
see each other's changes, so each slot is taken under an exclusive file lock for the life of the
holder (released by the kernel when the process dies), and a process that finds every slot taken gets
a session of its own, as before. A slot's id file names the server's URL; a session the server has
closed (released, or idle past its timeout) is replaced with a new id.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from epochal.redaction import redact_url

log = logging.getLogger("epochal.spark")

#: Session confs a holder may have changed for a while: reset when a slot is taken, in case the
#: process that changed them was killed before it put them back.
TRANSIENT_CONFS = ("spark.scheduler.pool", "spark.sql.parquet.outputTimestampType")


@dataclass
class SessionSlot:
    """Slot ``index``, held by this process until ``release``: its session id on server ``url``."""

    directory: Path
    index: int
    url: str
    session_id: str
    _lock: IO[str] | None = field(default=None, repr=False)

    @property
    def remote(self) -> str:
        """The Connect URL that attaches to this slot's session."""
        return with_session_id(self.url, self.session_id)

    def renew(self) -> None:
        """A new session id for this slot (a new slot, or the server closed the old session)."""
        self.session_id = str(uuid.uuid4())
        _write_id(self.directory, self.index, redact_url(self.url), self.session_id)

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()  # closing the file drops the flock
            self._lock = None


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (sc://host:port, maybe with ``/;key=value`` parameters) attaching to ``session_id``."""
    if "/;" in url:
        return f"{url};session_id={session_id}"
    return f"{url.rstrip('/')}/;session_id={session_id}"


def names_a_session(url: str) -> bool:
    """Whether ``url`` already chooses its session (the user's choice: no slot then)."""
    return "session_id=" in url.split("/;", 1)[-1] if "/;" in url else False


def take(directory: Path, url: str, slots: int) -> SessionSlot | None:
    """The first free one of ``slots`` slots for server ``url`` under ``directory``, locked for this
    process; None when every slot is held (the caller makes a session of its own)."""
    if slots <= 0:
        return None
    try:
        return _take(directory, url, slots)
    except OSError as exc:  # a home the run cannot write costs the warm session, never the run
        log.warning("no Spark Connect session slot under %s (%s): this run gets a session of its own", directory, exc)
        return None


def _take(directory: Path, url: str, slots: int) -> SessionSlot | None:
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(slots):
        lock = open(directory / f"slot-{index}.lock", "a")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            session_id = _read_id(directory, index, url)
            slot = SessionSlot(directory, index, url, session_id or "", lock)
            if session_id is None:
                slot.renew()
        except BaseException:
            lock.close()  # not left held by a slot nobody has
            raise
        return slot
    return None


def is_closed_session_error(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a session it has closed or no longer knows."""
    text = str(error)
    return "INVALID_HANDLE.SESSION_CLOSED" in text or "INVALID_HANDLE.SESSION_NOT_FOUND" in text


def _id_file(directory: Path, index: int) -> Path:
    return directory / f"slot-{index}.json"


def _read_id(directory: Path, index: int, url: str) -> str | None:
    try:  # (the URL is kept redacted: a token in it stays out of the file)
        kept = json.loads(_id_file(directory, index).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("url") != redact_url(url) or not kept.get("session_id"):
        return None  # another server (a new port, a cluster instead): its own sessions
    try:
        return str(uuid.UUID(str(kept["session_id"])))
    except ValueError:
        return None


def _write_id(directory: Path, index: int, url: str, session_id: str) -> None:
    target = _id_file(directory, index)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "session_id": session_id}))
    tmp.replace(target)
