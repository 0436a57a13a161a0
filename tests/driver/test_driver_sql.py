"""duck_sql: a view's Spark SQL run by DuckDB on the driver gives Spark's rows, names and types, raises where Spark
raises, or is refused (NotOnDriver). Each query runs on the same data in Spark (ANSI, the default) and DuckDB."""

from __future__ import annotations

import datetime
import math
import struct
import subprocess
import sys
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from epochal.driver.duck_sql import NotOnDriver, duckdb_sql
from epochal.driver.tables import conformed

NAN, INF = float("nan"), float("inf")
B, SH, INT, L, D, S = T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType(), T.DoubleType(), T.StringType()
BOOL, DATE, TS, NTZ = T.BooleanType(), T.DateType(), T.TimestampType(), T.TimestampNTZType()
day, wall = datetime.date, datetime.datetime
TIME = datetime.datetime(2024, 5, 1, 12, 0)
IST = datetime.timezone(datetime.timedelta(hours=5, minutes=30))


def utc(*fields: int) -> datetime.datetime:
    return datetime.datetime(*fields, tzinfo=datetime.UTC)


def _schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, data_type) for name, data_type in fields])


PLANNED = _schema(("id", L), ("k", L), ("v", L), ("note", S))
PLANNED_ROWS = [(1, 1, 5, "x"), (2, 1, 3, "y"), (3, 2, -7, None), (4, None, None, "é"),
                (5, 2, 4611686018427387903, "x"), (6, 3, 0, "")]
TABLES: dict[str, tuple[T.StructType, list[tuple]]] = {
    "t": (PLANNED, PLANNED_ROWS),
    "__epochal_leaf_0": (PLANNED, PLANNED_ROWS),
    "v__stage1": (
        _schema(*((c, L) for c in ("k", "p_rows", "p1_count", "p2_sum", "p3_min", "p4_max")),
                ("_epochal_kept_p3_min", T.ArrayType(L)), ("_epochal_kept_p4_max", T.ArrayType(L))),
        [(1, 3, 3, 10, 1, 7, [1, 2], [7]), (2, 1, 1, -5, -5, -5, [], [-5, None]),
         (3, 2, 2, None, None, None, None, None), (4, 5, 3, 9007199254740993, 0, 9, [0], [9])],
    ),
    "bid": (
        _schema(("auction", L), ("bidder", L), ("price", L), ("ts", TS)),
        [(1, 10, 5, TIME), (1, 11, 11, TIME), (2, None, 50, TIME), (2, 12, 100, None), (3, 13, -20, TIME),
         (4, 14, None, TIME)],
    ),
    "n": (
        _schema(("id", INT), ("b", B), ("s", SH), ("i", INT), ("l", L), ("d", D), ("e", D),
                ("dec", T.DecimalType(10, 2)), ("flag", BOOL), ("day", DATE), ("name", S), ("tags", T.ArrayType(S)),
                ("nums", T.ArrayType(L)), ("q", INT)),
        [
            (1, 1, 300, 10, 10_000_000_000, 1.5, 2.0, Decimal("12.50"), True, day(2024, 1, 1), "alpha", ["a", "b"],
             [1, 2], 3),
            (2, -2, -7, -3, -1, -0.0, -0.5, Decimal("-0.01"), False, day(1970, 1, 1), "Émile", [], None, -2),
            (3, None, None, None, None, None, None, None, None, None, None, None, [None], None),
            (4, 100, 12, 2, 7, NAN, NAN, Decimal("1.50"), True, day(2000, 2, 29), "😀", ["x"], [], 7),
            (5, 0, 0, 0, 0, INF, INF, Decimal("0.00"), False, day(2024, 12, 31), "\uffff", None, [0], 1),
            (6, 5, 5, 5, 9007199254740993, -INF, 3.0, Decimal("99999999.99"), True, day(1900, 1, 1), "a ", ["é"],
             [9], -1),
            (7, -100, 1000, -2147483, -9007199254740993, 0.0, -4.0, Decimal("1.5"), None, day(1, 1, 1), "a", [], [], 2),
            (8, 7, -1, 7, 3, 1e308, 1e-308, Decimal("-12.5"), False, day(9999, 12, 31), "z", ["a"], [1], 5),
        ],
    ),
    "edge": (
        _schema(("id", INT), ("i", INT), ("l", L), ("b", B), ("s", SH)),
        [(1, 2147483647, 9223372036854775807, 127, 32767), (2, -2147483648, -9223372036854775808, -128, -32768),
         (3, 0, 0, 0, 0), (4, None, None, None, None), (5, 1, -1, 1, -1)],
    ),
    "odd": (
        _schema(("user-id", INT), ("select", S), ("Order Type", S), ("a.b", L), ("MixedCase", L)),
        [(1, "from", "Retail", 10, 1), (2, None, "Wholesale", None, -1), (None, "é", "Retail", 3, 2)],
    ),
    "Events": (_schema(("Kind", S), ("N", L)), [("a", 1), ("b", 2), ("c", None), (None, 4)]),
    "ev": (  # ts, ts2 instants (Arrow timestamp[us, UTC]); nt, nt2 wall times (timestamp[us])
        _schema(("id", INT), ("ts", TS), ("ts2", TS), ("nt", NTZ), ("nt2", NTZ), ("k", L)),
        [
            # a microsecond before New York springs forward (07:00 UTC), and at it; a wall time New York skips
            (1, utc(2024, 3, 10, 6, 59, 59, 999999), utc(2024, 3, 10, 7), wall(2024, 3, 10, 2, 30),
             wall(2024, 3, 10, 2, 30), 1),
            # the two instants New York shows as 01:30 when it falls back; Lord Howe moves by 30 minutes
            (2, utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 6, 30), wall(2024, 11, 3, 1, 30),
             wall(2024, 11, 3, 1, 30, 0, 1), 2),
            (3, utc(1969, 12, 31, 23, 59, 59, 999999), utc(1970, 1, 1), wall(1969, 12, 31, 23, 59, 59, 999999),
             wall(1970, 1, 1), 3),
            # before the Gregorian reform (proleptic in Spark, Arrow and DuckDB), year 1, year 9999
            (4, utc(1500, 1, 1, 0, 0, 0, 1), utc(1, 1, 1), wall(1582, 10, 10), wall(1, 1, 1), 4),
            (5, None, utc(2024, 1, 1, 10), None, wall(2024, 1, 1, 10), None),
            (6, utc(9999, 12, 31, 23, 59, 59, 999999), utc(9999, 12, 31, 23, 59, 59, 999999),
             wall(9999, 12, 31, 23, 59, 59, 999999), None, 6),
            # one instant written with two offsets: 15:30 +05:30 is 10:00 UTC
            (7, datetime.datetime(2024, 1, 1, 15, 30, tzinfo=IST), utc(2024, 1, 1, 10), wall(2024, 1, 1, 10),
             wall(2024, 1, 1, 10, 0, 0, 1), 7),
            (8, utc(2024, 1, 1, 10, 0, 0, 1), None, wall(2024, 1, 1, 10, 0, 0, 1), None, 1),
            (9, utc(2024, 5, 1, 12), utc(2024, 5, 1, 12), wall(2024, 3, 10, 2, 30), wall(2024, 3, 10, 2, 30), 2),
        ],
    ),
    "a": (
        _schema(("k", L), ("x", INT), ("label", S)),
        [(1, 10, "one"), (2, 20, "two"), (2, 21, "two-b"), (None, 30, "null"), (4, 40, "four")],
    ),
    "c": (
        _schema(("k", INT), ("y", D), ("tag", S)),
        [(1, 1.5, "p"), (2, -0.0, "q"), (3, NAN, "r"), (None, 2.0, "s"), (2, 0.5, "u")],
    ),
}
INPUTS = {name: schema for name, (schema, _) in TABLES.items()} | {
    "m": _schema(("k", L), ("props", T.MapType(S, S))),
    "ci": _schema(("k", L), ("name", T.StringType("UNICODE_CI"))),
    "f1": _schema(("dk", D), ("v", INT)),
    "f2": _schema(("dk", D), ("w", S)),
    "tsa": _schema(("k", L), ("times", T.ArrayType(TS))),
}

ACCEPTED = [
    # the shapes the planner generates
    "SELECT * FROM t",
    "SELECT t.k AS k, t.v AS _epochal_a0 FROM __epochal_leaf_0 AS t",
    "SELECT t.k AS k, t.v * 2 AS _epochal_a0, t.note <> 'x' AS _epochal_f0 FROM __epochal_leaf_0 AS t WHERE t.v > 3",
    "SELECT _p.k AS k, _p.p_rows AS n, _p.p2_sum AS s, (_p.p2_sum / _p.p1_count) AS a, _p.p3_min AS lo, "
    "_p.p4_max AS hi FROM v__stage1 AS _p",
    "SELECT auction, price, price * 100 AS cents FROM bid WHERE price > 10 AND bidder IS NOT NULL",
    "SELECT auction, price FROM bid WHERE price > 10 UNION ALL SELECT k, v FROM t WHERE note = 'x'",
    "SELECT * FROM v__stage1 WHERE k <> 2",
    # names: quoted, keywords, dots, spaces, case as written, input names matched case-insensitively
    "SELECT `user-id`, `select`, `Order Type` AS `Order Type`, `a.b` + 1 AS `x-y z`, mixedcase FROM odd",
    "SELECT o.* FROM odd AS o WHERE o.`select` IS NOT NULL",
    "SELECT kind, N AS cnt FROM events WHERE kind >= 'b'",
    "SELECT e.* FROM EVENTS AS e WHERE e.KIND IS NOT NULL",
    # subqueries, UNION ALL (columns widened as Spark: INT with BIGINT, INT with DOUBLE), parentheses
    "SELECT s.k, s.w FROM (SELECT k, v - 3 AS w, note FROM t WHERE note IS NOT NULL) AS s WHERE s.k > 1",
    "SELECT * FROM (SELECT id, l FROM n) WHERE l > 0",
    "SELECT x FROM ((SELECT i AS x FROM n) UNION ALL (SELECT l FROM n)) AS u WHERE x IS NOT NULL",
    "SELECT i AS v FROM n WHERE i > 0 UNION ALL SELECT d FROM n WHERE flag UNION ALL SELECT id FROM edge",
    "SELECT tags, id FROM n UNION ALL SELECT tags, id FROM n WHERE flag",
    "SELECT id FROM n WHERE (((i > 0)))",
    "SELECT w + 1 AS z, w > 5 AS big, k FROM (SELECT v - 3 AS w, k FROM t) AS s WHERE k > 1",
    "SELECT * FROM (SELECT k, v + 1 AS w FROM t UNION ALL SELECT k, -v FROM t) AS u WHERE k > 1",
    "SELECT k FROM t WHERE v > 2 * 3 AND k IN (1, 1 + 1)",
    # comparisons: NaN and -0.0, code point order, decimals exact, dates, booleans, boundaries
    "SELECT id, d = e AS eq, d < e AS lt, d >= 0 AS ge0, d <=> e AS nse, d <> 0.0D AS ne, d = i AS di FROM n",
    "SELECT id, d > 1e300 AS huge, d >= 1e308 AS top, d = d AS self, d <> d AS other FROM n",
    "SELECT id, name < 'b' AS lt, name = 'a ' AS sp, name > 'é' AS gt, name <= '\uffff' AS ff FROM n",
    "SELECT id, i = 1.5 AS a, i < 2.5 AS b, l >= 10000000000 AS c, dec > 12.5 AS d2, dec = i AS e2, "
    "dec <=> 1.50 AS f, dec < 0.05 AS g FROM n",
    "SELECT id, day < DATE '2000-01-01' AS old, day = DATE '2024-12-31' AS eve, flag = TRUE AS t1, "
    "flag <> false AS t2 FROM n",
    "SELECT id FROM edge WHERE l > 9223372036854775806 OR i < -2147483647 OR b = -128 OR s >= 32767",
    "SELECT id, i IN (1, 2147483647, NULL) AS a, l NOT IN (0, -1) AS b, b BETWEEN -128 AND 0 AS c, "
    "s NOT BETWEEN -1 AND 1 AS d, l = -9223372036854775808 AS e FROM edge",
    "SELECT id, name IN ('a', 'é', '😀') AS a, d IN (0.0D, 1.5D) AS b, "
    "day BETWEEN DATE '1970-01-01' AND DATE '2024-06-30' AS c, i IN (2, 1.5) AS dd FROM n",
    "SELECT id, NOT (i > 0 AND d < 2) AS a, (i > 0 OR name IS NULL) AS b, i = NULL AS c, flag AND NULL AS dd FROM n",
    "SELECT id FROM n WHERE NOT flag",
    "SELECT id, l IS DISTINCT FROM 7 AS a, name IS NOT DISTINCT FROM NULL AS b FROM n",
    # arithmetic: integer results in Spark's types, doubles IEEE, division as DOUBLE, constants folded
    "SELECT id, i + 1 AS a, i - l AS b, i * 1000 AS c, -i AS d, abs(i) AS e, s + s AS f, -l AS g, b - 1 AS h, "
    "b * b AS bb FROM n WHERE id NOT IN (4, 7)",
    "SELECT id, d + 1 AS a, d * e AS b, -d AS c, abs(d) AS dd, d - i AS e2, e * 2 AS f, -(0.0D) AS z FROM n",
    "SELECT id, i / q AS a, d / e AS b, l / 3 AS c, CASE WHEN i = 0 THEN NULL ELSE 1 / i END AS dd, "
    "IF(q = 0, NULL, l / q) AS r FROM n",
    "SELECT id, i / 0 AS z, d / 0 AS dz FROM n WHERE i IS NULL",
    "SELECT id, (i + 2) * (s - 1) AS a, -(-5) AS b, 2147483647 + 0 AS c, 10Y AS y, 7L * i AS dd, "
    "i * 2 + 1 AS e, 1 + i + 2 AS f FROM n",
    # casts: widening integers, integer to DOUBLE (rounding as Spark), to the same type, typed NULL
    "SELECT id, CAST(b AS SMALLINT) AS a, CAST(s AS INT) AS bb, CAST(i AS BIGINT) AS c, CAST(l AS DOUBLE) AS dd, "
    "CAST(i AS DOUBLE) AS e, CAST(d AS DOUBLE) AS f, CAST(NULL AS INT) + i AS g, CAST(dec AS DECIMAL(10,2)) AS h, "
    "CAST(day AS DATE) AS k2, CAST(l AS DOUBLE) = CAST(l - 1 AS DOUBLE) AS same FROM n",
    # CASE / IF / COALESCE / NVL: branch types widened as Spark
    "SELECT id, CASE WHEN i > 0 THEN i WHEN i < 0 THEN l ELSE NULL END AS a, "
    "CASE WHEN flag THEN 'yes' WHEN NOT flag THEN 'no' END AS bb, IF(d > 0, d, i) AS c, COALESCE(i, l, 0) AS dd, "
    "NVL(name, '∅') AS e FROM n",
    "SELECT id, CASE b WHEN 1 THEN 'one' WHEN -2 THEN 'minus two' ELSE 'other' END AS a, "
    "CASE WHEN dec > 0 THEN dec END AS p, CASE WHEN q > 0 THEN i * q ELSE -i END AS m, "
    "COALESCE(flag, i > 0) AS f FROM n",
    # joins: INNER (keys widened), LEFT with NULLs, -0.0 and NaN keys, a subquery, two conditions
    "SELECT a.k, a.x, c.y, c.tag FROM a JOIN c ON a.k = c.k",
    "SELECT a.label, c.tag, c.y, c.y > 0 AS pos FROM a LEFT JOIN c ON c.k = a.k WHERE c.tag IS NULL OR c.tag <> 'u'",
    "SELECT * FROM a AS l JOIN (SELECT k AS ck, tag FROM c WHERE tag <> 'r') AS r ON l.k = r.ck",
    "SELECT a.x * 2 AS x2, c.tag FROM a LEFT OUTER JOIN c ON a.k = c.k AND a.label = c.tag",
    # literals and output names
    "SELECT n.id AS `ID`, 'lit' AS s, 'it''s' AS q, \"dq\" AS dq, TRUE AS t, DATE '2020-02-29' AS dd, 1.5D AS dbl, "
    "1e3 AS e3, -2147483648 AS mn, 2147483648 AS big, tags, nums FROM n",
]

RAISES = [  # Spark 4 (ANSI) raises: DuckDB must raise too
    "SELECT i + 1 AS x FROM edge WHERE id = 1",
    "SELECT l * 2 AS x FROM edge WHERE id = 1",
    "SELECT -l AS x FROM edge WHERE id = 2",
    "SELECT abs(i) AS x FROM edge WHERE id = 2",
    "SELECT b + b AS x FROM edge WHERE id = 1",
    "SELECT s * s AS x FROM edge WHERE id = 2",
    "SELECT l / i AS x FROM edge WHERE id = 3",
    "SELECT 1.0D / d AS x FROM n WHERE id = 2",
    "SELECT (i + 1) - 1 AS x FROM edge",
    "SELECT CASE WHEN id = 1 THEN i * 2 ELSE 0 END AS x FROM edge",
    "SELECT w FROM (SELECT i + 1 AS w, id FROM edge) WHERE id = 1",
    "SELECT l * l AS x FROM edge WHERE id = 2",
    # DuckDB's optimizer turns i + 1 > 5 into i > 4, and i * 2 = 4 into i = 2: no overflow left to raise
    "SELECT i + 1 > 5 AS f FROM edge",
    "SELECT i * 2 = 4 AS f FROM edge",
    "SELECT -i < 0 AS f FROM edge",
]

REFUSED = [
    ("SELECT upper(note) AS u FROM t", r"function upper\(\)"),
    ("SELECT k FROM t WHERE note = 1", "comparing VARCHAR with INTEGER"),
    ("SELECT day FROM n WHERE day > '2024-01-01'", "comparing DATE with VARCHAR"),
    ("SELECT dec + 1 AS x FROM n", r"arithmetic \(\+\) on DECIMAL"),
    ("SELECT i * 1.5 AS x FROM n", r"arithmetic \(\*\) on DECIMAL"),
    ("SELECT CAST(d AS INT) AS x FROM n", r"CAST\(DOUBLE AS INTEGER\)"),
    ("SELECT CAST(name AS INT) AS x FROM n", r"CAST\(VARCHAR AS INTEGER\)"),
    ("SELECT CAST(i AS STRING) AS x FROM n", "CAST to STRING"),
    ("SELECT k, count(*) AS c FROM t GROUP BY k", "GROUP BY"),
    ("SELECT k, row_number() OVER (ORDER BY k) AS r FROM t", "window"),
    ("SELECT k FROM t LIMIT 3", "LIMIT"),
    ("SELECT DISTINCT k FROM t", "DISTINCT"),
    ("SELECT k FROM t ORDER BY k", "ORDER BY"),
    ("WITH w AS (SELECT k FROM t) SELECT k FROM w", "WITH"),
    ("SELECT k FROM t UNION SELECT k FROM t", "UNION DISTINCT"),
    # timestamps: only passed through and compared with their own kind
    ("SELECT hour(ts) AS h FROM ev", r"function hour\(\)"),
    ("SELECT date_trunc('HOUR', ts) AS h FROM ev", r"DATE_TRUNC\('HOUR', ts\)"),
    ("SELECT window(ts, '10 minutes') AS w FROM ev", r"function window\(\)"),
    ("SELECT to_date(ts) AS d FROM ev", r"TO_DATE\(ts\)"),
    ("SELECT unix_timestamp(ts) AS u FROM ev", r"UNIX_TIMESTAMP\(ts\)"),
    ("SELECT id FROM ev WHERE ts < current_timestamp()", r"current_timestamp\(\)"),
    ("SELECT ts + INTERVAL 1 HOUR AS x FROM ev", "an INTERVAL"),
    ("SELECT ts - ts2 AS x FROM ev", r"arithmetic \(-\) on TIMESTAMP"),
    ("SELECT nt - INTERVAL '1' DAY AS x FROM ev", "an INTERVAL"),
    ("SELECT CAST(ts AS STRING) AS x FROM ev", "CAST to STRING"),
    ("SELECT CAST(ts AS DATE) AS x FROM ev", r"CAST\(TIMESTAMP AS DATE\)"),
    ("SELECT CAST(nt AS TIMESTAMP) AS x FROM ev", "CAST to TIMESTAMP"),
    ("SELECT CAST(ts AS TIMESTAMP_NTZ) AS x FROM ev", "CAST to TIMESTAMP_NTZ"),
    ("SELECT id FROM ev WHERE ts = CAST('2024-01-01 10:00:00' AS TIMESTAMP)", "CAST to TIMESTAMP"),
    ("SELECT id FROM ev WHERE ts = '2024-01-01 10:00:00'::timestamp", "CAST to TIMESTAMP"),
    ("SELECT id FROM ev WHERE ts = timestamp('2024-01-01 10:00:00')", r"timestamp\(\)"),
    ("SELECT id FROM ev WHERE ts > '2024-01-01'", "comparing TIMESTAMP with VARCHAR"),
    ("SELECT id FROM ev WHERE ts > DATE '2024-01-01'", "comparing TIMESTAMP with DATE"),
    ("SELECT id FROM ev WHERE ts = nt", "comparing TIMESTAMP with TIMESTAMP_NTZ"),
    ("SELECT id FROM ev WHERE nt = TIMESTAMP '2024-01-01 10:00:00'", "comparing TIMESTAMP_NTZ with TIMESTAMP"),
    ("SELECT a.id FROM ev AS a JOIN ev AS b ON a.ts = b.nt", "comparing TIMESTAMP with TIMESTAMP_NTZ"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP '2024-01-01 10:00:00+02:00'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP '2024-01-01 10:00:00Z'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP '2024-01-01T10:00:00'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP '2024-01-01 10:00:00.1234567'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP '2024-02-30 00:00:00'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE nt > TIMESTAMP_NTZ '2024-1-1'", "only 'yyyy-mm-dd"),
    ("SELECT id FROM ev WHERE ts > TIMESTAMP 'epoch'", "only 'yyyy-mm-dd"),
    ("SELECT TIMESTAMP '2024-01-01 10:00:00' AS x FROM ev", "literal: only compared"),
    ("SELECT COALESCE(ts, TIMESTAMP '2024-01-01 10:00:00') AS x FROM ev", "literal as the value of COALESCE"),
    ("SELECT id FROM ev WHERE ts IN (ts2)", "not a literal"),
    ("SELECT CASE WHEN id = 1 THEN ts ELSE nt END AS x FROM ev", r"CASE/IF mixing \['TIMESTAMP', 'TIMESTAMP_NTZ'\]"),
    ("SELECT ts FROM ev UNION ALL SELECT nt FROM ev", "UNION ALL mixing"),
    ("SELECT ts FROM ev UNION ALL SELECT id FROM ev", "UNION ALL mixing"),
    ("SELECT * FROM tsa", r"type array<timestamp>"),
    ("SELECT * FROM m", "type map<string,string>"),
    ("SELECT name FROM ci", "string collate UNICODE_CI"),
    ("SELECT tags IS NULL AS x FROM n", "ARRAY"),
    ("SELECT k FROM t WHERE v + 1 > 5", "integer \\+ in a WHERE"),
    ("SELECT (v + 1 > 0 AND k = 1) AS f FROM t", "under AND/OR"),
    ("SELECT i BETWEEN 0 AND l + 1 AS x FROM n", "BETWEEN bound"),
    ("SELECT 2147483647 + 1 AS x FROM t", "overflow in a constant"),
    ("SELECT (v + 9223372036854775807) + 1 AS x FROM t", "overflow in a constant"),
    ("SELECT 1 / 0 AS x FROM t", "divided by zero"),
    ("SELECT w FROM (SELECT k, v * 2 AS w FROM t) AS s JOIN a ON s.k = a.k", "joined subquery"),
    ("SELECT k FROM (SELECT k, v * 2 AS w FROM t)", "not read"),
    ("SELECT CASE WHEN k > 0 THEN w END AS x FROM (SELECT k, v * 2 AS w FROM t)", "in a branch"),
    ("SELECT v + 1 FROM t", "no alias"),
    ("SELECT k AS a, v AS A FROM t", "two columns named A"),
    ("SELECT NULL AS x FROM t", "bare NULL"),
    ("SELECT i > 1.5D AS x FROM n", "DOUBLE literal compared with INTEGER"),
    ("SELECT i % 2 AS x FROM n", "Mod"),
    ("SELECT a.k FROM a JOIN c USING (k)", r"only \[INNER\|LEFT\] JOIN"),
    ("SELECT * FROM a JOIN c ON a.k < c.k", "only column = column"),
    ("SELECT f1.v, f2.w FROM f1 JOIN f2 ON f1.dk = f2.dk", "DOUBLE keys"),
    ("SELECT id FROM n WHERE d > 1e300", "DOUBLE comparison in a WHERE"),
    ("SELECT id FROM (SELECT id, d > 1 AS big FROM n) WHERE big", "DOUBLE comparison in a WHERE"),
    ("SELECT id FROM n WHERE i IN (1, 2) OR d IN (0.0D)", "DOUBLE comparison in a WHERE"),
    ("SELECT t.v FROM t AS z", "table or alias t"),
    ("SELECT i + 1 AS y, y + 1 AS z FROM n", "not an input column"),
    ("SELECT i FROM n WHERE i IN (SELECT k FROM t)", "IN"),
    ("SELECT 9223372036854775808 AS x FROM t", "beyond BIGINT"),
    ("SELECT name = 'a\\n' AS x FROM n", "backslash"),
    ("SELECT k FROM t; SELECT k FROM t", "2 statements"),
]


def _arrow_type(data_type: T.DataType) -> pa.DataType:
    if isinstance(data_type, T.ArrayType):
        return pa.list_(_arrow_type(data_type.elementType))
    if isinstance(data_type, T.DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    return {T.ByteType: pa.int8(), T.ShortType: pa.int16(), T.IntegerType: pa.int32(), T.LongType: pa.int64(),
            T.DoubleType: pa.float64(), T.StringType: pa.string(), T.BooleanType: pa.bool_(), T.DateType: pa.date32(),
            T.TimestampType: pa.timestamp("us", tz="UTC"), T.TimestampNTZType: pa.timestamp("us")}[type(data_type)]


def _type_name(data_type: pa.DataType) -> str:
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return f"list<{_type_name(data_type.value_type)}>"
    return "string" if data_type in (pa.large_string(), pa.string_view()) else str(data_type)


def _value(value: object) -> object:
    """A value compared exactly: doubles by their bits (-0.0 is not 0.0), NaN equal to NaN."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else struct.pack(">d", value).hex()
    if isinstance(value, list):
        return tuple(_value(v) for v in value)
    return value


def _multiset(rows: list[tuple]) -> list[tuple]:
    return sorted((tuple(_value(v) for v in row) for row in rows), key=repr)


def _arrow_table(name: str) -> pa.Table:
    schema, rows = TABLES[name]
    columns = [pa.array([row[i] for row in rows], _arrow_type(f.dataType)) for i, f in enumerate(schema.fields)]
    return pa.Table.from_arrays(columns, names=schema.fieldNames())


@pytest.fixture(scope="module")
def views(spark):
    """Spark reads the same Arrow tables as DuckDB, cached: Spark's operators compute each query (not its optimizer
    over a local relation), without a Python worker per query. (The cache's batch statistics drop NaN rows from a
    DOUBLE filter, as Parquet's do: duck_sql refuses those filters.)"""
    session = spark.newSession()  # temp views of its own, the shared session's left alone
    frames = [session.createDataFrame(_arrow_table(name), TABLES[name][0]).cache() for name in TABLES]
    for name, frame in zip(TABLES, frames, strict=True):
        frame.createOrReplaceTempView(name)
    yield session
    for frame in frames:
        frame.unpersist()


@pytest.fixture
def duck():
    con = duckdb.connect()
    for name in TABLES:
        con.register(name, _arrow_table(name))
    yield con
    con.close()


@pytest.mark.parametrize("query", ACCEPTED)
def test_duckdb_returns_sparks_rows(views, duck, query):
    expected = views.sql(query)
    expected_rows = [tuple(row) for row in expected.collect()]
    result = duck.sql(duckdb_sql(query, INPUTS)).to_arrow_table()

    assert result.column_names == expected.columns
    assert [_type_name(t) for t in result.schema.types] == [
        _type_name(_arrow_type(f.dataType)) for f in expected.schema.fields
    ]
    assert _multiset(list(zip(*(c.to_pylist() for c in result.columns), strict=True))) == _multiset(expected_rows)


@pytest.mark.parametrize("query", RAISES)
def test_duckdb_raises_where_spark_raises(views, duck, query):
    with pytest.raises(Exception, match="ARITHMETIC_OVERFLOW|DIVIDE_BY_ZERO"):
        views.sql(query).collect()
    with pytest.raises(duckdb.Error, match="integer overflow|division by zero"):
        duck.execute(duckdb_sql(query, INPUTS)).fetchall()


@pytest.mark.parametrize(("query", "reason"), REFUSED)
def test_refused_with_the_construct_named(query, reason):
    with pytest.raises(NotOnDriver, match=reason):
        duckdb_sql(query, INPUTS)


TIMESTAMPS = [  # Spark's Arrow rows (toArrow: microseconds, no Python datetimes) against DuckDB's in several zones
    "SELECT * FROM ev",
    "SELECT * FROM bid",
    "SELECT e.*, e.ts AS again FROM ev AS e WHERE e.ts IS NOT NULL",
    "SELECT id, ts = ts2 AS eq, ts <> ts2 AS ne, ts < ts2 AS lt, ts <= ts2 AS le, ts > ts2 AS gt, ts >= ts2 AS ge, "
    "ts <=> ts2 AS nse, ts IS DISTINCT FROM ts2 AS d, ts IS NOT DISTINCT FROM ts2 AS nd, ts IS NULL AS z FROM ev",
    "SELECT id, nt = nt2 AS eq, nt <> nt2 AS ne, nt < nt2 AS lt, nt <= nt2 AS le, nt > nt2 AS gt, nt >= nt2 AS ge, "
    "nt <=> nt2 AS nse, nt IS DISTINCT FROM nt2 AS d, nt2 IS NOT NULL AS nn, ts = NULL AS z FROM ev",
    "SELECT id, ts BETWEEN ts2 AND ts AS b1, nt NOT BETWEEN nt2 AND nt AS b2, "
    "ts IN (TIMESTAMP '2024-01-01 10:00:00', TIMESTAMP '1500-01-01 00:00:00.000001', NULL) AS i1, "
    "nt IN (TIMESTAMP_NTZ '2024-03-10 02:30:00', TIMESTAMP_NTZ '1582-10-10') AS i2, "
    "ts > TIMESTAMP '2024-03-10 06:59:59.999999' AS after, "
    "TIMESTAMP '2024-11-03 05:30:00' < TIMESTAMP '2024-11-03' AS c FROM ev",
    # filters DuckDB pushes into the Arrow scan
    "SELECT id FROM ev WHERE ts = TIMESTAMP '2024-01-01 10:00:00'",
    "SELECT id FROM ev WHERE ts > TIMESTAMP '1969-12-31 23:59:59.999999'",
    "SELECT id FROM ev WHERE ts BETWEEN TIMESTAMP '0001-01-01' AND TIMESTAMP '1970-01-01 00:00:00'",
    "SELECT id FROM ev WHERE ts IN (TIMESTAMP '2024-11-03 05:30:00', TIMESTAMP_LTZ '2024-03-10 06:59:59.999999')",
    "SELECT id FROM ev WHERE ts <=> TIMESTAMP '2024-01-01 10:00:00.000001' "
    "OR ts >= TIMESTAMP '9999-12-31 23:59:59.999999'",
    "SELECT id, nt FROM ev WHERE nt <= TIMESTAMP_NTZ '2024-03-10 02:30:00' AND nt2 IS NOT NULL",
    "SELECT id FROM ev WHERE nt = TIMESTAMP_NTZ '2024-11-03 01:30:00' OR nt2 = TIMESTAMP_NTZ '0001-01-01 00:00:00'",
    "SELECT id FROM ev WHERE ts <> ts2 OR ts IS NULL",
    "SELECT id FROM ev WHERE nt > nt2",
    # branches, UNION ALL, subqueries, joins
    "SELECT id, CASE WHEN k > 2 THEN ts ELSE ts2 END AS c, COALESCE(ts, ts2) AS co, IF(id = 1, NULL, nt) AS i, "
    "NVL(nt2, nt) AS nv, CASE ts WHEN TIMESTAMP '2024-01-01 10:00:00' THEN 'ten' END AS w FROM ev",
    "SELECT id, ts, nt FROM ev UNION ALL SELECT k, ts2, nt2 FROM ev WHERE ts2 > TIMESTAMP '1970-01-01'",
    "SELECT s.id, s.t FROM (SELECT id, ts AS t FROM ev WHERE ts IS NOT NULL) AS s WHERE s.t < TIMESTAMP '2000-01-01'",
    "SELECT a.id, b.id AS other, b.ts FROM ev AS a JOIN ev AS b ON a.ts = b.ts2",
    "SELECT a.id, b.id AS other, b.nt2 FROM ev AS a LEFT JOIN ev AS b ON a.nt = b.nt2 AND a.k = b.k",
    "SELECT e.id, b.auction, b.ts FROM ev AS e JOIN bid AS b ON b.ts = e.ts2",
]
ZONES = ("UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe")


def _micros(table: pa.Table) -> list[tuple]:
    """Rows as a multiset, timestamps as int64 microseconds: instants compared whatever zone labels them."""
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return _multiset(list(zip(*(c.to_pylist() for c in columns), strict=True)))


def _labelled(data_type: pa.DataType, zone: str) -> str:
    """Spark's type in Arrow as DuckDB renders it: an instant labelled with the connection's TimeZone."""
    return str(pa.timestamp("us", tz=zone)) if pa.types.is_timestamp(data_type) and data_type.tz else str(data_type)


@pytest.mark.parametrize("query", TIMESTAMPS)
def test_timestamps_as_spark_whatever_duckdbs_time_zone(views, query):
    expected = views.sql(query)
    expected_rows = _micros(expected.toArrow())
    translated = duckdb_sql(query, INPUTS)
    for zone in ZONES:
        con = duckdb.connect()
        con.execute(f"SET TimeZone = '{zone}'")
        for name in TABLES:
            con.register(name, _arrow_table(name))
        result = con.sql(translated).to_arrow_table()
        con.close()
        assert result.column_names == expected.columns
        assert [str(t) for t in result.schema.types] == [
            _labelled(_arrow_type(f.dataType), zone) for f in expected.schema.fields
        ]
        assert _micros(result) == expected_rows, zone
        if zone == "UTC":  # as the caller takes it
            assert _micros(conformed(result, expected.schema)) == expected_rows


@pytest.mark.parametrize("query", [q for q in TIMESTAMPS if "TIMESTAMP '" in q])
def test_timestamp_literals_alike_when_spark_types_them_ntz(views, duck, query):
    """spark.sql.timestampType=TIMESTAMP_NTZ types TIMESTAMP '...' as a wall time; compared with an instant in a UTC
    session it is the same instant (which Epochal's conf does not pin, so the literal is never a value)."""
    views.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
    try:
        expected = views.sql(query).toArrow()
    finally:
        views.conf.unset("spark.sql.timestampType")
    assert _micros(duck.sql(duckdb_sql(query, INPUTS)).to_arrow_table()) == _micros(expected)


def test_imports_without_spark():
    code = "import sys, epochal.driver.duck_sql; sys.exit('pyspark' in sys.modules)"  # duck_types, duck_arith too
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
