"""Several epochs through the real epoch_job: in-process, and as `dagster job execute` would run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from epochal.checkpoint.records import Collected, EpochState
from tests.consistency import (
    assert_sink_exactly_once,
    assert_source_exact,
    assert_view_matches_batch,
    assert_views_match_batch,
    sink_rows,
)
from tests.epochal_harness import REPO, VIEW_QUERIES, make_harness

ORDERS = [
    '{"id": 1, "customer": "ann", "amount": 12.5, "ts": "2026-01-01T10:00:00"}',
    '{"id": 2, "customer": "vip", "amount": 3.0, "ts": "2026-01-01T10:01:00"}',
    '{"id": 3, "customer": "bob", "amount": 2.0, "ts": "2026-01-01T10:02:00"}',
    "{this is not json",
    '{"id": "four", "customer": "eve", "amount": 40, "ts": "2026-01-01T10:03:00"}',
    '{"id": 5, "customer": "vip", "amount": 99.0, "ts": "2026-01-01T10:04:00"}',
]


def materializations(instance: dg.DagsterInstance, asset: str) -> list[dg.AssetMaterialization]:
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=1000).records
    return [r.asset_materialization for r in records]


def test_epochs_end_to_end_in_process(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    h.produce(ORDERS[:3])
    instance = dg.DagsterInstance.ephemeral()
    for round_ in range(3):
        if round_ == 1:
            h.produce(ORDERS[3:], split="1")
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    runtime = h.runtime(spark)
    committed = runtime.controller.epoch_log.epochs([EpochState.COMMITTED])
    assert len(committed) == 3
    assert runtime.controller.status()["tables"] == dict.fromkeys(runtime.pipeline.tables, committed[-1].epoch)
    # The last epoch had no order to read: the source recorded an empty change without a file (or
    # a Spark job), and everything below still saw it as an empty change.
    idle = runtime.controller.epoch_log.collected(committed[-1].epoch)["orders"]
    assert idle.location is None and idle.rows_out == 0
    assert not (Path(runtime.warehouse.table_root("orders")) / f"epoch={committed[-1].epoch}").exists()
    # So did the views whose inputs were all idle (their change is empty by construction), and
    # the sinks below them still delivered that epoch (assert_sink_exactly_once checks progress).
    entries = runtime.controller.epoch_log.collected(committed[-1].epoch)
    quiet = [v for v, d in runtime.pipeline.views.items() if all(entries[u].rows_out == 0 for u in d.upstreams)]
    assert quiet and all(entries[v].location is None and entries[v].rows_out == 0 for v in quiet), quiet

    assert assert_source_exact(runtime, "bid") > 0
    assert assert_source_exact(runtime, "orders") == 4  # two of the six lines are dead letters
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert assert_sink_exactly_once(runtime, "big_bids_out") > 0
    # ann (amount 12.5), vip 2 (customer) and vip 5 (both branches: twice, as in the view)
    assert assert_sink_exactly_once(runtime, "orders_out") == 4

    # Every asset has one partitioned materialization per epoch, with the metadata the UI shows.
    keys = {str(r.epoch) for r in committed}
    for asset in [*runtime.pipeline.tables, "epoch_commit", *runtime.pipeline.sinks]:
        assert {m.partition for m in materializations(instance, asset)} == keys, asset
    bid_meta = materializations(instance, "bid")[0].metadata
    assert {"epoch", "records_read", "rows_out", "dead_letters", "offsets"} <= set(bid_meta)
    commit_meta = materializations(instance, "epoch_commit")[0].metadata
    assert {"committed_epoch", "lag_seconds", "in_flight"} <= set(commit_meta)
    assert set(instance.get_dynamic_partitions("epochs")) == keys

    # Dead letters: counted in the epoch's metadata, queryable with their reason, and not in the table.
    dead = sum(m.metadata["dead_letters"].value for m in materializations(instance, "orders"))
    assert dead == 2
    from epochal.query.cut import run_query

    columns, rows, epoch = run_query(runtime, "SELECT split, \"offset\", reason FROM orders__dead_letters ORDER BY 2")
    assert epoch == committed[-1].epoch and [(r[0], r[1]) for r in rows] == [("1", 0), ("1", 1)]
    assert all(r[2] for r in rows)
    # the same columns as with no dead letter yet: the files' epoch=E directory is not one of them
    columns, _, _ = run_query(runtime, "SELECT * FROM orders__dead_letters")
    assert list(columns) == ["split", "offset", "raw", "reason"], columns


def test_rerunning_an_epoch_is_idempotent(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    assert h.run_in_process(instance).success
    runtime = h.runtime(spark)
    epoch = runtime.controller.epoch_log.committed_epoch()
    before = sink_rows(runtime, "big_bids_out")
    again = h.run_in_process(instance, partition=str(epoch))
    assert again.success
    assert runtime.controller.epoch_log.committed_epoch() == epoch
    assert sink_rows(runtime, "big_bids_out") == before
    assert_view_matches_batch(runtime, "big_bids", VIEW_QUERIES["big_bids"])
    assert_source_exact(runtime, "bid")


def test_unknown_partition_fails_with_a_clear_message(tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    result = h.run_in_process(dg.DagsterInstance.ephemeral(), partition="12345")
    assert not result.success
    messages = " ".join(str(e.event_specific_data.error) for e in result.all_events if e.is_step_failure)
    assert "was never injected" in messages


def test_partition_window_keeps_recent_keys_and_all_data(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_PARTITION_WINDOW", "2")
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for _ in range(4):
        assert h.run_in_process(instance).success
    runtime = h.runtime(spark)
    committed = [str(r.epoch) for r in runtime.controller.epoch_log.epochs([EpochState.COMMITTED])]
    assert instance.get_dynamic_partitions("epochs") == committed[-2:]
    # Retired keys lose nothing: every epoch's rows are still in the table and the sink.
    assert_source_exact(runtime, "bid")
    assert_sink_exactly_once(runtime, "big_bids_out")


@pytest.mark.slow
def test_dagster_job_execute_and_cli(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness(tmp_path)
    h.cli("produce", "orders", stdin="\n".join(ORDERS[:3]) + "\n")
    # The repo's dagster.yaml in the working directory, as on a fresh clone without DAGSTER_HOME
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    for _ in range(2):
        proc = h.run_subprocess()
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # INFO by default: no Dagster DEBUG event on the console, and the run's summary is its last line
        output = proc.stdout + proc.stderr
        assert " - DEBUG - " not in output, [line for line in output.splitlines() if " - DEBUG - " in line][:5]
        dagster_lines = [line for line in output.splitlines() if " - dagster - " in line]
        assert re.search(r" - epoch_job: epoch \d+ .*committed; \d+ record\(s\) read", dagster_lines[-1]), output
    # Dagster's state persisted under ./.epochal/dagster: both runs are there, no temporary home is left
    assert not list(tmp_path.glob(".tmp_dagster_home_*"))
    monkeypatch.chdir(tmp_path)  # the yaml's paths are relative to the working directory
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:  # reads tmp_path/dagster.yaml
        runs = inst.get_runs()
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 2, runs
        assert (tmp_path / ".epochal" / "dagster" / "history" / "runs.db").exists()
        assert len(materializations(inst, "epoch_commit")) == 2  # what `dg dev` on this directory shows
    status = json.loads(h.cli("status", "--json").stdout)
    assert status["committed_epoch"] is not None and status["in_flight"] == [] and status["paused"] is False
    assert set(status["tables"].values()) == {status["committed_epoch"]}
    # The second run re-runs the committed epoch through the partition tag.
    proc = h.run_subprocess("--tags", json.dumps({"dagster/partition": str(status["committed_epoch"])}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runtime = h.runtime(spark)
    assert len(runtime.controller.epoch_log.epochs([EpochState.COMMITTED])) == 2
    assert_source_exact(runtime, "bid")
    assert_view_matches_batch(runtime, "big_bids", VIEW_QUERIES["big_bids"])
    assert_sink_exactly_once(runtime, "big_bids_out")
    query = h.cli("query", "SELECT count(*) AS n FROM big_orders", "--format", "json")
    assert json.loads(query.stdout) == [{"n": 2}]  # ann by amount, vip 2 by customer


def test_three_hundred_epochs_keep_a_bounded_partition_window(tmp_path: Path, monkeypatch, postgres_url) -> None:
    """Hundreds of epochs through the controller and the partition mirror. No Spark (the data path
    is covered above) and the PostgreSQL store, because this is about the window, not about DuckDB's
    per-transaction file open; partition keys stay within the window, the meta store keeps every epoch."""
    from resources.checkpoint import CheckpointControllerResource
    from resources.spark import EpochalSparkResource

    monkeypatch.setenv("EPOCHAL_PARTITION_WINDOW", "25")
    monkeypatch.setenv("EPOCHAL_META_URL", postgres_url)
    h = make_harness(tmp_path)
    resource = CheckpointControllerResource(
        spark=EpochalSparkResource(spark_config={}), home=str(h.home), pipeline_dir=str(h.pipeline_dir)
    )
    controller = resource.runtime.controller
    controller.recover("bootstrap", discard=lambda locations: None)
    instance = dg.DagsterInstance.ephemeral()
    epochs = []
    for _ in range(300):
        record = controller.epoch_log.inject(lambda source, starts: [])
        resource.ensure_partition(instance, record.epoch)
        for table in controller.tables:
            controller.epoch_log.collect(record.epoch, Collected(table, None))
        resource.retire_partitions(instance)
        epochs.append(str(record.epoch))
        assert len(instance.get_dynamic_partitions("epochs")) <= 25
    assert instance.get_dynamic_partitions("epochs") == epochs[-25:]
    assert len(controller.epoch_log.epochs([EpochState.COMMITTED])) == 300


@pytest.mark.slow
def test_persistent_dagster_home_records_partitioned_materializations(tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("")
    env = {**os.environ, **h.env, "DAGSTER_HOME": str(dagster_home)}
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    instance = dg.DagsterInstance.from_config(str(dagster_home))
    keys = instance.get_dynamic_partitions("epochs")
    assert len(keys) == 2
    for asset in ("bid", "big_bids", "epoch_commit", "big_bids_out"):
        assert {m.partition for m in materializations(instance, asset)} == set(keys)


SOURCE_SINK = {
    "pipeline.sql": """
CREATE SOURCE orders (id BIGINT, amount DOUBLE) WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE SINK orders_copy FROM orders
WITH (connector = 'duckdb', database = 'out/copy.duckdb', table = 'orders', type = 'append-only');
""",
}


def test_a_sink_on_a_source_keeps_up_through_idle_epochs(spark, tmp_path: Path) -> None:
    """An idle source epoch writes no file; a sink reading the source still delivers it (as
    nothing), so its progress reaches the committed epoch instead of stopping at the last rows."""
    h = make_harness(tmp_path, SOURCE_SINK)
    runtime = h.runtime(spark)

    def epoch() -> int:
        record, _ = runtime.start_epoch(None, None)
        runtime.run_source(record.epoch, "orders")
        runtime.commit(record.epoch)
        runtime.run_sink(record.epoch, "orders_copy")
        return record.epoch

    h.produce([json.dumps({"id": 1, "amount": 2.5}), json.dumps({"id": 2, "amount": 4.0})])
    first = epoch()
    idle = [epoch(), epoch()]
    assert runtime.controller.epoch_log.collected(idle[-1])["orders"].location is None
    sink = runtime.sink("orders_copy")
    assert sink.delivered_epoch() == idle[-1] > first
    assert sink.row_count() == 2
    batches = runtime.controller.sink_coordinator.batches("orders_copy")
    assert [(b.id.first_epoch, b.state.value) for b in batches] == [(e, "COMMITTED") for e in (first, *idle)]
    h.produce([json.dumps({"id": 3, "amount": 1.0})])
    assert epoch() > idle[-1] and sink.row_count() == 3
    assert assert_sink_exactly_once(runtime, "orders_copy") == 3


def test_latest_startup_mode_starts_a_log_table_at_its_end_and_keeps_that_start(spark, tmp_path: Path) -> None:
    """scan.startup.mode = 'latest' through epoch_job: the lines already in the log when the table
    starts are never read. The start is fixed by the first epoch that commits (as RisingWave's is by
    its first checkpoint): an injection that recovery aborts fixes nothing, so a line written before
    the first commit is skipped too. Lines appended afterwards, and a split that appears later, are
    read whole; the view equals the oracle."""
    files = {
        "pipeline.sql": """
CREATE TABLE orders (id BIGINT, customer STRING, amount DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json', scan.startup.mode = 'latest');

CREATE MATERIALIZED VIEW spend AS SELECT customer, sum(amount) AS total FROM orders GROUP BY customer;
""",
    }
    h = make_harness(tmp_path, files)
    instance = dg.DagsterInstance.ephemeral()
    h.produce(ORDERS[:3])  # history: before the table's first epoch
    runtime = h.runtime(spark)
    runtime.controller.epoch_log.inject(runtime.plan)
    runtime.recover("test: the first epoch is lost before it commits")
    h.produce(ORDERS[5:6])  # written after the first injection, before the first commit
    assert h.run_in_process(instance).success
    h.produce(ORDERS[:1])
    h.produce(ORDERS[1:2], split="eu")  # a new split: all of it is new
    assert h.run_in_process(instance).success
    runtime = h.runtime(spark)
    ids = sorted(row["id"] for row in runtime.state("orders").collect())
    assert ids == [1, 2], "only the lines written after the table's first commit (5 came before it)"
    assert_source_exact(runtime, "orders")
    assert_views_match_batch(runtime, {"spend": files["pipeline.sql"].split(" AS ", 1)[1].strip().rstrip(";")})
