"""`epochal changes`: the net change of a table between two retained epochs.

The sum of the table's change files in (A, B], netted by ``_weight``: rows with an ``op``
(``insert`` or ``delete``; an update is a delete and an insert; a row inserted and deleted in
between is not there). Applied to the table as of A it gives the table as of B. The change files
of every epoch in the time-travel window are kept (epochal/query/time_travel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.errors import EpochalError
from epochal.query.cut import _columns_of
from epochal.query.time_travel import AsOf, resolve_as_of, retained
from epochal.sql import DUCKDB, duckdb_parquet, quote
from epochal.storage.parts import StateCompacted
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime

#: the ``op`` of a change row
INSERT, DELETE = "insert", "delete"


@dataclass(frozen=True)
class Changes:
    """The net change of ``table`` from epoch ``start`` (excluded) to ``end`` (included): one row per
    row inserted or deleted (``op`` first, then the table's columns); an update is a delete and an
    insert, and a row inserted and deleted in between is not there."""

    table: str
    start: int
    end: int
    columns: list[str]
    rows: list[tuple]

    def records(self) -> list[dict]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def table_changes(runtime: "EpochRuntime", table: str, start: AsOf, end: AsOf | None = None) -> Changes:
    """The net change of ``table`` (a table, source or view) between two retained epochs (``end``
    default: the newest committed)."""
    import duckdb

    names = {t.lower(): t for t in runtime.pipeline.tables}
    if table.lower() not in names:
        raise EpochalError(f"{table} is not a table of this pipeline ({', '.join(runtime.pipeline.tables)})")
    table = names[table.lower()]
    a = resolve_as_of(runtime, start)
    b = resolve_as_of(runtime, end) if end is not None else retained(runtime)[1]
    if b < a:
        raise EpochalError(f"--from {a} is after --to {b}: give the earlier epoch first")
    columns = [n for n, _ in _columns_of(runtime, table)]
    try:
        locations = runtime.controller.committed_locations(table, upto=b, after=a)
    except StateCompacted:
        raise EpochalError(
            f"{table}'s change files between {a} and {b} are not kept: a SOURCE that stores nothing keeps "
            "its rows only until its sinks delivered them; query it AS OF each epoch instead"
        ) from None
    files = [f for _, loc in locations if loc for f in runtime.warehouse.parquet_files(loc)]
    header = ["op", *columns]
    if not files:
        return Changes(table, a, b, header, [])
    cols = ", ".join(quote(c, DUCKDB) for c in columns)
    # (by row, a delete before an insert of the same key reads as an update; a row repeats |net weight| times)
    order = ", ".join([*(str(i + 2) for i in range(len(columns))), "1"])
    rows = duckdb.sql(
        f"WITH net AS (SELECT {cols}, sum({WEIGHT})::BIGINT AS _n FROM {duckdb_parquet(files)} "
        f"GROUP BY ALL HAVING sum({WEIGHT}) <> 0) "
        f"SELECT CASE WHEN _n > 0 THEN '{INSERT}' ELSE '{DELETE}' END AS op, {cols} "
        f"FROM (SELECT {cols}, _n, unnest(range(abs(_n))) FROM net) ORDER BY {order}"
    ).fetchall()
    return Changes(table, a, b, header, rows)
