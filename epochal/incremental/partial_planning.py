"""Planning a partial aggregate: a GROUP BY over one input whose COUNT, SUM, AVG, MIN and MAX are
kept as state (:class:`~epochal.incremental.plan.PartialAggregate`), and the stage that holds it
when the query is not already in that form."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from epochal.errors import require
from epochal.incremental.plan import MIN_MAX_CACHE_PREFIX, Leaf, PartialAggregate, PartialColumn, Stage
from epochal.incremental.query_shapes import column_path, is_aggregate_call, is_row_function, is_stateful
from epochal.pipeline.dialect import DIALECT
from epochal.sql import quote, unquote

_PARTIAL_KINDS: dict[type, str] = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}
#: the columns of a partial aggregate's rows_sql that carry arguments and FILTER conditions
_ARGUMENT_PREFIX = "_epochal_a"
_CONDITION_PREFIX = "_epochal_f"


def _aggregate_call(node: exp.Expression) -> tuple[str, exp.Expression | None, exp.Expression | None] | None:
    """(kind, argument or None for COUNT(*), FILTER condition or None) of an aggregate call a
    partial aggregate can keep; None for anything else (COUNT(DISTINCT), other functions)."""
    condition = None
    if isinstance(node, exp.Filter):
        where = node.expression
        condition = where.this if isinstance(where, exp.Where) else where
        node = node.this
    kind = _PARTIAL_KINDS.get(type(node))
    if kind is None or node.expressions or isinstance(node.this, exp.Distinct):
        return None
    argument = None if isinstance(node.this, exp.Star) else node.this
    if argument is None and kind != "count":
        return None
    for part in (argument, condition):
        if part is not None and (is_stateful(part) or part.find(exp.Window) is not None):
            return None
    return kind, argument, condition


def _aggregate_calls(node: exp.Expression) -> list[exp.Expression]:
    """The aggregate calls in ``node``, a FILTER (WHERE ...) with the call it applies to."""
    return [
        sub
        for sub in node.walk()
        if isinstance(sub, exp.Filter)
        or (isinstance(sub, exp.Func) and is_aggregate_call(sub) and not isinstance(sub.parent, exp.Filter))
    ]


def _one_input_grouping(select: exp.Expression) -> bool:
    """A GROUP BY (or an aggregate over all rows) over one table or linear subquery, filtered by
    WHERE at most: the shape a partial aggregate maintains (anything more is planned by
    recomputing the touched groups)."""
    if not isinstance(select, exp.Select):
        return False
    if any(select.args.get(a) for a in ("joins", "distinct", "limit", "offset", "qualify", "order", "laterals")):
        return False
    group = select.args.get("group")
    if group is None:
        if not any(_aggregate_calls(e) for e in select.expressions):
            return False
    elif not group.expressions or any(group.args.get(a) for a in ("grouping_sets", "cube", "rollup", "totals")):
        return False
    elif any(isinstance(g, exp.Literal) or not g.find(exp.Column) for g in group.expressions):
        return False  # GROUP BY 1 or a constant
    elif not all(is_row_function(g) for g in group.expressions):
        return False  # a session window (or a window no input carries): its groups depend on other rows
    if any(w.parent_select is select for w in select.find_all(exp.Window)):
        return False
    item = select.args["from_"].this
    if not isinstance(item, (exp.Table, exp.Subquery)) or (isinstance(item, exp.Subquery) and is_stateful(item.this)):
        return False
    where = select.args.get("where")
    return where is None or not is_stateful(where.this)


def _group_expressions(select: exp.Select) -> list[exp.Expression]:
    """GROUP BY's expressions; none for an aggregate over all rows (one group, always there)."""
    group = select.args.get("group")
    return list(group.expressions) if group is not None else []


#: (name, kind, argument, condition) of an output column of a partial aggregate; kind 'group' for a group
_AggregateColumn = tuple[str, str, "exp.Expression | None", "exp.Expression | None"]


def _signature(argument: exp.Expression | None, condition: exp.Expression | None) -> tuple[str, str]:
    """What makes two aggregate calls of one kind the same: their argument and FILTER, as SQL."""
    a = argument.sql(dialect=DIALECT) if argument is not None else ""
    c = condition.sql(dialect=DIALECT) if condition is not None else ""
    return a, c


def _canonical_columns(select: exp.Select, extremes: bool) -> list[_AggregateColumn] | None:
    """When ``select`` is its own partial state, its columns as (name, kind, argument, condition),
    kind 'group' for the group columns; else None.

    That is: every group expression is an output column, every other column is COUNT, SUM, or
    (when ``extremes``: the table may keep hidden values for them) MIN or MAX, FILTER allowed;
    there is a COUNT(*) without filter (a group exists while it is above 0), and every SUM, MIN and
    MAX has the COUNT of its argument beside it (the sum is NULL when that count is 0; the kept
    values of a MIN/MAX are all of the group's when there are as many as that count)."""
    if not _one_input_grouping(select) or select.args.get("having"):
        return None
    groups = {g.sql(dialect=DIALECT) for g in _group_expressions(select)}
    columns: list[_AggregateColumn] = []
    seen_groups: set[str] = set()
    for projection in select.expressions:
        inner = projection.unalias()
        text = inner.sql(dialect=DIALECT)
        if text in groups and text not in seen_groups:
            seen_groups.add(text)
            columns.append((projection.alias_or_name, "group", inner, None))
            continue
        call = _aggregate_call(inner)
        if call is None or call[0] == "avg" or (call[0] in ("min", "max") and not extremes):
            return None
        columns.append((projection.alias_or_name, *call))
    if seen_groups != groups or len({name for name, *_ in columns}) != len(columns):
        return None
    counts = {_signature(a, c) for _, kind, a, c in columns if kind == "count"}
    if ("", "") not in counts:
        return None
    if any(kind in ("sum", "min", "max") and _signature(a, c) not in counts for _, kind, a, c in columns):
        return None
    return columns


def _local_sql(node: exp.Expression) -> str:
    """An expression over one input as the planner's leaf keys spell it: without the input's alias."""
    path = column_path(node)
    if path and len(path) >= 2:
        return ".".join(quote(p, when_needed=True) for p in path[1:])
    local = node.copy()
    for column in local.find_all(exp.Column):
        column.set("table", None)
    return local.sql(dialect=DIALECT)


def partial_aggregate(tree: exp.Expression, leaves: Sequence[Leaf], min_max_cache: int) -> PartialAggregate | None:
    """The partial-aggregate description of ``tree`` (its leaf already replaced), when it is one.
    ``min_max_cache``: values kept per MIN/MAX column and group; 0 for a table without hidden
    columns, which then cannot be a partial aggregate with MIN/MAX."""
    if len(leaves) != 1 or not isinstance(tree, exp.Select):
        return None
    columns = _canonical_columns(tree, extremes=min_max_cache > 0)
    if columns is None:
        return None
    group_names = {_local_sql(expr): name for name, kind, expr, _ in columns if kind == "group" and expr is not None}
    key_groups = tuple(group_names.get(unquote(key), group_names.get(key, "")) for key in leaves[0].key)
    if "" in key_groups or set(key_groups) != set(group_names.values()):
        return None  # the groups are not exactly what the leaf is restricted by: recompute instead
    arguments: dict[str, str] = {}
    conditions: dict[str, str] = {}
    projections = [exp.alias_(expr.copy(), name) for name, kind, expr, _ in columns if kind == "group" and expr]
    by_signature = {_signature(a, c): name for name, kind, a, c in columns if kind == "count"}
    partial_columns = []
    for name, kind, argument, condition in columns:
        if kind == "group":
            continue
        a, c = _signature(argument, condition)
        if argument is not None and a not in arguments:
            arguments[a] = f"{_ARGUMENT_PREFIX}{len(arguments)}"
            projections.append(exp.alias_(argument.copy(), arguments[a]))
        if condition is not None and c not in conditions:
            conditions[c] = f"{_CONDITION_PREFIX}{len(conditions)}"
            # NULL is not TRUE: FILTER keeps a row only when its condition is TRUE
            projections.append(exp.alias_(exp.func("COALESCE", condition.copy(), exp.false()), conditions[c]))
        nonnull = by_signature[(a, c)] if kind in ("sum", "min", "max") else ""
        cache = f"{MIN_MAX_CACHE_PREFIX}{name}" if kind in ("min", "max") else ""
        partial_columns.append(PartialColumn(name, kind, arguments.get(a, ""), conditions.get(c, ""), nonnull, cache))
    if not projections:  # COUNT(*) alone over all rows: a row needs a column
        projections.append(exp.alias_(exp.Literal.number(1), f"{_ARGUMENT_PREFIX}_row"))
    rows_select = exp.select(*projections).from_(tree.args["from_"].this.copy())
    if tree.args.get("where") is not None:
        rows_select.set("where", tree.args["where"].copy())
    return PartialAggregate(
        rows_sql=rows_select.sql(dialect=DIALECT),
        groups=tuple(name for name, kind, *_ in columns if kind == "group"),
        rows=by_signature[("", "")],
        columns=tuple(partial_columns),
        key_groups=key_groups,
        min_max_cache=min_max_cache,
    )


def split_partial(select: exp.Expression, name: str, internal: bool) -> tuple[Stage, exp.Select] | None:
    """A grouped aggregate that is not its own partial state (AVG, HAVING, expressions over
    aggregates or groups, or a MIN/MAX in a view people read) becomes a partial-aggregate stage
    and a linear projection of it: AVG(x) = SUM(x) / COUNT(x), HAVING = WHERE over the stage's
    columns; the stage keeps its MIN/MAX values in hidden columns the projection leaves out."""
    if not _one_input_grouping(select) or _canonical_columns(select, extremes=internal) is not None:
        return None
    work = select.copy()
    having = work.args.get("having")
    calls = [call for e in work.expressions for call in _aggregate_calls(e)]
    calls += _aggregate_calls(having) if having is not None else []
    found = [(_aggregate_call(call), call) for call in calls]
    if not found or any(spec is None for spec, _ in found):
        return None
    alias = "_p"
    groups = _group_expressions(work)
    taken: set[str] = set()
    group_columns: list[tuple[exp.Expression, str]] = []
    for index, group in enumerate(groups):
        text = group.sql(dialect=DIALECT)
        named = next((e.alias_or_name for e in work.expressions if e.unalias().sql(dialect=DIALECT) == text), "")
        column = named if named.isidentifier() and named not in taken else f"g{index}"
        taken.add(column)
        group_columns.append((group, column))
    partials: dict[tuple[str, str, str], tuple[str, exp.Expression]] = {}

    def column_of(kind: str, argument: exp.Expression | None, condition: exp.Expression | None) -> exp.Expression:
        a, c = _signature(argument, condition)
        if (kind, a, c) not in partials:
            label = "p_rows" if (kind, a, c) == ("count", "", "") else f"p{len(partials)}_{kind}"
            call = {"count": exp.Count, "sum": exp.Sum, "min": exp.Min, "max": exp.Max}[kind](
                this=argument.copy() if argument is not None else exp.Star()
            )
            if condition is not None:
                call = exp.Filter(this=call, expression=exp.Where(this=condition.copy()))
            partials[(kind, a, c)] = (label, call)
        return exp.column(partials[(kind, a, c)][0], table=alias)

    column_of("count", None, None)
    for spec, call in found:
        require(spec is not None, "every aggregate call found has its spec")
        kind, argument, condition = spec
        if kind in ("sum", "avg"):
            count = column_of("count", argument, condition)
            total = column_of("sum", argument, condition)
            call.replace(exp.Paren(this=exp.Div(this=total, expression=count)) if kind == "avg" else total)
        else:
            if kind in ("min", "max"):  # its count tells when the kept values are all of the group's
                column_of("count", argument, condition)
            call.replace(column_of(kind, argument, condition))
    by_text = {group.sql(dialect=DIALECT): column for group, column in group_columns}

    def to_group_column(node: exp.Expression) -> exp.Expression:
        text = node.sql(dialect=DIALECT)
        return exp.column(by_text[text], table=alias) if text in by_text else node

    outer_expressions = [e.transform(to_group_column) for e in work.expressions]
    outer_filter = having.this.transform(to_group_column) if having is not None else None
    for node in [*outer_expressions, *([outer_filter] if outer_filter is not None else [])]:
        if any(c.table != alias for c in node.find_all(exp.Column)):
            return None  # reads a column that is neither a group nor an aggregate of the stage
    labels = [column for _, column in group_columns] + [label for label, _ in partials.values()]
    if len(set(labels)) != len(labels):
        return None
    stage_select = exp.select(
        *(exp.alias_(group.copy(), column) for group, column in group_columns),
        *(exp.alias_(call, label) for label, call in partials.values()),
    ).from_(select.args["from_"].this.copy())
    if select.args.get("where") is not None:
        stage_select.set("where", select.args["where"].copy())
    if select.args.get("group") is not None:
        stage_select.set("group", select.args["group"].copy())
    upstreams = tuple(dict.fromkeys(t.name.lower() for t in stage_select.find_all(exp.Table)))
    stage = Stage(name, stage_select.sql(dialect=DIALECT), tuple(labels), upstreams)
    outer = exp.select(*outer_expressions).from_(
        exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=exp.to_identifier(alias)))
    )
    if outer_filter is not None:
        outer.set("where", exp.Where(this=outer_filter))
    return stage, outer
