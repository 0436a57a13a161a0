"""`epochal status`: a short readable summary, with each source's dead letters."""

from __future__ import annotations

from epochal.cli.main import status_lines


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
