"""How a view is maintained from its inputs' changes: the incremental planner.

Every stateful operator Epochal supports (GROUP BY and aggregates, DISTINCT, equi-joins of every
kind, IN/EXISTS, set operations, window functions such as top-N) has one property in common: it
*partitions* by a key. The rows of its output that carry key value ``k`` depend only on the input
rows that carry ``k``. So when an epoch changes the inputs at keys ``K``, the view changes only at
``K``, and its change is

    Q(inputs after the epoch, restricted to K)  -  Q(inputs before the epoch, restricted to K)

computed by Spark with the view's own SQL over the two restricted states. This is the
"affected-key recompute" RisingWave uses for operators that are not invertible, applied to a whole
query at once: it is exact for every aggregate (MIN/MAX when the extreme is deleted included), every
join type and NULL keys (restriction is null-safe), and it reads only the state at the touched keys.

The planner's job is to find that key. It builds equivalence classes of columns from the equi-join
conditions (``a.x = b.y`` puts both in one class) and keeps a class when every input of the query has
a member in it and every grouping, DISTINCT, window partition and nested subquery partitions by it.
The inputs the restriction is applied to are the query's *leaves*: upstream tables, or subqueries
that only filter and project (``window()`` assignment included). Whatever a leaf computes, its key
is an expression over the leaf's output, evaluated on the epoch's delta to find ``K``.

When one query level cannot be partitioned by one key (a join on ``a.id`` grouped by ``b.region``,
or joins on two different keys), the planner splits it into stages: the part below the conflict
becomes an internal view, a table of its own with state and change log, and the rest reads it. Each
stage then has a key of its own. RisingWave builds the same shape: one state table per stateful
operator.

A GROUP BY over one input whose aggregates are COUNT, SUM, AVG, MIN and MAX needs less than that:
its output can be its own state (COUNT(*), and COUNT/SUM/MIN/MAX per argument), to which an epoch
adds its change per group (:class:`PartialAggregate`, run by :mod:`epochal.incremental.partial`), so
that only the touched groups' stored rows are read, and the input only where a MIN/MAX lost every
value it keeps. A query that is not already in that form (AVG, HAVING, expressions over aggregates,
any MIN/MAX, whose kept values are hidden columns a view people read must not have) keeps the
partial state in a stage and becomes a linear projection of it.

Queries with no operator that needs state are *linear*: their change is the query over the delta.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sqlglot import exp

from epochal.incremental.key_analysis import KeyAnalyzer
from epochal.incremental.partial_planning import partial_aggregate, split_partial
from epochal.incremental.plan import (
    DEFAULT_MIN_MAX_CACHE,
    LEAF_PREFIX,
    PARTIAL_RULE,
    Leaf,
    Plan,
    PlannedView,
    Stage,
    Unmaintainable,
)
from epochal.incremental.query_shapes import has_semi_join, is_stateful, padded_items
from epochal.incremental.rewrites import (
    exists_as_left_joins,
    from_less_as_values,
    scalar_subqueries_as_joins,
    split_groupings,
    wrap_lateral_views,
)
from epochal.incremental.tuple_in import tuple_in_as_exists
from epochal.pipeline.dialect import DIALECT
from epochal.pipeline.model import STAGE_SEPARATOR  # internal stages: {view}__stage{n}
from epochal.pipeline.time_windows import windows_as_input_columns
from epochal.sql import unquote


def plan_query(
    view: str,
    tree: exp.Expression,
    schema: Mapping[str, Sequence[str]],
    internal: bool = False,
    min_max_cache: int = DEFAULT_MIN_MAX_CACHE,
) -> PlannedView:
    """Plan ``tree``, a *qualified* query (see :func:`epochal.pipeline.query_checks.qualify_query`).

    ``internal``: ``view`` is a stage the planner split off, whose table may hold hidden columns
    (the kept values of its MIN/MAX, ``min_max_cache`` per group). A view people read never does:
    a grouped MIN/MAX keeps its state in a stage, and the view projects it.

    Raises :class:`Unmaintainable` with the construct and a suggested rewrite when no plan exists."""
    tree = tree.copy()
    pivot = next((p for p in tree.find_all(exp.Pivot) if not p.args.get("unpivot")), None)
    if pivot is not None:
        # (its output columns come from the IN list, which the key analysis does not follow)
        raise Unmaintainable(
            "PIVOT",
            "its columns are made from values, not from a column the planner can follow",
            "write each pivoted column as a conditional aggregate, e.g. "
            "sum(CASE WHEN status = 'paid' THEN amount END) AS paid ... GROUP BY customer_id",
            node=pivot,
        )
    tree = from_less_as_values(tree)  # a constant row is a constant input (VALUES)
    tree = tuple_in_as_exists(tree)  # (a, b) IN (SELECT x, y ...) in WHERE: the EXISTS it equals
    tree = exists_as_left_joins(tree)  # EXISTS under OR: a left join with its distinct keys
    tree = scalar_subqueries_as_joins(tree)  # one aggregate's value: a (left) join with it
    constant = tree.find(exp.Values) is not None
    if not is_stateful(tree) and not constant:
        # query "": the view's own text is run, as written
        return PlannedView(Plan("linear", operators=("filter, project, UNION ALL",)))
    stages: list[Stage] = []
    schema = dict(schema)
    while True:
        # A grouped time window becomes a column of the input it reads, which a key can restrict
        # (again after a split: a window over two joined inputs reads one stage then), and so
        # does a column a LATERAL VIEW generates
        tree = windows_as_input_columns(wrap_lateral_views(tree, schema), schema)
        # an aggregation ranked or limited by another key: its groups become a stage (below)
        tree = split_groupings(tree)
        analyzer = KeyAnalyzer()
        level = analyzer.level(tree)
        if level.conflict is None:
            break
        if not level.splittable:
            if isinstance(tree, exp.Select) and _split_joins(view, tree, schema, stages):
                continue
            raise level.conflict
        # Materialize the stateful subqueries of the root (or branches of its set operation) as
        # stages: each is then a table with a key of its own, and the root is planned again over them.
        for part in level.splittable:
            name = f"{view}{STAGE_SEPARATOR}{len(stages) + 1}"
            query = part.this if isinstance(part, exp.Subquery) else _named_as_its_set_operation(part)
            columns = tuple(query.named_selects)
            upstreams = tuple(dict.fromkeys(t.name.lower() for t in query.find_all(exp.Table)))
            stages.append(Stage(name, query.sql(dialect=DIALECT), columns, upstreams))
            schema[name] = columns
            stage = exp.Table(this=exp.to_identifier(name))
            if isinstance(part, exp.Subquery) and part.args.get("alias") is not None:
                stage.set("alias", exp.TableAlias(this=part.args["alias"].this))
                part.replace(stage)
            elif isinstance(part, exp.Subquery):  # x IN (subquery): a subquery reading the stage
                part.replace(exp.Subquery(this=exp.select(*(exp.column(c) for c in columns)).from_(stage)))
            else:  # a branch: its columns, by position as the set operation reads them
                part.replace(exp.select(*(exp.column(c) for c in columns)).from_(stage))
    constant = tree.find(exp.Values) is not None  # (a stage may have taken them)
    if not is_stateful(tree) and not constant:  # what needed state went into the stages
        plan = Plan("linear", query=tree.sql(dialect=DIALECT), operators=("filter, project, UNION ALL",))
        return PlannedView(plan, tuple(stages))
    # VALUES rows are in no epoch's change, which is all a linear query or a partial aggregate
    # reads: a query with them is recomputed at the keys its other inputs' change touches.
    split = None if constant else split_partial(tree, f"{view}{STAGE_SEPARATOR}{len(stages) + 1}", internal)
    if split is not None:
        # The aggregate keeps its partial state in a stage (planned as a partial aggregate when the
        # loader plans it), and the view is a projection of that stage.
        stage, outer = split
        stages.append(stage)
        plan = Plan(
            "linear",
            query=outer.sql(dialect=DIALECT),
            operators=(f"project the partial aggregate {stage.name} (AVG = SUM / COUNT, HAVING = WHERE)",),
            typed_like_query=True,
        )
        return PlannedView(plan, tuple(stages))
    leaves = []
    for index, spec in enumerate(analyzer.leaves):
        key = tuple(expr for _, restrictions in level.classes for leaf, expr in restrictions if leaf == index)
        plain = spec.table is not None and all(unquote(k) in schema.get(spec.table, ()) for k in key)
        leaves.append(Leaf(f"{LEAF_PREFIX}{index}", spec.sql, spec.upstreams, key, spec.table if plain else None))
    for index, spec in enumerate(analyzer.leaves):
        node = spec.node
        replacement = exp.Table(this=exp.to_identifier(f"{LEAF_PREFIX}{index}"))
        alias = node.args.get("alias")
        if alias is not None:
            replacement.set("alias", alias.copy())
        elif isinstance(node, exp.Table):
            replacement.set("alias", exp.TableAlias(this=exp.to_identifier(node.name)))
        if isinstance(node.parent, exp.In):  # x IN (leaf): the leaf has the subquery's one column
            node.replace(exp.Subquery(this=exp.select("*").from_(replacement)))
        elif isinstance(node, exp.Values):  # the leaf's SELECT * names the columns already
            replacement.set("alias", exp.TableAlias(this=alias.this.copy()) if alias is not None else None)
            node.replace(replacement)
        elif isinstance(node, (exp.Subquery, exp.Table)):
            node.replace(replacement)
        else:  # a set-operation branch: a SELECT over the leaf keeps the branch's columns
            node.replace(exp.select("*").from_(replacement))
    # (no key class: inner joins without an equality, whose terms read the other inputs whole)
    rule = "delta join" if _inner_joins_only(tree, keyless=not level.classes) else "recompute"
    plan = Plan(
        "keyed",
        rule=rule,
        query=tree.sql(dialect=DIALECT),
        leaves=tuple(leaves),
        key_classes=tuple(name for name, _ in level.classes),
        operators=tuple(level.operators),
        output_keys=_output_keys(tree, leaves) if rule == "recompute" else (),
    )
    aggregate = None if constant else partial_aggregate(tree, leaves, min_max_cache if internal else 0)
    if aggregate is not None:
        plan = replace(plan, rule=PARTIAL_RULE, aggregate=aggregate)
    return PlannedView(plan, tuple(stages))


def _output_keys(tree: exp.Expression, leaves: Sequence[Leaf]) -> tuple[int, ...]:
    """Per key class, the position of an output column of ``tree`` (the query over the leaves)
    that is the class's key expression of some leaf, as it is: the view's stored rows at a set of
    keys are then the rows whose columns there equal them. Positions, not names: the view's
    columns are named by the loader. Only a leaf in the top level's FROM whose rows an outer join
    never pads with NULLs counts (a padded row carries NULL, not its key). () unless every class
    has one (a view that does not select its GROUP BY key, or selects it transformed)."""
    if not isinstance(tree, exp.Select) or not leaves or not leaves[0].key or tree.args.get("from_") is None:
        return ()
    if any(isinstance(item, exp.Star) or isinstance(item.unalias(), exp.Star) for item in tree.expressions):
        return ()  # positions are only known when every column is written out
    joins = tree.args.get("joins") or []
    items = [tree.args["from_"].this, *(join.this for join in joins)]
    padded = padded_items(tree)
    by_name = {leaf.name: leaf for leaf in leaves}
    aliases: dict[str, Leaf] = {}
    for item, is_padded in zip(items, padded, strict=True):
        if isinstance(item, exp.Table) and item.name in by_name and not is_padded:
            aliases[item.alias_or_name] = by_name[item.name]
    selected: dict[tuple[str, str], int] = {}
    for position, item in enumerate(tree.expressions):
        column = item.unalias()
        if isinstance(column, exp.Column) and column.table in aliases:
            selected.setdefault((column.table, column.name), position)
    found = []
    for index in range(len(leaves[0].key)):
        matches = (
            selected.get((alias, unquote(leaf.key[index]))) for alias, leaf in aliases.items() if index < len(leaf.key)
        )
        position = next((m for m in matches if m is not None), None)
        if position is None:
            return ()
        found.append(position)
    return tuple(found)


def _named_as_its_set_operation(branch: exp.Expression) -> exp.Expression:
    """``branch`` of a set operation with its columns named as the set operation's output (a set
    operation reads its branches by position, and names the columns after its first branch):
    unique names for a stage, where a branch may repeat one (``SELECT 'all', 'all', sum(q)``)."""
    owner = branch.parent
    while isinstance(owner, exp.Paren):
        owner = owner.parent
    names = list(owner.named_selects) if isinstance(owner, exp.SetOperation) else []
    first = branch
    while isinstance(first, (exp.SetOperation, exp.Paren)):
        first = first.this if isinstance(first, exp.Paren) else first.left
    if not isinstance(first, exp.Select) or len(set(names)) != len(first.expressions):
        return branch  # (duplicate names in the set operation itself: the stage says so when it loads)
    renamed = [exp.alias_(e.unalias(), n) for e, n in zip(first.expressions, names, strict=True)]
    first.set("expressions", renamed)
    return branch


def _inner_joins_only(tree: exp.Expression, keyless: bool = False) -> bool:
    """A select-project-join query of inner joins over leaves: its change follows the delta rule.
    ``keyless``: no key partitions it (a comma or CROSS join, a join without an equality), which
    only the delta rule maintains; a keyed join without ON (``FROM a, b WHERE a.k = b.k``) recomputes."""
    if not isinstance(tree, exp.Select) or not tree.args.get("joins"):
        return False
    if any(tree.args.get(a) for a in ("group", "having", "distinct", "limit", "offset", "qualify")):
        return False
    for join in tree.args["joins"]:
        if join.side or (join.kind or "INNER").upper() not in ("INNER", "CROSS") or join.args.get("using"):
            return False
        if join.args.get("on") is None and not keyless:
            return False
    items = [tree.args["from_"].this, *(j.this for j in tree.args["joins"])]
    if any(isinstance(i, exp.Subquery) and is_stateful(i.this) for i in items):
        return False
    level = tree.copy()
    for join in level.args["joins"]:
        join.set("on", None)  # the join itself is what the rule handles; look for anything else
    level.set("joins", None)
    level.set("from_", exp.From(this=exp.Table(this=exp.to_identifier("x"))))
    return not is_stateful(level)


def _split_joins(view: str, select: exp.Select, schema: dict[str, Sequence[str]], stages: list[Stage]) -> bool:
    """Move the longest prefix of ``select``'s joins that one key partitions into a stage.

    ``FROM a JOIN b ON a.id = b.a_id JOIN c ON c.id = b.c_id`` becomes a stage joining a and b
    (keyed by a.id) that the rest joins with c (keyed by c.id). When all of the joins fit, WHERE
    goes into the stage too, and what is left groups, deduplicates or ranks the stage's rows by a
    key of its own. Columns keep their meaning across the cut: ``b.x`` becomes ``stage.b__x``. A
    single input filtered by IN/EXISTS (subquery) is cut the same way, its WHERE in the stage."""
    joins = list(select.args.get("joins") or [])
    # IN/EXISTS (subquery) in WHERE is a semi join: one input filtered by it is a stage of its own
    # too, which the rest groups by another key (``WHERE cust IN (SELECT id ...) GROUP BY item``)
    if not joins and not has_semi_join(select):
        return False
    items = [select.args["from_"].this, *(j.this for j in joins)]
    # (a prefix of one input only without joins: a stage copying one table would key nothing new)
    for size in range(len(items), 0 if not joins else 1, -1):
        aliases = {item.alias_or_name for item in items[:size]}
        with_where = size == len(items)
        outside: list[exp.Expression] = [*select.expressions, *joins[size - 1 :]]
        outside += [select.args[a] for a in ("group", "having", "order", "qualify") if select.args.get(a)]
        if not with_where and select.args.get("where"):
            outside.append(select.args["where"])
        references = _references(outside, aliases, select)
        names = list(dict.fromkeys((path[0], path[1]) for _, path in references))
        if not names:  # e.g. SELECT count(*): the stage still needs a column to have rows
            first = items[0]
            names = [(first.alias_or_name, _item_columns(first, schema)[0])]
        stage_select = exp.select(
            *(exp.alias_(exp.column(column, table=alias), f"{alias}__{column}") for alias, column in names)
        ).from_(items[0].copy())
        for join in joins[: size - 1]:
            stage_select.append("joins", join.copy())
        if with_where and select.args.get("where"):
            stage_select.set("where", select.args["where"].copy())
        if KeyAnalyzer().level(stage_select).conflict is not None:
            continue
        name = f"{view}{STAGE_SEPARATOR}{len(stages) + 1}"
        columns = tuple(f"{alias}__{column}" for alias, column in names)
        upstreams = tuple(dict.fromkeys(t.name.lower() for t in stage_select.find_all(exp.Table)))
        stages.append(Stage(name, stage_select.sql(dialect=DIALECT), columns, upstreams))
        schema[name] = columns
        stage_alias = f"_s{len(stages)}"
        for node, path in references:
            renamed = exp.column(f"{path[0]}__{path[1]}", table=stage_alias)
            for field_name in path[2:]:
                renamed = exp.Dot(this=renamed, expression=exp.to_identifier(field_name))
            node.replace(renamed)
        select.set(
            "from_",
            exp.From(
                this=exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=exp.to_identifier(stage_alias)))
            ),
        )
        select.set("joins", [j for j in joins[size - 1 :]] or None)
        if with_where:
            select.set("where", None)
        return True
    return False


def _item_columns(item: exp.Expression, schema: Mapping[str, Sequence[str]]) -> list[str]:
    if isinstance(item, exp.Table):
        return list(schema.get(item.name.lower(), ()))
    return list(item.this.named_selects) if isinstance(item, exp.Subquery) else []


def _references(
    nodes: list[exp.Expression], aliases: set[str], level: exp.Select
) -> list[tuple[exp.Expression, list[str]]]:
    """Column references (node, path) in ``nodes`` to ``aliases`` of ``level``, outermost node of a
    struct-field chain only, skipping subqueries that define an alias of the same name."""
    found = []
    for root in nodes:
        for column in root.find_all(exp.Column):
            parts = [p.name for p in column.parts]
            if len(parts) < 2 or parts[0] not in aliases or _shadowed(column, parts[0], level):
                continue
            node: exp.Expression = column
            while isinstance(node.parent, exp.Dot) and node.parent.this is node:
                node = node.parent
                parts.append(node.expression.name)
            found.append((node, parts))
    return found


def _shadowed(column: exp.Expression, alias: str, level: exp.Select) -> bool:
    select = column.parent_select
    while select is not None and select is not level:
        defined = [select.args["from_"].this] if select.args.get("from_") else []
        defined += [j.this for j in select.args.get("joins") or []]
        if any(d.alias_or_name == alias for d in defined):
            return True
        select = select.parent_select
    return False
