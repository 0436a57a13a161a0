"""Aggregates over floating point stay exact under retractions. A SUM of DOUBLE adds in whatever
order Spark reads the rows, so the same rows can sum to values that differ in the last bit. A view
recomputed from its inputs must retract the rows it stored, not a recomputation of them: a
retraction that misses the stored row by a bit leaves it in the view for good."""

from __future__ import annotations

import json
import random
from pathlib import Path

from epochal.connectors.log import append_records
from tests.consistency import assert_view_matches_batch
from tests.epochal_harness import make_harness, run_epoch

TABLES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE, status STRING)
WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE TABLE customers (name STRING PRIMARY KEY, region STRING)
WITH (connector = 'log', path = 'data/customers', format = 'json');
"""
VIEWS = {
    # ROLLUP has no key a change can be restricted by: one partition, recomputed whole every epoch
    "rollup": "SELECT customer, status, sum(amount) AS total, avg(amount) AS mean FROM orders "
    "GROUP BY ROLLUP (customer, status)",
    # COUNT(DISTINCT) is no partial aggregate: recomputed at the customers an epoch touches
    "per_customer": "SELECT customer, count(DISTINCT status) AS statuses, sum(amount) AS total FROM orders "
    "GROUP BY customer",
    # the same without selecting its key: the stored rows cannot be found by key
    "per_customer_unselected": "SELECT count(DISTINCT status) AS statuses, sum(amount) AS total, "
    "avg(amount) AS mean FROM orders GROUP BY customer",
    # the same over a join, keyed by the join key, which the view selects
    # (its key column named in capitals: the loader names the view's columns in lower case)
    "per_region": "SELECT c.region, o.customer AS Customer, count(DISTINCT o.status) AS statuses, "
    "sum(o.amount) AS total FROM orders o JOIN customers c ON o.customer = c.name GROUP BY c.region, o.customer",
}


def test_views_recomputed_over_doubles_match_the_batch_at_every_epoch(spark, tmp_path: Path, caplog) -> None:  # noqa: ANN001
    statements = "".join(f"CREATE MATERIALIZED VIEW {n} AS {q};\n" for n, q in VIEWS.items())
    h = make_harness(tmp_path, {"p.sql": TABLES + statements})
    runtime = h.runtime(spark, {"EPOCHAL_COMPACT_EVERY": "2"})
    runtime.recover("bootstrap")
    plans = {n: runtime.pipeline.views[n].plan for n in VIEWS}
    assert plans["rollup"].key_classes == () and plans["per_customer"].output_keys == (0,)
    assert plans["per_region"].output_keys == (1,)  # o.customer
    assert plans["per_customer_unselected"].output_keys == ()  # so it is recomputed whole, and says why
    rng = random.Random(5)
    append_records(
        h.home / "data" / "customers", [json.dumps({"name": c, "region": rng.choice(["eu", "us"])}) for c in "abc"]
    )
    for _ in range(6):
        # updates of a few ids (amounts move between groups), some deletes, new ids
        # (amounts with every bit of a double used, and enough rows per group for the order of the
        # additions to matter)
        records = [
            {
                "id": rng.randrange(60),
                "customer": rng.choice("abc"),
                "amount": rng.uniform(0, 100) * 1.1,
                "status": rng.choice(["new", "paid"]),
            }
            for _ in range(40)
        ]
        records += [{"id": rng.randrange(60), "_op": "delete"}]
        append_records(h.home / "data" / "orders", [json.dumps(r) for r in records])
        runtime.compact(run_epoch(runtime))
        for view, query in VIEWS.items():
            assert_view_matches_batch(runtime, view, query)
    warned = [r.getMessage() for r in caplog.records if "recomputed whole" in r.getMessage()]
    assert len(warned) == 1 and "view per_customer_unselected" in warned[0] and "Select the key" in warned[0]
