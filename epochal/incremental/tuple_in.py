"""``(a, b) IN (SELECT x, y FROM t ...)`` as the ``EXISTS`` it equals, for the planner.

A top-level condition of WHERE keeps a row when the test is true and drops it when it is false or
NULL, so there a tuple IN is ``EXISTS (SELECT 1 FROM t WHERE ... AND t.x = a AND t.y = b)``: both
are true exactly when some row equals the tuple on every column. (Negated, or under OR, NULL and
false differ, and the refusal stays.) The EXISTS is then a semi join like any other."""

from __future__ import annotations

from sqlglot import exp

from epochal.incremental.query_shapes import conjuncts


def tuple_in_as_exists(tree: exp.Expression) -> exp.Expression:
    """``tree`` (qualified; changed in place) with each top-level WHERE conjunct ``(a, b) IN
    (SELECT x, y ...)`` written as ``EXISTS (SELECT 1 ... WHERE ... AND x = a AND y = b)``."""
    for select in list(tree.find_all(exp.Select)):
        where = select.args.get("where")
        if where is None:
            continue
        for conjunct in list(conjuncts(where.this)):
            node = conjunct.unnest() if isinstance(conjunct, exp.Paren) else conjunct
            if not isinstance(node, exp.In) or not isinstance(node.this, exp.Tuple):
                continue
            subquery = node.args.get("query")
            query = subquery.this if isinstance(subquery, exp.Subquery) else subquery
            if not isinstance(query, exp.Select) or len(query.expressions) != len(node.this.expressions):
                continue
            if any(query.args.get(a) for a in ("group", "having", "limit", "offset", "qualify", "with")):
                continue
            if any(p.find(exp.AggFunc, exp.Window, exp.Star) for p in query.expressions):
                continue
            equalities = [
                exp.EQ(this=p.unalias().copy(), expression=outer.copy())
                for p, outer in zip(query.expressions, node.this.expressions, strict=True)
            ]
            inner = query.copy()
            inner.set("distinct", None)
            inner.set("expressions", [exp.Literal.number(1)])
            own = inner.args.get("where")
            inner.set("where", exp.Where(this=exp.and_(*([own.this] if own is not None else []), *equalities)))
            conjunct.replace(exp.Exists(this=inner))
    return tree
