"""mysql-cdc's pure parts: binlog positions as offsets, the upstream-to-declared type map, the
privileges it needs, and one table's binlog changes as a keyed table's records. No server, no Spark.

An offset packs a binlog position into one int: the file's sequence number (``mysql-bin.000042``
is 42) in the high 32 bits, the byte position in the file in the low 32. Offsets then order as the
binlog does, across a rotation to the next file.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from epochal.errors import EpochalError
from epochal.storage.upsert import DELETE, UPSERT

_FILE = re.compile(r"^(.*)\.(\d+)$")


class UpstreamChanged(EpochalError):
    """The upstream table's columns changed: the epoch cannot be read as declared."""


def pack(file: str, position: int) -> int:
    """The offset of ``position`` in binlog file ``file`` (e.g. mysql-bin.000042)."""
    found = _FILE.match(file)
    if found is None:
        raise EpochalError(f"binlog file name {file!r} has no .NNNNNN sequence number")
    if not 0 <= position < 1 << 32:
        raise EpochalError(f"binlog position {position} of {file} does not fit 32 bits")
    return int(found[2]) << 32 | position


def unpack(offset: int) -> tuple[int, int]:
    """(file sequence number, position in the file) of an offset."""
    return offset >> 32, offset & 0xFFFFFFFF


def file_named(files: Iterable[str], sequence: int) -> str | None:
    """Which of the server's binlog ``files`` has ``sequence``, None when it is not there (purged)."""
    for name in files:
        found = _FILE.match(name)
        if found is not None and int(found[2]) == sequence:
            return name
    return None


def shown(offset: int, files: Iterable[str] = ()) -> str:
    """``mysql-bin.000042:1234`` for an offset, when ``files`` (the server's) name its file."""
    sequence, position = unpack(offset)
    name = file_named(files, sequence)
    return f"{name}:{position}" if name else f"position {position} of the binlog file numbered {sequence:06d}"


def bytes_between(lower: int, upper: int, sizes: Sequence[tuple[str, int]]) -> int:
    """Binlog bytes from offset ``lower`` to ``upper``, across files (``sizes``: SHOW BINARY LOGS)."""
    if upper <= lower:
        return 0
    (low_file, low_pos), (high_file, high_pos) = unpack(lower), unpack(upper)
    if low_file == high_file:
        return high_pos - low_pos
    total = 0
    for name, size in sizes:
        sequence = int(_FILE.match(name)[2]) if _FILE.match(name) else -1
        if sequence == low_file:
            total += max(0, size - low_pos)
        elif low_file < sequence < high_file:
            total += size
    return total + high_pos


# --- types -------------------------------------------------------------------------------------

_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")


@dataclass(frozen=True)
class UpstreamColumn:
    name: str
    #: information_schema.COLUMNS.DATA_TYPE (int, varchar, ...) and COLUMN_TYPE (int(11) unsigned, ...)
    data_type: str
    column_type: str
    precision: int | None = None
    scale: int | None = None


def accepted_types(column: UpstreamColumn) -> tuple[str, ...]:
    """The declared types that hold ``column``'s values exactly, the first the natural one; () when
    none does."""
    data_type, column_type = column.data_type.lower(), column.column_type.lower()
    unsigned = "unsigned" in column_type
    if data_type == "tinyint" and re.match(r"tinyint\(1\)", column_type) and not unsigned:
        return ("BOOLEAN", *_INTEGERS)  # MySQL's BOOL is tinyint(1)
    widths = {"tinyint": 0, "smallint": 1, "mediumint": 2, "int": 2, "integer": 2, "bigint": 3}
    if data_type in widths:
        width = widths[data_type] + (1 if unsigned and data_type != "mediumint" else 0)
        return _INTEGERS[width:] if width < len(_INTEGERS) else ()
    if data_type == "decimal" and column.precision is not None and column.scale is not None:
        return (f"DECIMAL({column.precision},{column.scale})",)
    if data_type == "float":
        return ("FLOAT", "DOUBLE")
    if data_type == "double":
        return ("DOUBLE",)
    if data_type in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json", "enum"):
        return ("STRING",)
    if data_type in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return ("STRING",)  # as \x-prefixed hex text, as postgres-cdc reads bytea
    if data_type == "date":
        return ("DATE",)
    if data_type in ("datetime", "timestamp"):
        return ("TIMESTAMP",)
    return ()


def fits(column: UpstreamColumn, declared: str) -> bool:
    accepted = accepted_types(column)
    if declared.replace(" ", "").startswith("DECIMAL(") and accepted and accepted[0].startswith("DECIMAL("):
        want = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", declared.replace(" ", ""))
        return bool(want) and int(want[2]) == column.scale and int(want[1]) >= (column.precision or 0)
    return declared in accepted


def type_problem(column: UpstreamColumn, declared: str) -> str | None:
    if fits(column, declared):
        return None
    accepted = accepted_types(column)
    maps_to = (
        accepted[0]
        if accepted
        else "no type (supported: integers, decimal(p,s), float, double, char, varchar, text, json, "
        "binary, varbinary, blob, date, datetime, timestamp, tinyint(1) as BOOLEAN)"
    )
    return f"column '{column.name}' is {declared}, but upstream it is {column.column_type}, which maps to {maps_to}" + (
        ": declare it as that" if accepted else ""
    )


#: what the replication user needs, and why
NEEDED_PRIVILEGES = {
    "REPLICATION SLAVE": "to read the binlog",
    "REPLICATION CLIENT": "to read the server's binlog position (SHOW MASTER STATUS)",
}


def privilege_problems(grants: Sequence[str], user: str) -> list[str]:
    """The privileges of NEEDED_PRIVILEGES that SHOW GRANTS's lines lack (MariaDB 10.5+ calls
    REPLICATION CLIENT's part BINLOG MONITOR: either is enough)."""
    held: set[str] = set()
    for line in grants:
        found = re.match(r"GRANT (.+?) ON \*\.\* TO", line, re.IGNORECASE)
        if found:
            held |= {p.strip().upper() for p in found[1].split(",")}
    if "ALL PRIVILEGES" in held:
        return []
    aliases = {
        "REPLICATION SLAVE": {"REPLICATION SLAVE", "REPLICATION REPLICA"},
        "REPLICATION CLIENT": {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"},
    }
    missing = [p for p in NEEDED_PRIVILEGES if not held & aliases[p]]
    return [
        f"user {user} lacks {p} ({NEEDED_PRIVILEGES[p]}): GRANT {', '.join(missing)} ON *.* TO {user}"
        for p in missing[:1]
    ] + [f"user {user} lacks {p} ({NEEDED_PRIVILEGES[p]})" for p in missing[1:]]


# --- values and records -----------------------------------------------------------------------


def to_declared(value: object, declared: str) -> object:
    """A value as PyMySQL (snapshot) or mysql-replication (binlog) gives it, as the declared type
    holds it; both paths go through here, so a row reads the same either way."""
    if value is None:
        return None
    if declared == "BOOLEAN":
        return bool(value)
    if declared in _INTEGERS:
        return int(value)
    if declared in ("FLOAT", "DOUBLE"):
        return float(value)
    if declared.startswith("DECIMAL"):
        return Decimal(value) if not isinstance(value, Decimal) else value
    if declared == "STRING":
        if isinstance(value, bytes | bytearray):
            return "\\x" + bytes(value).hex()
        if isinstance(value, dict | list):  # MySQL's binary JSON, decoded by mysql-replication
            return json.dumps(value, separators=(", ", ": "))
        return str(value)
    if declared == "DATE":
        return value.date() if isinstance(value, dt.datetime) else value
    if declared == "TIMESTAMP":
        # DATETIME (no zone) is taken as UTC, as Spark's TIMESTAMP holds instants; TIMESTAMP is read in UTC
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    raise EpochalError(f"mysql-cdc does not read declared type {declared}")


@dataclass(frozen=True)
class RowChange:
    """One row of a binlog rows event: ``kind`` insert/update/delete, at ``offset`` (the event's
    start), with the row before (update, delete) and after (insert, update) by column name; or a
    TRUNCATE of the table (``kind`` truncate, no rows)."""

    kind: str
    offset: int
    before: dict[str, object] | None
    after: dict[str, object] | None


def binlog_records(
    changes: Iterable[RowChange],
    table: str,
    columns: Sequence[tuple[str, str]],
    key: Sequence[str],
    upstream: Sequence[str],
    lower: int,
    upper: int,
) -> list[tuple]:
    """The records of the changes with ``lower <= offset < upper``: each the declared ``columns``
    (name, type) then ``_op``. The range's ends are transaction boundaries (a server's binlog
    position, a snapshot's), so whole transactions are in it. An update that changes the key is a
    delete of the old key and an upsert of the new one. ``upstream``: the table's columns when the
    pipeline loaded; a row with others means an upstream ADD/DROP COLUMN."""
    names = [n for n, _ in columns]
    types = [t for _, t in columns]
    records: list[tuple] = []
    for change in changes:
        if not lower <= change.offset < upper:
            continue
        if change.kind == "truncate":
            raise UpstreamChanged(
                f"upstream table {table} was truncated (binlog position {shown(change.offset)}): TRUNCATE writes "
                "no row events, so Epochal cannot apply it; delete the rows with DELETE instead, or drop the table "
                "from the pipeline and add it again to read a new snapshot"
            )
        for row in (change.before, change.after):
            if row is not None and list(row) != list(upstream):
                added = [c for c in row if c not in upstream]
                dropped = [c for c in upstream if c not in row]
                raise UpstreamChanged(
                    f"upstream table {table} changed while the pipeline read it (now its columns are "
                    f"{', '.join(map(str, row))}; when the pipeline loaded, {', '.join(upstream)}"
                    + (f"; added {', '.join(map(str, added))}" if added else "")
                    + (f"; dropped {', '.join(dropped)}" if dropped else "")
                    + "): Epochal does not follow upstream schema changes yet; drop the table from the pipeline "
                    "and add it again with its new columns to read it from a new snapshot"
                )
        if change.before is not None and (
            change.kind == "delete" or [change.before[k] for k in key] != [change.after[k] for k in key]
        ):
            row = [change.before[n] if n in key else None for n in names]
            records.append((*(to_declared(v, t) for v, t in zip(row, types, strict=True)), DELETE))
        if change.after is not None:
            records.append((*(to_declared(change.after[n], t) for n, t in zip(names, types, strict=True)), UPSERT))
    return records
