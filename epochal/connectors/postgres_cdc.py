"""PostgreSQL change data capture: RisingWave's ``postgres-cdc`` source.

A pipeline declares the connection once and a table per upstream table::

    CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
      username = 'postgres', password = '${SHOP_PASSWORD}', database.name = 'shop',
      schema.name = 'public', slot.name = 'epochal_shop', publication.name = 'epochal_shop');
    CREATE TABLE orders (id BIGINT, ..., PRIMARY KEY (id)) FROM shop TABLE 'public.orders';

The loader turns each such table into a source of this connector with the shared source's options
and ``table.name``. Offsets are LSNs; a table is one split. How an epoch is read:

* ``plan`` (injection) makes sure the publication covers the table and the slot exists (created on
  first use), and fixes the epoch's range ``[start, end)`` with ``end`` the server's current LSN.
  A table's first range starts at 0: before it is planned, its snapshot is staged (below).
* ``read`` peeks the slot (``pg_logical_slot_peek_binary_changes``, pgoutput): that never consumes,
  so a re-read gets the same messages. It keeps the transactions whose commit LSN is in the range:
  a transaction is never split across epochs.
* The slot's confirmed position moves (``release_wal``) only to the end of the committed epoch of
  every table that shares the slot, so a recovery reads the same changes again.
* The snapshot: the table's key space is split into chunks (``snapshot.chunk.rows``, about
  100,000 rows each); a temporary replication slot exports a snapshot exactly at its consistent
  point L, and every chunk is read in it by a Spark task of its own and staged as Parquet under
  EPOCHAL_HOME, durably, then its record (key range, L, rows). A kill keeps the chunks recorded;
  the rest are read at a new exported snapshot L' > L. The marker naming them all is written last.
  A log record for key k at LSN p applies on top only if p >= the position of k's chunk
  (``cdc_chunks.KeyFilter``, which argues why nothing is lost or doubled).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors import cdc_chunks
from epochal.connectors import pg_cdc_server as server
from epochal.connectors.base import SourceBatch, SplitRange
from epochal.connectors.cdc_snapshot import MARKER, Snapshot, cdc_batch, staged_snapshot, write_marker
from epochal.connectors.pg_cdc_changes import SUPPORTED_DECLARED, parser, typed_row, wal_records
from epochal.connectors.pg_cdc_snapshot import key_types, plan_chunks, stage_chunk, stage_chunks
from epochal.connectors.pgoutput import lsn_text
from epochal.errors import EpochalError
from epochal.options import unknown_option_problems

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.pipeline.model import Column, SourceDef

log = logging.getLogger("epochal.connectors.postgres_cdc")

NAME = "postgres-cdc"
#: the option the loader adds from ``FROM source TABLE 'schema.table'``
TABLE_OPTION = "table.name"
OPTIONS = (
    "connector",
    "hostname",
    "port",
    "username",
    "password",
    "database.name",
    "schema.name",
    "slot.name",
    "publication.name",
    cdc_chunks.CHUNK_ROWS_OPTION,
    TABLE_OPTION,
)
CONNECTION_FILE = "connection.json"
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


def parse_options(options: Mapping[str, str]) -> tuple[server.ServerConfig | None, list[str]]:
    problems = unknown_option_problems(NAME, options, OPTIONS)
    for required in ("hostname", "username", "database.name", "slot.name"):
        if not (options.get(required) or "").strip():
            problems.append(f"postgres-cdc source needs option {required} = '...'")
    port = (options.get("port") or "5432").strip()
    if not port.isdigit():
        problems.append(f"option 'port' = '{port}' is not a port number, e.g. '5432'")
    slot = (options.get("slot.name") or "").strip()
    if slot and not _SLOT_NAME.match(slot):
        problems.append(
            f"option 'slot.name' = '{slot}' is not a slot name: lower-case letters, digits and _, at most 63 characters"
        )
    password = (options.get("password") or "").strip()
    reference = server.ENV_REFERENCE.match(password)
    if password and reference is None:
        # the options are shown in the asset's description and kept with the statement's text
        problems.append(
            "option 'password' is written out: write it as password = '${NAME}' and export NAME=... in the "
            "environment Epochal runs in, so that it stays out of the pipeline's files, the UI and status"
        )
    elif reference is not None and reference[1].upper().startswith(("EPOCHAL_", "DAGSTER_")):
        problems.append(
            f"option 'password' = '${{{reference[1]}}}' reads one of Epochal's or Dagster's own settings: "
            "export the password under a name of its own, e.g. SHOP_PASSWORD"
        )
    chunk_rows = (options.get(cdc_chunks.CHUNK_ROWS_OPTION) or str(cdc_chunks.DEFAULT_CHUNK_ROWS)).strip()
    if not chunk_rows.isdigit() or int(chunk_rows) < 1:
        problems.append(
            f"option '{cdc_chunks.CHUNK_ROWS_OPTION}' = '{chunk_rows}' is not a number of rows, "
            f"e.g. '{cdc_chunks.DEFAULT_CHUNK_ROWS}'"
        )
    table = (options.get(TABLE_OPTION) or "").strip()
    if not table:
        problems.append(
            "a postgres-cdc table names its upstream table: CREATE TABLE t (...) FROM source TABLE 'schema.table'"
        )
    schema = (options.get("schema.name") or "public").strip()
    if "." in table:
        schema, table = table.split(".", 1)
    if problems:
        return None, problems
    config = server.ServerConfig(
        hostname=options["hostname"].strip(),
        port=int(port),
        username=options["username"].strip(),
        password=options.get("password", ""),
        database=options["database.name"].strip(),
        schema=schema,
        table=table,
        slot=slot,
        publication=(options.get("publication.name") or slot).strip(),
        chunk_rows=int(chunk_rows),
    )
    return config, []


class PostgresCdcConnectorSpec:
    name = NAME
    #: what the LSNs point to: the server, the database, the table and the slot that retains its WAL
    identity_options = ("hostname", "port", "database.name", "schema.name", TABLE_OPTION, "slot.name")
    fields_by_spelling = False

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        if option == "port":
            return (value or "5432").strip().lstrip("0") or "0"
        if option == "schema.name":
            return (value or "public").strip()
        return value.strip() if value is not None else None

    def validate(self, columns: tuple[Column, ...], options: Mapping[str, str]) -> list[str]:
        _, problems = parse_options(options)
        for column in columns:
            if parser(column.type) is None:
                problems.append(
                    f"column '{column.name}' is {column.type}, which postgres-cdc does not read: "
                    f"declare one of {', '.join(SUPPORTED_DECLARED)}"
                )
        return problems

    def server_problems(
        self, columns: tuple[Column, ...], key: tuple[str, ...], options: Mapping[str, str]
    ) -> list[str]:
        """What the server says at load: it is up, logical, the table is there with that key, replica
        identity and column types (``pg_cdc_server.load_problems``)."""
        config, problems = parse_options(options)
        if config is None:
            return []  # the option problems are reported by validate
        if not key:
            return ["a postgres-cdc table needs the upstream table's PRIMARY KEY declared: add PRIMARY KEY (...)"]
        return server.load_problems(config, [(c.name, c.type) for c in columns], key)

    def create(self, source: SourceDef, home: Path) -> PostgresCdcSource:
        config, problems = parse_options(source.options)
        if config is None:
            raise EpochalError(f"source {source.name}: " + "; ".join(problems))
        return PostgresCdcSource(config, source, home)


class PostgresCdcSource:
    def __init__(self, config: server.ServerConfig, source: SourceDef, home: Path):
        self.config = config
        self.source = source
        self.split = config.qualified
        #: where the snapshot is staged, by source name (a source re-added later takes its own)
        self.stage = Path(home) / "cdc" / source.name
        self._upstream: list[str] | None = None
        self._spark: Callable[[], SparkSession] | None = None

    def bind_spark(self, spark: Callable[[], SparkSession]) -> None:
        """Where the snapshot's chunks are read as tasks; unbound, they are read on the driver."""
        self._spark = spark

    #: sources whose connectors answer the same ``wal_holder`` share a slot (see ``release_wal``)
    @property
    def wal_holder(self) -> tuple[str, ...]:
        c = self.config
        return (NAME, c.hostname, str(c.port), c.database, c.slot)

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

    # --- planning ---------------------------------------------------------------------------

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        begin = start.get(self.split, 0)
        with server.connect(self.config) as conn:
            server.ensure_publication_and_slot(conn, self.config)
            self._remember_connection()
            if begin == 0:
                self._ensure_snapshot(conn)
            end = server.current_lsn(conn)
        self.upstream()
        return [SplitRange(self.split, begin, max(begin, end))]

    def _remember_connection(self) -> None:
        """The options, kept beside the snapshot: once the table leaves the pipeline they are how
        its slot and publication are found to clean up (a password is only ever a ``${NAME}``)."""
        path = self.stage / CONNECTION_FILE
        if not path.exists():
            self.stage.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(dict(self.source.options)))
            os.replace(tmp, path)

    def release_wal(self, committed_end: int) -> None:
        """The epochs before ``committed_end`` are committed for every table of the slot: the
        server may drop the WAL before it."""
        if committed_end > 0:
            server.advance(self.config, committed_end)

    def positions(self) -> Mapping[str, object]:
        """The slot's and the server's LSNs and the WAL the slot retains, and the snapshot's chunks
        staged of its plan, for status and the source step's asset metadata."""
        found = dict(server.server_positions(self.config))
        directory = self.stage / "chunks"
        plan = cdc_chunks.load_plan(directory)
        if plan is not None:
            found["snapshot_chunks"] = f"{len(cdc_chunks.staged_chunks(directory, plan))}/{len(plan)}"
        return found

    # --- snapshot ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        return staged_snapshot(self.stage)

    def _ensure_snapshot(self, conn: object) -> Snapshot:
        staged = self.snapshot()
        position = server.slot_position(conn, self.config)
        if staged is not None and position is not None and staged.position >= position:
            return staged  # a re-plan after a recovery reads the same snapshot
        return self._take_snapshot(position or 0)

    def _take_snapshot(self, slot_position: int) -> Snapshot:
        """Stages the chunks not yet staged (all of them the first time) at one new exported
        snapshot, then the marker. Chunks staged before a kill are kept when the slot still holds
        the WAL from their position on; else (a snapshot for a recreated slot) all are read again."""
        import shutil

        label = f"postgres-cdc {self.source.name} ({self.config.qualified})"
        directory = self.stage / "chunks"
        key = tuple(self.source.primary_key)
        previous = staged_snapshot(self.stage)
        plan = cdc_chunks.load_plan(directory)
        done = cdc_chunks.staged_chunks(directory, plan) if plan is not None else {}
        if previous is not None or any(s.position < slot_position for s in done.values()):
            shutil.rmtree(directory, ignore_errors=True)
            (self.stage / MARKER).unlink(missing_ok=True)
            plan, done = None, {}
        with server.exported_snapshot(self.config) as (lsn, exported):
            with server.snapshot_transaction(self.config, exported) as conn:
                types = key_types(conn, self.config, key)
                if plan is None:
                    plan, total = plan_chunks(conn, self.config, key, types, self.config.chunk_rows)
                    cdc_chunks.save_plan(directory, plan)
                else:
                    total = sum(s.rows for s in done.values()) * len(plan) // max(len(done), 1)
            pending = [c for c in plan if c.index not in done]
            log.info(
                "%s: snapshot at LSN %s: %d chunks of %d to read (about %d rows)",
                label,
                lsn_text(lsn),
                len(pending),
                len(plan),
                total,
            )
            columns, config = self.source.columns, self.config.resolved()

            def stage_one(chunk: cdc_chunks.Chunk) -> cdc_chunks.StagedChunk:
                return stage_chunk(config, columns, key, types, exported, lsn, directory, chunk)

            spark = self._spark() if self._spark is not None else None
            stage_chunks(spark, stage_one, pending, directory, label, total)
        staged = cdc_chunks.staged_chunks(directory, plan)
        if len(staged) != len(plan):
            missing = sorted(set(range(len(plan))) - set(staged))
            raise EpochalError(f"{label}: the snapshot's chunks {missing} were not staged: plan the epoch again")
        chunks = [staged[i] for i in range(len(plan))]
        snapshot = write_marker(self.stage, chunks)
        log.info("%s: snapshot done: %d rows in %d chunks", label, snapshot.rows, len(chunks))
        return snapshot

    # --- reading ----------------------------------------------------------------------------

    def records(self, upper: int, lower: int) -> list[tuple]:
        """The WAL records of ``[lower, upper)``: declared columns and ``_op`` (no Spark)."""
        messages = server.peek(self.config, upper, lower)
        columns = [(c.name, c.type) for c in self.source.columns]
        staged = self.snapshot()
        keep = None
        if staged is not None and staged.chunks:
            # the first range's records from the lowest chunk position on: each applies only on
            # top of a chunk read before it (cdc_chunks.KeyFilter)
            types = {c.name: c.type for c in self.source.columns}
            parsers = [parser(types[k]) for k in self.source.primary_key]
            keep = cdc_chunks.KeyFilter(staged.chunks, lambda bound: typed_row(bound, parsers)).keep
        return wal_records(
            messages,
            (self.config.schema, self.config.table),
            columns,
            self.source.primary_key,
            self.upstream(),
            lower,
            upper,
            keep,
        )

    def read(self, spark: SparkSession, ranges: list[SplitRange]) -> SourceBatch:
        return cdc_batch(
            spark, self.source.columns, ranges, self.snapshot, self.records, self.config.qualified, self.stage
        )


def wal_holder(options: Mapping[str, str]) -> tuple[str, ...] | None:
    """Which slot a table with ``options`` reads (``PostgresCdcSource.wal_holder``), None if unparsable."""
    config, _ = parse_options(options)
    return None if config is None else (NAME, config.hostname, str(config.port), config.database, config.slot)


def retire_removed_table(home: Path, name: str, holders_in_use: set[tuple[str, ...] | None]) -> bool:
    """When table ``name`` that left the pipeline was a postgres-cdc table: leave its publication,
    drop its slot when no table of the pipeline uses it any more, delete its staged snapshot.
    Returns whether it was one. A server that cannot be reached is logged, with the SQL to run."""
    import shutil

    import psycopg

    stage = Path(home) / "cdc" / name
    path = stage / CONNECTION_FILE
    if not path.exists():
        return False
    options = json.loads(path.read_text())
    config, _ = parse_options(options)
    if config is not None:
        last = wal_holder(options) not in holders_in_use
        try:
            server.retire_table(config, last)
        except (EpochalError, psycopg.Error) as error:  # the table is gone either way: say what to clean up
            log.warning(
                "postgres-cdc table %s left the pipeline, but its slot could not be cleaned up (%s): run "
                "SELECT pg_drop_replication_slot('%s') on %s when no table uses it, or the server keeps its WAL",
                name,
                error,
                config.slot,
                config.where,
            )
    shutil.rmtree(stage, ignore_errors=True)
    return True
