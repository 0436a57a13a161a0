"""Views added to a running pipeline backfill: a snapshot of their inputs at a fixed epoch, range by
range of the key space, then their inputs' change logs epoch by epoch, then they join commit
alignment. Each test starts from a pipeline with committed epochs and a compaction done (the new
view's inputs are read from snapshots), adds views, and checks them against the batch oracle at
every epoch after the join, while live epochs go on committing."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from epochal.backfill.runner import BackfillRunner
from tests.consistency import assert_views_match_batch
from tests.epochal_harness import make_harness

#: one of each kind: linear, aggregate (partial), join, top-N, and a view on a new view
NEW_VIEWS = {
    "cheap_bids": "SELECT auction, bidder, price FROM bid WHERE price < 500",
    "bidder_counts": "SELECT bidder, count(*) AS n, sum(price) AS total, max(price) AS top FROM bid GROUP BY bidder",
    "auction_big": "SELECT b.auction, b.price, g.bidder AS big_bidder FROM bid b "
    "JOIN big_bids g ON b.auction = g.auction",
    "order_bids": "SELECT o.customer, b.price FROM orders o "
    "JOIN (SELECT auction % 7 AS k, price FROM bid) b ON o.id = b.k",
    "top_bid": "SELECT auction, bidder, price FROM (SELECT auction, bidder, price, ROW_NUMBER() OVER "
    "(PARTITION BY auction ORDER BY price DESC, bidder) AS rn FROM bid) WHERE rn = 1",
    "busy_bidders": "SELECT bidder, n FROM bidder_counts WHERE n > 1",
}

# Small ranges: the snapshot phase writes several vnode ranges however small the test's data.
ENV = {"EPOCHAL_BACKFILL_CHUNK_ROWS": "1000"}


def order(i: int, customer: str, amount: float) -> str:
    return f'{{"id": {i}, "customer": "{customer}", "amount": {amount}, "ts": "2026-01-01T10:00:00"}}'


def _views_file(views: dict[str, str]) -> str:
    return "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {query};" for name, query in views.items())


def _run(h, instance) -> None:
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def _history(h, spark, instance, epochs: int = 3) -> None:
    """Committed epochs with orders and bids, then a compaction of every table."""
    for i in range(epochs):
        h.produce([order(10 * i + j, f"c{j % 3}", 5.0 + 7 * j) for j in range(6)])
        _run(h, instance)
    report = h.runtime(spark).compact(every=1)
    assert report.metadata["failures"] == "none", report.metadata


@pytest.fixture
def monkeyenv(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


def test_new_views_backfill_while_epochs_commit_and_match_the_batch_oracle(spark, tmp_path: Path, monkeyenv) -> None:
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance)
    (h.pipeline_dir / "new.sql").write_text(_views_file(NEW_VIEWS))

    # The next epoch registers the new views as backfills and commits without them.
    _run(h, instance)
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    committed = status["committed_epoch"]
    for name in NEW_VIEWS:
        assert status["backfills"][name]["phase"] in ("snapshot", "waiting"), status["backfills"][name]
    assert status["backfills"]["busy_bidders"]["phase"] == "waiting"  # reads a backfilling view
    assert all(status["tables"][t] == committed for t in SMALL_PIPELINE_TABLES)

    # A first bounded run writes some vnode ranges; live epochs go on meanwhile.
    runner = BackfillRunner(runtime)
    runner.advance(views=["cheap_bids"], budget_s=0.001)
    h.produce([order(100, "c1", 40.0)])
    _run(h, instance)
    runner = BackfillRunner(h.runtime(spark))
    reports = runner.advance(budget_s=600)
    assert set(NEW_VIEWS) <= {r.view for r in reports}  # with the planner's stages of them
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    for name in NEW_VIEWS:
        assert status["backfills"][name]["phase"] == "done", status["backfills"][name]
        assert status["tables"][name] == status["committed_epoch"]
    assert_views_match_batch(runtime, NEW_VIEWS)

    # Joined: computed with every live epoch from now on, still equal to the oracle.
    for i in range(2):
        h.produce([order(200 + i, "c2", 77.0), order(300 + i, "vip", 1.0)])
        _run(h, instance)
        runtime = h.runtime(spark)
        assert_views_match_batch(runtime, NEW_VIEWS)
    assert not runtime.controller.status()["in_flight"]


SMALL_PIPELINE_TABLES = ["bid", "orders", "big_bids", "big_orders"]
