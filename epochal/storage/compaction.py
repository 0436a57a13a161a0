"""Compaction: fold a table's change files into a snapshot, and let go of what no reader needs.

A table is stored as one directory of change files per epoch. Left alone, reading its state
replays all of history, and its files grow without bound. After an epoch commits (never inside the
commit, never holding the epoch's claim), every table with at least ``EPOCHAL_COMPACT_EVERY``
committed epochs of changes after its last snapshot gets a new one:

1. **plan**: ``plan(runtime, every)`` lists (table, committed epoch S) to snapshot. The pass after
   each epoch spreads the tables: it takes the ones furthest behind, as many as keep every table
   within its interval at twice the pace needed, plus any table twice its interval behind. All
   tables fell due in the same epoch otherwise (they start together), and that epoch's compaction
   of every table held the next epochs back (demo, every 16th epoch: freshness 31-39 s against
   13-24 s around it);
2. **write**: the state at S (previous snapshot + the changes after it, ``StateReader.read_state``)
   is written by Spark to a fresh ``{table}/snapshot=S/{attempt}/`` partitioned by vnode, after
   the meta store was told a snapshot is being written there by this process (so recovery keeps the
   files while we live and renew the snapshot's lease, and sweeps them if we die or stop renewing);
3. **publish**: one meta-store transaction makes it READY and applies retention; a racing
   compaction that published S or later first wins, and the loser deletes its files;
4. **retention**: the newest two snapshots stay, and the change files after the older of them;
   older change files go only once every sink of the table has delivered them. Their
   ``collected.location`` is cleared in the publishing transaction, so no later read lists them, and
   they are *retired* (``epochal/checkpoint/retired_files.py``), not deleted: a step of an epoch in
   flight in another run may have chosen them before and still be scanning them;
5. **reap**: every compaction pass deletes the retired files no reader can hold any more (the
   epochs that could have chosen them are done, no compaction that started before is writing, and
   ``EPOCHAL_RETENTION_GRACE_S`` passed), releasing a cached copy first.

Readers never see a difference: a snapshot at S is exactly the multiset the changes up to S add up
to, and only committed epochs are snapshotted. Dagster-free, and below the runtime: it is handed
the state reader, the tables and how each is laid out. The Dagster shell runs ``EpochRuntime.compact``
as its own step after the commit, and ``epochal compact`` from the shell.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochal.storage.durability import sync_written
from epochal.storage.mirror import build_mirror
from epochal.storage.state_reader import StateReader
from epochal.storage.vnode import DEFAULT_DIRECTORY_ROWS, vnodes_per_directory, write_laid_out

log = logging.getLogger("epochal.compaction")

#: Snapshots kept per table: the newest, and the one before it for readers that started earlier.
KEEP_SNAPSHOTS = 2


@dataclass
class TableCompaction:
    table: str
    epoch: int
    #: "compacted", "released" (a SOURCE that stores nothing let go of delivered change files),
    #: "lost a race" or "failed: <error>"
    outcome: str
    rows: int = 0
    files_before: int = 0
    files_after: int = 0
    #: locations retention retired (deleted by a later reap, once no reader can hold them)
    retired_locations: int = 0
    changes_dropped_upto: int | None = None
    seconds: float = 0.0


@dataclass
class CompactionReport:
    committed_epoch: int | None
    tables: list[TableCompaction] = field(default_factory=list)
    reaped: int = 0
    #: retired locations whose files this pass deleted
    deleted_locations: int = 0
    #: old epochs whose meta-store rows were pruned after this compaction
    pruned_epochs: int = 0
    seconds: float = 0.0

    @property
    def failed(self) -> list[TableCompaction]:
        return [t for t in self.tables if t.outcome.startswith("failed")]

    @property
    def metadata(self) -> dict[str, Any]:
        done = [t for t in self.tables if t.outcome == "compacted"]
        return {
            "epoch": self.committed_epoch,
            "tables_compacted": ", ".join(f"{t.table}@{t.epoch}" for t in done) or "none",
            "sources_released": ", ".join(t.table for t in self.tables if t.outcome == "released") or "none",
            "rows_in_snapshots": sum(t.rows for t in done),
            "files_before": sum(t.files_before for t in self.tables),
            "files_after": sum(t.files_after for t in self.tables),
            "locations_retired": sum(t.retired_locations for t in self.tables),
            "locations_deleted": self.deleted_locations,
            "abandoned_snapshots_removed": self.reaped,
            "epochs_pruned": self.pruned_epochs,
            "failures": "; ".join(f"{t.table}: {t.outcome}" for t in self.failed) or "none",
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Layout:
    """What compaction needs to know about the pipeline, handed down by the layer above."""

    tables: list[str]
    #: the columns whose hash places a table's rows in vnodes
    distribution_key: Callable[[str], tuple[str, ...]]
    #: the sinks reading a table: retention keeps change files until they delivered them
    sinks_of: Callable[[str], list[str]]
    #: SOURCEs that store nothing (epochal/incremental/state_needs.py): never snapshotted, their
    #: change files released once delivered
    store_nothing: frozenset[str] = frozenset()
    #: rows a snapshot directory holds before vnodes get one each (epochal/storage/vnode.py)
    directory_rows: int = DEFAULT_DIRECTORY_ROWS
    #: copy a large snapshot into a DuckDB file beside it for the driver's key lookups (mirror.py)
    mirrors: bool = False


def plan(reader: StateReader, every: int, tables: list[str], spread: bool = False) -> list[tuple[str, int]]:
    """(table, committed epoch) for every table whose committed change epochs after its newest
    snapshot number at least ``every``; with ``spread``, only as many as ``per_pass`` allows (the
    most behind first) and those ``2 * every`` behind."""
    due: dict[str, tuple[int, int]] = {}
    for table in tables:
        latest, pending, committed = reader.catalog.change_epochs_since_snapshot(table)
        if committed is not None and pending >= every and (latest is None or committed > latest):
            due[table] = (pending, committed)
    if spread:
        behind = sorted(due, key=lambda t: -due[t][0])
        taken = set(behind[: per_pass(len(tables), every)]) | {t for t in behind if due[t][0] >= 2 * every}
        due = {t: d for t, d in due.items() if t in taken}
    return [(table, committed) for table, (_, committed) in due.items()]


def per_pass(tables: int, every: int) -> int:
    """Tables a spread pass compacts: each table once every ``every`` epochs needs tables/every a
    pass; twice that drains a backlog (all tables due at once, a run of several epochs)."""
    return max(1, -(-tables // max(1, every // 2)))


def release_table(reader: StateReader, layout: Layout, table: str) -> TableCompaction | None:
    """Let go of the delivered change files of a SOURCE that stores nothing (retired: the reap
    deletes them once no reader can hold them); None if none were due."""
    started = time.time()
    retired = reader.catalog.release_changes(table, layout.sinks_of(table))
    if not retired:
        return None
    files = reader.warehouse.table_file_count(table)
    log.info("%s stores nothing: retired %d delivered location(s)", table, len(retired))
    return TableCompaction(
        table, reader.catalog.committed_epoch() or 0, "released", 0, files, files, len(retired),
        seconds=time.time() - started,
    )


def compact_table(reader: StateReader, layout: Layout, table: str, epoch: int) -> TableCompaction:
    """Write, publish and apply retention for one snapshot of ``table`` at committed ``epoch``."""
    started = time.time()
    catalog, warehouse = reader.catalog, reader.warehouse
    files_before = warehouse.table_file_count(table)
    # Stamped before the files are chosen: what is retired after this keeps its files until we publish.
    chosen_at = time.time()
    state, rows_read = reader.read_state(table, epoch, inclusive=True)
    key = layout.distribution_key(table)
    location = warehouse.new_snapshot_location(table, epoch)
    catalog.begin_snapshot(table, epoch, location, key, state.schema.json(), started_at=chosen_at)
    try:
        with catalog.snapshot_lease(location):
            # (the rows read bound the state's: a directory per vnode once that is large)
            write_laid_out(state, key, vnodes_per_directory(rows_read, layout.directory_rows), location)
        files = warehouse.snapshot_files(location)
        rows = warehouse.files_row_count(files)
        if layout.mirrors and warehouse.is_local:  # before it is published: readers find it whole
            build_mirror(warehouse.file_path(location), [warehouse.file_path(f) for f in files], rows)
        sync_written(warehouse, [location])  # on the disk before it is published
        result = catalog.publish_snapshot(location, rows, len(files), layout.sinks_of(table), KEEP_SNAPSHOTS)
    except BaseException:
        warehouse.delete([location], prune_parents=True)
        catalog.abandon_snapshot(location)
        raise
    if not result.recorded:
        warehouse.delete([location], prune_parents=True)
        log.info("%s: a snapshot at or after epoch %s was published first; ours is deleted", table, epoch)
        return TableCompaction(table, epoch, "lost a race", 0, files_before, warehouse.table_file_count(table))
    # (what retention released is retired, not deleted: a reader may still be scanning it)
    report = TableCompaction(
        table,
        epoch,
        "compacted",
        rows,
        files_before,
        warehouse.table_file_count(table),
        len(result.retired),
        result.changes_dropped_upto,
        time.time() - started,
    )
    log.info(
        "%s: snapshot at epoch %s, %d rows in %d files; files %d -> %d",
        table,
        epoch,
        rows,
        len(files),
        report.files_before,
        report.files_after,
    )
    return report


def reap_retired(reader: StateReader, grace_s: float) -> int:
    """Delete the retired files no reader can hold any more (``retired_files.reap``); returns how
    many locations went. Their rows go first: a crash before the delete leaves orphans for
    recovery's sweep, never a row naming a missing file."""
    doomed = reader.catalog.reap_retired(grace_s)
    if doomed:
        # A cached copy is released only now, when the files really go: while they are retired, a
        # reader that chose them may be scanning the server's cache of them.
        reader.release_snapshots(doomed)
        reader.warehouse.delete(doomed, prune_parents=True)
        log.info("deleted %d retired location(s) no reader can hold any more", len(doomed))
    return len(doomed)


def compact_tables(
    reader: StateReader,
    layout: Layout,
    every: int,
    tables: list[str] | None = None,
    prune: Callable[[], int] | None = None,
    grace_s: float | None = None,
    spread: bool = False,
) -> CompactionReport:
    """Compact every table the plan picks (of ``tables``, default all), delete the retired files
    whose readers are done (``grace_s``: default ``EPOCHAL_RETENTION_GRACE_S``), then ``prune()``
    old epochs' meta-store rows; ``spread``: the pass after an epoch (``plan``). A table that fails
    is logged and reported, never raised: compaction runs after the commit, and its failure must not
    fail the epoch."""
    started = time.time()
    report = CompactionReport(None)
    catalog, warehouse = reader.catalog, reader.warehouse
    try:
        reaped = catalog.reap_abandoned_snapshots()
        if reaped:
            warehouse.delete(reaped, prune_parents=True)
            log.warning("removed %d snapshot(s) a dead compaction left unpublished", len(reaped))
        report.reaped = len(reaped)
        report.committed_epoch = catalog.committed_epoch()
        chosen = tables if tables is not None else layout.tables
        todo = plan(reader, every, [t for t in chosen if t not in layout.store_nothing], spread)
        released = [t for t in chosen if t in layout.store_nothing]
    except Exception as exc:  # the meta store or the warehouse is unreachable: try again next epoch
        log.exception("compaction could not plan")
        report.tables.append(TableCompaction("*", 0, f"failed: {type(exc).__name__}: {exc}"[:500]))
        todo, released = [], []
    for table in released:
        try:
            done = release_table(reader, layout, table)
        except Exception as exc:
            log.exception("releasing the change files of %s failed", table)
            done = TableCompaction(table, 0, f"failed: {type(exc).__name__}: {exc}"[:500])
        if done is not None:
            report.tables.append(done)
    for table, epoch in todo:
        try:
            report.tables.append(compact_table(reader, layout, table, epoch))
        except Exception as exc:
            log.exception("compaction of %s at epoch %s failed", table, epoch)
            report.tables.append(TableCompaction(table, epoch, f"failed: {type(exc).__name__}: {exc}"[:500]))
    # After the tables: what this pass retired goes at once when no reader can hold it (grace 0).
    try:
        grace = catalog.settings.retention_grace_s if grace_s is None else grace_s
        report.deleted_locations = reap_retired(reader, grace)
    except Exception as exc:  # tried again by the next pass: the files stay retired meanwhile
        log.exception("deleting retired files failed")
        report.tables.append(TableCompaction("*", 0, f"failed: reaping: {type(exc).__name__}: {exc}"[:500]))
    if prune is not None and (todo or any(t.outcome == "released" for t in report.tables)):
        try:
            report.pruned_epochs = prune()
        except Exception as exc:
            log.exception("pruning old epochs failed")
            report.tables.append(TableCompaction("*", 0, f"failed: pruning: {type(exc).__name__}: {exc}"[:500]))
    report.seconds = time.time() - started
    return report
