"""What a run logs and reports to the UI: routine things at INFO, what needs the user at WARNING."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import dagster as dg
import pytest

from epochal.checkpoint.records import RecoveryReport
from epochal.epoch import epoch_physical_ms, shown_epoch
from platform_defs.jobs import log_recovery
from tests.epochal_harness import make_harness


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def info(self, message: str) -> None:
        self.lines.append((logging.INFO, message))

    def warning(self, message: str) -> None:
        self.lines.append((logging.WARNING, message))


def test_a_recovery_that_aborted_nothing_is_info_and_one_that_did_is_a_warning() -> None:
    log = _Log()
    log_recovery(log, RecoveryReport("bootstrap", None, [], [], 1, 0.01, False))  # every first run
    log_recovery(log, RecoveryReport("failure", 5, [6], ["/w/t/epoch=6"], 1, 0.2, False))
    assert [level for level, _ in log.lines] == [logging.INFO, logging.WARNING]
    assert "aborted nothing" in log.lines[0][1] and "aborted [6]" in log.lines[1][1]


ORDERS_ONLY = {
    "sources.sql": "CREATE SOURCE orders (id BIGINT, customer STRING, amount DOUBLE)\n"
    "WITH (connector = 'log', path = 'data/orders', format = 'json');\n",
    "views.sql": "CREATE MATERIALIZED VIEW big AS SELECT id, amount FROM orders WHERE amount >= 10;\n",
}


def test_dead_letters_warn_in_the_run_and_show_in_metadata_the_asset_check_and_status(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = make_harness(tmp_path, ORDERS_ONLY)
    h.produce(['{"id": 1, "customer": "a", "amount": 12}', "not json", '{"id": "two"}'])
    instance = dg.DagsterInstance.ephemeral()
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    epoch = h.runtime(spark).controller.status()["committed_epoch"]
    # the first run's bootstrap recovery aborted nothing: not a warning on the console either
    assert not [r.message for r in caplog.records if r.levelno >= logging.WARNING and "recovery" in r.message]

    # a WARNING naming the source, the count, where they are and how to read them
    records = instance.all_logs(result.run_id)
    warned = [r.user_message for r in records if r.level == logging.WARNING and "dead letters" in r.user_message]
    assert len(warned) == 1, [r.user_message for r in records if r.level == logging.WARNING]
    assert f"source orders epoch {shown_epoch(epoch)}: 2 record(s)" in warned[0]
    assert "orders__dead_letters/epoch=" in warned[0]
    assert 'epochal query "SELECT * FROM orders__dead_letters"' in warned[0]

    # the run ends with one readable line: the epoch, records, views, sinks and time
    finished = [e.message for e in result.all_events if e.event_type_value == "ENGINE_EVENT"][-1]
    assert re.fullmatch(
        rf"epoch_job: epoch {re.escape(shown_epoch(epoch))} committed; 3 record\(s\) read, 1 view\(s\) written, "
        r"0 sink\(s\) delivered 0 row\(s\); \d+\.\ds",
        finished,
    ), finished

    # numeric metadata the UI plots
    (materialization,) = [
        r.asset_materialization for r in instance.fetch_materializations(dg.AssetKey("orders"), limit=10).records
    ]
    assert materialization.metadata["dead_letters"] == dg.IntMetadataValue(2)

    # the source's dead_letters check warns for the epoch's partition
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("orders"), "dead_letters")]
    )[dg.AssetCheckKey(dg.AssetKey("orders"), "dead_letters")]
    evaluation = check.event.dagster_event.event_specific_data
    assert evaluation.passed is False and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.partition == str(epoch)
    defs = h.definitions()
    assert dg.AssetCheckKey(dg.AssetKey("orders"), "dead_letters") in defs.resolve_asset_graph().asset_check_keys

    # and the controller's status counts them per source
    assert h.runtime(spark).controller.status()["dead_letters"] == {
        "orders": {"records": 2, "epochs": 1, "last_epoch": epoch}
    }


ORDERS_TO_A_SINK = {
    "sources.sql": "CREATE SOURCE orders (id BIGINT, customer STRING, amount DOUBLE)\n"
    "WITH (connector = 'log', path = 'data/orders', format = 'json', 'max.events.per.epoch' = '2');\n",
    "views.sql": ORDERS_ONLY["views.sql"],
    "sinks.sql": "CREATE SINK big_out FROM big\n"
    "WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'big', type = 'append-only');\n",
}


def test_every_step_reports_freshness_lag_and_rates_as_numbers_the_ui_plots(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, ORDERS_TO_A_SINK)
    h.produce([f'{{"id": {i}, "customer": "c", "amount": {10 + i}}}' for i in range(3)])  # 2 an epoch: 1 waits
    instance = dg.DagsterInstance.ephemeral()
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    epoch = h.runtime(spark).controller.status()["committed_epoch"]

    def metadata(asset: str) -> dict:
        (m,) = [r.asset_materialization for r in instance.fetch_materializations(dg.AssetKey(asset), limit=9).records]
        return m.metadata

    source, view, commit, sink = (metadata(a) for a in ("orders", "big", "epoch_commit", "big_out"))
    # typed numbers, so the UI plots each over the epoch partitions
    assert source["records_read"] == dg.IntMetadataValue(2) and source["dead_letters"] == dg.IntMetadataValue(0)
    assert source["lag_records"] == dg.IntMetadataValue(1), source  # the third line is past the epoch's offsets
    assert "offsets_end" not in source
    plotted = {
        "orders": (source, ("freshness_s", "lag_seconds", "rows_per_second")),
        "big": (view, ("freshness_s", "rows_per_second")),
        "epoch_commit": (commit, ("freshness_s",)),
        "big_out": (sink, ("freshness_s", "rows_per_second")),
    }
    for m, keys in plotted.values():
        for key in keys:
            assert isinstance(m[key], dg.FloatMetadataValue) and 0 < m[key].value < 300, (key, m)
    # the epoch's barrier is followed by its source's write, its view's, its commit, then its delivery
    shown = [m["freshness_s"].value for m in (source, view, commit, sink)]
    assert shown == sorted(shown), shown
    assert source["lag_seconds"].value >= source["freshness_s"].value - 0.5
    # the partition key is the bare epoch; its wall-clock time is beside it
    assert source["epoch_time"] == dg.TimestampMetadataValue(epoch_physical_ms(epoch) / 1000)
    # and the step's log line shows it too
    lines = [r.user_message for r in instance.all_logs(result.run_id)]
    assert any(line.startswith(f"orders epoch {shown_epoch(epoch)}: ") for line in lines), lines


def test_the_summary_counts_epochs_records_views_and_sinks_not_stages() -> None:
    from platform_defs.run_summary import run_summary

    done = [
        ("epoch_commit", "7", {"state": "COMMITTED"}),
        ("epoch_commit", "9", {"state": "COMMITTED"}),
        ("bid", "7", {"records_read": 400}),
        ("bid", "9", {"records_read": 0}),
        ("per_item__stage1", "7", {"mode": "incremental"}),
        ("per_item", "7", {"mode": "incremental"}),
        ("per_item", "9", {"mode": "incremental"}),
        ("out", "9", {"rows_delivered": 12}),
    ]
    assert run_summary(done, 12.34) == (
        "epoch_job: 2 epochs committed (7..9, 2021-04-01 00:00:00Z..2021-04-01 00:00:00Z); 400 record(s) read, "
        "1 view(s) written, 1 sink(s) delivered 12 row(s); 12.3s"
    )


def test_materializing_a_source_in_the_ui_answers_its_dead_letters_check(spark, tmp_path: Path) -> None:
    from resources.checkpoint import EPOCHS_PARTITIONS, CheckpointControllerResource
    from resources.spark import EpochalSparkResource

    h = make_harness(tmp_path, ORDERS_ONLY)
    h.produce(['{"id": 1, "customer": "a", "amount": 12}', "not json"])
    record, _ = h.runtime(spark).start_epoch(None, None)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(EPOCHS_PARTITIONS, [str(record.epoch)])
    source = next(a for a in h.definitions().assets if dg.AssetKey("orders") in a.keys)
    resource = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False)
    checkpoint = CheckpointControllerResource(spark=resource, home=str(h.home), pipeline_dir=str(h.pipeline_dir))
    result = dg.materialize(
        [source], partition_key=str(record.epoch), instance=instance, resources={"checkpoint": checkpoint}
    )
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "dead_letters" and evaluation.passed is False
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    # the step's line names the epoch with its wall-clock time, as epoch_job's do
    lines = [r.user_message for r in instance.all_logs(result.run_id)]
    assert any(line.startswith(f"orders epoch {shown_epoch(record.epoch)}: ") for line in lines), lines
