"""An append-only JSON Lines log as a source connector.

``<path>/<split>.jsonl`` holds one record per line; each file is a split and the offset of a record
is its 0-based line number (blank lines count, and are skipped). Producers append whole lines under
an exclusive ``flock`` (see ``append_records``); the planner only hands out complete lines, so a
line that is still being written is picked up by a later epoch, never half-read.

A source with a PRIMARY KEY reads records instead of rows: ``"_op"`` says whether a record upserts
(absent, "insert", "upsert", "update") or deletes ("delete") the row with its key, and ``read``
hands them on with their operation and position for ``epochal.storage.upsert.upsert_changes`` to net.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors.base import SourceBatch, SplitRange
from epochal.connectors.json_lines import OP_KEY, SHOWN_VALUE_CHARS, UPSERT_OPS, keyed_records, plain_records
from epochal.connectors.log_lines import LineIndex, LinePiece, open_index
from epochal.errors import EpochalError
from epochal.options import (
    ENCODE_KEY,
    FORMAT_KEY,
    clause_text,
    format_encode,
    unknown_option_problems,
    whole_number_option,
    with_options,
)
from epochal.pipeline.model import Column
from epochal.storage.upsert import DELETE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from epochal.pipeline.model import SourceDef

LOG_OPTIONS = ("connector", "path", "format", "max.events.per.epoch", "scan.startup.mode")
LOG_FORMATS = ("json",)
#: where a new source's history starts, as RisingWave's scan.startup.mode: every line, or only
#: the lines written after the source first sees its splits
STARTUP_MODES = ("earliest", "latest")
SUFFIX = ".jsonl"
DEFAULT_SPLIT = "0"

# Split names end up in Spark paths, where Hadoop treats * ? [ ] { } as globs: keep them plain.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def valid_split_name(split: str) -> bool:
    return bool(_SPLIT_NAME.fullmatch(split))


def split_path(directory: Path, split: str) -> Path:
    """The file that holds ``split``."""
    if not valid_split_name(split):
        raise EpochalError(
            f"'{split}' is not a valid log split name: use letters, digits, '_', '-' and '.' "
            f"(not first), e.g. '0' or 'orders-eu'"
        )
    return directory / f"{split}{SUFFIX}"


# --- options --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogConfig:
    directory: Path
    #: records per epoch across all splits; None: everything complete
    max_events_per_epoch: int | None = None
    #: ``scan.startup.mode``: "latest" starts a source that has read nothing yet at its splits' ends
    startup_mode: str = "earliest"


def parse_log_options(options: Mapping[str, str], home: Path) -> tuple[LogConfig | None, list[str]]:
    """The config for ``options`` and the problems with them (config is None when there are any)."""
    problems = unknown_option_problems("log", with_options(options), LOG_OPTIONS)
    problems += log_clause_problems(options)
    raw_path = (options.get("path") or "").strip()
    if not raw_path:
        problems.append("log source needs option path = '...', the directory holding <split>.jsonl files")
    fmt = options.get("format", "json")
    if fmt.strip().lower() not in LOG_FORMATS:
        problems.append(f"log format '{fmt}' is not supported: use format = 'json' (one JSON object per line)")
    max_events = whole_number_option(options, "max.events.per.epoch", None, 1, problems)
    startup = options.get("scan.startup.mode", "earliest").strip().lower()
    if startup not in STARTUP_MODES:
        problems.append(
            f"scan.startup.mode = '{options['scan.startup.mode']}' is not a startup mode: use 'earliest' "
            f"(read every line already in the log, the default) or 'latest' (only lines written from now on)"
        )
    if problems:
        return None, problems
    directory = Path(raw_path).expanduser()
    if not directory.is_absolute():
        directory = home / directory
    return LogConfig(directory, max_events, startup), []


#: the FORMAT/ENCODE clauses a log reads: PLAIN is today's reading (a keyed table's records upsert
#: or delete by ``_op``), UPSERT says so explicitly; the loader requires a PRIMARY KEY for UPSERT
LOG_CLAUSES = (("plain", "json"), ("upsert", "json"))


def log_clause_problems(options: Mapping[str, str]) -> list[str]:
    """The FORMAT/ENCODE clause of a log source, when it is one the log does not read."""
    fmt, encode, clause = format_encode(options)
    if fmt is None:
        return []
    problems = []
    if (fmt, encode) not in LOG_CLAUSES:
        problems.append(
            f"the log connector does not read {clause_text(fmt, encode)}: use FORMAT PLAIN ENCODE JSON (one "
            f"JSON object per line) or FORMAT UPSERT ENCODE JSON (a keyed table, '_op' marks deletes); "
            f"Debezium envelopes are read by connector = 'posix_fs'"
        )
    for key in clause:
        problems.append(f"ENCODE JSON takes no options here, got '{key}': remove it")
    return problems


class LogConnectorSpec:
    name = "log"
    identity_options = ("path", "format", FORMAT_KEY, ENCODE_KEY)
    fields_by_spelling = True

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        if option == "format":
            return (value or "json").strip().lower()
        if option == FORMAT_KEY:
            # a log reads PLAIN and UPSERT records alike (a keyed table's '_op' marks deletes)
            fmt = (value or "plain").strip().lower()
            return "plain" if fmt == "upsert" else fmt
        if option == ENCODE_KEY:
            return (value or "json").strip().lower()
        if option == "path" and value is not None and value.strip():
            path = os.path.expanduser(value.strip())
            if home is not None and not os.path.isabs(path):
                path = os.path.join(os.path.abspath(home), path)  # as the connector resolves it
            return os.path.normpath(path)
        return value

    def validate(self, columns: "tuple[Column, ...]", options: Mapping[str, str]) -> list[str]:
        # the home directory only matters for resolving the path, not for whether it is valid
        _, problems = parse_log_options(options, Path("."))
        for column in columns:
            if column.name.lower() == OP_KEY:
                problems.append(
                    f"column '{column.name}' is reserved: the '{OP_KEY}' key of a record marks its "
                    f"change operation; rename the column"
                )
        return problems

    def create(self, source: "SourceDef", home: Path) -> "LogSource":
        problems = self.validate(source.columns, source.options)
        config, _ = parse_log_options(source.options, home)
        if problems or config is None:
            raise EpochalError(f"source {source.name}: " + "; ".join(problems))
        for key in source.primary_key:
            if key not in source.column_names:
                # the loader reports this with file and line; this guards direct construction
                raise EpochalError(f"source {source.name}: PRIMARY KEY column '{key}' is not a column")
        return LogSource(config, source.columns, source.primary_key)


# --- planning (no Spark) --------------------------------------------------------------------------


class LogSource:
    def __init__(self, config: LogConfig, columns: "tuple[Column, ...]", primary_key: tuple[str, ...] = ()):
        self.config = config
        self.columns = columns
        #: with a key, records upsert or delete rows (see ``read``); without one, they are appended
        self.primary_key = primary_key
        #: per split, where its lines start, counted as far as the file was last seen
        self._indexes: dict[str, LineIndex] = {}

    def splits(self) -> list[str]:
        """Names of the splits that exist now (file stems), sorted."""
        if not self.config.directory.is_dir():
            return []  # no producer has written yet
        names = []
        for path in self.config.directory.glob(f"*{SUFFIX}"):
            split = path.name[: -len(SUFFIX)]
            if split.startswith(".") or not path.is_file():
                continue  # hidden files are editors' and tools' temporaries
            if not valid_split_name(split):
                # refuse rather than skip: skipping would silently drop the records in it
                raise EpochalError(
                    f"log file {path} has a name that is not a valid split name: rename it to use "
                    f"only letters, digits, '_', '-' and '.'"
                )
            names.append(split)
        return sorted(names)

    def complete_lines(self, split: str) -> int:
        """Lines of ``split`` that end with a newline; a half-written last line is not counted."""
        try:
            f, index = open_index(split_path(self.config.directory, split), self._indexes.get(split))
        except FileNotFoundError:
            self._indexes.pop(split, None)
            return 0
        f.close()
        self._indexes[split] = index
        return index.lines

    def split_ends(self) -> dict[str, int]:
        """Each split's end (its complete lines) now: what a source's lag is measured against."""
        return {split: self.complete_lines(split) for split in self.splits()}

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        # 'latest' applies once, when the source has read no split yet: a split that appears later
        # holds only lines written after the source started, so it is read from its first line.
        latest = self.config.startup_mode == "latest" and not start
        backlog = {}
        for split in self.splits():
            available = self.complete_lines(split)
            first = available if latest else start.get(split, 0)
            if first > available:
                raise EpochalError(
                    f"log split '{split}' has {available} complete line(s) but this source has already "
                    f"read up to line {first}: {split_path(self.config.directory, split)} was truncated "
                    f"or replaced; log files are append-only, so restore it or reset the source's offsets"
                )
            backlog[split] = (first, available)
        take = _share(
            {split: available - first for split, (first, available) in backlog.items()},
            self.config.max_events_per_epoch,
        )
        return [SplitRange(split, first, first + take[split]) for split, (first, _) in backlog.items()]

    # --- reading (Spark) --------------------------------------------------------------------------

    def read(self, spark: "SparkSession", ranges: list[SplitRange]) -> SourceBatch:
        from pyspark.sql import functions as F

        # only the ranges' bytes are read, never the rest of the file (see log_lines)
        from epochal.connectors.log_lines_spark import read_lines

        raw = F.col("raw")
        # Tolerate CRLF producers. The regex runs only on lines holding a \r: with the blank-line
        # regex below, run on every line, it cost 1.15-1.4 s of a 2M-line read (Java's $ also
        # matches before a final U+2028 or U+0085, so it stays the regex, not a suffix test).
        lines = read_lines(spark, self.line_pieces(ranges)).select(
            "split",
            "offset",
            F.when(raw.contains("\r"), F.regexp_replace(raw, "\r$", "")).otherwise(raw).alias("raw"),
        )
        return self.parse_lines(lines)

    def parse_lines(self, lines: "DataFrame") -> SourceBatch:
        """Records of ``lines`` (``split``, ``offset``, ``raw``: one JSON object per line), and the
        lines that are none as dead letters. The posix_fs connector reads JSON files with it too."""
        from pyspark.sql import functions as F

        # Blank lines keep their offset but are not records (what append_records skips, too). A
        # line that opens an object is not blank: the regex is asked only of the others.
        raw = F.col("raw")
        lines = lines.where(raw.startswith("{") | ~raw.rlike(r"^\s*$"))
        if self.primary_key:
            return keyed_records(lines, self.columns, self.primary_key)
        return plain_records(lines, self.columns)

    def line_pieces(self, ranges: list[SplitRange]) -> list[tuple[str, LinePiece]]:
        """``(path, piece)`` for the lines of ``ranges``: what ``read`` reads (and the driver path,
        ``log_driver``, too)."""
        pieces = []
        for r in ranges:
            if r.count > 0:
                path = split_path(self.config.directory, r.split)
                pieces.extend((str(path), piece) for piece in self._pieces(path, r))
        return pieces

    def _pieces(self, path: Path, r: SplitRange) -> list[LinePiece]:
        """Where ``r``'s lines are in the file, found from the split's line index. A file that no
        longer has them was truncated or replaced: refused, never read short."""
        try:
            f, index = open_index(path, self._indexes.get(r.split))
        except FileNotFoundError:
            index, f = None, None
        try:
            if index is None or f is None or index.lines < r.end:
                have = 0 if index is None else index.lines
                raise EpochalError(
                    f"log split '{r.split}' has {have} complete line(s) but lines {r.start}..{r.end - 1} were "
                    f"planned for this read: {path} was truncated, replaced or deleted; log files are "
                    f"append-only, so restore it"
                )
            self._indexes[r.split] = index
            return index.pieces(f, r.split, r.start, r.end)
        finally:
            if f is not None:
                f.close()


def _share(backlog: Mapping[str, int], budget: int | None) -> dict[str, int]:
    """How many records each split gets: all of it without a budget, else an even split of the
    budget where splits with less backlog than their share leave the rest to the others."""
    if budget is None:
        return dict(backlog)
    take = {}
    remaining = budget
    # smallest backlog first, so what they leave is spread over the ones still waiting
    order = sorted(backlog, key=lambda s: (backlog[s], s))
    for i, split in enumerate(order):
        take[split] = min(backlog[split], remaining // (len(order) - i))
        remaining -= take[split]
    return take


# --- producing (no Spark) -------------------------------------------------------------------------


def record_lines(data: bytes | str, what: str = "the input") -> list[str]:
    """The records in ``data`` as the reader will see them: split on ``\\n`` only (a trailing ``\\r``
    removed), never on the other line breaks ``str.splitlines`` knows (U+2028, U+2029, U+0085,
    \\v, \\f...), which JSON allows unescaped inside a string. Bytes that are not UTF-8 are refused
    (the reader would turn them into U+FFFD), naming the line."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise EpochalError(
                f"{what} is not UTF-8 text: line {line} has byte 0x{data[exc.start]:02x}; save it as UTF-8"
            ) from None
    else:
        text = data
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def json_record_problem(line: str, keys: Sequence[str] = ()) -> str | None:
    """Why ``line`` (not blank) would be a dead letter of a JSON log before any column's type is
    read: not JSON, or JSON but not one object; for a table with a PRIMARY KEY (``keys``, the key
    fields as records spell them), an ``_op`` that is no operation or a key field missing or null.
    None when the reader takes it that far."""
    import json

    try:
        record = json.loads(line)
    except RecursionError:
        return "it nests too deeply to read"
    except json.JSONDecodeError as exc:  # (its own "line 1" would contradict the line number given)
        return f"it is not JSON ({exc.msg} at character {exc.pos + 1})"
    except ValueError:  # Python's limit on an integer's digits
        return "it holds a number of over 4300 digits, which no reader takes: write it as a string"
    if not isinstance(record, dict):
        kind = "null" if record is None else type(record).__name__.replace("dict", "object").replace("str", "string")
        return f"it is JSON but not an object (got {kind}): each record is one JSON object, {{...}}"
    if keys:
        op = record.get(OP_KEY)
        # the reader takes _op as a string, lower-cased; absent or null is an upsert
        if op is not None and not (isinstance(op, str) and op.lower() in (*UPSERT_OPS, DELETE)):
            return (
                f"{OP_KEY} is {json.dumps(op)[:40]}, not an operation: use one of "
                f"{', '.join(UPSERT_OPS)}, {DELETE}, or leave it out (an upsert)"
            )
        missing = [k for k in keys if record.get(k) is None]
        if missing:
            named = ", ".join(repr(k) for k in missing)
            return f"the key field {named} is missing or null: a keyed record needs its key"
    return None


def check_records(lines: Iterable[str], fmt: str = "json", keys: Sequence[str] = ()) -> None:
    """Refuse, before anything is written, a batch with a record its reader would only send to the
    dead letters (``epochal produce``): EpochalError naming the first bad line (1-based) and why.
    ``keys``: a keyed table's key fields (see :func:`json_record_problem`)."""
    if fmt.strip().lower() != "json":  # parse_log_options refuses any other format first
        raise EpochalError(f"log format '{fmt}' is not supported: use format = 'json'")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue  # blank lines are skipped, as the reader skips them
        problem = json_record_problem(line, keys)
        if problem is not None:
            shown = line if len(line) <= SHOWN_VALUE_CHARS else line[:SHOWN_VALUE_CHARS] + "..."
            raise EpochalError(
                f"line {number} is not a record: {problem}; nothing was written. Fix the line or remove it "
                f"(line {number}: {shown!r})"
            )


def append_records(path_dir: str | os.PathLike[str], lines: Iterable[str], split: str | None = None) -> int:
    """Append ``lines`` as records to ``split`` (default '0') of the log in ``path_dir``; returns how
    many were written.

    Lines are written as given (a malformed one becomes a dead letter when read), minus trailing
    newlines; blank lines are skipped. The batch is one write under an exclusive lock, then fsync'd,
    so concurrent producers never interleave and readers never see a batch's lines out of order."""
    split = DEFAULT_SPLIT if split is None else split
    directory = Path(path_dir)
    path = split_path(directory, split)
    records = []
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if "\n" in text:
            # it would become two records with the wrong offsets; reject the batch, not half of it
            raise EpochalError(f"record {number} contains a line break: each record must be one line of JSON")
        records.append(text)
    if not records:
        return 0
    payload = ("\n".join(records) + "\n").encode("utf-8")
    directory.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # a producer died mid-line: end that line, so it becomes one dead letter instead of
            # swallowing our first record
            payload = b"\n" + payload
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # also releases the lock
    if created:
        # make the new file's directory entry durable too, or a crash could lose the whole split
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return len(records)
