"""Rewrites the planner applies to a qualified query before looking for its key: each turns a form
Spark accepts but no one key partitions into an equivalent one whose levels each have a key.

* :func:`split_groupings`: a level that aggregates and then ranks, deduplicates or limits its
  groups by something other than a grouping key (``GROUP BY cust ORDER BY count(*) DESC LIMIT 2``,
  ``rank() OVER (ORDER BY count(*))``) is two operators with two partitionings. The aggregation
  moves into a subquery in FROM, which the planner materializes as a stage (keyed by the
  grouping), and the rest reads it (here one partition, recomputed from the stage).
"""

from __future__ import annotations

from sqlglot import exp

from epochal.incremental.key_analysis import KeyAnalyzer
from epochal.incremental.plan import Unmaintainable
from epochal.incremental.query_shapes import is_aggregate_call

#: The clauses evaluated after the aggregation: they read its groups, never its input rows.
_AFTER_GROUPING = ("distinct", "order", "limit", "offset", "qualify", "sort", "cluster", "distribute")
#: Modifiers of an aggregate call that belong to it (FILTER, IGNORE NULLS, WITHIN GROUP).
_CALL_WRAPPERS = (exp.Filter, exp.IgnoreNulls, exp.RespectNulls, exp.WithinGroup)
#: Alias of the subquery the aggregation moves into.
GROUPED_ALIAS = "_grouped"


# ---------------------------------------------------------------------------------- aggregation, then the rest


def split_groupings(tree: exp.Expression) -> exp.Expression:
    """``tree`` (qualified; changed in place, the new root returned) with every level that
    aggregates and then applies a window, QUALIFY, DISTINCT or LIMIT/OFFSET no one key partitions
    split in two: ``SELECT cust, count(*) AS n FROM orders GROUP BY cust ORDER BY n DESC LIMIT 2``
    becomes ``SELECT _grouped.cust AS cust, _grouped.a1 AS n FROM (SELECT orders.cust AS cust,
    count(*) AS a1 FROM orders GROUP BY orders.cust) AS _grouped ORDER BY n DESC LIMIT 2``.

    Grouping sets (ROLLUP, CUBE, GROUPING SETS) are left as written."""
    # children first: a split level is replaced, and its nested levels are copied into it
    for select in reversed(list(tree.find_all(exp.Select, bfs=False))):
        if not _aggregates_then_more(select) or not _conflicts(select):
            continue
        outer = _split(select)
        if outer is None:
            continue
        if select is tree:
            tree = outer
        else:
            select.replace(outer)
    return tree


def _aggregates_then_more(select: exp.Select) -> bool:
    group = select.args.get("group")
    if group is not None and any(group.args.get(a) for a in ("grouping_sets", "cube", "rollup", "totals")):
        return False
    if group is None and not _aggregate_calls(select):
        return False
    after = any(select.args.get(a) for a in ("distinct", "limit", "offset", "qualify"))
    return after or any(w.parent_select is select for w in select.find_all(exp.Window))


def _aggregate_calls(select: exp.Select) -> list[exp.Expression]:
    clauses = [*select.expressions, *(select.args[a] for a in ("having", "order", "qualify") if select.args.get(a))]
    return [
        f
        for clause in clauses
        for f in clause.find_all(exp.Func)
        if f.parent_select is select and is_aggregate_call(f) and not _is_window_function(f)
    ]


def _conflicts(select: exp.Select) -> bool:
    try:
        return KeyAnalyzer().level(select.copy()).conflict is not None
    except Unmaintainable:
        return False  # refused for another reason, which the planner reports on its own


def _is_window_function(node: exp.Expression) -> bool:
    """``node`` is what a window computes (``sum(x)`` of ``sum(x) OVER (...)``), possibly under
    IGNORE NULLS, not an aggregate of the level."""
    parent = node.parent
    if isinstance(parent, _CALL_WRAPPERS) and parent.this is node:
        node, parent = parent, parent.parent
    return isinstance(parent, exp.Window) and parent.this is node


def _aggregate_node(node: exp.Expression) -> bool:
    """``node`` is a whole aggregate call of the level: the call with its FILTER or IGNORE NULLS."""
    if isinstance(node, _CALL_WRAPPERS) and isinstance(node.this, exp.Func):
        return is_aggregate_call(node.this) and not _is_window_function(node)
    if isinstance(node, exp.Func) and is_aggregate_call(node) and not _is_window_function(node):
        return not (isinstance(node.parent, _CALL_WRAPPERS) and node.parent.this is node)
    return False


def _split(select: exp.Select) -> exp.Select | None:
    """The level above ``select``'s aggregation, reading it as a subquery; None when a clause
    after the aggregation reads an input column that is not grouped (Spark refuses that too)."""
    group = select.args.get("group")
    grouping = [g for g in (group.expressions if group is not None else [])]
    sources = {item.alias_or_name for item in _items(select)}
    sources |= {lateral.alias_or_name for lateral in select.args.get("laterals") or []}
    outputs = {p.alias_or_name.lower(): p.unalias() for p in select.expressions}

    columns: list[tuple[exp.Expression, str]] = []  # what the inner level projects, by name
    taken: set[str] = set()

    def name_for(expression: exp.Expression, base: str) -> str:
        for known, name in columns:
            if known == expression:
                return name
        # a column keeps its name unless an output column of another meaning has it
        name, n = base, 1
        while name.lower() in taken or (name.lower() in outputs and outputs[name.lower()] != expression):
            name, n = f"{base}_{n}", n + 1
        taken.add(name.lower())
        columns.append((expression, name))
        return name

    for index, expression in enumerate(grouping, start=1):
        name_for(expression, expression.name if isinstance(expression, exp.Column) else f"g{index}")

    def over_groups(node: exp.Expression) -> exp.Expression:
        if any(node == g for g in grouping):
            return exp.column(name_for(node, "g"), table=GROUPED_ALIAS)
        if _aggregate_node(node):
            return exp.column(name_for(node, f"a{len(columns) - len(grouping) + 1}"), table=GROUPED_ALIAS)
        return node

    projections = []
    for projection in select.expressions:
        name = projection.alias_or_name
        rewritten = projection.unalias().transform(over_groups)
        projections.append(exp.alias_(rewritten, name))  # the output keeps its name
    after = {a: select.args[a].transform(over_groups) for a in _AFTER_GROUPING if select.args.get(a)}
    output_names = {p.alias_or_name.lower() for p in select.expressions}
    for clause in [*projections, *after.values()]:
        for column in clause.find_all(exp.Column):
            if column.table in sources or (not column.table and column.name.lower() not in output_names):
                return None  # an input column outside an aggregate and the grouping
    if not columns:  # (an aggregate only in HAVING: the level still needs a column to have rows)
        return None

    inner = select.copy()
    for arg in _AFTER_GROUPING:
        inner.set(arg, None)
    inner.set("expressions", [exp.alias_(expression.copy(), name) for expression, name in columns])
    outer = exp.Select(expressions=projections)
    alias = exp.TableAlias(this=exp.to_identifier(GROUPED_ALIAS))
    outer.set("from_", exp.From(this=exp.Subquery(this=inner, alias=alias)))
    for arg, clause in after.items():
        outer.set(arg, clause)
    return outer


def _items(select: exp.Select) -> list[exp.Expression]:
    source = select.args.get("from_")
    return ([source.this] if source is not None else []) + [join.this for join in select.args.get("joins") or []]
