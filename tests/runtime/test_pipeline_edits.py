"""A pipeline edited while runs are in flight: a run that read the SQL files before a view was
removed still names it. Its steps for the removed view do nothing, its commit does not wait for
it, and nothing of the view comes back; a view added back later starts afresh. Views and sinks
stay equal to the batch oracle throughout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from epochal.checkpoint.backfills import rows as backfill_rows
from epochal.checkpoint.records import EpochState
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import VIEW_QUERIES, make_harness, run_epoch

ORDERS = [
    '{"id": 1, "customer": "ann", "amount": 12.5, "ts": "2026-01-01T10:00:00"}',
    '{"id": 2, "customer": "vip", "amount": 3.0, "ts": "2026-01-01T10:01:00"}',
    '{"id": 3, "customer": "bob", "amount": 20.0, "ts": "2026-01-01T10:02:00"}',
]
TOTALS = "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer"
TOTALS_TOP = "SELECT customer, count(*) AS n, sum(amount) AS total, max(amount) AS top FROM orders GROUP BY customer"


def test_a_run_that_read_the_pipeline_before_a_view_was_removed_commits_without_it(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    h.produce(ORDERS)
    first = h.runtime(spark)
    run_epoch(first)
    # A run reads the files (totals in them) and injects its epoch; then the user removes totals
    # and a newer run injects (which retires it), before the first run has done its steps.
    stale = h.runtime(spark)
    stale_epoch = stale.start_epoch(None, None)[0].epoch
    time.sleep(0.01)
    (h.pipeline_dir / "totals.sql").unlink()
    h.produce(ORDERS[:2], split="1")
    fresh = h.runtime(spark)
    assert "totals" not in fresh.pipeline.views
    fresh_epoch = fresh.start_epoch(None, None)[0].epoch
    retired = fresh.controller.backend.transaction(backfill_rows.retired)
    assert set(retired) == {"totals", "totals__stage1"}  # with the stage the planner split from it
    assert not (Path(fresh.warehouse.table_root("totals"))).exists()

    # The stale run's epoch: its totals step does nothing, and the epoch commits without it.
    run_epoch(stale, stale_epoch)
    log = stale.controller.epoch_log
    assert log.epoch(stale_epoch).state is EpochState.COMMITTED
    assert "totals" not in log.collected(stale_epoch)
    report = stale.run_view(stale_epoch, "totals")
    assert report.metadata["mode"].startswith("retired")
    run_epoch(fresh, fresh_epoch)
    # The stale process's next injection does not bring totals back (it read the files before
    # totals was removed), and its next epoch commits without it too...
    later = run_epoch(stale)
    assert stale.controller.backend.transaction(backfill_rows.retired).keys() == {"totals", "totals__stage1"}
    assert stale.controller.epoch_log.epoch(later).state is EpochState.COMMITTED
    assert "totals" not in stale.controller.epoch_log.collected(later)
    assert not (Path(stale.warehouse.table_root("totals"))).exists()
    assert fresh.controller.epoch_log.in_flight() == []
    assert_views_match_batch(fresh, VIEW_QUERIES)
    assert assert_sink_exactly_once(fresh, "orders_out") == 5

    # ...but the user putting it back does: a new view over a pipeline with history, backfilled.
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    back = h.runtime(spark)
    run_epoch(back)
    assert back.controller.backend.transaction(backfill_rows.retired) == {}
    assert back.controller.status()["backfills"]["totals"]["phase"] != "done"
    from epochal.backfill.runner import BackfillRunner

    BackfillRunner(back).advance(budget_s=300)
    assert back.controller.status()["backfills"]["totals"]["phase"] == "done"
    run_epoch(back)
    assert_views_match_batch(back, {**VIEW_QUERIES, "totals": TOTALS})


def test_a_view_step_that_wrote_before_its_view_was_removed_leaves_no_directory_behind(
    spark, tmp_path: Path
) -> None:
    """The stale run's view step began before the view was removed (its start found it in the
    pipeline), wrote its change, and only its collect saw the view gone. The write is discarded
    and, as when the view left, its directory is gone: not an empty ``epoch=`` directory under it
    (a chaos run found one)."""
    from epochal.checkpoint.records import Collected

    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    stale = h.runtime(spark)
    stale_epoch = stale.start_epoch(None, None)[0].epoch
    (h.pipeline_dir / "totals.sql").unlink()
    fresh = h.runtime(spark)
    fresh.start_epoch(None, None)  # retires totals and deletes its directory
    root = Path(stale.warehouse.table_root("totals"))
    assert not root.exists()

    # what the stale step wrote after its start, then collects
    location = stale.warehouse.new_location("totals", stale_epoch)
    rows = stale.warehouse.write(spark.createDataFrame([("ann", 1)], "customer STRING, n BIGINT"), location)
    assert rows == 1 and root.exists()
    assert not stale.collect(stale_epoch, Collected("totals", location, 1, rows), [location], release=False)
    assert not root.exists(), sorted(str(p) for p in root.rglob("*"))
    assert "totals" not in stale.controller.epoch_log.collected(stale_epoch)


def test_an_epoch_injected_without_retiring_a_removed_view_commits_without_it(spark, tmp_path: Path) -> None:
    """The barrier sensor's tick injects without the retirement a run's injection does first, so a
    view removed from the files was still committed by the meta store: the sensor's runs, which
    read the files afresh and do not know it, could not commit ("top_events joined the pipeline
    after this run read its SQL files", chaos seed 30), epoch after epoch until some other process
    injected. Now the tick retires first, and so does a commit that finds such a table."""
    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    (h.pipeline_dir / "totals.sql").unlink()
    h.produce(ORDERS[:2], split="1")
    runtime = h.runtime(spark)
    assert "totals" not in runtime.pipeline.views
    epoch = runtime.controller.epoch_log.inject(runtime.plan).epoch  # as an older tick did
    for name in runtime.pipeline.sources:
        runtime.run_source(epoch, name)
    for name in runtime.pipeline.view_order():
        runtime.run_view(epoch, name)
    report = runtime.commit(epoch)
    assert report.metadata["state"] == EpochState.COMMITTED.value, report.metadata
    assert set(runtime.controller.backend.transaction(backfill_rows.retired)) == {"totals", "totals__stage1"}
    assert not Path(runtime.warehouse.table_root("totals")).exists()
    status = runtime.controller.status()
    assert set(status["tables"].values()) == {epoch}, status["tables"]
    assert_views_match_batch(runtime, VIEW_QUERIES)


def test_a_run_that_read_the_pipeline_before_a_view_was_added_does_not_commit_without_it(
    spark, tmp_path: Path
) -> None:
    """A view added while a run that read the older files is still going: the view backfills and
    joins; the stale run does not know it, so it cannot write the view's step of its epoch. Its
    commit must not go ahead without the view (the view would be left at an older epoch than
    every other table, which no recovery can mend): it fails, naming the view, and a recovery
    takes the epoch back. The pipeline then goes on, aligned and equal to the batch oracle."""
    from epochal.backfill.runner import BackfillRunner
    from epochal.errors import EpochalError

    h = make_harness(tmp_path)
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    stale = h.runtime(spark)  # reads the files before totals is added
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    fresh = h.runtime(spark)
    run_epoch(fresh)  # registers totals as a backfill; commits without it
    BackfillRunner(fresh).advance(budget_s=300)
    status = fresh.controller.status()
    assert status["backfills"]["totals"]["phase"] == "done", status["backfills"]
    committed = status["committed_epoch"]

    h.produce(ORDERS[:2], split="1")
    stale_epoch = stale.start_epoch(None, None)[0].epoch
    # Not naming totals is not removing it: the stale process's injection does not retire it.
    assert "totals" not in stale.controller.backend.transaction(backfill_rows.retired)
    for name in stale.pipeline.sources:
        stale.run_source(stale_epoch, name)
    for name in stale.pipeline.view_order():
        stale.run_view(stale_epoch, name)
    with pytest.raises(EpochalError, match="totals.* joined the pipeline after this run read its SQL files"):
        stale.commit(stale_epoch)
    status = fresh.controller.status()
    assert status["committed_epoch"] == committed, "not committed without the view"
    assert set(status["tables"].values()) == {committed}, status["tables"]

    fresh = h.runtime(spark)
    run_epoch(fresh)  # recovers first: the stale epoch goes back
    status = fresh.controller.status()
    assert stale.controller.epoch_log.epoch(stale_epoch).state is EpochState.ABORTED
    assert set(status["tables"].values()) == {status["committed_epoch"]}, status["tables"]
    assert_views_match_batch(fresh, {**VIEW_QUERIES, "totals": TOTALS})


def test_a_run_that_read_the_pipeline_before_a_statement_changed_neither_undoes_the_change_nor_computes_with_it(
    spark, tmp_path: Path
) -> None:
    """A run (or sensor tick) that read the SQL files before the user changed a view holds the old
    statement. Its injection used to take the view's rebuild back to that statement (and the next
    up-to-date run forward again, deleting the new statement's backfill under its runners); its
    backfill runner would build the new statement's rows with the old query, and its steps would
    go on computing the view with it after the switch, mixing the two in the view's rows."""
    from epochal.backfill.runner import BackfillRunner
    from epochal.checkpoint.statements import rebuilds
    from epochal.checkpoint.statements.views import StaleStatements

    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    stale = h.runtime(spark)
    time.sleep(0.01)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS_TOP};\n")
    h.produce(ORDERS[:2], split="1")
    fresh = h.runtime(spark)
    run_epoch(fresh)  # starts the rebuild: the old rows serve while the new statement backfills
    started = fresh.controller.backend.transaction(lambda cur: rebuilds.read(cur, "totals"))
    assert started is not None and started.state is rebuilds.RebuildState.SERVING_OLD

    with pytest.raises(StaleStatements, match="statement of .*totals.* changed after this process read its SQL"):
        stale.start_epoch(None, None)
    assert fresh.controller.backend.transaction(lambda cur: rebuilds.read(cur, "totals")) == started, "not undone"
    notes = [p.note for p in BackfillRunner(stale).advance(budget_s=60)]
    assert any("changed after this process read its SQL files" in (n or "") for n in notes), notes
    assert fresh.controller.backfills.get("totals__rebuild").vnodes_done == 0, "nothing built with the old query"

    BackfillRunner(fresh).advance(budget_s=300)
    run_epoch(fresh)  # switches to the new statement
    run_epoch(fresh)  # its switch committed: done
    done = fresh.controller.backend.transaction(lambda cur: rebuilds.read(cur, "totals"))
    assert done.state is rebuilds.RebuildState.DONE

    # An epoch injected by an up-to-date run, which the stale one then works on: it refuses to
    # compute totals with the old statement and gives the epoch back, unfailed, to the next run
    # (it used to fail it, and the recovery that followed aborted every epoch in flight).
    h.produce(ORDERS[1:], split="2")
    epoch = fresh.start_epoch(None, None)[0].epoch
    for name in stale.pipeline.sources:
        stale.run_source(epoch, name)
    with pytest.raises(StaleStatements, match="totals"):
        for name in stale.pipeline.view_order():
            stale.run_view(epoch, name)
    after = h.runtime(spark)
    assert after.controller.epoch_log.recovery_reason() is None
    assert after.controller.epoch_log.waiting() == [epoch]  # what the next run of epoch_job takes
    assert after.controller.epoch_log.take_waiting("next-run") == [epoch]
    run_epoch(after, epoch)
    assert after.controller.epoch_log.epoch(epoch).state is EpochState.COMMITTED
    run_epoch(after)
    status = after.controller.status()
    assert set(status["tables"].values()) == {status["committed_epoch"]}, status["tables"]
    assert_views_match_batch(after, {**VIEW_QUERIES, "totals": TOTALS_TOP})


def test_a_step_that_waited_for_the_switch_of_its_view_goes_on_with_the_new_statement(spark, tmp_path: Path) -> None:
    """Two epochs in flight while a changed view's new statement is ready: the later epoch's step
    starts while the view still serves its old rows and waits for the earlier epoch, whose step
    switches. It must then go on as the new statement's step. It used to go on as the old one's:
    maintained old rows waited for the switch's epoch in the old stages, which never write it (or
    failed, once it committed: a recovery for nothing, seen in a chaos run), and frozen ones would
    have dropped the epoch's change from the view."""
    import threading

    from epochal.backfill.runner import BackfillRunner
    from epochal.checkpoint.statements import rebuilds

    h = make_harness(tmp_path)
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS_TOP};\n")
    runtime = h.runtime(spark)
    run_epoch(runtime)  # starts the rebuild
    BackfillRunner(runtime).advance(budget_s=300)
    h.produce(ORDERS[1:], split="1")
    switching = runtime.start_epoch(None, None)[0].epoch
    h.produce(ORDERS[:2], split="2")
    later = runtime.start_epoch(None, None)[0].epoch
    for epoch in (switching, later):
        for name in runtime.pipeline.sources:
            runtime.run_source(epoch, name)
    before_totals = runtime.pipeline.view_order()[: runtime.pipeline.view_order().index("totals")]
    for epoch in (switching, later):
        for name in before_totals:
            runtime.run_view(epoch, name)

    log, waiting, outcome = runtime.controller.epoch_log, threading.Event(), {}
    wait_for_order = log.wait_for_order

    def signalling(epoch: int, tables, what: str) -> float:  # noqa: ANN001
        if epoch == later and "totals" in tables:
            waiting.set()
        return wait_for_order(epoch, tables, what)

    log.wait_for_order = signalling  # type: ignore[method-assign]

    def later_step() -> None:
        try:
            outcome["report"] = runtime.run_view(later, "totals")
        except Exception as error:  # noqa: BLE001 (the assertion below names it)
            outcome["error"] = error

    thread = threading.Thread(target=later_step)
    thread.start()
    assert waiting.wait(120), "the later epoch's step waits for the earlier one"
    assert runtime.controller.backend.transaction(lambda cur: rebuilds.read(cur, "totals")).switched_epoch is None
    switched = runtime.run_view(switching, "totals")
    assert switched.metadata["mode"] == "switched to the new statement", switched.metadata
    thread.join(120)
    assert not thread.is_alive(), "the later step waits for the old statement's stages, which never write the switch"
    assert "error" not in outcome, outcome
    assert outcome["report"].metadata["mode"] == "incremental", outcome["report"].metadata
    for epoch in (switching, later):
        for name in runtime.pipeline.view_order()[runtime.pipeline.view_order().index("totals") + 1 :]:
            runtime.run_view(epoch, name)
        runtime.commit(epoch)
    assert log.epoch(later).state is EpochState.COMMITTED
    run_epoch(h.runtime(spark))
    assert_views_match_batch(h.runtime(spark), {**VIEW_QUERIES, "totals": TOTALS_TOP})


def test_a_commit_that_comes_between_a_join_and_its_runner_writing_the_epoch_waits_for_it(
    spark, tmp_path: Path
) -> None:
    """A view that joins by backfill while an epoch is in flight: its runner writes that epoch
    right after the join. The epoch's commit, arriving in between, used to fail ("the backfill
    runner that writes such epochs stopped before writing it"), and the recovery it called for
    aborted every epoch in flight (seen in a chaos run). While the runner holds the backfill, it
    is a wait for order: the commit waits, and the epoch commits with the view."""
    import threading

    from epochal.backfill.runner import BackfillRunner

    h = make_harness(tmp_path)
    h.produce(ORDERS)
    run_epoch(h.runtime(spark))
    (h.pipeline_dir / "totals.sql").write_text(f"CREATE MATERIALIZED VIEW totals AS {TOTALS};\n")
    runtime = h.runtime(spark)
    h.produce(ORDERS[1:], split="1")
    epoch = runtime.start_epoch(None, None)[0].epoch  # registers totals (and its stage) as backfills
    for name in runtime.pipeline.sources:
        runtime.run_source(epoch, name)
    for name in runtime.pipeline.view_order():
        if name != "big_bids":  # (held back, or the epoch would commit now, without totals)
            runtime.run_view(epoch, name)  # totals' steps: backfilling, skipped

    log, asked, outcome = runtime.controller.epoch_log, threading.Semaphore(0), {}
    commit_step = log.commit_step

    def counting(at: int):  # noqa: ANN202
        step = commit_step(at)
        asked.release()
        return step

    log.commit_step = counting  # type: ignore[method-assign]

    def commit() -> None:
        try:
            outcome["report"] = runtime.commit(epoch)
        except Exception as error:  # noqa: BLE001 (the assertion below names it)
            outcome["error"] = error

    runner = BackfillRunner(runtime)
    write_in_flight = runner._write_in_flight
    threads: list[threading.Thread] = []

    def commit_first(view: str, at: int) -> None:
        if not threads:  # the first view to join: the commit comes now, before the runner writes it
            runtime.run_view(at, "big_bids")
            threads.append(threading.Thread(target=commit))
            threads[0].start()
            for _ in range(3):  # it has read the epoch's state, and asked again: it waits
                assert asked.acquire(timeout=60), outcome
        write_in_flight(view, at)

    runner._write_in_flight = commit_first  # type: ignore[method-assign]
    runner.advance(budget_s=300)
    assert threads, "a view joined while the epoch was in flight"
    threads[0].join(300)
    assert "error" not in outcome, outcome
    log.commit_step = commit_step  # type: ignore[method-assign]
    runner.advance(budget_s=300)
    assert log.epoch(epoch).state is EpochState.COMMITTED
    assert log.recovery_reason() is None, "nothing failed"
    run_epoch(h.runtime(spark))
    assert_views_match_batch(h.runtime(spark), {**VIEW_QUERIES, "totals": TOTALS})


def test_a_backfill_writing_an_epoch_that_recovery_aborts_under_it_does_not_fail(tmp_path: Path, monkeypatch) -> None:
    """After its join a backfill writes the epochs in flight that its live step skipped. A recovery
    may abort one meanwhile and delete its inputs' files under the step, which then fails on a
    missing file rather than on the abort (seen in chaos): that is the abort, not a failure. A real
    failure of a live epoch still fails the backfill."""
    from epochal.backfill.runner import BackfillRunner
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime

    h = make_harness(tmp_path)

    def no_spark():  # noqa: ANN202
        raise AssertionError("no Spark here: the view's step is replaced")

    runtime = EpochRuntime(h.settings(), load_pipeline(h.pipeline_dir), no_spark)
    runtime.recover("bootstrap")
    epoch = runtime.controller.epoch_log.inject(runtime.plan).epoch

    def aborted_under_it(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        runtime.recover("ad-hoc (a test)")  # aborts the epoch and deletes its files
        raise FileNotFoundError("Cannot list directory '.../orders/epoch=.../x'")

    monkeypatch.setattr(runtime, "run_view", aborted_under_it)
    BackfillRunner(runtime)._write_in_flight("big_orders", epoch)  # no error: recovery re-runs it
    assert runtime.controller.epoch_log.epoch(epoch).state is EpochState.ABORTED

    live = runtime.controller.epoch_log.inject(runtime.plan).epoch

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise FileNotFoundError("a file the epoch needs is gone")

    monkeypatch.setattr(runtime, "run_view", broken)
    with pytest.raises(FileNotFoundError, match="is gone"):
        BackfillRunner(runtime)._write_in_flight("big_orders", live)
