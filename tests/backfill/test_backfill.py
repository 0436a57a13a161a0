"""Views added to a running pipeline backfill: a snapshot of their inputs at a fixed epoch, range by
range of the key space, then their inputs' change logs epoch by epoch, then they join commit
alignment. Each test starts from a pipeline with committed epochs and a compaction done (the new
view's inputs are read from snapshots), adds views, and checks them against the batch oracle at
every epoch after the join, while live epochs go on committing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from epochal.backfill.runner import BackfillRunner
from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError
from epochal.pipeline.model import STAGE_SEPARATOR
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import REPO, SMALL_PIPELINE, VIEW_QUERIES, make_harness

#: one of each kind: linear, aggregate (partial), join, top-N, a view on a new view, and VALUES
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
    # constant rows (VALUES) on the kept side of a LEFT JOIN: 'zed' has no order
    "customer_tiers": "SELECT t.customer, t.tier, count(o.id) AS n FROM VALUES ('c1', 'gold'), ('zed', 'new') "
    "AS t(customer, tier) LEFT JOIN orders o ON o.customer = t.customer GROUP BY t.customer, t.tier",
    # a stage per branch (groups beside a total), and a join staged under a grouping by its padded side
    "bidders_and_total": "SELECT bidder, count(*) AS n FROM bid GROUP BY bidder UNION ALL SELECT -1, count(*) FROM bid",
    "orders_hit": "SELECT o.id, count(*) AS n FROM (SELECT auction % 7 AS k FROM bid) b "
    "LEFT JOIN orders o ON o.id = b.k GROUP BY o.id",
}

# Small ranges: the snapshot phase writes several vnode ranges however small the test's data.
ENV = {"EPOCHAL_BACKFILL_CHUNK_ROWS": "1000", "EPOCHAL_BACKFILL_RANGE_ROWS": "300"}  # several of each


def order(i: int, customer: str, amount: float) -> str:
    return f'{{"id": {i}, "customer": "{customer}", "amount": {amount}, "ts": "2026-01-01T10:00:00"}}'


def _views_file(views: dict[str, str]) -> str:
    return "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {query};" for name, query in views.items())


def _run(h, instance):  # noqa: ANN202
    result = h.run_in_process(instance)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result


def _metadata(result, asset: str) -> dict:  # noqa: ANN001
    """The metadata of ``asset``'s materialization in an epoch_job run, as plain values."""
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        if materialization.asset_key.to_user_string() == asset:
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


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
    runtime = h.runtime(spark)
    registered = runtime.controller.backfills.get("bidder_counts").snapshot_epoch
    assert registered < committed
    # What a runner killed in its first range would have left under the registration's epoch.
    leftover = Path(runtime.warehouse.backfill_root("bidder_counts", registered)) / "snapshot" / "000-255"
    leftover.mkdir(parents=True)
    (leftover / "unrecorded.parquet").write_bytes(b"not recorded")
    runner = BackfillRunner(runtime)
    reports = runner.advance(budget_s=600)
    assert set(NEW_VIEWS) <= {r.view for r in reports}  # with the planner's stages of them
    # A backfill that had written nothing reads its inputs at the newest committed epoch when it
    # starts, not at its registration's: the epochs between are not replayed one by one. A view
    # that waited for a backfilling view starts at that one's new snapshot epoch.
    newest = runtime.controller.status()["committed_epoch"]
    by_view = {r.view: r for r in reports}
    for name in ("bidder_counts", "busy_bidders", "bidder_counts__stage1"):
        if name in by_view:
            assert (by_view[name].snapshot_epoch, by_view[name].epochs_written) == (newest, 0), by_view[name]
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
    assert not leftover.exists()  # listed when the snapshot epoch moved; deleted by the next injection


SMALL_PIPELINE_TABLES = ["bid", "orders", "big_bids", "big_orders"]


def test_a_backfill_starts_no_range_while_a_live_epoch_is_in_flight(spark, tmp_path: Path, monkeyenv) -> None:
    """Live epochs first (EPOCHAL_BACKFILL_YIELD_S): with an epoch in flight, the snapshot phase waits
    before its range until the epoch commits, then runs to the join and matches the oracle."""
    monkeyenv.setenv("EPOCHAL_BACKFILL_YIELD_S", "120")
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=1)
    (h.pipeline_dir / "new.sql").write_text(_views_file({"cheap_bids": NEW_VIEWS["cheap_bids"]}))
    _run(h, instance)  # registers the backfill
    runtime = h.runtime(spark)
    h.produce([order(100, "c1", 40.0)])
    live, _ = runtime.start_epoch(None, None)  # injected, not committed: in flight

    reports: list = []
    worker = threading.Thread(target=lambda: reports.extend(BackfillRunner(h.runtime(spark)).advance(budget_s=600)))
    worker.start()
    time.sleep(3)
    assert worker.is_alive(), reports
    assert runtime.controller.backfills.done_ranges("cheap_bids") == []

    for source in runtime.pipeline.sources:
        runtime.run_source(live.epoch, source)
    for view in runtime.pipeline.view_order():
        runtime.run_view(live.epoch, view)
    runtime.commit(live.epoch)
    worker.join(timeout=600)
    report = {r.view: r for r in reports}["cheap_bids"]
    assert report.phase == "done", report.metadata()
    assert 3 <= report.metadata()["seconds_yielded"] < 120, report.metadata()
    assert_views_match_batch(h.runtime(spark), {"cheap_bids": NEW_VIEWS["cheap_bids"]})


def test_a_live_step_that_comes_after_its_views_backfill_joined_at_that_epoch_does_nothing(
    spark, tmp_path: Path, monkeyenv
) -> None:
    """An epoch commits without a backfilling view; the backfill then starts, reads its inputs at
    that committed epoch and joins there, before the epoch's own run reaches the view's step (a
    slow run, steps one after another). That step must do nothing: the view's state already holds
    the epoch. It used to read the view's state before its snapshot and fail the run with
    EpochOrderError (seen in bench_backfill, in-process, eight backfills)."""
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=1)
    views = {"bidder_counts": NEW_VIEWS["bidder_counts"]}
    (h.pipeline_dir / "new.sql").write_text(_views_file(views))
    _run(h, instance)  # registers the backfill
    runtime = h.runtime(spark)
    h.produce([order(100, "c1", 40.0)])
    late, _ = runtime.start_epoch(None, None)
    for source in runtime.pipeline.sources:
        runtime.run_source(late.epoch, source)
    for view in runtime.pipeline.view_order():
        if view.split(STAGE_SEPARATOR)[0] != "bidder_counts":
            runtime.run_view(late.epoch, view)
    runtime.commit(late.epoch)  # commits without bidder_counts (outside alignment)
    assert runtime.controller.status()["committed_epoch"] == late.epoch

    reports = {r.view: r for r in BackfillRunner(h.runtime(spark)).advance(budget_s=600)}
    assert reports["bidder_counts"].phase == "done", reports["bidder_counts"].metadata()
    assert reports["bidder_counts"].snapshot_epoch == late.epoch
    for view in runtime.pipeline.view_order():  # the run's late steps of the view and its stages
        if view.split(STAGE_SEPARATOR)[0] == "bidder_counts":
            assert runtime.run_view(late.epoch, view).metadata["mode"] == "written by its backfill"
    _run(h, instance)  # and the next epoch maintains it as usual
    assert_views_match_batch(h.runtime(spark), views)


STALLED_VIEWS = {"big_bid_prices": "SELECT auction, price_eur FROM big_bids WHERE price_eur > 100"}


def _stalled_runner(spark, tmp_path: Path) -> tuple:  # noqa: ANN001
    """A pipeline with history and a registered backfill of STALLED_VIEWS, and runner A for it,
    whose lease no longer beats (a suspended process)."""
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=1)
    (h.pipeline_dir / "new.sql").write_text(_views_file(STALLED_VIEWS))
    _run(h, instance)  # registers the backfill
    runner_a = BackfillRunner(h.runtime(spark))
    runner_a.controller.renew_backfill = lambda view: True  # stalled: its lease no longer beats
    return h, runner_a


def _take_over(h, spark, runner_a: BackfillRunner) -> None:  # noqa: ANN001
    """A's claim times out; runner B takes the backfill over and runs it to the join."""
    runner_a.controller.backend.transaction(
        lambda cur: cur.execute("UPDATE backfills SET heartbeat_at = 0 WHERE view_name = ?", ["big_bid_prices"])
    )
    reports_b = {r.view: r for r in BackfillRunner(h.runtime(spark)).advance(budget_s=600)}
    assert reports_b["big_bid_prices"].phase == "done", reports_b["big_bid_prices"].metadata()


def _published_ranges_only(runtime) -> tuple:  # noqa: ANN001
    """The view's published snapshot and the nonces of the ranges recorded for it (they stay
    recorded after the join), checked: every published file belongs to a recorded range."""
    snapshot = runtime.controller.catalog.snapshots("big_bid_prices")[0]
    nonces = tuple(nonce for _, nonce in runtime.controller.backfills.done_ranges("big_bid_prices"))
    names = [f.rsplit("/", 1)[-1] for f in runtime.warehouse.snapshot_files(snapshot.location)]
    assert nonces and names and all(n.startswith(nonces) for n in names), (nonces, names)
    return snapshot, nonces


def test_a_runner_taken_over_mid_range_adds_nothing_to_the_snapshot_its_successor_published(
    spark, tmp_path: Path, monkeyenv, monkeypatch
) -> None:
    """Runner A stalls inside its first range (a suspended laptop) long enough to lose its claim;
    runner B takes the backfill over and runs it to the join. When A wakes and finishes its range,
    the range must not land in the snapshot B published (a reader lists the directory: its rows
    would count twice), and A leaves no files behind."""
    from epochal.backfill import snapshot_phase

    h, runner_a = _stalled_runner(spark, tmp_path)
    views = STALLED_VIEWS
    stalled, wake = threading.Event(), threading.Event()
    real_rows_over = snapshot_phase.rows_over

    def rows_over(runner, name, states):  # noqa: ANN001, ANN202
        if runner is runner_a and not stalled.is_set():
            stalled.set()
            assert wake.wait(600)
        return real_rows_over(runner, name, states)

    monkeypatch.setattr(snapshot_phase, "rows_over", rows_over)
    reports_a: list = []
    worker = threading.Thread(target=lambda: reports_a.extend(runner_a.advance(budget_s=600)))
    worker.start()
    assert stalled.wait(300), "runner A never reached its first range"
    _take_over(h, spark, runner_a)

    wake.set()
    worker.join(timeout=600)
    assert "taken over" in {r.view: r for r in reports_a}["big_bid_prices"].note
    runtime = h.runtime(spark)
    snapshot, _ = _published_ranges_only(runtime)
    staging = Path(snapshot.location).parent / "staging"  # (A's range went to staging first)
    assert not [f for f in staging.rglob("*") if f.is_file()]
    assert_views_match_batch(runtime, views)


def test_a_runner_that_stalls_between_its_claim_check_and_its_move_adds_nothing_to_the_published_snapshot(
    spark, tmp_path: Path, monkeyenv
) -> None:
    """The narrower window: runner A passed its claim check for a range and its move was in flight
    (on an object store a move is a copy, then a delete: long enough to outlive a lease) when A
    stalled. B takes over and publishes; then A's move lands. The files must not be read as the
    view's rows: the snapshot is published in a directory no range writer knows."""
    h, runner_a = _stalled_runner(spark, tmp_path)
    views = STALLED_VIEWS
    stalled, wake = threading.Event(), threading.Event()
    warehouse_a = runner_a.runtime.warehouse
    real_adopt = warehouse_a.adopt_vnode_files

    in_flight = str(tmp_path / "in-flight")

    def adopt(staging: str, target: str, prefix: str) -> int:  # after A's claim check
        copied = real_adopt(staging, in_flight, prefix)  # the copy is under way (B deletes staging)
        stalled.set()
        assert wake.wait(600)
        warehouse_a.move_prefixed(in_flight, target, {prefix})  # ... and lands
        return copied

    warehouse_a.adopt_vnode_files = adopt
    reports_a: list = []
    worker = threading.Thread(target=lambda: reports_a.extend(runner_a.advance(budget_s=600)))
    worker.start()
    assert stalled.wait(300), "runner A never reached its first move"
    _take_over(h, spark, runner_a)

    wake.set()  # A's move lands, then A fails to record its range
    worker.join(timeout=600)
    assert not worker.is_alive()
    runtime = h.runtime(spark)
    snapshot, nonces = _published_ranges_only(runtime)
    # A's files did land somewhere (its move ran): just not where readers look
    late = [f for f in (Path(snapshot.location).parent / "snapshot").rglob("*.parquet")]
    assert late and not any(f.name.startswith(nonces) for f in late), late
    assert_views_match_batch(runtime, views)


def _backfill_cli(h, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **h.env, **ENV}
    env.pop("EPOCHAL_FAULT", None)
    if fault:
        env["EPOCHAL_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "epochal.cli", "backfill", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.slow
def test_a_killed_backfill_resumes_where_it_stopped(spark, tmp_path: Path, postgres_url: str, monkeyenv) -> None:
    """SIGKILL after a source split's chunk is recorded, with a chunk written but not recorded,
    after a range is recorded, with a range's files moved but not recorded, and in the log-store
    phase: each run goes on from what the meta store (PostgreSQL here) recorded. A chunk or range
    a killed run left unrecorded would double rows, which the oracle would see."""
    monkeyenv.setenv("EPOCHAL_META_URL", postgres_url)
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance)
    views = {"bidder_counts": NEW_VIEWS["bidder_counts"], "cheap_bids": NEW_VIEWS["cheap_bids"]}
    (h.pipeline_dir / "new.sql").write_text(_views_file(views))
    _run(h, instance)  # registers the backfills; their first run reads their inputs at this epoch

    # bid is a SOURCE: its history is read split by split from the connector first.
    killed = _backfill_cli(h, "cheap_bids", "--run", fault="backfill-split-recorded")
    assert killed.returncode == -9, killed.stderr[-2000:]
    shown = h.runtime(spark).controller.status()["backfills"]["cheap_bids"]
    assert (shown["splits_done"], shown["splits_total"]) == (1, 2), shown["splits"]
    read_before = shown["rows"]
    assert read_before > 0
    killed = _backfill_cli(h, "cheap_bids", "--run", fault="backfill-split-read")  # written, not recorded
    assert killed.returncode == -9, killed.stderr[-2000:]
    shown = h.runtime(spark).controller.status()["backfills"]["cheap_bids"]
    assert (shown["splits_done"], shown["rows"]) == (1, read_before)  # resumed at the recorded offsets

    killed = _backfill_cli(h, "cheap_bids", "--run", fault="backfill-range-done")
    assert killed.returncode == -9, killed.stderr[-2000:]
    first = h.runtime(spark).controller.backfills.get("cheap_bids")
    assert first is not None and 0 < first.vnodes_done < 256, first

    killed = _backfill_cli(h, "cheap_bids", "--run", fault="backfill-range-moved")
    assert killed.returncode == -9, killed.stderr[-2000:]
    second = h.runtime(spark).controller.backfills.get("cheap_bids")
    assert second.vnodes_done >= first.vnodes_done and second.rows_read >= first.rows_read  # resumed, not reset

    h.produce([order(500, "c1", 12.0)])
    _run(h, instance)
    killed = _backfill_cli(h, "cheap_bids", "--run", fault="backfill-epoch-written")
    assert killed.returncode == -9, killed.stderr[-2000:]
    third = h.runtime(spark).controller.backfills.get("cheap_bids")
    assert third.phase.value == "LOG_STORE" and third.vnodes_done == 256, third
    # Once it had read something, the epoch committed since did not move its snapshot epoch.
    newest = h.runtime(spark).controller.status()["committed_epoch"]
    assert third.snapshot_epoch == first.snapshot_epoch < newest, third

    runtime = h.runtime(spark)
    BackfillRunner(runtime).advance(budget_s=600)
    status = runtime.controller.status()
    phases = {v: b["phase"] for v, b in status["backfills"].items()}
    assert phases == {"cheap_bids": "done", "bidder_counts": "done"}  # the planner's stage is inside its view
    assert status["backfills"]["bidder_counts"]["stages"] == {"bidder_counts__stage1": "done"}
    assert_views_match_batch(runtime, views)
    h.produce([order(501, "c2", 99.0)])
    _run(h, instance)
    assert_views_match_batch(h.runtime(spark), views)
    # What the killed runs left behind was deleted: the snapshot holds exactly the view's rows.
    snapshot = runtime.controller.catalog.snapshots("cheap_bids")[0]
    assert runtime.warehouse.files_row_count(runtime.warehouse.snapshot_files(snapshot.location)) == snapshot.rows


def test_backfill_control_pause_cancel_restart_and_queries(spark, tmp_path: Path, monkeyenv) -> None:
    from epochal.cli.main import main

    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=2)
    views = {"bidder_counts": NEW_VIEWS["bidder_counts"]}
    (h.pipeline_dir / "new.sql").write_text(_views_file(views))
    _run(h, instance)
    for key, value in h.env.items():
        monkeyenv.setenv(key, value)

    # A view that has not joined: queries say so, with its progress.
    from epochal.query.cut import run_query

    with pytest.raises(EpochalError, match="bidder_counts is backfilling.*phase"):
        run_query(h.runtime(spark), "SELECT count(*) FROM bidder_counts")
    assert run_query(h.runtime(spark), "SELECT count(*) FROM big_bids")[1][0][0] > 0  # the rest reads fine

    # Rate limit 0 pauses it; changing it while it runs takes effect at the next range.
    assert main(["backfill", "bidder_counts", "--rate-limit", "0"]) == 0
    BackfillRunner(h.runtime(spark)).advance(budget_s=60)
    paused = h.runtime(spark).controller.backfills.get("bidder_counts")
    assert paused.vnodes_done == 0 and paused.rate_limit == 0
    with pytest.raises(SystemExit):  # argparse refuses it, naming the value
        main(["backfill", "bidder_counts", "--rate-limit", "bogus"])

    # Cancel deletes the partial state; the view stays out of the flow, live epochs go on.
    assert main(["backfill", "bidder_counts", "--rate-limit", "none"]) == 0
    assert main(["backfill", "bidder_counts", "--cancel"]) == 0
    _run(h, instance)
    runtime = h.runtime(spark)
    assert runtime.controller.status()["backfills"]["bidder_counts"]["phase"] == "cancelled"
    assert not runtime.controller.status()["in_flight"]
    with pytest.raises(EpochalError, match="cancelled"):
        run_query(runtime, "SELECT * FROM bidder_counts")

    # Restart: the next epoch starts it again from a new snapshot; then it joins and is right.
    assert main(["backfill", "bidder_counts", "--restart"]) == 0
    _run(h, instance)
    assert main(["backfill", "bidder_counts", "--run"]) == 0
    runtime = h.runtime(spark)
    assert runtime.controller.status()["backfills"]["bidder_counts"]["phase"] == "done"
    assert_views_match_batch(runtime, views)
    assert main(["backfill", "nope", "--cancel"]) == 1


def test_backfill_job_and_sensor_in_dagster_and_a_dropped_view_retires(spark, tmp_path: Path, monkeyenv) -> None:
    """backfill_job advances every backfill and reports backfill__<view> materializations; a view
    and its sink removed from the pipeline lose their files and meta-store rows."""
    from resources.checkpoint import CheckpointControllerResource
    from resources.spark import EpochalSparkResource

    files = {
        **SMALL_PIPELINE,
        "new.sql": _views_file({"top_bid": NEW_VIEWS["top_bid"]})
        + "\nCREATE SINK top_out FROM top_bid WITH (connector = 'duckdb', database = 'out/top.duckdb', "
        "table = 'top', type = 'upsert', primary_key = 'auction');\n",
    }
    h = make_harness(tmp_path, {k: v for k, v in files.items() if k != "new.sql"})
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance)
    (h.pipeline_dir / "new.sql").write_text(files["new.sql"])
    _run(h, instance)  # registers top_bid; its sink waits for the join
    defs = h.definitions()
    spark_resource = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False)
    checkpoint = CheckpointControllerResource(spark=spark_resource, home=str(h.home), pipeline_dir=str(h.pipeline_dir))
    result = defs.get_job_def("backfill_job").execute_in_process(
        instance=instance, resources={"spark": spark_resource, "checkpoint": checkpoint}
    )
    assert result.success
    materialized = [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    assert [m.asset_key.to_user_string() for m in materialized] == ["backfill__top_bid"]
    metadata = materialized[0].metadata
    assert metadata["phase"].value == "done" and metadata["vnodes_done"].value == 256
    assert metadata["rows_read"].value > 0 and "rows_per_second" in metadata and "epochs_behind" in metadata
    _run(h, instance)
    runtime = h.runtime(spark)
    assert_views_match_batch(runtime, {"top_bid": NEW_VIEWS["top_bid"]})
    # The sink created with the view waited for its join, then delivered its rows once (snapshot).
    assert assert_sink_exactly_once(runtime, "top_out") > 0
    top_root = Path(runtime.warehouse.table_root("top_bid"))
    assert top_root.exists()

    # Removing the view and its sink retires them: rows and files go, the rest goes on.
    (h.pipeline_dir / "new.sql").unlink()
    h.produce([order(900, "c1", 50.0)])
    _run(h, instance)
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    assert "top_bid" not in status["backfills"] and not status["in_flight"]
    assert runtime.controller.backend.transaction(
        lambda cur: cur.execute(
            "SELECT (SELECT count(*) FROM collected WHERE asset = 'top_bid') + "
            "(SELECT count(*) FROM snapshots WHERE table_name = 'top_bid') + "
            "(SELECT count(*) FROM table_epochs WHERE table_name = 'top_bid')"
        ).fetchone()[0]
    ) == 0
    assert not any(p.suffix == ".parquet" for p in top_root.rglob("*")) if top_root.exists() else True


def test_dropping_a_view_that_others_read_is_a_load_error(tmp_path: Path) -> None:
    from epochal.errors import PipelineError
    from epochal.pipeline.loader import load_pipeline

    h = make_harness(tmp_path, {**SMALL_PIPELINE, "new.sql": _views_file(
        {"v1": "SELECT bidder FROM cheap", "v2": "SELECT bidder FROM v3", "v3": "SELECT bidder FROM v2"})})
    with pytest.raises(PipelineError) as error:
        load_pipeline(h.pipeline_dir)
    text = str(error.value)
    assert "v1" in text and "cheap" in text  # a missing upstream names the view that reads it
    assert "cycle" in text.lower() or ("v2" in text and "v3" in text)


COUNTS = (
    "SELECT bidder, count(*) AS n, sum(price) AS total, max(price) AS top FROM bid WHERE price >= {floor} "
    "GROUP BY bidder"
)


def test_a_changed_view_serves_its_old_rows_then_switches_and_its_readers_and_sink_get_the_difference(
    spark, tmp_path: Path, monkeyenv
) -> None:
    """A grouped view with hidden MIN/MAX state, read by another view and by an upsert sink, changes
    its WHERE. Its old statement keeps being maintained (the view, the view on it and the sink follow
    the old statement's batch over every epoch) while the new statement backfills; one epoch
    switches: the view, the view built on it and the sink then equal the new statement's batch over
    the sources, at that epoch and the next, with nobody rebuilt by hand."""
    from tests.consistency import multiset

    views = SMALL_PIPELINE["views.sql"] + (
        f"\nCREATE MATERIALIZED VIEW bidder_counts AS {COUNTS.format(floor=1500)};\n"
        "CREATE MATERIALIZED VIEW busy AS SELECT bidder, n FROM bidder_counts WHERE n > 1;\n"
    )
    sinks = (
        "CREATE SINK orders_out FROM big_orders WITH (connector = 'duckdb', database = 'out/sink.duckdb', "
        "table = 'big_orders', type = 'append-only');\n"
        "CREATE SINK counts_out FROM bidder_counts WITH (connector = 'duckdb', database = 'out/counts.duckdb', "
        "table = 'counts', type = 'upsert', primary_key = 'bidder');\n"
    )
    h = make_harness(tmp_path, {"sources.sql": SMALL_PIPELINE["sources.sql"], "views.sql": views, "sinks.sql": sinks})
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=2)
    runtime = h.runtime(spark)
    old = {
        "bidder_counts": COUNTS.format(floor=1500),
        "busy": f"SELECT bidder, n FROM ({COUNTS.format(floor=1500)}) WHERE n > 1",
    }
    assert_views_match_batch(runtime, old)
    before_change = multiset(runtime.state("bidder_counts").collect())

    views_file = h.pipeline_dir / "views.sql"
    original = views_file.read_text()
    # A new statement whose columns differ from those the sink's target was made with is refused.
    views_file.write_text(original.replace("max(price) AS top", "max(price) AS best"))
    refused = h.run_in_process(instance)
    failure = " ".join(
        e.event_specific_data.error.to_string() for e in refused.all_events if e.event_type_value == "STEP_FAILURE"
    )
    assert not refused.success and "without top; with new best" in failure and "counts_out" in failure, failure
    # A new statement that changes a column's type would hand the sink's target and the view on it
    # rows of another type: the old rows keep serving, and the switch is held with the reason.
    views_file.write_text(original.replace("max(price) AS top", "max(CAST(price AS INT)) AS top"))
    held = _metadata(_run(h, instance), "bidder_counts")
    assert "top bigint -> int" in held["switch_held"] and "counts_out" in held["switch_held"], held
    assert "busy" in held["switch_held"] and "CAST(... AS bigint) AS top" in held["switch_held"], held
    assert held["serving"] == "old statement, maintained", held
    rebuild_status = h.runtime(spark).controller.status()["backfills"]["bidder_counts"]["rebuild"]
    assert rebuild_status["held"] == held["switch_held"], rebuild_status
    shown = h.cli("status").stdout
    assert "serving the old statement" in shown and "switch held: the new statement changes the type of top" in shown
    pending = [b.view for b in BackfillRunner(h.runtime(spark)).pending()]
    assert "bidder_counts__rebuild" not in pending, "a held statement is not backfilled: its fix starts over"
    views_file.write_text(original.replace("price >= 1500", "price >= 4000"))
    serving_step = _metadata(_run(h, instance), "bidder_counts")
    assert "switch_held" not in serving_step, "a statement that keeps the types is no longer held"
    assert serving_step["serving"] == "old statement, maintained", serving_step
    assert serving_step["rows_out"] > 0, "the old statement took the epoch's bids"
    # The UI shows where the new statement is: its backfill's own progress (filed under the view's
    # name), not the "waiting" and empty lag of a lookup that found nothing.
    behind = serving_step["new_statement_epochs_behind"]
    assert isinstance(behind, int) and behind >= 2, serving_step
    runtime = h.runtime(spark)
    status = runtime.controller.status()
    entry = status["backfills"]["bidder_counts"]
    assert entry["phase"] in ("snapshot", "waiting") and entry["rebuild"]["serving"] == "old statement", entry
    assert entry["rebuild"]["old_rows"] == "maintained", entry
    assert entry["rebuild"]["held"] is None, entry
    assert "bidder_counts__rebuild" in [b.view for b in BackfillRunner(runtime).pending()]
    assert "busy" not in status["backfills"], "a view built on it is not rebuilt: it receives the difference"
    assert status["tables"]["bidder_counts"] == status["committed_epoch"], "it stays in commit alignment"
    # The old version is maintained: readers and the sink see the old statement over every epoch.
    assert_views_match_batch(runtime, old)
    assert multiset(runtime.state("bidder_counts").collect()) != before_change, "the old rows moved"
    assert_sink_exactly_once(runtime, "counts_out")

    # A busy pipeline: an epoch is in flight, its step of the view served the old statement (the
    # new one was still in its snapshot phase), and the new statement's backfill writes committed
    # epochs only. The view's step of the next epoch writes the one in flight for it, then switches.
    h.produce([order(899, "c2", 20.0)])
    flying, _ = runtime.start_epoch(None, None)
    for source in runtime.pipeline.sources:
        runtime.run_source(flying.epoch, source)
    for view in runtime.pipeline.view_order():
        runtime.run_view(flying.epoch, view)
    BackfillRunner(runtime).advance(budget_s=600)
    assert runtime.controller.status()["backfills"]["bidder_counts"]["phase"] == "log_store"
    assert_views_match_batch(h.runtime(spark), old)  # caught up, not yet switched
    new = {
        "bidder_counts": COUNTS.format(floor=4000),
        "busy": f"SELECT bidder, n FROM ({COUNTS.format(floor=4000)}) WHERE n > 1",
        "big_bids": VIEW_QUERIES["big_bids"],
        "big_orders": VIEW_QUERIES["big_orders"],
    }
    # A run killed right after its step of the view recorded the switch (having written the epoch
    # in flight ahead for the new statement, or taken and committed it): recovery takes it back.
    killed = h.run_subprocess(fault="rebuild-switched")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    rebuild = runtime.controller.backend.transaction(lambda cur: rebuilds.read(cur, "bidder_counts"))
    assert rebuild.state is rebuilds.RebuildState.SWITCHED and rebuild.switched_epoch > flying.epoch
    runtime = h.runtime(spark)
    h.produce([order(900, "c1", 50.0)])
    switching, _ = runtime.start_epoch(None, None)  # recovers first: the killed run's switch is taken back
    for source in runtime.pipeline.sources:
        runtime.run_source(switching.epoch, source)
    for view in runtime.pipeline.view_order():
        runtime.run_view(switching.epoch, view)
    switched = runtime.controller.backend.transaction(lambda cur: rebuilds.read(cur, "bidder_counts"))
    assert switched.state is rebuilds.RebuildState.SWITCHED and switched.switched_epoch == switching.epoch
    runtime.commit(switching.epoch)
    assert_views_match_batch(h.runtime(spark), new)
    # Its sinks deliver both epochs, then one more epoch is computed from the new rows.
    h.produce([order(902, "c1", 50.0)])
    _run(h, instance)
    runtime = h.runtime(spark)
    assert_views_match_batch(runtime, new)
    assert_sink_exactly_once(runtime, "counts_out")
    assert_sink_exactly_once(runtime, "orders_out")
    status = runtime.controller.status()
    # (the killed run may have taken the epoch in flight and committed it before its own)
    aborted = status["last_recovery"]["aborted_epochs"]
    assert rebuild.switched_epoch in aborted and set(aborted) <= {flying.epoch, rebuild.switched_epoch}, aborted
    done = runtime.controller.backend.transaction(lambda cur: rebuilds.read(cur, "bidder_counts"))
    assert done.state is rebuilds.RebuildState.DONE and done.switched_epoch == switching.epoch
    assert "bidder_counts" not in status["backfills"], status["backfills"]
    assert not [t for t in status["tables"] if "__rebuild" in t]
    assert not list((Path(runtime.settings.warehouse) / "bidder_counts__rebuild").glob("**/*.parquet")), (
        "the new statement's shadow is retired with its files"
    )
    # The old statement's stage, maintained until the switch, goes too: its rows, and its files
    # (those written under its old-version name and those it kept from before the change).
    left = runtime.controller.backend.transaction(
        lambda cur: cur.execute(
            "SELECT count(*) FROM collected WHERE asset LIKE 'bidder_counts__rebuild_old%' UNION ALL "
            "SELECT count(*) FROM table_epochs WHERE table_name LIKE 'bidder_counts__rebuild_old%' UNION ALL "
            "SELECT count(*) FROM retired_tables WHERE table_name LIKE 'bidder_counts__rebuild_old%'"
        ).fetchall()
    )
    assert left == [(0,), (0,), (0,)], left
    assert not list((Path(runtime.settings.warehouse) / "bidder_counts__rebuild_old__stage1").glob("**/*.parquet"))
    stage_files = {str(p) for p in (Path(runtime.settings.warehouse) / "bidder_counts__stage1").glob("**/*.parquet")}
    live = runtime.controller.backend.transaction(
        lambda cur: cur.execute(
            "SELECT location FROM collected WHERE asset = 'bidder_counts__stage1' AND location IS NOT NULL "
            "UNION SELECT location FROM snapshots WHERE table_name = 'bidder_counts__stage1'"
        ).fetchall()
    )
    assert all(any(f.startswith(loc.removeprefix("file://")) for (loc,) in live) for f in stage_files), (
        "every file left under the stage's directory belongs to its new statement"
    )


def test_changed_views_keep_their_old_statement_maintained_or_frozen_until_the_switch(
    spark, tmp_path: Path, monkeyenv
) -> None:
    """Views added to a running pipeline (backfilled, so their first snapshot lives in the backfill's
    directory) then changed. A join (a plan without internal stages) and a grouped aggregate (its
    partial state in a stage, kept under the old version's name) are maintained with their old
    statements while the new ones backfill: at every epoch they equal the old statement's batch. A
    view whose old statement read a table the new one does not read cannot be (no run orders that
    table before it): it serves frozen, says so, and stays frozen. All then switch."""
    from tests.consistency import multiset

    before = {
        "order_bids": NEW_VIEWS["order_bids"],
        "cheap_bids": NEW_VIEWS["cheap_bids"],
        "per_bidder": "SELECT bidder, count(*) AS n, max(price) AS top FROM bid GROUP BY bidder",
        # a join grouped by another key: two stages, the second reading the first (its old version
        # was typed over the new statement's tables, found no first stage and froze)
        "per_customer": "SELECT o.customer, count(*) AS n, max(b.price) AS top FROM orders o "
        "JOIN (SELECT auction % 7 AS k, price FROM bid) b ON o.id = b.k GROUP BY o.customer",
    }
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance)
    (h.pipeline_dir / "new.sql").write_text(_views_file(before))
    _run(h, instance)
    BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    _run(h, instance)
    assert_views_match_batch(h.runtime(spark), before)
    frozen_rows = multiset(h.runtime(spark).state("cheap_bids").collect())
    after = {
        "order_bids": NEW_VIEWS["order_bids"] + " WHERE b.price > 300",
        "cheap_bids": "SELECT id AS auction, 0 AS bidder, CAST(amount AS BIGINT) AS price FROM orders",
        "per_bidder": "SELECT bidder, count(*) AS n, max(price) AS top FROM bid WHERE price > 200 GROUP BY bidder",
        "per_customer": before["per_customer"].replace("GROUP BY", "WHERE b.price > 300 GROUP BY"),
    }
    (h.pipeline_dir / "new.sql").write_text(_views_file(after))
    # Every epoch compacts: the maintained old stage gets snapshots too, and is read through them.
    monkeyenv.setenv("EPOCHAL_COMPACT_EVERY", "1")
    changed_at = h.runtime(spark).controller.status()["committed_epoch"]
    for i in range(2):
        h.produce([order(500 + i, "c1", 30.0 + i)])
        result = _run(h, instance)
        for view in ("order_bids", "per_bidder", "per_customer"):
            step = _metadata(result, view)
            assert step["serving"] == "old statement, maintained", step
        assert _metadata(result, "epoch_compaction")["failures"] == "none"
        frozen = _metadata(result, "cheap_bids")
        assert frozen["serving"] == "old statement, frozen", frozen
        runtime = h.runtime(spark)
        assert_views_match_batch(runtime, {v: before[v] for v in ("order_bids", "per_bidder", "per_customer")})
        assert multiset(runtime.state("cheap_bids").collect()) == frozen_rows, "frozen at the change"
    rebuilds_now = runtime.controller.status()["backfills"]
    assert rebuilds_now["order_bids"]["rebuild"]["old_rows"] == "maintained", rebuilds_now["order_bids"]
    assert rebuilds_now["per_bidder"]["rebuild"]["old_rows"] == "maintained", rebuilds_now["per_bidder"]
    assert rebuilds_now["per_customer"]["rebuild"]["old_rows"] == "maintained", rebuilds_now["per_customer"]
    assert rebuilds_now["cheap_bids"]["rebuild"]["old_rows"] == "frozen", rebuilds_now["cheap_bids"]
    old_stage = "per_bidder__rebuild_old__stage1"
    newest = max(snap.epoch for snap in runtime.controller.catalog.snapshots(old_stage))
    assert newest > changed_at, f"{old_stage} is compacted while maintained"
    assert runtime.controller.catalog.snapshots(old_stage)[-1].distribution_key == ("bidder",)
    monkeyenv.delenv("EPOCHAL_COMPACT_EVERY")

    BackfillRunner(runtime).advance(budget_s=600)
    h.produce([order(600, "c2", 12.0)])
    _run(h, instance)
    h.produce([order(601, "c2", 13.0)])
    _run(h, instance)
    runtime = h.runtime(spark)
    assert_views_match_batch(runtime, after)
    status = runtime.controller.status()
    switched = {v: status["backfills"].get(v, {}) for v in after}
    assert all(b.get("phase", "done") == "done" and "rebuild" not in b for b in switched.values()), switched


def test_a_changed_view_is_refused_then_rebuilt_in_place(spark, tmp_path: Path, monkeyenv) -> None:
    """A view whose statement changed must not go on from rows its old query made: the epoch is
    refused with the fix; `--rebuild` backfills it again from its new statement."""
    from epochal.cli.main import main

    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance, epochs=2)
    for key, value in h.env.items():
        monkeyenv.setenv(key, value)
    views_file = h.pipeline_dir / "views.sql"
    changed = views_file.read_text().replace("WHERE price > 1000", "WHERE price > 5000")
    views_file.write_text(changed)
    result = h.run_in_process(instance)
    assert not result.success
    failure = " ".join(
        e.event_specific_data.error.to_string() for e in result.all_events if e.event_type_value == "STEP_FAILURE"
    )
    assert "big_bids" in failure and "changed" in failure and "epochal backfill big_bids --rebuild" in failure
    # A sink reads big_bids: rebuilding in place would leave it with rows of the old version.
    assert main(["backfill", "big_bids", "--rebuild"]) == 1
    (h.pipeline_dir / "sinks.sql").write_text(
        "CREATE SINK orders_out FROM big_orders WITH (connector = 'duckdb', database = 'out/sink.duckdb', "
        "table = 'big_orders', type = 'append-only');"
    )
    assert main(["backfill", "big_bids", "--rebuild"]) == 0
    _run(h, instance)
    BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    _run(h, instance)
    runtime = h.runtime(spark)
    assert runtime.controller.status()["backfills"]["big_bids"]["phase"] == "done"
    query = "SELECT auction, bidder, price * 0.908 AS price_eur, date_time FROM bid WHERE price > 5000"
    assert_views_match_batch(runtime, {"big_bids": query})


def test_extremes_backfilled_over_an_append_only_input_stay_exact_when_a_delete_comes(
    spark, tmp_path: Path, monkeyenv
) -> None:
    """A MIN/MAX view added over an input that only appends (big_bids: a filter of bid, a SOURCE
    without a key) keeps just each group's best value from its backfill: a hash aggregate instead
    of a bounded heap per group that Spark can only sort-aggregate. That is a hint, not a promise:
    when big_bids' statement changes, its switch deletes the bids it no longer takes, the lowest
    of nearly every group among them. Those groups are reread from big_bids, and the view equals
    the batch over the sources at every epoch, before the change, at the switch and after it."""
    from pyspark.sql import functions as F

    h = make_harness(tmp_path, {"sources.sql": SMALL_PIPELINE["sources.sql"], "views.sql": SMALL_PIPELINE["views.sql"]})
    instance = dg.DagsterInstance.ephemeral()
    _history(h, spark, instance)
    extremes = (
        "SELECT bidder, count(*) AS n, min(price_eur) AS low, max(price_eur) AS high, "
        "min(date_time) AS first_at FROM {big_bids} GROUP BY bidder"
    )
    (h.pipeline_dir / "new.sql").write_text(_views_file({"extremes": extremes.format(big_bids="big_bids")}))
    _run(h, instance)  # registers the backfill
    BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    runtime = h.runtime(spark)
    assert runtime.controller.status()["backfills"]["extremes"]["phase"] == "done"
    # The stage's snapshot the backfill wrote (later epochs may add inserted values that are better)
    snapshot = runtime.controller.catalog.snapshots("extremes__stage1")[0]
    written = spark.read.parquet(*runtime.warehouse.snapshot_files(snapshot.location))
    kept = [c for c in written.columns if c.startswith("_epochal_kept_")]
    assert len(kept) == 3, kept
    sizes = written.select(*(F.max(F.size(c)).alias(c) for c in kept)).first()
    assert all(size == 1 for size in sizes), f"the backfill kept more than the best value: {sizes}"

    def oracle(floor: int) -> dict[str, str]:
        big_bids = VIEW_QUERIES["big_bids"].replace("price > 1000", f"price > {floor}")
        return {"extremes": extremes.format(big_bids=f"({big_bids})"), "big_bids": big_bids}

    for i in range(2):  # live epochs append: no group needs its input
        h.produce([order(500 + i, "c1", 12.0)])
        _run(h, instance)
        assert_views_match_batch(h.runtime(spark), oracle(1000))

    views_file = h.pipeline_dir / "views.sql"
    views_file.write_text(views_file.read_text().replace("price > 1000", "price > 2500"))
    _run(h, instance)  # the new statement of big_bids starts its backfill; the old one serves
    BackfillRunner(h.runtime(spark)).advance(budget_s=600)
    switch = _run(h, instance)  # big_bids switches, and hands extremes the difference
    assert _metadata(switch, "big_bids").get("serving") != "old statement, maintained"
    runtime = h.runtime(spark)
    assert runtime.controller.backend.transaction(lambda cur: rebuilds.read(cur, "big_bids")).state in (
        rebuilds.RebuildState.SWITCHED,
        rebuilds.RebuildState.DONE,
    )
    assert_views_match_batch(runtime, oracle(2500))
    h.produce([order(600, "c2", 30.0)])
    _run(h, instance)
    assert_views_match_batch(h.runtime(spark), oracle(2500))
