"""One upstream table's WAL changes in an epoch's LSN range, as a keyed table's records.

Pure (no server, no Spark): the pgoutput messages a peek returned go in, the records come out as
Python values of the declared types, each with ``_op`` (upsert/delete, see epochal/storage/upsert.py)
in commit order. A transaction belongs to the epoch whose ``[lower, upper)`` holds its commit LSN,
so no transaction is split across epochs, and reading the same messages again gives the same
records.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal

from epochal.connectors.pgoutput import UNCHANGED, Change, Decoder, Relation, lsn_text
from epochal.errors import EpochalError
from epochal.storage.upsert import DELETE, UPSERT


class UpstreamChanged(EpochalError):
    """The upstream table's shape changed, or it was truncated: the epoch cannot be read as declared."""


class UnreadableValue(EpochalError):
    """An upstream value the declared type cannot hold (a NaN numeric, a year past 9999 or BC)."""


#: Spark's TIMESTAMP and DATE range: PostgreSQL's 'infinity' and '-infinity' become its ends, as
#: Debezium turns them into the largest and smallest timestamps it can write
_LAST_INSTANT = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
_FIRST_INSTANT = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


def _timestamp(text: str) -> dt.datetime:
    if text in ("infinity", "-infinity"):
        return _LAST_INSTANT if text == "infinity" else _FIRST_INSTANT
    value = dt.datetime.fromisoformat(text)
    # timestamp (no zone) is taken as UTC, as Spark's TIMESTAMP holds instants; timestamptz is printed in UTC
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _date(text: str) -> dt.date:
    if text in ("infinity", "-infinity"):
        return (_LAST_INSTANT if text == "infinity" else _FIRST_INSTANT).date()
    return dt.date.fromisoformat(text)


def _decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():  # numeric holds NaN (and, from PostgreSQL 14, infinity); DECIMAL does not
        raise ValueError(f"{text} is not a number a DECIMAL holds")
    return value


_PARSERS: dict[str, Callable[[str], object]] = {
    "BIGINT": int,
    "INT": int,
    "SMALLINT": int,
    "TINYINT": int,
    "DOUBLE": float,
    "FLOAT": float,
    "BOOLEAN": lambda text: text in ("t", "true"),  # boolout writes t, a ::text cast true
    "STRING": lambda text: text,
    "DATE": _date,
    "TIMESTAMP": _timestamp,
}
SUPPORTED_DECLARED = (*_PARSERS, "DECIMAL(p,s)")


def parser(declared: str) -> Callable[[str], object] | None:
    """How PostgreSQL's text of a value becomes a value of the declared type, None when unsupported."""
    if re.fullmatch(r"DECIMAL\(\d+,\d+\)", declared.replace(" ", "")):
        return _decimal
    return _PARSERS.get(declared)


def unreadable(column: str, value: str, where: str, error: Exception) -> UnreadableValue:
    return UnreadableValue(
        f"column '{column}' of {where} holds {value!r}, which its declared type cannot hold ({error}): change "
        "the value upstream and keep such values out (a CHECK constraint), then drop the table from the pipeline "
        "and add it again to read a new snapshot (the epoch's changes cannot be read as declared)"
    )


def typed_row(
    values: Sequence[str | None],
    parsers: Sequence[Callable[[str], object]],
    names: Sequence[str] = (),
    where: str = "the upstream table",
) -> tuple:
    """The values parsed; one that does not parse is an ``UnreadableValue`` naming its column."""
    try:
        return tuple(None if v is None else p(v) for v, p in zip(values, parsers, strict=True))
    except (ValueError, ArithmeticError) as error:
        for i, (v, p) in enumerate(zip(values, parsers, strict=True)):
            try:
                None if v is None else p(v)
            except (ValueError, ArithmeticError) as found:
                raise unreadable(names[i] if i < len(names) else f"#{i + 1}", str(v), where, found) from error
        raise


def wal_records(
    messages: Iterable[bytes],
    table: tuple[str, str],
    columns: Sequence[tuple[str, str]],
    key: Sequence[str],
    upstream: Sequence[str],
    lower: int,
    upper: int,
    keep: Callable[[tuple, int], bool] | None = None,
) -> list[tuple]:
    """The records of ``table`` (schema, name) in the transactions with ``lower <= commit LSN <
    upper``: each the declared ``columns`` (name, type) then ``_op``. An update that changes the key
    is a delete of the old key and an upsert of the new one. ``upstream`` are the table's columns
    when the pipeline loaded: a Relation message with others is an upstream ADD/DROP COLUMN.
    ``keep(key, commit LSN)`` says whether a record of that key applies (a chunked snapshot's
    ``KeyFilter``): a key change's delete and upsert are judged each by its own key."""
    parsers = [parser(t) for _, t in columns]
    if any(p is None for p in parsers):
        raise EpochalError(f"unsupported declared type among {columns}")
    names = [n for n, _ in columns]
    key_at = [names.index(k) for k in key]
    records: list[tuple] = []
    decoder = Decoder()
    for item in decoder.decode(messages):
        if isinstance(item, Relation):
            if (item.namespace, item.name) == table and list(item.columns) != list(upstream):
                _schema_changed(item, upstream)
            continue
        change: Change = item
        if (change.relation.namespace, change.relation.name) != table or not lower <= change.commit_lsn < upper:
            continue
        where = f"{table[0]}.{table[1]} (transaction committed at LSN {lsn_text(change.commit_lsn)})"
        if change.kind == "truncate":
            raise UpstreamChanged(
                f"upstream table {where} was truncated: Epochal does not apply TRUNCATE; delete the rows "
                "with DELETE instead, or drop the table from the pipeline and add it again to read a new snapshot"
            )
        if change.kind in ("update", "delete") and change.old is not None:
            old_key = [change.old.get(k) for k in key]
            if change.kind == "delete" or old_key != [change.new.get(k) for k in key]:
                row = [change.old.get(n) if n in key else None for n in names]
                typed = typed_row(row, parsers, names, where)
                if keep is None or keep(tuple(typed[i] for i in key_at), change.commit_lsn):
                    records.append((*typed, DELETE))
        if change.kind == "delete" and change.old is None:
            raise EpochalError(f"a delete of {where} came without its old key: set REPLICA IDENTITY DEFAULT")
        if change.new is not None:
            row = []
            unchanged: list[str] = []
            for name in names:
                value = change.new[name]
                if value is UNCHANGED:
                    # a whole old row (REPLICA IDENTITY FULL) has it; else the row Epochal holds for
                    # the key does (storage.upsert's UNCHANGED_COLUMN), unless the key changed
                    value = (
                        change.old.get(name, UNCHANGED) if change.old is not None and change.old_is_row else UNCHANGED
                    )
                    key_changed = change.old is not None and [change.old.get(k) for k in key] != [
                        change.new.get(k) for k in key
                    ]
                    if value is UNCHANGED and (name in key or key_changed):
                        raise EpochalError(
                            f"an update of {where} changed the primary key and left the large (TOASTed) value of "
                            f"column '{name}' unchanged, and PostgreSQL does not send it again: ALTER TABLE "
                            f"{table[0]}.{table[1]} REPLICA IDENTITY FULL so that every update carries it"
                        )
                    if value is UNCHANGED:
                        unchanged.append(name)
                        value = None
                row.append(value)
            typed = typed_row(row, parsers, names, where)
            if keep is None or keep(tuple(typed[i] for i in key_at), change.commit_lsn):
                records.append((*typed, UPSERT, tuple(unchanged)) if unchanged else (*typed, UPSERT))
    return records


def _schema_changed(relation: Relation, upstream: Sequence[str]) -> None:
    added = [c for c in relation.columns if c not in upstream]
    dropped = [c for c in upstream if c not in relation.columns]
    what = (
        "; ".join(
            part
            for part in (
                f"column(s) {', '.join(added)} added" if added else "",
                f"column(s) {', '.join(dropped)} dropped" if dropped else "",
            )
            if part
        )
        or "its columns reordered"
    )
    raise UpstreamChanged(
        f"upstream table {relation.qualified} changed while the pipeline read it ({what}): Epochal does not "
        "follow upstream schema changes yet; drop the table from the pipeline and add it again with its new "
        "columns to read it from a new snapshot"
    )
