"""An epoch as users meet it: its id with its wall-clock time beside it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from epochal.epoch import epoch_age_s, epoch_from_ms, epoch_time_text, shown_epoch


def test_an_epoch_is_shown_with_its_wall_clock_time_in_utc() -> None:
    at = datetime(2026, 12, 7, 10, 0, 1, 250_000, tzinfo=UTC)
    epoch = epoch_from_ms(int(at.timestamp() * 1000)) + 3  # (a sequence number does not move the time)
    assert epoch_time_text(epoch) == "2026-12-07 10:00:01Z"
    assert shown_epoch(epoch) == f"{epoch} (2026-12-07 10:00:01Z)"
    assert shown_epoch(None) == "none"
    assert epoch_age_s(epoch, at.timestamp() + 2.5) == 2.5
