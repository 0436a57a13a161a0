"""Meta-store connections: DuckDB (embedded default) or PostgreSQL (production).

The meta store is shared by every process that touches the pipeline: the Dagster UI, the daemon's
sensor, multiprocess steps and the shell. DuckDB allows one process to open a file at a time, so
every operation opens the file, runs one transaction and closes it, and a lock held by another
process (or a write-write conflict inside one) is retried with backoff rather than shown to a user.

"Opens the file" is an ATTACH to an in-memory DuckDB kept for the process, not a new database:
creating and destroying a DuckDB instance costs about 20 ms here even for ``:memory:``, an ATTACH
and DETACH of the meta file about 3 ms, and an epoch runs about twenty meta-store transactions.
DETACH closes the file and its buffers, so the next ATTACH reads what other processes committed.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from epochal.errors import ConfigError, EpochalError
from epochal.redaction import redact_url, scrub
from epochal.retry import retrying

log = logging.getLogger("epochal.meta")

T = TypeVar("T")

# Longer than any one meta-store transaction can hold the file: a waiter gives up only when
# something is truly stuck, and then says which file and why.
LOCK_WAIT_SECONDS = 120.0
# Waits between tries of a locked file or a conflicting transaction: 2 ms doubling up to 100 ms,
# with full jitter, so concurrent waiters spread out instead of retrying in lockstep.
BACKOFF_BASE_S = 0.002
BACKOFF_CAP_S = 0.1


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> "Cursor": ...
    def fetchall(self) -> list[tuple]: ...
    def fetchone(self) -> tuple | None: ...


class Backend(Protocol):
    url: str

    def transaction(self, fn: Callable[[Cursor], T]) -> T:
        """Run ``fn`` in one transaction, retrying it whole on lock/serialization conflicts."""


# The meta store needs no extension, and autoloading them made every database creation a third slower.
_DUCKDB_CONFIG = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}


#: The catalog name the meta file is attached under, for the length of one transaction.
_ATTACHED = "epochal_meta"


class DuckDBBackend:
    _process_lock = threading.Lock()
    #: (pid, connection) of the in-memory DuckDB that attaches meta files; guarded by _process_lock.
    #: The pid check drops a host inherited through fork, which must not be shared with the parent.
    _host: "tuple[int, Any] | None" = None

    #: what the file holds and what to do when another process keeps it locked, for the errors
    META_STORE_LOCKED = (
        "meta store",
        "stop it, or use a PostgreSQL meta store (EPOCHAL_META_URL=postgresql://...) for many concurrent writers",
    )

    def __init__(self, path: Path, locked: tuple[str, str] = META_STORE_LOCKED):
        self.path = Path(path)
        self.url = f"duckdb:///{self.path}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.what, self.locked_fix = locked

    @classmethod
    def _host_connection(cls) -> Any:
        import os

        import duckdb

        if cls._host is None or cls._host[0] != os.getpid():
            cls._host = (os.getpid(), duckdb.connect(":memory:", config=_DUCKDB_CONFIG))
        return cls._host[1]

    @classmethod
    def _drop_host(cls) -> None:
        """Forget the host after a failure that may have left the meta file attached: a fresh
        host cannot hold it open, so the next transaction starts clean."""
        host, cls._host = cls._host, None
        if host is not None:
            try:
                host[1].close()
            except Exception:  # closing is best effort; the file lock is released with the instance
                log.debug("closing the meta-store host connection failed", exc_info=True)

    @contextmanager
    def _attached(self) -> Iterator[Any]:
        """The host connection with the meta file attached and in use; detached on the way out."""
        import duckdb

        con = self._host_connection()
        path = str(self.path).replace("'", "''")
        # An interrupt between an ATTACH and its DETACH would otherwise leave the name taken.
        con.execute(f"DETACH DATABASE IF EXISTS {_ATTACHED}")
        con.execute(f"ATTACH '{path}' AS {_ATTACHED}")
        try:
            con.execute(f"USE {_ATTACHED}")
            yield con
        finally:
            try:
                con.execute("USE memory")
                con.execute(f"DETACH {_ATTACHED}")
            except duckdb.Error:
                # Not raised: after a COMMIT the transaction is durable, and a retry would repeat it.
                # Still attached would keep the file open and lock every other process out, so the
                # host goes, and the file with it.
                log.warning("meta store %s: detach failed, host connection replaced", self.path, exc_info=True)
                self._drop_host()

    @staticmethod
    def _retryable(exc: Exception) -> bool:
        import duckdb

        text = str(exc)
        if isinstance(exc, duckdb.IOException) and "lock" in text.lower():
            return True
        return isinstance(exc, duckdb.TransactionException) or "Conflict" in text

    @contextmanager
    def _file_lock(self, deadline: float) -> Iterator[None]:
        """An exclusive flock on ``<store>.lock`` around open, transaction and close.

        DuckDB's own lock on the database file did not keep processes apart: with four processes
        hammering one store, a process now and then missed another's committed write (an injected
        epoch, a collect), about one run in four. An flock belongs to its open file description, so
        nothing DuckDB opens or closes inside can release it early."""
        with open(self.path.with_name(self.path.name + ".lock"), "a+b") as handle:
            retrying(
                retry_on=lambda exc: isinstance(exc, BlockingIOError),
                base=BACKOFF_BASE_S,
                cap=BACKOFF_CAP_S,
                deadline=deadline,
                give_up=lambda exc, attempts: EpochalError(
                    f"{self.what} {self.path} stayed locked for {LOCK_WAIT_SECONDS:.0f}s; another process "
                    f"holds it: {self.locked_fix}"
                ),
            )(fcntl.flock, handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def transaction(self, fn: Callable[[Cursor], T]) -> T:
        import duckdb

        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        return retrying(
            retry_on=lambda exc: isinstance(exc, duckdb.Error) and self._retryable(exc),
            base=BACKOFF_BASE_S,
            cap=BACKOFF_CAP_S,
            deadline=deadline,
            give_up=lambda exc, attempts: EpochalError(
                f"{self.what} {self.path} stayed locked for {LOCK_WAIT_SECONDS:.0f}s ({exc}); "
                f"another process holds it open: {self.locked_fix}"
            ),
        )(self._attempt, fn, deadline)

    def _attempt(self, fn: Callable[[Cursor], T], deadline: float) -> T:
        """One try of ``fn`` in a transaction; a failure before COMMIT rolls it back and is raised."""
        import duckdb

        # One transaction at a time per process: DuckDB would otherwise turn two threads'
        # writes into a conflict error; across processes the file lock serializes us.
        with self._process_lock, self._file_lock(deadline), self._attached() as con:
            committed = False
            try:
                con.execute("BEGIN TRANSACTION")
                result = fn(_DuckCursor(con))
                con.execute("COMMIT")
                committed = True
                # Fold the WAL into the file while this process still holds the lock, so the
                # next process to open it reads the commit from the file itself.
                con.execute(f"CHECKPOINT {_ATTACHED}")
                return result
            except BaseException as exc:
                if committed and isinstance(exc, duckdb.Error):
                    # The transaction is durable (in the WAL at least): running it again would
                    # repeat its effects, e.g. inject a second epoch and orphan the first, which
                    # then blocks every later commit. Only a failure before COMMIT is retried.
                    log.warning("meta store %s: %s after commit, ignored", self.path, exc)
                    return result
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise


class _DuckCursor:
    def __init__(self, con: Any):
        self._con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> "_DuckCursor":
        self._con.execute(sql, list(params))
        return self

    def fetchall(self) -> list[tuple]:
        return self._con.fetchall()

    def fetchone(self) -> tuple | None:
        return self._con.fetchone()


class PostgresBackend:
    """Transactions on pooled connections to one PostgreSQL database.

    A connection is kept for the next transaction rather than closed: connecting costs about
    7 ms here against 0.5 ms for a transaction on an open connection, and an epoch runs about
    twenty meta-store transactions. Idle connections hold no transaction (each one ends in
    COMMIT or ROLLBACK before it goes back), so they block nothing on the server. One that the
    server closed meanwhile (a restart, an idle timeout, pg_terminate_backend) fails at BEGIN,
    before anything ran: it is dropped and the transaction starts again on a new connection."""

    #: Idle connections per URL, kept by this process; guarded by _pool_lock. Connections inherited
    #: through fork belong to the parent's sessions: a child drops the pool unclosed (psycopg does
    #: not close another process's connection when it is collected) and connects for itself.
    _pool: "tuple[int, dict[str, list[Any]]] | None" = None
    _pool_lock = threading.Lock()
    #: More idle connections than this per URL are closed on return: a process's meta-store
    #: concurrency is a few threads (the webserver, a sensor), not a pool's worth.
    MAX_IDLE = 4

    def __init__(self, url: str):
        self.url = url
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:  # pragma: no cover - psycopg is a dependency
            raise ConfigError("a postgresql:// meta store needs psycopg: pip install 'psycopg[binary]'") from exc

    @staticmethod
    def _idle(url: str) -> list[Any]:
        import os

        # PostgresBackend's, not cls's: every backend of a process shares one pool per URL
        if PostgresBackend._pool is None or PostgresBackend._pool[0] != os.getpid():
            PostgresBackend._pool = (os.getpid(), {})
        return PostgresBackend._pool[1].setdefault(url, [])

    def _checkout(self) -> tuple[Any, bool]:
        """An open connection, and whether it was kept from an earlier transaction."""
        with self._pool_lock:
            idle = self._idle(self.url)
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn, True
        return self._connect(), False

    def _connect(self) -> Any:
        import psycopg

        try:
            # autocommit: BEGIN and COMMIT are ours, so a failed BEGIN is known to have run nothing
            return psycopg.connect(self.url, connect_timeout=10, autocommit=True)
        except psycopg.OperationalError as exc:
            # `from None`: a traceback prints the cause's text, which is the driver's, unredacted
            raise EpochalError(
                f"cannot reach the PostgreSQL meta store at {redact_url(self.url)}: "
                f"{_first_line(exc, self.url)}; start the server or fix EPOCHAL_META_URL"
            ) from None
        except psycopg.Error as exc:
            # psycopg refuses the URL itself (ProgrammingError), quoting the bad piece: the password
            raise ConfigError(
                f"EPOCHAL_META_URL {redact_url(self.url)} is not a PostgreSQL URL psycopg can read "
                f"({type(exc).__name__}: {_first_line(exc, self.url)}): percent-encode special characters "
                "in the user and password (% as %25, @ as %40, : as %3A, / as %2F, ? as %3F, ; as %3B, "
                "# as %23; urllib.parse.quote(password, safe='') does it)"
            ) from None

    def _checkin(self, conn: Any) -> None:
        from psycopg.pq import TransactionStatus

        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            with self._pool_lock:
                idle = self._idle(self.url)
                if len(idle) < self.MAX_IDLE:
                    idle.append(conn)
                    return
        conn.close()

    def transaction(self, fn: Callable[[Cursor], T]) -> T:
        from psycopg import errors as pg_errors

        # These fail the transaction whole (a serialization failure may come at COMMIT), so it is
        # rolled back and run again; the retry then sees what the winner committed.
        conflicts = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.UniqueViolation)
        return retrying(
            retry_on=lambda exc: isinstance(exc, conflicts),
            base=BACKOFF_BASE_S,
            cap=BACKOFF_CAP_S,
            deadline=time.monotonic() + LOCK_WAIT_SECONDS,
        )(self._attempt, fn)

    def _attempt(self, fn: Callable[[Cursor], T]) -> T:
        """One try of ``fn`` in a transaction; on any failure it is rolled back and raised."""
        conn = self._begin()
        try:
            result = fn(_PgCursor(conn))
            conn.execute("COMMIT")
        except BaseException:
            self._release(conn)
            raise
        self._checkin(conn)
        return result

    def _begin(self) -> Any:
        """A connection in a new transaction. A kept connection the server closed while idle fails
        at BEGIN, before anything ran: it is dropped and the next one (or a new one) takes over."""
        import psycopg

        while True:
            conn, kept = self._checkout()
            try:
                # SERIALIZABLE makes racing commits of one epoch fail over to a retry instead of
                # both succeeding; the retry then sees the committed state.
                conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                return conn
            except psycopg.OperationalError:
                conn.close()
                if not kept:
                    raise

    def _release(self, conn: Any) -> None:
        """Roll back whatever transaction ``conn`` is in and keep it; one that cannot is closed."""
        import psycopg
        from psycopg.pq import TransactionStatus

        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()
        self._checkin(conn)


class _PgCursor:
    """The meta store's cursor on PostgreSQL: its ``?`` parameters become ``$n`` and are bound by the
    server (a ``RawCursor`` sends the text as written, so a ``?`` or ``%`` in a literal stays)."""

    def __init__(self, conn: Any):
        import psycopg

        self._cur = psycopg.RawCursor(conn)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> "_PgCursor":
        from epochal.sql import numbered_placeholders

        self._cur.execute(numbered_placeholders(sql), list(params))
        return self

    def fetchall(self) -> list[tuple]:
        return self._cur.fetchall()

    def fetchone(self) -> tuple | None:
        return self._cur.fetchone()




def open_backend(url: str) -> Backend:
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresBackend(url)
    if url.startswith("duckdb:///"):
        return DuckDBBackend(Path(url[len("duckdb:///") :]))
    raise ConfigError(
        f"unsupported meta store URL '{redact_url(url)}': use duckdb:///path/to/meta.duckdb or postgresql://user@host/db"
    )


def _first_line(exc: BaseException, url: str) -> str:
    """The first line of a driver's error about ``url``, without any secret ``url`` holds."""
    lines = scrub(str(exc), url).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
