"""Rewrites the planner applies to a qualified query before looking for its key: each turns a form
Spark accepts but no one key partitions into an equivalent one whose levels each have a key.

* :func:`split_groupings`: a level that aggregates and then ranks, deduplicates or limits its
  groups by something other than a grouping key (``GROUP BY cust ORDER BY count(*) DESC LIMIT 2``,
  ``rank() OVER (ORDER BY count(*))``) is two operators with two partitionings. The aggregation
  moves into a subquery in FROM, which the planner materializes as a stage (keyed by the
  grouping), and the rest reads it (here one partition, recomputed from the stage).
* :func:`wrap_lateral_views`: a column a ``LATERAL VIEW`` generates belongs to no FROM item, so a
  grouping, DISTINCT or window partition by it has no input column to restrict. The FROM item
  and its lateral views become a linear subquery (a leaf) that carries the generated columns.
* :func:`from_less_as_values`: a SELECT without FROM is a constant row, read from a one-row VALUES.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from epochal.incremental.key_analysis import KeyAnalyzer
from epochal.incremental.plan import Unmaintainable
from epochal.incremental.query_shapes import conjuncts, is_aggregate_call, padded_items
from epochal.pipeline.dialect import DIALECT
from epochal.pipeline.stateless import CALL_WRAPPERS, is_window_call

#: The clauses evaluated after the aggregation: they read its groups, never its input rows.
_AFTER_GROUPING = ("distinct", "order", "limit", "offset", "qualify", "sort", "cluster", "distribute")
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
        if f.parent_select is select and is_aggregate_call(f) and not is_window_call(f)
    ]


def _conflicts(select: exp.Select) -> bool:
    try:
        return KeyAnalyzer().level(select.copy()).conflict is not None
    except Unmaintainable:
        return False  # refused for another reason, which the planner reports on its own


def _aggregate_node(node: exp.Expression) -> bool:
    """``node`` is a whole aggregate call of the level: the call with its FILTER or IGNORE NULLS."""
    if isinstance(node, CALL_WRAPPERS) and isinstance(node.this, exp.Func):
        return is_aggregate_call(node.this) and not is_window_call(node)
    if isinstance(node, exp.Func) and is_aggregate_call(node) and not is_window_call(node):
        return not (isinstance(node.parent, CALL_WRAPPERS) and node.parent.this is node)
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
    if not columns:  # (no grouping, and aggregates only in HAVING: the inner level would have no column)
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


# ---------------------------------------------------------------------------------- LATERAL VIEW


def wrap_lateral_views(tree: exp.Expression, schema: Mapping[str, Sequence[str]]) -> exp.Expression:
    """``tree`` (qualified; changed in place and returned) with the lateral views of every level
    that groups, deduplicates, partitions a window or semi-joins by a column one generates moved
    into the FROM item they read: ``FROM orders LATERAL VIEW explode(orders.tags) t AS x GROUP BY
    t.x`` becomes ``FROM (SELECT orders.id AS id, ..., t.x AS x FROM orders AS orders LATERAL VIEW
    explode(orders.tags) t AS x) AS orders GROUP BY orders.x``. A level that only reads generated
    columns keeps its lateral views: its inputs stay whole tables, restricted where they are read.

    Raises :class:`Unmaintainable` when the lateral views cannot move into one input."""
    for select in list(tree.find_all(exp.Select)):
        laterals = [lateral for lateral in select.args.get("laterals") or [] if lateral.args.get("view")]
        if laterals and _keyed_by_generated(select, {lateral.alias_or_name for lateral in laterals}):
            _wrap(select, laterals, schema)
    return tree


def _keyed_by_generated(select: exp.Select, generated: set[str]) -> bool:
    """Some expression ``select`` partitions its rows by reads a column of ``generated``."""
    group = select.args.get("group")
    keys: list[exp.Expression] = list(group.expressions) if group is not None else []
    if select.args.get("distinct"):
        keys += select.expressions
    keys += [
        p for w in select.find_all(exp.Window) if w.parent_select is select for p in w.args.get("partition_by") or []
    ]
    for conjunct in conjuncts(select.args.get("where")):
        inner = conjunct.this if isinstance(conjunct, exp.Not) else conjunct
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            keys.append(inner.this)
    # (an unqualified column there is a generated one the query did not name: _wrap says so)
    return any(c.table in generated or not c.table for key in keys for c in key.find_all(exp.Column))


def _wrap(select: exp.Select, laterals: list[exp.Lateral], schema: Mapping[str, Sequence[str]]) -> None:
    items = _items(select)
    by_alias = {item.alias_or_name: index for index, item in enumerate(items)}
    padded = padded_items(select)
    owner_of: dict[str, int] = {}  # lateral alias -> the item it reads (a later one may read an earlier)
    for lateral in laterals:
        alias = lateral.alias_or_name
        if not lateral.args["alias"].columns:
            raise _refusal(lateral, "its generated columns have no names", f"name them: LATERAL VIEW ... {alias} AS x")
        read = {c.table for c in lateral.this.find_all(exp.Column)}
        if any(a not in by_alias and a not in owner_of for a in read):
            raise _refusal(lateral, "it reads a column of no input of its FROM", "qualify its columns by their input")
        owners = {by_alias[a] for a in read if a in by_alias} | {owner_of[a] for a in read if a in owner_of}
        if len(owners) > 1:
            raise _refusal(
                lateral,
                "it reads the columns of two joined inputs",
                "join them in a subquery in FROM and apply the LATERAL VIEW to that subquery",
            )
        owner = owners.pop() if owners else next((i for i, p in enumerate(padded) if not p), 0)
        if padded[owner]:
            raise _refusal(
                lateral,
                f"it reads {items[owner].alias_or_name}, which an outer join pads with NULLs",
                "apply the LATERAL VIEW in a subquery in FROM that reads that input, then join the subquery",
            )
        owner_of[alias] = owner

    moved = {id(lateral) for lateral in laterals}
    staying = [lateral for lateral in select.args.get("laterals") or [] if id(lateral) not in moved]
    select.set("laterals", staying or None)
    renamed: dict[tuple[str, str], tuple[str, str]] = {}  # (lateral, column) -> (item, column)
    wrappers: dict[int, exp.Select] = {}
    for lateral in laterals:
        owner = owner_of[lateral.alias_or_name]
        item = items[owner]
        if owner not in wrappers:
            columns = _item_columns(item, schema)
            if columns is None:
                raise _refusal(lateral, "the columns of the input it reads are not known", "list them in a subquery")
            alias = item.alias_or_name
            wrappers[owner] = exp.select(*(exp.alias_(exp.column(c, table=alias), c) for c in columns)).from_(
                item.copy()
            )
        wrapper = wrappers[owner]
        wrapper.append("laterals", lateral)
        taken = {name.lower() for name in wrapper.named_selects}
        for identifier in lateral.args["alias"].columns:
            name = identifier.name
            if name.lower() in taken:  # an input column of that name: the generated one is renamed
                name = f"{lateral.alias_or_name}__{identifier.name}"
            if name.lower() in taken:
                raise _refusal(
                    lateral,
                    f"its column {identifier.name} has the name of a column of {item.alias_or_name}",
                    "rename the generated column",
                )
            taken.add(name.lower())
            wrapper.append("expressions", exp.alias_(exp.column(identifier.name, table=lateral.alias_or_name), name))
            renamed[(lateral.alias_or_name, identifier.name.lower())] = (item.alias_or_name, name)

    for column in list(select.find_all(exp.Column)):
        target = renamed.get((column.table, column.name.lower()))
        # (a subquery of its own FROM may name a lateral view alike: its columns are its own)
        if target is not None and column.parent_select is select:
            column.replace(exp.column(target[1], table=target[0]))
    for owner, wrapper in wrappers.items():
        item = items[owner]
        alias = exp.TableAlias(this=exp.to_identifier(item.alias_or_name))
        item.replace(exp.Subquery(this=wrapper, alias=alias))


def _refusal(lateral: exp.Lateral, why: str, rewrite: str) -> Unmaintainable:
    shown = lateral.sql(dialect=DIALECT)
    return Unmaintainable(shown if len(shown) <= 60 else shown[:57] + "...", why, rewrite, lateral)


def _items(select: exp.Select) -> list[exp.Expression]:
    source = select.args.get("from_")
    return ([source.this] if source is not None else []) + [join.this for join in select.args.get("joins") or []]


def _item_columns(item: exp.Expression, schema: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The columns a FROM item offers, or None when they are not known."""
    if isinstance(item, exp.Table):
        columns = schema.get(item.name.lower())
        return None if columns is None else list(columns)
    if isinstance(item, exp.Subquery):
        names = list(item.this.named_selects)
        return None if "*" in names or "" in names else names
    return None


# ---------------------------------------------------------------------------------- a SELECT without FROM


#: Alias and column of the one-row VALUES a SELECT without FROM reads.
ONE_ROW = ("_epochal_one_row", "_epochal_row")


def from_less_as_values(tree: exp.Expression) -> exp.Expression:
    """``tree`` (changed in place) with every SELECT without FROM that yields rows of the query
    (a set-operation branch, a subquery in FROM, JOIN or IN) reading a one-row VALUES instead.

    ``... UNION ALL SELECT 'z' AS item`` is a constant row: planned linear, the branch gave the row in
    the query over the inserted rows and again over the deleted ones, so it cancelled and the view
    never had it. Reading VALUES, it is a constant input like any inline table (keyed, present
    from the first epoch)."""
    for select in list(tree.find_all(exp.Select)):
        if select.args.get("from_") is not None or not _yields_rows(select):
            continue
        alias, column = ONE_ROW
        one = exp.Values(
            expressions=[exp.Tuple(expressions=[exp.Literal.number(0)])],
            alias=exp.TableAlias(this=exp.to_identifier(alias), columns=[exp.to_identifier(column)]),
        )
        select.set("from_", exp.From(this=one))
    return tree


def _yields_rows(select: exp.Select) -> bool:
    """Whether ``select``'s rows are rows of the query (not a scalar subquery's value)."""
    node: exp.Expression = select
    while isinstance(node.parent, exp.Paren):
        node = node.parent
    parent = node.parent
    if parent is None or isinstance(parent, (exp.SetOperation, exp.CTE, exp.In)):
        return True
    relation = (exp.From, exp.Join, exp.SetOperation, exp.In)
    return isinstance(parent, exp.Subquery) and isinstance(parent.parent, relation)


# ---------------------------------------------------------------------------------- EXISTS under OR

#: Alias prefix of the distinct keys an EXISTS test under OR (or NOT, CASE...) becomes.
EXISTS_ALIAS = "_exists"


def exists_as_left_joins(tree: exp.Expression) -> exp.Expression:
    """``tree`` (qualified; changed in place) with each ``EXISTS (subquery)`` that is not a
    top-level conjunct of its level's WHERE (``WHERE a.x > 1 OR EXISTS (...)``, or a column of an
    ungrouped level's select list: ``EXISTS (...) AS has_bids``) turned into a left
    join with the subquery's distinct correlated keys, tested for a match:
    ``EXISTS (SELECT 1 FROM t WHERE t.k = a.k AND t.p > 5)`` becomes ``LEFT JOIN (SELECT DISTINCT
    t.k AS _k0 FROM t WHERE t.p > 5) AS _exists1 ON _exists1._k0 = a.k`` and ``_exists1._k0 IS NOT
    NULL``. The keys are distinct, so each row still appears once; a NULL key matches nothing, as
    in EXISTS. Only a subquery over one table whose correlation is equalities of WHERE is
    rewritten (anything else keeps its refusal), and only in a level that names its columns (a
    ``*`` would read the join's)."""
    count = 0
    for select in list(tree.find_all(exp.Select)):
        where = select.args.get("where")
        if select.args.get("from_") is None:
            continue
        if any(isinstance(p, exp.Star) or isinstance(p.unalias(), exp.Star) for p in select.expressions):
            continue
        top = {id(c) for c in conjuncts(where.this)} if where is not None else set()
        found = list(where.find_all(exp.Exists)) if where is not None else []
        if _ungrouped(select):
            # (in a grouped level the join's key would be neither grouped nor aggregated)
            found += [n for e in select.expressions for n in e.find_all(exp.Exists)]
        for node in found:
            negated = isinstance(node.parent, exp.Not) and id(node.parent) in top
            if node.parent_select is not select or id(node) in top or negated:
                continue  # (a top-level EXISTS / NOT EXISTS is a semi / anti join already)
            keyed = _correlated_keys(node, select)
            if keyed is None:
                continue
            inner, outer, subquery = keyed
            count += 1
            alias = f"{EXISTS_ALIAS}{count}"
            keys = exp.select(*(exp.alias_(e.copy(), f"_k{i}") for i, e in enumerate(inner))).from_(
                subquery.args["from_"].this.copy()
            )
            keys.set("distinct", exp.Distinct())
            if subquery.args.get("where") is not None:
                keys.set("where", subquery.args["where"].copy())
            on = exp.and_(
                *(exp.EQ(this=exp.column(f"_k{i}", table=alias), expression=o.copy()) for i, o in enumerate(outer))
            )
            join = exp.Join(
                this=exp.Subquery(this=keys, alias=exp.TableAlias(this=exp.to_identifier(alias))), side="LEFT", on=on
            )
            select.append("joins", join)
            node.replace(
                exp.Paren(this=exp.Not(this=exp.Is(this=exp.column("_k0", table=alias), expression=exp.Null())))
            )
    return tree


def _ungrouped(select: exp.Select) -> bool:
    """Whether ``select`` neither groups nor aggregates (an aggregate inside a subquery is the subquery's)."""
    return not select.args.get("group") and not any(
        n.parent_select is select for e in select.expressions for n in e.find_all(exp.AggFunc)
    )


def _correlated_keys(
    node: exp.Exists, outer_select: exp.Select
) -> tuple[list[exp.Expression], list[exp.Expression], exp.Select] | None:
    """The inner and outer sides of the correlated equalities of EXISTS's subquery, and the
    subquery with them removed from its WHERE; None for a subquery this rewrite does not take."""
    subquery = node.this
    if not isinstance(subquery, exp.Select) or subquery.args.get("from_") is None:
        return None
    if any(
        subquery.args.get(a)
        for a in ("joins", "group", "having", "distinct", "limit", "offset", "qualify", "laterals", "with")
    ):
        return None
    source = subquery.args["from_"].this
    if not isinstance(source, exp.Table):
        return None
    own = source.alias_or_name
    if any(
        isinstance(n, (exp.Subquery, exp.Exists, exp.Window)) or isinstance(n, exp.AggFunc)
        for n in subquery.walk()
        if n is not subquery
    ):
        return None
    inner: list[exp.Expression] = []
    outer: list[exp.Expression] = []
    kept: list[exp.Expression] = []
    where = subquery.args.get("where")
    for conjunct in conjuncts(where.this if where is not None else None):
        tables = {c.table for c in conjunct.find_all(exp.Column)}
        if own in tables and len(tables) == 1 or not tables:
            kept.append(conjunct)
            continue
        if not isinstance(conjunct, exp.EQ):
            return None  # a correlation that is no equality
        sides = [{c.table for c in side.find_all(exp.Column)} for side in (conjunct.this, conjunct.expression)]
        if sides[0] == {own} and sides[1] and own not in sides[1]:
            inner.append(conjunct.this)
            outer.append(conjunct.expression)
        elif sides[1] == {own} and sides[0] and own not in sides[0]:
            inner.append(conjunct.expression)
            outer.append(conjunct.this)
        else:
            return None
    if not inner:
        return None  # uncorrelated: its refusal names it
    # the outer side must read only the level's own inputs (not a level further out)
    defined = {
        i.alias_or_name
        for i in [outer_select.args["from_"].this, *(j.this for j in outer_select.args.get("joins") or [])]
    }
    if any(c.table not in defined for o in outer for c in o.find_all(exp.Column)):
        return None
    rest = subquery.copy()
    rest.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return inner, outer, rest


# ---------------------------------------------------------------------------------- scalar subqueries

#: Alias of the join a scalar subquery becomes.
SCALAR_ALIAS = "_scalar"
#: Aggregates whose value over no rows is NULL, as a left join's missing match is; count's is 0.
_NULL_WHEN_EMPTY = (exp.Sum, exp.Avg, exp.Min, exp.Max)


def scalar_subqueries_as_joins(tree: exp.Expression) -> exp.Expression:
    """``tree`` (qualified; changed in place) with each scalar subquery that is one aggregate of one
    table and no GROUP BY turned into a join, in WHERE or in an ungrouped level's select list:

    * correlated by equalities (``(SELECT count(*) FROM e WHERE e.id = t.id)``): a left join with
      the aggregate grouped by the correlated columns, ``LEFT JOIN (SELECT e.id AS _k0, count(*) AS
      _v FROM e GROUP BY e.id) AS _scalar1 ON _scalar1._k0 = t.id``, read as ``coalesce(_scalar1._v,
      0)`` for count (its value over no rows) and ``_scalar1._v`` for sum, avg, min and max (NULL);
    * uncorrelated (``(SELECT max(k) FROM u)``): a cross join with its one row (an aggregate without
      GROUP BY has exactly one), read as ``_scalar1._v``.

    The joins are maintained like any other; anything else keeps its refusal."""
    count = 0
    for select in list(tree.find_all(exp.Select)):
        if select.args.get("from_") is None:
            continue
        if any(isinstance(p, exp.Star) or isinstance(p.unalias(), exp.Star) for p in select.expressions):
            continue
        where = select.args.get("where")
        found = list(where.find_all(exp.Subquery)) if where is not None else []
        if _ungrouped(select):
            found += [n for e in select.expressions for n in e.find_all(exp.Subquery)]
        for node in found:
            if node.parent_select is not select or isinstance(node.parent, (exp.In, exp.Exists)):
                continue
            aggregate = _one_aggregate(node.this)
            if aggregate is None:
                continue
            probe = node.this.copy()
            probe.set("expressions", [exp.Literal.number(1)])
            keyed = _correlated_keys(exp.Exists(this=probe), select)
            if keyed is None and _reads_outside(node.this):
                continue  # correlated, but not by equalities of WHERE
            count += 1
            alias = f"{SCALAR_ALIAS}{count}"
            source = node.this.args["from_"].this.copy()
            if keyed is None:
                values = exp.select(exp.alias_(aggregate.copy(), "_v")).from_(source)
                if node.this.args.get("where") is not None:
                    values.set("where", node.this.args["where"].copy())
                join = exp.Join(this=exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias))),
                                kind="CROSS")
            else:
                inner, outer, rest = keyed
                keys = [exp.alias_(e.copy(), f"_k{i}") for i, e in enumerate(inner)]
                values = exp.select(*keys, exp.alias_(aggregate.copy(), "_v")).from_(source)
                if rest.args.get("where") is not None:
                    values.set("where", rest.args["where"].copy())
                values.set("group", exp.Group(expressions=[e.copy() for e in inner]))
                on = exp.and_(
                    *(exp.EQ(this=exp.column(f"_k{i}", table=alias), expression=o.copy()) for i, o in enumerate(outer))
                )
                join = exp.Join(
                    this=exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias))),
                    side="LEFT",
                    on=on,
                )
            select.append("joins", join)
            value: exp.Expression = exp.column("_v", table=alias)
            if keyed is not None and isinstance(aggregate, exp.Count):
                value = exp.func("coalesce", value, exp.Literal.number(0))
            node.replace(value)
    return tree


def _one_aggregate(query: exp.Expression) -> exp.Expression | None:
    """The aggregate call of ``SELECT agg(x) FROM one_table [WHERE ...]``, else None."""
    if not isinstance(query, exp.Select) or len(query.expressions) != 1 or query.args.get("from_") is None:
        return None
    if any(
        query.args.get(a)
        for a in ("joins", "group", "having", "distinct", "limit", "offset", "qualify", "laterals", "with", "order")
    ):
        return None
    if not isinstance(query.args["from_"].this, exp.Table):
        return None
    call = query.expressions[0].unalias()
    if not isinstance(call, (exp.Count, *_NULL_WHEN_EMPTY)):
        return None
    if any(isinstance(n, (exp.Subquery, exp.Exists, exp.Window)) for n in query.walk() if n is not query):
        return None
    if any(isinstance(n, exp.AggFunc) for n in call.walk() if n is not call):
        return None
    return call


def _reads_outside(query: exp.Select) -> bool:
    """Whether ``query`` reads a column of a table it does not name itself (it is correlated)."""
    own = {t.alias_or_name for t in query.find_all(exp.Table)}
    return any(c.table and c.table not in own for c in query.find_all(exp.Column))
