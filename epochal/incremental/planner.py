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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sqlglot import exp

from epochal.errors import require
from epochal.pipeline.dialect import DIALECT
from epochal.pipeline.model import STAGE_SEPARATOR  # internal stages: {view}__stage{n}
from epochal.pipeline.stateless import AGGREGATE_FUNCTIONS
from epochal.pipeline.time_windows import window_call, windows_as_input_columns
from epochal.sql import quote, unquote

#: Temp views the rewritten query reads instead of its leaves (one per leaf, per run).
LEAF_PREFIX = "__epochal_leaf_"
#: How many of its least (MIN) or greatest (MAX) values a partial aggregate keeps per group when
#: the view says nothing (``WITH (min_max_cache = n)``). A group's input is reread only when a
#: change deletes all of them and inserts nothing better: with k values kept and deletes spread
#: over a group's rows, that is k deletes of the group's extremes between two refills.
DEFAULT_MIN_MAX_CACHE = 16
#: Hidden column of a partial aggregate's table holding a MIN/MAX column's kept values.
MIN_MAX_CACHE_PREFIX = "_epochal_kept_"


class Unmaintainable(Exception):
    """The planner cannot maintain this query incrementally."""

    def __init__(self, construct: str, why: str, rewrite: str = "", node: exp.Expression | None = None):
        self.construct = construct
        self.why = why
        self.rewrite = rewrite
        self.node = node
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"{self.construct} cannot be maintained incrementally: {self.why}"
        if self.rewrite:
            text += f"; {self.rewrite}"
        return text + ", or add WITH (refresh = 'full') to recompute the view every epoch (cost grows with the table)"


@dataclass(frozen=True)
class Leaf:
    """A linear relation of the query's upstream tables, restricted to the affected keys."""

    #: temp view the rewritten query reads in the leaf's place
    name: str
    #: SELECT over upstream tables that produces the leaf's rows
    sql: str
    upstreams: tuple[str, ...]
    #: one SQL expression over the leaf's output columns per key class
    key: tuple[str, ...]
    #: the upstream table, when the leaf is the whole table and every key expression is one of its
    #: columns: then the restriction is applied where the state is read (vnode pruning)
    table: str | None = None


#: The rule of a grouped aggregate whose output is its own partial state (see :class:`PartialAggregate`).
PARTIAL_RULE = "partial aggregate"


@dataclass(frozen=True)
class PartialColumn:
    """One aggregate column of a partial-aggregate table, and how an epoch's change updates it."""

    name: str
    #: 'count' and exact 'sum' add the change's weighted values; 'min' and 'max' update their kept
    #: values (:attr:`cache`); a 'sum' over floating point (decided by type at run time) adds
    #: inserts and recomputes a group from its input when a value is retracted (rounding)
    kind: str
    #: column of :attr:`PartialAggregate.rows_sql` holding the argument; '' for COUNT(*)
    argument: str = ""
    #: column of rows_sql holding the FILTER (WHERE ...) condition; '' when there is none
    condition: str = ""
    #: sum, min, max: the count column of the same argument and filter (the values the aggregate
    #: takes): a sum is NULL when it is 0, and a MIN/MAX whose kept values are all of them is exact
    nonnull: str = ""
    #: min, max: the hidden column holding the group's least (MIN) or greatest (MAX) values, best
    #: first, at most :attr:`PartialAggregate.min_max_cache` of them: always the best values of the
    #: group (a prefix of them in order), all of them when there are that few. Deletes remove from
    #: it, inserts better than its last value enter it; only when it empties while the group still
    #: has values is the group reread from its input (RisingWave's MinMax state cache).
    cache: str = ""


@dataclass(frozen=True)
class PartialAggregate:
    """A GROUP BY whose output columns are the group keys plus COUNT/SUM/MIN/MAX: it is its own
    state. An epoch adds the change, aggregated by group, to the stored rows of the groups it
    touches; the input is read only for groups whose kept MIN/MAX values all went. This is
    RisingWave's HashAgg with its intermediate state table (and its MIN/MAX cache), and DBSP's
    linear aggregate."""

    #: SELECT over the leaf: the group columns, then the arguments (_epochal_a*) and FILTER conditions (_epochal_f*)
    rows_sql: str
    #: group columns of the table, in order (its distribution key)
    groups: tuple[str, ...]
    #: the column of COUNT(*) without a filter: a group with 0 rows has no row
    rows: str
    columns: tuple[PartialColumn, ...]
    #: per expression of the leaf's key, the group column holding the same value
    key_groups: tuple[str, ...]
    #: values kept per group and MIN/MAX column (see :attr:`PartialColumn.cache`)
    min_max_cache: int = DEFAULT_MIN_MAX_CACHE

    @property
    def hidden(self) -> tuple[str, ...]:
        """Columns the table stores beyond its query's: the kept MIN/MAX values."""
        return tuple(c.cache for c in self.columns if c.cache)


@dataclass(frozen=True)
class Plan:
    """How one view (or internal stage) is maintained."""

    #: 'linear' (the query over the delta) or 'keyed' (recompute at the affected keys)
    kind: str
    #: keyed: the view's query with each leaf replaced by its temp view
    query: str = ""
    leaves: tuple[Leaf, ...] = ()
    #: keyed: what each key class is, for people ("a.id = b.auction")
    key_classes: tuple[str, ...] = ()
    #: operators, outermost first, each with the state it reads
    operators: tuple[str, ...] = ()
    #: keyed: 'recompute' (the query at the affected keys, before and after) or 'delta join'
    #: (inner joins only: each input's change joined with the others' state) or PARTIAL_RULE
    rule: str = "recompute"
    #: PARTIAL_RULE: what the table keeps per group and how a change updates it
    aggregate: PartialAggregate | None = None
    #: linear: the rewritten query may type a column differently from the query as written (AVG
    #: as SUM / COUNT over a partial aggregate): its output is cast to the written query's types
    typed_like_query: bool = False

    def describe(self) -> str:
        if self.kind == "linear":
            lines = ["linear: the change is the query applied to the inputs' change; no state"]
            if self.query:  # rewritten to read the stages that keep the state
                lines += [f"- {op}" for op in self.operators] + [f"- runs: {self.query}"]
            return "\n".join(lines)
        lines = []
        if self.key_classes:
            lines.append("keyed by " + ", ".join(f"({k})" for k in self.key_classes))
            if self.rule == "delta join":
                lines.append("delta rule: each input's change joined with the other inputs' state at its keys")
            if self.aggregate is not None:
                aggregate = self.aggregate
                lines.append(
                    "partial aggregate: the table keeps per group "
                    + ", ".join(f"{c.name} ({c.kind})" for c in aggregate.columns)
                    + "; a change is added to the groups it touches"
                )
                if aggregate.hidden:
                    lines.append(
                        f"- MIN/MAX: the {aggregate.min_max_cache} least/greatest values per group are kept"
                        f" ({', '.join(aggregate.hidden)}); a group is reread from its input only when a"
                        " change deletes all of them"
                    )
                if any(c.kind == "sum" for c in aggregate.columns):
                    lines.append("- a SUM over floating point that loses a value is recomputed from its input")
        else:
            lines.append("one partition: the whole input is recomputed when it changes")
        lines += [f"- {op}" for op in self.operators]
        lines += [
            f"- state read: {leaf.table or 'subquery over ' + ', '.join(leaf.upstreams)}"
            + (f" at {', '.join(leaf.key)} in the affected keys" if leaf.key else " (all of it)")
            for leaf in self.leaves
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class Stage:
    """An internal view the planner split off a view, planned like any view."""

    name: str
    query: str
    columns: tuple[str, ...]
    upstreams: tuple[str, ...]


@dataclass(frozen=True)
class PlannedView:
    plan: Plan
    #: internal stages this view reads, upstream-most first; each is planned separately
    stages: tuple[Stage, ...] = ()


# ---------------------------------------------------------------------------------------- helpers


def is_stateful(node: exp.Expression) -> bool:
    """True when ``node`` (a query) has an operator that needs state, anywhere inside."""
    for sub in node.walk():
        if isinstance(sub, (exp.Join, exp.Group, exp.Distinct, exp.Window, exp.Exists, exp.Intersect, exp.Except)):
            return True
        if isinstance(sub, exp.Union) and sub.args.get("distinct"):
            return True
        if isinstance(sub, exp.In) and sub.args.get("query") is not None:
            return True
        if isinstance(sub, (exp.Any, exp.All)) and isinstance(sub.this, (exp.Subquery, exp.Query)):
            return True
        if isinstance(sub, exp.Subquery) and not isinstance(sub.parent, (exp.From, exp.Join, exp.SetOperation)):
            return True  # a subquery in an expression reads its table whole, not the epoch's change
        if isinstance(sub, (exp.Limit, exp.Offset, exp.Fetch, exp.Having)):
            return True
        if isinstance(sub, exp.Func) and _is_aggregate(sub):
            return True
    return False


def _is_aggregate(node: exp.Func) -> bool:
    if isinstance(node.parent, exp.Window) and node.parent.this is node:
        return False  # a window aggregate: reported as the window
    name = node.name.lower() if isinstance(node, exp.Anonymous) else node.sql_name().lower()
    return isinstance(node, exp.AggFunc) or name in AGGREGATE_FUNCTIONS


#: Functions that turn one row into several (explode, posexplode, inline, stack...), so no value
#: of them belongs to a row alone.
_GENERATORS = (exp.UDTF, exp.Stack)
#: Several groupings in one GROUP BY: no value of one row.
_GROUPING_SETS = (exp.Rollup, exp.Cube, exp.GroupingSets)


def _row_function(node: exp.Expression) -> bool:
    """True when ``node`` is a value of one row alone, which a key can be: no subquery, aggregate,
    window function or generator, and no time window (a hopping window puts a row in several,
    a session window's bounds depend on the other rows; Spark refuses both in a join condition,
    which is where a key restricts an input)."""
    for sub in node.walk():
        if isinstance(sub, (exp.Subquery, exp.Query, exp.Window, *_GENERATORS, *_GROUPING_SETS)) or window_call(sub):
            return False
        if isinstance(sub, exp.Func) and _is_aggregate(sub):
            return False
    return True


def _conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    if isinstance(node, exp.Where):
        node = node.this
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _column_path(node: exp.Expression) -> list[str] | None:
    """``a.w.start`` -> ['a', 'w', 'start'] for a (qualified) column or a struct field of one."""
    if isinstance(node, exp.Column):
        return [p.name for p in node.parts]
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        base = _column_path(node.this)
        return None if base is None else [*base, node.expression.name]
    return None


class _Classes:
    """Union-find over members: (item id, expression over the item's columns)."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, str], tuple[int, str]] = {}

    def find(self, member: tuple[int, str]) -> tuple[int, str]:
        self.parent.setdefault(member, member)
        while self.parent[member] != member:
            self.parent[member] = self.parent[self.parent[member]]
            member = self.parent[member]
        return member

    def union(self, a: tuple[int, str], b: tuple[int, str]) -> None:
        self.parent[self.find(a)] = self.find(b)

    def members(self, root: tuple[int, str]) -> list[tuple[int, str]]:
        return [m for m in list(self.parent) if self.find(m) == root]


# ---------------------------------------------------------------------------------------- analysis


@dataclass
class _Item:
    """One input of a query level: a leaf (table or linear subquery) or a stateful subquery."""

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
    #: when the level cannot be partitioned: why, and the subquery items a split could materialize
    conflict: Unmaintainable | None = None
    splittable: list[exp.Subquery] = field(default_factory=list)


@dataclass
class _LeafSpec:
    node: exp.Expression
    sql: str
    upstreams: tuple[str, ...]
    table: str | None


class _Analyzer:
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
            if not is_stateful(query):
                tables = tuple(dict.fromkeys(t.name.lower() for t in query.find_all(exp.Table)))
                self.leaves.append(_LeafSpec(node, query.sql(dialect=DIALECT), tables, None))
                return _Item(self._next_id(), alias, node, leaf=len(self.leaves) - 1)
            return _Item(self._next_id(), alias, node, child=self.level(query))
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
        for branch in (query.left, query.right):
            branch = branch.unnest() if isinstance(branch, exp.Paren) else branch
            if is_stateful(branch):
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
            conflict = Unmaintainable(kind, "its branches share no column they are partitioned by", node=query)
        return _Level(keys, [(n, r) for n, r in keys.items()], operators, conflict)

    def _select(self, select: exp.Select) -> _Level:
        items: list[_Item] = []
        by_alias: dict[str, _Item] = {}
        operators: list[str] = []
        classes = _Classes()

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

        for conjunct in _conjuncts(select.args.get("where")):
            self._where_conjunct(conjunct, by_alias, classes, add, operators)
        for node in select.find_all(exp.In, exp.Exists):
            if isinstance(node, exp.In) and node.args.get("query") is None:
                continue  # x IN (1, 2, 3): a comparison with a list, as linear as x = 1 OR ...
            if node.parent_select is select and id(node) not in self.handled:
                raise Unmaintainable(
                    "IN/EXISTS (subquery)",
                    "is only maintained as a condition of WHERE joined by AND",
                    "move it to the top level of WHERE, or turn it into a JOIN",
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
                raise Unmaintainable(
                    "a subquery inside an expression",
                    "a scalar subquery reads a whole table for every row",
                    "join with the subquery in FROM instead",
                    node,
                )

        # What must partition by the key, besides the joins.
        required: list[tuple[str, list[exp.Expression]]] = []
        group = select.args.get("group")
        aggregates = [f for e in select.expressions for f in e.find_all(exp.Func) if _is_aggregate(f)] + [
            f for f in (select.args.get("having") or exp.Null()).find_all(exp.Func) if _is_aggregate(f)
        ]
        if group is not None:
            # What every grouping set groups by: a plain expression outside ROLLUP, CUBE and
            # GROUPING SETS (none when WITH ROLLUP/CUBE covers them all), and no session window,
            # whose bounds depend on the other rows. Nothing left: one partition.
            sets = any(group.args.get(a) for a in ("grouping_sets", "cube", "rollup", "totals"))
            required.append(("GROUP BY", [] if sets else [g for g in group.expressions if _row_function(g)]))
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

        # A member is an expression over one item's columns: a column, a struct field of one, or
        # (for grouping) any expression that reads one item only, e.g. date_trunc('hour', b.ts).
        def member(node: exp.Expression) -> tuple[int, str] | None:
            found = self._member_of(node, by_alias)
            if found is not None:
                return found
            owners = {c.table for c in node.find_all(exp.Column)}
            if len(owners) != 1 or next(iter(owners)) not in by_alias or not _row_function(node):
                return None
            local = node.copy()
            for column in local.find_all(exp.Column):
                column.set("table", None)
            return by_alias[next(iter(owners))].id, local.sql(dialect=DIALECT)

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
                any((m := member(node)) is not None and classes.find(m) == root for node in nodes)
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
        for projection in select.expressions:
            m = member(projection.unalias())
            if m and classes.find(m) in valid:
                keys[projection.alias_or_name] = self._restrictions(classes.members(classes.find(m)), items)

        for item in items:
            if item.child is not None:
                operators += item.child.operators
        conflict = None
        if not valid and (len(items) > 1 or any(nodes for _, nodes in required) or any(i.child for i in items)):
            conflict = self._conflict(select, items, required)
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
            return Unmaintainable(
                "JOIN",
                "its inputs are not all joined on one key (every join must share an equality with the others)",
                "join the inputs that share a key in a subquery in FROM, then join that subquery",
                select,
            )
        what = ", ".join(name for name, _ in required) or "the query"
        return Unmaintainable(
            what,
            "its partitioning does not include the join key, so one change can move rows across groups",
            "",
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

    def _equalities(self, condition: exp.Expression | None, by_alias, classes: _Classes) -> list[str]:
        found = []
        for conjunct in _conjuncts(condition):
            if isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
                left, right = self._member_of(conjunct.this, by_alias), self._member_of(conjunct.expression, by_alias)
                if left and right:
                    classes.union(left, right)
                    found.append(conjunct.sql(dialect=DIALECT))
        return found

    @staticmethod
    def _member_of(node: exp.Expression, by_alias) -> tuple[int, str] | None:
        path = _column_path(node)
        if not path or len(path) < 2 or path[0] not in by_alias:
            return None
        return by_alias[path[0]].id, ".".join(quote(p, when_needed=True) for p in path[1:])

    def _where_conjunct(self, conjunct, by_alias, classes: _Classes, add, operators: list[str]) -> None:
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
                raise Unmaintainable("IN (subquery)", "the subquery must return one column", node=inner)
            if not isinstance(subquery, exp.Subquery):
                subquery = exp.Subquery(this=query.copy())
                inner.set("query", subquery)
            item = self._item(subquery)
            item.alias = f"__in{item.id}"
            add(item)
            outer = self._member_of(inner.this, by_alias)
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
            for c in _conjuncts(query.args.get("where")):
                if isinstance(c, (exp.EQ, exp.NullSafeEQ)):
                    left, right = self._member_of(c.this, local), self._member_of(c.expression, local)
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


def is_stateful_outside_where(select: exp.Select) -> bool:
    """EXISTS subqueries may filter; anything else stateful in them is not maintained."""
    return any(select.args.get(arg) for arg in ("group", "distinct", "having", "limit", "order", "qualify")) or any(
        isinstance(n, exp.Window) for n in select.find_all(exp.Window)
    )


# ---------------------------------------------------------------------------------------- planning


def plan_query(
    view: str,
    tree: exp.Expression,
    schema: Mapping[str, Sequence[str]],
    internal: bool = False,
    min_max_cache: int = DEFAULT_MIN_MAX_CACHE,
) -> PlannedView:
    """Plan ``tree``, a *qualified* query (see :func:`epochal.pipeline.query.qualify_query`).

    ``internal``: ``view`` is a stage the planner split off, whose table may hold hidden columns
    (the kept values of its MIN/MAX, ``min_max_cache`` per group). A view people read never does:
    a grouped MIN/MAX keeps its state in a stage, and the view projects it.

    Raises :class:`Unmaintainable` with the construct and a suggested rewrite when no plan exists."""
    tree = tree.copy()
    if not is_stateful(tree):
        # query "": the view's own text is run, as written
        return PlannedView(Plan("linear", operators=("filter, project, UNION ALL",)))
    stages: list[Stage] = []
    schema = dict(schema)
    while True:
        # A grouped time window becomes a column of the input it reads, which a key can restrict
        # (again after a split: a window over two joined inputs reads one stage then)
        tree = windows_as_input_columns(tree, schema)
        analyzer = _Analyzer()
        level = analyzer.level(tree)
        if level.conflict is None:
            break
        if not level.splittable:
            if isinstance(tree, exp.Select) and _split_joins(view, tree, schema, stages):
                continue
            raise level.conflict
        # Materialize the stateful subqueries of the root as stages: each is then a table with a
        # key of its own, and the root is planned again over them.
        for subquery in level.splittable:
            name = f"{view}{STAGE_SEPARATOR}{len(stages) + 1}"
            query = subquery.this
            columns = tuple(query.named_selects)
            upstreams = tuple(dict.fromkeys(t.name.lower() for t in query.find_all(exp.Table)))
            stages.append(Stage(name, query.sql(dialect=DIALECT), columns, upstreams))
            schema[name] = columns
            subquery.replace(
                exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=subquery.args["alias"].this))
            )
    if not is_stateful(tree):  # what needed state went into the stages
        plan = Plan("linear", query=tree.sql(dialect=DIALECT), operators=("filter, project, UNION ALL",))
        return PlannedView(plan, tuple(stages))
    split = _split_partial(tree, f"{view}{STAGE_SEPARATOR}{len(stages) + 1}", internal)
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
        elif isinstance(node, (exp.Subquery, exp.Table)):
            node.replace(replacement)
        else:  # a set-operation branch: a SELECT over the leaf keeps the branch's columns
            node.replace(exp.select("*").from_(replacement))
    plan = Plan(
        "keyed",
        rule="delta join" if _inner_joins_only(tree) and level.classes else "recompute",
        query=tree.sql(dialect=DIALECT),
        leaves=tuple(leaves),
        key_classes=tuple(name for name, _ in level.classes),
        operators=tuple(level.operators),
    )
    aggregate = _partial_aggregate(tree, leaves, min_max_cache if internal else 0)
    if aggregate is not None:
        plan = replace(plan, rule=PARTIAL_RULE, aggregate=aggregate)
    return PlannedView(plan, tuple(stages))


def _inner_joins_only(tree: exp.Expression) -> bool:
    """A select-project-join query of inner joins over leaves: its change follows the delta rule."""
    if not isinstance(tree, exp.Select) or not tree.args.get("joins"):
        return False
    if any(tree.args.get(a) for a in ("group", "having", "distinct", "limit", "offset", "qualify")):
        return False
    for join in tree.args["joins"]:
        if join.side or (join.kind or "INNER").upper() != "INNER" or join.args.get("on") is None:
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
    key of its own. Columns keep their meaning across the cut: ``b.x`` becomes ``stage.b__x``."""
    joins = list(select.args.get("joins") or [])
    if not joins:
        return False
    items = [select.args["from_"].this, *(j.this for j in joins)]
    for size in range(len(items), 1, -1):
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
        if _Analyzer().level(stage_select).conflict is not None:
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


# ---------------------------------------------------------------------------------------- partial aggregates

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
        or (isinstance(sub, exp.Func) and _is_aggregate(sub) and not isinstance(sub.parent, exp.Filter))
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
    elif not all(_row_function(g) for g in group.expressions):
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
    path = _column_path(node)
    if path and len(path) >= 2:
        return ".".join(quote(p, when_needed=True) for p in path[1:])
    local = node.copy()
    for column in local.find_all(exp.Column):
        column.set("table", None)
    return local.sql(dialect=DIALECT)


def _partial_aggregate(tree: exp.Expression, leaves: Sequence[Leaf], min_max_cache: int) -> PartialAggregate | None:
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


def _split_partial(select: exp.Expression, name: str, internal: bool) -> tuple[Stage, exp.Select] | None:
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
