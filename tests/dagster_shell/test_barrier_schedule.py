"""The barrier sensor's schedule (pure): injections on the barrier interval's grid at the daemon's
5-second loop, never a burst after a pause, and a cursor that survives the old format."""

import random

import pytest

from platform_defs.barrier_schedule import DAEMON_LOOP_S, BarrierSchedule, SensorCursor


def _daemon(schedule: BarrierSchedule, seconds: float, start_jitter: list[float]) -> list[float]:
    """Injection times as Dagster's sensor daemon would produce them: a loop turn every 5 s, a tick
    when the minimum interval has passed since the previous tick's start (which lands a little
    after its turn, by the jitter), an injection when the schedule says due."""
    injections: list[float] = []
    last_tick: float | None = None
    next_barrier: float | None = None
    turn = 0
    while turn * DAEMON_LOOP_S < seconds:
        now = turn * DAEMON_LOOP_S + start_jitter[turn % len(start_jitter)]
        turn += 1
        if last_tick is not None and now - last_tick < schedule.minimum_interval_seconds():
            continue
        last_tick = now
        if schedule.due(next_barrier, now):
            next_barrier = schedule.after_injection(next_barrier, now)
            injections.append(now)
    return injections


@pytest.mark.parametrize("jitter", [[0.0], [0.3, 0.1, 0.4, 0.0, 0.2], [0.05, 0.0]])
def test_a_ten_second_barrier_injects_six_epochs_a_minute_whatever_the_ticks_jitter(jitter: list[float]) -> None:
    schedule = BarrierSchedule(10.0)
    injections = _daemon(schedule, 600, jitter)
    assert len(injections) == 60
    gaps = [b - a for a, b in zip(injections, injections[1:], strict=False)]
    assert all(9 < g < 11 for g in gaps), gaps


def test_under_random_tick_jitter_the_old_rule_lost_barriers_and_the_schedule_does_not() -> None:
    """What the schedule fixes: a minimum interval equal to the barrier interval, counted from a tick
    that started a little after its loop turn, misses the turn one interval later whenever that turn
    started a little earlier. The old rule is the schedule with no tolerance."""
    rng = random.Random(17)
    jitter = [rng.uniform(0.0, 0.5) for _ in range(120)]

    class OldRule(BarrierSchedule):
        tolerance_s = 0.0

    assert len(_daemon(OldRule(10.0), 600, jitter)) < 54
    assert len(_daemon(BarrierSchedule(10.0), 600, jitter)) == 60


def test_intervals_off_the_loop_keep_their_rate_and_short_ones_inject_every_loop() -> None:
    assert len(_daemon(BarrierSchedule(7.0), 700, [0.1, 0.0])) == pytest.approx(100, abs=1)
    assert len(_daemon(BarrierSchedule(15.0), 600, [0.2, 0.0, 0.1])) == 40
    assert len(_daemon(BarrierSchedule(1.0), 60, [0.0])) == 12  # the daemon's loop is the floor


def test_a_late_tick_keeps_the_grid_and_a_long_pause_starts_a_new_one_without_a_burst() -> None:
    schedule = BarrierSchedule(10.0)
    assert schedule.after_injection(None, 100.0) == 110.0
    assert schedule.after_injection(110.0, 114.0) == 120.0  # 4 s late: the grid stays
    assert not schedule.due(120.0, 117.0) and schedule.due(120.0, 117.6)
    resumed = schedule.after_injection(120.0, 200.0)  # injection was blocked for 80 s
    assert resumed == 210.0 and not schedule.due(resumed, 205.0)


def test_the_cursor_round_trips_and_reads_the_format_before_the_schedule() -> None:
    assert SensorCursor.parse(None) == SensorCursor()
    assert SensorCursor.parse("41") == SensorCursor(requested="41")
    cursor = SensorCursor("42", 1234.5)
    assert SensorCursor.parse(cursor.serialize()) == cursor
    assert SensorCursor.parse(SensorCursor(None, None).serialize()) == SensorCursor()
