"""Source backfill per split: the state rules (pure), and their meta-store side on DuckDB and
PostgreSQL (targets fixed at the snapshot epoch, offsets persisted with each chunk, splits moving
on with the epochs the view takes, a split that appears during the backfill, the join)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.checkpoint.backfills.splits import (
    SPLIT_TRANSITIONS,
    SplitPhase,
    after_epoch,
    after_join,
    after_read,
    next_chunk,
    reading_done,
    start,
)
from epochal.checkpoint.backfills.state import VnodeRange
from epochal.checkpoint.records import InvariantViolation
from epochal.connectors.base import SplitRange
from tests.checkpoint.test_backfill_log import grown, history
from tests.checkpoint.test_controller import collect_all, plan_ten

# ---------------------------------------------------------------- the rules, without a store


def test_a_split_reads_its_history_in_chunks_up_to_the_target_then_caches_up() -> None:
    state = start("v", "src", "0", origin=5, target=30)
    assert state.phase is SplitPhase.BACKFILLING and state.offset == 5
    chunk = next_chunk(state, 10)
    assert chunk == SplitRange("0", 5, 15)
    state = after_read("v", state, chunk, rows=9)  # a malformed line is not a row
    assert (state.phase, state.offset, state.rows) == (SplitPhase.BACKFILLING, 15, 9)
    state = after_read("v", state, next_chunk(state, 10), rows=10)
    last = next_chunk(state, 10)
    assert last == SplitRange("0", 25, 30)  # never past the target
    state = after_read("v", state, last, rows=5)
    assert (state.phase, state.offset, state.rows) == (SplitPhase.SOURCE_CACHING_UP, 30, 24)
    assert next_chunk(state, 10) is None
    with pytest.raises(InvariantViolation, match="after it was read"):
        after_read("v", state, SplitRange("0", 30, 31), 1)


def test_a_chunk_that_is_not_the_next_records_is_refused() -> None:
    state = start("v", "src", "0", origin=0, target=100)
    for wrong in (SplitRange("0", 10, 20), SplitRange("1", 0, 10), SplitRange("0", 0, 101), SplitRange("0", 0, 0)):
        with pytest.raises(InvariantViolation, match="next records"):
            after_read("v", state, wrong, 1)


def test_an_idle_split_is_caught_up_at_once_and_never_holds_the_snapshot_back() -> None:
    busy = start("v", "src", "0", origin=0, target=50)
    idle = start("v", "src", "1", origin=7, target=7)
    assert idle.phase is SplitPhase.SOURCE_CACHING_UP
    assert not reading_done([busy, idle])
    busy = after_read("v", busy, next_chunk(busy, 100), 50)
    assert reading_done([busy, idle])


def test_epochs_after_the_snapshot_finish_a_split_only_where_the_backfill_stopped() -> None:
    reading = start("v", "src", "0", origin=0, target=20)
    with pytest.raises(InvariantViolation, match="still backfilling"):
        after_epoch("v", reading, SplitRange("0", 20, 30))
    cached = after_read("v", reading, next_chunk(reading, 100), 20)
    with pytest.raises(InvariantViolation, match="count twice"):
        after_epoch("v", cached, SplitRange("0", 15, 30))  # records 15..19 read by the backfill too
    finished = after_epoch("v", cached, SplitRange("0", 20, 30))
    assert finished.phase is SplitPhase.FINISHED
    assert after_epoch("v", finished, SplitRange("0", 30, 40)) == finished
    # A split new after the snapshot epoch: nothing to read, finished by its first epoch.
    new = start("v", "src", "9", origin=0, target=0)
    assert after_epoch("v", new, SplitRange("9", 0, 4)).phase is SplitPhase.FINISHED


def test_the_join_finishes_every_split_that_has_read_its_history() -> None:
    cached = start("v", "src", "1", origin=3, target=3)
    assert after_join("v", cached).phase is SplitPhase.FINISHED
    with pytest.raises(InvariantViolation, match="still backfilling"):
        after_join("v", start("v", "src", "0", origin=0, target=1))
    assert SPLIT_TRANSITIONS[SplitPhase.FINISHED] == frozenset()
    assert SplitPhase.BACKFILLING not in SPLIT_TRANSITIONS[SplitPhase.SOURCE_CACHING_UP]


# ---------------------------------------------------------------- the meta store


def plan_with_new_split(source: str, starts: dict[str, int]) -> list:
    """plan_ten, and a split "2" that appears (4 records an epoch)."""
    return [*plan_ten(source, starts), SplitRange("2", starts.get("2", 0), starts.get("2", 0) + 4)]


def test_splits_are_read_from_the_history_start_to_the_snapshot_epoch_and_finish_with_the_epochs(
    tmp_path: Path, meta_url: str
) -> None:
    first = history(tmp_path, meta_url)  # src's splits "0" and "1" hold [0, 10) each at ``first``
    ctl = grown(tmp_path, meta_url)
    e2 = ctl.epoch_log.inject(plan_ten).epoch  # registers v3 over src, snapshot epoch ``first``
    assert collect_all(ctl, e2) == [e2]
    assert ctl.backfills.get("v3").snapshot_epoch == first
    assert ctl.backfills.claim("v3")
    assert ctl.backfills.begin_splits("v3", ["src"], vnodes_started=False) == ["src"]
    # Decided once: asking again (another run) does not start the splits over.
    assert ctl.backfills.begin_splits("v3", [], vnodes_started=True) == ["src"]
    states = {s.split: s for s in ctl.backfills.split_states("v3")}
    assert {k: (s.phase, s.offset, s.target) for k, s in states.items()} == {
        "0": (SplitPhase.BACKFILLING, 0, 10),  # the target is the snapshot epoch's end, not e2's
        "1": (SplitPhase.BACKFILLING, 0, 10),
    }
    # A chunk is recorded with its files; reading from a stale state (another runner) is refused.
    moved = ctl.backfills.record_split_read("v3", states["0"], SplitRange("0", 0, 6), 6, "/b/splits/src/0-0")
    with pytest.raises(InvariantViolation, match="no longer has"):
        ctl.backfills.record_split_read("v3", states["0"], SplitRange("0", 0, 6), 6, "/b/splits/src/0-0x")
    ctl.backfills.record_split_read("v3", moved, SplitRange("0", 6, 10), 4, "/b/splits/src/0-6")
    shown = ctl.status()["backfills"]["v3"]
    assert (shown["splits_done"], shown["splits_total"]) == (1, 2)
    assert shown["splits"]["src"]["0"] == {"phase": "caching_up", "offset": 10, "target": 10, "rows": 10}
    assert shown["rows"] == 10
    ctl.backfills.record_split_read("v3", states["1"], SplitRange("1", 0, 10), 10, "/b/splits/src/1-0")
    assert ctl.backfills.split_chunks("v3", "src") == ["/b/splits/src/0-0", "/b/splits/src/0-6", "/b/splits/src/1-0"]

    # A split appears in an epoch after the snapshot epoch: its records come with the epochs.
    e3 = ctl.epoch_log.inject(plan_with_new_split).epoch
    assert collect_all(ctl, e3) == [e3]
    ctl.backfills.record_chunk("v3", VnodeRange(0, 256), "r000-x-", 20, 5)
    ctl.backfills.finish_snapshot("v3", "/snap/v3", ("k",), "{}", 5, 1)
    ctl.backfills.record_epoch("v3", e2, "/loc/v3/e2", 20, 2, 0.1)
    states = {s.split: s for s in ctl.backfills.split_states("v3")}
    assert states["0"].phase is SplitPhase.FINISHED and states["1"].phase is SplitPhase.FINISHED
    assert "2" not in states  # not in e2
    ctl.backfills.record_epoch("v3", e3, "/loc/v3/e3", 24, 2, 0.1)
    states = {s.split: s for s in ctl.backfills.split_states("v3")}
    assert (states["2"].phase, states["2"].offset, states["2"].target) == (SplitPhase.FINISHED, 0, 0)
    joined, _ = ctl.backfills.join("v3")
    assert joined
    assert ctl.status()["backfills"]["v3"]["splits_done"] == 3


def test_a_view_joining_right_after_its_snapshot_finishes_its_cached_up_splits(tmp_path: Path, meta_url: str) -> None:
    history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    e2 = ctl.epoch_log.inject(plan_ten).epoch
    assert ctl.backfills.claim("v3")
    ctl.backfills.begin_splits("v3", ["src"], vnodes_started=False)
    for state in ctl.backfills.split_states("v3"):
        ctl.backfills.record_split_read("v3", state, SplitRange(state.split, 0, 10), 10, f"/c/{state.split}")
    ctl.backfills.record_chunk("v3", VnodeRange(0, 256), "r000-x-", 20, 5)
    ctl.backfills.finish_snapshot("v3", "/snap/v3", ("k",), "{}", 5, 1)
    joined, pending = ctl.backfills.join("v3")  # e2 is in flight: the view writes it live
    assert joined and pending == []
    assert {s.phase for s in ctl.backfills.split_states("v3")} == {SplitPhase.FINISHED}
    assert collect_all(ctl, e2, tables=("src", "v1", "v2", "v3")) == [e2]


def test_a_source_whose_history_start_is_unknown_is_read_from_its_stored_rows(tmp_path: Path, meta_url: str) -> None:
    history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    ctl.epoch_log.inject(plan_ten)
    # A store from before first_offset was recorded.
    ctl.backend.transaction(lambda cur: cur.execute("UPDATE split_frontier SET first_offset = NULL"))
    assert ctl.backfills.claim("v3")
    assert ctl.backfills.begin_splits("v3", ["src"], vnodes_started=False) == []
    assert ctl.backfills.split_states("v3") == []
    assert ctl.status()["backfills"]["v3"]["splits"] == {}


def test_a_restarted_backfill_forgets_its_splits_and_hands_back_their_files(tmp_path: Path, meta_url: str) -> None:
    history(tmp_path, meta_url)
    ctl = grown(tmp_path, meta_url)
    ctl.epoch_log.inject(plan_ten)
    assert ctl.backfills.claim("v3")
    ctl.backfills.begin_splits("v3", ["src"], vnodes_started=False)
    state = ctl.backfills.split_states("v3")[0]
    ctl.backfills.record_split_read("v3", state, SplitRange(state.split, 0, 4), 4, "/d/chunk")
    assert "/d/chunk" in ctl.backfills.restart("v3")
    assert ctl.backfills.split_states("v3") == [] and ctl.backfills.split_chunks("v3") == []


def test_a_chunk_the_split_no_longer_holds_is_refused_not_read_short(tmp_path: Path) -> None:
    from epochal.backfill.source_splits import check_still_there
    from epochal.connectors.log import LogConfig, LogSource, append_records
    from epochal.errors import EpochalError
    from epochal.pipeline.model import Column

    append_records(tmp_path, ['{"id": 1}', '{"id": 2}', '{"id": 3}'], split="a")
    connector = LogSource(LogConfig(tmp_path), (Column("id", "BIGINT"),))
    check_still_there(connector, "orders", SplitRange("a", 0, 3))  # all there
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n')  # truncated since the epochs read it
    with pytest.raises(EpochalError, match="split a no longer holds records \\[0, 3\\)"):
        check_still_there(connector, "orders", SplitRange("a", 0, 3))


def test_a_split_history_starts_where_the_source_first_read_it(tmp_path: Path, meta_url: str) -> None:
    """scan.startup.mode = 'latest': the source's first epoch starts at the log's end (100 here),
    and a split that appears later starts at 0. The backfill reads from there, never before."""
    from epochal.checkpoint.controller import CheckpointController
    from tests.checkpoint.test_backfill_log import UPSTREAMS
    from tests.checkpoint.test_controller import settings
    from tests.checkpoint.test_controller import start as bootstrap

    def latest(source: str, starts: dict[str, int]) -> list:
        first = {"0": starts.get("0", 100), "1": starts.get("1", 0)}
        return [SplitRange(split, at, at + 5) for split, at in first.items() if split == "0" or starts]

    old = CheckpointController(settings(tmp_path, meta_url), ["src"], ["v1", "v2"], upstreams=UPSTREAMS)
    bootstrap(old)
    for _ in range(2):  # split "1" appears in the second epoch
        epoch = old.epoch_log.inject(latest).epoch
        collect_all(old, epoch)
    ctl = grown(tmp_path, meta_url)
    ctl.epoch_log.inject(latest)
    assert ctl.backfills.claim("v3")
    ctl.backfills.begin_splits("v3", ["src"], vnodes_started=False)
    states = {s.split: (s.offset, s.target) for s in ctl.backfills.split_states("v3")}
    assert states == {"0": (100, 110), "1": (0, 5)}
