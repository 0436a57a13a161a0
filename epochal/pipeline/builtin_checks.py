"""The built-in ``error`` check of a view's row count against its input, made only where the query
proves the relation (docs/checks.md), named ``<view>__row_count``:

* a projection of one table, without WHERE, GROUP BY, DISTINCT, LIMIT, aggregate or generator:
  exactly as many rows as its input;
* a GROUP BY (plain expressions, no GROUPING SETS/ROLLUP/CUBE, no time window, which may place a
  row in several groups) of one table without generator: at most as many rows as its input, and
  at least one when the input has rows and there is neither WHERE nor HAVING.

Anything else proves nothing and gets no check: a false alarm would hold every sink downstream.
The check's query says what it checks; it is evaluated from the stored row counts (a snapshot's
recorded rows plus the weights of the change files after it), which costs nothing like reading
the rows (:mod:`epochal.runtime.check_step`).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from epochal.pipeline.dialect import DIALECT
from epochal.pipeline.model import CheckDef, Pipeline, ViewDef

ROW_COUNT_SUFFIX = "__row_count"
_GENERATORS = ("explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer", "stack",
               "json_tuple")
_WINDOWS = ("window", "session_window", "hop", "tumble")


def builtin_checks(pipeline: Pipeline) -> dict[str, CheckDef]:
    """The views' row-count checks their queries prove, by name."""
    from epochal.incremental.state_needs import sources_storing_nothing

    stored = set(pipeline.tables) - set(sources_storing_nothing(pipeline))
    found = (row_count_check(view, stored) for view in pipeline.views.values())
    return {check.name: check for check in found if check is not None}


def row_count_check(view: ViewDef, stored: set[str]) -> CheckDef | None:
    """The row-count check of ``view`` when its query proves one against an input in ``stored``
    (tables whose committed rows are kept: reading a source that stores nothing would start Spark)."""
    if view.internal_of is not None:
        return None
    try:
        tree = sqlglot.parse_one(view.query, read=DIALECT)
    except SqlglotError:
        return None
    if not isinstance(tree, exp.Select) or _widens_or_narrows(tree):
        return None
    # (the table the query reads, not ``view.upstreams``: the planner may have split the view into stages)
    source = tree.args.get("from") or tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or source.this.name.lower() not in stored:
        return None
    table = source.this.name.lower()
    group = tree.args.get("group")
    where, having = tree.args.get("where"), tree.args.get("having")
    counts = f"(SELECT count(*) AS n FROM {view.name}) AS v CROSS JOIN (SELECT count(*) AS n FROM {table}) AS i"
    if group is None:
        if where is not None or having is not None or _aggregates(tree):
            return None
        wrong, proven, relation = "v.n <> i.n", f"exactly as many rows as {table}", "equal"
    else:
        if any(group.args.get(k) for k in ("grouping_sets", "rollup", "cube")) or not group.expressions:
            return None
        if group.find(exp.Rollup, exp.Cube, exp.GroupingSets) is not None:  # (written inside GROUP BY)
            return None
        if any(isinstance(f, exp.Anonymous) and f.name.lower() in _WINDOWS for f in group.find_all(exp.Anonymous)):
            return None
        if any(type(f).__name__.lower() in _WINDOWS for f in group.find_all(exp.Func)):
            return None
        wrong, proven, relation = "v.n > i.n", f"at most as many rows as {table}", "at_most"
        if where is None and having is None:
            wrong += " OR (i.n > 0 AND v.n = 0)"
            proven += ", and some when it has rows"
            relation = "at_most_some"
    return CheckDef(
        name=f"{view.name}{ROW_COUNT_SUFFIX}",
        table=view.name,
        severity="error",
        query=f"-- {view.name} has {proven}\nSELECT v.n AS view_rows, i.n AS input_rows FROM {counts} WHERE {wrong}",
        location=view.location,
        builtin=True,
        also_reads=(table,),
        row_count=relation,
    )


def _widens_or_narrows(tree: exp.Select) -> bool:
    """Whether the query changes the row count in a way the proof does not follow."""
    if tree.args.get("joins") or tree.args.get("laterals") or tree.args.get("with") or tree.args.get("with_"):
        return True
    if tree.args.get("distinct") or tree.args.get("limit") or tree.args.get("offset") or tree.args.get("qualify"):
        return True
    if any(isinstance(node, (exp.Subquery, exp.Explode, exp.Inline, exp.Unnest, exp.Lateral)) for node in tree.walk()):
        return True
    return any(
        isinstance(node, exp.Func) and (node.name.lower() in _GENERATORS or node.sql_name().lower() in _GENERATORS)
        for node in tree.walk()
    )


def _aggregates(tree: exp.Select) -> bool:
    """An aggregate outside a window (a global aggregate makes one row of any input)."""
    return any(isinstance(node, exp.AggFunc) and not isinstance(node.parent, exp.Window) for node in tree.walk())
