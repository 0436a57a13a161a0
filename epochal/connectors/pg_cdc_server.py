"""The PostgreSQL side of the postgres-cdc source: connecting, the load-time checks, the slot and
the publication, the consistent snapshot, peeking and advancing the slot. No Spark here.

Every connection runs with TimeZone UTC and DateStyle ISO, so that a value's text is the same
whether it comes from the snapshot (``column::text``) or from pgoutput (which formats values with
the output functions of the session that peeks).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.connectors.cdc_chunks import DEFAULT_CHUNK_ROWS, DEFAULT_EPOCH_ROWS
from epochal.connectors.pgoutput import lsn_int, lsn_text
from epochal.env_refs import resolved
from epochal.errors import EpochalError

if TYPE_CHECKING:
    import psycopg

#: libpq settings every connection gets: values print the same in the snapshot and in the WAL
_SESSION = "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=3 -c bytea_output=hex"
#: how long a read waits for the slot while another step of the pipeline peeks it
SLOT_BUSY_WAIT_S = 60.0
#: a publication Epochal created says so in its comment (so that a later cleanup drops only those)
CREATED_BY = "created by epochal for postgres-cdc"

#: upstream type (pg_type.typname) -> the declared types that hold its values exactly
TYPE_MAP: dict[str, tuple[str, ...]] = {
    "int2": ("SMALLINT", "INT", "BIGINT"),
    "int4": ("INT", "BIGINT"),
    "int8": ("BIGINT",),
    "float4": ("FLOAT", "DOUBLE"),
    "float8": ("DOUBLE",),
    "bool": ("BOOLEAN",),
    "text": ("STRING",),
    "varchar": ("STRING",),
    "bpchar": ("STRING",),
    "uuid": ("STRING",),
    "json": ("STRING",),
    "jsonb": ("STRING",),
    "bytea": ("STRING",),
    "date": ("DATE",),
    "timestamp": ("TIMESTAMP",),
    "timestamptz": ("TIMESTAMP",),
    # numeric: DECIMAL(p,s) of its own typmod, checked apart
}


@dataclass(frozen=True)
class ServerConfig:
    hostname: str
    port: int
    username: str
    #: as written: a ``${NAME}`` is read from the environment when connecting
    password: str
    database: str
    schema: str
    table: str
    slot: str
    publication: str
    #: about how many rows a chunk of the snapshot holds (``snapshot.chunk.rows``)
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    #: about how many snapshot rows an epoch applies (``snapshot.epoch.rows``)
    epoch_rows: int = DEFAULT_EPOCH_ROWS
    #: ``password`` is the password itself, read from the environment already (``resolved``)
    password_resolved: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def quoted(self) -> str:
        return f'"{self.schema}"."{self.table}"'

    def resolved(self) -> ServerConfig:
        """This config with the password read from the driver's environment: for Spark tasks,
        whose processes (on other machines, or forked before it was set) may not have it."""
        password = self.conninfo().get("password", "")
        return dataclasses.replace(self, password=str(password), password_resolved=True)

    def conninfo(self, **extra: str) -> dict[str, object]:
        password = self.password if self.password_resolved else resolved(self.password, "option password")
        info: dict[str, object] = dict(
            host=self.hostname,
            port=self.port,
            user=self.username,
            dbname=self.database,
            connect_timeout=5,
            application_name="epochal-postgres-cdc",
            options=_SESSION,
            **extra,
        )
        if password:
            info["password"] = password
        return info

    @property
    def where(self) -> str:
        return f"{self.username}@{self.hostname}:{self.port}/{self.database}"


def connect(config: ServerConfig, **extra: str) -> psycopg.Connection:
    """A connection (autocommit), or an error naming the server and why it cannot be reached."""
    import psycopg

    try:
        return psycopg.connect(autocommit=True, **config.conninfo(**extra))
    except psycopg.OperationalError as error:
        # the message names host/port and the cause; never the password (libpq does not echo it)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise EpochalError(
            f"cannot connect to PostgreSQL at {config.where}: {first}. Check that the server is up and "
            f"that hostname, port, username, password and database.name are right"
        ) from None


@dataclass(frozen=True)
class UpstreamColumn:
    name: str
    typname: str
    #: (precision, scale) for numeric(p,s), else None
    numeric: tuple[int, int] | None


def load_problems(config: ServerConfig, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> list[str]:
    """What keeps the table from being read, each naming the fix: the server, wal_level, the
    role's privileges, the table, its key and replica identity, the declared columns' types."""
    try:
        conn = connect(config)
    except EpochalError as error:
        return [str(error)]
    with conn:
        problems = []
        wal_level = conn.execute("SHOW wal_level").fetchone()[0]
        if wal_level != "logical":
            problems.append(
                f"the server's wal_level is '{wal_level}', and logical decoding needs 'logical': run ALTER "
                "SYSTEM SET wal_level = logical and restart PostgreSQL"
            )
        can = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (can and can[0]):
            problems.append(
                f"role {config.username} may not use replication slots: ALTER ROLE {config.username} REPLICATION "
                "(and GRANT SELECT on the table; creating the publication needs the table's owner)"
            )
        upstream = upstream_columns(conn, config)
        if upstream is None:
            problems.append(
                f"table {config.qualified} does not exist in database {config.database}: create it, "
                "or name it as schema.table in FROM source TABLE '...'"
            )
            return problems
        if not conn.execute("SELECT has_table_privilege(%s, 'SELECT')", [config.quoted]).fetchone()[0]:
            problems.append(
                f"role {config.username} may not read {config.qualified}: "
                f"GRANT SELECT ON {config.qualified} TO {config.username}"
            )
        problems += _key_problems(conn, config, key)
        by_name = {c.name: c for c in upstream}
        for name, declared in columns:
            column = by_name.get(name)
            if column is None:
                problems.append(
                    f"column '{name}' is not a column of {config.qualified} "
                    f"(it has {', '.join(by_name)}): remove it or add it upstream"
                )
                continue
            fits = (
                numeric_fits(column, declared)
                if column.typname == "numeric"
                else (declared in TYPE_MAP.get(column.typname, ()))
            )
            if not fits:
                problems.append(
                    f"column '{name}' is {declared}, but upstream it is {shown_type(column)}, which "
                    f"maps to {mapped_type(column)}: declare it as that"
                )
        return problems


def shown_type(column: UpstreamColumn) -> str:
    if column.numeric:
        return f"numeric({column.numeric[0]},{column.numeric[1]})"
    return column.typname


def mapped_type(column: UpstreamColumn) -> str:
    if column.typname == "numeric":
        if column.numeric is None:
            return "no type (numeric without a precision: give it one upstream, numeric(p,s))"
        return f"DECIMAL({column.numeric[0]},{column.numeric[1]})"
    types = TYPE_MAP.get(column.typname)
    if not types:
        return (
            "no type Epochal reads (supported: integers, numeric(p,s), real, double precision, text, "
            "varchar, char, boolean, date, timestamp, timestamptz, uuid, json, jsonb, bytea)"
        )
    return types[0]


def numeric_fits(column: UpstreamColumn, declared: str) -> bool:
    found = re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", declared.replace(" ", ""))
    if column.numeric is None or not found:
        return False
    precision, scale = int(found[1]), int(found[2])
    return scale == column.numeric[1] and precision >= column.numeric[0]


def upstream_columns(conn: psycopg.Connection, config: ServerConfig) -> list[UpstreamColumn] | None:
    """The table's columns in order, or None when there is no such table."""
    rows = conn.execute(
        "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [config.quoted],
    ).fetchall()
    if not rows:
        return None
    columns = []
    for name, typname, typmod in rows:
        numeric = None
        if typname == "numeric" and typmod >= 4:
            numeric = (((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF)
        columns.append(UpstreamColumn(name, typname, numeric))
    return columns


def _key_problems(conn: psycopg.Connection, config: ServerConfig, key: Sequence[str]) -> list[str]:
    (identity,) = conn.execute(
        "SELECT relreplident FROM pg_class WHERE oid = to_regclass(%s)", [config.quoted]
    ).fetchone()
    primary = [
        r[0]
        for r in conn.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
            [config.quoted],
        ).fetchall()
    ]
    problems = []
    if not primary:
        problems.append(
            f"upstream table {config.qualified} has no primary key, so its updates and deletes "
            f"cannot be matched to rows: ALTER TABLE {config.qualified} ADD PRIMARY KEY (...)"
        )
    elif sorted(primary) != sorted(key):
        problems.append(
            f"PRIMARY KEY ({', '.join(key)}) is not the upstream primary key of {config.qualified} "
            f"({', '.join(primary)}): declare PRIMARY KEY ({', '.join(primary)})"
        )
    if identity == "n" or (identity == "d" and not primary):
        problems.append(
            f"table {config.qualified}'s replica identity cannot deliver deletes: ALTER TABLE "
            f"{config.qualified} REPLICA IDENTITY DEFAULT (with a primary key) or REPLICA IDENTITY FULL"
        )
    return problems


# --- slot and publication ------------------------------------------------------------------------


def ensure_publication_and_slot(conn: psycopg.Connection, config: ServerConfig) -> None:
    """The publication covers the table and the slot exists: created on first use, the publication
    altered when a table is added. The publication first: a change is published only if the
    publication covered its table when it was written."""
    from psycopg import sql

    pub = sql.Identifier(config.publication)
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [config.publication]).fetchone()
    table = sql.Identifier(config.schema, config.table)
    if exists is None:
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(pub, table))
        conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(pub, sql.Literal(CREATED_BY)))
    elif (
        conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            [config.publication, config.schema, config.table],
        ).fetchone()
        is None
    ):
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, table))
    if slot_position(conn, config) is None:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [config.slot])


def slot_position(conn: psycopg.Connection, config: ServerConfig) -> int | None:
    """The slot's confirmed LSN, None when there is no such slot."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, plugin, database FROM pg_replication_slots WHERE slot_name = %s",
        [config.slot],
    ).fetchone()
    if row is None:
        return None
    if row[1] != "pgoutput" or row[2] != config.database:
        raise EpochalError(
            f"replication slot {config.slot} exists for plugin {row[1]} in database {row[2]}: "
            f"name another slot.name (this source needs a pgoutput slot in {config.database})"
        )
    return lsn_int(row[0])


def current_lsn(conn: psycopg.Connection) -> int:
    return lsn_int(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def peek(config: ServerConfig, end: int, start: int) -> list[bytes]:
    """The slot's pgoutput messages of the transactions committed before ``end``, in commit order;
    never consumes them (the same call returns the same messages until the slot is advanced). An
    error when the slot was advanced past ``start``: the changes after ``start`` are no longer all
    there, and reading fewer than the plan saw would lose them silently."""
    import psycopg

    deadline = time.monotonic() + SLOT_BUSY_WAIT_S
    while True:
        with connect(config) as conn:
            position = slot_position(conn, config)
            if position is None:
                raise EpochalError(
                    f"replication slot {config.slot} is gone, so the changes it retained are lost: "
                    "drop the table from the pipeline and add it again to read a new snapshot"
                )
            if position > start:
                raise EpochalError(
                    f"replication slot {config.slot} was advanced to {lsn_text(position)}, past this epoch's start "
                    f"{lsn_text(start)}: another process consumed the changes the epoch needs; drop the table from "
                    "the pipeline and add it again to read a new snapshot, and let no other client use the slot"
                )
            try:
                rows = conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                    "'proto_version', '1', 'publication_names', %s)",
                    [config.slot, lsn_text(end), config.publication],
                ).fetchall()
                return [bytes(r[0]) for r in rows]
            except psycopg.errors.ObjectInUse as error:
                if time.monotonic() >= deadline:
                    raise EpochalError(
                        f"replication slot {config.slot} is held by another process ({error}): stop the "
                        "process that uses it, or name another slot.name"
                    ) from None
        time.sleep(0.2)


def advance(config: ServerConfig, to: int) -> None:
    """Moves the slot's confirmed position to ``to`` (never back): the server may then drop the WAL
    before it. Skipped, for the next commit to do, while another process holds the slot."""
    import psycopg

    with connect(config) as conn:
        position = slot_position(conn, config)
        if position is None or position >= to:
            return
        try:
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [config.slot, lsn_text(to)])
        except psycopg.errors.ObjectInUse:
            pass


def retire_table(config: ServerConfig, last_of_slot: bool) -> None:
    """The table left the pipeline: out of the publication; and when no table of the pipeline uses
    the slot any more, the slot is dropped (a slot left behind makes the server keep WAL), with
    the publication when Epochal created it (its comment says so)."""
    from psycopg import sql

    pub = sql.Identifier(config.publication)
    with connect(config) as conn:
        if last_of_slot:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                [config.slot],
            )
        mine = conn.execute(
            "SELECT obj_description(oid, 'pg_publication') = %s FROM pg_publication WHERE pubname = %s",
            [CREATED_BY, config.publication],
        ).fetchone()
        if mine and mine[0] and last_of_slot:
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(pub))
        elif (
            mine is not None
            and conn.execute(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
                [config.publication, config.schema, config.table],
            ).fetchone()
        ):
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, sql.Identifier(config.schema, config.table))
            )


@contextmanager
def exported_snapshot(config: ServerConfig) -> Iterator[tuple[int, str]]:
    """A snapshot exported exactly at one LSN, and that LSN: a temporary slot's consistent point. A
    change whose transaction commits before it is seen in the snapshot; one that commits at or after
    it is not. Yields (lsn, snapshot id); any connection may ``SET TRANSACTION SNAPSHOT`` to it
    (``snapshot_transaction``) until the context ends."""
    with connect(config, replication="database") as replication:
        name = f"epochal_snap_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        result = replication.pgconn.exec_(
            f"CREATE_REPLICATION_SLOT {name} TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')".encode()
        )
        if result.status != 2:  # PGRES_TUPLES_OK
            raise EpochalError(
                f"cannot take a snapshot of {config.qualified}: {result.error_message.decode(errors='replace').strip()}"
            )
        yield lsn_int(result.get_value(0, 1).decode()), result.get_value(0, 2).decode()


@contextmanager
def snapshot_transaction(config: ServerConfig, snapshot: str) -> Iterator[psycopg.Connection]:
    """A connection in a REPEATABLE READ transaction that sees exactly the exported ``snapshot``."""
    from psycopg import IsolationLevel, sql

    with connect(config) as conn:
        conn.autocommit = False
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            yield conn


def server_positions(config: ServerConfig) -> Mapping[str, object]:
    """The slot's confirmed LSN, the server's current LSN, the WAL the slot retains (bytes)."""
    with connect(config) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
            [config.slot],
        ).fetchone()
    if row is None:
        return {}
    return {"slot_confirmed_lsn": row[0], "server_lsn": row[1], "slot_retained_wal_bytes": int(row[2] or 0)}
