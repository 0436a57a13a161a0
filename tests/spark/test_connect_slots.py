"""Spark Connect session slots (epochal/spark/slots.py): which session a run attaches to.

The lock and id-file logic is pure, tested here without Spark; attaching to a slot's session on a
real server is tested in test_spark_server.py."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from epochal.spark import slots as connect_slots

URL = "sc://127.0.0.1:15002"


def test_a_slot_is_held_by_one_holder_and_keeps_its_session_for_the_next(tmp_path: Path) -> None:
    first = connect_slots.take(tmp_path, URL, 2)
    second = connect_slots.take(tmp_path, URL, 2)
    assert first is not None and second is not None
    assert (first.index, second.index) == (0, 1)
    assert first.session_id != second.session_id
    assert connect_slots.take(tmp_path, URL, 2) is None, "every slot held: the caller makes its own session"
    kept = first.session_id
    first.release()
    again = connect_slots.take(tmp_path, URL, 2)
    assert again is not None and (again.index, again.session_id) == (0, kept), "the same session, warm"
    assert again.remote == f"{URL}/;session_id={kept}"


def test_a_slot_held_by_another_process_is_skipped_and_freed_when_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from epochal.spark import slots as connect_slots;"
            f"s = connect_slots.take(Path({str(tmp_path)!r}), {URL!r}, 2); print(s.index, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        mine = connect_slots.take(tmp_path, URL, 2)
        assert mine is not None and mine.index == 1
        mine.release()
    finally:
        holder.kill()
        holder.wait()
    freed = connect_slots.take(tmp_path, URL, 2)
    assert freed is not None and freed.index == 0, "the kernel dropped the dead holder's lock"


def test_another_server_a_renewed_session_and_a_damaged_id_file_get_new_ids(tmp_path: Path) -> None:
    slot = connect_slots.take(tmp_path, URL, 1)
    assert slot is not None
    old = slot.session_id
    slot.renew()  # the server closed the session
    assert slot.session_id != old
    assert json.loads((tmp_path / "slot-0.json").read_text()) == {"url": URL, "session_id": slot.session_id}
    renewed = slot.session_id
    slot.release()
    other = connect_slots.take(tmp_path, "sc://127.0.0.1:15003", 1)
    assert other is not None and other.session_id not in (old, renewed), "another server: its own session"
    other.release()
    (tmp_path / "slot-0.json").write_text("{torn")
    fresh = connect_slots.take(tmp_path, "sc://127.0.0.1:15003", 1)
    assert fresh is not None and uuid.UUID(fresh.session_id)
    fresh.release()
    assert connect_slots.take(tmp_path, URL, 0) is None, "0 slots: a session per run"
    (tmp_path / "a-file").write_text("")
    assert connect_slots.take(tmp_path / "a-file" / "sessions", URL, 2) is None, "unwritable: a session of its own"


def test_urls_with_parameters_and_secrets(tmp_path: Path) -> None:
    assert connect_slots.with_session_id("sc://h:1/;use_ssl=true", "x") == "sc://h:1/;use_ssl=true;session_id=x"
    assert connect_slots.with_session_id("sc://h:1/", "x") == "sc://h:1/;session_id=x"
    assert connect_slots.names_a_session("sc://h:1/;user_id=a;session_id=b")
    assert not connect_slots.names_a_session("sc://h:1/;user_id=a") and not connect_slots.names_a_session("sc://h:1")
    slot = connect_slots.take(tmp_path, "sc://h:1/;token=s3cr3t", 1)
    assert slot is not None and slot.remote.endswith(f";token=s3cr3t;session_id={slot.session_id}")
    assert "s3cr3t" not in (tmp_path / "slot-0.json").read_text(), "the token stays out of the id file"
    slot.release()
    again = connect_slots.take(tmp_path, "sc://h:1/;token=s3cr3t", 1)
    assert again is not None and again.session_id == slot.session_id
    again.release()


def test_the_servers_refusals_of_a_closed_session_are_recognised() -> None:
    closed = RuntimeError("(SparkSQLException) [INVALID_HANDLE.SESSION_CLOSED] The handle x is invalid.")
    assert connect_slots.is_closed_session_error(closed)
    assert not connect_slots.is_closed_session_error(RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] t"))
