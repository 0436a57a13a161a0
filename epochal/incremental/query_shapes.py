"""What a query is made of, as the planner asks it: stateful operators, aggregate and row
functions, the conjuncts of a condition, column paths, and equivalence classes of columns."""

from __future__ import annotations

from sqlglot import exp

from epochal.pipeline.stateless import AGGREGATE_FUNCTIONS, is_window_call
from epochal.pipeline.time_windows import window_call


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
        if isinstance(sub, exp.Func) and is_aggregate_call(sub):
            return True
    return False


def is_aggregate_call(node: exp.Func) -> bool:
    if is_window_call(node):
        return False  # a window aggregate: reported as the window
    name = node.name.lower() if isinstance(node, exp.Anonymous) else node.sql_name().lower()
    return isinstance(node, exp.AggFunc) or name in AGGREGATE_FUNCTIONS


#: Functions that turn one row into several (explode, posexplode, inline, stack...), so no value
#: of them belongs to a row alone.
_GENERATORS = (exp.UDTF, exp.Stack)
#: Several groupings in one GROUP BY: no value of one row.
_GROUPING_SETS = (exp.Rollup, exp.Cube, exp.GroupingSets)


def is_row_function(node: exp.Expression) -> bool:
    """True when ``node`` is a value of one row alone, which a key can be: no subquery, aggregate,
    window function or generator, and no time window (a hopping window puts a row in several,
    a session window's bounds depend on the other rows; Spark refuses both in a join condition,
    which is where a key restricts an input)."""
    for sub in node.walk():
        if isinstance(sub, (exp.Subquery, exp.Query, exp.Window, *_GENERATORS, *_GROUPING_SETS)) or window_call(sub):
            return False
        if isinstance(sub, exp.Func) and is_aggregate_call(sub):
            return False
    return True


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    if isinstance(node, exp.Where):
        node = node.this
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def column_path(node: exp.Expression) -> list[str] | None:
    """``a.w.start`` -> ['a', 'w', 'start'] for a (qualified) column or a struct field of one."""
    if isinstance(node, exp.Column):
        return [p.name for p in node.parts]
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        base = column_path(node.this)
        return None if base is None else [*base, node.expression.name]
    return None


class KeyClasses:
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


def padded_items(select: exp.Select) -> list[bool]:
    """Per FROM item, whether an outer join pads it with NULLs (then it has rows it did not read)."""
    joins = select.args.get("joins") or []
    padded = [False] * (len(joins) + 1)
    for index, join in enumerate(joins, start=1):
        side = (join.side or "").upper()
        if side in ("LEFT", "FULL"):
            padded[index] = True
        if side in ("RIGHT", "FULL"):
            padded[:index] = [True] * index
    return padded


def has_semi_join(select: exp.Select) -> bool:
    """Whether ``select``'s own WHERE holds IN/EXISTS (subquery): a semi (or anti) join with the
    subquery's table."""
    where = select.args.get("where")
    return where is not None and any(
        node.parent_select is select and (isinstance(node, exp.Exists) or node.args.get("query"))
        for node in where.find_all(exp.In, exp.Exists)
    )
