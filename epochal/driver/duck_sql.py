"""A view's Spark SQL as DuckDB SQL that computes Spark's rows on the driver, or ``NotOnDriver``.

The contract: for every input, DuckDB running ``duckdb_sql(query, inputs)`` returns Spark 4's result
(ANSI mode, session time zone UTC: same rows, column order and names, equal values) or raises an
error; then the caller runs the step on Spark, which is always right. It never returns another
value. So this is a whitelist: each construct below was measured against Spark
(tests/driver/test_driver_sql.py); anything else raises NotOnDriver naming it. The DuckDB SQL is written
here, node by node, with every type explicit: sqlglot's DuckDB generator keeps DuckDB's own
coercions (and writes Spark's CAST as TRY_CAST). It assumes DuckDB's default (binary) collation;
DuckDB's TimeZone setting changes no value (only the zone an instant is labelled with in Arrow).

This module compiles the query; ``duck_types`` holds the types, comparisons and literals
(TIMESTAMP and TIMESTAMP_NTZ among them), ``duck_arith`` the arithmetic and casts.

* SELECT of columns, ``*``, ``t.*`` and aliased expressions FROM one table or subquery, INNER or
  LEFT JOIN ... ON equalities of columns, WHERE, UNION ALL. Names are Spark's: the alias, a bare
  column as written, ``*`` as the schema spells it; an unaliased expression (Spark names it after
  its text), duplicate names, GROUP BY, DISTINCT, ORDER BY, LIMIT, CTEs, windows are refused.
* Expressions: comparisons, IS [NOT] NULL, IN (literals), BETWEEN, AND/OR/NOT, CASE/IF,
  COALESCE/NVL, arithmetic, CAST. Any other function (on timestamps: hour(), date_trunc(),
  window(), to_date(), unix_timestamp(), current_timestamp() ...) and INTERVALs are refused.
* DOUBLE comparisons are refused in a WHERE: Spark pushes them to the scan's statistics, which
  leave NaN out (measured on Parquet written by Arrow, and on Spark's cache: NaN rows dropped); and
  as join keys, where Spark normalizes NaN and -0.0 (DuckDB joins them alike on small data;
  runtime filters unverified). Timestamp keys and filters compare int64 instants or wall times in
  both engines (measured on Arrow tables registered as the caller registers them, under four
  DuckDB TimeZones; DuckDB 2.0.1 keeps such filters above its Arrow scan).

DuckDB must raise on every row Spark evaluates (``duck_arith``: where each engine raises). It
reorders AND/OR operands and filters (Spark goes left to right), so an expression that can raise is
refused in WHERE and ON, under AND/OR and in BETWEEN bounds; a subquery's column computed so is
refused in a join (Spark computes it before the join), unread, or read only in a branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp

from epochal.driver.duck_arith import arith, cast_expr
from epochal.driver.duck_types import (
    ANY,
    COL,
    TS_LITERAL_VALUE,
    Col,
    Expr,
    NotOnDriver,
    boolean,
    cast,
    cmp_type,
    compare,
    compound,
    duck_type,
    known,
    literal,
    q,
    refuse_unless,
    scalar,
    shown,
    value_type,
)
from epochal.pipeline.dialect import DIALECT

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["NotOnDriver", "duckdb_sql"]

_MAX_SQL = 200_000  # checked arithmetic repeats its operands: deep nesting grows the SQL exponentially
_CLAUSES = {
    "group": "GROUP BY",
    "having": "HAVING",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "distinct": "DISTINCT",
    "with_": "WITH (CTE)",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
    "laterals": "LATERAL VIEW",
    "hint": "a hint",
    "sort": "SORT BY",
    "cluster": "CLUSTER BY",
}
_JOINS = {(None, None), (None, "INNER"), ("LEFT", None), ("LEFT", "OUTER")}
_FILTER = "in a WHERE or ON clause: DuckDB reorders and rewrites filters, skipping errors Spark raises"
_REORDER = "under AND/OR: DuckDB reorders the operands, skipping errors Spark raises"
_CMP = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.NullSafeEQ: "IS NOT DISTINCT FROM",
    exp.NullSafeNEQ: "IS DISTINCT FROM",
}


@dataclass
class _Source:  # a FROM item: its qualifier in the query, DuckDB alias, columns, SQL; which columns were read
    qualifier: str | None
    alias: str
    cols: list[Col]
    sql: str
    subquery: bool
    used: set[int] = field(default_factory=set)


class _Compiler:
    def __init__(self, inputs: Mapping[str, StructType]) -> None:
        self.inputs, self.n = inputs, 0

    def alias(self) -> str:
        self.n += 1
        return f"_s{self.n}"

    def query(self, node: exp.Expression, named: bool = True) -> tuple[str, list[Col]]:
        """``node`` as DuckDB SQL and its columns; ``named``: False for a later UNION ALL branch, whose names go."""
        if isinstance(node, exp.Select):
            return self.select(node, named)
        if type(node) is exp.Subquery and {k for k, v in node.args.items() if v} == {"this"}:
            sql, cols = self.query(node.this, named)
            return f"({sql})", cols
        refuse_unless(type(node) is exp.Union, f"{type(node).__name__.upper()} is not computed on the driver")
        extra = [k for k, v in node.args.items() if v and k not in ("this", "expression")]
        what = _CLAUSES.get(extra[0], extra[0].upper()) if extra else ""
        refuse_unless(not extra, f"UNION {what} is not computed on the driver: only UNION ALL is")
        (lsql, left), (rsql, right) = self.query(node.this, named), self.query(node.expression, False)
        refuse_unless(len(left) == len(right), "a UNION ALL of different numbers of columns")
        pairs = list(zip(left, right, strict=True))
        types = [
            a.type if a.type == b.type else value_type([Expr("", a.type), Expr("", b.type)], "UNION ALL")
            for a, b in pairs
        ]
        branches = []
        for sql, cols in ((lsql, left), (rsql, right)):
            if [c.type for c in cols] != types:  # Spark widens each column (INT with BIGINT: BIGINT)
                u = self.alias()
                items = (f"CAST({q(u)}.{q(c.name)} AS {t}) AS {q(c.name)}" for c, t in zip(cols, types, strict=True))
                sql = f"SELECT {', '.join(items)} FROM ({sql}) AS {q(u)}"
            branches.append(f"({sql})")
        cols = [
            Col(a.name, t, "", a.raises or b.raises, COL if a.const == b.const == COL else ANY, a.dbl or b.dbl)
            for (a, b), t in zip(pairs, types, strict=True)
        ]
        return " UNION ALL ".join(branches), cols

    def select(self, node: exp.Select, named: bool) -> tuple[str, list[Col]]:
        for key, value in node.args.items():
            refuse_unless(
                not value or key in ("expressions", "from_", "joins", "where"),
                f"{_CLAUSES.get(key, key.upper())} is not computed on the driver",
            )
        refuse_unless(node.args.get("from_"), "a SELECT without FROM is not computed on the driver")
        scope = [self.source(node.args["from_"].this)]
        sql = f" FROM {scope[0].sql}"
        for join in node.args.get("joins") or []:
            side, kind = join.args.get("side"), join.args.get("kind")
            others = [k for k, v in join.args.items() if v and k not in ("this", "on", "side", "kind")]
            refuse_unless(
                not others and (side, kind) in _JOINS and join.args.get("on"),
                f"{join.sql(dialect=DIALECT)[:60]}: only [INNER|LEFT] JOIN ... ON is computed here",
            )
            right = self.source(join.this)
            sql += f" {'LEFT' if side else 'INNER'} JOIN {right.sql} ON {self.join_on(join.args['on'], scope, right)}"
            scope.append(right)
        refuse_unless(
            len(scope) == 1 or not any(s.subquery and any(c.raises for c in s.cols) for s in scope),
            "a joined subquery computes a column that can raise: Spark computes it on every row before "
            "the join, DuckDB may not",
        )
        if node.args.get("where"):
            cond = self.expr(node.args["where"].this, scope, _FILTER)
            boolean(cond)
            # (measured: Spark drops NaN rows of d > 1e300, and -0.0 of d = 0.0, reading Parquet written by Arrow,
            # whose statistics leave NaN out; its cache's batch statistics drop NaN too)
            refuse_unless(
                not cond.dbl,
                "a DOUBLE comparison in a WHERE: Spark pushes it to the scan's statistics, "
                "which order NaN and -0.0 unlike its comparisons",
            )
            sql += f" WHERE {cond.sql}"
        items, cols = [], []
        for item in node.expressions:
            for name, e in self.projection(item, scope, named):
                name = name if named else f"_c{len(cols)}"
                refuse_unless(e.type != "NULL", f"column {name} is a bare NULL: Spark types it VOID")
                refuse_unless(e.lit != "dec", f"column {name} is a decimal literal: only compared on the driver")
                refuse_unless(e.lit != "ts", f"column {name} is a {shown(e.type)} literal: {TS_LITERAL_VALUE}")
                refuse_unless(all(c.name.casefold() != name.casefold() for c in cols), f"two columns named {name}")
                items.append(f"{e.sql} AS {q(name)}")
                cols.append(Col(name, e.type, "", e.raises, e.const, e.dbl))
        for s in scope:
            for i, c in enumerate(s.cols):
                refuse_unless(
                    not (s.subquery and c.raises and i not in s.used),
                    f"subquery column {c.name} can raise "
                    "and is not read: whether Spark computes it is up to its optimizer",
                )
        return f"SELECT {', '.join(items)}{sql}", cols

    def source(self, node: exp.Expression) -> _Source:
        alias, table_alias = self.alias(), node.args.get("alias")
        refuse_unless(
            not any(v for k, v in node.args.items() if k not in ("this", "alias"))
            and not (table_alias and table_alias.args.get("columns")),
            f"{node.sql(dialect=DIALECT)[:60]}: only a table or a subquery, with an alias, is read",
        )
        if isinstance(node, exp.Subquery):
            sql, cols = self.query(node.this)
            return _Source(node.alias.casefold() or None, alias, cols, f"({sql}) AS {q(alias)}", True)
        refuse_unless(isinstance(node, exp.Table), f"reading {type(node).__name__.upper()} is not on the driver")
        names = [n for n in self.inputs if n.casefold() == node.name.casefold()]
        refuse_unless(len(names) == 1, f"table {node.name}: {len(names)} inputs have that name")
        cols = []
        for f in self.inputs[names[0]].fields:
            try:
                cols.append(Col(f.name, duck_type(f.dataType)))
            except NotOnDriver as why:
                cols.append(Col(f.name, None, why=str(why)))
        for c in cols:
            if sum(c.name.casefold() == o.name.casefold() for o in cols) > 1:
                c.type, c.why = None, f"column {c.name} of {names[0]} differs from another only in case"
        return _Source((node.alias or node.name).casefold(), alias, cols, f"{q(names[0])} AS {q(alias)}", False)

    def join_on(self, node: exp.Expression, scope: list[_Source], right: _Source) -> str:
        conds, parts = [node], []
        while conds:
            cond = conds.pop(0)
            while isinstance(cond, exp.Paren):
                cond = cond.this
            if isinstance(cond, exp.And):
                conds[:0] = [cond.this, cond.expression]
                continue
            sides = [cond.this, cond.expression] if type(cond) is exp.EQ else []
            refuse_unless(
                sides and all(isinstance(s, exp.Column) and not isinstance(s.this, exp.Star) for s in sides),
                f"join condition {cond.sql(dialect=DIALECT)}: only column = column is computed here",
            )
            refuse_unless(
                {self.resolve(s, [*scope, right])[0] is right for s in sides} == {True, False},
                f"join condition {cond.sql(dialect=DIALECT)} does not compare the two sides",
            )
            a, b = (self.expr(s, [*scope, right], _FILTER) for s in sides)
            t = cmp_type(a, b)
            refuse_unless(t != "DOUBLE", f"join key {cond.sql(dialect=DIALECT)}: DOUBLE keys (NaN, -0.0) are Spark's")
            parts.append(f"{cast(a, t)} = {cast(b, t)}")
        return " AND ".join(parts)

    def resolve(self, node: exp.Column, scope: list[_Source]) -> tuple[_Source, int]:
        refuse_unless(not node.args.get("db"), f"column {node.sql(dialect=DIALECT)}: a name of more than two parts")
        qual = node.table.casefold() or None
        sources = [s for s in scope if qual is None or s.qualifier == qual]
        refuse_unless(not qual or len(sources) == 1, f"table or alias {node.table}: {len(sources)} in scope")
        found = [(s, i) for s in sources for i, c in enumerate(s.cols) if c.name.casefold() == node.name.casefold()]
        what = "ambiguous" if found else "not an input column"
        refuse_unless(len(found) == 1, f"column {node.sql(dialect=DIALECT)} is {what}")
        return found[0]

    def projection(self, item: exp.Expression, scope: list[_Source], named: bool) -> list[tuple[str, Expr]]:
        star = item if isinstance(item, exp.Star) else item.this if isinstance(item, exp.Column) else None
        if isinstance(star, exp.Star):
            qual = item.table.casefold() if isinstance(item, exp.Column) else ""
            sources = [s for s in scope if not qual or s.qualifier == qual]
            refuse_unless(
                not any(star.args.values()) and (not qual or len(sources) == 1),
                f"{item.sql(dialect=DIALECT)} is not computed on the driver",
            )
            return [(c.name, self.column(s, i)) for s in sources for i, c in enumerate(s.cols)]
        if isinstance(item, exp.Alias):
            return [(item.alias, self.expr(item.this, scope))]
        refuse_unless(
            isinstance(item, exp.Column) or not named,
            f"{item.sql(dialect=DIALECT)} has no alias: Spark names it after its text",
        )
        return [(item.name, self.expr(item, scope))]  # Spark names a column as written, not as the schema spells it

    def column(self, source: _Source, i: int, ban: str = "", lazy: bool = False) -> Expr:
        c = source.cols[i]
        refuse_unless(c.type, c.why)
        refuse_unless(
            not (c.raises and (ban or lazy)),
            f"column {c.name}, computed by an operation that can raise, read {ban or 'in a branch'}",
        )
        source.used.add(i)
        return Expr(f"{q(source.alias)}.{q(c.name)}", c.type, c.raises, c.const, dbl=c.dbl)

    def expr(self, node: exp.Expression, scope: list[_Source], ban: str = "", lazy: bool = False) -> Expr:
        """``node`` compiled; ``ban``: why it may not raise here; ``lazy``: Spark evaluates it only on some rows."""

        def sub(child: exp.Expression, ban: str = ban, lazy: bool = lazy) -> Expr:
            return self.expr(child, scope, ban, lazy)

        kind = type(node)
        if kind is exp.Paren:
            e = sub(node.this)
            return Expr(f"({e.sql})", e.type, e.raises, e.const, e.lit, e.chain, e.dbl)
        if kind is exp.Column and not isinstance(node.this, exp.Star):
            return self.column(*self.resolve(node, scope), ban, lazy)
        if kind is exp.Literal or (kind is exp.Neg and isinstance(node.this, exp.Literal)):
            return _literal(node)  # Spark reads -2147483648 as one INT literal, -(2147483648) as BIGINT
        if kind is exp.Boolean:
            return Expr("TRUE" if node.this else "FALSE", "BOOLEAN", const=(node.this,))
        if kind is exp.Null:
            return Expr("NULL", "NULL", const=(None,))
        if kind in (exp.Cast, exp.TryCast) and not node.args.get("safe"):  # sqlglot reads Spark's CAST as TryCast
            return cast_expr(node, sub(node.this))
        if kind in (exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Abs, exp.Div):
            return arith(node, [sub(c) for c in (node.this, node.args.get("expression")) if c], ban)
        if kind in _CMP:
            return compare(sub(node.this), _CMP[kind], sub(node.expression))
        if kind in (exp.And, exp.Or, exp.Not):
            args = [sub(c, ban if kind is exp.Not else ban or _REORDER) for c in (node.this, node.expression) if c]
            boolean(*args)
            sql = f"(NOT {args[0].sql})" if len(args) == 1 else f"({args[0].sql} {node.key.upper()} {args[1].sql})"
            const = ANY if COL not in [a.const for a in args] else COL
            return compound(sql, "BOOLEAN", args, const)
        if kind is exp.Is and isinstance(node.expression, exp.Null):
            e = sub(node.this)
            scalar(e)
            return compound(f"({e.sql} IS NULL)", "BOOLEAN", [e], ANY if e.const != COL else COL)
        if kind is exp.In and {k for k, v in node.args.items() if v} == {"this", "expressions"}:
            e, items = sub(node.this), [sub(i) for i in node.expressions]
            refuse_unless(all(known(i.const) for i in items), "IN with an item that is not a literal")
            t = e.type
            for i in [*items, e]:
                t = cmp_type(Expr("", t), i)
            return compound(
                f"({cast(e, t)} IN ({', '.join(cast(i, t) for i in items)}))", "BOOLEAN", [e], dbl=t == "DOUBLE"
            )
        if kind is exp.Between and not node.args.get("symmetric"):
            # Spark: value >= low AND value <= high, each compared in its own type, high only if low passed
            e, bound = sub(node.this), ban or "in a BETWEEN bound: DuckDB may compare the other bound first"
            ge, le = compare(e, ">=", sub(node.args["low"], bound)), compare(e, "<=", sub(node.args["high"], bound))
            return compound(f"({ge.sql} AND {le.sql})", "BOOLEAN", [ge, le])
        if kind in (exp.Case, exp.If):
            return self.case(node, scope, ban, lazy)
        if kind is exp.Coalesce:  # (NVL, IFNULL too) a later argument only where the ones before are NULL
            args = [sub(a, lazy=lazy or n > 0) for n, a in enumerate([node.this, *node.expressions])]
            t = value_type(args, "COALESCE")
            first = next((a.const for a in args if a.const != (None,)), (None,))  # Spark drops NULLs, stops at a value
            sql = f"COALESCE({', '.join(cast(a, t) for a in args)})"
            return compound(sql, t, args, COL if first == COL else ANY)
        raise NotOnDriver(f"{_what(node)} is not computed on the driver")

    def case(self, node: exp.Case | exp.If, scope: list[_Source], ban: str, lazy: bool) -> Expr:
        if isinstance(node, exp.If):
            branches, default, subject = [(node.this, node.args.get("true"))], node.args.get("false"), None
        else:
            branches, default = [(b.this, b.args.get("true")) for b in node.args["ifs"]], node.args.get("default")
            subject = self.expr(node.this, scope, ban, lazy) if node.this else None
        conds, values = [], []
        for n, (cond, value) in enumerate(branches):  # Spark evaluates a later WHEN, and a THEN, only on some rows
            c = self.expr(cond, scope, ban, lazy or n > 0)
            conds.append(compare(subject, "=", c) if subject else c)
            boolean(conds[-1])
            values.append(self.expr(value, scope, ban, True))
        values.append(self.expr(default, scope, ban, True) if default else Expr("NULL", "NULL", const=(None,)))
        t = value_type(values, "CASE/IF")
        whens = " ".join(f"WHEN {c.sql} THEN {cast(v, t)}" for c, v in zip(conds, values, strict=False))
        const = COL if all(v.const == COL for v in values) else ANY
        return compound(f"(CASE {whens} ELSE {cast(values[-1], t)} END)", t, [*conds, *values], const)


def _literal(node: exp.Expression) -> Expr:
    lit = node.this if isinstance(node, exp.Neg) else node
    refuse_unless(not lit.is_string or lit is node, "the negation of a string literal is not computed on the driver")
    return literal(("-" if lit is not node else "") + lit.this, lit.is_string)


def _what(node: exp.Expression) -> str:
    if isinstance(node, exp.Window | exp.Subquery | exp.Exists | exp.Select):
        return f"a {'window function' if isinstance(node, exp.Window) else 'subquery'} in an expression"
    text = node.sql(dialect=DIALECT)[:60]
    if isinstance(node, exp.Interval):
        return f"an INTERVAL ({text}: Spark adds it to dates and timestamps in the session time zone)"
    if isinstance(node, exp.Func) and not isinstance(node, exp.Binary | exp.Unary):
        kind = "aggregate function" if isinstance(node, exp.AggFunc) else "function"
        return f"{kind} {(node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()}() ({text})"
    return f"{type(node).__name__} ({text})"


def duckdb_sql(query: str, inputs: Mapping[str, StructType]) -> str:
    """``query``, Spark SQL reading the tables named in ``inputs`` (matched case-insensitively, as Spark matches temp
    views), as DuckDB SQL that reads the same names (DuckDB relations registered under exactly those names, columns
    named exactly as the Spark schema fields) and returns the same rows, in the same column order, with values equal
    to Spark's -- or raises NotOnDriver."""
    # Spark unescapes \n, \u0041 ... in string literals, sqlglot not all of them alike
    refuse_unless("\\" not in query, "a backslash (Spark's string escapes) is not read on the driver")
    try:
        statements = [s for s in sqlglot.parse(query, read=DIALECT) if s is not None]
    except sqlglot.errors.SqlglotError as error:
        raise NotOnDriver(f"the query does not parse: {error}") from error
    refuse_unless(len(statements) == 1, f"{len(statements)} statements")
    sql, _ = _Compiler(inputs).query(statements[0])
    refuse_unless(len(sql) <= _MAX_SQL, "the query's integer arithmetic is nested too deep for the driver")
    return sql
