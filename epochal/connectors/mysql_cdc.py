"""MySQL/MariaDB change data capture: RisingWave's ``mysql-cdc`` source.

A pipeline declares the connection once and a table per upstream table::

    CREATE SOURCE shop WITH (connector = 'mysql-cdc', hostname = '127.0.0.1', port = '3306',
      username = 'root', password = '${MYSQL_PASSWORD}', database.name = 'shop', server.id = '5401');
    CREATE TABLE orders (id BIGINT, ..., PRIMARY KEY (id)) FROM shop TABLE 'shop.orders';

The loader turns each such table into a source of this connector (epochal/pipeline/shared_sources.py).
Offsets are binlog positions packed into one int (mysql_cdc_types.pack); a table is one split.

* ``plan`` (injection) fixes the epoch's range ``[start, end)`` with ``end`` the server's binlog
  position now (SHOW MASTER STATUS: the end of the last transaction written). A table's first range
  starts at 0; injection reads no rows.
* ``read`` reads the binlog from ``start`` to ``end`` (mysql-replication, ROW events): both ends are
  transaction boundaries, so whole transactions are read, and the same range reads the same rows.
  The binlog is not consumed: nothing moves on the server when an epoch commits. A range whose
  binlog was purged is an error naming the fix.
* The snapshot: MariaDB's ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` tells the binlog position
  the snapshot is exactly at (binlog_snapshot_file/position, no lock). The rows are staged as
  Parquet under EPOCHAL_HOME with the position written last; changes before it are in the snapshot,
  those at or after it apply on top. It is staged by the table's first read (the source step), so
  its position P may lie past the first range's end: every range's records are read from
  ``max(start, P)`` on. A snapshot killed half-way left no marker and is taken again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors import mysql_cdc_server as server
from epochal.connectors.base import SourceBatch, SplitRange
from epochal.connectors.cdc_snapshot import Snapshot, cdc_batch, stage_snapshot, staged_snapshot
from epochal.connectors.mysql_cdc_types import binlog_records, shown, to_declared
from epochal.env_refs import password_problems
from epochal.errors import EpochalError
from epochal.options import unknown_option_problems

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.pipeline.model import Column, SourceDef

log = logging.getLogger("epochal.connectors.mysql_cdc")

NAME = "mysql-cdc"
TABLE_OPTION = "table.name"
OPTIONS = ("connector", "hostname", "port", "username", "password", "database.name", "server.id", TABLE_OPTION)
SUPPORTED_DECLARED = (
    "BIGINT",
    "INT",
    "SMALLINT",
    "TINYINT",
    "DOUBLE",
    "FLOAT",
    "BOOLEAN",
    "STRING",
    "DATE",
    "TIMESTAMP",
)
COMMITTED_FILE = "committed.json"


def parse_options(options: Mapping[str, str]) -> tuple[server.ServerConfig | None, list[str]]:
    problems = unknown_option_problems(NAME, options, OPTIONS)
    for required in ("hostname", "username", "database.name", "server.id"):
        if not (options.get(required) or "").strip():
            problems.append(f"mysql-cdc source needs option {required} = '...'")
    port = (options.get("port") or "3306").strip()
    if not port.isdigit():
        problems.append(f"option 'port' = '{port}' is not a port number, e.g. '3306'")
    server_id = (options.get("server.id") or "").strip()
    if server_id and not (server_id.isdigit() and 0 < int(server_id) < 2**32 - 1000):
        problems.append(
            f"option 'server.id' = '{server_id}' is not a replica id: a number from 1 to {2**32 - 1001}, unique "
            "among the server's replicas (Epochal reads each table as server.id + 0..999)"
        )
    password = (options.get("password") or "").strip()
    problems += password_problems(password, "MYSQL_PASSWORD", "or omit it for a user without a password")
    table = (options.get(TABLE_OPTION) or "").strip()
    if not table:
        problems.append("a mysql-cdc table names its upstream table: CREATE TABLE t (...) FROM source TABLE 'db.table'")
    database = (options.get("database.name") or "").strip()
    if "." in table:
        database, table = table.split(".", 1)
    if problems:
        return None, problems
    config = server.ServerConfig(
        hostname=options["hostname"].strip(),
        port=int(port),
        username=options["username"].strip(),
        password=password,
        database=database,
        table=table,
        server_id=int(server_id),
    )
    return config, []


def _supported(declared: str) -> bool:
    return declared in SUPPORTED_DECLARED or declared.replace(" ", "").startswith("DECIMAL(")


class MysqlCdcConnectorSpec:
    name = NAME
    #: what the offsets point to: the server's binlog and the table
    identity_options = ("hostname", "port", "database.name", TABLE_OPTION)
    fields_by_spelling = False

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        if option == "port":
            return (value or "3306").strip().lstrip("0") or "0"
        return value.strip() if value is not None else None

    def validate(self, columns: tuple[Column, ...], options: Mapping[str, str]) -> list[str]:
        _, problems = parse_options(options)
        for column in columns:
            if not _supported(column.type):
                problems.append(
                    f"column '{column.name}' is {column.type}, which mysql-cdc does not read: "
                    f"declare one of {', '.join(SUPPORTED_DECLARED)}, DECIMAL(p,s)"
                )
        return problems

    def server_problems(
        self, columns: tuple[Column, ...], key: tuple[str, ...], options: Mapping[str, str]
    ) -> list[str]:
        """What the server says at load (``mysql_cdc_server.load_problems``)."""
        config, problems = parse_options(options)
        if config is None:
            return []  # the option problems are reported by validate
        if not key:
            return ["a mysql-cdc table needs the upstream table's PRIMARY KEY declared: add PRIMARY KEY (...)"]
        return server.load_problems(config, [(c.name, c.type) for c in columns], key)

    def create(self, source: SourceDef, home: Path) -> MysqlCdcSource:
        config, problems = parse_options(source.options)
        if config is None:
            raise EpochalError(f"source {source.name}: " + "; ".join(problems))
        return MysqlCdcSource(config, source, home)


class MysqlCdcSource:
    def __init__(self, config: server.ServerConfig, source: SourceDef, home: Path):
        self.config = config
        self.source = source
        self.split = config.qualified
        #: where the snapshot is staged, by source name (a source re-added later takes its own)
        self.stage = Path(home) / "cdc" / source.name
        self._upstream: list[str] | None = None

    #: each table its own: the runtime then tells ``release_wal`` its committed end (kept for status)
    @property
    def wal_holder(self) -> tuple[str, ...]:
        c = self.config
        return (NAME, c.hostname, str(c.port), c.qualified, self.source.name)

    def upstream(self) -> list[str]:
        """The upstream table's columns when this connector first looked (a later ADD/DROP COLUMN
        is an error at the epoch that meets it)."""
        if self._upstream is None:
            with server.connect(self.config) as conn:
                found = server.upstream_columns(conn, self.config)
            if found is None:
                raise EpochalError(f"upstream table {self.config.qualified} is gone")
            self._upstream = [c.name for c in found]
        return self._upstream

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        begin = start.get(self.split, 0)
        with server.connect(self.config) as conn:
            if begin:
                server.check_not_purged(self.config, [n for n, _ in server.binary_logs(conn)], begin)
            end = server.current_offset(conn)
        self.upstream()
        return [SplitRange(self.split, begin, max(begin, end))]

    def wal_end(self, ranges: list[SplitRange]) -> int:
        """Where an epoch of ``ranges`` ends in the binlog (one split: the table's)."""
        return max((r.end for r in ranges), default=0)

    def release_wal(self, committed_end: int) -> None:
        """Nothing to confirm on the server (the binlog is not consumed): the committed epoch's end
        is kept beside the snapshot, for status to tell how far the table is behind."""
        self.stage.mkdir(parents=True, exist_ok=True)
        path = self.stage / COMMITTED_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"end": committed_end}))
        os.replace(tmp, path)

    def positions(self) -> Mapping[str, object]:
        """The server's binlog position, the committed epoch's end and the binlog bytes between."""
        path = self.stage / COMMITTED_FILE
        committed = json.loads(path.read_text())["end"] if path.exists() else None
        return server.server_positions(self.config, committed)

    # --- snapshot ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        return staged_snapshot(self.stage)

    def _ensure_snapshot(self) -> Snapshot:
        """The staged snapshot, staged now by the first read (the source step, not injection, which
        stays quick); a re-run of an epoch after a recovery reads the same one (its binlog must still
        be there)."""
        return self.snapshot() or self._take_snapshot()

    def _take_snapshot(self) -> Snapshot:
        types = [c.type for c in self.source.columns]
        label = f"mysql-cdc {self.source.name} ({self.split})"
        with server.consistent_snapshot(self.config, list(self.source.column_names)) as (offset, batches):
            snapshot = stage_snapshot(
                self.stage,
                offset,
                self.source.columns,
                batches,
                lambda row: [to_declared(v, t) for v, t in zip(row, types, strict=True)],
                label,
            )
        log.info("%s: snapshot at %s done: %d rows", label, shown(offset), snapshot.rows)
        return snapshot

    # --- reading ----------------------------------------------------------------------------

    def records(self, upper: int, lower: int) -> list[tuple]:
        """The binlog records of ``[lower, upper)``: declared columns and ``_op`` (no Spark)."""
        changes = server.read_changes(self.config, lower, upper)
        return binlog_records(
            changes,
            self.split,
            [(c.name, c.type) for c in self.source.columns],
            self.source.primary_key,
            self.upstream(),
            lower,
            upper,
        )

    def read(self, spark: SparkSession, ranges: list[SplitRange]) -> SourceBatch:
        return cdc_batch(spark, self.source.columns, ranges, self._ensure_snapshot, self.records)
