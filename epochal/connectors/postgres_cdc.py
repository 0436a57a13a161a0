"""PostgreSQL change data capture: RisingWave's ``postgres-cdc`` source.

A pipeline declares the connection once and a table per upstream table::

    CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
      username = 'postgres', password = '${SHOP_PASSWORD}', database.name = 'shop',
      schema.name = 'public', slot.name = 'epochal_shop', publication.name = 'epochal_shop');
    CREATE TABLE orders (id BIGINT, ..., PRIMARY KEY (id)) FROM shop TABLE 'public.orders';

The loader turns each such table into a source of this connector with the shared source's options
and ``table.name``. A table has two splits: the WAL (offsets are LSNs) and its snapshot (offsets
count key chunks applied). How an epoch is read:

* ``plan`` (injection) makes sure the publication covers the table and the slot exists (created on
  first use), and fixes the epoch's WAL range ``[start, end)`` with ``end`` the server's current
  LSN, and the snapshot chunks it applies: the next ones in key order, about
  ``snapshot.epoch.rows`` rows (at least one chunk). No row is read at injection.
* ``read`` stages the epoch's chunks (and any earlier one not staged yet), then peeks the slot
  (``pg_logical_slot_peek_binary_changes``, pgoutput): that never consumes, so a re-read gets the
  same messages. It keeps the transactions whose commit LSN is in the range: a transaction is
  never split across epochs.
* The slot's confirmed position moves (``release_wal``) only to the end of the committed epoch of
  every table that shares the slot, so a recovery reads the same changes again.
* The snapshot (RisingWave's CDC backfill, live epochs commit while it runs): the table's key space
  is split into chunks (``snapshot.chunk.rows``, about 100,000 rows each) by its first read.
  A temporary replication slot exports a snapshot exactly at its consistent point L, and each chunk
  an epoch applies is read in it by a Spark task of its own and staged as Parquet under
  EPOCHAL_HOME, durably, then its record (key range, L, rows; the first record written stands). A
  kill keeps the chunks recorded; a re-run of the epoch reads the same. The chunk's rows apply as
  upserts, then the WAL's records: one for key k at LSN p applies only if k's chunk is applied
  and p >= its position (``cdc_chunks.KeyFilter``, which argues why nothing is lost or doubled).
  A key in a chunk not applied yet is left out: that chunk, read later, holds its changes.
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
from epochal.connectors.cdc_chunks import StagedChunk
from epochal.connectors.cdc_snapshot import keyed_batch, log_rows, snapshot_rows
from epochal.connectors.pg_cdc_changes import SUPPORTED_DECLARED, parser, typed_row, wal_records
from epochal.connectors.pg_cdc_snapshot import key_types, plan_chunks, stage_chunk, stage_chunks
from epochal.connectors.pgoutput import lsn_text
from epochal.env_refs import password_problems
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
    cdc_chunks.EPOCH_ROWS_OPTION,
    TABLE_OPTION,
)
CONNECTION_FILE = "connection.json"
SNAPSHOT_SPLIT_SUFFIX = "#snapshot"
#: the source step's metadata: how many snapshot chunks the epoch applied (its backfill progressed)
SNAPSHOT_CHUNKS_READ = "snapshot_chunks_read"
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
    problems += password_problems(options.get("password") or "", "SHOP_PASSWORD")
    rows_options = {}
    for option, default in (
        (cdc_chunks.CHUNK_ROWS_OPTION, cdc_chunks.DEFAULT_CHUNK_ROWS),
        (cdc_chunks.EPOCH_ROWS_OPTION, cdc_chunks.DEFAULT_EPOCH_ROWS),
    ):
        value = (options.get(option) or str(default)).strip()
        if not value.isdigit() or int(value) < 1:
            problems.append(f"option '{option}' = '{value}' is not a number of rows, e.g. '{default}'")
        else:
            rows_options[option] = int(value)
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
        chunk_rows=rows_options[cdc_chunks.CHUNK_ROWS_OPTION],
        epoch_rows=rows_options[cdc_chunks.EPOCH_ROWS_OPTION],
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
        #: the snapshot's split: its offsets count the key chunks applied, in key order
        self.snapshot_split = f"{config.qualified}{SNAPSHOT_SPLIT_SUFFIX}"
        #: where the snapshot is staged, by source name (a source re-added later takes its own)
        self.stage = Path(home) / "cdc" / source.name
        self.chunks = self.stage / "chunks"
        self._upstream: list[str] | None = None
        self._spark: Callable[[], SparkSession] | None = None
        #: the snapshot chunks the last epoch this process read applied, ``[start, end)`` (positions)
        self._applied: tuple[int, int] | None = None

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

    @property
    def _label(self) -> str:
        return f"postgres-cdc {self.source.name} ({self.config.qualified})"

    # --- planning ---------------------------------------------------------------------------

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        """The WAL's range ``[start, current LSN)`` and the snapshot's next chunks (no rows are
        read here: injection stays quick however large the table)."""
        begin = start.get(self.split, 0)
        with server.connect(self.config) as conn:
            server.ensure_publication_and_slot(conn, self.config)
            self._remember_connection()
            chunks = self._snapshot_range(start)
            end = server.current_lsn(conn)
        self.upstream()
        return [SplitRange(self.split, begin, max(begin, end)), *chunks]

    def _snapshot_range(self, start: Mapping[str, int]) -> list[SplitRange]:
        """The chunks the epoch applies: the next ones in key order, about ``snapshot.epoch.rows``
        of rows (at least one chunk), or none left. The chunk plan is made by the first read (it
        scans the key index of a table whose key is not one integer column: no work for the
        injection); until then the range is not cut at the plan's end, and the read applies the
        chunks of it that exist."""
        if self.snapshot_split not in start and start.get(self.split, 0) > 0:
            return []  # staged whole at the table's first injection, by an Epochal before this split
        first = start.get(self.snapshot_split, 0)
        end = first + max(1, self.config.epoch_rows // self.config.chunk_rows)
        plan = cdc_chunks.load_plan(self.chunks)
        if plan is not None:
            end = max(first, min(len(plan), end))
        return [SplitRange(self.snapshot_split, first, end)]

    def _chunk_plan(self) -> list[cdc_chunks.Chunk]:
        """The table's key chunks, planned by the first read that needs them (the first plan saved
        stands, so runs planning at once stage the same chunks)."""
        plan = cdc_chunks.load_plan(self.chunks)
        if plan is not None:
            return plan
        key = tuple(self.source.primary_key)
        with server.connect(self.config) as conn:
            types = key_types(conn, self.config, key)
            plan, total = plan_chunks(conn, self.config, key, types, self.config.chunk_rows)
        plan = cdc_chunks.save_plan(self.chunks, plan)
        log.info("%s: snapshot of about %d rows in %d chunks", self._label, total, len(plan))
        return plan

    def _remember_connection(self) -> None:
        """The options, kept beside the snapshot: once the table leaves the pipeline they are how
        its slot and publication are found to clean up (a password is only ever a ``${NAME}``)."""
        path = self.stage / CONNECTION_FILE
        if not path.exists():
            self.stage.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(dict(self.source.options)))
            os.replace(tmp, path)

    def wal_end(self, ranges: list[SplitRange]) -> int:
        """Where an epoch of ``ranges`` ends in the WAL (its snapshot split's offsets count chunks)."""
        return max((r.end for r in ranges if r.split == self.split), default=0)

    def release_wal(self, committed_end: int) -> None:
        """The epochs before ``committed_end`` are committed for every table of the slot: the
        server may drop the WAL before it."""
        if committed_end > 0:
            server.advance(self.config, committed_end)

    def positions(self) -> Mapping[str, object]:
        """The slot's and the server's LSNs and the WAL the slot retains, and the snapshot's chunks
        applied of its plan (staged, before this process read an epoch), for status and the
        source step's asset metadata."""
        found = dict(server.server_positions(self.config))
        plan = cdc_chunks.load_plan(self.chunks)
        if plan is not None:
            staged = cdc_chunks.staged_chunks(self.chunks, plan)
            # (a first range is planned before the chunk plan exists: it may reach past its end)
            done = min(self._applied[1], len(plan)) if self._applied is not None else len(staged)
            found["snapshot_chunks"] = f"{done}/{len(plan)}"
            found["snapshot_chunks_applied"] = done
            found["snapshot_chunks_total"] = len(plan)
            found["snapshot_done_pct"] = round(100.0 * done / len(plan), 1)
            found["snapshot_rows_staged"] = sum(s.rows for s in staged.values())
            if self._applied is not None:  # after a read: what this epoch applied
                found[SNAPSHOT_CHUNKS_READ] = max(0, done - self._applied[0])
        return found

    # --- snapshot ---------------------------------------------------------------------------

    def staged(self) -> list[StagedChunk]:
        """The snapshot's chunks staged so far, in key order."""
        plan = cdc_chunks.load_plan(self.chunks) or []
        found = cdc_chunks.staged_chunks(self.chunks, plan)
        return [found[c.index] for c in plan if c.index in found]

    def _chunks_for(self, floor: int, chunks: SplitRange | None) -> list[StagedChunk]:
        """The staged chunks ``0 .. chunks.end - 1`` (the key space the epoch's records may touch),
        staging those not staged yet: an earlier epoch's that has not read yet is staged here, at a
        position past its range's start, and it applies them from there. A chunk of this epoch's
        own staged before ``floor``, where the WAL this epoch reads starts (a slot created again
        after it was staged), is staged again."""
        if chunks is None:  # a snapshot staged whole at the first injection: every chunk is there
            plan = cdc_chunks.load_plan(self.chunks) or []
            found = cdc_chunks.staged_chunks(self.chunks, plan)
            return [found[i] for i in sorted(found)]
        plan = self._chunk_plan()
        needed = plan[: chunks.end]
        found = cdc_chunks.staged_chunks(self.chunks, needed)
        stale = {c.index for c in needed[chunks.start :] if c.index in found and found[c.index].position < floor}
        pending = [c for c in needed if c.index not in found or c.index in stale]
        if pending:
            self._stage(pending, stale)
            found = cdc_chunks.staged_chunks(self.chunks, needed)
        missing = [c.index for c in needed if c.index not in found]
        if missing:
            raise EpochalError(f"{self._label}: the snapshot's chunks {missing} were not staged: run the epoch again")
        return [found[c.index] for c in needed]

    def _slot_position(self) -> int:
        with server.connect(self.config) as conn:
            return server.slot_position(conn, self.config) or 0

    def _stage(self, pending: list[cdc_chunks.Chunk], replace: set[int]) -> None:
        """Stages ``pending`` at one new exported snapshot, as Spark tasks."""
        key = tuple(self.source.primary_key)
        with server.exported_snapshot(self.config) as (lsn, exported):
            with server.snapshot_transaction(self.config, exported) as conn:
                types = key_types(conn, self.config, key)
            log.info("%s: %d snapshot chunks to read at LSN %s", self._label, len(pending), lsn_text(lsn))
            columns, config, directory = self.source.columns, self.config.resolved(), self.chunks

            def stage_one(chunk: cdc_chunks.Chunk) -> StagedChunk:
                return stage_chunk(
                    config, columns, key, types, exported, lsn, directory, chunk, replace=chunk.index in replace
                )

            spark = self._spark() if self._spark is not None else None
            stage_chunks(spark, stage_one, pending, directory, self._label, len(pending) * self.config.chunk_rows)

    # --- reading ----------------------------------------------------------------------------

    def records(self, upper: int, lower: int, staged: list[StagedChunk] | None = None) -> list[tuple]:
        """The WAL records of ``[lower, upper)``: declared columns and ``_op`` (no Spark). A record
        of a key is kept only on top of the staged chunk that holds it (``cdc_chunks.KeyFilter``)."""
        messages = server.peek(self.config, upper, lower)
        columns = [(c.name, c.type) for c in self.source.columns]
        keep = None
        if staged is not None:
            types = {c.name: c.type for c in self.source.columns}
            parsers = [parser(types[k]) for k in self.source.primary_key]
            keep = cdc_chunks.KeyFilter(staged, lambda bound: typed_row(bound, parsers)).keep
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
        """The rows of the snapshot chunks the epoch applies, as upserts, then the WAL's records of
        its range on top, each kept per its key's chunk."""
        log_range = next((r for r in ranges if r.split == self.split), None)
        if log_range is None:
            raise EpochalError(f"{self._label}: the epoch's ranges {ranges} have no range of the WAL")
        chunks = next((r for r in ranges if r.split == self.snapshot_split), None)
        # a table's first range starts where the slot stands: it is not advanced while a table of
        # it has nothing committed (``EpochRuntime._release_committed_wal``)
        floor = log_range.start or self._slot_position()
        staged = self._chunks_for(floor, chunks)
        applying = [s for s in staged if chunks is not None and chunks.start <= s.chunk.index < chunks.end]
        frames = []
        count = sum(s.rows for s in applying)
        if applying:
            frames.append(snapshot_rows(spark, self.source.columns, [s.file for s in applying], self.split))
        found = self.records(log_range.end, floor, staged if staged or chunks is not None else None)
        frame, unchanged = log_rows(spark, self.source.columns, found, self.split)
        if chunks is not None:
            self._applied = (chunks.start, chunks.end)
        return keyed_batch([*frames, frame], count + len(found), unchanged)


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
