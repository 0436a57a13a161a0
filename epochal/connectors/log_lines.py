"""A range of lines of an append-only log file, read without reading the rest of the file.

A log source's offsets are line numbers. Spark's text reader cannot start at a line: with
``wholetext`` the whole file becomes one row to slice, so every epoch read the whole log (its cost
grew with the log, not with the epoch) and a split past the executor's heap, or past Spark's 2 GB
row limit, could not be read at all. Without it, Spark gives lines but not their numbers.

So the driver finds a range's byte offsets with a sparse index of where lines start
(:class:`LineIndex`, filled while the planner counts lines anyway) and reads only those bytes:

* a read of at most ``SPARK_DRIVER_READ_BYTES`` (a small epoch's records, a backfill chunk) is
  read on the driver and handed to Spark as one Arrow table: no Python worker to start, which
  costs seconds in a fresh process;
* a larger one is cut into pieces at indexed line starts (at least ``MIN_PIECES`` where the
  index allows, at most ``PIECE_BYTES`` each), and the ``LogLinesDataSource`` (a Spark Python
  data source) reads each piece on an executor, in parallel, so no process ever holds more than
  one piece. Both are ``log_lines_spark.read_lines``.

Both decode a piece with :func:`piece_batches`, so the two paths give the same rows: ``split``,
``offset`` (the line number) and ``raw`` (the line without its newline; a stray ``\\r`` and blank
lines are left to the caller, as the text reader left them).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import pyarrow as pa

#: the rows a line range reads as (Spark DDL)
LINES_SCHEMA = "split STRING, offset BIGINT, raw STRING"
#: bytes counted per read() while indexing or seeking
COUNT_CHUNK = 1 << 20
#: a line start is remembered about this often, so finding any line reads at most this much
#: (and a read can be cut into pieces no finer than this)
CHECKPOINT_BYTES = 4 << 20
#: the most the DuckDB driver path (``log_driver``) reads into the driver's memory
DRIVER_READ_BYTES = 32 << 20
#: reads up to this size are handed to Spark from the driver (no Python worker); larger ones are
#: read in pieces by executors. Far below DRIVER_READ_BYTES: measured on 300,000 lines (14 MB),
#: the driver's Arrow hand-over and its single-partition plan cost 2.7 s against 1.5 s for two
#: pieces read by executors (benchmarks/bench_source_step.py), and the pieces run in parallel
SPARK_DRIVER_READ_BYTES = 4 << 20
#: the largest piece of a large read
PIECE_BYTES = 64 << 20
#: a read is cut into at least this many pieces where the index's marks allow it, so that a
#: machine's cores share it (beyond that, pieces of PIECE_BYTES)
MIN_PIECES = 4
#: lines per Arrow batch handed to Spark
BATCH_LINES = 1 << 16
#: the name LogLinesDataSource is registered under
DATA_SOURCE_NAME = "epochal_log_lines"


class LineIndex:
    """Where lines start in one append-only file: ``(line, byte)`` about every CHECKPOINT_BYTES,
    and how far the file has been counted, so counting resumes there when the file grows."""

    def __init__(self, inode: int):
        self.inode = inode
        #: bytes counted, a half-written last line included
        self.size = 0
        #: complete lines (ending with a newline) in the bytes counted
        self.lines = 0
        self.marks: list[tuple[int, int]] = [(0, 0)]

    def count(self, f: BinaryIO) -> None:
        """Count the lines appended since the last count."""
        f.seek(self.size)
        while chunk := f.read(COUNT_CHUNK):
            newlines = chunk.count(b"\n")
            if newlines and self.size + len(chunk) - self.marks[-1][1] >= CHECKPOINT_BYTES:
                self.marks.append((self.lines + newlines, self.size + chunk.rfind(b"\n") + 1))
            self.lines += newlines
            self.size += len(chunk)

    def byte_of(self, f: BinaryIO, line: int) -> int:
        """The byte where ``line`` starts (``line == lines``: just after the last complete line).
        Reads at most about CHECKPOINT_BYTES from the nearest remembered line start."""
        if not 0 <= line <= self.lines:
            raise ValueError(f"line {line} is outside the {self.lines} complete lines counted")
        at_line, at_byte = self.marks[bisect.bisect_right(self.marks, (line, float("inf"))) - 1]
        f.seek(at_byte)
        while at_line < line:
            chunk = f.read(COUNT_CHUNK)
            if not chunk:
                raise EOFError(f"the file ended before line {line}")
            newlines = chunk.count(b"\n")
            if at_line + newlines < line:
                at_line += newlines
                at_byte += len(chunk)
                continue
            position = 0
            while at_line < line:
                position = chunk.index(b"\n", position) + 1
                at_line += 1
            return at_byte + position
        return at_byte

    def pieces(self, f: BinaryIO, split: str, start: int, end: int) -> list[LinePiece]:
        """Lines [``start``, ``end``) as pieces of about a MIN_PIECES-th of the range (at most
        PIECE_BYTES), cut at remembered line starts."""
        first, last = self.byte_of(f, start), self.byte_of(f, end)
        size = min(PIECE_BYTES, max(1, (last - first) // MIN_PIECES))
        cuts = [(start, first)]
        for line, byte in self.marks:
            if start < line < end and byte - cuts[-1][1] >= size and last - byte >= size // 2:
                cuts.append((line, byte))
        bounds = [*cuts, (end, last)]
        return [
            LinePiece(split, line, byte, next_byte, next_line - line)
            for (line, byte), (next_line, next_byte) in zip(bounds, bounds[1:], strict=False)
            if next_line > line
        ]


@dataclass(frozen=True)
class LinePiece:
    """Lines ``first_line`` .. ``first_line + lines - 1`` of a split, at bytes [``start``, ``end``)."""

    split: str
    first_line: int
    start: int
    end: int
    lines: int


def piece_batches(path: str, piece: LinePiece) -> Iterator[pa.RecordBatch]:
    """The piece's lines as Arrow batches of LINES_SCHEMA. The bytes must still be there, ending
    at a line end: a log is append-only, and reading a shorter or rewritten file short would lose
    records without a word."""
    with open(path, "rb") as f:
        f.seek(piece.start)
        data = f.read(piece.end - piece.start)
    if len(data) != piece.end - piece.start or (data and not data.endswith(b"\n")):
        raise OSError(
            f"{path} no longer holds lines {piece.first_line}..{piece.first_line + piece.lines - 1} where "
            f"they were (bytes {piece.start}..{piece.end}): log files are append-only; restore it"
        )
    # Bytes that are not UTF-8 become U+FFFD, so the line is still read (and becomes a dead letter
    # if it does not parse) instead of failing the read. A decoder never takes a newline into an
    # invalid sequence, so the lines are where they were.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", errors="replace").encode("utf-8")
    where = f"{path} at bytes {piece.start}..{piece.end}"
    yield from line_batches(data, piece.split, piece.first_line, piece.lines, where)


def line_batches(data: bytes, split: str, first_line: int, lines: int, where: str) -> Iterator[pa.RecordBatch]:
    """``data`` (valid UTF-8, ending with a newline, ``lines`` lines) as Arrow batches of LINES_SCHEMA,
    built from buffers: the lines are never Python strings. It runs in the executors' Python
    workers, once per piece: 2M lines of 50 bytes took 0.25 s against 0.74 s splitting into ``str``
    and ``pa.array`` (warm, one process)."""
    import numpy as np
    import pyarrow as pa

    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    if len(ends) != lines:
        raise OSError(f"{where}: expected {lines} lines, found {len(ends)}")
    # line i is data[ends[i-1] + 1 : ends[i]]; with the newlines taken out it starts i bytes earlier
    starts = np.empty(lines + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends - np.arange(lines, dtype=np.int64)
    body = pa.py_buffer(data.replace(b"\n", b""))
    name = split.encode("utf-8")
    schema = pa.schema([("split", pa.string()), ("offset", pa.int64()), ("raw", pa.string())])
    for at in range(0, lines, BATCH_LINES):
        count = min(BATCH_LINES, lines - at)
        bounds = starts[at : at + count + 1]
        # 32-bit offsets, rebased per batch (a batch holds at most its piece's bytes)
        offsets = (bounds - bounds[0]).astype(np.int32)
        raw_lines = pa.StringArray.from_buffers(
            count, pa.py_buffer(offsets), body.slice(int(bounds[0]), int(bounds[-1] - bounds[0]))
        )
        name_offsets = np.arange(0, (count + 1) * len(name), len(name), dtype=np.int32)
        splits = pa.StringArray.from_buffers(count, pa.py_buffer(name_offsets), pa.py_buffer(name * count))
        numbers = pa.array(np.arange(first_line + at, first_line + at + count, dtype=np.int64))
        yield pa.RecordBatch.from_arrays([splits, numbers, raw_lines], schema=schema)


def open_index(path: str | os.PathLike[str], known: LineIndex | None) -> tuple[BinaryIO, LineIndex]:
    """``path`` opened for reading, and its index counted up to now: ``known`` carried on, or a
    fresh one when the file is new, replaced or truncated. The caller closes the file."""
    f = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        stat = os.fstat(f.fileno())
        if known is None or known.inode != stat.st_ino or known.size > stat.st_size:
            known = LineIndex(stat.st_ino)
        known.count(f)
    except BaseException:
        f.close()
        raise
    return f, known
