"""The rules a Delta table holds for its rows, and their check over a batch's staged files.

Delta leaves these rules to its writers: a CHECK constraint (``delta.constraints.<name>`` in the
table's configuration), a column invariant (``delta.invariants`` in a field's metadata, writer
version 2) and a generated column (``delta.generationExpression``: the value its row must hold).
Epochal writes its own Parquet files and commits them through delta-rs's transaction API, which
checks none of them (delta-rs's own ``write_deltalake`` does), so the sink checks them itself. It
does so after the writers and before the batch is PENDING, because a PENDING batch must commit.

A row keeps a rule only when its expression is TRUE: NULL breaks it, as in Delta's Spark writer and
delta-rs. The expressions are Spark SQL; sqlglot turns them into DuckDB's, which evaluates them over
the staged files where they lie (no row passes through Python). An identity column's high-water
mark is the writer's to keep as well, and a sink cannot: such a table is refused by
:func:`unsupported_columns`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epochal.sinks.base import SinkConfigError, SinkDataError
from epochal.sql import DUCKDB, SPARK, quote

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

CONSTRAINT_PREFIX = "delta.constraints."
#: how much of a breaking row an error shows
SAMPLE_CHARS = 300


@dataclass(frozen=True)
class RowRule:
    """One rule every row the sink adds must keep."""

    kind: str  # 'CHECK constraint', 'invariant', 'generated column'
    name: str
    #: as the table states it (Spark SQL)
    expression: str
    #: Spark SQL that is TRUE for a row keeping the rule
    predicate: str

    def describe(self) -> str:
        return f"{self.kind} {self.name} ({self.expression})"


def row_rules(table: DeltaTable) -> list[RowRule]:
    """Every CHECK constraint, invariant and generated column of ``table``."""
    rules = [
        RowRule("CHECK constraint", key[len(CONSTRAINT_PREFIX) :], value, value)
        for key, value in sorted(table.metadata().configuration.items())
        if key.startswith(CONSTRAINT_PREFIX) and value
    ]
    for field in json.loads(table.schema().to_json())["fields"]:
        metadata = field.get("metadata") or {}
        invariant = metadata.get("delta.invariants")
        if invariant:
            expression = _invariant_expression(invariant)
            rules.append(RowRule("invariant", field["name"], expression, expression))
        generated = metadata.get("delta.generationExpression")
        if generated:
            column = quote(field["name"], SPARK)
            rules.append(RowRule("generated column", field["name"], generated, f"{column} <=> ({generated})"))
    return rules


def _invariant_expression(text: str) -> str:
    """An invariant's SQL: stored as ``{"expression": {"expression": "x > 3"}}``."""
    try:
        node = json.loads(text)
        return node["expression"]["expression"]
    except (ValueError, KeyError, TypeError):
        return text


def unsupported_columns(table: DeltaTable) -> list[str]:
    """Columns whose values a sink cannot write as the table demands (identity columns)."""
    return [
        f"column {f['name']} is an identity column (GENERATED ... AS IDENTITY), whose values and high-water "
        "mark the writer must generate; the sink writes the view's values"
        for f in json.loads(table.schema().to_json())["fields"]
        if any(k.startswith("delta.identity.") for k in (f.get("metadata") or {}))
    ]


def check_rows(rules: Sequence[RowRule], files: Sequence[str], filesystem: pafs.FileSystem, where: str) -> None:
    """Raise :class:`SinkDataError` naming the first rule some row of ``files`` (Parquet, on
    ``filesystem``) breaks, with how many rows break it and one of them; :class:`SinkConfigError`
    when a rule cannot be evaluated. ``where`` starts the message (the batch and the table)."""
    if not rules or not files:
        return
    import duckdb
    import pyarrow.dataset as ds
    import sqlglot
    import sqlglot.errors

    predicates = []
    for rule in rules:
        try:
            predicates.append(sqlglot.transpile(rule.predicate, read=SPARK, write=DUCKDB)[0])
        except sqlglot.errors.SqlglotError as exc:
            raise _cannot_check(rule, where, exc) from exc
    rows = ds.dataset(list(files), filesystem=filesystem, format="parquet")
    with duckdb.connect() as con:
        con.register("batch_rows", rows)
        broken = []
        for rule, predicate in zip(rules, predicates, strict=True):
            try:
                count = con.execute(
                    f"SELECT count(*) FROM batch_rows WHERE NOT coalesce(({predicate}), false)"
                ).fetchone()[0]
            except (duckdb.DataError, duckdb.InvalidInputException) as exc:
                raise SinkDataError(
                    f"{where}: its {rule.describe()} could not be evaluated over the batch's rows ({exc}); fix the "
                    "view's rows or the table's rule, then the next run delivers the batch again"
                ) from exc
            except duckdb.Error as exc:
                raise _cannot_check(rule, where, exc) from exc
            if count:
                broken.append((rule, predicate, count))
        if not broken:
            return
        rule, predicate, count = broken[0]
        sample = con.execute(f"SELECT * FROM batch_rows WHERE NOT coalesce(({predicate}), false) LIMIT 1")
        names = [d[0] for d in sample.description]
        row = dict(zip(names, sample.fetchone(), strict=True))
    shown = _sample(row)
    others = "".join(f"; its {r.describe()} by {n}" for r, _, n in broken[1:])
    raise SinkDataError(
        f"{where}: {count} row(s) break its {rule.describe()}{others} (e.g. {shown}). Nothing of the batch was "
        "committed. Fix the view's rows or drop the rule (ALTER TABLE ... DROP CONSTRAINT): epochs committed "
        "before a fixed view keep their rows, so then give the sink a new name, which starts from the view's rows"
    )


def _sample(row: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in row.items())
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 3] + "..."


def _cannot_check(rule: RowRule, where: str, exc: Exception) -> SinkConfigError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SinkConfigError(
        f"{where}: Epochal writes the table's files itself, so it checks its {rule.describe()}, and it cannot "
        f"evaluate that expression ({first}): rewrite or drop the rule, or point the sink at another location"
    )
