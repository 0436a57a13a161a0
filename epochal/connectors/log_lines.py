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
    import pyarrow as pa

    with open(path, "rb") as f:
        f.seek(piece.start)
        data = f.read(piece.end - piece.start)
    if len(data) != piece.end - piece.start or (data and not data.endswith(b"\n")):
        raise OSError(
            f"{path} no longer holds lines {piece.first_line}..{piece.first_line + piece.lines - 1} where "
            f"they were (bytes {piece.start}..{piece.end}): log files are append-only; restore it"
        )
    # decoded once for the whole piece; bytes that are not UTF-8 become U+FFFD, so the line is
    # still read (and becomes a dead letter if it does not parse) instead of failing the read
    lines = data.decode("utf-8", errors="replace").split("\n")[:-1]
    if len(lines) != piece.lines:
        raise OSError(f"{path}: expected {piece.lines} lines at bytes {piece.start}..{piece.end}, found {len(lines)}")
    schema = pa.schema([("split", pa.string()), ("offset", pa.int64()), ("raw", pa.string())])
    for at in range(0, len(lines), BATCH_LINES):
        chunk = lines[at : at + BATCH_LINES]
        first = piece.first_line + at
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([piece.split] * len(chunk), pa.string()),
                pa.array(range(first, first + len(chunk)), pa.int64()),
                pa.array(chunk, pa.string()),
            ],
            schema=schema,
        )


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
