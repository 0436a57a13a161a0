"""The MySQL/MariaDB side of the mysql-cdc source: connecting, the load-time checks, the server's
binlog position, the consistent snapshot and reading a bounded binlog range (mysql-replication).
No Spark here. Every session runs with time_zone '+00:00', so that a TIMESTAMP's value is the
same from the snapshot as from the binlog (which holds it as seconds since the epoch)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.connectors.mysql_cdc_types import (
    RowChange,
    UpstreamColumn,
    bytes_between,
    file_named,
    pack,
    privilege_problems,
    shown,
    type_problem,
    unpack,
)
from epochal.env_refs import resolved
from epochal.errors import EpochalError

if TYPE_CHECKING:
    import pymysql


#: the server's error number for a table that does not exist (ER_NO_SUCH_TABLE)
_NO_SUCH_TABLE = 1146


@dataclass(frozen=True)
class ServerConfig:
    hostname: str
    port: int
    username: str
    #: as written: a ``${NAME}`` is read from the environment when connecting; '' for none
    password: str
    database: str
    table: str
    server_id: int

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def quoted(self) -> str:
        return f"`{self.database.replace('`', '``')}`.`{self.table.replace('`', '``')}`"

    @property
    def where(self) -> str:
        return f"{self.username}@{self.hostname}:{self.port}"

    @property
    def reader_id(self) -> int:
        """The replica id the binlog is read under: server.id plus a per-table part, so that the
        tables of one source, read at once, do not take each other's place (a server keeps one
        binlog reader per id)."""
        return self.server_id + zlib.crc32(self.qualified.encode()) % 1000

    def settings(self) -> dict[str, object]:
        password = resolved(self.password.strip(), "option password")
        return {
            "host": self.hostname,
            "port": self.port,
            "user": self.username,
            "password": password,
            "connect_timeout": 5,
            "init_command": "SET time_zone = '+00:00'",
        }


def connect(config: ServerConfig) -> pymysql.Connection:
    """A connection (autocommit), or an error naming the server and why it cannot be reached."""
    import pymysql

    try:
        return pymysql.connect(**config.settings(), autocommit=True, charset="utf8mb4")
    except pymysql.err.OperationalError as error:
        raise EpochalError(
            f"cannot connect to MySQL/MariaDB at {config.where}: {error.args[-1]}. Check that the server is up "
            "and that hostname, port, username and password are right"
        ) from None


def _query(conn: pymysql.Connection, sql: str, args: Sequence[object] = ()) -> list[tuple]:
    with conn.cursor() as cursor:
        cursor.execute(sql, args or None)
        return list(cursor.fetchall())


def upstream_columns(conn: pymysql.Connection, config: ServerConfig) -> list[UpstreamColumn] | None:
    rows = _query(
        conn,
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        [config.database, config.table],
    )
    return [UpstreamColumn(*r) for r in rows] or None


def load_problems(config: ServerConfig, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> list[str]:
    """What keeps the table from being read, each naming the fix: the server, its binlog settings,
    the user's privileges, the table, its key, the declared columns' types."""
    import pymysql

    try:
        conn = connect(config)
    except EpochalError as error:
        return [str(error)]
    with conn:
        problems = []
        version, log_bin, row_format, row_image, own_id = _query(
            conn, "SELECT VERSION(), @@log_bin, @@binlog_format, @@binlog_row_image, @@server_id"
        )[0]
        metadata = dict(_query(conn, "SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")).get("binlog_row_metadata")
        if "mariadb" not in version.lower():
            problems.append(
                f"the server is MySQL {version}: mysql-cdc takes its snapshot at MariaDB's binlog_snapshot_position "
                "(no lock); on MySQL that needs FLUSH TABLES WITH READ LOCK, which Epochal does not take yet: "
                "read MariaDB, or export the table"
            )
        fix = "; set it under [mysqld] in the server's configuration and restart the server"
        if not log_bin:
            problems.append(f"the server's log_bin is OFF, so there is no binlog to read: add log_bin = mysql-bin{fix}")
        if str(row_format).upper() != "ROW":
            problems.append(
                f"the server's binlog_format is {row_format}, and mysql-cdc reads ROW: binlog_format = ROW{fix}"
            )
        if str(row_image).upper() != "FULL":
            problems.append(
                f"the server's binlog_row_image is {row_image}, and mysql-cdc needs whole rows: "
                f"binlog_row_image = FULL{fix}"
            )
        if metadata is not None and str(metadata).upper() != "FULL":
            problems.append(
                f"the server's binlog_row_metadata is {metadata}, and mysql-cdc reads each row's column names "
                f"from the binlog: binlog_row_metadata = FULL{fix} (or SET GLOBAL binlog_row_metadata = FULL)"
            )
        if config.reader_id == own_id:
            problems.append(f"server.id {config.server_id} makes the reader's id the server's own: choose another")
        user = _query(conn, "SELECT CURRENT_USER()")[0][0]
        quoted_user = "'{}'@'{}'".format(*user.split("@", 1))
        problems += privilege_problems([r[0] for r in _query(conn, "SHOW GRANTS")], quoted_user)
        try:  # information_schema shows only what the user may see: ask the table itself first
            _query(conn, f"SELECT 1 FROM {config.quoted} LIMIT 0")
        except pymysql.err.MySQLError as error:
            if error.args[0] == _NO_SUCH_TABLE:
                problems.append(
                    f"table {config.qualified} does not exist: create it, or name it as database.table in "
                    "FROM source TABLE '...'"
                )
            else:
                problems.append(
                    f"user {quoted_user} may not read {config.qualified} ({error.args[-1]}): "
                    f"GRANT SELECT ON {config.qualified} TO {quoted_user}"
                )
            return problems
        upstream = upstream_columns(conn, config) or []
        primary = [
            r[0]
            for r in _query(
                conn,
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
                [config.database, config.table],
            )
        ]
        if not primary:
            problems.append(
                f"upstream table {config.qualified} has no primary key, so its updates and deletes cannot be "
                f"matched to rows: ALTER TABLE {config.qualified} ADD PRIMARY KEY (...)"
            )
        elif sorted(primary) != sorted(key):
            problems.append(
                f"PRIMARY KEY ({', '.join(key)}) is not the upstream primary key of {config.qualified} "
                f"({', '.join(primary)}): declare PRIMARY KEY ({', '.join(primary)})"
            )
        by_name = {c.name: c for c in upstream}
        for name, declared in columns:
            column = by_name.get(name)
            if column is None:
                problems.append(
                    f"column '{name}' is not a column of {config.qualified} (it has {', '.join(by_name)}): "
                    "remove it or add it upstream"
                )
            elif (problem := type_problem(column, declared)) is not None:
                problems.append(problem)
        return problems


# --- positions ---------------------------------------------------------------------------------


def binary_logs(conn: pymysql.Connection) -> list[tuple[str, int]]:
    """The server's binlog files and their sizes, oldest first (what was purged is not listed)."""
    return [(r[0], int(r[1])) for r in _query(conn, "SHOW BINARY LOGS")]


def current_offset(conn: pymysql.Connection) -> int:
    """The server's binlog position now: the end of the last transaction written."""
    rows = _query(conn, "SHOW MASTER STATUS")
    if not rows:
        raise EpochalError("the server has no binlog (log_bin is OFF): add log_bin = mysql-bin and restart it")
    return pack(rows[0][0], int(rows[0][1]))


def check_not_purged(config: ServerConfig, files: Sequence[str], offset: int) -> str:
    """The name of the binlog file that holds ``offset``, or an error when it was purged."""
    name = file_named(files, unpack(offset)[0])
    if name is None:
        raise EpochalError(
            f"the binlog position {shown(offset)} that this epoch of {config.qualified} starts at was purged "
            f"from the server (its oldest binlog is {files[0] if files else 'none'}), so its changes are lost: "
            "keep binlogs longer than the pipeline may stop (binlog_expire_logs_seconds / expire_logs_days, "
            "no PURGE BINARY LOGS past it), then drop the table from the pipeline and add it again to read "
            "a new snapshot"
        )
    return name


def server_positions(config: ServerConfig, committed_end: int | None) -> Mapping[str, object]:
    """The server's binlog position, the end of the committed epoch, and the bytes between."""
    with connect(config) as conn:
        now = current_offset(conn)
        sizes = binary_logs(conn)
    names = [n for n, _ in sizes]
    out: dict[str, object] = {"server_binlog_position": shown(now, names)}
    if committed_end is not None:
        out["committed_binlog_position"] = shown(committed_end, names)
        out["binlog_bytes_behind"] = bytes_between(committed_end, now, sizes)
    return out


# --- snapshot and binlog -----------------------------------------------------------------------


@contextmanager
def consistent_snapshot(config: ServerConfig, columns: Sequence[str]) -> Iterator[tuple[int, Iterator[list[tuple]]]]:
    """The table's rows as of one binlog position, and that position (MariaDB's
    binlog_snapshot_file/position of a consistent-snapshot transaction: no lock). A transaction
    written to the binlog before it is in these rows; one at or after it is not. Yields (offset,
    batches of rows)."""
    import pymysql.cursors

    with connect(config) as conn:
        _query(conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        _query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
        status = dict(_query(conn, "SHOW STATUS LIKE 'binlog_snapshot_%'"))
        if not status.get("Binlog_snapshot_file"):
            raise EpochalError(
                f"cannot take a snapshot of {config.qualified}: the server tells no binlog_snapshot_position "
                "(log_bin is OFF, or the server is not MariaDB)"
            )
        offset = pack(status["Binlog_snapshot_file"], int(status["Binlog_snapshot_position"]))
        selected = ", ".join(f"`{c.replace('`', '``')}`" for c in columns)
        with conn.cursor(pymysql.cursors.SSCursor) as cursor:
            cursor.execute(f"SELECT {selected} FROM {config.quoted}")

            def batches() -> Iterator[list[tuple]]:
                while rows := cursor.fetchmany(50_000):
                    yield list(rows)

            yield offset, batches()
        _query(conn, "COMMIT")


def truncates(query: str, schema: str, config: ServerConfig) -> bool:
    """Whether statement ``query``, run in database ``schema``, truncates the config's table."""
    found = re.match(r"\s*TRUNCATE\s+(?:TABLE\s+)?(?:`?([^`.\s]+)`?\.)?`?([^`\s;]+)`?", query, re.IGNORECASE)
    return found is not None and (found[1] or schema) == config.database and found[2] == config.table


def read_changes(config: ServerConfig, start: int, end: int) -> list[RowChange]:
    """The row changes of the table in binlog positions ``[start, end)``, in binlog order: the
    binlog is read from ``start`` (a transaction boundary) and no further than ``end``. An error
    when the binlog at ``start`` was purged."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    if end <= start:
        return []
    with connect(config) as conn:
        files = [n for n, _ in binary_logs(conn)]
    name = check_not_purged(config, files, start)
    settings = config.settings()
    settings.pop("init_command")
    stream = BinLogStreamReader(
        connection_settings=settings,
        server_id=config.reader_id,
        log_file=name,
        log_pos=unpack(start)[1],
        resume_stream=True,
        blocking=False,
        # Not is_mariadb=True: with it (and no GTID position), mysql-replication 1.0 sends MariaDB an
        # empty file name and position 4, dropping log_file/log_pos, so every read decoded the binlog
        # from the oldest file; once that took longer than the server keeps the dump going, each
        # reconnect started over and the read never ended. The classic dump (file and position)
        # is MariaDB's too; its events (GTID, annotate) are told apart by type either way.
        is_mariadb=False,
        # a transaction's first and last events, of every table: the read stops at the first one past
        # ``end`` instead of reading the binlog to its end
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, QueryEvent, MariadbGtidEvent, XidEvent],
        only_schemas=[config.database],
        only_tables=[config.table],
        enable_logging=False,
    )
    changes: list[RowChange] = []
    try:
        for event in stream:
            at = pack(stream.log_file, event.packet.log_pos - event.event_size)
            if at >= end:
                break
            if at < start or isinstance(event, MariadbGtidEvent | XidEvent):
                continue
            if isinstance(event, QueryEvent):  # statements: a TRUNCATE of the table has no row events
                schema = event.schema.decode(errors="replace") if isinstance(event.schema, bytes) else event.schema
                if truncates(event.query, schema, config):
                    changes.append(RowChange("truncate", at, None, None))
                continue
            for row in event.rows:
                if isinstance(event, WriteRowsEvent):
                    changes.append(RowChange("insert", at, None, dict(row["values"])))
                elif isinstance(event, UpdateRowsEvent):
                    changes.append(RowChange("update", at, dict(row["before_values"]), dict(row["after_values"])))
                else:
                    changes.append(RowChange("delete", at, dict(row["values"]), None))
    finally:
        stream.close()
    return changes
