"""Incremental views with state, end to end: every kind of stateful operator the planner maintains,
alone and combined, over keyed sources that insert, update and delete, each view compared after
every epoch with the same SQL run as a Spark batch over the committed source rows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from epochal.connectors.log import append_records
from epochal.errors import EpochalError, PipelineError
from epochal.incremental.analysis import FINGERPRINT_FILE, analyse_pipeline, check_pipeline, written_schemas
from epochal.incremental.binding import sql_over
from epochal.incremental.plan import PARTIAL_RULE, Plan
from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.model import Pipeline
from epochal.runtime.facade import EpochRuntime
from tests.consistency import Oracle, assert_view_matches_batch, assert_views_match_batch
from tests.epochal_harness import make_harness
from tests.incremental.test_incremental_planner import SPARK_FORMS as CORPUS_FORMS
from tests.incremental.test_incremental_planner import load_corpus

SOURCES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, item STRING, qty BIGINT, price DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE TABLE customers (id BIGINT PRIMARY KEY, region STRING, tier BIGINT)
WITH (connector = 'log', path = 'data/customers', format = 'json');
"""

VIEWS = {
    # GROUP BY with every aggregate, FILTER and HAVING
    "per_cust": "SELECT cust, count(*) AS n, count(DISTINCT item) AS items, sum(qty) AS q, avg(price) AS ap, "
    "min(price) AS lo, max(price) AS hi, count(*) FILTER (WHERE qty > 2) AS big FROM orders GROUP BY cust "
    "HAVING count(*) >= 1",
    # only what a partial aggregate keeps: sums over an exact type and floating point, MIN over
    # few groups (deletes retract the extreme), AVG, FILTER and HAVING over the stage
    "per_item": "SELECT item, count(*) AS n, sum(qty) AS q, avg(price) AS ap, min(price) AS lo, max(qty) AS hq, "
    "sum(price) FILTER (WHERE qty > 1) AS big, avg(CAST(price AS DECIMAL(9, 2))) AS dap, "
    "sum(CAST(price AS DECIMAL(9, 2))) AS dsum FROM orders GROUP BY item HAVING count(*) >= 2",
    "distinct_items": "SELECT DISTINCT item FROM orders",
    "enriched": "SELECT o.id, o.price, c.region FROM orders o LEFT JOIN customers c ON o.cust = c.id",
    "full_pairs": "SELECT o.id, c.id AS cid, c.tier FROM orders o FULL OUTER JOIN customers c ON o.cust = c.id",
    # joined on the customer, grouped by region: split into a join stage and a grouping stage
    "by_region": "SELECT c.region, count(*) AS n, sum(o.price) AS total FROM orders o JOIN customers c "
    "ON o.cust = c.id GROUP BY c.region",
    "top2": "SELECT cust, id, price FROM (SELECT cust, id, price, ROW_NUMBER() OVER (PARTITION BY cust "
    "ORDER BY price DESC, id) AS rn FROM orders) WHERE rn <= 2",
    "with_orders": "SELECT id, region FROM customers WHERE id IN (SELECT cust FROM orders WHERE qty > 0)",
    "without_orders": "SELECT c.id, c.region FROM customers c WHERE NOT EXISTS "
    "(SELECT 1 FROM orders o WHERE o.cust = c.id)",
    "hopping": "SELECT w.start AS ws, w.end AS we, count(*) AS n, max(price) AS hi FROM "
    "(SELECT price, window(ts, '10 minutes', '5 minutes') AS w FROM orders) GROUP BY w.start, w.end",
    "cte_max": "WITH m AS (SELECT cust, max(price) AS mp FROM orders GROUP BY cust) "
    "SELECT o.id, o.cust FROM orders o JOIN m ON o.cust = m.cust AND o.price = m.mp",
    "spenders": "SELECT hi, count(*) AS custs FROM per_cust GROUP BY hi",  # a view on a view
    # joins on two different keys: the first join becomes a stage the second joins with
    "same_tier": "SELECT o.id, c.region, t.id AS peer FROM orders o JOIN customers c ON o.cust = c.id "
    "JOIN customers t ON t.tier = c.tier",
    "custs_and_buyers": "SELECT cust AS k FROM orders INTERSECT SELECT id AS k FROM customers",
    "totals": "SELECT count(*) AS n, sum(qty) AS q, max(price) AS hi FROM orders",  # one partition
    "repeat_buyers": "SELECT c.id, c.region FROM orders o RIGHT JOIN customers c ON o.cust = c.id "
    "WHERE c.id IN (SELECT cust FROM orders GROUP BY cust HAVING count(*) > 1)",
}


def order(i: int, cust: int | None = None, item: str = "a", qty: int = 1, price: float = 1.0, minute: int = 0,
          op: str | None = None) -> str:
    body: dict = {"id": i}
    if op != "delete":
        body.update(cust=cust, item=item, qty=qty, price=price, ts=f"2026-01-01T10:{minute:02d}:00")
    if op:
        body["_op"] = op
    return json.dumps(body)


def customer(i: int, region: str | None = None, tier: int = 1, op: str | None = None) -> str:
    body: dict = {"id": i}
    if op != "delete":
        body.update(region=region, tier=tier)
    if op:
        body["_op"] = op
    return json.dumps(body)


def files(views: dict[str, str]) -> dict[str, str]:
    return {
        "sources.sql": SOURCES,
        "views.sql": "\n".join(f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in views.items()),
    }


EPOCHS = [
    (
        [order(1, 1, "a", 1, 10.0, 1), order(2, 1, "b", 3, 30.0, 4), order(3, 2, "a", 5, 20.0, 12),
         order(4, None, "c", 1, 5.0, 7)],
        [customer(1, "eu", 1), customer(2, "us", 2), customer(3, "eu", 2)],
    ),
    (
        # delete the max of cust 1; move order 3 to cust 1; an order for a customer that comes later
        [order(2, op="delete"), order(3, 1, "a", 5, 20.0, 12), order(5, 4, "d", 2, 7.5, 14)],
        [customer(4, "apac", 3), customer(2, "us", 3)],
    ),
    (
        # the last order of cust 4 goes, its customer too; customer 1 changes region; duplicates
        [order(5, op="delete"), order(6, 1, "a", 1, 10.0, 1), order(7, 2, "b", 1, 1.0, 22)],
        [customer(4, op="delete"), customer(1, "us", 1), customer(9, op="delete")],
    ),
    (
        # item a loses its cheapest order and its largest quantity (an update): MIN and MAX recompute
        [order(1, op="delete"), order(3, 1, "a", 2, 25.0, 12)],
        [],
    ),
]


def run_epochs(h, instance, spark, views: dict[str, str], epochs=EPOCHS):
    runtime = None
    for orders, customers in epochs:
        append_records(h.home / "data" / "orders", orders)
        append_records(h.home / "data" / "customers", customers)
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        runtime = h.runtime(spark)
        assert_views_match_batch(runtime, views)
    return runtime


#: The two engines of an incremental step: small epochs go to the driver by default, larger ones
#: (and every epoch with EPOCHAL_DRIVER_ROWS=0) to Spark; both must give the batch's result.
ENGINES = pytest.mark.parametrize("engine", ["driver", "spark"])


def use_engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    if engine == "spark":
        monkeypatch.setenv("EPOCHAL_DRIVER_ROWS", "0")
    else:
        monkeypatch.delenv("EPOCHAL_DRIVER_ROWS", raising=False)


def assert_steps_ran_on(instance: dg.DagsterInstance, assets: list[str], engine: str) -> None:
    """The latest materialization of each of ``assets`` names ``engine`` (an idle step names none):
    a driver path that silently gave every step to Spark, or the reverse, would test one engine twice."""
    ran = {}
    for asset in assets:
        records = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records
        ran[asset] = records[0].asset_materialization.metadata["engine"].value if records else None
    expected = "driver (DuckDB)" if engine == "driver" else "spark"
    assert any(e == expected for e in ran.values()), ran
    if engine == "spark":
        assert not any(e == "driver (DuckDB)" for e in ran.values()), ran


@ENGINES
def test_stateful_views_match_batch_after_inserts_updates_and_deletes(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    use_engine(monkeypatch, engine)
    h = make_harness(tmp_path, files(VIEWS))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    for name in VIEWS:
        plan = pipeline.views[name].plan
        # keyed, or a projection of its internal stages that are (a partial aggregate's stage)
        stages = [v.plan for v in pipeline.views.values() if v.internal_of == name]
        assert plan is not None and (plan.kind == "keyed" or stages[-1].kind == "keyed"), name
    # the join grouped by another key was split into a join stage and a partial-aggregate stage,
    # and the first join of two into a stage
    assert [v.name for v in pipeline.views.values() if v.internal_of == "by_region"] == [
        "by_region__stage1",
        "by_region__stage2",
    ]
    assert [v.name for v in pipeline.views.values() if v.internal_of == "same_tier"] == ["same_tier__stage1"]
    assert pipeline.views["by_region__stage1"].plan.rule == "delta join"
    # (hopping is in partial form but for its MAX, whose kept values live in a stage)
    partial = {"by_region__stage2", "per_item__stage1", "hopping__stage1", "spenders", "totals__stage1"}
    assert {n for n, v in pipeline.views.items() if v.plan and v.plan.rule == PARTIAL_RULE} == partial
    # over all rows: one group, kept as partial state like any other
    assert pipeline.views["totals__stage1"].plan.aggregate.groups == ()
    instance = dg.DagsterInstance.ephemeral()
    runtime = run_epochs(h, instance, spark, VIEWS)
    # a projection of a partial aggregate has the types of the query as written (AVG of a decimal
    # is a wider decimal, not SUM / COUNT's), so its readers and sinks see what Spark would give
    with Oracle(runtime).tables(VIEWS["per_item"]):  # the sources with their declared types
        written = spark.sql(VIEWS["per_item"]).schema
    assert [f.dataType for f in runtime.state("per_item").schema] == [f.dataType for f in written]
    records = instance.fetch_materializations(dg.AssetKey("per_cust"), limit=1).records
    metadata = records[0].asset_materialization.metadata
    assert metadata["mode"].value == "incremental"
    assert metadata["state_rows_read"].value > 0
    assert_steps_ran_on(instance, ["orders", "customers", *runtime.pipeline.views], engine)


def test_a_table_without_change_files_reads_empty_and_leaves_the_callers_views_alone(spark, tmp_path: Path) -> None:
    """Before a view writes a change (its inputs were idle so far), its state is empty with the
    columns and types of its query as written; finding them binds nothing the caller named."""
    h = make_harness(tmp_path, files({"per_item": VIEWS["per_item"]}))
    runtime = h.runtime(spark)
    spark.range(3).createOrReplaceTempView("orders")  # a caller's own rows under a table's name
    try:
        for table in ("orders", "per_item__stage1", "per_item"):
            rows, read = runtime.read_state(table, 1, inclusive=True)
            assert rows.isEmpty() and read == 0, table
        assert spark.table("orders").count() == 3
        empty_orders = runtime.read_state("orders", 1, inclusive=True)[0]
        empty_orders.createOrReplaceTempView("orders")
        written = spark.sql(VIEWS["per_item"]).schema
        got = runtime.read_state("per_item", 1, inclusive=True)[0].schema
        assert [(f.name, f.dataType) for f in got] == [(f.name, f.dataType) for f in written]
    finally:
        spark.catalog.dropTempView("orders")


def test_min_and_max_read_their_input_only_when_their_kept_values_run_out(spark, tmp_path: Path) -> None:
    """A grouped MIN/MAX keeps the group's best values (here 2): deleting the extreme is answered
    from them, reading only the view's own row; once they are all deleted the group is rebuilt
    from its input, and an insert better than the last kept value enters them."""
    query = "SELECT item, min(price) AS lo, max(price) AS hi, count(*) AS n FROM orders GROUP BY item"
    views = {"extremes": query}
    h = make_harness(tmp_path, files(views))
    (h.pipeline_dir / "views.sql").write_text(
        f"CREATE MATERIALIZED VIEW extremes WITH (min_max_cache = 2) AS {query};"
    )
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    runtime = h.runtime(spark)
    stage = "extremes__stage1"
    assert runtime.pipeline.views[stage].plan.aggregate.min_max_cache == 2
    steps = [
        # item a: prices 1..5 (kept: 1, 2 and 5, 4); item b: one price, all of its values kept
        [order(i, 1, "a", 1, float(i), i) for i in range(1, 6)] + [order(9, 1, "b", 1, 7.0, 9)],
        [order(1, op="delete"), order(5, op="delete")],  # the extremes go: answered by kept 2 and 4
        [order(2, op="delete")],  # MIN's kept values are gone, 3 and 4 remain: rebuilt from the input
        [order(6, 1, "a", 1, 0.5, 20), order(9, op="delete")],  # 0.5 enters; b's last row goes
    ]
    read, own = [], []
    for records in steps:
        append_records(h.home / "data" / "orders", records)
        record, _ = runtime.start_epoch(None, None)
        for source in runtime.pipeline.sources:
            runtime.run_source(record.epoch, source)
        parts = runtime.controller.catalog.state_parts(stage, record.epoch, False)
        assert parts.snapshot is None  # (no compaction here: the stage's rows are its change files)
        own.append(sum(runtime.warehouse.row_count(location) for _, location in parts.changes))
        reports = {v: runtime.run_view(record.epoch, v) for v in runtime.pipeline.view_order()}
        runtime.commit(record.epoch)
        read.append(reports[stage].metadata["state_rows_read"])
        assert_view_matches_batch(runtime, "extremes", query)
    rows = {r["item"]: (r["lo"], r["hi"], r["n"]) for r in runtime.state("extremes").collect()}
    assert rows == {"a": (0.5, 4.0, 3)}
    # epochs 2 and 4 read only the stage's own rows; epoch 3 also read item a's orders
    assert read[1] == own[1] and read[3] == own[3], (read, own)
    assert read[2] > own[2], (read, own)
    kept = runtime.state(stage).select("_epochal_kept_p2_min", "_epochal_kept_p3_max").collect()
    assert [list(r[0]) for r in kept] == [[0.5, 3.0]] and [list(r[1]) for r in kept] == [[4.0, 3.0]]


#: Spark SQL as users write it, which loaded but failed at the first epoch, or did not load
#: (issue 16): an IN list filtering a join, Spark's GROUP BY window(...) with window.start, and a
#: hopping-window CTE joined with its own per-window maximum (Nexmark q5's shape); besides them a
#: session window, and a window grouped with another key, HAVING on an alias.
SPARK_FORMS = {
    "regional_orders": "SELECT o.id, o.qty, c.region FROM orders o JOIN customers c ON o.cust = c.id "
    "WHERE c.region IN ('eu', 'apac') AND o.item IN ('a', 'b')",
    "per_window": "SELECT window.start AS ws, window.end AS we, count(*) AS n, sum(qty) AS q, max(price) AS hi "
    "FROM orders GROUP BY window(ts, '10 minutes')",
    "hot_customers": "WITH w AS (SELECT cust, window(ts, '10 minutes', '5 minutes') AS win, count(*) AS num "
    "FROM orders GROUP BY cust, window(ts, '10 minutes', '5 minutes')) "
    "SELECT w.cust, w.win.start AS starttime, w.num FROM w JOIN (SELECT win, max(num) AS maxn FROM w GROUP BY win) m "
    "ON w.win = m.win AND w.num >= m.maxn",
    "sessions": "SELECT cust, session_window.start AS ss, session_window.end AS se, count(*) AS n FROM orders "
    "GROUP BY cust, session_window(ts, '5 minutes')",
    "busy_items": "SELECT item, window.start AS ws, count(*) AS n FROM orders GROUP BY window(ts, '10 minutes'), item "
    "HAVING n > 1",
    # a named window, and a join hint naming an alias (both were refused at load; a SQL probe found them)
    "running": "SELECT id, cust, sum(qty) OVER w AS run, row_number() OVER w AS rn FROM orders "
    "WINDOW w AS (PARTITION BY cust ORDER BY ts, id)",
    "hinted": "SELECT /*+ BROADCAST(c) */ o.id, o.qty, c.region FROM orders o JOIN customers c ON o.cust = c.id",
    # the higher-order exists(), which was taken for EXISTS (subquery)
    "a_lines": "SELECT cust, count(*) AS n FROM orders WHERE exists(array(item, 'z'), x -> x = 'a') GROUP BY cust",
    # joins, IN and EXISTS on expressions of one input's columns (were refused as "not joined on one key")
    "by_initial": "SELECT o.id, c.region FROM orders o JOIN customers c ON o.item = substr(c.region, 1, 1)",
    "next_ids": "SELECT id FROM customers WHERE id + 1 IN (SELECT cust FROM orders)",
    "unmatched": "SELECT c.id FROM customers c WHERE NOT EXISTS "
    "(SELECT 1 FROM orders o WHERE coalesce(o.cust, 0) = c.id - 1)",
    # two semi joins on different keys, the rewrite their refusal names: one in a subquery in FROM
    "tiered_buyers": "SELECT id FROM (SELECT * FROM customers c WHERE c.tier IN (SELECT qty FROM orders)) c "
    "WHERE EXISTS (SELECT 1 FROM orders o WHERE o.cust = c.id)",
    # the top groups and a ranking of groups (refused: the aggregation and the LIMIT or window
    # partition differently); the planner makes the aggregation a stage the rest reads
    "top_custs": "SELECT cust, count(*) AS n FROM orders GROUP BY cust ORDER BY n DESC, cust LIMIT 2",
    "ranked_custs": "SELECT cust, n, rk FROM (SELECT cust, count(*) AS n, rank() OVER (ORDER BY count(*) DESC) AS rk "
    "FROM orders GROUP BY cust) WHERE rk <= 2",
    # grouped by a column a LATERAL VIEW generates (refused: it belongs to no input), with OUTER,
    # under a LIMIT, and over one input of a join
    "item_tags": "SELECT x, count(*) AS n FROM orders LATERAL VIEW explode(array(item, 'z')) t AS x GROUP BY x",
    "big_tags": "SELECT x, count(*) AS n FROM orders "
    "LATERAL VIEW OUTER explode(CASE WHEN qty > 2 THEN array(item) END) t AS x GROUP BY x",
    "top_tags": "SELECT x, sum(qty) AS q FROM orders LATERAL VIEW explode(array(item, 'z')) t AS x GROUP BY x "
    "ORDER BY q DESC, x LIMIT 2",
    # calls sqlglot's Spark generator rewrote for Spark 2, losing meaning: an approximate percentile
    # without DESC, and to_char without its format (the views ran, with wrong rows)
    "medians": "SELECT item, percentile_cont(0.5) WITHIN GROUP (ORDER BY price) AS med, "
    "percentile_disc(0.25) WITHIN GROUP (ORDER BY price DESC) AS p25 FROM orders GROUP BY item",
    "daily": "SELECT to_char(ts, 'yyyy-MM-dd') AS d, count(*) AS n, "
    "to_char(CAST(sum(qty) AS DECIMAL(10, 2)), '999.99') AS q FROM orders GROUP BY to_char(ts, 'yyyy-MM-dd')",
    # a SELECT without FROM is a constant row (planned linear, it cancelled out and never showed)
    "with_z": "SELECT item FROM orders UNION ALL SELECT 'z' AS item",
    "counted_with_z": "SELECT item, count(*) AS n FROM (SELECT item FROM orders UNION ALL SELECT 'z' AS item) "
    "GROUP BY item",
    "region_tags": "SELECT c.region, x, count(*) AS n FROM orders o JOIN customers c ON o.cust = c.id "
    "LATERAL VIEW posexplode(array(o.item, 'z')) t AS pos, x GROUP BY c.region, x",
    # grouping() and grouping_id() in HAVING: Spark resolves their arguments against the output
    # columns, which qualification had aliased (every epoch failed its analysis)
    "item_customers": "SELECT item, cust, grouping(cust) AS g, count(*) AS n FROM orders "
    "GROUP BY ROLLUP(item, cust) HAVING grouping(cust) = 0",
    "cube_levels": "SELECT o.item, o.cust, sum(o.qty) AS q FROM orders o GROUP BY CUBE(o.item, o.cust) "
    "HAVING grouping_id(o.item, o.cust) IN (0, 2)",
    "set_totals": "SELECT item, cust, count(*) AS n FROM orders GROUP BY GROUPING SETS ((item, cust), (item), ()) "
    "HAVING grouping(item) = 1 OR count(*) > 1",
    # VALUES as a constant input (a leaf with no upstream; it was refused, full refresh included):
    # joined, with Spark's col1/col2 names, in IN, as a CTE with column names, on the side of a
    # LEFT JOIN whose unmatched rows only the first epoch computes, and as a UNION ALL branch
    "labelled": "SELECT o.id, v.label FROM orders o JOIN (VALUES ('a', 'A'), ('b', 'B')) AS v(item, label) "
    "ON o.item = v.item",
    "labelled_cols": "SELECT o.id, col2 AS label FROM orders o JOIN VALUES ('a', 'A'), ('c', 'C') ON o.item = col1",
    "listed": "SELECT id, qty FROM orders WHERE item IN (SELECT * FROM VALUES ('a'), ('c'))",
    "weighted": "WITH m(k, w) AS (VALUES ('a', 1), ('b', 2)) SELECT m.w, count(*) AS n, sum(o.qty) AS q "
    "FROM orders o JOIN m ON o.item = m.k GROUP BY m.w",
    "every_item": "SELECT v.item, count(o.id) AS n FROM VALUES ('a'), ('b'), ('q') AS v(item) "
    "LEFT JOIN orders o ON o.item = v.item GROUP BY v.item",
    "items_and_z": "SELECT item FROM orders WHERE qty > 1 UNION ALL VALUES ('z')",
    # window functions under IGNORE NULLS (were refused as aggregates without GROUP BY)
    "first_custs": "SELECT id, first_value(cust) IGNORE NULLS OVER (PARTITION BY item ORDER BY id) AS fc, "
    "lag(cust) IGNORE NULLS OVER (PARTITION BY item ORDER BY id) AS pc FROM orders",
    # a constant grouping key, alone and beside a column (was refused as partitioned by no column)
    "all_orders": "SELECT 'all' AS segment, count(*) AS n FROM orders GROUP BY 1",
    "item_totals": "SELECT 'all' AS segment, item, sum(qty) AS q FROM orders GROUP BY 1, item",
    # a view named with capitals, read by the name as written (the loader keeps it lowercased)
    "DailyRev": "SELECT item, sum(qty * price) AS rev FROM orders GROUP BY item",
    # a generator's several named columns (was refused as a column without a name)
    "order_values": "SELECT id, stack(2, 'qty', CAST(qty AS DOUBLE), 'price', price) AS (k, v) FROM orders",
    # a CTE named like the table it reads (refused: "reads no source or view"); a CTE that reads a
    # table a later CTE is named like; a quote doubled in a string (the plan said "customers")
    "open_orders": "WITH orders AS (SELECT * FROM orders WHERE qty > 1) "
    "SELECT cust, count(*) AS n, sum(qty) AS q FROM orders GROUP BY cust",
    "by_region": "WITH c AS (SELECT id, region FROM customers), "
    "customers AS (SELECT o.id, c.region FROM orders o JOIN c ON o.cust = c.id) "
    "SELECT region, count(*) AS n FROM customers GROUP BY region",
    "noted": "SELECT CASE WHEN qty > 1 THEN 'customer''s many' ELSE 'it''s one' END AS note, count(*) AS n "
    "FROM orders GROUP BY 1",
    # a path into a VARIANT (refused as a syntax error), over JSON whose keys have capitals: a
    # struct's field names were lowercased, so the path found nothing and every row had a NULL key
    "json_items": "SELECT parse_json(to_json(named_struct('Item', item, 'Qty', qty))):Item::string AS it, "
    "count(*) AS n, sum(parse_json(to_json(named_struct('Item', item, 'Qty', qty))):Qty::bigint) AS q "
    "FROM orders GROUP BY 1",
    "top_orders": "SELECT cust, max_by(named_struct('orderId', id, 'Price', price), price) AS top "
    "FROM orders GROUP BY cust",
}


@ENGINES
def test_spark_sql_forms_are_maintained_incrementally(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    use_engine(monkeypatch, engine)
    h = make_harness(tmp_path, files(SPARK_FORMS))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    assert pipeline.views["regional_orders"].plan.rule == "delta join"
    assert pipeline.views["per_window__stage1"].plan.rule == PARTIAL_RULE
    assert pipeline.views["hot_customers"].plan.key_classes == ("m.win = w.win",)
    assert pipeline.views["sessions"].plan.key_classes == ("orders.cust",)
    assert pipeline.views["running"].plan.key_classes == ("orders.cust",)
    assert pipeline.views["hinted"].plan.rule == "delta join"
    # the groups are partial state in a stage; the LIMIT over them is one partition
    assert pipeline.views["top_custs__stage1"].plan.rule == PARTIAL_RULE
    assert pipeline.views["top_custs"].plan.key_classes == ()
    assert pipeline.views["item_tags"].plan.key_classes == ("orders.x",)
    assert pipeline.views["order_values"].columns == ("id", "k", "v")
    # (each reads its tables through a stage: the CTEs are gone, the tables they read are not)
    read = {v.internal_of or v.name: set() for v in pipeline.views.values()}
    for v in pipeline.views.values():
        read[v.internal_of or v.name] |= {u for u in v.upstreams if u in pipeline.sources}
    assert read["open_orders"] == {"orders"} and read["by_region"] == {"orders", "customers"}
    # Three epochs: inserts, then deletes, updates and keys moving between groups (the fourth, MIN and
    # MAX running out of kept values, is the stateful views' test above)
    instance = dg.DagsterInstance.ephemeral()
    runtime = run_epochs(h, instance, spark, SPARK_FORMS, EPOCHS[:3])
    assert_steps_ran_on(instance, ["orders", "customers", *runtime.pipeline.views], engine)
    # a struct's field names are data (to_json's keys, a sink's schema): kept as written
    assert runtime.state("top_orders").schema["top"].dataType.simpleString() == "struct<orderId:bigint,Price:double>"
    # names are case-insensitive; one no table has is said to be unknown, not late
    assert runtime.state("DAILYREV").count() == runtime.state("dailyrev").count()
    with pytest.raises(EpochalError, match="no table DailyRevs in the pipeline"):
        runtime.state("DailyRevs")


#: Grouped, deduplicated or ranked by a column of the side an outer join pads with NULLs: the
#: unmatched rows of every join key meet in one NULL group (wrong rows when a recompute read
#: only the touched keys' share of it; found by a user-style query sweep)
PADDED_GROUPS = {
    "full_distinct": "SELECT c.id, count(DISTINCT o.item) AS items FROM orders o FULL JOIN customers c "
    "ON o.cust = c.id GROUP BY c.id",
    "left_by_padded": "SELECT c.id AS cid, count(*) AS n, max(o.price) AS hi, sum(o.qty) AS q FROM orders o "
    "LEFT JOIN customers c ON o.cust = c.id GROUP BY c.id",
    "right_by_padded": "SELECT o.cust, count(c.id) AS n, sum(c.tier) AS t FROM orders o RIGHT JOIN customers c "
    "ON o.cust = c.id GROUP BY o.cust",
    "padded_regions": "SELECT DISTINCT c.id, c.region FROM orders o LEFT JOIN customers c ON o.cust = c.id",
    "padded_ranks": "SELECT o.id, c.id AS cid, row_number() OVER (PARTITION BY c.id ORDER BY o.id) AS rn "
    "FROM orders o LEFT JOIN customers c ON o.cust = c.id",
    # grouped by the side that is never padded: one key still partitions it, no stage
    "left_by_kept": "SELECT o.cust, count(*) AS n, count(c.id) AS matched FROM orders o "
    "LEFT JOIN customers c ON o.cust = c.id GROUP BY o.cust",
}

#: orders without a customer under several keys, so the NULL group spans keys an epoch touches one by one
PADDED_EPOCHS = [
    (
        [
            order(1, 1, "a", 1, 10.0),
            order(2, 7, "b", 2, 20.0),
            order(3, 8, "a", 3, 30.0),
            order(4, None, "c", 1, 5.0),
            order(5, 7, "c", 1, 6.0),
        ],
        [customer(1, "eu", 1), customer(2, "us", 2)],
    ),
    (
        # one of key 7's unmatched orders goes; key 8's customer arrives
        [order(2, op="delete")],
        [customer(8, "apac", 3)],
    ),
    (
        # a new unmatched key; customer 2 goes and its key gains an order; order 1 moves to key 9
        [order(6, 9, "d", 4, 40.0), order(7, 2, "b", 1, 1.0), order(1, 9, "a", 1, 10.0)],
        [customer(2, op="delete")],
    ),
]


def test_grouping_by_the_side_an_outer_join_pads_is_staged_and_matches_batch(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, files(PADDED_GROUPS))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    stages = {v.internal_of for v in pipeline.views.values() if v.internal_of}
    # the join is a stage keyed by its join key, which the grouping then reads as a table
    assert stages >= {"full_distinct", "left_by_padded", "right_by_padded", "padded_regions", "padded_ranks"}
    assert "left_by_kept" not in stages
    assert pipeline.views["left_by_kept"].plan.key_classes == ("c.id = o.cust",)
    run_epochs(h, dg.DagsterInstance.ephemeral(), spark, PADDED_GROUPS, PADDED_EPOCHS)


#: Set operations whose branches share no key (refused with no rewrite): each stateful branch is a
#: stage, as an IN subquery grouped by another key is
UNEVEN_BRANCHES = {
    "with_total": "SELECT cust, count(*) AS n FROM orders GROUP BY cust UNION ALL SELECT NULL, count(*) FROM orders",
    "by_dimension": "SELECT 'cust' AS dim, CAST(cust AS STRING) AS k, sum(qty) AS q FROM orders GROUP BY cust "
    "UNION ALL SELECT 'all', 'all', sum(qty) FROM orders UNION ALL SELECT 'region', region, count(*) FROM customers "
    "GROUP BY region",
    "counts_seen": "SELECT count(*) AS n FROM orders GROUP BY cust UNION SELECT max(tier) FROM customers",
    # an IN subquery grouped by another key than the IN tests (its stage had no alias: the load crashed)
    "latest_orders": "SELECT id, cust FROM orders WHERE id IN (SELECT max(id) FROM orders GROUP BY cust)",
    # filtered by a semi join, then grouped, deduplicated or counted by another key (refused before,
    # told to join in a subquery first: the planner makes the filtered input that subquery's stage)
    "eu_items": "SELECT item, count(*) AS n FROM orders WHERE cust IN (SELECT id FROM customers WHERE region = 'eu') "
    "GROUP BY item",
    "tiered_items": "SELECT o.item, sum(o.qty) AS q, max(o.price) AS hi FROM orders o WHERE EXISTS "
    "(SELECT 1 FROM customers c WHERE c.id = o.cust AND c.tier > 1) AND o.qty > 0 GROUP BY o.item",
}


def test_branches_and_in_subqueries_grouped_by_another_key_become_stages(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, files(UNEVEN_BRANCHES))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    for name in UNEVEN_BRANCHES:
        assert any(v.internal_of == name for v in pipeline.views.values()), name
    run_epochs(h, dg.DagsterInstance.ephemeral(), spark, UNEVEN_BRANCHES)


def _with_plan(pipeline: Pipeline, view: str, plan: Plan) -> Pipeline:
    views = {**pipeline.views, view: replace(pipeline.views[view], plan=plan)}
    return replace(pipeline, views=views)


def test_a_plan_spark_refuses_is_a_load_error_naming_the_view_before_any_epoch(spark, tmp_path: Path) -> None:
    """The planner bug of issue 16, put back by hand: the hopping window as a key evaluated on the
    table (a join condition Spark cannot analyse). The runtime reports it, naming the view, where
    the view is defined, before it injects an epoch or writes anything."""
    views = {"hot_customers": SPARK_FORMS["hot_customers"]}
    h = make_harness(tmp_path, files(views))
    pipeline = load_pipeline(h.pipeline_dir)
    plan = pipeline.views["hot_customers"].plan
    window = "WINDOW(ts, '10 minutes', '5 minutes')"
    broken = replace(
        plan,
        leaves=tuple(replace(leaf, sql="SELECT * FROM orders", key=(window,)) for leaf in plan.leaves),
        query=plan.query.replace("orders.window", "WINDOW(orders.ts, '10 minutes', '5 minutes')"),
    )
    runtime = EpochRuntime(h.settings(), _with_plan(pipeline, "hot_customers", broken), lambda: spark)
    with pytest.raises(PipelineError) as refused:
        runtime.start_epoch(None, None)
    (issue,) = refused.value.issues
    assert (Path(issue.file).name, issue.line) == ("views.sql", 1)
    assert issue.message.startswith("view hot_customers: its plan (keyed recompute) does not analyse in Spark")
    assert "bug in Epochal's planner" in issue.message and "WITH (refresh = 'full')" in issue.message
    # nothing ran: no epoch, no file, and no fingerprint that would let the next runtime skip it
    assert runtime.controller.epoch_log.epochs() == []
    assert not (h.home / "warehouse").exists() or not any((h.home / "warehouse").iterdir())
    assert not (h.home / FINGERPRINT_FILE).exists()
    # the plan as the planner makes it runs
    fixed = EpochRuntime(h.settings(), pipeline, lambda: spark)
    record, _ = fixed.start_epoch(None, None)
    assert (h.home / FINGERPRINT_FILE).exists()
    assert record.epoch in {r.epoch for r in fixed.controller.epoch_log.in_flight()}


def test_a_query_spark_refuses_is_reported_at_load_as_the_users_to_fix(spark, tmp_path: Path) -> None:
    """sqlglot cannot see types: a WHERE that is not a condition loads, and Spark's analysis of
    the query as written names it before any epoch (through `epochal validate` too)."""
    h = make_harness(tmp_path, files({"cheap": "SELECT id, price FROM orders WHERE price"}))
    pipeline = load_pipeline(h.pipeline_dir)
    (failure,) = analyse_pipeline(spark, pipeline, written_schemas(spark, pipeline))
    issue = failure.issue(pipeline)
    assert issue.message.startswith("view cheap: Spark cannot analyse the query: [DATATYPE_MISMATCH")
    assert issue.message.endswith("; fix the query")


def test_validate_analyses_the_plans_once_and_runs_remember_it(spark, tmp_path: Path, monkeypatch, capsys) -> None:
    from epochal.cli.main import main

    views = {"per_window": SPARK_FORMS["per_window"], "cheap": "SELECT id FROM orders WHERE qty"}
    h = make_harness(tmp_path, files(views))
    monkeypatch.setenv("EPOCHAL_HOME", str(h.home))
    monkeypatch.setenv("EPOCHAL_PIPELINE", str(h.pipeline_dir))
    assert main(["validate"]) == 1
    assert "view cheap: Spark cannot analyse the query" in capsys.readouterr().err
    assert main(["validate", "--no-spark"]) == 0  # sqlglot alone cannot see it
    (h.pipeline_dir / "views.sql").write_text(f"CREATE MATERIALIZED VIEW per_window AS {SPARK_FORMS['per_window']};")
    assert main(["validate"]) == 0
    assert "plans: analysed by Spark in" in capsys.readouterr().out
    assert main(["validate"]) == 0
    assert "plans: analysed before (same plans)" in capsys.readouterr().out

    def no_spark():  # noqa: ANN202
        raise AssertionError("the plans were analysed before: Spark must not start for them")

    pipeline = load_pipeline(h.pipeline_dir)
    assert check_pipeline(no_spark, pipeline, home=h.home) is None
    # another plan (more kept MIN/MAX values) is analysed again
    stage = pipeline.views["per_window__stage1"]
    plan = replace(stage.plan, aggregate=replace(stage.plan.aggregate, min_max_cache=3))
    assert check_pipeline(lambda: spark, _with_plan(pipeline, stage.name, plan), home=h.home) is not None


#: The forms of the planner's corpus whose plans are most unlike the query as written (windows
#: moved into inputs, stages, grouping sets): Spark analyses every frame of their epochs.
ANALYSED_FORMS = (
    "tumble", "tumble_struct", "tumble_call_selected", "hop", "hop_start_time", "window_having", "window_ordinal",
    "window_over_join", "window_of_two_inputs", "session", "session_alone", "hot_items", "in_list_join",
    "not_in_list_grouped", "group_by_all", "group_by_all_global", "having_alias", "rollup_under_a_key", "grouping_sets",
    "top_groups", "ranked_groups", "exploded",
)


def test_spark_names_every_form_as_the_loader_does_and_analyses_their_plans(spark, tmp_path: Path) -> None:
    """Every query of the planner's corpus is one Spark accepts, with the output columns the loader
    found; the plans of the trickiest ones analyse in Spark, every stage and part of them."""
    pipeline = load_corpus(tmp_path, {name: query for name, (query, _) in CORPUS_FORMS.items()})
    schemas = written_schemas(spark, pipeline)
    inputs = {source: spark.createDataFrame([], schemas(source)) for source in pipeline.sources}
    for name, (query, _) in CORPUS_FORMS.items():
        spark_names = tuple(c.lower() for c in sql_over(spark, query, inputs).columns)
        assert spark_names == pipeline.views[name].columns, name

    def form(name: str) -> str:  # the view a stage belongs to, through stages of stages
        while pipeline.views[name].internal_of is not None:
            name = pipeline.views[name].internal_of
        return name

    subset = replace(pipeline, views={n: v for n, v in pipeline.views.items() if form(n) in ANALYSED_FORMS})
    assert analyse_pipeline(spark, subset, schemas) == []


def test_a_variant_column_is_refused_by_name_with_to_json_and_the_rewrite_runs(spark, tmp_path: Path) -> None:
    """Issue 60 item 16: a VARIANT output loaded, then failed its plan analysis as a planner bug
    (GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE: changes are netted by grouping whole rows), and so did a
    view on it. It is refused as the user's, naming the column and the rewrite; the rewrite runs."""
    views = {
        "as_variant": "SELECT id, CAST(CAST(price AS DECIMAL(9, 2)) AS VARIANT) AS v FROM orders",
        "on_variant": "SELECT id, v FROM as_variant",
        "nested": "SELECT id, named_struct('p', parse_json(item)) AS s FROM orders",
    }
    h = make_harness(tmp_path, files(views))
    pipeline = load_pipeline(h.pipeline_dir)
    with pytest.raises(PipelineError) as refused:
        check_pipeline(lambda: spark, pipeline)
    messages = sorted(issue.message for issue in refused.value.issues)
    # the view on it is not reported again: its input's refusal is the root cause
    assert len(messages) == 2, messages
    assert messages[0].startswith("view as_variant: column(s) v hold a VARIANT")
    assert messages[1].startswith("view nested: column(s) s hold a VARIANT")
    assert all("to_json(...)" in m and "planner" not in m for m in messages)
    fixed = {
        "as_json": "SELECT id, to_json(CAST(CAST(price AS DECIMAL(9, 2)) AS VARIANT)) AS v FROM orders",
        "on_json": "SELECT id, parse_json(v) IS NOT NULL AS parsed, v FROM as_json",
    }
    h = make_harness(tmp_path / "fixed", files(fixed))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    run_epochs(h, dg.DagsterInstance.ephemeral(), spark, fixed, EPOCHS[:2])


#: Inner joins no key partitions (refused before): each term of the delta rule reads the other side whole
KEYLESS_JOINS = {
    "pairs": "SELECT o.id, c.id AS cid FROM orders o CROSS JOIN customers c",
    "comma_range": "SELECT o.id, c.region FROM orders o, customers c WHERE o.qty > c.tier",
    "theta": "SELECT o.id, c.id AS cid, c.tier FROM orders o JOIN customers c ON o.cust < c.id",
    # grouped over a cross join: the join is a keyless stage, the groups keyed by region over it
    "cross_grouped": "SELECT c.region, count(*) AS n, sum(o.qty) AS q FROM orders o CROSS JOIN customers c "
    "GROUP BY c.region",
    # an equi-join, then a cross join with a third input
    "mixed": "SELECT o.id, c.region, t.id AS tid FROM orders o JOIN customers c ON o.cust = c.id "
    "CROSS JOIN customers t",
}


@ENGINES
def test_inner_joins_without_a_key_match_batch_after_changes_on_both_sides(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    use_engine(monkeypatch, engine)
    h = make_harness(tmp_path, files(KEYLESS_JOINS))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    for name in ("pairs", "comma_range", "theta", "mixed", "cross_grouped__stage1"):
        assert (pipeline.views[name].plan.rule, pipeline.views[name].plan.key_classes) == ("delta join", ()), name
    # inserts on both sides, then deletes and updates on both (EPOCHS 2 and 3), and one side alone
    run_epochs(h, dg.DagsterInstance.ephemeral(), spark, KEYLESS_JOINS, EPOCHS)


#: Unordered aggregates as written (refused before, or left to the order rows arrive in)
UNORDERED = {
    "lists": "SELECT cust, collect_list(item) AS items, collect_set(qty) AS qtys, "
    "array_agg(price) FILTER (WHERE qty > 1) AS big FROM orders GROUP BY cust",
    "ties": "SELECT cust, max_by(item, qty) AS top_item, min_by(item, qty) AS low_item FROM orders GROUP BY cust",
}
#: ... and the batch they must equal: the canonical order, written out (lists compared as sorted)
UNORDERED_ORACLE = {
    "lists": "SELECT cust, array_sort(collect_list(item)) AS items, array_sort(collect_set(qty)) AS qtys, "
    "array_sort(array_agg(price) FILTER (WHERE qty > 1)) AS big FROM orders GROUP BY cust",
    "ties": "SELECT cust, max_by(item, struct(qty, item)) AS top_item, "
    "min_by(item, if(qty IS NULL, NULL, struct(qty, item))) AS low_item FROM orders GROUP BY cust",
}
#: groups whose rows tie on qty with different items, as ties come and go
TIED_EPOCHS = [
    ([order(1, 1, "b", 2, 1.0), order(2, 1, "a", 2, 2.0), order(3, 1, "c", 1, 3.0), order(4, 2, "x", 5, 1.5)], []),
    ([order(1, op="delete"), order(5, 1, "z", 2, 4.0), order(6, 2, "y", 5, 2.5)], []),
    ([order(2, 1, "a", 1, 2.0), order(5, op="delete"), order(7, 2, "w", None, 1.0)], []),
]


def test_unordered_aggregates_get_a_canonical_order_and_match_batch(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, files(UNORDERED))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    assert "ARRAY_SORT(COLLECT_LIST(item))" in pipeline.views["lists"].query
    instance = dg.DagsterInstance.ephemeral()
    for orders, customers in TIED_EPOCHS:
        append_records(h.home / "data" / "orders", orders)
        append_records(h.home / "data" / "customers", customers)
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        assert_views_match_batch(h.runtime(spark), UNORDERED_ORACLE)


#: EXISTS tests that are not a top-level conjunct of WHERE (refused before): each a left join with
#: the subquery's distinct correlated keys, tested for a match
EXISTS_UNDER_OR = {
    "big_or_eu": "SELECT o.id, o.qty FROM orders o WHERE o.qty > 3 OR EXISTS "
    "(SELECT 1 FROM customers c WHERE c.id = o.cust AND c.region = 'eu')",
    "unknown_or_cheap": "SELECT o.id FROM orders o WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = o.cust) "
    "OR o.price < 10",
    # a column of the select list (refused before too)
    "vip_flag": "SELECT o.id, EXISTS (SELECT 1 FROM customers c WHERE c.id = o.cust AND c.tier > 1) AS vip "
    "FROM orders o",
    # grouped by another key: the filtered join is a stage
    "tiered_items": "SELECT o.item, count(*) AS n FROM orders o WHERE o.qty IS NULL OR (o.qty > 0 AND EXISTS "
    "(SELECT 1 FROM customers c WHERE c.id = o.cust AND c.tier > 1)) GROUP BY o.item",
}


#: Scalar subqueries of one aggregate (refused before): a left join with the aggregate grouped by
#: the correlated columns (count's missing match is 0, the others' NULL), or a cross join with its one row
SCALAR_AS_JOINS = {
    "orders_per_customer": "SELECT c.id, (SELECT count(*) FROM orders o WHERE o.cust = c.id AND o.qty > 1) AS n, "
    "(SELECT max(o.price) FROM orders o WHERE o.cust = c.id) AS top FROM customers c",
    "above_customer_mean": "SELECT o.id FROM orders o WHERE o.price > (SELECT avg(o2.price) FROM orders o2 "
    "WHERE o2.cust = o.cust) - 5",
    "above_mean": "SELECT o.id, o.price FROM orders o WHERE o.price >= (SELECT avg(o2.price) FROM orders o2)",
    "top_tier": "SELECT c.id FROM customers c WHERE c.tier = (SELECT max(c2.tier) FROM customers c2)",
    # (a, b) IN (subquery) in WHERE: the EXISTS it equals (refused before too)
    "qty_is_tier": "SELECT o.id FROM orders o WHERE o.price > 1 AND (o.cust, o.qty) IN (SELECT c.id, c.tier FROM "
    "customers c)",
}


def test_exists_under_or_and_scalar_subqueries_are_joins_and_match_batch(spark, tmp_path: Path) -> None:
    views = {**EXISTS_UNDER_OR, **SCALAR_AS_JOINS}
    h = make_harness(tmp_path, files(views))
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    pipeline = load_pipeline(h.pipeline_dir)
    assert "LEFT JOIN" in pipeline.views["big_or_eu"].plan.query
    assert "LEFT JOIN" in pipeline.views["orders_per_customer"].plan.query
    assert "CROSS JOIN" in pipeline.views["above_mean"].plan.query
    run_epochs(h, dg.DagsterInstance.ephemeral(), spark, views)
