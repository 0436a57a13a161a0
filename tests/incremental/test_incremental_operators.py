"""Property-based tests of every stateful view operator (issue 3): random epochs of inserts, updates
and deletes on two keyed log sources, run through EpochRuntime, and after every epoch every view's
committed state compared with a batch oracle.

The oracle is independent of Epochal: the source rows come from a Python model of the upsert
semantics (a dict per source: the last record of a key wins, a delete removes the key), and each view
is its own SQL run by Spark as a plain batch query over those rows (views on views over the oracle's
results for their upstreams). The committed source state is checked against the same model.

Comparison: multisets of rows, exact except that floating point values are rounded to
``FLOAT_DIGITS`` decimal places (tolerance 5e-7 absolute). Prices are multiples of 0.25, so sums
are exact in binary; averages are rationals with small denominators, never close to a rounding
boundary, so rounding cannot split two values that differ only by summation order.

``FORCE_FULL`` decides how views are maintained: True adds ``WITH (refresh = 'full')`` (recompute and
diff, the reference implementation), False leaves the default so the incremental planner maintains
them. ``TESTS_OPERATORS_MODE=full|incremental`` overrides it; ``TESTS_HYPOTHESIS_EXAMPLES`` sets
how many random change sequences run (the explicit corner cases always run).

Cost, measured on the 2-core test machine while other suites ran (load average 12-18): one epoch of
the 25 views takes 90-130 s in full mode and 120-300 s incrementally, plus 30-80 s for the check,
so the default (the two explicit sequences merged into one of 4 epochs, + 1 random one of 2-3
epochs) runs for several minutes there; on an idle machine the same work is several times faster.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from epochal.sql import quote
from tests.consistency import frame

#: True: every view WITH (refresh = 'full'); False: every view maintained incrementally (the planner
#: loads every view here since 0c89c50; full mode passes, see the module docstring for timings).
FORCE_FULL = False
FULL = os.environ.get("TESTS_OPERATORS_MODE", "full" if FORCE_FULL else "incremental") == "full"
#: Random change sequences per run (each costs a few epochs of the whole pipeline, ~4 min in CI).
#: The suite draws one, so every CI run still explores a new sequence while staying under its time
#: budget; a deeper search is `TESTS_HYPOTHESIS_EXAMPLES=20 python -m pytest -k every_view
#: tests/incremental/test_incremental_operators.py` (docs/development.md).
EXAMPLES = int(os.environ.get("TESTS_HYPOTHESIS_EXAMPLES", "1"))
FLOAT_DIGITS = 6

# ---------------------------------------------------------------------------------------------------
# The pipeline: two keyed sources, one view per operator or combination of operators.

SOURCES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, item STRING, qty BIGINT, price DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE TABLE customers (id BIGINT PRIMARY KEY, region STRING, tier BIGINT)
WITH (connector = 'log', path = 'data/customers', format = 'json');
"""

#: name -> query, in an order where every view comes after the views it reads.
VIEWS: dict[str, str] = {
    # GROUP BY with every plain aggregate (MIN/MAX over numbers, strings and timestamps); a NULL group
    # key is a group of its own. MIN/MAX must stay right when the current extreme is deleted (it
    # keeps one value per group: MIN_MAX_CACHE); a group whose last row goes must disappear.
    "agg_basic": """
SELECT cust, count(*) AS n, count(qty) AS n_qty, sum(qty) AS qty, sum(price) AS total,
       avg(price) AS avg_price, min(price) AS lo, max(price) AS hi, min(item) AS first_item,
       max(ts) AS last_ts
FROM orders GROUP BY cust""",
    # COUNT(DISTINCT), SUM(DISTINCT) and AVG(DISTINCT): duplicates must count once, and only until
    # the last copy goes.
    "agg_distinct": """
SELECT item, count(DISTINCT cust) AS custs, count(DISTINCT qty) AS qtys, sum(DISTINCT qty) AS qty_sum,
       avg(DISTINCT price) AS avg_price
FROM orders GROUP BY item""",
    # Aggregate FILTER (WHERE ...) and HAVING: groups enter and leave the view as counts cross 2.
    "agg_filter_having": """
SELECT cust, item, count(*) AS n, count(*) FILTER (WHERE qty >= 2) AS big,
       sum(price) FILTER (WHERE price > 1) AS pricey, max(ts) FILTER (WHERE qty IS NOT NULL) AS last_ts,
       count(DISTINCT qty) FILTER (WHERE price IS NOT NULL) AS priced_qtys
FROM orders GROUP BY cust, item HAVING count(*) >= 2""",
    # An aggregate without GROUP BY: always exactly one row, count 0 and NULLs on an empty table.
    "agg_global": """
SELECT count(*) AS n, sum(price) AS total, min(ts) AS first_ts, max(ts) AS last_ts,
       count(DISTINCT item) AS items, max(qty) AS top_qty
FROM orders""",
    # The same over all rows with only what partial state keeps (no DISTINCT): the one row is
    # updated in place, and the input is reread only when the two kept values of a MIN/MAX (or a
    # float SUM's values) lose one.
    "agg_global_partial": """
SELECT count(*) AS n, count(qty) AS n_qty, sum(qty) AS qty, avg(price) AS avg_price, min(ts) AS first_ts,
       max(price) AS hi
FROM orders""",
    # DISTINCT: a row stays while any copy of it remains.
    "distinct_pairs": "SELECT DISTINCT cust, item FROM orders",
    # Equi-joins of each kind; NULL keys never match; outer sides are NULL-padded.
    "join_inner": """
SELECT o.id, o.qty, c.region, c.tier FROM orders o JOIN customers c ON o.cust = c.id""",
    "join_left": """
SELECT o.id, o.cust, c.region FROM orders o LEFT JOIN customers c ON o.cust = c.id""",
    "join_right": """
SELECT c.id AS cid, o.id AS oid, o.price FROM orders o RIGHT JOIN customers c ON o.cust = c.id""",
    "join_full": """
SELECT o.id AS oid, o.cust, c.id AS cid, c.region FROM orders o FULL OUTER JOIN customers c ON o.cust = c.id""",
    # A self-join whose output has duplicate rows (no key in it), and a two-column join key.
    "self_join": """
SELECT a.item, b.qty, b.region_hint
FROM orders a
JOIN (SELECT cust, item, qty, CASE WHEN qty >= 2 THEN 'hi' ELSE 'lo' END AS region_hint FROM orders) b
  ON a.cust = b.cust AND a.item = b.item""",
    # Several joins in one query: inner, left over a subquery in FROM with its own aggregate, and a
    # self-join of customers on a non-key column.
    "join_multi": """
SELECT o.id, c.region, r.n AS region_customers, p.id AS peer
FROM orders o
JOIN customers c ON o.cust = c.id
LEFT JOIN (SELECT region, count(*) AS n FROM customers GROUP BY region) r ON r.region = c.region
LEFT JOIN customers p ON p.tier = c.tier AND p.region = c.region""",
    # IN subquery.
    "semi_in": """
SELECT id, cust, qty FROM orders WHERE cust IN (SELECT id FROM customers WHERE region = 'eu')""",
    # Correlated EXISTS / NOT EXISTS.
    "semi_exists": """
SELECT c.id, c.region FROM customers c
WHERE EXISTS (SELECT 1 FROM orders o WHERE o.cust = c.id AND o.qty >= 2)""",
    "anti_not_exists": """
SELECT c.id, c.tier FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.cust = c.id)""",
    # A CTE and a subquery in FROM, aggregated, joined and aggregated again.
    "cte_region_qty": """
WITH per_cust AS (SELECT cust, sum(qty) AS q, count(*) AS n FROM orders GROUP BY cust)
SELECT c.region, sum(p.q) AS q, sum(p.n) AS n, count(*) AS custs
FROM per_cust p JOIN (SELECT id, region FROM customers WHERE tier IS NOT NULL) c ON p.cust = c.id
GROUP BY c.region""",
    # UNION ALL of a stateful branch (an aggregate), a join and a plain filter: duplicates kept.
    "union_all": """
SELECT cust AS k, 'agg' AS kind, count(*) AS v FROM orders GROUP BY cust
UNION ALL
SELECT o.cust, 'join', c.tier FROM orders o JOIN customers c ON o.cust = c.id
UNION ALL
SELECT id, 'customer', tier FROM customers WHERE tier >= 1""",
    # Top-2 per group: when a top row is deleted the third one moves in; rn is part of the row.
    "top2_per_cust": """
SELECT cust, id, price, rn FROM (
  SELECT cust, id, price, ROW_NUMBER() OVER (PARTITION BY cust ORDER BY price DESC, id) AS rn FROM orders
) ranked WHERE rn <= 2""",
    # Top-1 (dedup) with ties in the ORDER BY: only the tie-invariant columns are output, so any of
    # the tied rows is a right answer and the result is still deterministic.
    "dedup_ties": """
SELECT item, qty FROM (
  SELECT item, qty, ROW_NUMBER() OVER (PARTITION BY item ORDER BY qty DESC) AS rn FROM orders
) ranked WHERE rn = 1""",
    # Top-1 by a total order (latest ts, then smallest id), whole rows out.
    "dedup_latest": """
SELECT id, cust, item, ts FROM (
  SELECT id, cust, item, ts, ROW_NUMBER() OVER (PARTITION BY cust ORDER BY ts DESC, id) AS rn FROM orders
) ranked WHERE rn <= 1""",
    # Tumbling (10 s) and hopping (10 s every 5 s) windows, computed in a FROM subquery.
    "tumble_10s": """
SELECT w.start AS window_start, w.end AS window_end, count(*) AS n, sum(price) AS total, max(qty) AS top_qty
FROM (SELECT price, qty, window(ts, '10 seconds') AS w FROM orders) t
GROUP BY w.start, w.end""",
    "hop_10s_5s": """
SELECT w.start AS window_start, cust, count(*) AS n, min(price) AS lo
FROM (SELECT cust, price, window(ts, '10 seconds', '5 seconds') AS w FROM orders) h
GROUP BY w.start, w.end, cust""",
    # Views on views: an aggregate of a join over agg_basic, and a global top-1 over that.
    "vv_region_spend": """
SELECT c.region, count(*) AS custs, sum(a.total) AS total, max(a.hi) AS hi
FROM agg_basic a LEFT JOIN customers c ON a.cust = c.id
GROUP BY c.region""",
    "vv_top_region": """
SELECT region, total FROM (
  SELECT region, total, ROW_NUMBER() OVER (ORDER BY total DESC NULLS LAST, region NULLS FIRST) AS rn
  FROM vv_region_spend
) ranked WHERE rn = 1""",
    # Several operators in one query: join + GROUP BY + top-N per group.
    "best_cust_per_region": """
SELECT region, cust, spend FROM (
  SELECT region, cust, spend, ROW_NUMBER() OVER (PARTITION BY region ORDER BY spend DESC NULLS LAST, cust) AS rn
  FROM (SELECT c.region, o.cust, sum(o.price * o.qty) AS spend
        FROM orders o JOIN customers c ON o.cust = c.id GROUP BY c.region, o.cust) s
) ranked WHERE rn <= 1""",
    # Window aggregate + join + HAVING: per tumbling window and region, the regions with 2+ orders.
    "window_join_having": """
SELECT w.start AS window_start, c.region, count(*) AS n, avg(o.qty) AS avg_qty
FROM (SELECT cust, qty, window(ts, '10 seconds') AS w FROM orders) o JOIN customers c ON o.cust = c.id
GROUP BY w.start, c.region HAVING count(*) >= 2""",
}


#: Views that keep fewer MIN/MAX values per group than the default 16, so that random changes
#: empty them often: a group is then rebuilt from its input, which must agree with the kept values.
MIN_MAX_CACHE = {"agg_basic": 1, "agg_global_partial": 2}


def pipeline_sql(views: dict[str, str], full: bool) -> str:
    def options(name: str) -> str:
        pairs = ["refresh = 'full'"] if full else []
        if name in MIN_MAX_CACHE:
            pairs.append(f"min_max_cache = {MIN_MAX_CACHE[name]}")
        return f" WITH ({', '.join(pairs)})" if pairs else ""

    return SOURCES + "\n".join(
        f"CREATE MATERIALIZED VIEW {name}{options(name)} AS\n{query.strip()};\n" for name, query in views.items()
    )


# ---------------------------------------------------------------------------------------------------
# Change sequences. An operation is (source, key, values) with values None for a delete.

BASE_TS = dt.datetime(2026, 1, 1, 0, 0, 0)
#: ts of an order: seconds after BASE_TS (None: a NULL ts), so tumbling and hopping windows collide.
TS_SECONDS = [None, 0, 4, 8, 12, 16, 22, 27]
ORDER_IDS = st.integers(0, 6)
CUSTOMER_IDS = st.integers(0, 3)
ORDER_VALUES = st.tuples(
    st.sampled_from([None, 0, 1, 2, 3]),  # cust: 0..3 may be customers, NULL never joins
    st.sampled_from([None, "a", "b", "c"]),  # item
    st.sampled_from([None, 1, 2, 3]),  # qty
    st.sampled_from([None, 0.25, 1.0, 1.5, 2.75, 4.0]),  # price: multiples of 0.25
    st.sampled_from(TS_SECONDS),
)
CUSTOMER_VALUES = st.tuples(st.sampled_from([None, "eu", "us"]), st.sampled_from([None, 1, 2]))
OPERATION = st.one_of(
    st.tuples(st.just("orders"), ORDER_IDS, ORDER_VALUES),  # insert or update (upsert)
    st.tuples(st.just("orders"), ORDER_IDS, ORDER_VALUES),  # (twice: orders change most)
    st.tuples(st.just("orders"), ORDER_IDS, st.none()),  # delete, of an existing key or not
    st.tuples(st.just("customers"), CUSTOMER_IDS, CUSTOMER_VALUES),
    st.tuples(st.just("customers"), CUSTOMER_IDS, st.none()),
)
#: 2-3 epochs a random sequence (2-4 until CI's time grew near its limit); the explicit corner cases
#: are the longer run, 4 epochs.
EPOCHS = st.lists(st.lists(OPERATION, min_size=1, max_size=7), min_size=2, max_size=3)


def O(i, cust, item, qty, price, t):  # noqa: ANN001, ANN201, E743, N802
    """An order insert or update, for the explicit examples."""
    return ("orders", i, (cust, item, qty, price, t))


def C(i, region, tier):  # noqa: ANN001, ANN201, N802
    return ("customers", i, (region, tier))


def DEL(source, i):  # noqa: ANN001, ANN201, N802
    return (source, i, None)


COLUMNS = {
    "orders": ("id", "cust", "item", "qty", "price", "ts"),
    "customers": ("id", "region", "tier"),
}
DDL = {
    "orders": "id BIGINT, cust BIGINT, item STRING, qty BIGINT, price DOUBLE, ts TIMESTAMP",
    "customers": "id BIGINT, region STRING, tier BIGINT",
}


def row_of(source: str, key: int, values: tuple) -> tuple:
    if source == "orders":
        *rest, seconds = values
        ts = None if seconds is None else BASE_TS + dt.timedelta(seconds=seconds)
        return (key, *rest, ts)
    return (key, *values)


def record(source: str, key: int, values: tuple | None) -> str:
    if values is None:
        return json.dumps({"id": key, "_op": "delete"})
    row = row_of(source, key, values)
    body = {c: (v.isoformat() if isinstance(v, dt.datetime) else v) for c, v in zip(COLUMNS[source], row, strict=True)}
    return json.dumps(body)


# ---------------------------------------------------------------------------------------------------
# Running epochs and checking them.


def as_json(df, table: str, side: str):  # noqa: ANN001, ANN201
    """One string column per row (columns renamed by position), tagged with table and side, so that
    every view's state and oracle of an epoch are collected by one Spark job."""
    from pyspark.sql import functions as F

    fields = F.struct(*[F.col(quote(c)).alias(f"c{i}") for i, c in enumerate(df.columns)])
    return df.select(
        F.lit(table).alias("t"), F.lit(side).alias("side"), F.to_json(fields, {"ignoreNullFields": "false"}).alias("j")
    )


def normal(value):  # noqa: ANN001, ANN201
    return round(value, FLOAT_DIGITS) if isinstance(value, float) else value


class Scenario:
    """One pipeline in a fresh EPOCHAL_HOME, the Python model of its sources, and the checks."""

    def __init__(self, spark, root: Path, views: dict[str, str], full: bool):  # noqa: ANN001
        from epochal.pipeline.loader import load_pipeline
        from epochal.runtime.facade import EpochRuntime
        from epochal.settings import Settings

        pipeline_dir = root / "pipeline"
        pipeline_dir.mkdir()
        (pipeline_dir / "pipeline.sql").write_text(pipeline_sql(views, full))
        self.views = views
        self.home = root / "home"
        settings = Settings.from_env({"EPOCHAL_HOME": str(self.home), "EPOCHAL_PIPELINE": str(pipeline_dir)})
        self.spark = spark
        self.runtime = EpochRuntime(settings, load_pipeline(pipeline_dir), lambda: spark)
        views = self.runtime.pipeline.views  # the planner may add hidden stage views of its own
        assert set(self.views) <= set(views), sorted(set(self.views) - set(views))
        assert {views[v].refresh for v in self.views} == {"full" if full else "incremental"}
        self.mode = "full" if full else "incremental"
        self.model: dict[str, dict[int, tuple]] = {"orders": {}, "customers": {}}

    def run_epoch(self, operations: list[tuple]) -> None:
        from epochal.connectors.log import append_records

        for source in COLUMNS:
            lines = [record(s, k, v) for s, k, v in operations if s == source]
            if lines:
                append_records(self.home / "data" / source, lines, "0")  # one split: the last record wins
        for source, key, values in operations:
            if values is None:
                self.model[source].pop(key, None)
            else:
                self.model[source][key] = row_of(source, key, values)
        runtime = self.runtime
        record_, _ = runtime.start_epoch(None, None)
        epoch = record_.epoch
        for source in runtime.pipeline.sources:
            runtime.run_source(epoch, source)
        for view in runtime.pipeline.view_order():
            runtime.run_view(epoch, view)
        runtime.commit(epoch)
        assert runtime.controller.epoch_log.committed_epoch() == epoch

    def mismatches(self) -> dict[str, tuple[Counter, Counter]]:
        """Each table whose committed state differs from the oracle: (got, expected) multisets."""
        spark = self.spark
        parts = []
        registered = []
        try:
            for source, rows in self.model.items():
                expected = frame(spark, sorted(rows.values(), key=repr), DDL[source])
                expected.createOrReplaceTempView(source)
                registered.append(source)
                parts += [as_json(self.runtime.state(source), source, "got"), as_json(expected, source, "expected")]
            for view, query in self.views.items():
                expected = spark.sql(query)
                expected.createOrReplaceTempView(view)  # the oracle of views on views reads this
                registered.append(view)
                parts += [as_json(self.runtime.state(view), view, "got"), as_json(expected, view, "expected")]
            union = parts[0]
            for part in parts[1:]:
                union = union.unionAll(part)
            collected = union.collect()
        finally:
            for name in registered:
                spark.catalog.dropTempView(name)
        sides: dict[tuple[str, str], Counter] = {}
        for t, side, j in collected:
            row = tuple(normal(v) for v in json.loads(j).values())
            sides.setdefault((t, side), Counter())[row] += 1
        out = {}
        for table in [*self.model, *self.views]:
            got, expected = sides.get((table, "got"), Counter()), sides.get((table, "expected"), Counter())
            if got != expected:
                out[table] = (got, expected)
        return out


def describe(mismatches: dict[str, tuple[Counter, Counter]]) -> str:
    lines = []
    for table, (got, expected) in mismatches.items():
        missing, extra = expected - got, got - expected
        lines.append(
            f"{table}: missing {sorted(missing.elements(), key=repr)}; unexpected {sorted(extra.elements(), key=repr)}"
        )
    return "\n".join(lines)


def with_upstreams(names: list[str]) -> dict[str, str]:
    """The views ``names`` and every view they read, transitively, in VIEWS order."""
    needed = set(names)
    for name in reversed(VIEWS):  # a view comes after the views it reads
        if name in needed:
            needed |= {other for other in VIEWS if re.search(rf"\b{other}\b", VIEWS[name]) and other != name}
    return {name: query for name, query in VIEWS.items() if name in needed}


def run_and_check(spark, epochs: list[list[tuple]], views: list[str] | None = None, full: bool = FULL) -> None:  # noqa: ANN001
    """Run ``epochs`` through a fresh pipeline of ``views`` (default all) and compare every view with the
    oracle after every epoch."""
    chosen = VIEWS if views is None else with_upstreams(views)
    with tempfile.TemporaryDirectory(prefix="epochal-ops-") as tmp:
        scenario = Scenario(spark, Path(tmp), chosen, full)
        for number, operations in enumerate(epochs):
            scenario.run_epoch(operations)
            wrong = scenario.mismatches()
            assert not wrong, (
                f"after epoch {number} of {epochs[: number + 1]} (mode {scenario.mode}):\n{describe(wrong)}"
            )


# ---------------------------------------------------------------------------------------------------
# The classic corner cases, as explicit examples (each epoch also runs every other view).

# Delete the current MIN and MAX of a group, then the group's last row (the group must go); an order
# moves between groups; a top-2 row is deleted so the third moves in; every order deleted (empty
# groups vanish, the global aggregate keeps its one row); a delete of a key that never existed.
EXTREMES_AND_GROUPS = [
    [
        O(0, 1, "a", 1, 0.25, 0),
        O(1, 1, "a", 2, 4.0, 4),
        O(2, 1, "b", 3, 1.5, 8),
        O(3, 2, "a", 1, 2.75, 12),
        C(1, "eu", 1),
        C(2, "us", 1),
    ],
    [DEL("orders", 0), DEL("orders", 1)],  # cust 1: min 0.25 and max 4.0 both gone, top-2 refills
    [O(2, 2, "b", 3, 1.5, 8)],  # order 2 moves from cust 1 to cust 2: cust 1's group disappears
    [DEL("orders", 3), DEL("orders", 2), DEL("orders", 5)],  # every order gone (5 never existed)
]
# A join key changes so a left-join row becomes NULL-padded and back; NULL join keys; a customer
# deleted and re-inserted; top-1 with ties in its ORDER BY (one tied row goes, the other stays);
# a no-op upsert; several records of one key in one epoch (the last wins).
JOINS_AND_TIES = [
    [
        O(0, 1, "a", 2, 1.0, 0),
        O(1, None, "a", 2, 1.0, 0),
        C(1, "eu", 2),
        C(3, None, None),
        O(4, 2, "b", 3, 1.0, 4),
        O(5, 3, "b", 3, 2.0, 8),
        O(6, 2, "b", 1, 0.25, 22),
    ],
    [O(0, 3, "a", 2, 1.0, 0), DEL("customers", 1), DEL("orders", 4), O(5, 3, "b", 3, 2.0, 8)],
    [O(0, 0, "a", 2, 1.0, 0), C(1, "us", 2), O(4, 1, "c", 2, 0.25, 27), DEL("orders", 4), O(4, 2, "b", 3, 4.0, 16)],
    [O(1, 1, "b", None, None, None), DEL("orders", 0), C(0, "eu", 1), DEL("orders", 5), DEL("orders", 6)],
]


def apart(epochs: list[list[tuple]], offset: int, items: dict[str, str]) -> list[list[tuple]]:
    """``epochs`` with every order and customer id (and an order's customer) moved up by ``offset``
    and its items renamed, so that it shares no key with a sequence that keeps ids below ``offset``."""

    def moved(op: tuple) -> tuple:
        source, key, values = op
        if values is not None and source == "orders":
            cust, item, *rest = values
            values = (None if cust is None else cust + offset, items.get(item, item), *rest)
        return (source, key + offset, values)

    return [[moved(op) for op in epoch] for epoch in epochs]


#: Both corner-case sequences in one run of four epochs (each epoch of 25 views costs about 40 s in
#: CI): their keys and items are disjoint, so per key and per group each sees what it saw alone, and
#: the views over every row (the global aggregates, the windows, the region rankings) see both.
#: TESTS_HYPOTHESIS_EXAMPLES > 1 also runs them one at a time, as they were written.
CORNER_CASES = [
    extremes + joins
    for extremes, joins in zip(
        EXTREMES_AND_GROUPS, apart(JOINS_AND_TIES, 10, {"a": "x", "b": "y", "c": "z"}), strict=True
    )
]


def explicit_examples(test):  # noqa: ANN001, ANN201
    test = example(epochs=CORNER_CASES)(test)
    if EXAMPLES > 1:
        test = example(epochs=JOINS_AND_TIES)(example(epochs=EXTREMES_AND_GROUPS)(test))
    return test


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(epochs=EPOCHS)
@explicit_examples
def test_every_view_matches_the_batch_oracle_after_every_epoch(spark, epochs) -> None:  # noqa: ANN001
    run_and_check(spark, epochs)


# ---------------------------------------------------------------------------------------------------
# Incremental engine bugs the property test found, each reduced to the views it needs and a fixed
# change sequence, kept as regressions. They always run incrementally (whatever FORCE_FULL says).
# The first: a one-partition view's first epoch retracted Q(empty) = (0, NULL...), a row it never
# held. The other two: a linear view over a stage the planner split off ran its text as written,
# ranking the stage's delta instead of reading the stage.


def test_global_aggregate_keeps_its_row_when_the_table_empties(spark) -> None:  # noqa: ANN001
    run_and_check(
        spark, [[O(0, 1, "a", 1, 0.25, 0)], [DEL("orders", 0)]], views=["agg_global", "agg_global_partial"], full=False
    )


def test_global_aggregate_has_its_row_after_a_first_epoch_that_changed_nothing(spark) -> None:  # noqa: ANN001
    # Hypothesis found it: the first epoch deletes an order that never existed (an empty change
    # with a file), so the view's inputs are unchanged, yet COUNT(*) over no rows is a row of 0.
    run_and_check(
        spark, [[DEL("orders", 3)], [DEL("customers", 0)]], views=["agg_global", "agg_global_partial"], full=False
    )


def test_top1_over_a_view_reranks_a_row_whose_value_falls(spark) -> None:  # noqa: ANN001
    run_and_check(spark, EXTREMES_AND_GROUPS[:2], views=["vv_top_region"], full=False)


def test_top1_per_group_over_an_aggregate_follows_the_new_value(spark) -> None:  # noqa: ANN001
    run_and_check(spark, EXTREMES_AND_GROUPS[:2], views=["best_cust_per_region"], full=False)
