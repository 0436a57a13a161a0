"""A CDC table's snapshot in primary-key chunks, and which log records apply on top of it.

Pure logic, no Spark and no server. The key space is split into ranges ``[lower, upper)`` (key
tuples; the first chunk has no lower bound, the last no upper bound), so every key, even one
inserted after the split, falls in exactly one chunk. Each chunk is read in a transaction whose
snapshot sits exactly at a log position (an exported snapshot's consistent point) and staged with
that position. Chunks read in one go share one position; chunks read later (by a later epoch, or
after a kill) a later one. The chunks are applied in key order, a few per epoch: an epoch's chunks'
rows come first in its batch, then the log's records of its range.

Why nothing is lost or doubled (the per-row visibility rule, as in RisingWave's snapshot backfill):
a log record at position ``p`` for key ``k`` applies only if ``k``'s chunk is applied (by this epoch
or an earlier one) and ``p >= P(k)``, ``P(k)`` that chunk's position. A change committed before
``P(k)`` is already in that chunk's rows (the chunk's snapshot saw it), so applying it again would
double it (or resurrect a deleted row); a change committed at or after ``P(k)`` is not in the chunk,
so it must apply, on top of the chunk's rows. A change to a key whose chunk is not applied yet is
left out: the chunk, read later, at a position past the change, holds it. An epoch only applies a
chunk staged at or after its range's start, so no change at or after ``P(k)`` fell in an earlier
epoch's range and was left out there. A row that moves key (an update of the primary
key) is a delete of the old key and an upsert of the new one, each judged by its own key's chunk:
the old key's chunk may be staged before the move (holds the row: the delete applies) and the new
key's after it (holds the row already: the upsert is skipped), or any other mix, and each half is
right on its own. An update that leaves a TOASTed value unchanged finds the row in state, since the
chunk that holds it is applied before the log.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.storage.durability import sync_tree

#: the rows a chunk holds, about; an option of the source
DEFAULT_CHUNK_ROWS = 100_000
CHUNK_ROWS_OPTION = "snapshot.chunk.rows"
#: about how many snapshot rows one epoch takes in (whole chunks, at least one): a large table's
#: snapshot is spread over epochs, so live epochs keep committing while it is read
DEFAULT_EPOCH_ROWS = 1_000_000
EPOCH_ROWS_OPTION = "snapshot.epoch.rows"
PLAN_FILE = "chunks.json"

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Chunk:
    index: int
    #: key bounds as the server prints them (``::text``), None for an open end
    lower: tuple[str, ...] | None
    upper: tuple[str, ...] | None


@dataclass(frozen=True)
class StagedChunk:
    chunk: Chunk
    #: the log position its rows are exactly at
    position: int
    rows: int
    file: str


def integer_boundaries(low: int, high: int, rows: int, chunk_rows: int) -> list[tuple[str, ...]]:
    """Inner boundaries splitting ``[low, high]`` (a one-column integer key) into equal-width
    ranges of about ``chunk_rows`` of the table's ``rows`` each."""
    if chunk_rows < 1:
        raise ValueError(f"{CHUNK_ROWS_OPTION} must be at least 1, not {chunk_rows}")
    count = min(max(1, math.ceil(rows / chunk_rows)), max(1, high - low + 1))
    width = (high - low + 1) / count
    bounds = sorted({low + int(i * width) for i in range(1, count)})
    return [(str(b),) for b in bounds if low < b <= high]


def chunks_of(boundaries: Sequence[tuple[str, ...]]) -> list[Chunk]:
    """The chunks between sorted inner ``boundaries``: n boundaries make n + 1 chunks."""
    edges: list[tuple[str, ...] | None] = [None, *boundaries, None]
    return [Chunk(i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


class KeyFilter:
    """Whether a log record at a position applies on top of the chunks staged at their positions.

    ``staged`` is the chunks applied so far, a prefix of the plan (chunks ``0 .. n-1``): a key past
    the last one's upper bound is in a chunk not applied yet, whose rows, read later, will hold
    every change made before them, so its records are left out (``keep`` is False)."""

    def __init__(self, staged: Sequence[StagedChunk], parse: Callable[[tuple[str, ...]], Key]):
        ordered = sorted(staged, key=lambda s: s.chunk.index)
        if [s.chunk.index for s in ordered] != list(range(len(ordered))):
            raise ValueError("the staged chunks are not the plan's first chunks: they would leave keys uncovered")
        if any(s.chunk.upper is None for s in ordered[:-1]):
            raise ValueError("the staged chunks do not cover the key space: only the last chunk has no upper bound")
        self._uppers = [parse(s.chunk.upper) for s in ordered if s.chunk.upper is not None]
        self._positions = [s.position for s in ordered]
        #: whether the chunks reach the end of the key space (the last one has no upper bound)
        self.complete = bool(ordered) and ordered[-1].chunk.upper is None
        self.everything_after = max(self._positions, default=0) if self.complete else None

    def position_of(self, key: Key) -> int | None:
        """The position of the chunk whose range holds ``key``, None when that chunk is not staged."""
        at = bisect.bisect_right(self._uppers, tuple(key))
        return self._positions[at] if at < len(self._positions) else None

    def keep(self, key: Key, position: int) -> bool:
        if self.everything_after is not None and position >= self.everything_after:
            return True
        chunk_position = self.position_of(key)
        return chunk_position is not None and position >= chunk_position


# --- the durable records ---------------------------------------------------------------------------


def write_durably(path: Path, data: object, replace: bool = True) -> bool:
    """``data`` as JSON at ``path``, atomically and on the disk (with its directory entry). Without
    ``replace`` a file already there stands (the first writer wins): returns whether this one was
    written."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    sync_tree(str(tmp))
    try:
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails when the file is there: no writer overwrites another's
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    sync_directory(path.parent)
    return True


def sync_directory(directory: Path) -> None:
    """fsync of the directory's own entries only: parallel tasks write beside each other in it, so
    walking it (``sync_tree``) would meet their temporary files as they vanish."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def chunk_record_path(directory: Path, index: int) -> Path:
    return directory / f"chunk-{index:05d}.json"


def chunk_file_path(directory: Path, index: int, position: int) -> Path:
    """Named by its position too: two runs staging a chunk at once never write one file."""
    return directory / f"chunk-{index:05d}-{position}.parquet"


def save_plan(directory: Path, chunks: Sequence[Chunk]) -> list[Chunk]:
    """The plan, saved unless one is there already: the first one saved stands (two runs planning
    at once must stage the same chunks). Returns the plan that stands."""
    directory.mkdir(parents=True, exist_ok=True)
    if write_durably(directory / PLAN_FILE, [[c.lower, c.upper] for c in chunks], replace=False):
        return list(chunks)
    return load_plan(directory) or []


def load_plan(directory: Path) -> list[Chunk] | None:
    path = directory / PLAN_FILE
    if not path.exists():
        return None
    edges = json.loads(path.read_text())
    return [Chunk(i, _bound(lo), _bound(hi)) for i, (lo, hi) in enumerate(edges)]


def _bound(value: list[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def record_chunk(directory: Path, staged: StagedChunk, replace: bool = False) -> StagedChunk:
    """The chunk's record, written once its rows are durable: a chunk with a record is kept on
    resume. Returns the record that stands: the first one written wins (two runs that staged the
    chunk at once each have their own file, and every reader must see one position for it; the
    loser's file is deleted), unless ``replace`` (a stale chunk read again at a later position)."""
    path = chunk_record_path(directory, staged.chunk.index)
    data = {"position": staged.position, "rows": staged.rows, "file": staged.file}
    if write_durably(path, data, replace):
        return staged
    standing = staged_chunks(directory, [staged.chunk])[staged.chunk.index]
    if standing.file != staged.file:  # the same file when both read at one position (a task's retry)
        Path(staged.file).unlink(missing_ok=True)
    return standing


def staged_chunks(directory: Path, chunks: Sequence[Chunk]) -> dict[int, StagedChunk]:
    """The chunks of the plan whose rows are staged and recorded, by index."""
    found = {}
    for chunk in chunks:
        path = chunk_record_path(directory, chunk.index)
        if path.exists():
            data = json.loads(path.read_text())
            found[chunk.index] = StagedChunk(chunk, int(data["position"]), int(data["rows"]), data["file"])
    return found
