"""A source with a PRIMARY KEY through the real epoch_job: updates and deletes become retractions
that flow through incremental and full views into upsert sinks, all checked against oracles."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from tests.consistency import assert_sink_exactly_once, assert_source_exact, assert_views_match_batch, multiset
from tests.epochal_harness import make_harness

FILES = {
    "pipeline.sql": """
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW large_orders AS
SELECT id, customer, amount FROM orders WHERE amount >= 10;

CREATE MATERIALIZED VIEW spend WITH (refresh = 'full') AS
SELECT customer, count(*) AS orders, sum(amount) AS total, min(amount) AS smallest FROM orders GROUP BY customer;

CREATE SINK large_out FROM large_orders
WITH (connector = 'duckdb', database = 'out/o.duckdb', table = 'large', type = 'upsert', primary_key = 'id');

CREATE SINK spend_out FROM spend
WITH (connector = 'duckdb', database = 'out/o.duckdb', table = 'spend', type = 'upsert', primary_key = 'customer');
""",
}
VIEWS = {
    "large_orders": "SELECT id, customer, amount FROM orders WHERE amount >= 10",
    "spend": "SELECT customer, count(*) AS orders, sum(amount) AS total, min(amount) AS smallest "
    "FROM orders GROUP BY customer",
}


def rec(i: int, customer: str | None = None, amount: float | None = None, op: str | None = None) -> str:
    body = {"id": i}
    if customer is not None:
        body.update(customer=customer, amount=amount, ts="2026-01-01T10:00:00")
    if op:
        body["_op"] = op
    return json.dumps(body)


def test_updates_and_deletes_flow_through_views_into_sinks(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES)
    instance = dg.DagsterInstance.ephemeral()
    model: dict[int, tuple[str, float]] = {}
    epochs = [
        [rec(1, "ann", 5), rec(2, "bob", 20), rec(3, "ann", 30)],
        [rec(1, "ann", 15), rec(2, op="delete"), rec(4, "cat", 1)],  # update crosses the filter; delete
        [rec(3, "ann", 30), rec(5, "bob", 2), rec(5, "bob", 12, op="update")],  # no-op upsert; two ops on 5
        [rec(3, op="delete"), rec(9, op="delete"), rec(2, "bob", 7)],  # smallest of ann removed; re-insert 2
    ]
    for batch in epochs:
        h.produce(batch)
        for line in batch:
            r = json.loads(line)
            if r.get("_op") == "delete":
                model.pop(r["id"], None)
            else:
                model[r["id"]] = (r["customer"], float(r["amount"]))
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        runtime = h.runtime(spark)
        state = multiset(runtime.state("orders").select("id", "customer", "amount").collect())
        assert state == multiset((i, c, a) for i, (c, a) in model.items())
        assert assert_source_exact(runtime, "orders") == len(model)  # the oracle resolves upserts alike
        assert_views_match_batch(runtime, VIEWS)
    assert assert_sink_exactly_once(runtime, "large_out") == 2  # 1 (ann 15) and 5 (bob 12)
    assert assert_sink_exactly_once(runtime, "spend_out") == 3
    # The no-op upsert of id 3 in the third epoch changed nothing: the source's change was only id 5's.
    records = instance.fetch_materializations(dg.AssetKey("orders"), limit=10).records
    assert sorted(r.asset_materialization.metadata["rows_out"].value for r in records)[0] == 1
