"""A CREATE SOURCE stores nothing once no reader needs its rows, as in RisingWave: its change files
go once delivered, and its rows at an epoch are read back from its connector (a query, a new
view's state). A view that reads it as state makes it keep its rows again, starting from its
connector; when that view goes, it stores nothing again. On real Spark and DuckDB, against the
batch oracle, which reads the log files itself."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from epochal.backfill.runner import BackfillRunner
from epochal.cli.main import main
from epochal.incremental.state_needs import inputs_read_as_state, sources_kept_as_state, sources_storing_nothing
from epochal.pipeline.loader import load_pipeline
from epochal.query.cut import run_query
from tests.consistency import Oracle, assert_sink_exactly_once, assert_source_exact, assert_views_match_batch
from tests.epochal_harness import VIEW_QUERIES, make_harness

TOTALS = "SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS top FROM orders GROUP BY customer"
# keyed: each epoch reads orders' rows at the customers it touches
TOP2 = (
    "SELECT id, customer, amount FROM (SELECT id, customer, amount, row_number() OVER "
    "(PARTITION BY customer ORDER BY amount DESC, id) AS rn FROM orders) WHERE rn <= 2"
)


def order(i: int, customer: str, amount: float) -> str:
    return f'{{"id": {i}, "customer": "{customer}", "amount": {amount}, "ts": "2026-01-01T10:00:00"}}'


def _run(h, instance) -> None:  # noqa: ANN001
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def _produce(h, epoch: int) -> None:  # noqa: ANN001
    h.produce([order(100 * epoch + j, f"c{j % 4}", 3.0 + (7 * j + epoch) % 40) for j in range(60)])


def _stored_files(runtime, table: str) -> int:  # noqa: ANN001
    return runtime.warehouse.table_file_count(table)


def test_which_sources_store_their_rows(tmp_path: Path) -> None:
    pipeline_dir = tmp_path / "pipeline"
    pipeline_dir.mkdir()
    (pipeline_dir / "p.sql").write_text(
        """
CREATE SOURCE s (k BIGINT, v BIGINT) WITH (connector = 'log', path = 's');
CREATE SOURCE j (k BIGINT, w BIGINT) WITH (connector = 'log', path = 'j');
CREATE SOURCE f (k BIGINT) WITH (connector = 'log', path = 'f');
CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT) WITH (connector = 'log', path = 't');
CREATE MATERIALIZED VIEW linear AS SELECT k, v * 2 AS v2 FROM s WHERE v > 0;
CREATE MATERIALIZED VIEW extremes AS SELECT k, min(v) AS lo, max(v) AS hi, count(*) AS n FROM s GROUP BY k;
CREATE MATERIALIZED VIEW joined AS SELECT s.k, j.w FROM s JOIN j ON s.k = j.k;
CREATE MATERIALIZED VIEW full_copy WITH (refresh = 'full') AS SELECT k FROM f;
CREATE MATERIALIZED VIEW over_t AS SELECT k, max(v) AS hi FROM t GROUP BY k;
"""
    )
    pipeline = load_pipeline(pipeline_dir)
    views = pipeline.views
    assert inputs_read_as_state(views["linear"], {"s"}) == set()
    # a MIN/MAX (its partial-aggregate stage) over a source that only appends never rebuilds a
    # group from it...
    assert inputs_read_as_state(views["extremes__stage1"], {"s"}) == set()
    # ...but over an input that deletes it may
    assert inputs_read_as_state(views["over_t__stage1"], set()) == {"t"}
    assert inputs_read_as_state(views["joined"], {"s", "j"}) == {"s", "j"}
    assert inputs_read_as_state(views["full_copy"], {"f"}) == {"f"}
    assert sources_kept_as_state(pipeline) == {"s", "j", "f"}  # a TABLE always stores: never listed
    text = (pipeline_dir / "p.sql").read_text()
    (pipeline_dir / "p.sql").write_text("\n".join(line for line in text.splitlines() if "VIEW joined" not in line))
    assert sources_storing_nothing(load_pipeline(pipeline_dir)) == {"s", "j"}


def test_a_source_stores_nothing_until_a_view_reads_it_as_state(spark, tmp_path: Path, monkeypatch, capsys) -> None:
    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW order_totals AS {TOTALS};")
    views = {"big_orders": VIEW_QUERIES["big_orders"], "big_bids": VIEW_QUERIES["big_bids"], "order_totals": TOTALS}
    instance = dg.DagsterInstance.ephemeral()
    for epoch in range(3):
        _produce(h, epoch)
        _run(h, instance)
        report = h.runtime(spark).compact(every=1)
        assert report.metadata["failures"] == "none", report.metadata
    runtime = h.runtime(spark)
    # Read only by a linear view and a MIN/MAX aggregate, orders and bid keep no file once the sinks
    # delivered their epochs; their rows come back from the connectors.
    assert runtime.controller.catalog.snapshots("orders") == []
    assert _stored_files(runtime, "orders") == 0 and _stored_files(runtime, "bid") == 0
    assert assert_source_exact(runtime, "orders") == 180
    for key, value in h.env.items():
        monkeypatch.setenv(key, value)
    main(["status"])
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "stores nothing" in line]
    assert shown == ["bid", "orders"]
    main(["status", "--json"])
    assert json.loads(capsys.readouterr().out)["sources_storing_nothing"] == ["bid", "orders"]
    oracle_rows = Oracle(runtime).source_rows("orders")
    total = sum(row[2] for row in oracle_rows)
    _, [(count, amount)], _ = run_query(runtime, "SELECT count(*), sum(amount) FROM orders")
    assert (count, round(amount, 6)) == (180, round(total, 6))
    assert_views_match_batch(runtime, views)
    assert_sink_exactly_once(runtime, "orders_out")

    # A keyed view over orders: backfilled from the connector's splits, then it reads orders' rows
    # every epoch, so orders keeps them again (its first snapshot read from the connector).
    (h.pipeline_dir / "top.sql").write_text(f"CREATE MATERIALIZED VIEW top2 AS {TOP2};")
    # and a sink over orders itself: its snapshot batch is orders' rows before it, which its files
    # no longer hold, so they come from the connector too
    (h.pipeline_dir / "raw.sql").write_text(
        "CREATE SINK raw_orders FROM orders WITH (connector = 'duckdb', database = 'out/raw.duckdb', "
        "table = 'raw_orders', type = 'append-only');"
    )
    _produce(h, 3)
    _run(h, instance)
    BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    for epoch in (4, 5):
        _produce(h, epoch)
        _run(h, instance)
        assert h.runtime(spark).compact(every=1).metadata["failures"] == "none"
    runtime = h.runtime(spark)
    assert runtime.controller.status()["backfills"]["top2"]["phase"] == "done"
    snapshots = runtime.controller.catalog.snapshots("orders")
    assert snapshots and snapshots[-1].epoch == runtime.controller.epoch_log.committed_epoch()
    assert assert_source_exact(runtime, "orders") == 360
    assert_views_match_batch(runtime, {**views, "top2": TOP2})
    assert assert_sink_exactly_once(runtime, "raw_orders") == 360

    # Without it, orders stores nothing again: its snapshots and change files go.
    (h.pipeline_dir / "top.sql").unlink()
    _produce(h, 6)
    _run(h, instance)
    runtime = h.runtime(spark)
    runtime.compact(every=1)
    assert runtime.controller.catalog.snapshots("orders") == []
    assert _stored_files(runtime, "orders") == 0
    assert assert_source_exact(runtime, "orders") == 420
    assert_views_match_batch(runtime, views)
    assert_sink_exactly_once(runtime, "orders_out")
    assert assert_sink_exactly_once(runtime, "raw_orders") == 420
