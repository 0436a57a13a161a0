"""Sinks into a real PostgreSQL server through the whole runtime: epochs of a log source, a view,
an upsert sink batching two epochs per transaction and an append-only sink, each written by several
Spark writer tasks. The target is read back with psycopg and compared with what the produced
records say it must hold, computed here in Python."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from tests.epochal_harness import make_harness
from tests.test_compaction import run_epoch
from tests.test_postgres_sink import database, prepared, sql_rows  # noqa: F401 - the fixture

PIPELINE = """
CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW totals AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;

CREATE SINK totals_pg FROM totals
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'totals',
      type = 'upsert', primary_key = 'customer', commit_checkpoint_interval = '2', writers = '3');

CREATE SINK orders_pg FROM orders
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', schema = 'raw',
      table = 'orders');
"""


def test_postgres_sinks_hold_every_committed_epoch_exactly_once(spark, tmp_path: Path, database: str) -> None:  # noqa: ANN001, F811
    h = make_harness(tmp_path, {"p.sql": PIPELINE.format(db=database)})
    runtime = h.runtime(spark)
    produced: list[dict] = []
    epochs = []
    for i in range(5):
        batch = [{"id": 10 * i + j, "customer": f"c{(i + j) % 4}", "amount": j + i} for j in range(6)]
        produced += batch
        h.produce([json.dumps(r) for r in batch])
        epochs.append(run_epoch(runtime))
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in produced:
            totals[r["customer"]][0] += r["amount"]
            totals[r["customer"]][1] += 1
        delivered = runtime.controller.sink_coordinator.delivered_epoch("totals_pg")
        if i % 2 == 1:  # a batch of two epochs is full: the upsert sink holds everything
            assert delivered == epochs[-1]
            assert sorted(sql_rows(database, "SELECT customer, total, n FROM totals")) == sorted(
                (c, t, n) for c, (t, n) in totals.items()
            )
        else:  # the sink waits for the batch's second epoch, and says so
            assert delivered == (epochs[-2] if i else None)
            assert runtime.controller.status()["sinks"]["totals_pg"]["lag_epochs"] == 1
        # the append-only sink delivers every epoch, each row once
        assert Counter(sql_rows(database, "SELECT id, customer, amount FROM raw.orders")) == Counter(
            (r["id"], r["customer"], r["amount"]) for r in produced
        )
    assert prepared(database) == []  # no prepared transaction is left behind
    batches = runtime.controller.sink_coordinator.batches("totals_pg")
    assert [(b.id.first_epoch, b.id.last_epoch, b.state.value) for b in batches] == [
        (epochs[0], epochs[1], "COMMITTED"),
        (epochs[2], epochs[3], "COMMITTED"),
    ]
    # each writer task covered its vnodes and pre-committed once
    assert all(len(b.results) == 3 for b in batches)
