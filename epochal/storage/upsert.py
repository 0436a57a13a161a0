"""Upsert sources: an epoch's keyed records, turned into the epoch's change.

A source with a PRIMARY KEY does not receive rows but *records*: an upsert replaces the row with its
key (or inserts it), a delete removes it. Tables in Epochal store changes (columns + ``_weight``),
so a keyed source's epoch is the difference its records make to the source's state:

* per key, only the last record of the epoch counts, ordered by ``(_split, _offset)``. Offsets only
  order records within one split, so producers should send all records of one key to one split;
  across splits the order is the split names' order, which is deterministic but says nothing about
  when the records were written;
* the previous row of every touched key is retracted (-1), and the last record's row is added (+1)
  when it is an upsert;
* what cancels out (an upsert of the row that is already there) is dropped.

Pure Spark DataFrame code (no Dagster, no RDDs, no collects), so it runs the same on a local session,
a cluster and Spark Connect.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

from epochal.errors import EpochalError
from epochal.sql import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Columns a keyed source's records carry after the declared ones (see ``LogSource.read``).
OP_COLUMN = "_op"
SPLIT_COLUMN = "_split"
OFFSET_COLUMN = "_offset"
RECORD_COLUMNS = (OP_COLUMN, SPLIT_COLUMN, OFFSET_COLUMN)
#: An optional column of records (ARRAY<STRING>): the columns an upsert did not send because the
#: update left them unchanged (PostgreSQL's unchanged TOASTed values); they keep the row's value,
#: from the key's earlier record in the epoch or else from the state before it.
UNCHANGED_COLUMN = "_unchanged"
#: The values of ``_op``.
UPSERT = "upsert"
DELETE = "delete"

# Internal column names: prefixed so they cannot meet a declared column.
_RANK = "__epochal_rank"
_PREV = "__epochal_prev_{}"
_FOUND = "__epochal_found"


def upsert_changes(
    incoming: "DataFrame", previous: "DataFrame | None", key: Sequence[str], columns: Sequence[str]
) -> "DataFrame":
    """The change (``columns`` + ``_weight`` BIGINT, one row per unit) that ``incoming`` makes to
    ``previous``.

    ``incoming`` holds the epoch's records: ``columns`` plus ``_op`` ('upsert' or 'delete'),
    ``_split`` and ``_offset``. ``previous`` is the state before the epoch: exactly ``columns``, at
    most one row per key (it is the net of all earlier changes), or None when there is none (a
    table's first epoch: nothing to join). Keys compare NULL-safely.

    The result is lazy, and ``incoming`` is read once. ``previous`` is only read through a join with
    the keys the epoch touches, so beyond scanning it, the work follows the change, not the table."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from epochal.storage.warehouse import WEIGHT

    key, columns = list(key), list(columns)
    _check_shapes(incoming, previous, key, columns)
    partial = UNCHANGED_COLUMN in incoming.columns
    if partial:
        incoming = _unchanged_from_earlier_records(incoming, key, columns)

    # The last record of each key wins. partitionBy groups NULL keys together, which is the
    # NULL-safe equality the join below uses too.
    latest_first = Window.partitionBy(*[F.col(quote(k)) for k in key]).orderBy(
        F.col(SPLIT_COLUMN).desc(), F.col(OFFSET_COLUMN).desc()
    )
    last = incoming.withColumn(_RANK, F.row_number().over(latest_first)).where(F.col(_RANK) == 1)

    if previous is None:
        types = {f.name: f.dataType for f in incoming.schema.fields}
        joined, found = last, F.lit(False)
        prev = {c: F.lit(None).cast(types[c]) for c in columns}
    else:
        # previous's columns renamed, so both sides of the join can be named without ambiguity; the
        # marker tells "no previous row" apart from a previous row whose columns are NULL
        before = previous.select(
            *[F.col(quote(c)).alias(_PREV.format(i)) for i, c in enumerate(columns)], F.lit(True).alias(_FOUND)
        )
        prev = {c: F.col(_PREV.format(i)) for i, c in enumerate(columns)}
        same_key = _all([F.col(quote(k)).eqNullSafe(prev[k]) for k in key])
        joined = last.join(before, same_key, "left")
        found = F.col(_FOUND).isNotNull()
    if partial:
        joined = _unchanged_from_state(joined, columns, prev, found)
    upsert = F.col(OP_COLUMN) == UPSERT
    # An upsert of the row that is already there changes nothing: its -1 and +1 would net to 0.
    # Rows of different keys never meet, so this per-key check is all the netting there is.
    unchanged = found & upsert & _all([F.col(quote(c)).eqNullSafe(prev[c]) for c in columns])
    retract = F.struct(*[prev[c].alias(c) for c in columns], F.lit(-1).cast("bigint").alias(WEIGHT))
    add = F.struct(*[F.col(quote(c)).alias(c) for c in columns], F.lit(1).cast("bigint").alias(WEIGHT))
    # Every row carries a weight of exactly +1 or -1, so the result already has one row per unit:
    # there is no |weight| > 1 to expand. Should ``previous`` break its contract and hold a row
    # twice, the join meets each copy, and each is retracted (and replaced) as a unit of its own.
    units = F.filter(
        F.array(F.when(found & ~unchanged, retract), F.when(upsert & ~unchanged, add)),
        lambda unit: unit.isNotNull(),
    )
    return joined.select(F.inline(units))


def _unchanged(column: str) -> "Column":
    from pyspark.sql import functions as F

    return F.coalesce(F.array_contains(F.col(UNCHANGED_COLUMN), column), F.lit(False))


def _unchanged_from_earlier_records(incoming: "DataFrame", key: list[str], columns: list[str]) -> "DataFrame":
    """``incoming`` with each unchanged value taken from the key's latest earlier record in the
    epoch that sent it (a table's first range holds its snapshot rows, then the log's), and
    UNCHANGED_COLUMN left naming only the columns still to be taken from the state."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    earlier = (
        Window.partitionBy(*[F.col(quote(k)) for k in key])
        .orderBy(F.col(SPLIT_COLUMN), F.col(OFFSET_COLUMN))
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    filled: dict[str, Column] = {}
    still: list[Column] = []
    for c in columns:
        if c in key:
            continue
        # a struct, so that a NULL the record did send is told apart from no record at all
        sent = F.last(F.when(~_unchanged(c), F.struct(F.col(quote(c)).alias("v"))), ignorenulls=True).over(earlier)
        filled[c] = F.when(_unchanged(c) & sent.isNotNull(), sent.getField("v")).otherwise(F.col(quote(c)))
        still.append(F.when(_unchanged(c) & sent.isNull(), F.lit(c)))
    remaining = F.array_compact(F.array(*still)) if still else F.array().cast("array<string>")
    return incoming.withColumns({**filled, UNCHANGED_COLUMN: remaining})


def _unchanged_from_state(
    joined: "DataFrame", columns: list[str], prev: "dict[str, Column]", found: "Column"
) -> "DataFrame":
    """``joined`` (the last records, each beside its key's previous row) with the values still
    unchanged taken from the previous row. An upsert whose row is in neither would be a row the
    source never delivered: an error, never a NULL in its place."""
    from pyspark.sql import functions as F

    missing = F.raise_error(
        F.lit(
            "an update left a large (TOASTed) value unchanged for a row this table does not hold, so its "
            "value is unknown: the table's snapshot and its changes disagree; drop the table from the "
            "pipeline and add it again to read a new snapshot"
        )
    )
    return joined.withColumns(
        {
            c: F.when(_unchanged(c), F.when(found, prev[c]).otherwise(missing)).otherwise(F.col(quote(c)))
            for c in columns
        }
    )


def _all(conditions: "list[Column]") -> "Column":
    return reduce(lambda a, b: a & b, conditions)


def _check_shapes(incoming: "DataFrame", previous: "DataFrame | None", key: list[str], columns: list[str]) -> None:
    """Schema-level checks (no Spark job): wrong shapes would otherwise fail deep inside a plan."""
    if not key:
        raise EpochalError("upsert_changes needs at least one key column")
    stray = [k for k in key if k not in columns]
    if stray:
        raise EpochalError(f"key column(s) {', '.join(stray)} are not among the columns ({', '.join(columns)})")
    for what, frame, needed in (
        ("incoming", incoming, [*columns, *RECORD_COLUMNS]),
        *([("previous", previous, columns)] if previous is not None else []),
    ):
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise EpochalError(
                f"upsert_changes: {what} lacks column(s) {', '.join(missing)} (it has {', '.join(frame.columns)})"
            )
