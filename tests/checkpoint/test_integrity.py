"""The controller's integrity under races, slow steps and stale writers (issue: nothing lost under
races): injection never plans over a recovery, a lease keeps a slow step alive and fences a stale
one, a recovery's sweep never deletes a snapshot being written, every state change touches exactly
the row it names, and the meta store forgets old epochs without losing what readers need. Each test
runs on the embedded DuckDB store and on the real PostgreSQL server."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochal.checkpoint import queries as q
from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import Collected, EpochAborted, EpochState, InvariantViolation
from epochal.connectors.base import SplitRange
from epochal.storage.warehouse import Warehouse
from tests.checkpoint.test_controller import collect_all, controller, mark_delivered, plan_ten, settings, start

TABLES = ("src", "v1", "v2")


def test_injection_never_plans_over_a_recovery(tmp_path: Path, meta_url: str) -> None:
    """Another process recovers while this one plans: the aborted epoch's range must be read by the
    new epoch, not skipped (before the fix the plan, made from the aborted epoch's end, was recorded
    because recovery leaves max(epoch) as it is)."""
    ctl, other = controller(tmp_path, meta_url), controller(tmp_path, meta_url)
    start(ctl)
    aborted = ctl.epoch_log.inject(plan_ten)
    assert ctl.epoch_log.offsets(aborted.epoch, "src") == [SplitRange("0", 0, 10), SplitRange("1", 0, 10)]
    plans: list[dict[str, int]] = []

    def plan_while_another_process_recovers(source: str, starts: dict[str, int]) -> list[SplitRange]:
        plans.append(dict(starts))
        if len(plans) == 1:
            other.recover("another process recovers meanwhile", discard=lambda locations: None)
        return plan_ten(source, starts)

    epoch = ctl.epoch_log.inject(plan_while_another_process_recovers)
    assert ctl.epoch_log.epoch(aborted.epoch).state is EpochState.ABORTED
    assert plans == [{"0": 10, "1": 10}, {}], "the stale plan must be thrown away and made again"
    assert ctl.epoch_log.offsets(epoch.epoch, "src") == [SplitRange("0", 0, 10), SplitRange("1", 0, 10)]
    assert epoch.prev is None and epoch.kind.value == "initial"


def test_a_plan_that_skips_records_is_refused(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    ctl.epoch_log.inject(plan_ten)

    def skipping(source: str, starts: dict[str, int]) -> list[SplitRange]:
        return [SplitRange(s, starts.get(s, 0) + 5, starts.get(s, 0) + 15) for s in ("0", "1")]

    with pytest.raises(InvariantViolation, match="planned split 0 from offset 15, but it was asked to start at 10"):
        ctl.epoch_log.inject(skipping)


def test_a_step_three_times_the_timeout_survives_on_its_lease(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    watcher = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    start(ctl)
    epoch = ctl.epoch_log.inject(plan_ten, claim=True).epoch
    reasons = []
    with ctl.epoch_log.lease(epoch) as lease:
        deadline = time.time() + 3.2  # 3x the timeout, and a little more
        while time.time() < deadline:
            reasons.append(watcher.epoch_log.recovery_reason())
            time.sleep(0.2)
    assert not lease.lost
    assert set(reasons) == {None}, f"a live step on its lease was taken for dead: {set(reasons) - {None}}"
    assert collect_all(ctl, epoch) == [epoch]
    # Without the lease the same wait is taken for a dead run: the check above can fail.
    stalled = ctl.epoch_log.inject(plan_ten).epoch
    time.sleep(1.3)
    assert f"epoch {stalled}: no progress" in (watcher.epoch_log.recovery_reason() or "")


def test_a_writer_whose_epoch_was_recovered_under_it_is_fenced(tmp_path: Path, meta_url: str) -> None:
    writer = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    other = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    start(writer)
    epoch = writer.epoch_log.inject(plan_ten).epoch
    writer.epoch_log.begin_step(epoch, "run-a", source="src")
    writer.epoch_log.collect(epoch, Collected("src", "/loc/src/a"))
    time.sleep(1.3)  # the writer hangs (no lease renewal): its epoch is recovered under it
    reason = other.epoch_log.recovery_reason()
    assert reason is not None and "no progress" in reason
    other.recover(reason, discard=lambda locations: None)
    with pytest.raises(EpochAborted):
        writer.epoch_log.collect(epoch, Collected("v1", "/loc/v1/a"))
    assert writer.epoch_log.renew(epoch) is False, "a lease on a recovered epoch cannot be renewed"
    assert writer.epoch_log.collected(epoch) == {}, "nothing the stale writer did before survives either"
    # The next epoch re-reads the recovered one's records, once.
    again = other.epoch_log.inject(plan_ten).epoch
    assert other.epoch_log.offsets(again, "src") == [SplitRange("0", 0, 10), SplitRange("1", 0, 10)]


def test_a_lease_that_lost_its_epoch_stops_renewing(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    start(ctl)
    epoch = ctl.epoch_log.inject(plan_ten).epoch
    with ctl.epoch_log.lease(epoch) as lease:
        ctl.recover("an operator ran epochal recover", discard=lambda locations: None)
        time.sleep(0.6)
    assert lease.lost


def _committed(ctl: CheckpointController) -> int:
    epoch = ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, epoch) == [epoch]
    return epoch


def _write_files(location: str, rows: int = 3) -> None:
    Path(location, "_vnode=0").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": list(range(rows))}), str(Path(location, "_vnode=0", "part-0.parquet")))


def test_a_long_compaction_on_its_lease_is_not_reaped_and_a_stale_one_cannot_publish(
    tmp_path: Path, meta_url: str
) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_EPOCH_TIMEOUT_S="1")
    start(ctl)
    epoch = _committed(ctl)
    warehouse = Warehouse(str(tmp_path / "warehouse"))
    renewed, stale = warehouse.new_snapshot_location("v1", epoch), warehouse.new_snapshot_location("v2", epoch)
    ctl.catalog.begin_snapshot("v1", epoch, renewed, (), "{}")
    ctl.catalog.begin_snapshot("v2", epoch, stale, (), "{}")
    with ctl.catalog.snapshot_lease(renewed):
        time.sleep(3.2)  # 3x the timeout: the stale one (no lease) is past it
        reaped = ctl.catalog.reap_abandoned_snapshots()
    assert reaped == [stale]
    assert ctl.catalog.publish_snapshot(renewed, 0, 0).recorded
    with pytest.raises(Exception, match="recovery removed it as abandoned"):
        ctl.catalog.publish_snapshot(stale, 0, 0)


@pytest.mark.parametrize("announced", ["before the sweep reads what to keep", "after it read what to keep"])
def test_recovery_never_deletes_a_snapshot_being_written(tmp_path: Path, meta_url: str, announced: str) -> None:
    """A compaction announces its snapshot and writes it while a recovery sweeps: the snapshot must
    come out whole and publishable (before the fix, the sweep read what to keep first and then
    listed the warehouse, so a snapshot announced in between lost its files mid-write). What a dead
    run left is still swept."""
    ctl, compactor = controller(tmp_path, meta_url), controller(tmp_path, meta_url)
    start(ctl)
    epoch = _committed(ctl)
    warehouse = Warehouse(str(tmp_path / "warehouse"))
    orphan = warehouse.new_location("v1", epoch)  # a run that died before it could collect
    _write_files(orphan)
    snapshot = warehouse.new_snapshot_location("v1", epoch)

    def compaction_starts() -> None:
        compactor.catalog.begin_snapshot("v1", epoch, snapshot, (), "{}")
        _write_files(snapshot, rows=5)

    def sweep(keep, upto):  # noqa: ANN001, ANN202 - the controller's sweep callback
        def keep_with_a_compaction_racing() -> set[str]:
            if announced.startswith("before"):
                compaction_starts()
                return keep()
            kept = keep()
            compaction_starts()
            return kept

        return warehouse.sweep(["v1"], keep_with_a_compaction_racing, upto)

    report = ctl.recover("a run died", discard=warehouse.delete, sweep=sweep)
    assert orphan in report.discarded_locations and not Path(orphan).exists()
    files = warehouse.snapshot_files(snapshot)
    assert len(files) == 1 and warehouse.files_row_count(files) == 5, "the snapshot lost files mid-write"
    assert compactor.catalog.publish_snapshot(snapshot, 5, len(files)).recorded


def test_a_state_change_touches_exactly_the_row_it_names(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    epoch = _committed(ctl)
    with pytest.raises(InvariantViolation, match="illegal epoch transition COMMITTED -> INJECTED"):
        ctl.backend.transaction(lambda cur: q.transition(cur, epoch, EpochState.COMMITTED, EpochState.INJECTED))
    # Legal in the table, but the row is not INJECTED: nothing may change, and it is an error.
    with pytest.raises(InvariantViolation, match=r"0 row\(s\) were in INJECTED"):
        ctl.backend.transaction(lambda cur: q.transition(cur, epoch, EpochState.INJECTED, EpochState.ABORTED))
    assert ctl.epoch_log.epoch(epoch).state is EpochState.COMMITTED


def test_old_epochs_are_pruned_keeping_what_readers_need(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url, EPOCHAL_PARTITION_WINDOW="2")
    start(ctl)
    epochs = [_committed(ctl) for _ in range(6)]
    assert ctl.prune_history() == 0, "nothing is pruned while every change file can still be read"
    # Retention dropped the change files up to epochs[3] for every table, and the sink delivered it.
    ctl.backend.transaction(
        lambda cur: [cur.execute("INSERT INTO table_retention VALUES (?, ?)", [t, epochs[3]]) for t in TABLES]
    )
    assert ctl.prune_history() == 0, "the sink has not delivered anything yet"
    mark_delivered(ctl, "out", epochs[4])
    assert ctl.prune_history() == 3  # older than epochs[3], and outside the newest two
    kept = [r.epoch for r in ctl.epoch_log.epochs()]
    assert kept == epochs[3:]
    assert ctl.epoch_log.offsets(epochs[0], "src") == []
    assert ctl.catalog.committed_locations("v1", after=epochs[3]) == [(e, f"/loc/v1/{e}") for e in epochs[4:]]
    # The pipeline goes on where it was: offsets continue, recovery works.
    ctl.recover("after pruning", discard=lambda locations: None)
    nxt = ctl.epoch_log.inject(plan_ten).epoch
    assert ctl.epoch_log.offsets(nxt, "src") == [SplitRange("0", 60, 70), SplitRange("1", 60, 70)]


def test_a_store_from_before_the_split_frontier_continues_its_offsets(tmp_path: Path, meta_url: str) -> None:
    ctl = controller(tmp_path, meta_url)
    start(ctl)
    _committed(ctl)
    in_flight = ctl.epoch_log.inject(plan_ten).epoch
    # What an older Epochal left: offsets' history only.
    ctl.backend.transaction(
        lambda cur: (cur.execute("DELETE FROM split_frontier"), q.set_flag(cur, "split_frontier", None))
    )
    reopened = controller(tmp_path, meta_url)
    assert reopened.epoch_log.offsets(in_flight, "src")[0] == SplitRange("0", 10, 20)
    nxt = reopened.epoch_log.inject(plan_ten).epoch
    assert reopened.epoch_log.offsets(nxt, "src") == [SplitRange("0", 20, 30), SplitRange("1", 20, 30)]
    reopened.recover("back to the committed epoch", discard=lambda locations: None)
    again = reopened.epoch_log.inject(plan_ten).epoch
    assert reopened.epoch_log.offsets(again, "src") == [SplitRange("0", 10, 20), SplitRange("1", 10, 20)]


def test_a_step_of_an_aborted_epoch_fails_before_any_work(tmp_path: Path, meta_url: str) -> None:
    """A Dagster run goes on with the steps that do not depend on a failed one. Once a recovery has
    aborted the run's epoch, each of them must fail at once with EpochAborted, without Spark. Found
    by benchmarks/chaos.py: a run whose keyed source found its epoch aborted went on to start a JVM
    and read and write its other source for two minutes, only to be refused at collect."""
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from tests.epochal_harness import make_harness

    pipeline = (
        "CREATE SOURCE orders (id BIGINT, amount BIGINT)\n"
        "WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
        "CREATE MATERIALIZED VIEW big AS SELECT id FROM orders WHERE amount > 1;\n"
    )
    h = make_harness(tmp_path, {"s.sql": pipeline})
    h.produce(['{"id": 1, "amount": 5}'])

    def no_spark():  # noqa: ANN202
        raise AssertionError("a step of an aborted epoch asked for Spark")

    cfg = settings(h.home, meta_url, EPOCHAL_PIPELINE=str(h.pipeline_dir))
    runtime = EpochRuntime(cfg, load_pipeline(cfg.pipeline_dir), no_spark)
    # injected as the barrier worker does, without its plan check: the steps' process is a fresh
    # one that has not analysed the plans, so each step would start Spark to do so
    record = runtime.controller.epoch_log.inject(runtime.plan, run_id="run-a", claim=True)
    runtime.recover("an operator ran epochal recover")
    steps = (
        lambda: runtime.run_source(record.epoch, "orders", "run-a"),
        lambda: runtime.run_view(record.epoch, "big", "run-a"),
    )
    for step in steps:
        with pytest.raises(EpochAborted, match="aborted by a recovery"):
            step()
    assert runtime.controller.epoch_log.recovery_reason() is None, "an aborted step asks for no recovery"
