"""The backfill's meta-store rules, without Spark, on DuckDB and PostgreSQL: a new view is
registered at injection and stays outside commit alignment; its progress is recorded in order; it
joins only when it has written the committed epoch, and then every commit waits for it."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from epochal.checkpoint import retired_files
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.backfills.log import BackfillLost
from epochal.checkpoint.backfills.state import BACKFILL_TRANSITIONS, BackfillPhase, VnodeRange, next_range
from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import Collected, EpochAborted, InvariantViolation
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements import views as definitions
from epochal.checkpoint.statements.rebuilds import REBUILD_TRANSITIONS, RebuildState
from epochal.checkpoint.statements.views import DefinitionChanged, StaleStatements
from epochal.runtime.pipeline_edits import PipelineEdits
from epochal.storage.warehouse import Warehouse
from tests.checkpoint.test_controller import collect_all, plan_ten, settings, start

UPSTREAMS = {"v1": ("src",), "v2": ("v1",), "v3": ("src",), "v4": ("v3",)}


def grown(
    home: Path,
    meta_url: str,
    fingerprints: dict[str, str] | None = None,
    sink_inputs: dict[str, str] | None = None,
    append_only: list[str] = (),  # type: ignore[assignment]
    columns: dict[str, tuple[str, ...]] | None = None,
) -> CheckpointController:
    return CheckpointController(
        settings(home, meta_url), ["src"], ["v1", "v2", "v3", "v4"], upstreams=UPSTREAMS, fingerprints=fingerprints,
        sink_inputs=sink_inputs, append_only_sinks=append_only, view_columns=columns,
    )


def history(
    home: Path, meta_url: str, fingerprints: dict[str, str] | None = None, columns: dict | None = None
) -> int:
    """A pipeline of src, v1, v2 with one committed epoch (returned), before v3 and v4 are added."""
    old = CheckpointController(
        settings(home, meta_url), ["src"], ["v1", "v2"], upstreams=UPSTREAMS, fingerprints=fingerprints,
        view_columns=columns,
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
    # Its commit names why v3 is missing: the join handed e3 to the runner (a killed runner leaves
    # it for a recovery). An epoch injected after the join has no such excuse.
    e5 = ctl.epoch_log.inject(plan_ten).epoch
    assert ctl.backend.transaction(lambda cur: backfill_log.joined_before(cur, ["v1", "v3"], e3)) == ["v3"]
    assert ctl.backend.transaction(lambda cur: backfill_log.joined_before(cur, ["v3"], e5)) == []
    assert ctl.epoch_log.collect(e3, Collected("v3", "/loc/v3/e3")).committed == [e3]
    assert collect_all(ctl, e4, tables=("src", "v1", "v2")) == []
    assert ctl.epoch_log.collect(e4, Collected("v3", "/loc/v3/e4")).committed == [e4]
    assert collect_all(ctl, e5) == []  # (v3 is aligned now)
    assert ctl.epoch_log.collect(e5, Collected("v3", "/loc/v3/e5")).committed == [e5]
    assert ctl.backfills.start_snapshot("v4")  # v3 reached v4's snapshot epoch
    with pytest.raises(BackfillLost):
        other.backfills.record_chunk("v4", VnodeRange(0, 256), "r000-y-", 1, 1)  # not its claim


def test_a_backfill_does_not_write_an_epoch_its_backfilling_upstream_has_not_written(
    tmp_path: Path, meta_url: str
) -> None:
    """A view over a view that backfills too: in the change-log phase it goes no further than its
    upstream, whose own runner (another process, when it holds that claim) writes each epoch
    first. It used to go on, and fail its run with "reads v3, which has not written epoch E yet"
    (seen in a chaos run: a changed view's new statement over its stage, rebuilt in place)."""
    from epochal.backfill.runner import BackfillRunner

    history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    collect_all(ctl, ctl.epoch_log.inject(plan_ten).epoch)  # registers v3 and v4 (which waits for v3)
    log = ctl.backfills
    assert log.claim("v3") and log.claim("v4")
    log.record_chunk("v3", VnodeRange(0, 256), "r000-x-", 10, 5)
    log.finish_snapshot("v3", "/snap/v3", ("k",), "{}", 5, 1)
    assert log.start_snapshot("v4")
    log.record_chunk("v4", VnodeRange(0, 256), "r000-y-", 5, 5)
    log.finish_snapshot("v4", "/snap/v4", ("k",), "{}", 5, 1)
    later = ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, later) == [later]  # without v3 and v4
    epoch = log.next_epoch("v4")
    assert epoch is not None and epoch == log.next_epoch("v3")

    runner = BackfillRunner(SimpleNamespace(controller=ctl))  # type: ignore[arg-type]
    assert runner._upstream_behind(log.get("v4"), epoch) == "v3"
    log.record_epoch("v3", epoch, "/loc/v3", 1, 1, 0.1)
    assert runner._upstream_behind(log.get("v4"), epoch) is None
    assert runner._upstream_behind(log.get("v4"), later) == ("v3" if later > epoch else None)
    assert runner._upstream_behind(log.get("v3"), later) is None  # (its upstream is a source)


def test_a_backfill_that_has_written_nothing_reads_at_the_newest_epoch_and_its_readers_follow(
    tmp_path: Path, meta_url: str
) -> None:
    """Registered at one epoch, a backfill whose runner starts epochs later reads its inputs at the
    committed epoch then (no epoch left to replay), unless it has written something. A view over two
    backfilling views waits until both have written the later of their snapshot epochs, and reads
    there: never before a backfilling input's snapshot, where it has no state."""
    from epochal.checkpoint.backfills import rows as backfill_rows

    first = history(tmp_path, meta_url)
    upstreams = {**UPSTREAMS, "v5": ("src",), "v6": ("v3", "v5")}
    ctl = CheckpointController(
        settings(tmp_path, meta_url), ["src"], ["v1", "v2", "v3", "v5", "v6"], upstreams=upstreams
    )
    e2 = ctl.epoch_log.inject(plan_ten).epoch  # registers v3, v5 at `first`; v6 waits for them
    assert collect_all(ctl, e2) == [e2]
    for view in ("v3", "v5", "v6"):
        assert ctl.backfills.claim(view)
    # v5 starts at once and writes a range: it stays at `first`.
    assert ctl.backfills.refresh_snapshot("v5") == (first, e2)
    ctl.backfills.record_chunk("v5", VnodeRange(0, 256), "r000-x-", 10, 5)
    e3 = ctl.epoch_log.inject(plan_ten).epoch
    assert collect_all(ctl, e3) == [e3]
    assert ctl.backfills.refresh_snapshot("v5") is None and ctl.backfills.get("v5").snapshot_epoch == e2
    # v3's runner starts after e3 committed: it reads at e3; its old directory is listed for deletion.
    assert ctl.backfills.refresh_snapshot("v3") == (first, e3)
    _, roots = ctl.backend.transaction(backfill_rows.dropped_files)
    assert ("v3", first) in roots and ("v5", first) in roots
    assert ctl.backfills.refresh_snapshot("v6") is None  # still waiting
    ctl.backfills.record_chunk("v3", VnodeRange(0, 256), "r000-y-", 10, 5)
    ctl.backfills.finish_snapshot("v3", "/snap/v3", ("k",), "{}", 5, 1)
    ctl.backfills.finish_snapshot("v5", "/snap/v5", ("k",), "{}", 5, 1)
    # v5 has written e2 only: v6 cannot read v3 (from e3) and v5 (up to e2) at one epoch yet.
    assert not ctl.backfills.start_snapshot("v6")
    ctl.backfills.record_epoch("v5", e3, "/loc/v5/e3", 1, 1, 0.1)
    assert ctl.backfills.start_snapshot("v6")
    assert ctl.backfills.get("v6").snapshot_epoch == e3  # where both can be read, paused or not
    assert ctl.backfills.refresh_snapshot("v6") is None  # e3 is also the committed epoch


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


def test_a_changed_definition_restarts_a_backfill_or_serves_the_old_rows_until_the_switch(
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
    # an append-only sink reads v1: the switch to the new statement would retract rows it holds
    with pytest.raises(DefinitionChanged, match=r"v1 changed.*append-only sink\(s\) out read it.*type = 'upsert'"):
        grown(tmp_path, meta_url, new_v1, sink_inputs={"out": "v1"}, append_only=["out"]).epoch_log.inject(plan_ten)
    with pytest.raises(DefinitionChanged, match="does not know the pipeline's sinks"):
        grown(tmp_path, meta_url, new_v1).epoch_log.inject(plan_ten)
    # An upsert sink on v2 (built on v1): v1's old rows keep serving, and committing; its new
    # statement backfills under the shadow name; v2 is not rebuilt, it will receive the difference.
    rebuilding = grown(tmp_path, meta_url, new_v1, sink_inputs={"out": "v2", "other": "v3"}, append_only=["other"])
    committed = rebuilding.status()["committed_epoch"]
    epoch = rebuilding.epoch_log.inject(plan_ten).epoch
    backfills = {b.view: b for b in rebuilding.backfills.all()}
    shadow = backfills["v1__rebuild"]
    assert shadow.phase is BackfillPhase.SNAPSHOT and shadow.snapshot_epoch == committed
    assert shadow.upstreams == ("src",)
    assert "v1" not in backfills and "v2" not in backfills
    assert not {"v1", "v2"} & rebuilding.backfills.outside_alignment()
    rebuild = rebuilding.backend.transaction(lambda cur: rebuilds.read(cur, "v1"))
    assert rebuild.state is RebuildState.SERVING_OLD and rebuild.frozen_epoch == committed
    assert rebuilding.backfills.status()["v1"]["rebuild"]["serving"] == "old statement"
    collect_all(rebuilding, epoch)
    assert rebuilding.status()["committed_epoch"] == epoch, "the epoch commits with v1's (empty) step"
    assert grown(tmp_path, meta_url, new_v1, sink_inputs={}).epoch_log.can_inject() is None, "and starts only once"

    # The switch at an epoch that recovery then aborts is taken back; one that commits is final.
    def switch_at(ctl: CheckpointController, at: int, location: str) -> None:
        ctl.catalog.begin_snapshot("v1", at, location, (), "{}", in_flight=True)
        ctl.backend.transaction(lambda cur: rebuilds.switch(cur, "v1", at, location, 5, 1))

    aborted = rebuilding.epoch_log.inject(plan_ten).epoch
    switch_at(rebuilding, aborted, "/snap/aborted")
    assert rebuilding.catalog.state_parts("v1", aborted, inclusive=True).snapshot.location == "/snap/aborted"
    report = rebuilding.recover("test", discard=lambda locations: None)
    assert aborted in report.aborted and "/snap/aborted" in report.discarded_locations
    rebuild = rebuilding.backend.transaction(lambda cur: rebuilds.read(cur, "v1"))
    assert rebuild.state is RebuildState.SERVING_OLD and rebuild.switched_epoch is None
    assert not [s for s in rebuilding.catalog.snapshots("v1") if s.location == "/snap/aborted"]
    at = rebuilding.epoch_log.inject(plan_ten).epoch
    switch_at(rebuilding, at, "/snap/first-try")
    # The same step again (its run retried it): the first attempt's snapshot is replaced, and
    # retired rather than deleted, since a step of a later epoch may be scanning it.
    switch_at(rebuilding, at, "/snap/kept")
    assert rebuilding.catalog.state_parts("v1", at, inclusive=True).snapshot.location == "/snap/kept"
    assert "/snap/first-try" in rebuilding.backend.transaction(retired_files.retired_locations)
    collect_all(rebuilding, at)
    shadows = rebuilding.backend.transaction(lambda cur: rebuilds.finish_committed(cur, at))
    assert shadows == ["v1__rebuild"]
    assert rebuilding.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).state is RebuildState.DONE
    assert grown(tmp_path, meta_url, new_v1, sink_inputs={}).epoch_log.can_inject() is None, "v1 is its new statement"


def test_a_process_that_read_its_files_before_a_statement_changed_neither_undoes_the_change_nor_builds_it(
    tmp_path: Path, meta_url: str
) -> None:
    """A run or sensor tick that read its SQL files before the user changed a view holds the old
    statement: its injection must not take the rebuild back to it (the next up-to-date process
    would start it again, deleting the backfill's files under the runners reading them), and the
    meta store tells its steps that their statement is not the view's."""
    fingerprints = {"v1": "a", "v2": "b", "v3": "c", "v4": "d"}
    history(tmp_path, meta_url, fingerprints)
    stale = grown(tmp_path, meta_url, fingerprints, sink_inputs={"out": "v2"})
    collect_all(stale, stale.epoch_log.inject(plan_ten).epoch)
    time.sleep(0.01)
    changed = grown(tmp_path, meta_url, {**fingerprints, "v1": "a2"}, sink_inputs={"out": "v2"})
    collect_all(changed, changed.epoch_log.inject(plan_ten).epoch)
    assert changed.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).new_fingerprint == "a2"

    with pytest.raises(StaleStatements, match=r"statement of v1 changed after this process read its SQL files"):
        stale.epoch_log.inject(plan_ten)
    assert "statement of v1 changed" in (stale.epoch_log.can_inject() or "")
    rebuild = changed.backend.transaction(lambda cur: rebuilds.read(cur, "v1"))
    assert rebuild.new_fingerprint == "a2" and rebuild.state is RebuildState.SERVING_OLD, "not taken back"
    shadow_statement = changed.backend.transaction(lambda cur: definitions.stored_statement(cur, "v1__rebuild"))
    assert shadow_statement[0] == "a2"
    with pytest.raises(StaleStatements, match="v1__rebuild"):
        definitions.check_statement(shadow_statement, "v1__rebuild", "a", stale.epoch_log.loaded_at)
    # A process that read the files later and holds yet another statement: a real change, which
    # starts the new statement's backfill over (and which its steps may not compute before that).
    time.sleep(0.01)
    again = grown(tmp_path, meta_url, {**fingerprints, "v1": "a3"}, sink_inputs={"out": "v2"})
    with pytest.raises(DefinitionChanged, match="no injection has acted on the change yet"):
        definitions.check_statement(shadow_statement, "v1__rebuild", "a3", again.epoch_log.loaded_at)
    collect_all(again, again.epoch_log.inject(plan_ten).epoch)
    assert again.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).new_fingerprint == "a3"
    with pytest.raises(StaleStatements, match="v1"):
        changed.epoch_log.inject(plan_ten)

    # A definition recorded by the switch keeps the time of the new statement, not of the commit:
    # a process that read the files since then holds it and injects.
    at = again.epoch_log.inject(plan_ten).epoch
    recorded = again.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).fingerprint_at
    again.catalog.begin_snapshot("v1", at, "/snap/a3", (), "{}", in_flight=True)
    again.backend.transaction(lambda cur: rebuilds.switch(cur, "v1", at, "/snap/a3", 5, 1))
    assert again.backend.transaction(lambda cur: definitions.stored_statement(cur, "v1"))[0] == "a3"
    collect_all(again, at)
    again.backend.transaction(lambda cur: rebuilds.finish_committed(cur, at))
    assert again.backend.transaction(lambda cur: definitions.stored_statement(cur, "v1")) == ("a3", recorded)
    holding = grown(tmp_path, meta_url, {**fingerprints, "v1": "a3"}, sink_inputs={"out": "v2"})
    assert holding.epoch_log.can_inject() is None
    with pytest.raises(StaleStatements, match="v1"):
        stale.epoch_log.inject(plan_ten)


def test_a_backfill_that_starts_again_leaves_no_files_behind(tmp_path: Path, meta_url: str) -> None:
    """A view whose statement changed while it backfilled starts again: the transaction that forgets
    its rows lists its backfill's directory, and the next run deletes it. A restart at the same
    snapshot epoch works in the same directory, which then stays."""
    fingerprints = {"v1": "a", "v2": "b", "v3": "c", "v4": "d"}
    history(tmp_path, meta_url, fingerprints)
    ctl = grown(tmp_path, meta_url, fingerprints, sink_inputs={})
    collect_all(ctl, ctl.epoch_log.inject(plan_ten).epoch)
    first = ctl.backfills.get("v3").snapshot_epoch
    warehouse = Warehouse(str(tmp_path / "warehouse"))

    def work_in(root: str) -> Path:
        path = Path(root) / "vnodes=0-51" / "part-0.parquet"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"rows")
        return path.parent.parent

    old = work_in(warehouse.backfill_root("v3", first))
    changed = grown(tmp_path, meta_url, {**fingerprints, "v3": "c2"}, sink_inputs={})
    changed.epoch_log.inject(plan_ten)
    second = changed.backfills.get("v3").snapshot_epoch
    assert second > first
    new = work_in(warehouse.backfill_root("v3", second))
    runtime = SimpleNamespace(controller=changed, warehouse=warehouse, reader=SimpleNamespace(release_snapshots=list))
    edits = PipelineEdits(runtime, note_old_versions=lambda rebuilds: None)  # type: ignore[arg-type]
    assert edits.delete_dropped() == 1
    assert not old.exists() and new.exists()
    assert edits.delete_dropped() == 0, "listed once, deleted once"

    # changed again before another commit: the new backfill starts at the same epoch, in `new`
    again = grown(tmp_path, meta_url, {**fingerprints, "v3": "c3"}, sink_inputs={})
    again.epoch_log.can_inject()
    assert again.backfills.get("v3").snapshot_epoch == second
    runtime.controller = again
    assert edits.delete_dropped() == 0
    assert new.exists()
    assert again.backend.transaction(lambda cur: cur.execute("SELECT count(*) FROM dropped_files").fetchone()[0]) == 0


def test_a_changed_view_a_sink_reads_must_keep_its_columns(tmp_path: Path, meta_url: str) -> None:
    """The sink's target was made with the old statement's columns: a switch to other columns is
    refused at injection, naming them and the fixes; the same columns switch."""
    fingerprints = {"v1": "a", "v2": "b"}
    history(tmp_path, meta_url, fingerprints, columns={"v1": ("k", "n"), "v2": ("k",)})
    sinks = {"out": "v1"}
    renamed = grown(tmp_path, meta_url, {**fingerprints, "v1": "a2"}, sinks, columns={"v1": ("k", "cnt")})
    with pytest.raises(DefinitionChanged, match=r"v1 has other columns .*without n; with new cnt.*sink\(s\) out read"):
        renamed.epoch_log.inject(plan_ten)
    assert renamed.backend.transaction(lambda cur: rebuilds.read(cur, "v1")) is None, "nothing half started"
    reordered = grown(tmp_path, meta_url, {**fingerprints, "v1": "a2"}, sinks, columns={"v1": ("n", "k")})
    with pytest.raises(DefinitionChanged, match=r"in another order.*AS k, \.\.\."):
        reordered.epoch_log.inject(plan_ten)
    same = grown(tmp_path, meta_url, {**fingerprints, "v1": "a2"}, sinks, columns={"v1": ("k", "n")})
    same.epoch_log.inject(plan_ten)
    assert same.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).state is RebuildState.SERVING_OLD
    # Changed again while the new statement backfills: checked against the stored rows' columns too.
    again = grown(tmp_path, meta_url, {**fingerprints, "v1": "a3"}, sinks, columns={"v1": ("k", "cnt")})
    with pytest.raises(DefinitionChanged, match="without n; with new cnt"):
        again.epoch_log.inject(plan_ten)
    assert again.backend.transaction(lambda cur: rebuilds.read(cur, "v1")).new_fingerprint == "a2"


def test_a_switch_first_writes_the_new_statements_epochs_its_backfill_has_not(
    tmp_path: Path, meta_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy pipeline always has epochs in flight, and a backfill writes committed epochs only: the
    view's step writes the shadow's missing epochs ahead (in order, committed or in flight), then
    switches. Recovery drops what was written ahead of an aborted epoch; the backfill adopts the
    rest once committed instead of computing it again."""
    fingerprints = {"v1": "a", "v2": "b", "v3": "c", "v4": "d"}
    history(tmp_path, meta_url, fingerprints)
    ctl = grown(tmp_path, meta_url, {**fingerprints, "v1": "a2"}, sink_inputs={"out": "v2"})
    first = ctl.epoch_log.inject(plan_ten).epoch  # registers the shadow; its snapshot epoch is before it
    collect_all(ctl, first)
    shadow, log = "v1__rebuild", ctl.backfills
    assert log.claim(shadow)
    log.record_chunk(shadow, VnodeRange(0, 256), "r000-x-", 1, 1)
    log.finish_snapshot(shadow, "/snap/shadow", ("k",), "{}", 1, 1)
    log.release(shadow)
    flying = ctl.epoch_log.inject(plan_ten).epoch
    switching = ctl.epoch_log.inject(plan_ten).epoch

    def gap(epoch: int) -> list[int] | None:
        return ctl.backend.transaction(lambda cur: rebuilds.switch_gap(cur, "v1", epoch, ("src",)))

    assert gap(switching) is None, "src has not written the epoch in flight: its change is not there yet"
    ctl.epoch_log.collect(flying, Collected("src", f"/loc/src/{flying}"))
    assert gap(switching) == [first, flying], "the committed epoch the backfill has not written, then the one in flight"
    monkeypatch.setattr(rebuilds, "SWITCH_GAP_MAX", 1)
    assert gap(switching) is None, "too far behind: the backfill catches up first"
    monkeypatch.undo()

    assert log.claim(shadow)
    with pytest.raises(InvariantViolation, match=f"first epoch it has not written is {first}"):
        log.record_ahead(shadow, flying, "/ahead/flying", 1, 1, 0.1)
    log.record_ahead(shadow, first, "/ahead/first", 1, 1, 0.1)
    log.record_ahead(shadow, flying, "/ahead/flying", 2, 2, 0.1)
    assert gap(switching) == []
    assert log.get(shadow).caught_up_epoch < first, "the backfill's position moves only over committed epochs"

    report = ctl.recover("test", discard=lambda locations: None)
    assert {flying, switching} <= set(report.aborted) and "/ahead/flying" in report.discarded_locations
    with pytest.raises(EpochAborted):
        log.record_ahead(shadow, flying, "/ahead/again", 1, 1, 0.1)
    assert log.adopt_written(shadow, first), "written ahead and committed: taken as written"
    assert log.get(shadow).caught_up_epoch == first and log.next_epoch(shadow) is None
    later = ctl.epoch_log.inject(plan_ten).epoch
    assert gap(later) == [], "nothing left to write: the aborted epochs are not in the gap"
    collect_all(ctl, later)
    assert not log.adopt_written(shadow, later), "nothing was written ahead there: the backfill computes it"


def test_a_held_switch_keeps_its_reason_until_a_new_statement_clears_it(tmp_path: Path, meta_url: str) -> None:
    """Why a changed view's switch waits is stored with its rebuild (shown by status) while it
    serves its old rows; changing the statement again clears it, and only SERVING_OLD is held."""
    backend = grown(tmp_path, meta_url).backend

    def rebuild() -> rebuilds.Rebuild:
        return backend.transaction(lambda cur: rebuilds.read(cur, "v1"))

    backend.transaction(lambda cur: rebuilds.start(cur, "v1", "a", "a2", 7))
    backend.transaction(lambda cur: rebuilds.hold(cur, "v1", "the new statement changes the type of n"))
    assert rebuild().as_status()["held"] == "the new statement changes the type of n"
    backend.transaction(lambda cur: rebuilds.hold(cur, "v1", None))
    assert rebuild().held is None
    backend.transaction(lambda cur: rebuilds.hold(cur, "v1", "still"))
    backend.transaction(lambda cur: rebuilds.restart(cur, "v1", "a3"))
    assert rebuild().held is None and rebuild().new_fingerprint == "a3", "a new statement is checked again"
    old, new = RebuildState.SERVING_OLD, RebuildState.SWITCHED
    backend.transaction(lambda cur: rebuilds._move(cur, "v1", old, new, switched_epoch=9, switch_snapshot="/s"))
    backend.transaction(lambda cur: rebuilds.hold(cur, "v1", "late"))
    assert rebuild().held is None, "a switched rebuild is not held"


def test_the_rebuild_rules() -> None:
    assert REBUILD_TRANSITIONS[RebuildState.DONE] == frozenset()
    rebuilds.check_rebuild("v", RebuildState.SERVING_OLD, RebuildState.SWITCHED)
    with pytest.raises(InvariantViolation, match="cannot move from SERVING_OLD to DONE"):
        rebuilds.check_rebuild("v", RebuildState.SERVING_OLD, RebuildState.DONE)
    assert rebuilds.rebuilt_view(rebuilds.shadow_name("bidder_counts")) == "bidder_counts"
    assert rebuilds.rebuilt_view("bidder_counts") is None


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


def test_snapshot_ranges_grow_towards_ten_seconds_and_stay_even() -> None:
    """A range of a few seconds grows (at most 4x a step) until ranges take about 10 s; ranges are
    never narrower than the first (EPOCHAL_BACKFILL_RANGE_ROWS); the vnodes left are split evenly,
    never into a range and a sliver, and a rest within half a range of the width is done in one."""
    from epochal.checkpoint.backfills.state import evened, grown_width

    assert grown_width([(8, 1.0)], 248) == 32 - 1  # 4x: 32 wide, evened over 248 left (8 ranges of 31)
    assert grown_width([(52, 3.0)], 300) == 150  # 3.3x: 173 wide would leave a sliver; two of 150
    assert grown_width([(52, 3.0)], 204) == 204  # 173 wide leaves 31: the rest in one range, not two
    assert grown_width([(52, 30.0)], 204) == 102  # slower than 10 s: twice as wide once (evened: 2 x 102)
    assert grown_width([(52, 30.0), (102, 60.0)], 102) == 51  # time grows with the width: back to the first (evened)
    assert grown_width([(100, 0.5)], 156) == 156  # the rest in one range
    assert grown_width([(64, 1.0)], 0) == 64  # nothing left
    assert grown_width([(1, 0.0)], 255) == 4  # no time measured: the largest step
    # The first range too: 10.01M rows at 10M rows a range is one range, not two of 128.
    assert (evened(255, 256), evened(51, 256)) == (256, 43)  # 51 wide: 6 ranges of 43, not 5 and a sliver


def test_ranges_that_each_scan_the_whole_input_grow_past_the_time_target() -> None:
    """Where the input is not laid out by the view's key every range scans all of it: a 300-s scan
    with 1-vnode ranges would be 256 scans. Once two ranges show the time does not grow with the
    width, ranges widen (16x a step at most) so the scan is at most half of each; where the time
    does grow with the width, the model sizes ranges to the 10-s target."""
    from epochal.checkpoint.backfills.state import grown_width, range_cost

    assert range_cost([(1, 300.0)]) is None
    assert range_cost([(1, 300.0), (4, 303.0)]) == (299.0, 1.0)
    assert range_cost([(4, 300.0), (4, 301.0)]) is None  # one width: nothing to tell apart
    scans = [(1, 300.0)]
    scans.append((grown_width(scans, 255), 301.0))
    assert scans[-1][0] == 2  # one range measured: twice as wide, however slow
    assert grown_width(scans, 253) == 32  # the scan is all of it: 16x
    assert grown_width([(4, 300.0), (64, 303.0)], 188) == 188  # 300 s more of scan would be the most of it
    # 1 s fixed, 0.1 s a vnode: 90 vnodes make a 10-s range
    assert grown_width([(10, 2.0), (20, 3.0)], 226) == 76  # 90 wanted: evened as 3 ranges of 76
    assert grown_width([(20, 2.0), (10, 3.0)], 250) == 125  # the wider was faster (noise): 16x, evened as 2


def test_steps_of_two_epochs_that_both_read_the_old_rows_pending_agree(tmp_path: Path, meta_url: str) -> None:
    """Steps of two epochs (two runs) of a view being rebuilt both read its old rows PENDING, and
    both decide. The first decides; the second takes that decision instead of failing (a chaos run
    lost a run to "the old rows of region_stats are not PENDING any more"); FROZEN is never undone."""
    from epochal.checkpoint.statements.rebuilds import OldRows

    history(tmp_path, meta_url)
    backend = grown(tmp_path, meta_url).backend
    backend.transaction(lambda cur: rebuilds.start(cur, "v1", "old", "new", 1))

    def decide(wanted: OldRows) -> OldRows:
        return backend.transaction(lambda cur: rebuilds.decide_old_rows(cur, "v1", wanted))

    stale = backend.transaction(lambda cur: rebuilds.read(cur, "v1")).old_rows
    assert stale is OldRows.PENDING
    assert decide(OldRows.MAINTAINED) is OldRows.MAINTAINED
    # the second step still holds PENDING: a move from what it read fails, a decision does not
    with pytest.raises(InvariantViolation, match="not PENDING any more"):
        backend.transaction(lambda cur: rebuilds.set_old_rows(cur, "v1", stale, OldRows.MAINTAINED))
    assert decide(OldRows.MAINTAINED) is OldRows.MAINTAINED
    assert decide(OldRows.FROZEN) is OldRows.FROZEN  # a maintained version that can no longer be
    assert decide(OldRows.MAINTAINED) is OldRows.FROZEN  # ... stays frozen for every later step
    assert backend.transaction(lambda cur: rebuilds.read(cur, "v1")).old_rows is OldRows.FROZEN
