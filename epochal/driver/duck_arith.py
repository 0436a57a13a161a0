"""Arithmetic and casts for ``duck_sql``: Spark's ANSI results, errors and constant folds in DuckDB.
Each rule was measured against Spark 4 (tests/driver/test_driver_sql.py); anything else raises NotOnDriver.

* Arithmetic + - * unary minus and abs() on integers and DOUBLE; ``/`` gives DOUBLE. Decimal
  arithmetic is refused (precision rules differ), and so is any on dates and timestamps (Spark adds
  intervals, subtracts to intervals, in the session time zone).
* CAST only widening integers, integer to DOUBLE, or to the same type (DuckDB rounds DOUBLE to INT
  where Spark truncates; string parsing differs; sqlglot reads VARCHAR(n) as STRING); nothing to or
  from TIMESTAMP or TIMESTAMP_NTZ (Spark reads and writes them in the session time zone, and its
  string forms differ). Typed literals (``10L``, ``1.5D``, ``DATE '...'``, ``TIMESTAMP '...'``) are
  read here as Spark reads them (``duck_types``).

Errors are where the engines part. Spark raises on integer overflow and on x / 0 (x not NULL, -0.0
too); DuckDB gives NULL (integers) or inf (doubles) for x / 0, and its optimizer drops overflow
checks (``x + 1 > 5`` becomes ``x > 4``). So integer results are computed in HUGEINT, where nothing
overflows, and a value out of the type's range calls ``error()``, a volatile call no rewrite
removes; a zero divisor likewise. Spark folds constants at planning and raises even on no rows
(``(x + 2147483647) + 1`` too: it regroups + and * chains), so such folds are computed here and
refused when they raise or cannot be computed.
"""

from __future__ import annotations

import operator
import re

from sqlglot import exp

from epochal.driver.duck_types import (
    COL,
    INTS,
    NUMERIC,
    RANGE,
    TIMESTAMP_LITERALS,
    Expr,
    cast,
    compound,
    date_literal,
    known,
    refuse_unless,
    shown,
    timestamp_literal,
)
from epochal.pipeline.dialect import DIALECT

CONST = "Spark folds it at planning and raises even on no rows"
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "neg": operator.neg, "abs": abs}
_ARITH = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Neg: "neg", exp.Abs: "abs", exp.Div: "/"}
_CASTS = {
    "TINYINT": "TINYINT",
    "SMALLINT": "SMALLINT",
    "INT": "INTEGER",
    "BIGINT": "BIGINT",
    "DOUBLE": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
    "DATE": "DATE",
}


def _int_op(op: str, values: list[int], t: str) -> int:
    result = _OPS[op](*values)
    refuse_unless(RANGE[t][0] <= result <= RANGE[t][1], f"integer overflow in a constant ({op} {values}): {CONST}")
    return result


def _fold_chain(op: str, consts: list[object], t: str) -> None:
    """Spark regroups the constants of an integer + or * chain and folds them at planning: they must not overflow."""
    foldable = [c for c in consts if c != COL]
    if len(foldable) > 1:
        refuse_unless(all(map(known, foldable)), f"integer {op} of constants whose value is not known: {CONST}")
        acc = foldable[0][0]
        for (value,) in foldable[1:]:
            acc = None if acc is None or value is None else _int_op(op, [acc, value], t)


def _checked(h: str, t: str) -> str:
    """``h`` (HUGEINT, which cannot overflow here) as ``t``, or an error where Spark overflows."""
    lo, hi = RANGE[t]
    return f"(CASE WHEN {h} NOT BETWEEN {lo} AND {hi} THEN error('integer overflow') ELSE CAST({h} AS {t}) END)"


def cast_expr(cast_node: exp.Cast, e: Expr) -> Expr:
    """``CAST(e AS ...)``, or a typed literal (sqlglot reads ``DATE '...'`` as a Cast, Spark's CAST as a TryCast)."""
    params, name = [p.this.name for p in cast_node.to.expressions], cast_node.to.this.name
    literal = type(cast_node) is exp.Cast and e.type == "VARCHAR" and known(e.const) and not params
    if literal and name in TIMESTAMP_LITERALS:
        return timestamp_literal(e.const[0], TIMESTAMP_LITERALS[name])
    if name == "DECIMAL" and len(params) == 2 and all(p.isdigit() for p in params):
        t = f"DECIMAL({params[0]},{params[1]})"
    else:
        what = " (timestamp(), to_timestamp())" if name == "TIMESTAMP" else ""
        refuse_unless(
            name in _CASTS and not params, f"CAST to {cast_node.to.sql(dialect=DIALECT)}{what}: not on the driver"
        )
        t = _CASTS[name]
    if literal and t == "DATE":
        return date_literal(e.const[0])  # DATE 'yyyy-mm-dd'
    lit = cast_node.this.this if isinstance(cast_node.this, exp.Neg) else cast_node.this
    if isinstance(lit, exp.Literal) and not lit.is_string:  # 10L, 10Y, 1.5D: typed literals
        text = ("-" if lit is not cast_node.this else "") + lit.this
        if t == "DOUBLE" and len(text.lstrip("-").replace(".", "")) <= 15 and re.fullmatch(r"-?\d*\.?\d*", text):
            value = float(text)  # (Spark's 1.5D parses, CAST(1.5 AS DOUBLE) divides: both exact to 15 digits)
            return Expr(f"CAST('{value!r}' AS DOUBLE)", "DOUBLE", const=(value,), lit="dbl")
        if t in INTS and re.fullmatch(r"-?\d+", text) and RANGE[t][0] <= int(text) <= RANGE[t][1]:
            return Expr(f"CAST({int(text)} AS {t})", t, const=(int(text),))
    widening = e.type in INTS and (t == "DOUBLE" or (t in INTS and INTS.index(t) >= INTS.index(e.type)))
    refuse_unless(
        e.type in (t, "NULL") or widening,
        f"CAST({shown(e.type)} AS {t}) is not computed on the driver: only widening numeric casts are",
    )
    const = (float(e.const[0]),) if t == "DOUBLE" and known(e.const) and e.const[0] is not None else e.const
    return compound(f"CAST({e.sql} AS {t})", t, [e], const)


def arith(op_node: exp.Expression, args: list[Expr], ban: str) -> Expr:
    """``op_node`` (+ - * / unary minus, abs) over ``args`` compiled; ``ban``: why it may not raise here."""
    op = _ARITH[type(op_node)]
    types = {a.type for a in args} - {"NULL"}
    for a in args:
        refuse_unless(
            a.type in (*NUMERIC, "NULL") and a.lit != "dec",
            f"arithmetic ({op}) on {shown(a.type)} is not computed on the driver",
        )
        refuse_unless(a.lit != "dbl" or types == {"DOUBLE"}, f"a DOUBLE literal in arithmetic ({op}) with {types}")
    refuse_unless(types, f"arithmetic ({op}) on NULL literals only")
    consts, raises = [a.const for a in args], any(a.raises for a in args)
    if (None,) in consts:
        const = (None,)  # Spark folds NULL + x to NULL
    elif all(map(known, consts)):
        const = None  # computed below
    else:
        refuse_unless(COL in consts, f"arithmetic ({op}) on a constant expression: {CONST}")
        const = COL
    if op == "/":
        n, d = (cast(a, "DOUBLE") for a in args)
        refuse_unless(consts[1] != (0,) or consts[0] == COL or const == (None,), f"a constant divided by zero: {CONST}")
        const = (float(consts[0][0]) / float(consts[1][0]),) if const is None else const
        sql = (
            f"(CASE WHEN {d} = CAST(0 AS DOUBLE) THEN (CASE WHEN {n} IS NULL THEN NULL "
            f"ELSE error('division by zero') END) ELSE {n} / {d} END)"
        )
        t, raises, chain = "DOUBLE", raises or not known(const), ()
    elif "DOUBLE" in types:  # IEEE in both: no errors
        t, a, chain = "DOUBLE", [cast(x, "DOUBLE") for x in args], ()
        sql = {"neg": f"(- {a[0]})", "abs": f"abs({a[0]})"}.get(op) or f"({a[0]} {op} {a[-1]})"
        const = (_OPS[op](*(float(c[0]) for c in consts)),) if const is None else const
    else:
        t, h = max(types, key=INTS.index), [f"CAST({x.sql} AS HUGEINT)" for x in args]
        const = (_int_op(op, [c[0] for c in consts], t),) if const is None else const
        sql = _checked({"neg": f"(- {h[0]})", "abs": f"abs({h[0]})"}.get(op) or f"({h[0]} {op} {h[-1]})", t)
        raises = raises or not known(const)
        chain = [c for a in args for c in (a.chain[2] if a.chain[:2] == (op, t) else [a.const])]
        if op in ("+", "*"):
            _fold_chain(op, chain, t)
        chain = (op, t, chain) if op in ("+", "*") else ()
    refuse_unless(not (raises and ban), f"{'division' if op == '/' else 'integer ' + op} {ban}")
    return Expr(sql, t, raises, const, chain=chain, dbl=any(a.dbl for a in args))
