"""`epochal status`: a short readable summary, with each source's dead letters."""

from __future__ import annotations

from epochal.cli.main import status_lines, with_epoch_times
from epochal.epoch import epoch_from_ms


def _status(**over: object) -> dict:
    status = {
        "committed_epoch": None,
        "paused": False,
        "pause_on_next_start": False,
        "recovery_requested": None,
        "in_flight": [],
        "tables": {"orders": 7, "big_orders": 7},
        "snapshots": {},
        "sources_storing_nothing": [],
        "sinks": {},
        "backfills": {},
        "last_recovery": None,
        "epoch_counts": {"INJECTED": 0, "COLLECTED": 0, "COMMITTED": 3, "ABORTED": 1},
        "dead_letters": {
            "orders": {"records": 4, "epochs": 2, "last_epoch": 7},
            "bid": {"records": 0, "epochs": 0, "last_epoch": None},
        },
        "meta_store": "duckdb:///x/meta.duckdb",
    }
    return {**status, **over}


def test_status_prints_readable_lines_not_a_python_dict() -> None:
    text = "\n".join(status_lines(_status()))
    assert "{" not in text and "'COMMITTED'" not in text, text
    assert "epochs          : 3 committed, 1 aborted" in text
    assert status_lines(_status(epoch_counts=dict.fromkeys(("INJECTED", "COMMITTED"), 0)))[-2].endswith("none yet")


def test_status_shows_dead_letters_per_source_and_how_to_read_them() -> None:
    lines = status_lines(_status())
    orders = next(line for line in lines if line.strip().startswith("orders ") and "epoch(s)" in line)
    assert "4 in 2 epoch(s), last in 7" in orders
    assert 'epochal query "SELECT * FROM orders__dead_letters"' in orders
    assert any(line.split() == ["bid", "none"] for line in lines)


def test_status_shows_each_epoch_with_its_wall_clock_time() -> None:
    # 2026-12-07 10:00:01Z committed, 10:00:02Z in flight; the sink delivered up to 10:00:00Z
    committed, flying, delivered = (epoch_from_ms(1796637600000 + ms) for ms in (1000, 2000, 0))
    flight = {"epoch": flying, "kind": "checkpoint", "state": "INJECTED", "collected": [], "failure": None}
    lag = {"delivered_epoch": delivered, "lag_epochs": 1, "lag_seconds": 1.0, "last_error": None}
    status = _status(committed_epoch=committed, in_flight=[flight], sinks={"out": lag})
    text = "\n".join(status_lines(status))
    assert f"committed epoch : {committed} (2026-12-07 10:00:01Z)" in text, text
    assert f"  {flying} (2026-12-07 10:00:02Z) checkpoint" in text, text
    assert f"{delivered} (2026-12-07 10:00:00Z)  1 epoch(s), 1s behind" in text, text
    # --json: ISO 8601 beside each epoch
    shown = with_epoch_times(status)
    assert shown["committed_epoch_time"] == "2026-12-07T10:00:01.000+00:00"
    assert shown["in_flight"][0]["epoch_time"] == "2026-12-07T10:00:02.000+00:00"
    assert shown["sinks"]["out"]["delivered_epoch_time"] == "2026-12-07T10:00:00.000+00:00"
    assert with_epoch_times(_status())["committed_epoch_time"] is None
