"""The backfill's meta-store rules, without Spark, on DuckDB and PostgreSQL: a new view is
registered at injection and stays outside commit alignment; its progress is recorded in order; it
joins only when it has written the committed epoch, and then every commit waits for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.backfill.state import BACKFILL_TRANSITIONS, BackfillPhase, VnodeRange, next_range
from epochal.checkpoint.backfill_log import BackfillLost
from epochal.checkpoint.definitions import DefinitionChanged
from epochal.checkpoint.records import Collected, InvariantViolation
from epochal.controller import CheckpointController
from tests.test_controller import collect_all, plan_ten, settings, start

UPSTREAMS = {"v1": ("src",), "v2": ("v1",), "v3": ("src",), "v4": ("v3",)}


def grown(
    home: Path, meta_url: str, fingerprints: dict[str, str] | None = None, sink_inputs: dict[str, str] | None = None
) -> CheckpointController:
    return CheckpointController(
        settings(home, meta_url), ["src"], ["v1", "v2", "v3", "v4"], upstreams=UPSTREAMS, fingerprints=fingerprints,
        sink_inputs=sink_inputs,
    )


def history(home: Path, meta_url: str, fingerprints: dict[str, str] | None = None) -> int:
    """A pipeline of src, v1, v2 with one committed epoch (returned), before v3 and v4 are added."""
    old = CheckpointController(
        settings(home, meta_url), ["src"], ["v1", "v2"], upstreams=UPSTREAMS, fingerprints=fingerprints
    )
    start(old)
    first = old.epoch_log.inject(plan_ten).epoch
    collect_all(old, first)
    return first


def test_a_new_view_backfills_outside_alignment_then_joins(tmp_path: Path, meta_url: str) -> None:
    first = history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    e2 = ctl.epoch_log.inject(plan_ten).epoch  # registers v3 (snapshot) and v4 (waits for v3)
    backfills = {b.view: b for b in ctl.backfills.all()}
    assert backfills["v3"].phase is BackfillPhase.SNAPSHOT and backfills["v3"].snapshot_epoch == first
    assert backfills["v4"].phase is BackfillPhase.WAITING
    assert ctl.backfills.outside_alignment() == {"v3", "v4"}
    # The epoch commits without them: backfill never blocks another table's commit.
    assert collect_all(ctl, e2) == [e2]

    assert ctl.backfills.claim("v3")
    other = grown(tmp_path, meta_url)
    assert not other.backfills.claim("v3")  # one runner per view
    assert ctl.backfills.claim("v4") and not ctl.backfills.start_snapshot("v4")  # v3 has not written S
    for lo, hi in ((0, 100), (100, 256)):
        ctl.backfills.record_chunk("v3", VnodeRange(lo, hi), f"r{lo:03d}-x-", 10, 5)
    with pytest.raises(InvariantViolation):
        ctl.backfills.record_epoch("v3", e2, "/loc/v3", 1, 1, 0.1)  # still in the snapshot phase
    ctl.backfills.finish_snapshot("v3", "/snap/v3", ("k",), "{}", 5, 2)
    assert ctl.backfills.next_epoch("v3") == e2
    e3 = ctl.epoch_log.inject(plan_ten).epoch  # in flight at the join: its live step skipped v3
    with pytest.raises(InvariantViolation, match="next committed epoch"):
        ctl.backfills.record_epoch("v3", e3, "/loc/v3", 1, 1, 0.1)
    assert ctl.backfills.join("v3") == (False, [])  # not caught up
    ctl.backfills.record_epoch("v3", e2, "/loc/v3/e2", 3, 2, 0.1)
    assert ctl.backfills.next_epoch("v3") is None
    e4 = ctl.epoch_log.inject(plan_ten).epoch  # in flight, its src step not run yet
    ctl.epoch_log.collect(e3, Collected("src", f"/loc/src/{e3}"))
    joined, pending = ctl.backfills.join("v3")
    # e3's live step of v3 is past (src wrote it): the backfill writes it. e4's is still ahead.
    assert joined and pending == [e3]
    assert ctl.status()["tables"]["v3"] == e2 and ctl.status()["backfills"]["v3"]["phase"] == "done"
    # From the join on, e3 commits only once v3 has written it.
    assert collect_all(ctl, e3, tables=("v1", "v2")) == []
    assert ctl.epoch_log.collect(e3, Collected("v3", "/loc/v3/e3")).committed == [e3]
    assert collect_all(ctl, e4, tables=("src", "v1", "v2")) == []
    assert ctl.epoch_log.collect(e4, Collected("v3", "/loc/v3/e4")).committed == [e4]
    assert ctl.backfills.start_snapshot("v4")  # v3 reached v4's snapshot epoch
    with pytest.raises(BackfillLost):
        other.backfills.record_chunk("v4", VnodeRange(0, 256), "r000-y-", 1, 1)  # not its claim


def test_retention_keeps_what_a_backfill_reads(tmp_path: Path, meta_url: str) -> None:
    e1 = history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    epochs = []
    for _ in range(3):
        epochs.append(ctl.epoch_log.inject(plan_ten).epoch)
        collect_all(ctl, epochs[-1])
    # Three snapshots of src after the backfill's snapshot epoch e1, keeping two: none may drop src's
    # change files after e1, which the backfill still reads.
    for epoch in epochs:
        location = f"/snap/src/{epoch}"
        ctl.catalog.begin_snapshot("src", epoch, location, (), "{}")
        result = ctl.catalog.publish_snapshot(location, 1, 1, keep=2)
        assert result.changes_dropped_upto is None or result.changes_dropped_upto <= e1
    assert ctl.catalog.state_parts("src", e1, inclusive=True).changes  # still readable at e1


def test_a_changed_definition_restarts_a_backfill_and_rebuilds_a_joined_view_unless_a_sink_reads_it(
    tmp_path: Path, meta_url: str
) -> None:
    fingerprints = {"v1": "a", "v2": "b", "v3": "c", "v4": "d"}
    history(tmp_path, meta_url, fingerprints)
    ctl = grown(tmp_path, meta_url, fingerprints, sink_inputs={})
    collect_all(ctl, ctl.epoch_log.inject(plan_ten).epoch)
    started = ctl.backfills.get("v3").started_at
    changed = grown(tmp_path, meta_url, {**fingerprints, "v3": "c2"}, sink_inputs={})
    collect_all(changed, changed.epoch_log.inject(plan_ten).epoch)
    assert changed.backfills.get("v3").started_at > started  # backfilling: starts again

    new_v1 = {**fingerprints, "v1": "a2"}
    # a sink reads v2, which reads v1: its target holds rows of v1's old version
    with pytest.raises(DefinitionChanged, match=r"v1 changed.*sink\(s\) out read it.*epochal backfill v1 --rebuild"):
        grown(tmp_path, meta_url, new_v1, sink_inputs={"out": "v2", "other": "v3"}).epoch_log.inject(plan_ten)
    with pytest.raises(DefinitionChanged, match="a sink may hold"):  # sinks unknown: no rebuild
        grown(tmp_path, meta_url, new_v1).epoch_log.inject(plan_ten)
    # no sink on them: v1 and v2 (built on v1) are rebuilt from the committed epoch, the rest goes on
    rebuilding = grown(tmp_path, meta_url, new_v1, sink_inputs={"other": "v3"})
    committed = rebuilding.status()["committed_epoch"]
    epoch = rebuilding.epoch_log.inject(plan_ten).epoch
    backfills = {b.view: b for b in rebuilding.backfills.all()}
    assert backfills["v1"].phase is BackfillPhase.SNAPSHOT and backfills["v1"].snapshot_epoch == committed
    assert backfills["v2"].phase is BackfillPhase.WAITING
    assert {"v1", "v2"} <= rebuilding.backfills.outside_alignment()
    # a run that began v1's step with its old statement cannot record it: the backfill writes v1 there
    assert not rebuilding.epoch_log.collect(epoch, Collected("v1", f"/old/v1/{epoch}")).recorded
    collect_all(rebuilding, epoch, tables=("src",))
    assert rebuilding.status()["committed_epoch"] == epoch, "the epoch commits without them"
    assert grown(tmp_path, meta_url, new_v1, sink_inputs={}).epoch_log.can_inject() is None, "and only once"


def test_the_phase_rules_and_vnode_ranges() -> None:
    assert BACKFILL_TRANSITIONS[BackfillPhase.JOINED] == frozenset()
    assert BackfillPhase.LOG_STORE in BACKFILL_TRANSITIONS[BackfillPhase.SNAPSHOT]
    assert BackfillPhase.JOINED not in BACKFILL_TRANSITIONS[BackfillPhase.SNAPSHOT]  # no join without catch-up
    assert next_range([], 100) == VnodeRange(0, 100)
    assert next_range([VnodeRange(0, 100)], 100) == VnodeRange(100, 200)
    assert next_range([VnodeRange(100, 256)], 64) == VnodeRange(0, 64)  # a gap first
    assert next_range([VnodeRange(0, 256)], 64) is None
    with pytest.raises(InvariantViolation):
        VnodeRange(10, 10)
