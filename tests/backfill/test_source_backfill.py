"""A view added over a SOURCE backfills its history split by split from the connector (a SOURCE's
history is its connector's), on real Spark and DuckDB: a busy split read in several chunks, an
idle split and an empty one that must not hold it back, a split that appears while it runs, and
live epochs committing throughout. Checked against the batch oracle after the join and after
later epochs."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from epochal.backfill.runner import BackfillRunner
from epochal.cli.main import main
from epochal.errors import EpochalError
from epochal.query.cut import run_query
from tests.consistency import assert_views_match_batch
from tests.epochal_harness import make_harness

VIEWS = {
    # aggregate (partial state), linear, and a join with the other source's stored rows
    "order_totals": "SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS top "
    "FROM orders GROUP BY customer",
    "cheap_orders": "SELECT id, customer, amount FROM orders WHERE amount < 30",
    "order_bids": "SELECT o.customer, b.price FROM orders o JOIN (SELECT auction % 7 AS k, price FROM bid) b "
    "ON o.id = b.k",
}


def order(i: int, customer: str, amount: float) -> str:
    return f'{{"id": {i}, "customer": "{customer}", "amount": {amount}, "ts": "2026-01-01T10:00:00"}}'


def _run(h, instance) -> None:  # noqa: ANN001
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


@pytest.fixture
def small_chunks(monkeypatch):
    # The smallest chunk: the busy split's history (3,300 records) takes four, each persisted.
    monkeypatch.setenv("EPOCHAL_BACKFILL_CHUNK_ROWS", "1000")
    monkeypatch.setenv("EPOCHAL_BACKFILL_RANGE_ROWS", "1000")
    return monkeypatch


def test_a_view_over_a_source_backfills_per_split_with_an_idle_split_and_one_added_midway(
    spark, tmp_path: Path, small_chunks
) -> None:
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    # History: split "busy" gets orders every epoch; "idle" two in the first epoch, then nothing;
    # "empty" exists but never holds a record.
    h.produce([order(1, "c1", 12.0), order(2, "c2", 40.0)], split="idle")
    (h.home / "data" / "orders" / "empty.jsonl").touch()
    for epoch in range(3):
        h.produce([order(1000 * epoch + j, f"c{j % 5}", 5.0 + j % 40) for j in range(1100)], split="busy")
        _run(h, instance)
    report = h.runtime(spark).compact(every=1)
    assert report.metadata["failures"] == "none", report.metadata

    (h.pipeline_dir / "new.sql").write_text(
        "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {query};" for name, query in VIEWS.items())
    )
    h.produce([order(5000, "c1", 3.0)], split="busy")
    _run(h, instance)  # registers the backfills; their first run fixes the snapshot epoch
    h.produce([order(5001, "c1", 3.0)], split="busy")  # in the log, in no committed epoch yet

    # A bounded run reads some chunks of one view; the idle and empty splits are not waited for.
    # (500 rows a second: the busy split's 3,300 records cannot all be read in the 3 s it gets)
    runtime = h.runtime(spark, env={"EPOCHAL_BACKFILL_RATE_LIMIT": "500"})
    runner = BackfillRunner(runtime)
    runner.advance(views=["cheap_orders"], budget_s=3)
    shown = runtime.controller.status()["backfills"]["cheap_orders"]
    splits = shown["splits"]["orders"]
    assert set(splits) == {"busy", "idle", "empty"}, splits
    assert splits["empty"] == {"phase": "caching_up", "offset": 0, "target": 0, "rows": 0}
    assert splits["busy"]["target"] == 3301  # the committed end at the snapshot epoch, not the log's end
    assert shown["splits_total"] == 3 and shown["splits_done"] >= 1
    assert set(shown["splits"]) == {"orders"}  # only the SOURCE inputs it reads
    with pytest.raises(EpochalError, match=r"cheap_orders is backfilling.*\d/3 source splits read"):
        run_query(runtime, "SELECT count(*) FROM cheap_orders")
    # A restart forgets the chunks read, files included; the next epoch starts it again.
    for key, value in h.env.items():
        small_chunks.setenv(key, value)
    old_root = runtime.warehouse.backfill_root(
        "cheap_orders", runtime.controller.backfills.get("cheap_orders").snapshot_epoch
    )
    assert runtime.warehouse.child_dirs(f"{old_root}/splits")
    assert main(["backfill", "cheap_orders", "--restart"]) == 0
    assert not runtime.warehouse.exists(old_root)
    assert h.runtime(spark).controller.backfills.split_states("cheap_orders") == []
    _run(h, instance)  # starts it again
    # Paused, a run begins each backfill's splits (and so fixes its snapshot epoch), reading nothing.
    BackfillRunner(h.runtime(spark, env={"EPOCHAL_BACKFILL_RATE_LIMIT": "0"})).advance(budget_s=60)

    # A split appears while the backfills run, and live epochs commit meanwhile.
    h.produce([order(6000, "c4", 8.0), order(6001, "c1", 70.0)], split="late")
    h.produce([order(6002, "c2", 9.0)], split="busy")
    _run(h, instance)

    reports = BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    by_view = {r.view: r for r in reports}
    assert by_view["cheap_orders"].metadata()["splits_total"] == 4
    # bid, a SOURCE too (nexmark, two splits), is read per split by the join.
    assert set(status_splits := h.runtime(spark).controller.status()["backfills"]["order_bids"]["splits"]) == {
        "orders",
        "bid",
    }, status_splits
    assert set(status_splits["bid"]) == {"0", "1"}
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    for name in VIEWS:
        entry = status["backfills"][name]
        assert entry["phase"] == "done", entry
        assert set(entry["splits"]["orders"]) == {"busy", "idle", "empty", "late"}, entry["splits"]
        assert entry["splits_done"] == entry["splits_total"], entry["splits"]
        assert {s["phase"] for by_split in entry["splits"].values() for s in by_split.values()} == {"finished"}
        # The split that appeared after the snapshot epoch had nothing to read: its records came
        # with the epochs the view took.
        assert entry["splits"]["orders"]["late"]["target"] == 0
        assert status["tables"][name] == status["committed_epoch"]
    # The rows read from the splits are deleted once the snapshot is published.
    for name in VIEWS:
        backfill = runtime.controller.backfills.get(name)
        root = runtime.warehouse.backfill_root(name, backfill.snapshot_epoch)
        assert not runtime.warehouse.exists(f"{root}/splits")
    assert_views_match_batch(runtime, VIEWS)

    for i in range(2):
        h.produce([order(7000 + i, "c1", 11.0)], split="late")
        h.produce([order(8000 + i, "c3", 2.0)], split="idle")
        _run(h, instance)
        assert_views_match_batch(h.runtime(spark), VIEWS)
