"""The PostgreSQL sink: delivers a sink's batches into a PostgreSQL table exactly once, with
two-phase commit (``PREPARE TRANSACTION``) coordinated by :mod:`epochal.checkpoint.sinks.coordinator`.

Each writer task (a Spark task, on an executor) opens its own connection, loads its rows with
``COPY`` and ends its transaction with ``PREPARE TRANSACTION '<gid>'``: the rows are durable on the
server (they survive a crash of the writer, of the driver, and of PostgreSQL itself) but nobody sees
them. The driver then runs ``COMMIT PREPARED`` for every writer's gid. A gid that is no longer in
``pg_prepared_xacts`` was committed already (only the abort paths roll back, and they never touch a
PENDING batch), so commit is idempotent; what proves the batch is in is the *progress rows* each
writer inserts in its own prepared transaction (``<schema>._epochal_sink_progress``): they become
visible exactly when that writer's rows do.

Transaction ids (gids) read ``epochal:<sink>:<schema>.<table>:<batch token>:w<writer>:<random>``.
The batch token holds the epochs, the attempt and the run's nonce; the random tail keeps a retried
Spark task from colliding with an earlier attempt's gid. Everything is matched by prefix in the
sink's database, so one sink's recovery never touches another sink's (or another table's) prepared
transactions.

Types, the check of an existing table and the COPY encoding: :mod:`epochal.sinks.postgres_schema`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from epochal.faults import fault_point
from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkDataError,
    SinkError,
    SinkSchemaError,
    SinkTarget,
    WriterTask,
    deletes_refused,
    null_key_refused,
)
from epochal.sinks.postgres_schema import check_existing, copy_csv, existing_columns, postgres_type
from epochal.sinks.spec import postgres_name_problems, primary_key_columns, writer_count

PROGRESS_TABLE = "_epochal_sink_progress"
DEFAULT_PORT = 5432
CONNECT_TIMEOUT_S = 10
#: A writer waiting longer than this for a lock fails instead of hanging: the usual holder is a
#: prepared transaction nobody will commit (a run killed before it persisted PENDING), which only
#: the coordinator's recovery (abort_orphans) or ROLLBACK PREPARED releases.
LOCK_TIMEOUT = "120s"
#: Batches of progress rows kept per sink and table; older ones are pruned after each commit.
PROGRESS_KEPT_BATCHES = 100
#: PostgreSQL's limit on a gid (GIDSIZE - 1 bytes).
GID_MAX_BYTES = 199

def max_prepared_transactions_message(sink: str, host: str, port: int) -> str:
    return (
        f"sink {sink}: PostgreSQL at {host}:{port} has max_prepared_transactions = 0, so it cannot take part in "
        "two-phase commit: set max_prepared_transactions (e.g. 64) in postgresql.conf or ALTER SYSTEM SET "
        "max_prepared_transactions = 64, then restart the server"
    )


class _Secret:
    """A password that never prints: the target is pickled to executors, logged and shown in
    tracebacks, and none of that may carry it."""

    __slots__ = ("value",)

    def __init__(self, value: str | None):
        self.value = value

    def __repr__(self) -> str:
        return "***" if self.value else "None"

    __str__ = __repr__


class PostgresTarget(SinkTarget):
    """A PostgreSQL table a sink delivers into with prepared transactions. Built from the sink's
    options (``${ENV}`` values already resolved); holds names only, no connection, so it pickles to
    the executors."""

    def __init__(
        self, name: str, options: Mapping[str, str], columns: Sequence[str], home: Path | None, meta_url: str | None
    ):
        self.name = name
        self.columns = list(columns)
        self.type = options.get("type", "append-only")
        self.primary_key = primary_key_columns(options, self.columns) if self.type == "upsert" else ()
        self.host = options.get("host", "localhost")
        raw_port = str(options.get("port", DEFAULT_PORT)).strip()
        if not raw_port.isdigit() or not 1 <= int(raw_port) <= 65535:
            raise SinkConfigError(f"sink {name}: option port must be a TCP port number (1..65535), got '{raw_port}'")
        self.port = int(raw_port)
        self.user = options.get("user", "postgres")
        self._password = _Secret(options.get("password") or None)
        self.database = options.get("database", "postgres")
        self.schema = options.get("schema", "public")
        self.table = options["table"] if "table" in options else name
        self.writers = writer_count(options)
        # the loader checked the literal names; a ${ENV} one is known only now
        long_names = postgres_name_problems(name, options, self.columns)
        if long_names:
            raise SinkConfigError(f"sink {name}: {'; '.join(long_names)}")
        target_tag = f"{self.schema}.{self.table}"
        prefix = f"epochal:{name}:{target_tag}:"
        if len(prefix.encode()) > 120:  # leave room for the token, writer and random tail
            prefix = f"epochal:{hashlib.sha1(prefix.encode()).hexdigest()[:20]}:"
        #: every gid of this sink (and table) starts with this
        self.gid_prefix = prefix

    # ------------------------------------------------------------------ names

    def describe(self) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{self.database}/{self.schema}.{self.table}"

    def __repr__(self) -> str:
        return f"PostgresTarget({self.name!r}, {self.describe()!r}, type={self.type!r})"

    def batch_prefix(self, batch: BatchId) -> str:
        return f"{self.gid_prefix}{batch.token}:"

    def _writer_prefix(self, task: WriterTask) -> str:
        return f"{self.batch_prefix(task.batch)}w{task.writer}:"

    def _table(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.table))

    def _progress_table(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(PROGRESS_TABLE))

    def _scrub(self, text: str) -> str:
        """``text`` without the password, should a server or driver message ever echo it."""
        password = self._password.value
        return text.replace(password, "***") if password else text

    # ------------------------------------------------------------------ connections

    def _connect(self, context: str) -> psycopg.Connection:
        """An autocommit connection (transactions are begun explicitly, so that they can end in
        PREPARE TRANSACTION); connection failures become errors that say what to fix."""
        where = f"{self.host}:{self.port}"
        try:
            return psycopg.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self._password.value,
                dbname=self.database,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=f"epochal sink {self.name}"[:63],
                autocommit=True,
            )
        except psycopg.OperationalError as exc:
            cause = self._scrub(" ".join(str(exc).split()))
            lowered = cause.lower()
            if "password authentication failed" in lowered or "no password supplied" in lowered:
                raise SinkConfigError(
                    f"{context}: PostgreSQL at {where} refused the password of user {self.user} "
                    f"(database {self.database}): check the sink's password option, usually "
                    "password = '${PG_PASSWORD}': export the right password in that environment variable "
                    "where Epochal runs"
                ) from None
            if "does not exist" in lowered and "database" in lowered:
                raise SinkConfigError(
                    f"{context}: PostgreSQL at {where} has no database {self.database}: create it "
                    f"(CREATE DATABASE {self.database}) or fix the sink's database option"
                ) from None
            if "does not exist" in lowered and "role" in lowered:
                raise SinkConfigError(
                    f"{context}: PostgreSQL at {where} has no user {self.user}: create it (CREATE ROLE "
                    f"{self.user} LOGIN PASSWORD '...') or fix the sink's user option"
                ) from None
            raise SinkError(
                f"{context}: cannot connect to PostgreSQL at {where} as {self.user} ({cause}): is the server "
                "running, and does it accept TCP connections there? Check the sink's host and port options"
            ) from None
        except psycopg.Error as exc:
            # any other refusal (an option psycopg cannot pass on): its text is scrubbed, its cause dropped
            raise SinkConfigError(
                f"{context}: psycopg refused the connection options for PostgreSQL at {where} "
                f"({type(exc).__name__}: {self._scrub(' '.join(str(exc).split()))}): check the sink's host, "
                "port, user, database and password options"
            ) from None

    def _prepared(self, conn: psycopg.Connection, prefix: str) -> list[str]:
        """gids of this database's prepared transactions that start with ``prefix``, oldest first."""
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s) "
            "ORDER BY prepared",
            [prefix],
        ).fetchall()
        return [r[0] for r in rows]

    def _rollback_prepared(self, conn: psycopg.Connection, gids: Sequence[str]) -> int:
        done = 0
        for gid in gids:
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                done += 1
            except psycopg.errors.UndefinedObject:
                pass  # finished by someone else meanwhile
        return done

    # ------------------------------------------------------------------ schema

    def prepare_target(self, schema: pa.Schema) -> None:
        context = f"sink {self.name}"
        names = self.columns or [n for n in schema.names if n != WEIGHT]
        expected: dict[str, str] = {}
        problems = [
            f"column {c} is not in the upstream schema ({', '.join(schema.names)})"
            for c in names
            if c not in schema.names
        ]
        problems += [f"primary_key column {k} is not a sink column" for k in self.primary_key if k not in names]
        for name in names:
            if name not in schema.names:
                continue
            try:
                expected[name] = postgres_type(schema.field(name))
            except SinkSchemaError as exc:
                problems.append(str(exc))
        if problems:
            raise SinkSchemaError(f"{context}: cannot create {self.describe()}: {'; '.join(problems)}")
        with self._connect(context) as conn:
            self._check_prepared_transactions(conn)
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (sink text NOT NULL, target text NOT NULL, "
                    "first_epoch bigint NOT NULL, last_epoch bigint NOT NULL, token text NOT NULL, "
                    "writer integer NOT NULL, writers integer NOT NULL, rows bigint NOT NULL, gid text NOT NULL, "
                    # now() in a prepared transaction is when the writer began, not when it committed
                    "prepared_at timestamptz NOT NULL DEFAULT now(), "
                    "PRIMARY KEY (sink, target, first_epoch, last_epoch, writer))"
                ).format(self._progress_table())
            )
            found = existing_columns(self, conn)
            if found is None:
                columns = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in expected.items()]
                if self.type == "upsert":
                    columns.append(
                        sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.primary_key)))
                    )
                conn.execute(sql.SQL("CREATE TABLE {} ({})").format(self._table(), sql.SQL(", ").join(columns)))
                return
            check_existing(self, conn, found[0], found[1], expected)

    def _check_prepared_transactions(self, conn: psycopg.Connection) -> None:
        """Fail on the driver, before any writer runs, when the server cannot PREPARE."""
        slots = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
        if slots == 0:
            raise SinkConfigError(max_prepared_transactions_message(self.name, self.host, self.port))
        if slots < self.writers:
            raise SinkConfigError(
                f"sink {self.name}: PostgreSQL at {self.host}:{self.port} has max_prepared_transactions = {slots}, "
                f"fewer than the sink's {self.writers} writers, which each hold one while a batch commits: raise "
                f"it (ALTER SYSTEM SET max_prepared_transactions = {max(64, self.writers * 2)}, then restart the "
                f"server) or lower the sink's writers option"
            )

    # ------------------------------------------------------------------ pre-commit (executors)

    def write(self, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> Mapping[str, Any]:
        batch = task.batch
        gid = f"{self._writer_prefix(task)}{secrets.token_hex(3)}"
        if len(gid.encode()) > GID_MAX_BYTES:
            raise SinkConfigError(f"{batch.describe()}: transaction id {gid!r} is longer than PostgreSQL's 199 bytes")
        with self._connect(batch.describe()) as conn:
            # A Spark task retry: the earlier attempt's result was never taken, and its prepared
            # transaction would hold locks on the very rows this attempt writes (waiting forever).
            self._rollback_prepared(conn, self._prepared(conn, self._writer_prefix(task)))
            try:
                conn.execute("BEGIN")
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
                conn.execute("SET LOCAL TimeZone = 'UTC'")  # timestamptz values are sent as UTC text
                self._check_not_delivered(conn, batch)
                if self.type == "upsert":
                    rows = self._write_upsert(conn, task, batches, gid)
                else:
                    rows = self._write_append(conn, task, batches)
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (sink, target, first_epoch, last_epoch, token, writer, writers, rows, gid) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    ).format(self._progress_table()),
                    [
                        self.name,
                        self.table,
                        batch.first_epoch,
                        batch.last_epoch,
                        batch.token,
                        task.writer,
                        task.writers,
                        rows,
                        gid,
                    ],
                )
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            except SinkError:
                self._rollback_open(conn)
                raise
            except psycopg.Error as exc:
                self._rollback_open(conn)
                raise self._write_error(task, exc) from None
            except (KeyError, pa.ArrowException) as exc:  # a column missing from the rows, an unconvertible value
                self._rollback_open(conn)
                raise SinkError(
                    f"{batch.describe()}, writer {task.writer}: the rows do not fit {self.schema}.{self.table} "
                    f"(sink columns: {', '.join(self.columns)}): {exc}"
                ) from exc
        return {"gid": gid, "rows": rows, "writer": task.writer, "writers": task.writers}

    @staticmethod
    def _rollback_open(conn: psycopg.Connection) -> None:
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # closing the connection rolls back too

    def _write_error(self, task: WriterTask, exc: psycopg.Error) -> SinkError:
        diag = exc.diag
        message = self._scrub(diag.message_primary or str(exc).strip())
        detail = f" ({self._scrub(diag.message_detail).rstrip('.')})" if diag.message_detail else ""
        where = f"{task.batch.describe()}, writer {task.writer}"
        if isinstance(exc, psycopg.errors.ObjectNotInPrerequisiteState) and "prepared transactions" in message:
            return SinkConfigError(max_prepared_transactions_message(self.name, self.host, self.port))
        if "maximum number of prepared transactions reached" in message:
            return SinkConfigError(
                f"{where}: PostgreSQL at {self.host}:{self.port} has no free prepared transaction "
                "(max_prepared_transactions are all in use): raise max_prepared_transactions and restart the "
                "server, or look for prepared transactions nobody commits (SELECT gid FROM pg_prepared_xacts)"
            )
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return SinkError(
                f"{where}: waited {LOCK_TIMEOUT} for a lock on {self.schema}.{self.table}, usually held by a "
                "prepared transaction of a killed run; the sink's recovery rolls those back (or ROLLBACK PREPARED "
                f"the gids starting with {self.gid_prefix!r} in pg_prepared_xacts), then the batch is retried"
            )
        if isinstance(exc, psycopg.errors.UndefinedTable):
            return SinkError(
                f"{where}: {message}: the target table or {PROGRESS_TABLE} is missing; prepare_target creates "
                "them before the writers run"
            )
        keys = {k.lower() for k in self.primary_key}
        if isinstance(exc, psycopg.errors.NotNullViolation) and (diag.column_name or "").lower() in keys:
            # (named as the DuckDB sink names it: PostgreSQL names the writer's staging table)
            return null_key_refused(where, self.primary_key, f"{self.schema}.{self.table}")
        state = exc.sqlstate or ""
        if state.startswith(("22", "23")):  # data exception, integrity constraint violation
            fix = "fix the table's constraint or the view's rows, then the next run delivers the batch again"
            if state == "22021" and "0x00" in message:  # text and jsonb cannot hold NUL
                fix = (
                    "PostgreSQL text cannot hold the NUL character: strip it in the view, e.g. "
                    "replace(col, char(0), ''); "
                    "epochs committed before the fix still hold it, so once the view has switched to the fixed "
                    "statement (epochal status), give the sink a new name: it starts from the view's rows"
                )
            return SinkDataError(
                f"{where}: PostgreSQL refused the rows for {self.schema}.{self.table}: {message}{detail}. The "
                f"writer's transaction was rolled back, so nothing of the batch is visible; {fix}"
            )
        return SinkError(f"{where}: PostgreSQL failed: {message}{detail}")

    def _check_not_delivered(self, conn: psycopg.Connection, batch: BatchId) -> None:
        """The target's own record: never write epochs it already holds (a meta store restored
        from a backup, two pipelines sharing a sink name), since append-only rows would double."""
        done = conn.execute(
            sql.SQL("SELECT max(last_epoch) FROM {} WHERE sink = %s AND target = %s").format(self._progress_table()),
            [self.name, self.table],
        ).fetchone()[0]
        if done is not None and done >= batch.first_epoch:
            raise SinkError(
                f"{batch.describe()}: table {self.schema}.{self.table} already holds this sink's epochs up to {done} "
                f"(its rows in {self.schema}.{PROGRESS_TABLE}), so writing epochs from {batch.first_epoch} would "
                "deliver some twice: the meta store and the target disagree. If the target was reset on purpose, "
                f"delete the sink's rows from {self.schema}.{PROGRESS_TABLE} too"
            )

    def _columns_sql(self) -> sql.Composable:
        return sql.SQL(", ").join(map(sql.Identifier, self.columns))

    def _write_append(self, conn: psycopg.Connection, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> int:
        rows = 0
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(self._table(), self._columns_sql())
        with conn.cursor().copy(copy_sql) as copy:
            for record_batch in batches:
                if record_batch.num_rows == 0:
                    continue
                weights = record_batch.column(WEIGHT)
                if pc.min(weights).as_py() < 0:
                    negative = pc.sum(pc.less(weights, 0)).as_py()
                    raise deletes_refused(task.batch.describe(), negative)
                if pc.max(weights).as_py() > 1:  # weight n: n copies of the row
                    repeats = np.repeat(np.arange(record_batch.num_rows), weights.to_numpy(zero_copy_only=False))
                    record_batch = record_batch.take(pa.array(repeats))
                copy.write(copy_csv(record_batch, self.columns))
                rows += record_batch.num_rows
        return rows

    def _write_upsert(
        self, conn: psycopg.Connection, task: WriterTask, batches: Iterator[pa.RecordBatch], gid: str
    ) -> int:
        # COPY cannot upsert, and a TEMP table cannot be used in a prepared transaction, so the rows go
        # through an UNLOGGED staging table created and dropped inside this transaction: nobody else
        # ever sees it, and it leaves no WAL for rows that are only copied on.
        stage = sql.Identifier(f"_epochal_stage_w{task.writer}_{gid.rsplit(':', 1)[-1]}")
        staged = sql.SQL("{}.{}").format(sql.Identifier(self.schema), stage)
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(staged, self._table()))
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint NOT NULL").format(staged, sql.Identifier(WEIGHT)))
        rows = 0
        columns = [*self.columns, WEIGHT]
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            staged, sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        with conn.cursor().copy(copy_sql) as copy:
            for record_batch in batches:
                if record_batch.num_rows:
                    copy.write(copy_csv(record_batch, columns))
                    rows += record_batch.num_rows
        if rows:
            self._apply_upsert(conn, task, staged)
        conn.execute(sql.SQL("DROP TABLE {}").format(staged))
        return rows

    def _apply_upsert(self, conn: psycopg.Connection, task: WriterTask, staged: sql.Composable) -> None:
        keys = sql.SQL(", ").join(map(sql.Identifier, self.primary_key))
        weight = sql.Identifier(WEIGHT)
        conn.execute(sql.SQL("ANALYZE {}").format(staged))
        # The loader proved the key unique in the view, so a key has at most one row to write. More
        # would be an Epochal bug; ON CONFLICT would fail on it anyway, less clearly.
        clashes = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM (SELECT 1 FROM {s} WHERE {w} > 0 GROUP BY {k} "
                "HAVING count(*) > 1 OR sum({w}) > 1) c"
            ).format(s=staged, w=weight, k=keys)
        ).fetchone()[0]
        if clashes:
            raise SinkError(
                f"{task.batch.describe()}: {clashes} key(s) of ({', '.join(self.primary_key)}) have more than one row "
                "in this batch although the key was proven unique at load: this is a bug in Epochal, please report it"
            )
        match = sql.SQL(" AND ").join(sql.SQL("t.{c} = d.{c}").format(c=sql.Identifier(k)) for k in self.primary_key)
        conn.execute(
            sql.SQL("DELETE FROM {t} AS t USING (SELECT DISTINCT {k} FROM {s} WHERE {w} < 0) AS d WHERE {m}").format(
                t=self._table(), k=keys, s=staged, w=weight, m=match
            )
        )
        others = [c for c in self.columns if c not in self.primary_key]
        if others:
            on_conflict = sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others)
            )
        else:
            on_conflict = sql.SQL("DO NOTHING")
        conn.execute(
            sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM {s} WHERE {w} > 0 ON CONFLICT ({k}) {o}").format(
                t=self._table(), c=self._columns_sql(), s=staged, w=weight, k=keys, o=on_conflict
            )
        )

    # ------------------------------------------------------------------ commit / abort (driver)

    def _batch_gids(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]], *, every: bool = True) -> list[str]:
        """The gids in ``metadata``, each checked to be this batch's. ``every``: each entry must have
        one (commit); abort also takes what failed writers left (entries without a gid)."""
        prefix = self.batch_prefix(batch)
        gids = [str(m.get("gid") or "") for m in metadata if every or m.get("gid")]
        wrong = [g for g in gids if not g.startswith(prefix)]
        if wrong:
            raise SinkError(
                f"{batch.describe()}: writer metadata names transaction(s) {wrong} that are not this batch's "
                f"(they should start with {prefix!r}): refusing to commit or roll back another batch's rows; "
                "this is a bug in Epochal, please report it"
            )
        return gids

    def commit(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        gids = self._batch_gids(batch, metadata)
        with self._connect(batch.describe()) as conn:
            pending = set(self._prepared(conn, self.batch_prefix(batch)))
            committed_now = 0
            for gid in gids:
                if gid not in pending:
                    continue  # committed by an earlier call; verified below
                try:
                    conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                except psycopg.errors.UndefinedObject:
                    continue  # committed by a concurrent call meanwhile; verified below
                except psycopg.Error as exc:
                    raise SinkError(
                        f"{batch.describe()}: COMMIT PREPARED of {gid} failed on PostgreSQL at "
                        f"{self.host}:{self.port}: "
                        f"{self._scrub(str(exc).strip())}; the batch stays PENDING and its commit is retried"
                    ) from None
                committed_now += 1
                if committed_now == 1:
                    fault_point("sink-commit-midway")
            self._verify_committed(conn, batch, metadata)
            self._prune_progress(conn)

    def _verify_committed(
        self, conn: psycopg.Connection, batch: BatchId, metadata: Sequence[Mapping[str, Any]]
    ) -> None:
        """Every writer's progress row is visible exactly when its rows are: the proof the batch is in."""
        visible = {
            r[0]
            for r in conn.execute(
                sql.SQL(
                    "SELECT writer FROM {} WHERE sink = %s AND target = %s AND first_epoch = %s AND last_epoch = %s "
                    "AND token = %s"
                ).format(self._progress_table()),
                [self.name, self.table, batch.first_epoch, batch.last_epoch, batch.token],
            ).fetchall()
        }
        expected = {int(m["writer"]) for m in metadata} if all("writer" in m for m in metadata) else None
        writers = {int(m["writers"]) for m in metadata if "writers" in m}
        if expected is None or len(writers) != 1 or len(expected) != writers.pop():
            raise SinkError(
                f"{batch.describe()}: the writers' metadata does not name one gid per writer ({list(metadata)}): "
                "this is a bug in Epochal, please report it"
            )
        missing = sorted(expected - visible)
        if not missing:
            return
        if not visible:
            raise PrecommitLost(
                f"{batch.describe()}: the writers' prepared transactions are gone from PostgreSQL at "
                f"{self.host}:{self.port} and none of them committed (rolled back by hand or by another run), so "
                f"{self.schema}.{self.table} holds nothing of this batch: it is aborted and delivered again"
            )
        raise SinkError(
            f"{batch.describe()}: {self.schema}.{self.table} holds the rows of writer(s) {sorted(visible)} but the "
            f"prepared transactions of writer(s) {missing} were rolled back before they committed (ROLLBACK "
            "PREPARED outside Epochal?), so the target holds only part of the batch. Epochal cannot repair that "
            f"without delivering some rows twice: rebuild the table (truncate it, delete the sink's rows from "
            f"{self.schema}.{PROGRESS_TABLE}) and deliver the sink from the start"
        )

    def _prune_progress(self, conn: psycopg.Connection) -> None:
        conn.execute(
            sql.SQL(
                "DELETE FROM {p} WHERE sink = %s AND target = %s AND last_epoch < (SELECT min(last_epoch) FROM "
                "(SELECT DISTINCT last_epoch FROM {p} WHERE sink = %s AND target = %s "
                "ORDER BY last_epoch DESC LIMIT %s) kept)"
            ).format(p=self._progress_table()),
            [self.name, self.table, self.name, self.table, PROGRESS_KEPT_BATCHES],
        )

    def abort(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        listed = self._batch_gids(batch, metadata, every=False)
        with self._connect(batch.describe()) as conn:
            prepared = self._prepared(conn, self.batch_prefix(batch))
            # listed ones first, then any other of the batch (a writer whose result never came back)
            ordered = [g for g in listed if g in prepared] + [g for g in prepared if g not in listed]
            self._rollback_prepared(conn, ordered)

    def abort_orphans(self, keep: Sequence[BatchId]) -> int:
        kept = tuple(self.batch_prefix(b) for b in keep)
        with self._connect(f"sink {self.name}") as conn:
            orphans = [g for g in self._prepared(conn, self.gid_prefix) if not g.startswith(kept)]
            return self._rollback_prepared(conn, orphans)

    # ------------------------------------------------------------------ reading the target

    def delivered_epoch(self) -> int | None:
        with self._connect(f"sink {self.name}") as conn:
            if conn.execute("SELECT to_regclass(%s)", [self._progress_table().as_string(conn)]).fetchone()[0] is None:
                return None
            # a batch counts once every one of its writers' rows is visible (a commit killed midway
            # leaves some writers committed and the others prepared)
            return conn.execute(
                sql.SQL(
                    "SELECT max(last_epoch) FROM (SELECT last_epoch FROM {} WHERE sink = %s AND target = %s "
                    "GROUP BY first_epoch, last_epoch, token HAVING count(*) = max(writers)) done"
                ).format(self._progress_table()),
                [self.name, self.table],
            ).fetchone()[0]

    def row_count(self) -> int:
        with self._connect(f"sink {self.name}") as conn:
            if conn.execute("SELECT to_regclass(%s)", [self._table().as_string(conn)]).fetchone()[0] is None:
                return 0
            return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._table())).fetchone()[0]
