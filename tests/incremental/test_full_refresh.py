"""Views WITH (refresh = 'full'): any query, maintained by recompute-and-diff, emitting a proper
change log (retractions included) that stateless views and upsert sinks downstream consume."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import SMALL_PIPELINE, make_harness

FULL_VIEWS = {
    "order_totals": "SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS biggest "
    "FROM orders GROUP BY customer",
    "top_bid": "SELECT auction, bidder, price FROM (SELECT auction, bidder, price, ROW_NUMBER() OVER "
    "(PARTITION BY auction ORDER BY price DESC, bidder) AS rn FROM bid) WHERE rn = 1",
    "customer_bids": "SELECT o.customer, count(*) AS bids FROM orders o JOIN bid b ON o.id = b.auction % 5 "
    "GROUP BY o.customer HAVING count(*) > 1",
    # an inline lookup table: VALUES reads no input (its rows are constant), every customer listed
    "customer_tiers": "SELECT t.customer, t.tier, count(o.id) AS n FROM VALUES ('ann', 'gold'), ('dan', 'new') "
    "AS t(customer, tier) LEFT JOIN orders o ON o.customer = t.customer GROUP BY t.customer, t.tier",
    # a recursive CTE (incremental views refuse it by name; it made a cycle among views)
    "order_bands": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
    "SELECT o.id, r.n FROM orders o JOIN r ON o.id % 3 + 1 = r.n",
    # a LATERAL subquery (incremental views refuse it by name; its columns read as unknown)
    "customer_counts": "SELECT c.customer, t.n, t.top FROM (SELECT DISTINCT customer FROM orders) c, "
    "LATERAL (SELECT count(*) AS n, max(o.amount) AS top FROM orders o WHERE o.customer = c.customer) t",
}
DOWNSTREAM = {"big_customers": "SELECT customer, total FROM order_totals WHERE total > 50"}

FILES = {
    **SMALL_PIPELINE,
    "full.sql": "\n".join(
        f"CREATE MATERIALIZED VIEW {name} WITH (refresh = 'full') AS {query};" for name, query in FULL_VIEWS.items()
    )
    + "\n"
    + "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {query};" for name, query in DOWNSTREAM.items())
    + """
CREATE SINK totals_out FROM order_totals
WITH (connector = 'duckdb', database = 'out/totals.duckdb', table = 'totals', type = 'upsert',
      primary_key = 'customer');
CREATE SINK big_customers_out FROM big_customers
WITH (connector = 'duckdb', database = 'out/totals.duckdb', table = 'big', type = 'upsert',
      primary_key = 'customer');
""",
}


def order(i: int, customer: str, amount: float) -> str:
    return f'{{"id": {i}, "customer": "{customer}", "amount": {amount}, "ts": "2026-01-01T10:00:00"}}'


def test_full_refresh_views_match_batch_every_epoch(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES)
    instance = dg.DagsterInstance.ephemeral()
    batches = [
        [order(1, "ann", 30), order(2, "bob", 5), order(3, "ann", 25)],
        [order(4, "bob", 60), order(5, "cat", 1)],  # bob crosses 50: big_customers gains a row
        [],  # an epoch where orders is idle but bids flow
        [order(6, "ann", 100), order(7, "cat", 2)],  # ann's total and max change: retract + insert
    ]
    for batch in batches:
        h.produce(batch)
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        runtime = h.runtime(spark)
        assert_views_match_batch(runtime, {**FULL_VIEWS, **DOWNSTREAM})
    assert assert_sink_exactly_once(runtime, "totals_out") == 3
    assert assert_sink_exactly_once(runtime, "big_customers_out") == 2
    # The view's change log carries retractions: ann's row was replaced twice.
    from epochal.query.cut import run_query

    _, rows, _ = run_query(runtime, "SELECT customer, n, total, biggest FROM order_totals ORDER BY customer")
    assert rows == [("ann", 3, 155.0, 100.0), ("bob", 2, 65.0, 60.0), ("cat", 2, 3.0, 2.0)]
    meta = instance.fetch_materializations(dg.AssetKey("order_totals"), limit=1).records[0]
    assert meta.asset_materialization.metadata["mode"].value == "full"
