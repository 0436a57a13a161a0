"""A partial aggregate's epoch on the driver: the arithmetic of ``epochal.incremental.partial``, as
the same SQL run by DuckDB over the change's rows and the touched groups' stored rows.

For each touched group, with ``d`` the change aggregated per group (+1 inserts, -1 deletes):

- a COUNT adds ``d``; an exact SUM (integers, decimals) adds the signed values; a SUM is NULL
  while the count of its values is 0;
- a floating-point SUM adds the inserted values; a deleted one would leave rounding behind, so
  that epoch is Spark's, which recomputes the group from its input (``NotOnDriver``);
- a MIN/MAX's kept values (the group's best values, best first) lose the best deleted ones that
  fall within them, one kept value per delete, and take the best inserted ones that do (all of
  them when the kept values were all of the group's), sorted and cut to ``min_max_cache``; a group
  whose kept values all went while it still has values is Spark's to rebuild from its input.

The change is the old rows (-1) and the new rows (+1), netted: a group whose row did not change
writes nothing. DuckDB orders and compares values as Spark does for the types the driver takes
(strings by bytes, -0.0 equal to 0.0), but for NaN, which Spark sorts last and equals to itself:
a MIN/MAX that meets a NaN is Spark's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from epochal.driver.tables import NotOnDriver, conformed, duck_type, run_sql, with_weight
from epochal.incremental.plan import PartialAggregate, PartialColumn
from epochal.sql import DUCKDB, quote
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql.types import StructType

#: old rows of the touched groups: (group columns, the groups as a table, or None for every row)
#: -> (the stored rows, how many stored rows were read to find them)
GroupReader = Callable[[Sequence[str], pa.Table | None], tuple[pa.Table, int]]
#: the input rows of some groups after the epoch, as ``rows_sql`` gives them (the groups as a table)
#: -> (those rows, stored rows read); raises NotOnDriver when only Spark can read them
InputReader = Callable[[pa.Table], tuple[pa.Table, int]]

_DELTA, _GONE, _IN, _OUT, _OLD = "_delta_", "_gone_", "_in_", "_out_", "_old_"
_REDO = "_epochal_recompute"


def _q(name: str) -> str:
    return quote(name, DUCKDB)


def partial_change_on_driver(
    con: duckdb.DuckDBPyConnection,
    spec: PartialAggregate,
    rows: pa.Table,
    read_groups: GroupReader,
    stored: StructType,
    read_input: InputReader,
) -> tuple[pa.Table, int]:
    """The partial aggregate's change for the epoch, and the stored rows read. ``rows`` is the
    change as the aggregate sees it (``spec.rows_sql``'s columns and ``_weight``); ``stored`` the
    table's schema, hidden kept values included. A group whose kept values all went, or whose
    floating-point sum lost a value, is rebuilt from its input rows (``read_input``), as if every
    one were inserted into an empty group. Raises NotOnDriver for what Spark must do."""
    for column in spec.columns:
        if column.kind in ("min", "max") and not _orderable(rows.schema.field(column.argument).type):
            raise NotOnDriver(f"MIN/MAX of {rows.schema.field(column.argument).type} values is computed by Spark")
    exact = {
        c.name: c.kind == "sum" and not pa.types.is_floating(rows.schema.field(c.argument).type) for c in spec.columns
    }
    delta = run_sql(con, _per_group_sql(spec, exact), {"_rows": rows})
    _refuse(delta, spec)
    touched = None
    if spec.groups:
        touched = conformed(delta.select(list(spec.groups)), _part(stored, spec.groups))
    old, rows_read = read_groups(spec.groups, touched)
    old = conformed(old, stored)
    merged = run_sql(con, _merged_sql(spec, exact, stored), {"_delta": delta, "_old": old})
    redo = pc.fill_null(merged[_REDO], False)
    new = merged.filter(pc.invert(redo)).drop_columns([_REDO])
    if pc.any(redo).as_py():
        inputs, read = read_input(conformed(merged.filter(redo).select(list(spec.groups)), _part(stored, spec.groups)))
        rows_read += read
        inserted = inputs.append_column(WEIGHT, pa.array([1] * inputs.num_rows, pa.int64()))
        rebuilt = run_sql(con, _per_group_sql(spec, exact), {"_rows": inserted})
        empty = conformed(pa.table({}), stored)
        rebuilt = run_sql(con, _merged_sql(spec, exact, stored), {"_delta": rebuilt, "_old": empty})
        new = pa.concat_tables([new, rebuilt.drop_columns([_REDO]).cast(new.schema)])
    change = run_sql(con, _netted_sql(spec, stored.fieldNames()), {"_old": old, "_new": new})
    return conformed(change, with_weight(stored)), rows_read


def _orderable(data_type: pa.DataType) -> bool:
    """Types DuckDB orders as Spark does (NaN refused by ``_refuse``)."""
    return (
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_decimal(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_date32(data_type)
        or pa.types.is_timestamp(data_type)
        or pa.types.is_boolean(data_type)
    )


def _part(schema: StructType, names: Sequence[str]) -> StructType:
    from pyspark.sql.types import StructType

    return StructType([schema[name] for name in names])


def _counted(column: PartialColumn) -> str:
    """The rows the aggregate takes: FILTER true and (but for COUNT(*)) the argument not NULL."""
    parts = [f"{_q(column.condition)} IS TRUE"] if column.condition else []
    if column.argument:
        parts.append(f"{_q(column.argument)} IS NOT NULL")
    return " AND ".join(parts) or "true"


def _per_group_sql(spec: PartialAggregate, exact: dict[str, bool]) -> str:
    """The change aggregated per group: weighted counts and exact sums, an inexact sum's inserted
    total and whether it lost a value, a MIN/MAX's inserted and deleted values."""
    w = _q(WEIGHT)
    columns = [_q(g) for g in spec.groups]
    for c in spec.columns:
        counted, value = _counted(c), _q(c.argument) if c.argument else ""
        if c.kind == "count":
            columns.append(f"sum(CASE WHEN {counted} THEN {w} ELSE 0 END) AS {_q(_DELTA + c.name)}")
        elif c.kind == "sum" and exact[c.name]:
            signed = f"CASE WHEN {w} > 0 THEN {value} ELSE -{value} END"
            columns.append(f"sum(CASE WHEN {counted} THEN {signed} END) AS {_q(_DELTA + c.name)}")
        elif c.kind == "sum":
            columns.append(f"sum({value}) FILTER (WHERE {counted} AND {w} > 0) AS {_q(_DELTA + c.name)}")
            columns.append(f"coalesce(bool_or({counted} AND {w} < 0), false) AS {_q(_GONE + c.name)}")
        else:
            for label, sign in ((_IN, ">"), (_OUT, "<")):
                columns.append(f"list({value}) FILTER (WHERE {counted} AND {w} {sign} 0) AS {_q(label + c.name)}")
    group_by = f" GROUP BY {', '.join(_q(g) for g in spec.groups)}" if spec.groups else ""
    return f"SELECT {', '.join(columns)} FROM _rows{group_by}"


def _refuse(delta: pa.Table, spec: PartialAggregate) -> None:
    """What DuckDB orders otherwise than Spark: a NaN among a MIN/MAX's values."""
    for c in spec.columns:
        if c.kind in ("min", "max") and pa.types.is_floating(delta.schema.field(_IN + c.name).type.value_type):
            for label in (_IN, _OUT):
                if any(v != v for values in delta[label + c.name].to_pylist() if values for v in values):
                    raise NotOnDriver("a MIN/MAX over NaN is ordered by Spark")


def _kept_values_sql(column: PartialColumn, limit: int, new_count: str) -> str:
    """A MIN/MAX's kept values after the epoch, best first (``partial._kept_values`` in Spark). ``L``
    is the last old kept value: values past it may exist unkept in the input, so a delete past it
    never touched the kept ones, and an insert past it cannot enter (unless the old kept values
    were all of the group's)."""
    order = "'ASC'" if column.kind == "min" else "'DESC'"
    at_most = "<=" if column.kind == "min" else ">="
    old = f"coalesce({_q(_OLD + column.cache)}, [])"
    last = f"{old}[-1]"
    complete = f"len({old}) >= coalesce({_q(_OLD + column.nonnull)}, 0)"
    best_out = f"list_slice(list_sort(coalesce({_q(_OUT + column.name)}, []), {order}), 1, {limit})"
    best_in = f"list_slice(list_sort(coalesce({_q(_IN + column.name)}, []), {order}), 1, {limit})"
    # each delete at or before L removes one equal kept value, if one is left
    at = "list_position(acc, d)"
    removed = (
        f"list_reduce(list_filter({best_out}, lambda d: d {at_most} {last}), lambda acc, d: "
        f"CASE WHEN {at} IS NULL THEN acc ELSE list_concat(acc[:{at} - 1], acc[{at} + 1:]) END, {old})"
    )
    entering = f"CASE WHEN {complete} THEN {best_in} ELSE list_filter({best_in}, lambda x: x {at_most} {last}) END"
    merged = f"list_slice(list_sort(list_concat({removed}, {entering}), {order}), 1, {limit})"
    return f"CASE WHEN {_q(new_count)} > 0 THEN {merged} ELSE [] END"


def _merged_sql(spec: PartialAggregate, exact: dict[str, bool], stored: StructType) -> str:
    """Per touched group: the row after the epoch (the stored columns, kept values included) and
    whether only its input can tell it (``_REDO``). Counts come first (a SUM's NULL and the kept
    values read them), then sums and kept values, then the MIN/MAX values read off the kept ones."""
    typed = {f.name: duck_type(f.dataType) for f in stored.fields}
    prior = ", ".join(f"o.{_q(name)} AS {_q(_OLD + name)}" for name in stored.fieldNames())
    same = " AND ".join(f"d.{_q(g)} IS NOT DISTINCT FROM o.{_q(g)}" for g in spec.groups) or "true"
    joined = f"SELECT d.*, {prior} FROM _delta AS d LEFT JOIN _old AS o ON {same}"
    counts = [f"CAST({_plus(c.name)} AS {typed[c.name]}) AS {_q(c.name)}" for c in spec.columns if c.kind == "count"]
    counted = f"SELECT *, {', '.join(counts)} FROM ({joined}) AS j"
    groups = [_q(g) for g in spec.groups]
    level = [*groups, *(_q(c.name) for c in spec.columns if c.kind == "count")]
    outer = [*groups]
    redo = []
    for c in spec.columns:
        if c.kind == "count":
            outer.append(_q(c.name))
        elif c.kind == "sum":
            total = _plus(c.name)
            level.append(f"CAST(CASE WHEN {_q(c.nonnull)} > 0 THEN {total} END AS {typed[c.name]}) AS {_q(c.name)}")
            outer.append(_q(c.name))
            if not exact[c.name]:  # a lost summand leaves rounding behind: the group's input tells
                level.append(_q(_GONE + c.name))
                redo.append(_q(_GONE + c.name))
        else:
            level.append(f"{_kept_values_sql(c, spec.min_max_cache, c.nonnull)} AS {_q(c.cache)}")
            outer.append(f"{_q(c.cache)}[1] AS {_q(c.name)}")
            redo.append(f"({_q(c.nonnull)} > 0 AND len({_q(c.cache)}) = 0)")
    outer += [_q(c.cache) for c in spec.columns if c.cache]
    present = f" WHERE {_q(spec.rows)} > 0" if spec.groups else ""
    kept = f"SELECT {', '.join(level)} FROM ({counted}) AS c{present}"
    flag = " OR ".join(redo) or "false"
    return f"SELECT {', '.join(outer)}, ({flag}) AS {_REDO} FROM ({kept}) AS k"


def _plus(name: str) -> str:
    """The stored value plus the change's (either may be NULL: a new group, or no row of it)."""
    return f"coalesce({_q(_OLD + name)}, 0) + coalesce({_q(_DELTA + name)}, 0)"


def _netted_sql(spec: PartialAggregate, stored: Sequence[str]) -> str:
    """The old rows retracted and the new ones inserted, netted to unit changes."""
    listed = ", ".join(_q(n) for n in stored)
    both = f"SELECT {listed}, -1 AS _w FROM _old UNION ALL SELECT {listed}, 1 AS _w FROM _new"
    net = f"SELECT {listed}, sum(_w) AS _n FROM ({both}) AS b GROUP BY ALL HAVING sum(_w) <> 0"
    return f"SELECT {listed}, sign(n._n)::BIGINT AS {_q(WEIGHT)} FROM ({net}) AS n, range(abs(n._n)::BIGINT)"
