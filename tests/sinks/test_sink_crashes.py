"""SIGKILL a real `dagster job execute` at each point of a sink's two-phase commit, with sinks into
PostgreSQL (upsert, three writers), Delta Lake (append-only) and Iceberg (upsert), then run again
and check every target against what the produced records say it must hold (computed here), with no
prepared transaction left and exactly one Delta commit / Iceberg snapshot per delivered batch."""

from __future__ import annotations

import json
import signal
from collections import Counter, defaultdict
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from epochal.checkpoint.sinks.batches import SinkBatchState
from tests.consistency import iceberg_table
from tests.epochal_harness import crash_points, make_harness
from tests.sinks.test_postgres_sink import database, prepared, sql_rows  # noqa: F401 - the fixture

PIPELINE = """
CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW totals AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;

CREATE SINK totals_pg FROM totals
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'totals',
      type = 'upsert', primary_key = 'customer', writers = '3');

CREATE SINK orders_delta FROM orders WITH (connector = 'deltalake', location = 'lake/orders');

CREATE SINK totals_iceberg FROM totals
WITH (connector = 'iceberg', namespace = 'sales', table = 'totals', type = 'upsert', primary_key = 'customer');
"""

ORDERS = [{"id": i, "customer": f"c{i % 4}", "amount": i * 3} for i in range(24)]


def expected_totals(orders: list[dict]) -> Counter:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in orders:
        totals[r["customer"]][0] += r["amount"]
        totals[r["customer"]][1] += 1
    return Counter((c, t, n) for c, (t, n) in totals.items())


@pytest.mark.slow
# The suite kills between two writers' COMMIT PREPARED (recovery finishes the batch) and after the
# targets committed it (recovery must see that, not write twice); TESTS_CRASH_MATRIX=all also kills
# after the writers prepared and after the batch was recorded PENDING.
@pytest.mark.parametrize(
    "point",
    crash_points(
        ["sink-prepared", "sink-pending", "sink-commit-midway", "sink-committed"],
        suite=["sink-commit-midway", "sink-committed"],
    ),
)
def test_sinks_are_exact_after_a_crash_inside_their_commit(spark, tmp_path: Path, database: str, point: str) -> None:  # noqa: ANN001, F811
    h = make_harness(tmp_path, {"p.sql": PIPELINE.format(db=database)})
    instance = dg.DagsterInstance.ephemeral()
    h.produce([json.dumps(r) for r in ORDERS[:12]])
    first = h.run_in_process(instance)
    assert first.success, [e.message for e in first.all_events if e.is_failure]

    h.produce([json.dumps(r) for r in ORDERS[12:]])
    crashed = h.run_subprocess(fault=point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert point in crashed.stderr

    recovered = h.run_in_process(instance)
    assert recovered.success, [e.message for e in recovered.all_events if e.is_failure]

    runtime = h.runtime(spark)
    committed = runtime.controller.epoch_log.committed_epoch()
    coordinator = runtime.controller.sink_coordinator
    for sink in ("totals_pg", "orders_delta", "totals_iceberg"):
        assert coordinator.delivered_epoch(sink) == committed, sink
        assert not [b for b in coordinator.batches(sink) if b.state is SinkBatchState.PENDING], sink

    # PostgreSQL: the view by key, nothing left prepared
    assert Counter(sql_rows(database, "SELECT customer, total, n FROM totals")) == expected_totals(ORDERS)
    assert prepared(database) == []

    # Delta: every order once; one commit per delivered batch (plus the table's creation)
    delta = DeltaTable(str(h.home / "lake" / "orders"))
    got = delta.to_pyarrow_table().to_pylist()
    assert Counter((r["id"], r["customer"], r["amount"]) for r in got) == Counter(
        (r["id"], r["customer"], r["amount"]) for r in ORDERS
    )
    batches = [b for b in coordinator.batches("orders_delta") if b.state is SinkBatchState.COMMITTED]
    writes = [c for c in delta.history() if c.get("operation") != "CREATE TABLE"]
    assert len(writes) == len(batches), (writes, batches)
    assert delta.transaction_version("orders_delta") == committed

    # Iceberg, opened as another tool would: the view by key; at most one snapshot per batch
    table = iceberg_table(h.home, "sales.totals")
    got = table.scan().to_arrow().to_pylist()
    assert Counter((r["customer"], r["total"], r["n"]) for r in got) == expected_totals(ORDERS)
    epochs = [s.summary.additional_properties.get("epochal.epoch") for s in table.snapshots()]
    mine = [e for e in epochs if e is not None]
    assert len(mine) == len(set(mine)), f"a batch was committed twice: {epochs}"
    ice_batches = [b for b in coordinator.batches("totals_iceberg") if b.state is SinkBatchState.COMMITTED]
    assert len(mine) == sum(1 for b in ice_batches if b.rows > 0)
