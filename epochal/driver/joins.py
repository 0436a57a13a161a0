"""An inner join's epoch on the driver: the delta rule of ``epochal.incremental.keyed``, run by DuckDB.

The change of L1 ⋈ ... ⋈ Ln is the sum over the leaves that changed of the join with that leaf
replaced by its change, the leaves before it at their state after the epoch and those after it at
their state before, each read only at the keys the epoch touched (DuckDB's semi-join over the
snapshot's files and the change files after it). Every leaf here is a whole table restricted by its
own columns; a leaf over a subquery would need the whole of its table, which Spark reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from epochal.driver.duck_sql import duckdb_sql
from epochal.driver.tables import NotOnDriver, arrow_schema, conformed, netted, run_sql, semi_joined
from epochal.incremental.plan import Plan
from epochal.sql import DUCKDB, quote
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql.types import StructType

#: a table's rows before the epoch at some keys: (table, (columns, keys)) -> (rows, rows read)
StateAt = Callable[[str, tuple[Sequence[str], pa.Table]], tuple[pa.Table, int]]


def delta_join_on_driver(
    con: duckdb.DuckDBPyConnection,
    plan: Plan,
    columns: Sequence[str],
    stored: StructType,
    deltas: Mapping[str, pa.Table],
    schema_of: Callable[[str], StructType],
    state_before: StateAt,
) -> tuple[pa.Table, int]:
    """The view's change (``stored``'s columns and ``_weight``, netted to unit rows) and the
    stored rows read. Raises NotOnDriver for a plan the driver does not run."""
    if not plan.key_classes:
        raise NotOnDriver("a join without a key reads its inputs whole, which Spark does")
    for leaf in plan.leaves:
        if leaf.table is None or leaf.upstreams != (leaf.table,):
            raise NotOnDriver("a join input over a subquery is read whole by Spark")
        table = arrow_schema(schema_of(leaf.table))
        if any(pa.types.is_floating(table.field(key.strip("`")).type) for key in leaf.key):
            raise NotOnDriver("a floating-point join key is compared by Spark (NaN, -0.0)")
    leaf_schema = {leaf.name: schema_of(leaf.table) for leaf in plan.leaves}
    query = duckdb_sql(plan.query, leaf_schema)
    keys = _affected_keys(con, plan, deltas, schema_of)
    changed = {name for name, delta in deltas.items() if delta.num_rows}
    states: dict[str, tuple[pa.Table, pa.Table]] = {}
    rows_read = 0

    def state_of(index: int) -> tuple[pa.Table, pa.Table]:
        """A leaf's rows at the keys before and after the epoch (read on first use)."""
        nonlocal rows_read
        leaf = plan.leaves[index]
        if leaf.name not in states:
            restrict = _restriction(leaf.key, keys)
            old, read = state_before(leaf.table, restrict)
            rows_read += read
            change = semi_joined(con, deltas[leaf.table], restrict)
            states[leaf.name] = (old, netted(con, old, change))
        return states[leaf.name]

    outputs = []
    for i, leaf in enumerate(plan.leaves):
        if leaf.table not in changed:
            continue
        others = {other.name: state_of(j)[1 if j < i else 0] for j, other in enumerate(plan.leaves) if j != i}
        delta = deltas[leaf.table]
        for sign in (1, -1):
            part = delta.filter(pc.greater(delta[WEIGHT], 0) if sign > 0 else pc.less(delta[WEIGHT], 0))
            frames = {**others, leaf.name: conformed(part, leaf_schema[leaf.name])}
            out = run_sql(con, query, frames)
            if out.num_columns != len(columns):
                raise NotOnDriver(f"the join gave {out.num_columns} columns for {len(columns)}")
            out = conformed(out.rename_columns(list(columns)), stored)
            outputs.append(out.append_column(WEIGHT, pa.array([sign] * out.num_rows, pa.int64())))
    if not outputs:
        return conformed(pa.table({}), stored).append_column(WEIGHT, pa.array([], pa.int64())), rows_read
    return _unit_changes(con, pa.concat_tables(outputs)), rows_read


def _affected_keys(
    con: duckdb.DuckDBPyConnection, plan: Plan, deltas: Mapping[str, pa.Table], schema_of: Callable[[str], StructType]
) -> pa.Table:
    """The distinct keys (one column per key class, ``_epochal_k<i>``) the change touches over every
    leaf, inserts and deletes alike."""
    parts = []
    for leaf in plan.leaves:
        names = ", ".join(f"{expr} AS _epochal_k{i}" for i, expr in enumerate(leaf.key))
        query = duckdb_sql(f"SELECT {names} FROM ({leaf.sql}) AS _leaf", {leaf.table: schema_of(leaf.table)})
        parts.append(run_sql(con, query, {leaf.table: deltas[leaf.table].drop_columns([WEIGHT])}))
    first = parts[0].schema
    unified = [parts[0], *(p.cast(first) for p in parts[1:])]
    return run_sql(con, "SELECT DISTINCT * FROM _keys", {"_keys": pa.concat_tables(unified)})


def _restriction(key: Sequence[str], keys: pa.Table) -> tuple[list[str], pa.Table]:
    """The keys as a restriction of the leaf's columns: one column each (two key classes may meet
    in one column, and restricting by either is enough)."""
    first: dict[str, str] = {}
    for i, expr in enumerate(key):
        first.setdefault(expr.strip("`"), f"_epochal_k{i}")
    return list(first), pa.table({column: keys[name] for column, name in first.items()})


def _unit_changes(con: duckdb.DuckDBPyConnection, weighted: pa.Table) -> pa.Table:
    """Net weights per row as one-row-per-unit (+1/-1) changes (``storage.changes.unit_changes``)."""
    names = [n for n in weighted.column_names if n != WEIGHT]
    listed = ", ".join(quote(n, DUCKDB) for n in names)
    net = f"SELECT {listed}, sum({WEIGHT}) AS _n FROM _w GROUP BY ALL HAVING sum({WEIGHT}) <> 0"
    out = run_sql(
        con,
        f"SELECT {listed}, sign(n._n)::BIGINT AS {WEIGHT} FROM ({net}) AS n, range(abs(n._n)::BIGINT)",
        {"_w": weighted},
    )
    return out.cast(weighted.schema)
