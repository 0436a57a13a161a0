"""Several epochs in flight, each with its own run, started at once in any order: the barrier
sensor's own pattern. A step that needs an earlier epoch waits for it instead of failing, nothing
recovers, every epoch commits, and views and sinks equal the batch oracle."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from epochal.checkpoint.records import EpochState
from epochal.runtime.facade import EpochRuntime
from tests.consistency import assert_sink_exactly_once, assert_view_matches_batch
from tests.epochal_harness import make_harness

FILES = {
    "pipeline.sql": """
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW large_orders AS SELECT id, customer, amount FROM orders WHERE amount >= 10;

CREATE MATERIALIZED VIEW spend AS
SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS biggest FROM orders GROUP BY customer;

CREATE MATERIALIZED VIEW top_order AS
SELECT customer, id, amount FROM (
  SELECT customer, id, amount, row_number() OVER (PARTITION BY customer ORDER BY amount DESC, id) AS rn
  FROM orders) WHERE rn = 1;

CREATE SINK spend_out FROM spend
WITH (connector = 'duckdb', database = 'out/o.duckdb', table = 'spend', type = 'upsert', primary_key = 'customer');
""",
}
VIEWS = {
    "large_orders": "SELECT id, customer, amount FROM orders WHERE amount >= 10",
    "spend": "SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS biggest FROM orders "
    "GROUP BY customer",
    "top_order": "SELECT customer, id, amount FROM (SELECT customer, id, amount, row_number() OVER "
    "(PARTITION BY customer ORDER BY amount DESC, id) AS rn FROM orders) WHERE rn = 1",
}


def run_epoch(runtime: EpochRuntime, epoch: int, run_id: str) -> None:
    """What epoch_job does for a partition: every source, the views in order, commit, sinks."""
    pipeline = runtime.pipeline
    for name in pipeline.sources:
        runtime.run_source(epoch, name, run_id)
    for name in pipeline.view_order():
        runtime.run_view(epoch, name, run_id)
    runtime.commit(epoch)
    for name in pipeline.sinks:
        runtime.run_sink(epoch, name, run_id)


def test_four_runs_for_consecutive_epochs_started_at_once_all_commit_without_recovery(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES)
    sensor = h.runtime(spark)
    sensor.recover("bootstrap")
    epochs = []
    for n in range(4):  # the sensor: records arrive, an epoch is injected each barrier interval
        h.produce(
            [
                json.dumps({"id": i, "customer": f"c{i % 3}", "amount": 5.0 * (i + n), "ts": "2026-01-01T10:00:00"})
                for i in range(n * 4, n * 4 + 6)
            ]  # overlapping ids: updates of earlier epochs' rows
            + ([json.dumps({"id": n, "_op": "delete"})] if n else [])
        )
        epochs.append(sensor.controller.epoch_log.inject(sensor.plan).epoch)

    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def run(epoch: int) -> None:
        runtime = h.runtime(spark)  # each run has its own runtime, as its own process would
        try:
            go.wait()
            run_epoch(runtime, epoch, f"run-{epoch}")
        except BaseException as exc:  # reported below, with the epoch
            errors.append(exc)
        finally:
            runtime.close()

    # The newest epoch's run first: every later step finds earlier epochs unwritten.
    threads = [threading.Thread(target=run, args=(e,)) for e in reversed(epochs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, f"a run failed: {errors!r}"
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    assert [runtime.controller.epoch_log.epoch(e).state for e in epochs] == [EpochState.COMMITTED] * 4
    assert status["last_recovery"]["reason"] == "bootstrap", "waiting for order must never start a recovery"
    assert status["epoch_counts"]["ABORTED"] == 0
    for name, query in VIEWS.items():
        assert_view_matches_batch(runtime, name, query)
    assert_sink_exactly_once(runtime, "spend_out")


def test_a_run_that_starts_late_takes_the_waiting_epochs_in_order_each_with_its_own_materializations(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """The sensor injected three epochs and requested a run for each; the first run to start takes
    all three and processes them in order in one process, and the runs requested for the others find
    nothing left. Every epoch commits with its own partition's materializations, without recovery;
    each epoch commits and reaches its sink before the next epoch's last view, not at the run's end."""
    import dagster as dg

    monkeypatch.setenv("EPOCHAL_STEP_THREADS", "2")
    h = make_harness(tmp_path, FILES)
    sensor = h.runtime(spark)
    sensor.recover("bootstrap")
    epochs = []
    for n in range(3):
        h.produce(
            [json.dumps({"id": i, "customer": f"c{i % 3}", "amount": 3.0 * (i + n), "ts": "2026-01-01T10:00:00"})
             for i in range(n * 3, n * 3 + 5)]
            + ([json.dumps({"id": n, "_op": "delete"})] if n else [])
        )
        epochs.append(sensor.controller.epoch_log.inject(sensor.plan).epoch)
    sensor.close()

    instance = dg.DagsterInstance.ephemeral()
    late = h.run_in_process(instance, partition=str(epochs[-1]), take_waiting=True)
    assert late.success
    for asset in ("orders", "spend", "top_order", "spend_out", "epoch_commit"):
        partitions = [e.partition for e in late.get_asset_materialization_events() if e.asset_key.path == [asset]]
        assert partitions == [str(e) for e in epochs], asset
    # Each step of the graph runs once per epoch, in epoch order, and never beside the same step of
    # another epoch (a table's epoch reads its epoch before).
    spans: dict[tuple[str, int], list[float]] = {}
    for record in instance.all_logs(late.run_id):
        event = record.dagster_event
        if event is not None and event.step_key and "[e" in event.step_key:
            if event.is_step_start or event.is_step_success:
                op_name, epoch = event.step_key[:-1].split("[e")
                spans.setdefault((op_name, int(epoch)), []).append(record.timestamp)
    ops = {op_name for op_name, _ in spans}
    assert {"source__orders", "view__spend", "commit", "sink__spend_out"} <= ops, ops
    for op_name in ops:
        runs = [spans[op_name, e] for e in epochs]
        assert all(len(r) == 2 for r in runs), (op_name, runs)
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False)), (op_name, runs)
    last_views_end = max(spans[op_name, epochs[-1]][1] for op_name in ops if op_name.startswith("view__"))
    assert spans["sink__spend_out", epochs[0]][1] <= last_views_end, spans

    empty = h.run_in_process(instance, partition=str(epochs[0]), take_waiting=True)
    assert empty.success and not empty.get_asset_materialization_events()

    runtime = h.runtime(spark)
    status = runtime.controller.status()
    assert [runtime.controller.epoch_log.epoch(e).state for e in epochs] == [EpochState.COMMITTED] * 3
    assert status["last_recovery"]["reason"] == "bootstrap"
    assert status["epoch_counts"]["ABORTED"] == 0
    for name, query in VIEWS.items():
        assert_view_matches_batch(runtime, name, query)
    assert_sink_exactly_once(runtime, "spend_out")
