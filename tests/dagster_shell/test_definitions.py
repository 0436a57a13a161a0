"""Loading the Dagster definitions: the asset graph, the job, the sensor, and pipeline errors at load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from epochal.errors import PipelineError
from tests.epochal_harness import REPO, make_harness


def test_definitions_build_the_epoch_graph(tmp_path: Path) -> None:
    defs = make_harness(tmp_path).definitions()
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {
        "bid", "orders", "big_bids", "big_orders", "epoch_commit", "epoch_compaction", "big_bids_out", "orders_out",
        "backfill__big_bids", "backfill__big_orders"}
    for key in keys:
        assert graph.get(dg.AssetKey(key)).partitions_def == dg.DynamicPartitionsDefinition(name="epochs")
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("big_bids")).parent_keys} == {"bid"}
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("big_bids_out")).parent_keys} == {
        "epoch_commit", "big_bids"}
    assert "price * 0.908" in defs.get_assets_def("big_bids").descriptions_by_key[dg.AssetKey("big_bids")]
    job = defs.get_job_def("epoch_job")
    # one process, one Spark attach; ready steps on threads (EPOCHAL_STEP_THREADS, default 2)
    assert job.executor_def.name == "epochal_threads"
    assert job.executor_def.config_schema.config_type.fields["max_concurrent"].default_value == 2
    sensor = defs.get_sensor_def("barrier_sensor")
    assert {t.job_name for t in sensor.targets} == {"epoch_job", "backfill_job", "epoch_assets"}
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("backfill__big_bids")).parent_keys} == {"bid"}
    assert defs.get_job_def("backfill_job").executor_def.name == "in_process"


def test_input_assets_show_the_declared_kind(tmp_path: Path) -> None:
    defs = make_harness(tmp_path, {"a.sql": (
        "CREATE SOURCE events (id BIGINT) WITH (connector = 'log', path = 'data/events', format = 'json');\n"
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, region STRING)\n"
        "WITH (connector = 'log', path = 'data/accounts', format = 'json');\n"
    )}).definitions()
    described = {k: defs.get_assets_def(k).descriptions_by_key[dg.AssetKey(k)] for k in ("events", "accounts")}
    assert described["events"].startswith("Source `events`")
    assert "CREATE SOURCE events (id BIGINT)" in described["events"]
    assert described["accounts"].startswith("Table `accounts`")
    assert "CREATE TABLE accounts (id BIGINT, region STRING, PRIMARY KEY (id))" in described["accounts"]


def test_pipeline_errors_fail_the_load_with_file_and_line(tmp_path: Path) -> None:
    h = make_harness(tmp_path, {"a.sql": "CREATE MATERIALIZED VIEW v AS\nSELECT x FROM nowhere;\n"})
    with pytest.raises(PipelineError, match=r"a\.sql:2: .*nowhere"):
        h.definitions()


def _validate(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "platform_defs"],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
    )


def test_dagster_loads_the_demo_and_reports_a_broken_pipeline(tmp_path: Path) -> None:
    ok = _validate({"EPOCHAL_HOME": str(tmp_path / "home")})
    assert ok.returncode == 0, ok.stderr[-2000:]
    broken = make_harness(tmp_path / "b", {"v.sql": "CREATE MATERIALIZED VIEW v AS\nSELECT count(*) AS n FROM bid;\n"})
    bad = _validate(broken.env)
    assert bad.returncode != 0
    assert "v.sql:" in bad.stderr + bad.stdout


def test_barrier_sensor_injects_and_respects_pause_and_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_MAX_IN_FLIGHT", "3")
    h = make_harness(tmp_path)
    defs = h.definitions()
    sensor = defs.get_sensor_def("barrier_sensor")
    instance = dg.DagsterInstance.ephemeral()
    resources = defs.resources

    cursor: list[str | None] = [None]
    clock = [1_000.0]
    import platform_defs.sensors as sensors_module

    monkeypatch.setattr(sensors_module, "_clock", lambda: clock[0])

    def tick(after: float = 10.0):  # noqa: ANN202
        """A daemon tick ``after`` seconds after the previous one (the barrier interval by default)."""
        clock[0] += after
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor[0]) as context:
            result = sensor(context)
        if isinstance(result, dg.SensorResult) and result.cursor is not None:
            cursor[0] = result.cursor  # as the daemon keeps it between ticks
        return result

    runs: list[dg.DagsterRun] = []

    def started_run() -> None:  # an epoch_job run the daemon launched and that is working
        runs.append(dg.DagsterRun(job_name="epoch_job", status=dg.DagsterRunStatus.STARTED))
        instance.add_run(runs[-1])

    first = tick()
    assert len(first.run_requests) == 1
    key = first.run_requests[0].run_key
    assert first.run_requests[0].tags["dagster/partition"] == key
    assert first.run_requests[0].tags["epochal/take"] == "waiting"  # the run takes every waiting epoch
    assert first.dynamic_partitions_requests[0].partition_keys == [key]
    # A tick before the next barrier is due (the daemon evaluates every 5 s) injects nothing; the
    # run for the waiting epoch was requested already.
    early = tick(after=5.0)
    assert isinstance(early, dg.SkipReason) and "next barrier is due in 5.0s" in early.skip_message
    started_run()
    # One run works (EPOCHAL_MAX_EPOCH_RUNS=1): one more is started to stand by for it...
    second = tick()
    assert int(second.run_requests[0].run_key) > int(key)
    started_run()
    # ...and no third: the standby takes whatever waits once the working run has committed. The
    # barrier grid holds: the tick half a loop early injects (it is the daemon turn nearest the point).
    third = tick(after=2.6)
    assert third.run_requests == [] and len(third.dynamic_partitions_requests[0].partition_keys) == 1
    blocked = tick()
    assert isinstance(blocked, dg.SkipReason) and "EPOCHAL_MAX_IN_FLIGHT" in blocked.skip_message
    from epochal.cli.main import main

    monkeypatch.setenv("EPOCHAL_HOME", str(h.home))
    monkeypatch.setenv("EPOCHAL_PIPELINE", str(h.pipeline_dir))
    assert main(["recover"]) == 0  # aborts the in-flight epochs
    for run in runs:
        instance.report_run_failed(run)  # the two runs ended with the recovery
    assert main(["pause"]) == 0
    paused = tick()
    assert isinstance(paused, dg.SkipReason) and "paused" in paused.skip_message
    assert main(["resume"]) == 0
    assert len(tick().run_requests) == 1

    # Without the standby run, a second run is only started once the first has ended.
    monkeypatch.setenv("EPOCHAL_STANDBY_RUN", "off")
    cursor[0] = None
    sensor = h.definitions().get_sensor_def("barrier_sensor")
    started_run()
    assert tick().run_requests == []



def test_the_ui_shows_barrier_sensor_as_the_automation_of_every_epoch_asset(tmp_path: Path) -> None:
    from tests.dagster_internals import RepositorySnap

    snap = RepositorySnap.from_def(make_harness(tmp_path).definitions().get_repository_def())
    (sensor,) = [s for s in snap.sensors if s.name == "barrier_sensor"]
    targeted = {t.job_name for t in sensor.target_dict.values()}
    # The UI lists a sensor under an asset's "Automation" when it targets a job (other than the
    # implicit one) that holds the asset: what it drives, through epoch_job and backfill_job.
    for node in snap.asset_nodes:
        assert targeted & (set(node.job_names) - {"__ASSET_JOB"}), node.asset_key
