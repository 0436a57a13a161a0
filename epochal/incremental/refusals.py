"""Refusals of the key analysis whose rewrite depends on the query's shape: which subquery or join
is the one no key partitions, and the rewrite that loads for it (a scalar subquery correlated or
not, a join whose condition equates nothing). Plain sqlglot; :mod:`epochal.incremental.key_analysis`
raises them."""

from __future__ import annotations

from sqlglot import exp

from epochal.incremental.plan import Unmaintainable
from epochal.incremental.query_shapes import conjuncts


def _correlated(subquery: exp.Subquery) -> bool:
    """Whether ``subquery`` (of a qualified query) reads a column of the query around it."""
    own = {t.alias_or_name for t in subquery.find_all(exp.Table)}
    own |= {s.alias for s in subquery.find_all(exp.Subquery) if s.alias}
    own |= {c.alias for c in subquery.find_all(exp.CTE)}
    return any(c.table and c.table not in own for c in subquery.find_all(exp.Column))


def scalar_subquery(node: exp.Subquery) -> Unmaintainable:
    if _correlated(node):
        return Unmaintainable(
            "a subquery inside an expression",
            "a correlated scalar subquery reads a table again for every row",
            "join with it in FROM, grouped by the columns it matches the outer row on: LEFT JOIN "
            "(SELECT k, max(x) AS m FROM t GROUP BY k) AS s ON s.k = outer.k",
            node,
        )
    return Unmaintainable(
        "a subquery inside an expression",
        "its one value is read by every row, so a change to it changes every row and no key partitions the view",
        "where a column is compared with it by equality (x = (SELECT max(x) FROM t)), join with it in FROM "
        "on that equality instead: JOIN (SELECT max(x) AS m FROM t) AS s ON x = s.m",
        node,
    )


def join_without_equality(select: exp.Select) -> exp.Join | None:
    """The first join of ``select`` that no equality, in its ON or in WHERE, links to an input
    before it (``ON o.price < b.hi``): no key can partition it, whatever the other joins do."""
    where = list(conjuncts(select.args.get("where")))
    before = {select.args["from_"].this.alias_or_name}
    for join in select.args.get("joins") or []:
        if join.args.get("using"):
            before.add(join.this.alias_or_name)
            continue
        alias = join.this.alias_or_name
        linked = False
        for conjunct in [*conjuncts(join.args.get("on")), *where]:
            if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
                continue
            sides = [{c.table for c in side.find_all(exp.Column)} for side in (conjunct.this, conjunct.expression)]
            if any(s == {alias} for s in sides) and any(s and s <= before for s in sides):
                linked = True
                break
        if not linked:
            return join
        before.add(alias)
    return None
