"""Finding the key a query level partitions by: equivalence classes of columns from its equi-joins,
kept when every input has a member and every grouping, DISTINCT, window partition and nested
subquery partitions by it (see planner.py for why that key makes the view's change exact)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlglot import exp

from epochal.errors import require
from epochal.incremental.plan import Unmaintainable
from epochal.incremental.query_shapes import (
    KeyClasses,
    column_path,
    conjuncts,
    has_semi_join,
    is_aggregate_call,
    is_row_function,
    is_stateful,
    padded_items,
)
from epochal.incremental.refusals import join_without_equality, scalar_subquery
from epochal.pipeline.dialect import DIALECT
from epochal.sql import quote, unquote


@dataclass
class _Item:
    """One input of a query level: a leaf (table, VALUES or linear subquery) or a stateful subquery."""

    id: int
    alias: str
    node: exp.Expression  # the Table or Subquery node in the tree
    leaf: int | None = None  # index into the analyzer's leaves
    child: _Level | None = None


@dataclass
class _Level:
    """What a stateful query level partitions by.

    ``keys``: output column -> restriction of every leaf below, as (leaf index, expression)."""

    keys: dict[str, list[tuple[int, str]]]
    #: key classes of the level as a whole: class description -> restrictions
    classes: list[tuple[str, list[tuple[int, str]]]]
    operators: list[str]
    #: when the level cannot be partitioned: why, and what a split could materialize (subqueries
    #: in FROM, or a set operation's stateful branches)
    conflict: Unmaintainable | None = None
    splittable: list[exp.Expression] = field(default_factory=list)


@dataclass
class _LeafSpec:
    node: exp.Expression
    sql: str
    upstreams: tuple[str, ...]
    table: str | None


def _constant_grouping(node: exp.Expression, select: exp.Select) -> bool:
    """``node`` of ``select``'s GROUP BY reads no column: a constant, or an ordinal (GROUP BY 1,
    which qualification leaves in place when the select item is a literal) naming one."""
    if isinstance(node, exp.Literal) and node.is_int and 1 <= int(node.name) <= len(select.expressions):
        node = select.expressions[int(node.name) - 1].unalias()
    return node.find(exp.Column) is None


class KeyAnalyzer:
    def __init__(self) -> None:
        self.leaves: list[_LeafSpec] = []
        self._ids = 0
        #: IN/EXISTS nodes planned as semi/anti joins (by id: sqlglot nodes take no attributes)
        self.handled: set[int] = set()

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    # -------------------------------------------------------------- items

    def _item(self, node: exp.Expression) -> _Item:
        alias = node.alias_or_name
        if isinstance(node, exp.Table):
            table = node.name.lower()
            self.leaves.append(_LeafSpec(node, f"SELECT * FROM {table}", (table,), table))
            return _Item(self._next_id(), alias, node, leaf=len(self.leaves) - 1)
        if isinstance(node, exp.Subquery):
            query = node.this
            # reading no table (only VALUES), a subquery is constant however it computes: a leaf
            # with no upstream, rather than a stage that no epoch would ever run
            if not is_stateful(query) or query.find(exp.Table) is None:
                tables = tuple(dict.fromkeys(t.name.lower() for t in query.find_all(exp.Table)))
                self.leaves.append(_LeafSpec(node, query.sql(dialect=DIALECT), tables, None))
                return _Item(self._next_id(), alias, node, leaf=len(self.leaves) - 1)
            return _Item(self._next_id(), alias, node, child=self.level(query))
        if isinstance(node, exp.Values):
            # Constant rows: a leaf with no upstream, whose change is always empty and whose state
            # is the rows themselves (restricted by key like any leaf's)
            self.leaves.append(_LeafSpec(node, f"SELECT * FROM {node.sql(dialect=DIALECT)}", (), None))
            return _Item(self._next_id(), alias, node, leaf=len(self.leaves) - 1)
        if isinstance(node, exp.Lateral) and isinstance(node.this, exp.Subquery):
            raise Unmaintainable(
                "a LATERAL subquery",
                "it runs once for every row of the tables before it, so no key partitions it",
                "join the subquery grouped by the columns it correlates on instead, e.g. LEFT JOIN "
                "(SELECT o.cust, count(*) AS n FROM orders o GROUP BY o.cust) t ON t.cust = c.id",
                node,
            )
        raise Unmaintainable(
            f"FROM {node.sql(dialect=DIALECT)[:60]}", "only tables, views and subqueries can be read", node=node
        )

    # -------------------------------------------------------------- levels

    def level(self, query: exp.Expression) -> _Level:
        if isinstance(query, exp.SetOperation):
            return self._set_operation(query)
        if isinstance(query, exp.Select):
            return self._select(query)
        raise Unmaintainable(type(query).__name__, "is not a query Epochal can plan", node=query)

    def _set_operation(self, query: exp.SetOperation) -> _Level:
        kind = type(query).__name__.upper()
        if isinstance(query, exp.Union) and not query.args.get("distinct"):
            kind = "UNION ALL"
        names = list(query.named_selects)
        branches = []
        stateful: list[exp.Expression] = []
        for branch in (query.left, query.right):
            branch = branch.unnest() if isinstance(branch, exp.Paren) else branch
            if is_stateful(branch):
                stateful.append(branch)
                branches.append(("child", self.level(branch), list(branch.named_selects)))
            else:
                tables = tuple(dict.fromkeys(t.name.lower() for t in branch.find_all(exp.Table)))
                self.leaves.append(_LeafSpec(branch, branch.sql(dialect=DIALECT), tables, None))
                branches.append(("leaf", len(self.leaves) - 1, list(branch.named_selects)))
        keys: dict[str, list[tuple[int, str]]] = {}
        for position, name in enumerate(names):
            restrictions: list[tuple[int, str]] = []
            for kind_, what, branch_names in branches:
                column = branch_names[position]
                if kind_ == "leaf":
                    restrictions.append((what, quote(column, when_needed=True)))
                elif column in what.keys:
                    restrictions += what.keys[column]
                else:
                    break
            else:
                keys[name] = restrictions
        operators = [f"{kind}: partitioned by its output columns"]
        for kind_, what, _ in branches:
            if kind_ == "child":
                operators += what.operators
        conflict = None
        if not keys:
            # (e.g. an aggregation by cust beside one over all rows): each stateful branch becomes
            # a stage, a table whose every column partitions it, and the set operation reads them
            conflict = Unmaintainable(kind, "its branches share no column they are partitioned by", node=query)
        return _Level(keys, [(n, r) for n, r in keys.items()], operators, conflict, stateful if conflict else [])

    def _select(self, select: exp.Select) -> _Level:
        items: list[_Item] = []
        by_alias: dict[str, _Item] = {}
        operators: list[str] = []
        classes = KeyClasses()

        def add(item: _Item) -> None:
            items.append(item)
            by_alias[item.alias] = item

        source = select.args.get("from_")
        if source is None:
            raise Unmaintainable("a query without FROM", "reads no table", node=select)
        add(self._item(source.this))
        for join in select.args.get("joins") or []:
            add(self._item(join.this))
            side = (join.side or "").upper()
            kind = (join.kind or "").upper()
            label = " ".join(w for w in (side, kind if kind != "OUTER" else "OUTER", "JOIN") if w)
            on = join.args.get("on")
            if on is None and not join.args.get("using"):
                if side or kind not in ("", "INNER", "CROSS"):
                    raise Unmaintainable(label, "has no ON condition", node=join)
            equalities = self._equalities(on, by_alias, classes)
            operators.append(
                f"{label} {join.this.alias_or_name}" + (f" on {', '.join(equalities)}" if equalities else "")
            )

        for conjunct in conjuncts(select.args.get("where")):
            self._where_conjunct(conjunct, by_alias, classes, add, operators)
        for node in select.find_all(exp.In, exp.Exists):
            if isinstance(node, exp.In) and node.args.get("query") is None:
                continue  # x IN (1, 2, 3): a comparison with a list, as linear as x = 1 OR ...
            if node.parent_select is select and id(node) not in self.handled:
                raise Unmaintainable(
                    "IN/EXISTS (subquery)",
                    "a subquery test is only maintained as a condition of WHERE joined to the others by AND",
                    "move it to the top level of WHERE, or left join the subquery's distinct keys and test them: "
                    "LEFT JOIN (SELECT DISTINCT cust FROM orders) m ON m.cust = c.id WHERE c.tier > 2 OR m.cust IS "
                    "NOT NULL",
                    node,
                )
        for node in select.find_all(exp.Any, exp.All):
            if node.parent_select is select and isinstance(node.this, (exp.Subquery, exp.Query)):
                raise Unmaintainable(
                    "ANY/SOME/ALL (subquery)",
                    "it compares every row with a whole table",
                    "write EXISTS / NOT EXISTS with an equality to the outer row instead",
                    node,
                )
        for node in select.find_all(exp.Subquery):
            if node.parent_select is select and not isinstance(
                node.parent, (exp.From, exp.Join, exp.In, exp.Exists, exp.Any, exp.All)
            ):
                raise scalar_subquery(node)

        # What must partition by the key, besides the joins.
        required: list[tuple[str, list[exp.Expression]]] = []
        group = select.args.get("group")
        aggregates = [f for e in select.expressions for f in e.find_all(exp.Func) if is_aggregate_call(f)] + [
            f for f in (select.args.get("having") or exp.Null()).find_all(exp.Func) if is_aggregate_call(f)
        ]
        if group is not None:
            # What every grouping set groups by: a plain expression outside ROLLUP, CUBE and
            # GROUPING SETS (none when WITH ROLLUP/CUBE covers them all), and no session window,
            # whose bounds depend on the other rows. A constant (GROUP BY 'all') reads no column, so
            # it puts every row in the same group. Nothing left: one partition.
            sets = any(group.args.get(a) for a in ("grouping_sets", "cube", "rollup", "totals"))
            keyed = [g for g in group.expressions if is_row_function(g) and not _constant_grouping(g, select)]
            required.append(("GROUP BY", [] if sets else keyed))
            names = sorted({f.sql_name().lower() if not isinstance(f, exp.Anonymous) else f.name for f in aggregates})
            operators.insert(
                0,
                "GROUP BY "
                + ", ".join(g.sql(dialect=DIALECT) for g in group.expressions)
                + (f" with {', '.join(names)}" if names else ""),
            )
        elif aggregates:
            required.append(("an aggregate without GROUP BY", []))
            operators.insert(0, "aggregate over all rows")
        if select.args.get("distinct"):
            required.append(("DISTINCT", [e.unalias() for e in select.expressions]))
            operators.insert(0, "DISTINCT")
        for window in select.find_all(exp.Window):
            if window.parent_select is not select:
                continue
            partition = list(window.args.get("partition_by") or [])
            what = window.this.sql(dialect=DIALECT)
            required.append((f"{what} OVER (...)", partition))
            shown = ", ".join(p.sql(dialect=DIALECT) for p in partition)
            operators.insert(0, f"{what} OVER (PARTITION BY {shown})" if shown else f"{what} OVER (all rows)")
        if select.args.get("limit") or select.args.get("offset"):
            required.append(("LIMIT", []))
            operators.insert(0, "LIMIT over all rows")

        def member(node: exp.Expression) -> tuple[int, str] | None:
            return self._member(node, by_alias)

        # An outer join pads an input with NULLs where its key had no match: there its columns
        # are NULL, not the key, so grouping (or DISTINCT, or a window) by them puts the
        # unmatched rows of every key in one NULL group that no one key's rows compute. Only
        # an unpadded input's member partitions such an operator by the join key.
        padded = {item.id for item, is_padded in zip(items, padded_items(select), strict=False) if is_padded}

        def partitioning_member(node: exp.Expression) -> tuple[int, str] | None:
            found = member(node)
            return None if found is None or found[0] in padded else found

        for node in self._required_nodes(required):
            if (m := member(node)) is not None:
                classes.find(m)
        for item in items:  # a stateful subquery offers the keys it is partitioned by
            for name in item.child.keys if item.child is not None else ():
                classes.find((item.id, quote(name, when_needed=True)))

        def satisfies(root: tuple[int, str]) -> bool:
            if not self._spans(classes.members(root), items):
                return False
            return all(
                any((m := partitioning_member(node)) is not None and classes.find(m) == root for node in nodes)
                for _, nodes in required
            )

        valid = [root for root in {classes.find(m) for m in list(classes.parent)} if satisfies(root)]
        valid.sort(key=lambda root: self._describe(classes.members(root), items))

        level_classes = []
        seen: set[tuple[tuple[int, str], ...]] = set()
        for root in valid:
            restrictions = self._restrictions(classes.members(root), items)
            # Two classes can restrict every leaf the same way (a subquery's id and auction both
            # come from a.id = b.auction): one of them is the key, the other adds nothing.
            signature = tuple(sorted(restrictions))
            if signature not in seen:
                seen.add(signature)
                level_classes.append((self._describe(classes.members(root), items), restrictions))

        keys: dict[str, list[tuple[int, str]]] = {}
        for projection in select.expressions:  # (a padded column is NULL where the key had no match)
            m = partitioning_member(projection.unalias())
            if m and classes.find(m) in valid:
                keys[projection.alias_or_name] = self._restrictions(classes.members(classes.find(m)), items)

        for item in items:
            if item.child is not None:
                operators += item.child.operators
        conflict = None
        if not valid and (len(items) > 1 or any(nodes for _, nodes in required) or any(i.child for i in items)):
            if not _keyless_inner_joins(select, items, required):
                conflict = self._conflict(select, items, required)
            else:  # one partition: the delta rule reads the other sides whole
                operators.insert(0, "inner join without a key (delta rule over whole inputs)")
        return _Level(keys, level_classes, operators, conflict, [i.node for i in items if i.child is not None])

    @staticmethod
    def _required_nodes(required: list[tuple[str, list[exp.Expression]]]) -> Iterator[exp.Expression]:
        for _, nodes in required:
            yield from nodes

    @staticmethod
    def _conflict(select: exp.Select, items: list[_Item], required) -> Unmaintainable:
        for join in select.args.get("joins") or []:
            if join.args.get("on") is None and not join.args.get("using"):
                return Unmaintainable(
                    "a comma join (FROM a, b) or CROSS JOIN",
                    "without an equality between its inputs every row meets every row of the other side",
                    "join them ON an equality (a.key = b.key), in ON or in WHERE",
                    join,
                )
        if len(items) > 1 and not any(nodes for _, nodes in required):
            if has_semi_join(select):
                return Unmaintainable(
                    "JOIN or IN/EXISTS (subquery)" if select.args.get("joins") else "IN/EXISTS (subquery)",
                    "each subquery in WHERE joins its table with the query's, and they are not all joined on one "
                    "key (each must share an equality with the others)",
                    "apply one in a subquery in FROM, e.g. FROM (SELECT * FROM t WHERE t.a IN (SELECT ...)) t, "
                    "and the other in the query that reads it",
                    select,
                )
            unlinked = join_without_equality(select)
            if unlinked is not None:
                # (named by its alias alone: the inputs before it may be a stage the planner made)
                return Unmaintainable(
                    "JOIN",
                    f"the condition joining {unlinked.this.alias_or_name} equates no expression of it alone with "
                    "one of the inputs before it, so a row may meet rows of any key on the other side",
                    "add an equality to ON (a.key = b.key AND ...); a range looked up in constant rows "
                    "(VALUES) can be a CASE expression instead: CASE WHEN price < 10 THEN 'low' ELSE 'high' END",
                    unlinked,
                )
            return Unmaintainable(
                "JOIN",
                "its inputs are not all joined on one key (every join must share an equality with the others)",
                "join the inputs that share a key in a subquery in FROM, then join that subquery",
                select,
            )
        what = ", ".join(name for name, _ in required) or "the query"
        if len(items) > 1:
            return Unmaintainable(
                what,
                "its partitioning does not include the join key, so one change can move rows across groups",
                f"join in a subquery in FROM and apply {what} in the query that reads it",
                select,
            )
        # One input: the operators partition its rows differently, or by what is no column of it.
        owned = {item.alias for item in items}

        def partitioning(name: str, nodes: list[exp.Expression]) -> str:
            if not nodes:
                return f"{name} over all rows"
            shown = ", ".join(n.sql(dialect=DIALECT) for n in nodes)
            return f"{name} by {shown}"

        foreign = [
            n for _, nodes in required for n in nodes if any(c.table not in owned for c in n.find_all(exp.Column))
        ]
        if not foreign and len(required) <= 1:
            # (a stateful subquery in FROM partitioned by other keys: the planner makes it a stage)
            return Unmaintainable(
                what,
                "it partitions its rows by other keys than the subquery in FROM it reads",
                "compute the subquery in a view of its own and read that view",
                select,
            )
        if foreign:
            shown = ", ".join(n.sql(dialect=DIALECT) for n in foreign)
            return Unmaintainable(
                what,
                f"it partitions by {shown}, which is no column of the table or subquery in FROM",
                "compute it as a column of a subquery in FROM and partition that subquery's rows by it",
                select,
            )
        # (in the order Spark applies them: the rewrite computes the first below the rest)
        steps = sorted(required, key=lambda r: _EVALUATION_ORDER.index(_operator_kind(r[0])))
        first, rest = steps[0][0], ", ".join(name for name, _ in steps[1:])
        return Unmaintainable(
            what,
            "its operators partition the rows by different keys ("
            + "; ".join(partitioning(name, nodes) for name, nodes in steps)
            + "), so no one key does",
            f"compute {first} in a subquery in FROM and apply {rest} in the query that reads it",
            select,
        )

    @staticmethod
    def _spans(members: list[tuple[int, str]], items: list[_Item]) -> bool:
        for item in items:
            offered = [expr for item_id, expr in members if item_id == item.id]
            if not offered:
                return False
            if item.child is not None and not any(unquote(e) in item.child.keys for e in offered):
                return False
        return True

    @staticmethod
    def _restrictions(members: list[tuple[int, str]], items: list[_Item]) -> list[tuple[int, str]]:
        restrictions: list[tuple[int, str]] = []
        for item in items:
            offered = [expr for item_id, expr in members if item_id == item.id]
            if item.leaf is not None:
                restrictions.append((item.leaf, offered[0]))
            else:
                require(item.child is not None, "a window item has a child")
                column = next(unquote(e) for e in offered if unquote(e) in item.child.keys)
                restrictions += item.child.keys[column]
        return restrictions

    @staticmethod
    def _describe(members: list[tuple[int, str]], items: list[_Item]) -> str:
        alias = {item.id: item.alias for item in items}
        return " = ".join(sorted({f"{alias[i]}.{unquote(e)}" for i, e in members}))

    def _equalities(self, condition: exp.Expression | None, by_alias, classes: KeyClasses) -> list[str]:
        found = []
        for conjunct in conjuncts(condition):
            if isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
                left, right = self._member(conjunct.this, by_alias), self._member(conjunct.expression, by_alias)
                if left and right:
                    classes.union(left, right)
                    found.append(conjunct.sql(dialect=DIALECT))
        return found

    def _member(self, node: exp.Expression, by_alias) -> tuple[int, str] | None:
        """A member is an expression over one item's columns: a column, a struct field of one, or
        any expression that reads one item only, e.g. date_trunc('hour', b.ts) as a grouping or
        lower(c.email) as a join key. The item's rows are then restricted by that expression."""
        found = self._member_of(node, by_alias)
        if found is not None:
            return found
        owners = {c.table for c in node.find_all(exp.Column)}
        if len(owners) != 1 or next(iter(owners)) not in by_alias or not is_row_function(node):
            return None
        local = node.copy()
        for column in local.find_all(exp.Column):
            column.set("table", None)
        return by_alias[next(iter(owners))].id, local.sql(dialect=DIALECT)

    @staticmethod
    def _member_of(node: exp.Expression, by_alias) -> tuple[int, str] | None:
        path = column_path(node)
        if not path or len(path) < 2 or path[0] not in by_alias:
            return None
        return by_alias[path[0]].id, ".".join(quote(p, when_needed=True) for p in path[1:])

    def _where_conjunct(self, conjunct, by_alias, classes: KeyClasses, add, operators: list[str]) -> None:
        negated = isinstance(conjunct, exp.Not)
        inner = conjunct.this if negated else conjunct
        inner = inner.unnest() if isinstance(inner, exp.Paren) else inner
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            self.handled.add(id(inner))
            if negated:
                raise Unmaintainable(
                    "NOT IN (subquery)",
                    "one NULL in the subquery makes it false for every row, so no key partitions it",
                    "write NOT EXISTS (SELECT ... WHERE inner.col = outer.col) instead",
                    conjunct,
                )
            subquery = inner.args["query"]
            query = subquery.this if isinstance(subquery, exp.Subquery) else subquery
            if len(query.named_selects) != 1:
                raise Unmaintainable(
                    "IN (subquery)",
                    "the subquery must return one column",
                    "for several, write EXISTS (SELECT 1 FROM t WHERE t.x = a AND t.y = b) instead of (a, b) IN "
                    "(SELECT x, y FROM t)",
                    inner,
                )
            if not isinstance(subquery, exp.Subquery):
                subquery = exp.Subquery(this=query.copy())
                inner.set("query", subquery)
            item = self._item(subquery)
            item.alias = f"__in{item.id}"
            add(item)
            outer = self._member(inner.this, by_alias)
            if outer is not None:
                classes.union(outer, (item.id, quote(query.named_selects[0], when_needed=True)))
            operators.append(f"semi join on {inner.this.sql(dialect=DIALECT)} IN (subquery)")
            return
        if isinstance(inner, exp.Exists):
            self.handled.add(id(inner))
            query = inner.this
            if not isinstance(query, exp.Select) or query.args.get("joins") or is_stateful_outside_where(query):
                raise Unmaintainable(
                    "EXISTS (subquery)",
                    "only EXISTS over one table or view with equality conditions is maintained",
                    "move joins and grouping of the subquery into a view and test EXISTS on that view",
                    inner,
                )
            item = self._item(query.args["from_"].this)
            add(item)
            local = {**by_alias, item.alias: item}
            correlated = []
            for c in conjuncts(query.args.get("where")):
                if isinstance(c, (exp.EQ, exp.NullSafeEQ)):
                    left, right = self._member(c.this, local), self._member(c.expression, local)
                    if left and right and (left[0] == item.id) != (right[0] == item.id):
                        classes.union(left, right)
                        correlated.append(c.sql(dialect=DIALECT))
            if not correlated:
                raise Unmaintainable(
                    "EXISTS (subquery)",
                    "it is not tied to the outer row by an equality, so its answer depends on the whole table",
                    "correlate it: EXISTS (SELECT ... FROM t WHERE t.key = outer.key)",
                    inner,
                )
            operators.append(f"{'anti' if negated else 'semi'} join on {', '.join(correlated)} (EXISTS)")
            return
        if isinstance(inner, (exp.EQ, exp.NullSafeEQ)) and not negated:
            self._equalities(inner, by_alias, classes)


#: The order Spark applies a level's operators in, which a rewrite splitting them must keep.
_EVALUATION_ORDER = ("aggregate", "window", "DISTINCT", "LIMIT")


def _operator_kind(name: str) -> str:
    """The kind of a required partitioning, by the name :meth:`KeyAnalyzer._select` gives it."""
    if name.endswith("OVER (...)"):
        return "window"
    if name in ("DISTINCT", "LIMIT"):
        return name
    return "aggregate"


def is_stateful_outside_where(select: exp.Select) -> bool:
    """EXISTS subqueries may filter; anything else stateful in them is not maintained."""
    return any(select.args.get(arg) for arg in ("group", "distinct", "having", "limit", "order", "qualify")) or any(
        isinstance(n, exp.Window) for n in select.find_all(exp.Window)
    )



def _keyless_inner_joins(select: exp.Select, items: list[_Item], required: list) -> bool:
    """Inner, comma or CROSS joins, one of them linked to the inputs before it by no equality, with
    nothing else stateful at the level: no key partitions it, but the delta rule maintains any inner
    join, Δ(A ⋈ B) = ΔA ⋈ B_old + A_new ⋈ ΔB, reading the other side whole (the change times the
    other side). An outer join pads by what did not match anywhere, so it stays refused."""
    joins = select.args.get("joins") or []
    if not joins or required or any(item.child is not None for item in items) or has_semi_join(select):
        return False
    for join in joins:
        if join.side or (join.kind or "").upper() not in ("", "INNER", "CROSS") or join.args.get("using"):
            return False
    return join_without_equality(select) is not None
