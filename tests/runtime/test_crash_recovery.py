"""SIGKILL a real `dagster job execute` at each point of an epoch, then recover and check that the
sinks hold every committed row exactly once and the views match their sources."""

from __future__ import annotations

import signal
from pathlib import Path

import dagster as dg
import pytest

from epochal.checkpoint.records import EpochState
from epochal.faults import FAULT_POINTS
from tests.consistency import assert_sink_exactly_once, assert_source_exact, assert_views_match_batch, sink_rows
from tests.epochal_harness import VIEW_QUERIES, crash_points, make_harness

ORDERS = [f'{{"id": {i}, "customer": "c{i % 3}", "amount": {i * 3.5}, "ts": "2026-01-01T10:00:00"}}' for i in range(30)]


@pytest.mark.slow
# The harness's sinks are DuckDB files, committed in one transaction: "sink-commit-midway" (between
# two writers' COMMIT PREPARED) is a PostgreSQL point, killed for real in tests/sinks/test_postgres_sink.py.
# The backfill and rebuild points are on their paths, not a plain epoch's: killed in tests/backfill/test_backfill.py.
# The suite kills after the source wrote (recovery aborts the epoch) and after the commit (sinks catch
# up); the points inside a sink's commit are killed on real targets in tests/sinks/test_sink_crashes.py,
# and here too with TESTS_CRASH_MATRIX=all.
@pytest.mark.parametrize(
    "point",
    crash_points(
        [p for p in FAULT_POINTS if p != "sink-commit-midway" and not p.startswith(("backfill-", "rebuild-"))],
        suite=["source-written", "committed"],
    ),
)
def test_crash_then_recover(spark, tmp_path: Path, point: str) -> None:
    h = make_harness(tmp_path)
    h.produce(ORDERS[:10])
    instance = dg.DagsterInstance.ephemeral()
    assert h.run_in_process(instance).success
    runtime = h.runtime(spark)
    first = runtime.controller.epoch_log.committed_epoch()
    sink_before = sink_rows(runtime, "big_bids_out")
    h.produce(ORDERS[10:])

    # One step at a time: which sink reaches a sink point first is then fixed (big_bids_out), so the
    # checks below know what the kill cut. (On threads the two sinks race to it; a crash at any
    # point is still recovered: benchmarks/chaos.py kills runs on threads at random.)
    crashed = h.run_subprocess(fault=point, env={"EPOCHAL_STEP_THREADS": "1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert "killing pid" in crashed.stderr and point in crashed.stderr

    # What the crash left behind: nothing half committed.
    committed = runtime.controller.epoch_log.committed_epoch()
    in_flight = runtime.controller.epoch_log.in_flight()
    if point == "source-written":
        assert committed == first and len(in_flight) == 1
        assert runtime.controller.epoch_log.collected(in_flight[0].epoch)  # something was written...
        # ...but nobody reads it: no committed change of bid after the first epoch (bid stores
        # nothing, so its committed files are gone; what is left of it is in flight)
        assert runtime.controller.catalog.committed_locations("bid", after=first) == []
    else:
        assert committed > first and in_flight == []
        # The meta store says the sink holds only what it held before the crash...
        assert runtime.controller.sink_coordinator.delivered_epoch("big_bids_out") == first
        if point == "sink-committed":
            # ...though the target committed the batch: marking it COMMITTED is what the crash cut
            assert runtime.sink("big_bids_out").delivered_epoch() == committed
        else:
            # A sink killed before or inside its commit leaves no row of the epoch behind.
            assert runtime.sink("big_bids_out").delivered_epoch() == first
            assert sink_rows(runtime, "big_bids_out") == sink_before

    recovered = h.run_in_process(instance)
    assert recovered.success, [e.message for e in recovered.all_events if e.is_failure]
    status = runtime.controller.status()
    if point == "source-written":
        assert "died" in status["last_recovery"]["reason"]
        assert status["last_recovery"]["aborted_epochs"] == [in_flight[0].epoch]
        assert runtime.controller.epoch_log.epoch(in_flight[0].epoch).state is EpochState.ABORTED
        # The aborted epoch's output is gone from storage, not just hidden.
        assert not any(p.name == f"epoch={in_flight[0].epoch}" for p in (h.home / "warehouse" / "bid").iterdir())
    assert status["in_flight"] == [] and status["recovery_requested"] is None

    assert_source_exact(runtime, "bid")
    assert assert_source_exact(runtime, "orders") == 30
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert_sink_exactly_once(runtime, "big_bids_out")
    assert_sink_exactly_once(runtime, "orders_out")


def test_a_step_whose_epoch_a_recovery_aborts_under_it_reports_the_abort(spark, tmp_path: Path) -> None:
    """A recovery (another run died) aborts the epochs in flight and deletes their files, so a step
    still running on one fails with whatever Spark says of a missing file. That is the abort, not a
    failure of its own: the step raises EpochAborted saying so, and asks for no second recovery
    (a chaos run counted such runs as unexplained failures)."""
    from epochal.checkpoint.records import EpochAborted
    from tests.epochal_harness import run_epoch

    h = make_harness(tmp_path)
    h.produce(['{"id": 1, "customer": "ann", "amount": 12.5, "ts": "2026-01-01T10:00:00"}'])
    runtime = h.runtime(spark)
    run_epoch(runtime)
    epoch = runtime.start_epoch(None, None)[0].epoch
    for name in runtime.pipeline.sources:
        runtime.run_source(epoch, name)

    def recovered_under_it(*args: object, **kwargs: object) -> object:
        h.runtime(spark).recover("another run died")
        raise RuntimeError("[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file ...")

    runtime.view_epoch = recovered_under_it  # type: ignore[method-assign]
    with pytest.raises(EpochAborted, match=r"aborted by a recovery while this step ran \(RuntimeError: \[FAILED_READ"):
        runtime.run_view(epoch, runtime.pipeline.view_order()[0])
    log = runtime.controller.epoch_log
    assert log.epoch(epoch).state is EpochState.ABORTED
    assert log.recovery_reason() is None, "no second recovery"
    # A failure of a step's own still fails its epoch and asks for the recovery.
    del runtime.view_epoch
    later = runtime.start_epoch(None, None)[0].epoch
    runtime.view_epoch = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="boom"):
        runtime.run_view(later, runtime.pipeline.view_order()[0])
    assert "boom" in (log.recovery_reason() or "")
