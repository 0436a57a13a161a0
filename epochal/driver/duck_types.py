"""Spark's types and values as DuckDB holds them, for ``duck_sql``: which types a query may read,
how Spark compares and widens them, and the literals whose value is read here as Spark reads it.
Every rule was measured against Spark 4 (ANSI, session time zone UTC; tests/driver/test_driver_sql.py);
anything else raises NotOnDriver naming it. Types are named as DuckDB names them ("TIMESTAMPTZ" is
Spark's TIMESTAMP, "TIMESTAMP" Spark's TIMESTAMP_NTZ); messages name timestamps as Spark does.

* Types: BOOLEAN, TINYINT..BIGINT, DOUBLE, STRING (binary collation), DATE, TIMESTAMP,
  TIMESTAMP_NTZ; DECIMAL only passed through and compared; ARRAY of those only passed through
  (ARRAY of a timestamp type not measured: refused). A referenced column of another type, ``*``
  included, is refused.
* Comparisons (NaN = NaN and greatest, -0.0 = 0.0, strings by code point: the same in both) and
  IN/BETWEEN within one family: integers with decimals, DOUBLE with DOUBLE or integers, and
  strings, dates, booleans, TIMESTAMP, TIMESTAMP_NTZ with their own kind. Across families Spark
  casts unlike DuckDB (a string or a DATE with a TIMESTAMP is read in the session time zone; a
  TIMESTAMP_NTZ with a TIMESTAMP is read there too, where DuckDB uses its connection's TimeZone).
  CASE/IF/COALESCE branches and UNION ALL columns widen integers, integers to DOUBLE, else keep
  one type.
* TIMESTAMP is an instant: the caller registers it as Arrow ``timestamp("us", tz="UTC")``, DuckDB
  holds it as TIMESTAMPTZ, UTC microseconds, and compares and joins the instants (int64), as Spark
  does, whatever the connection's TimeZone (measured under UTC, America/New_York, Asia/Kolkata,
  Australia/Lord_Howe: around DST changes, before 1970 and 1582, to the microsecond). Rendered to
  Arrow, DuckDB labels it with the connection's TimeZone, the instant kept; the caller conforms it
  to UTC (``tables.conformed``, which refuses a label other than UTC: the caller's connection
  should ``SET TimeZone = 'UTC'``, also for its own TIMESTAMP with TIMESTAMPTZ comparisons).
  TIMESTAMP_NTZ is a wall time, ``timestamp("us")`` and DuckDB's TIMESTAMP: no zone anywhere.
* Literals: integers (INT, else BIGINT), decimals (only compared: DECIMAL(p, s) as Spark types
  them), doubles with an exponent, strings, ``DATE 'yyyy-mm-dd'``, and ``TIMESTAMP``,
  ``TIMESTAMP_LTZ``, ``TIMESTAMP_NTZ 'yyyy-mm-dd[ hh:mm:ss[.f..ffffff]]'``, only compared. Spark
  reads a TIMESTAMP literal in the session time zone, UTC: written here with an explicit ``+00:00``,
  so DuckDB's TimeZone plays no part. A TIMESTAMP literal is not a value of its own: Spark types it
  by ``spark.sql.timestampType`` (TIMESTAMP_NTZ if set so), which Epochal does not pin; compared
  with a TIMESTAMP column it gives the same answer either way in a UTC session (measured). Time
  zone text (``Z``, ``+02:00``, a region), a ``T``, more than six fraction digits (Spark drops the
  seventh), special values (``now``, ``epoch``), ``timestamp(s)`` and ``to_timestamp(s)`` (not
  measured), and text that is no valid date and time are refused.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from epochal.driver import tables

if TYPE_CHECKING:
    from pyspark.sql.types import DataType


class NotOnDriver(tables.NotOnDriver):
    """The query (or a part of it) cannot be computed on the driver with results identical to Spark's; the message
    names the construct and why. (A tables.NotOnDriver, which the driver path catches.)"""


INTS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
RANGE = {t: (-(2 ** (b - 1)), 2 ** (b - 1) - 1) for t, b in zip(INTS, (8, 16, 32, 64), strict=True)}
_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 20}  # as DECIMAL(n, 0), Spark's widening
NUMERIC = {"DOUBLE", *INTS}
COL, ANY = "column", "constant"  # not a constant / a constant Spark may fold whose value is not known here
# in messages; other types as DuckDB names them
_SPARK_NAMES = {"TIMESTAMPTZ": "TIMESTAMP", "TIMESTAMP": "TIMESTAMP_NTZ"}
TS_LITERAL_VALUE = "only compared on the driver (Spark types it by spark.sql.timestampType)"
# sqlglot's type of a typed literal: TIMESTAMP and TIMESTAMP_LTZ '...' are instants, TIMESTAMP_NTZ '...' a wall time
TIMESTAMP_LITERALS = {"TIMESTAMPTZ": "TIMESTAMPTZ", "TIMESTAMPLTZ": "TIMESTAMPTZ", "TIMESTAMPNTZ": "TIMESTAMP"}
_TIMESTAMP_TEXT = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?: (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?)?")


@dataclass(frozen=True)
class Expr:
    """An expression compiled: DuckDB SQL of Spark's type, whether it may raise at run time, and its constancy
    (COL, ANY, or the 1-tuple of its known value)."""

    sql: str
    type: str
    raises: bool = False
    const: object = COL
    lit: str = ""  # "dec" / "dbl" / "ts": a decimal, double or timestamp literal, admitted in fewer places
    chain: tuple = ()  # (op, type, operand constancies) of a + or * chain, as Spark regroups them
    dbl: bool = False  # compares DOUBLE values: not in a WHERE (Spark pushes it to Parquet statistics)


@dataclass
class Col:  # a column of a source or result; type None: not on the driver, ``why``
    name: str
    type: str | None
    why: str = ""
    raises: bool = False
    const: object = COL
    dbl: bool = False


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def known(c: object) -> bool:
    return isinstance(c, tuple)


def shown(t: str) -> str:
    """A type as Spark names it, for messages (DuckDB's TIMESTAMP is Spark's TIMESTAMP_NTZ)."""
    return _SPARK_NAMES.get(t, t)


def cast(e: Expr, t: str) -> str:
    return e.sql if e.type == t else f"CAST({e.sql} AS {t})"


def compound(sql: str, t: str, parts: list[Expr], const: object = COL, raises: bool = False, dbl: bool = False) -> Expr:
    """A compound expression: it may raise, or compares doubles, if a part does."""
    raises, dbl = raises or any(p.raises for p in parts), dbl or any(p.dbl for p in parts)
    return Expr(sql, t, raises, const, dbl=dbl)


def refuse_unless(ok: object, message: str) -> None:
    if not ok:
        raise NotOnDriver(message)


def duck_type(dt: DataType) -> str:
    from pyspark.sql import types as T

    simple = {
        T.BooleanType: "BOOLEAN",
        T.ByteType: "TINYINT",
        T.ShortType: "SMALLINT",
        T.IntegerType: "INTEGER",
        T.LongType: "BIGINT",
        T.DoubleType: "DOUBLE",
        T.DateType: "DATE",
        T.TimestampType: "TIMESTAMPTZ",  # an instant, registered as Arrow timestamp("us", tz="UTC")
        T.TimestampNTZType: "TIMESTAMP",  # a wall time, timestamp("us")
    }
    if type(dt) in simple:
        return simple[type(dt)]
    if type(dt) is T.StringType and dt.isUTF8BinaryCollation():
        return "VARCHAR"
    if type(dt) is T.DecimalType:
        return f"DECIMAL({dt.precision},{dt.scale})"
    nested = (T.ArrayType, T.TimestampType, T.TimestampNTZType)
    if type(dt) is T.ArrayType and not isinstance(dt.elementType, nested):
        return duck_type(dt.elementType) + "[]"
    raise NotOnDriver(f"a column of type {dt.simpleString()} is not computed on the driver")


def _decimal(t: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", t)
    return (int(m[1]), int(m[2])) if m else (_DIGITS[t], 0) if t in INTS else None


def scalar(*args: Expr) -> None:
    refuse_unless(not any(a.type.endswith("[]") for a in args), "an ARRAY in an expression: only passed through")


def boolean(*args: Expr) -> None:
    refuse_unless(all(a.type in ("BOOLEAN", "NULL") for a in args), f"a condition of type {[a.type for a in args]}")


def cmp_type(a: Expr, b: Expr) -> str:
    """The type Spark compares ``a`` and ``b`` in, when comparing there means the same in DuckDB."""
    scalar(a, b)
    for x, y in ((a, b), (b, a)):
        refuse_unless(x.lit != "dbl" or y.type in ("DOUBLE", "NULL"), f"a DOUBLE literal compared with {y.type}")
        if x.type == "NULL":
            return "INTEGER" if y.type == "NULL" else y.type
    if a.type == b.type and not a.type.startswith("DECIMAL"):
        return a.type
    if a.type in INTS and b.type in INTS:
        return max(a.type, b.type, key=INTS.index)
    if {a.type, b.type} <= NUMERIC:
        return "DOUBLE"
    da, db = _decimal(a.type), _decimal(b.type)
    if da and db:  # exact in both: integers widened to DECIMAL(n, 0)
        scale = max(da[1], db[1])
        if (precision := max(da[0] - da[1], db[0] - db[1]) + scale) <= 38:
            return f"DECIMAL({precision},{scale})"
    raise NotOnDriver(
        f"comparing {shown(a.type)} with {shown(b.type)} is not computed on the driver: "
        "Spark casts across types unlike DuckDB"
    )


def value_type(values: list[Expr], what: str) -> str:
    """The type of CASE/IF/COALESCE branches or UNION ALL columns, as Spark widens them, or NotOnDriver."""
    scalar(*values)
    types = {v.type for v in values} - {"NULL"}
    for v in values:
        refuse_unless(v.lit != "dec", f"a decimal literal as the value of {what}: only compared on the driver")
        refuse_unless(v.lit != "ts", f"a {shown(v.type)} literal as the value of {what}: {TS_LITERAL_VALUE}")
        refuse_unless(v.lit != "dbl" or types == {"DOUBLE"}, f"a DOUBLE literal with {sorted(types)} in {what}")
    if len(types) <= 1:
        return types.pop() if types else "NULL"
    if types <= set(INTS):
        return max(types, key=INTS.index)
    refuse_unless(types <= NUMERIC, f"{what} mixing {sorted(map(shown, types))} is not computed on the driver")
    return "DOUBLE"


def compare(a: Expr, op: str, b: Expr) -> Expr:
    t = cmp_type(a, b)
    const = ANY if a.const != COL and b.const != COL else COL
    return compound(f"({cast(a, t)} {op} {cast(b, t)})", "BOOLEAN", [a, b], const, dbl=t == "DOUBLE")


def literal(text: str, is_string: bool) -> Expr:
    """A number or string literal as Spark types it; ``text`` with its sign."""
    if is_string:
        return Expr("'" + text.replace("'", "''") + "'", "VARCHAR", const=(text,))
    if re.fullmatch(r"-?\d+", text):
        t = next((t for t in ("INTEGER", "BIGINT") if RANGE[t][0] <= int(text) <= RANGE[t][1]), None)
        refuse_unless(t, f"integer literal {text} beyond BIGINT: Spark reads it as a DECIMAL")
        return Expr(f"CAST({int(text)} AS {t})", t, const=(int(text),))
    if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", text):
        _, digits, exponent = Decimal(text).as_tuple()
        precision, scale = max(len(digits), -exponent), -exponent  # Spark: 0.05 is DECIMAL(2,2), 100.0 DECIMAL(4,1)
        refuse_unless(precision <= 38, f"decimal literal {text} beyond 38 digits")
        t = f"DECIMAL({precision},{scale})"
        return Expr(f"CAST('{text}' AS {t})", t, const=(Decimal(text),), lit="dec")
    value = float(text)  # 1e3: Spark 4 reads an exponent as a DOUBLE
    refuse_unless(abs(value) != float("inf"), f"double literal {text} is not finite")
    return Expr(f"CAST('{value!r}' AS DOUBLE)", "DOUBLE", const=(value,), lit="dbl")


def date_literal(text: str) -> Expr:
    try:
        day = datetime.date.fromisoformat(text) if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text) else None
    except ValueError:
        day = None
    refuse_unless(day, f"DATE '{text}': only yyyy-mm-dd dates are read on the driver")
    return Expr(f"DATE '{day.isoformat()}'", "DATE", const=(day,))


def timestamp_literal(text: str, t: str) -> Expr:
    """``TIMESTAMP[_LTZ|_NTZ] 'text'``: ``t`` TIMESTAMPTZ (an instant, read in UTC) or TIMESTAMP (a wall time)."""
    m = _TIMESTAMP_TEXT.fullmatch(text)
    try:
        fields = [int(g or 0) for g in m.groups()[:6]] if m else None
        value = datetime.datetime(*fields, int((m[7] or "").ljust(6, "0"))) if fields else None
    except ValueError:
        value = None
    refuse_unless(
        value, f"{shown(t)} '{text}': only 'yyyy-mm-dd[ hh:mm:ss[.ffffff]]' timestamps are read on the driver"
    )
    wall = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
    )
    if t == "TIMESTAMPTZ":  # the offset fixes the instant: DuckDB's TimeZone is not read
        return Expr(f"CAST('{wall}+00:00' AS TIMESTAMPTZ)", t, const=(value.replace(tzinfo=datetime.UTC),), lit="ts")
    return Expr(f"CAST('{wall}' AS TIMESTAMP)", t, const=(value,), lit="ts")
