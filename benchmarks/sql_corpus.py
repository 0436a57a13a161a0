"""Issue 60 item 16: how much SQL that Spark runs in batch Epochal loads, and whether what loads is right.

The corpus is this file's own queries, written in the style of Spark's SQL tests
(``sql/core/src/test/resources/sql-tests/inputs``: projections, functions, aggregates, joins of every
kind, subqueries, set operations, windows, CTEs) over three keyed tables defined here:

* ``t(id BIGINT PRIMARY KEY, k INT, v BIGINT, x DOUBLE, s STRING, ts TIMESTAMP, dt DATE,
  amt DECIMAL(10,2), flag BOOLEAN)``, NULLs in v, x and s;
* ``u(k INT PRIMARY KEY, name STRING, region STRING, w DOUBLE)``, some of t's k have no u row;
* ``e(eid BIGINT PRIMARY KEY, id BIGINT, kind STRING, qty INT)``, events of t's ids.

Each query Spark batch runs over the tables' first state is loaded as a view of its own pipeline
(``refused``: the loader's refusal, grouped by reason). Every view that loads then runs together in one
pipeline, in-process on one SparkSession, through ``--epochs`` epochs: an initial load, then inserts,
updates (some move a t row to another k) and deletes in all three tables. After each epoch each view's
committed state is compared with Spark's batch answer over the same tables (``wrong``: a mismatch; floats
within a relative 1e-8, the noise of summing in another order; arrays compared as multisets, since an
unordered aggregate's order is free).
A view whose step raises is ``failed``; it is dropped and the run starts over without it.

    python benchmarks/sql_corpus.py                 # the driver path (small changes on DuckDB)
    python benchmarks/sql_corpus.py --spark-path    # every step on Spark (EPOCHAL_DRIVER_ROWS=0)
    python benchmarks/sql_corpus.py --only 12,40    # a few queries by number
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import math
import random
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import harness
from harness import log, workdir

T_COLUMNS = (
    "id BIGINT PRIMARY KEY, k INT, v BIGINT, x DOUBLE, s STRING, ts TIMESTAMP, dt DATE, amt DECIMAL(10,2), "
    "flag BOOLEAN"
)
U_COLUMNS = "k INT PRIMARY KEY, name STRING, region STRING, w DOUBLE"
E_COLUMNS = "eid BIGINT PRIMARY KEY, id BIGINT, kind STRING, qty INT"
TABLES = {"t": T_COLUMNS, "u": U_COLUMNS, "e": E_COLUMNS}
KEYS = {"t": "id", "u": "k", "e": "eid"}

QUERIES: list[str] = [
    # --- projections and filters
    "SELECT id, v FROM t",
    "SELECT id, v + 1 AS v1, v * 2 AS v2, -v AS neg FROM t WHERE v IS NOT NULL",
    "SELECT id, k FROM t WHERE k BETWEEN 2 AND 5",
    "SELECT id FROM t WHERE k IN (1, 3, 5) AND flag",
    "SELECT id, s FROM t WHERE s LIKE 'a%'",
    "SELECT id, s FROM t WHERE s RLIKE '^[a-c]'",
    "SELECT id FROM t WHERE v IS NULL OR x IS NULL",
    "SELECT id, coalesce(v, 0) AS v0, nvl(s, 'none') AS s0, ifnull(x, -1.0) AS x0 FROM t",
    "SELECT id, CASE WHEN v > 500 THEN 'big' WHEN v > 100 THEN 'mid' ELSE 'small' END AS band FROM t",
    "SELECT id, if(flag, 'y', 'n') AS f, nullif(k, 3) AS k3 FROM t",
    "SELECT id, greatest(v, k) AS g, least(v, k) AS l FROM t",
    "SELECT id, v % 7 AS m, pmod(v, 7) AS pm, v DIV 3 AS d FROM t",
    "SELECT id, abs(x) AS a, round(x, 2) AS r, floor(x) AS f, ceil(x) AS c FROM t",
    "SELECT id, sqrt(abs(x)) AS q, exp(x / 1000) AS ex, ln(abs(x) + 1) AS l FROM t",
    "SELECT id, pow(k, 2) AS p, sign(x) AS sg, bround(x, 1) AS br FROM t",
    "SELECT id, CAST(v AS STRING) AS vs, CAST(k AS DOUBLE) AS kd, CAST(x AS BIGINT) AS xb FROM t",
    "SELECT id, CAST(amt AS DOUBLE) AS ad, amt * 2 AS a2, amt + 0.5 AS a3 FROM t",
    "SELECT id, try_cast(s AS INT) AS si, try_divide(v, k) AS dv FROM t",
    "SELECT id, v IS DISTINCT FROM k AS dist, v <=> k AS nse FROM t",
    "SELECT DISTINCT k FROM t",
    "SELECT DISTINCT k, flag FROM t",
    "SELECT * FROM t WHERE NOT flag",
    "SELECT id, k FROM t WHERE k = (SELECT max(k) FROM u)",
    # --- strings
    "SELECT id, upper(s) AS us, lower(s) AS ls, length(s) AS n FROM t",
    "SELECT id, concat(s, '-', k) AS c, concat_ws('/', s, name_of_k) AS cw "
    "FROM (SELECT *, CAST(k AS STRING) AS name_of_k FROM t)",
    "SELECT id, substr(s, 1, 2) AS p, substring(s, 2) AS q, left(s, 1) AS l, right(s, 1) AS r FROM t",
    "SELECT id, trim(s) AS t1, ltrim(s) AS t2, rtrim(s) AS t3, lpad(s, 6, '*') AS lp, rpad(s, 6, '*') AS rp FROM t",
    "SELECT id, replace(s, 'a', 'A') AS r, translate(s, 'abc', 'xyz') AS tr, reverse(s) AS rv FROM t",
    "SELECT id, instr(s, 'b') AS i, locate('c', s) AS lc, split(s, 'b') AS parts FROM t",
    "SELECT id, regexp_replace(s, '[aeiou]', '_') AS r, regexp_extract(s, '([a-z])([a-z])', 2) AS x FROM t",
    "SELECT id, initcap(s) AS ic, repeat(s, 2) AS rp, ascii(s) AS a, md5(s) AS h FROM t",
    "SELECT id, sha2(s, 256) AS h, crc32(s) AS c, base64(s) AS b FROM t",
    "SELECT id, format_string('%s:%d', s, k) AS f, printf('%05d', k) AS p FROM t",
    "SELECT id, s || '!' AS bang, char_length(s) AS cl, octet_length(s) AS ol FROM t",
    "SELECT id, startswith(s, 'a') AS sw, endswith(s, 'z') AS ew, contains(s, 'b') AS cn FROM t",
    "SELECT id, split_part(s, 'b', 1) AS sp, soundex(s) AS sx FROM t",
    # --- dates and times
    "SELECT id, year(dt) AS y, month(dt) AS m, dayofmonth(dt) AS d, dayofweek(dt) AS dw FROM t",
    "SELECT id, date_add(dt, 3) AS d3, date_sub(dt, 1) AS d1, datediff(dt, DATE'2024-01-01') AS dd FROM t",
    "SELECT id, hour(ts) AS h, minute(ts) AS mi, second(ts) AS se FROM t",
    "SELECT id, date_trunc('HOUR', ts) AS h, trunc(dt, 'MM') AS m FROM t",
    "SELECT id, date_format(ts, 'yyyy-MM-dd HH:mm') AS f, to_date(ts) AS d FROM t",
    "SELECT id, ts + INTERVAL 1 HOUR AS later, dt + INTERVAL 2 DAYS AS dl FROM t",
    "SELECT id, unix_timestamp(ts) AS u, from_unixtime(unix_timestamp(ts)) AS f FROM t",
    "SELECT id, last_day(dt) AS ld, next_day(dt, 'MON') AS nd, add_months(dt, 1) AS am FROM t",
    "SELECT id, months_between(ts, TIMESTAMP'2024-01-01 00:00:00') AS mb, weekofyear(dt) AS w FROM t",
    "SELECT id, extract(YEAR FROM dt) AS y, date_part('day', dt) AS d, quarter(dt) AS q FROM t",
    "SELECT id, make_date(2024, k + 1, 1) AS md, to_timestamp('2024-02-03 04:05:06') AS tt FROM t",
    "SELECT id, CAST(ts AS DATE) AS d, CAST(dt AS TIMESTAMP) AS t2, CAST(ts AS STRING) AS s2 FROM t",
    "SELECT id, window(ts, '1 hour').start AS ws FROM t",
    "SELECT id, timestampadd(MINUTE, 30, ts) AS t30, timestampdiff(HOUR, TIMESTAMP'2024-01-01', ts) AS hd FROM t",
    # --- arrays, maps, structs, json
    "SELECT id, array(k, v) AS a, size(array(k, v)) AS n FROM t",
    "SELECT id, named_struct('k', k, 's', s) AS st FROM t",
    "SELECT id, map('k', k) AS m FROM t",
    "SELECT id, array_contains(array(1, 2, 3), k) AS c, element_at(array(k, k + 1), 2) AS e2 FROM t",
    "SELECT id, to_json(named_struct('k', k, 'v', v)) AS j FROM t",
    "SELECT id, get_json_object(to_json(named_struct('k', k)), '$.k') AS jk FROM t",
    "SELECT id, from_json(to_json(named_struct('k', k)), 'k INT').k AS back FROM t",
    "SELECT id, sort_array(array(v, k, id)) AS sa, array_max(array(v, k)) AS mx FROM t",
    "SELECT id, transform(array(k, v), z -> z + 1) AS tr, filter(array(k, v), z -> z > 2) AS fl FROM t",
    "SELECT id, aggregate(array(k, v), 0L, (acc, z) -> acc + coalesce(z, 0)) AS sm FROM t",
    "SELECT id, exists(array(k, v), z -> z > 100) AS ex FROM t",
    "SELECT id, array_distinct(array(k, k, v)) AS ad, array_union(array(k), array(v)) AS au FROM t",
    "SELECT id, explode_outer_ok FROM t LATERAL VIEW OUTER explode(array(k, v)) x AS explode_outer_ok",
    "SELECT id, part FROM t LATERAL VIEW explode(split(s, 'b')) x AS part",
    "SELECT id, pos, val FROM t LATERAL VIEW posexplode(array(k, v)) x AS pos, val",
    "SELECT id, CAST(amt AS VARIANT) AS var FROM t",
    "SELECT id, parse_json(to_json(named_struct('k', k))) AS pj FROM t",
    "SELECT id, struct(k, s).k AS sk FROM t",
    # --- aggregates
    "SELECT count(*) AS n FROM t",
    "SELECT count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM t",
    "SELECT k, count(*) AS n FROM t GROUP BY k",
    "SELECT k, sum(v) AS s, avg(v) AS a, count(v) AS nv FROM t GROUP BY k",
    "SELECT k, min(s) AS lo, max(s) AS hi FROM t GROUP BY k",
    "SELECT k, count(DISTINCT s) AS ds FROM t GROUP BY k",
    "SELECT k, sum(DISTINCT v) AS sdv FROM t GROUP BY k",
    "SELECT k, flag, count(*) AS n FROM t GROUP BY k, flag",
    "SELECT k, sum(x) AS sx, avg(x) AS ax FROM t GROUP BY k",
    "SELECT k, stddev(x) AS sd, variance(x) AS va, stddev_pop(x) AS sp FROM t GROUP BY k",
    "SELECT k, sum(amt) AS sa, avg(amt) AS aa, max(amt) AS ma FROM t GROUP BY k",
    "SELECT k, count_if(flag) AS f, bool_and(flag) AS ba, bool_or(flag) AS bo FROM t GROUP BY k",
    "SELECT k, every(v > 0) AS ev, some(v > 900) AS so, any(flag) AS an FROM t GROUP BY k",
    "SELECT k, max_by(id, v) AS mb, min_by(id, v) AS nb FROM t GROUP BY k",
    "SELECT k, max_by(s, x) AS mbs FROM t GROUP BY k",
    "SELECT k, collect_list(v) AS vs FROM t GROUP BY k",
    "SELECT k, collect_set(s) AS ss FROM t GROUP BY k",
    "SELECT k, array_agg(id) AS ids FROM t GROUP BY k",
    "SELECT k, sort_array(collect_list(v)) AS vs FROM t GROUP BY k",
    "SELECT k, size(collect_set(s)) AS n FROM t GROUP BY k",
    "SELECT k, first(v) AS fv FROM t GROUP BY k",
    "SELECT k, approx_count_distinct(s) AS acd FROM t GROUP BY k",
    "SELECT k, percentile(v, 0.5) AS med FROM t GROUP BY k",
    "SELECT k, median(x) AS med FROM t GROUP BY k",
    "SELECT k, percentile_approx(v, 0.5) AS pa FROM t GROUP BY k",
    "SELECT k, bit_and(v) AS ba, bit_or(v) AS bo, bit_xor(v) AS bx FROM t GROUP BY k",
    "SELECT k, corr(x, v) AS c, covar_pop(x, v) AS cp FROM t GROUP BY k",
    "SELECT k, sum(v) AS s FROM t GROUP BY k HAVING sum(v) > 1000",
    "SELECT k, count(*) AS n FROM t GROUP BY k HAVING count(*) > 2 AND max(v) < 990",
    "SELECT k % 3 AS g, sum(v) AS s FROM t GROUP BY k % 3",
    "SELECT upper(s) AS us, count(*) AS n FROM t GROUP BY upper(s)",
    "SELECT date_trunc('HOUR', ts) AS h, count(*) AS n, sum(amt) AS a FROM t GROUP BY date_trunc('HOUR', ts)",
    "SELECT dt, count(*) AS n FROM t GROUP BY dt",
    "SELECT window(ts, '1 hour') AS w, count(*) AS n FROM t GROUP BY window(ts, '1 hour')",
    "SELECT k, sum(v) FILTER (WHERE flag) AS sf, count(*) FILTER (WHERE v > 500) AS cb FROM t GROUP BY k",
    "SELECT k, sum(CASE WHEN flag THEN v ELSE 0 END) AS s FROM t GROUP BY k",
    "SELECT flag, avg(v) AS a, count(*) AS n FROM t GROUP BY flag",
    "SELECT k, s, count(*) AS n FROM t GROUP BY ROLLUP(k, s)",
    "SELECT k, flag, sum(v) AS s FROM t GROUP BY CUBE(k, flag)",
    "SELECT k, flag, sum(v) AS s FROM t GROUP BY GROUPING SETS ((k), (flag), ())",
    "SELECT k, flag, grouping(flag) AS gf, sum(v) AS s FROM t GROUP BY ROLLUP(k, flag)",
    "SELECT max(v) - min(v) AS spread, count(DISTINCT k) AS ks FROM t",
    "SELECT sum(v) / count(*) AS mean FROM t",
    "SELECT k, avg(v) AS a FROM t WHERE flag GROUP BY k",
    "SELECT kind, sum(qty) AS q, count(*) AS n FROM e GROUP BY kind",
    "SELECT id, count(*) AS n, sum(qty) AS q FROM e GROUP BY id",
    "SELECT region, count(*) AS n, avg(w) AS aw FROM u GROUP BY region",
    # --- joins
    "SELECT t.id, t.v, u.name FROM t JOIN u ON t.k = u.k",
    "SELECT t.id, u.name FROM t LEFT JOIN u ON t.k = u.k",
    "SELECT t.id, u.k, u.name FROM t RIGHT JOIN u ON t.k = u.k",
    "SELECT t.id, u.k AS uk FROM t FULL OUTER JOIN u ON t.k = u.k",
    "SELECT t.id, e.eid, e.qty FROM t JOIN e ON t.id = e.id",
    "SELECT t.id, u.name, e.kind FROM t JOIN u ON t.k = u.k JOIN e ON e.id = t.id",
    "SELECT t.id, u.name FROM t JOIN u USING (k)",
    "SELECT t.id, u.name FROM t NATURAL JOIN u",
    "SELECT t.id, u.name FROM t JOIN u ON t.k = u.k AND t.v > u.w",
    "SELECT t.id, u.name FROM t JOIN u ON t.k = u.k WHERE u.region = 'north'",
    "SELECT t.id, u.name FROM t, u WHERE t.k = u.k",
    "SELECT t.id, u.k AS uk FROM t, u WHERE t.k < u.k AND t.v > 900",
    "SELECT t.id, u.name FROM t CROSS JOIN u WHERE t.k = u.k AND t.flag",
    "SELECT u.name, e.kind FROM u CROSS JOIN (SELECT DISTINCT kind FROM e) e",
    "SELECT t.id FROM t LEFT SEMI JOIN u ON t.k = u.k",
    "SELECT t.id FROM t LEFT ANTI JOIN u ON t.k = u.k",
    "SELECT t.id, u.name FROM t JOIN u ON t.k = u.k OR t.v = u.k",
    "SELECT t.id, u.name FROM t JOIN u ON t.k + 1 = u.k",
    "SELECT a.id AS a_id, b.id AS b_id FROM t a JOIN t b ON a.k = b.k AND a.id < b.id WHERE a.v > 950",
    "SELECT u.region, count(*) AS n, sum(t.v) AS s FROM t JOIN u ON t.k = u.k GROUP BY u.region",
    "SELECT u.name, count(t.id) AS n FROM u LEFT JOIN t ON t.k = u.k GROUP BY u.name",
    "SELECT t.k, sum(e.qty) AS q FROM t JOIN e ON t.id = e.id GROUP BY t.k",
    "SELECT t.id, t.v, u.name FROM t JOIN u ON t.k = u.k WHERE t.s LIKE '%b%'",
    "SELECT t.id, coalesce(u.name, 'orphan') AS nm FROM t LEFT JOIN u ON t.k = u.k",
    "SELECT u.k, e.eid FROM u JOIN t ON t.k = u.k JOIN e ON e.id = t.id WHERE e.qty > 5",
    # --- subqueries
    "SELECT id FROM t WHERE k IN (SELECT k FROM u WHERE region = 'north')",
    "SELECT id FROM t WHERE k NOT IN (SELECT k FROM u)",
    "SELECT id FROM t WHERE EXISTS (SELECT 1 FROM e WHERE e.id = t.id)",
    "SELECT id FROM t WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.id = t.id)",
    "SELECT id FROM t WHERE flag OR EXISTS (SELECT 1 FROM e WHERE e.id = t.id AND e.qty > 8)",
    "SELECT id, EXISTS (SELECT 1 FROM e WHERE e.id = t.id) AS has_e FROM t",
    "SELECT id, (SELECT count(*) FROM e WHERE e.id = t.id) AS ne FROM t",
    "SELECT id, (SELECT name FROM u WHERE u.k = t.k) AS nm FROM t",
    "SELECT id FROM t WHERE v > (SELECT avg(v) FROM t)",
    "SELECT id FROM t WHERE v > (SELECT avg(v) FROM t t2 WHERE t2.k = t.k)",
    "SELECT k, n FROM (SELECT k, count(*) AS n FROM t GROUP BY k) WHERE n > 3",
    "SELECT s2.k, s2.total FROM (SELECT k, sum(v) AS total FROM t GROUP BY k) s2 JOIN u ON s2.k = u.k",
    "SELECT id FROM t WHERE (k, flag) IN (SELECT k, true FROM u)",
    # --- set operations
    "SELECT k FROM t UNION SELECT k FROM u",
    "SELECT k FROM t UNION ALL SELECT k FROM u",
    "SELECT k FROM t INTERSECT SELECT k FROM u",
    "SELECT k FROM t EXCEPT SELECT k FROM u",
    "SELECT k FROM u EXCEPT ALL SELECT k FROM t",
    "SELECT k FROM t INTERSECT ALL SELECT k FROM u",
    "SELECT id, v FROM t WHERE flag UNION ALL SELECT eid, qty FROM e WHERE qty > 5",
    # --- windows, top-N, ordering
    "SELECT id, k, row_number() OVER (PARTITION BY k ORDER BY v DESC, id) AS rn FROM t",
    "SELECT id, k, rank() OVER (PARTITION BY k ORDER BY v) AS r, "
    "dense_rank() OVER (PARTITION BY k ORDER BY v) AS d FROM t",
    "SELECT id, k, sum(v) OVER (PARTITION BY k) AS ks FROM t",
    "SELECT id, k, lag(v) OVER (PARTITION BY k ORDER BY id) AS pv, "
    "lead(v) OVER (PARTITION BY k ORDER BY id) AS nv FROM t",
    "SELECT id, sum(v) OVER (PARTITION BY k ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS rs FROM t",
    "SELECT id, count(*) OVER (PARTITION BY k) AS n FROM t",
    "SELECT id, k, v FROM (SELECT *, row_number() OVER (PARTITION BY k ORDER BY v DESC, id) AS rn FROM t) "
    "WHERE rn <= 2",
    "SELECT id, k, v FROM t QUALIFY row_number() OVER (PARTITION BY k ORDER BY v DESC, id) = 1",
    "SELECT id, v FROM t ORDER BY v DESC, id LIMIT 5",
    "SELECT k, sum(v) AS s FROM t GROUP BY k ORDER BY s DESC, k LIMIT 3",
    "SELECT id, percent_rank() OVER (PARTITION BY k ORDER BY v) AS pr, "
    "ntile(2) OVER (PARTITION BY k ORDER BY id) AS nt FROM t",
    "SELECT id, first_value(v) OVER (PARTITION BY k ORDER BY id) AS fv FROM t",
    "SELECT id, sum(v) OVER (ORDER BY id) AS running FROM t",
    # --- CTEs and nesting
    "WITH big AS (SELECT * FROM t WHERE v > 500) SELECT k, count(*) AS n FROM big GROUP BY k",
    "WITH a AS (SELECT k, sum(v) AS s FROM t GROUP BY k), "
    "b AS (SELECT k, count(*) AS c FROM e JOIN t USING (id) GROUP BY k) "
    "SELECT a.k, a.s, b.c FROM a JOIN b ON a.k = b.k",
    "WITH x AS (SELECT id, v FROM t) SELECT * FROM x WHERE v IS NOT NULL",
    "SELECT k, max(n) AS mx FROM (SELECT k, id, count(*) AS n FROM t JOIN e USING (id) GROUP BY k, id) GROUP BY k",
    "SELECT region, sum(s) AS total FROM (SELECT u.region, t.v AS s FROM t JOIN u ON t.k = u.k) GROUP BY region",
    "SELECT k, avg(s) AS a FROM (SELECT k, sum(v) AS s FROM t GROUP BY k, flag) GROUP BY k",
    "SELECT DISTINCT u.region FROM t JOIN u ON t.k = u.k WHERE t.flag",
    # --- types
    "SELECT id, CAST('12:34:56' AS TIME) AS tm FROM t",
    "SELECT id, X'1F' AS bin, CAST(s AS BINARY) AS sb FROM t",
    "SELECT id, INTERVAL '1' DAY AS one_day FROM t",
    "SELECT id, ts - TIMESTAMP'2024-01-01 00:00:00' AS since FROM t",
    "SELECT id, CAST(v AS DECIMAL(20, 4)) / 3 AS third FROM t",
    "SELECT id, CAST(k AS TINYINT) AS tk, CAST(k AS SMALLINT) AS sk, CAST(v AS FLOAT) AS fv FROM t",
    "SELECT id, uuid_ok FROM (SELECT id, md5(CAST(id AS STRING)) AS uuid_ok FROM t)",
    "SELECT id, typeof(amt) AS ty, hash(id, s) AS h, xxhash64(s) AS xh FROM t",
]


# ------------------------------------------------------------------------------------------ data


class Tables:
    """The three tables' current state (key -> row) and the log lines of each epoch's change."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.rows: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in TABLES}
        self.next_id = {"t": 1, "u": 0, "e": 1}

    def _t_row(self, key: int) -> dict[str, Any]:
        r = self.rng
        return {
            "id": key,
            "k": r.randrange(0, 12),
            "v": None if r.random() < 0.1 else r.randrange(0, 1000),
            "x": None if r.random() < 0.1 else round(r.uniform(-500, 500), 3),
            "s": None if r.random() < 0.08 else "".join(r.choice("abcde ") for _ in range(r.randrange(1, 6))),
            "ts": f"2024-03-0{r.randrange(1, 4)} {r.randrange(24):02d}:{r.randrange(60):02d}:{r.randrange(60):02d}",
            "dt": f"2024-0{r.randrange(1, 10)}-{r.randrange(1, 28):02d}",
            "amt": round(r.uniform(0, 9999), 2),
            "flag": r.random() < 0.5,
        }

    def _u_row(self, key: int) -> dict[str, Any]:
        r = self.rng
        region = r.choice(["north", "south", "east"])
        return {"k": key, "name": f"n{key}", "region": region, "w": round(r.uniform(0, 900), 1)}

    def _e_row(self, key: int) -> dict[str, Any]:
        r = self.rng
        ids = list(self.rows["t"]) or [1]
        return {"eid": key, "id": r.choice(ids), "kind": r.choice(["click", "view", "buy"]), "qty": r.randrange(0, 10)}

    def change(self, initial: bool) -> dict[str, list[str]]:
        """One epoch's change: the initial load, or about 15% of each table's rows changed."""
        lines: dict[str, list[str]] = defaultdict(list)
        make = {"t": self._t_row, "u": self._u_row, "e": self._e_row}
        sizes = {"t": 120, "u": 9, "e": 150} if initial else {"t": 8, "u": 1, "e": 10}
        for name in ("t", "u", "e"):  # e draws ids from t
            rows = self.rows[name]
            if not initial:
                for key in self.rng.sample(sorted(rows), min(len(rows), sizes[name])):
                    if self.rng.random() < 0.3:
                        del rows[key]
                        lines[name].append(json.dumps({KEYS[name]: key, "_op": "delete"}))
                    else:
                        rows[key] = make[name](key)  # an update; a t row may move to another k
                        lines[name].append(json.dumps(rows[key]))
            for _ in range(sizes[name]):
                key = self.next_id[name]
                self.next_id[name] += 1
                rows[key] = make[name](key)
                lines[name].append(json.dumps(rows[key]))
        return lines

    def register(self, spark: Any) -> None:
        """The current state as Spark temp views t, u, e, for the batch answer."""
        for name, columns in TABLES.items():
            schema = columns.replace(" PRIMARY KEY", "")
            lines = [json.dumps(r) for r in self.rows[name].values()]
            spark.read.schema(schema).json(spark.sparkContext.parallelize(lines, 1)).createOrReplaceTempView(name)


# -------------------------------------------------------------------------------------- loading


def sources_sql(data_dir: Path) -> str:
    return "".join(
        f"CREATE TABLE {name} ({columns})\nWITH (connector = 'log', path = '{data_dir / name}', format = 'json');\n"
        for name, columns in TABLES.items()
    )


def view_name(number: int) -> str:
    return f"q{number:03d}"


def refusal_reason(message: str) -> str:
    """A refusal's reason without the view's name, file and line, so equal reasons group."""
    text = " ".join(message.split())
    text = re.sub(r"^pipeline has \d+ error\(s\): ", "", text)
    text = re.sub(r"\S+\.sql:\d+(:\d+)?:? ?", "", text)
    text = re.sub(r"\bq\d{3}\b", "<view>", text)
    return text[:220]


def try_load(root: Path, data_dir: Path, number: int, query: str) -> str | None:
    """None if the loader takes ``query`` as a view, else its refusal."""
    from epochal.errors import EpochalError
    from epochal.pipeline.loader import load_pipeline

    probe = root / "probe" / view_name(number)
    probe.mkdir(parents=True)
    (probe / "01_sources.sql").write_text(sources_sql(data_dir))
    (probe / "02_view.sql").write_text(f"CREATE MATERIALIZED VIEW {view_name(number)} AS\n{query};\n")
    try:
        load_pipeline(probe)
    except EpochalError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------ comparing


def normal(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, decimal.Decimal):
        return float(f"{float(value):.9g}")
    if isinstance(value, (list, tuple)) and not hasattr(value, "asDict"):
        return tuple(sorted((normal(v) for v in value), key=repr))
    if hasattr(value, "asDict"):
        return tuple(normal(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((normal(k), normal(v)) for k, v in value.items()))
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time, dt.timedelta)):
        return str(value)
    if value is not None and type(value).__name__ == "VariantVal":
        return str(value)
    return value


def close(a: Any, b: Any) -> bool:
    """Equal, floats within a relative 1e-8 (of values rounded to 9 digits): a sum's last digits depend
    on the order Spark adds in, which differs between a batch and a group recomputed from its changes."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-8, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def coarse(row: tuple) -> str:
    return repr(tuple(float(f"{v:.5g}") if isinstance(v, float) else v for v in row))


def rows_of(frame: Any, columns: list[str]) -> Counter:
    return Counter(tuple(normal(row[c]) for c in range(len(columns))) for row in frame.select(*columns).collect())


def compare(spark: Any, runtime: Any, name: str, query: str) -> str | None:
    expected_frame = spark.sql(query)
    columns = expected_frame.columns
    expected = Counter(tuple(normal(v) for v in row) for row in expected_frame.collect())
    got = rows_of(runtime.state(name), [f"`{c}`" for c in columns])
    if expected == got:
        return None
    missing, extra = expected - got, got - expected
    left, right = sorted(missing.elements(), key=coarse), sorted(extra.elements(), key=coarse)
    if len(left) == len(right) and all(close(a, b) for a, b in zip(left, right, strict=True)):
        return None
    return (f"{sum(missing.values())} row(s) missing (e.g. {list(missing)[:2]}), "
            f"{sum(extra.values())} extra (e.g. {list(extra)[:2]})")


# ------------------------------------------------------------------------------------------ run


def run_epochs(root: Path, spark: Any, views: dict[int, str], epochs: int, seed: int, knobs: dict[str, str],
               attempt: int) -> tuple[dict[int, str], dict[int, str]]:
    """All ``views`` in one pipeline through ``epochs`` epochs: (wrong, failed). Stops at the first
    failure: Spark's analysis of the plans refusing some (every one it names), or a view's step."""
    from epochal.errors import PipelineError
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings

    base = root / f"run{attempt}"
    data_dir = base / "data"
    pipeline_dir = base / "pipeline"
    pipeline_dir.mkdir(parents=True)
    (pipeline_dir / "01_sources.sql").write_text(sources_sql(data_dir))
    (pipeline_dir / "02_views.sql").write_text(
        "".join(f"CREATE MATERIALIZED VIEW {view_name(n)} AS\n{q};\n\n" for n, q in views.items())
    )
    settings = Settings.from_env({"EPOCHAL_HOME": str(base / "home"), "EPOCHAL_PIPELINE": str(pipeline_dir), **knobs})
    runtime = EpochRuntime(settings, load_pipeline(pipeline_dir), lambda: spark)
    by_table = {view_name(n): n for n in views}
    tables = Tables(seed)
    from epochal.connectors.log import append_records

    wrong: dict[int, str] = {}
    for index in range(epochs):
        for name, lines in tables.change(initial=index == 0).items():
            append_records(data_dir / name, lines, split=str(index))
        try:
            record, _ = runtime.start_epoch(None, None)  # (the first analyses every plan on Spark)
        except PipelineError as exc:
            failed: dict[int, str] = {}
            for issue in exc.issues:
                text = " ".join(str(issue).split())
                for number in {int(m) for m in re.findall(r"\bq(\d{3})(?!\d)", text)} & set(views):
                    failed[number] = f"epoch {index + 1}, Spark's analysis of the plan: {text[:500]}"
            if not failed:
                raise
            return wrong, failed
        for source in runtime.pipeline.sources:
            runtime.run_source(record.epoch, source)
        for table in runtime.pipeline.view_order():
            try:
                runtime.run_view(record.epoch, table)
            except Exception as exc:  # noqa: BLE001 (the corpus reports every failure)
                owner = by_table[table.split("__")[0]]
                detail = " ".join("".join(traceback.format_exception_only(exc)).split())
                return wrong, {owner: f"epoch {index + 1}, step {table}: {detail[:600]}"}
        runtime.commit(record.epoch)
        tables.register(spark)
        for number, query in views.items():
            if number in wrong:
                continue
            try:
                problem = compare(spark, runtime, view_name(number), query)
            except Exception as exc:  # noqa: BLE001
                problem = f"comparison raised: {' '.join(str(exc).split())[:300]}"
            if problem:
                wrong[number] = f"after epoch {index + 1}: {problem}"
        log(f"epoch {index + 1}/{epochs} committed; wrong so far: {sorted(wrong)}")
    return wrong, {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=60)
    p.add_argument("--spark-path", action="store_true", help="every step on Spark (EPOCHAL_DRIVER_ROWS=0)")
    p.add_argument("--only", help="comma-separated query numbers (as printed)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--load-only", action="store_true", help="only what loads and what is refused, no epochs")
    p.add_argument("--json", help="result file (default benchmarks/results/sql_corpus-<time>.json)")
    args = p.parse_args(argv)
    from epochal.spark.session import build_spark_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"}
    spark = build_spark_session(master="local[2]", app_name="sql-corpus", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    chosen = {int(n) for n in args.only.split(",")} if args.only else None
    queries = {n: q for n, q in enumerate(QUERIES, 1) if chosen is None or n in chosen}
    knobs = {"EPOCHAL_DRIVER_ROWS": "0"} if args.spark_path else {}
    started = time.monotonic()
    with workdir("sql_corpus", keep=args.keep) as root:
        first = Tables(args.seed)
        first.change(initial=True)
        first.register(spark)
        spark_runs: dict[int, str] = {}
        not_spark: dict[int, str] = {}
        for n, q in queries.items():
            try:
                spark.sql(q).collect()
                spark_runs[n] = q
            except Exception as exc:  # noqa: BLE001
                not_spark[n] = " ".join(str(exc).split())[:200]
        refused: dict[int, str] = {}
        loaded: dict[int, str] = {}
        for n, q in spark_runs.items():
            problem = try_load(root, root / "probe-data", n, q)
            if problem is None:
                loaded[n] = q
            else:
                refused[n] = problem
        failed: dict[int, str] = {}
        remaining = {} if args.load_only else dict(loaded)
        wrong: dict[int, str] = {}
        for attempt in range(len(loaded) + 1):
            if not remaining:
                break
            wrong, failures = run_epochs(root, spark, remaining, args.epochs, args.seed, knobs, attempt)
            if not failures:
                break
            failed.update(failures)
            for number in failures:  # and start over without them
                remaining.pop(number, None)
    for number, message in list(failed.items()):
        if "which a view cannot store" in message:  # a refusal by name, from the analysis before epoch 1
            refused[number] = failed.pop(number)
    print_report(queries, not_spark, spark_runs, loaded, refused, failed, wrong, time.monotonic() - started,
                 ran=not args.load_only)
    figures = {"queries": len(queries), "spark_runs": len(spark_runs), "loaded": len(loaded), "epochs": args.epochs,
               "spark_path": args.spark_path, "refused": refused, "failed": failed, "wrong": wrong,
               "not_spark": not_spark}
    log(f"figures in {harness.save(harness.result_path('sql_corpus', args.json), figures)}")
    return 0


def print_report(queries: dict[int, str], not_spark: dict[int, str], spark_runs: dict[int, str],
                 loaded: dict[int, str], refused: dict[int, str], failed: dict[int, str], wrong: dict[int, str],
                 seconds: float, ran: bool) -> None:
    print(f"\n== sql_corpus: {len(queries)} queries, {len(spark_runs)} run by Spark batch over t, u, e "
          f"({len(not_spark)} not; skipped)")
    share = 100 * len(refused) / max(1, len(spark_runs))
    checked = f"failed {len(failed)}, wrong {len(wrong)}, right {len(loaded) - len(failed) - len(wrong)}" if ran \
        else "no epochs run (--load-only)"
    print(f"loaded {len(loaded)}, refused {len(refused)} ({share:.1f}% of what Spark runs), {checked}; {seconds:.0f}s")
    groups: dict[str, list[int]] = defaultdict(list)
    for n, message in refused.items():
        groups[refusal_reason(message)].append(n)
    if groups:
        print("\nrefused, by reason:")
        for reason, numbers in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(numbers):3d}  {reason}\n       {', '.join(view_name(n) for n in numbers)}")
    for title, found in (("failed", failed), ("wrong", wrong)):
        if found:
            print(f"\n{title}:")
            for n, message in sorted(found.items(), key=lambda kv: kv[0] or 0):
                print(f"  {view_name(n or 0)}  {queries.get(n, '?')}\n       {message}")
    if not_spark:
        print("\nnot run by Spark (not counted):")
        for n, message in not_spark.items():
            print(f"  {view_name(n)}  {message[:150]}")


if __name__ == "__main__":
    harness.log  # noqa: B018 (this checkout first, EPOCHAL_* dropped: imported above)
    sys.exit(main())
