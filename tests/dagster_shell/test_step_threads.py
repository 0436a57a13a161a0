"""A run's independent steps on threads (``platform_defs.executor``, EPOCHAL_STEP_THREADS): they
overlap, what one step sets for itself stays with it, a failure in one thread skips only what
depends on it, and views and sinks still equal the batch oracle."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from epochal.checkpoint.records import EpochState
from epochal.runtime.facade import EpochRuntime
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import VIEW_QUERIES, make_harness

ORDERS = [
    '{"id": 1, "customer": "ann", "amount": 12.5, "ts": "2026-01-01T10:00:00"}',
    '{"id": 2, "customer": "vip", "amount": 3.0, "ts": "2026-01-01T10:01:00"}',
    '{"id": 3, "customer": "bob", "amount": 20.0, "ts": "2026-01-01T10:02:00"}',
]


def _op(step_key: str) -> str:
    """The op of a step mapped over the run's epochs: ``view__v[e<epoch>]`` -> ``view__v``."""
    return re.sub(r"\[e\d+\]$", "", step_key)


def _intervals(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> dict[str, tuple[float, float]]:
    """Each step's (start, end) by its op (runs of one epoch), from the run's event log."""
    starts, ends = {}, {}
    for record in instance.all_logs(result.run_id):
        event = record.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.is_step_start:
            starts[_op(event.step_key)] = record.timestamp
        elif event.is_step_success or event.is_step_failure:
            ends[_op(event.step_key)] = record.timestamp
    return {key: (starts[key], ends[key]) for key in ends if key in starts}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_independent_steps_overlap_and_the_epochs_stay_exact(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_STEP_THREADS", "2")
    h = make_harness(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    for round_ in range(2):
        h.produce(ORDERS if round_ == 0 else ORDERS[:1], split=str(round_))
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    steps = _intervals(instance, result)
    # Both sources wait only for the barrier, and each view only for its own source: with two
    # threads the sources run side by side, and so does one branch's view with the other branch
    # (which pair depends on which source ends first, which a loaded machine decides).
    assert _overlap(steps["source__bid"], steps["source__orders"]), steps
    assert any(
        _overlap(steps[a], steps[b])
        for a, b in (
            ("view__big_bids", "view__big_orders"),
            ("view__big_bids", "source__orders"),
            ("view__big_orders", "source__bid"),
        )
    ), steps
    runtime = h.runtime(spark)
    assert len(runtime.controller.epoch_log.epochs([EpochState.COMMITTED])) == 2
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert assert_sink_exactly_once(runtime, "big_bids_out") > 0
    assert assert_sink_exactly_once(runtime, "orders_out") == 4

    # One thread: one step at a time, nothing overlaps.
    monkeypatch.setenv("EPOCHAL_STEP_THREADS", "1")
    h.produce(ORDERS[1:], split="2")
    result = h.run_in_process(instance)
    assert result.success
    steps = sorted(_intervals(instance, result).values())
    assert all(a[1] <= b[0] for a, b in zip(steps, steps[1:], strict=False)), steps
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert assert_sink_exactly_once(runtime, "orders_out") == 6


def test_a_failed_step_skips_only_what_depends_on_it_and_recovery_goes_on(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_STEP_THREADS", "2")
    h = make_harness(tmp_path)
    h.produce(ORDERS)
    instance = dg.DagsterInstance.ephemeral()
    assert h.run_in_process(instance).success

    real = EpochRuntime.view_epoch

    def failing(self: EpochRuntime, epoch: int, name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if name == "big_orders":
            raise RuntimeError("big_orders broke")
        return real(self, epoch, name, *args, **kwargs)

    monkeypatch.setattr(EpochRuntime, "view_epoch", failing)
    h.produce(ORDERS[:1], split="1")
    result = h.run_in_process(instance)
    assert not result.success
    outcome = {
        _op(e.step_key): e.event_type_value
        for e in result.all_events
        if e.step_key and (e.is_step_success or e.is_step_failure or e.is_step_skipped)
    }
    assert outcome["view__big_orders"] == "STEP_FAILURE"
    assert outcome["view__big_bids"] == "STEP_SUCCESS"  # the other thread's view finished
    # what depends on it does not run (Dagster abandons it, with a note naming the failed step)
    started = {_op(e.step_key) for e in result.all_events if e.is_step_start}
    assert not started & {"commit", "sink__orders_out", "sink__big_bids_out", "compaction"}, started
    notes = [_op(re.sub(r"\[e\d+\]", "", r.user_message)) for r in instance.all_logs(result.run_id)]
    assert any("Dependencies for step commit failed: ['view__big_orders']" in note for note in notes), notes
    assert any(
        "big_orders broke" in e.step_failure_data.error.to_string() for e in result.all_events if e.is_step_failure
    )

    monkeypatch.setattr(EpochRuntime, "view_epoch", real)
    assert h.run_in_process(instance).success  # recovers the failed epoch and goes on
    runtime = h.runtime(spark)
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert assert_sink_exactly_once(runtime, "orders_out") == 4


@pytest.mark.slow
def test_an_interrupted_run_ends_and_the_next_one_recovers(spark, tmp_path: Path) -> None:
    """Ctrl-C (or Dagster's terminate) while view steps run on threads: no new step starts, the run
    ends within the grace period, and the next run recovers the epoch; nothing is lost or doubled."""
    h = make_harness(tmp_path)
    h.produce(ORDERS)
    instance = dg.DagsterInstance.ephemeral()
    assert h.run_in_process(instance).success
    h.produce(ORDERS[:2], split="1")
    # DEBUG: the console then shows Dagster's step events, the cue to interrupt (and the override works)
    env = {**os.environ, **h.env, "EPOCHAL_STEP_THREADS": "2", "EPOCHAL_LOG_LEVEL": "DEBUG"}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job"],
        cwd=h.home.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:  # interrupt once the first view step has started
        seen.append(line)
        if 'Started execution of step "view__' in line:
            proc.send_signal(signal.SIGINT)
            break
    started = time.monotonic()
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, "".join(seen) + rest
    assert time.monotonic() - started < 60, "the interrupted run did not end"
    assert "interrupted" in rest.lower(), rest[-3000:]

    recovered = h.run_in_process(instance)
    assert recovered.success, [e.message for e in recovered.all_events if e.is_failure]
    runtime = h.runtime(spark)
    assert runtime.controller.status()["in_flight"] == []
    assert_views_match_batch(runtime, VIEW_QUERIES)
    assert assert_sink_exactly_once(runtime, "orders_out") == 5
    assert_sink_exactly_once(runtime, "big_bids_out")
