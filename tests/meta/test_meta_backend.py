"""The meta-store backends on a real DuckDB file and a real PostgreSQL server: parameters are bound
(never pasted into the SQL text), and locks and conflicts are waited out, or named with their fix."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

from epochal.errors import EpochalError
from epochal.meta import backend as meta_backend
from epochal.meta.backend import DuckDBBackend, PostgresBackend, open_backend


@pytest.fixture(params=["duckdb", "postgresql"])
def meta_url(request, tmp_path: Path) -> str:
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'meta.duckdb'}"
    return request.getfixturevalue("postgres_url")


HOSTILE = "x'); DROP TABLE notes; --"


def test_parameters_are_bound_and_a_question_mark_in_a_literal_stays(meta_url: str) -> None:
    """The meta store's SQL is written once with ``?`` parameters for both backends. A ``?`` inside a
    string literal, a quoted identifier or a comment is text, not a parameter, and a value that
    looks like SQL is stored as it is."""
    backend = open_backend(meta_url)
    backend.transaction(lambda cur: cur.execute('CREATE TABLE notes (id INTEGER, body VARCHAR, "why?" VARCHAR)'))

    def write(cur) -> None:
        cur.execute(
            "-- why? a comment with a question mark\n"
            "INSERT INTO notes (id, body, \"why?\") VALUES (?, ?, 'because? 100%') /* ? */",
            [1, HOSTILE],
        )
        cur.execute("INSERT INTO notes VALUES (?, 'what?', ?)", [2, "a ? b"])

    backend.transaction(write)
    rows = backend.transaction(lambda cur: cur.execute('SELECT id, body, "why?" FROM notes ORDER BY id').fetchall())
    assert rows == [(1, HOSTILE, "because? 100%"), (2, "what?", "a ? b")]
    found = backend.transaction(
        lambda cur: cur.execute("SELECT id FROM notes WHERE body = ? AND '?' = ?", [HOSTILE, "?"]).fetchall()
    )
    assert found == [(1,)]


def test_postgres_binds_parameters_on_the_server(postgres_url: str) -> None:
    """The ``?`` parameters reach PostgreSQL as ``$n`` placeholders bound by the server, not as text
    pasted into the query: the server's own record of the query holds ``$1``, not the value."""
    backend = PostgresBackend(postgres_url)
    sql = "SELECT current_query() WHERE ? = 'secret?' AND ? > 0"
    (query,) = backend.transaction(lambda cur: cur.execute(sql, ["secret?", 5]).fetchone())
    assert query == "SELECT current_query() WHERE $1 = 'secret?' AND $2 > 0"


def test_postgres_transaction_that_loses_a_serialization_race_runs_again(postgres_url: str) -> None:
    """Two transactions that update one row: the one that loses fails whole at the server and is run
    again from the start, seeing the winner's write (a lost update would leave 11, not 111)."""
    import psycopg

    backend = PostgresBackend(postgres_url)
    backend.transaction(lambda cur: cur.execute("CREATE TABLE counter (n INTEGER)"))
    backend.transaction(lambda cur: cur.execute("INSERT INTO counter VALUES (?)", [1]))
    tries = []

    def add_ten(cur) -> None:
        tries.append(cur.execute("SELECT n FROM counter").fetchone()[0])
        if len(tries) == 1:  # another session commits in between our read and our write
            with psycopg.connect(postgres_url, autocommit=True) as other:
                other.execute("UPDATE counter SET n = n + 100")
        cur.execute("UPDATE counter SET n = ?", [tries[-1] + 10])

    backend.transaction(add_ten)
    assert tries == [1, 101]
    assert backend.transaction(lambda cur: cur.execute("SELECT n FROM counter").fetchone()) == (111,)


def test_postgres_error_that_is_no_conflict_is_raised_at_once(postgres_url: str) -> None:
    import psycopg

    backend = PostgresBackend(postgres_url)
    calls = []

    def bad(cur) -> None:
        calls.append(1)
        cur.execute("SELECT * FROM no_such_table")

    with pytest.raises(psycopg.errors.UndefinedTable):
        backend.transaction(bad)
    assert len(calls) == 1
    assert backend.transaction(lambda cur: cur.execute("SELECT ?", [7]).fetchone()) == (7,)


def _hold_lock(path: Path):
    handle = open(path.with_name(path.name + ".lock"), "a+b")  # noqa: SIM115 - released by the caller
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    return handle


def test_duckdb_meta_store_waits_for_a_lock_another_process_holds(tmp_path: Path) -> None:
    """A transaction finds the store locked (another open file description holds the flock, as
    another process would), waits with backoff, and runs once the lock is released."""
    path = tmp_path / "meta.duckdb"
    backend = DuckDBBackend(path)
    backend.transaction(lambda cur: cur.execute("CREATE TABLE t (v INTEGER)"))
    handle = _hold_lock(path)
    releaser = threading.Timer(0.5, handle.close)  # closing the file releases its flock
    releaser.start()
    started = time.monotonic()
    backend.transaction(lambda cur: cur.execute("INSERT INTO t VALUES (?)", [1]))
    waited = time.monotonic() - started
    releaser.join()
    assert waited >= 0.4
    assert backend.transaction(lambda cur: cur.execute("SELECT sum(v) FROM t").fetchone()) == (1,)


def test_duckdb_meta_store_locked_too_long_names_the_file_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "meta.duckdb"
    backend = DuckDBBackend(path)
    backend.transaction(lambda cur: cur.execute("CREATE TABLE t (v INTEGER)"))
    monkeypatch.setattr(meta_backend, "LOCK_WAIT_SECONDS", 0.3)
    handle = _hold_lock(path)
    try:
        started = time.monotonic()
        with pytest.raises(EpochalError, match="stayed locked") as raised:
            backend.transaction(lambda cur: cur.execute("INSERT INTO t VALUES (1)"))
        assert 0.3 <= time.monotonic() - started < 5
    finally:
        handle.close()
    message = str(raised.value)
    assert str(path) in message
    assert "use a PostgreSQL meta store (EPOCHAL_META_URL=postgresql://...)" in message
    assert backend.transaction(lambda cur: cur.execute("SELECT count(*) FROM t").fetchone()) == (0,)
