"""The checkpoint controller: one meta store, and the parts that keep it (``epochal/checkpoint/``).

* ``epoch_log``: inject epochs, lease them to the runs working on them, collect, commit;
* ``catalog``: snapshots, what each table's state is made of, retention and history pruning;
* ``backfills``: views that backfill while epochs go on, and join;
* ``sink_coordinator``: delivers committed epochs into sinks exactly once;
* ``recover()`` and ``status()``: the operations that span them.

Callers outside ``epochal/checkpoint/`` use the controller's named methods (the ``*Methods`` classes
beside this module, one concern each), never a part or the meta store directly: every method is one
transaction or one protocol of them, so what the checkpoint promises is decided here.

Its state lives in the meta store alone: the "workers" are Dagster runs in processes that come and
go, and every decision is one meta-store transaction, so runs, the sensor and the shell can race.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills.log import BackfillLog
from epochal.checkpoint.catalog import SnapshotCatalog
from epochal.checkpoint.checks import CheckRecords
from epochal.checkpoint.controller.backfills import BackfillMethods
from epochal.checkpoint.controller.catalog import CatalogMethods
from epochal.checkpoint.controller.checks import CheckMethods
from epochal.checkpoint.controller.epochs import EpochMethods
from epochal.checkpoint.controller.sinks import SinkMethods
from epochal.checkpoint.controller.statements import StatementMethods
from epochal.checkpoint.epoch_log import EpochLog
from epochal.checkpoint.records import RecoveryReport
from epochal.checkpoint.recovery import Discard, Recovery, Sweep
from epochal.checkpoint.sinks.coordinator import SinkCoordinator
from epochal.checkpoint.status import read_status
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor, open_backend
from epochal.meta.schema import DDL, SCHEMA_VERSION
from epochal.settings import Settings


class CheckpointController(
    EpochMethods, CatalogMethods, BackfillMethods, SinkMethods, StatementMethods, CheckMethods
):
    def __init__(
        self,
        settings: Settings,
        sources: Iterable[str],
        views: Iterable[str] = (),
        sinks: Iterable[str] = (),
        backend: Backend | None = None,
        upstreams: Mapping[str, tuple[str, ...]] | None = None,
        fingerprints: Mapping[str, str] | None = None,
        sink_inputs: Mapping[str, str] | None = None,
        append_only_sinks: Iterable[str] = (),
        view_columns: Mapping[str, tuple[str, ...]] | None = None,
        loaded_at: float | None = None,
        statements: Mapping[str, str] | None = None,
        declarations: Mapping[str, str] | None = None,
    ):
        self.settings = settings
        self.sources = list(sources)
        #: the state tables whose commit is aligned: every source and view
        self.tables = [*self.sources, *views]
        self.sinks = list(sinks)
        self.backend = backend or open_backend(settings.meta_url)
        self.backend.transaction(ensure_schema)
        self.epoch_log = EpochLog(
            settings,
            self.backend,
            self.sources,
            self.tables,
            upstreams,
            fingerprints,
            sink_inputs,
            append_only_sinks,
            view_columns,
            loaded_at,
            statements,
            declarations,
        )
        self.backfills = BackfillLog(self.backend, settings.epoch_timeout_s)
        self.catalog = SnapshotCatalog(settings, self.backend)
        self.sink_coordinator = SinkCoordinator(self.backend, settings.epoch_timeout_s, settings.sink_retry_s)
        self.check_records = CheckRecords(self.backend)

    def recover(self, reason: str, discard: Discard, sweep: Sweep | None = None) -> RecoveryReport:
        """Take every table back to the committed epoch and make the controller ready to inject.

        ``discard(locations)`` deletes data written for aborted epochs. ``sweep(keep, upto)``
        optionally deletes warehouse data of epochs <= ``upto`` that no live epoch references
        (written by a run that died before it could collect); it calls ``keep()`` for what to keep
        only after it listed the warehouse, so a snapshot announced meanwhile is never swept."""
        registrable = [*self.epoch_log.sources, *self.epoch_log.upstreams]
        return Recovery(self.backend, self.tables, self.catalog, registrable).run(reason, discard, sweep)

    def status(self) -> dict[str, Any]:
        return read_status(self.backend, self.tables, self.sinks)

    def prune_history(self) -> int:
        """Delete the rows of epochs nothing can read any more (``SnapshotCatalog.prune_history``)."""
        return self.catalog.prune_history(self.tables, self.sinks, self.settings.partition_window)


def ensure_schema(cur: Cursor) -> None:
    for ddl in DDL:
        cur.execute(ddl)
    row = cur.execute("SELECT value FROM controller WHERE key = 'schema_version'").fetchone()
    if row is None:
        cur.execute("INSERT INTO controller VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    elif int(row[0]) != SCHEMA_VERSION:
        raise EpochalError(
            f"meta store schema version {row[0]} is not {SCHEMA_VERSION}, the one this Epochal uses: "
            "upgrade Epochal or point EPOCHAL_META_URL at a matching store"
        )
    if q.get_flag(cur, "split_frontier") is None:
        _fill_split_frontier(cur)
        q.set_flag(cur, "split_frontier", "1")


def _fill_split_frontier(cur: Cursor) -> None:
    """A store from before ``split_frontier``: fill it once from the offsets' history, as injection
    used to read it (each split's newest epoch that is not aborted, and its newest committed one)."""
    newest = (
        "SELECT o.source, o.split, o.end_offset FROM epoch_offsets o "
        "JOIN (SELECT o2.source, o2.split, max(o2.epoch) AS epoch FROM epoch_offsets o2 "
        "      JOIN epochs e ON e.epoch = o2.epoch WHERE {which} GROUP BY o2.source, o2.split) m "
        "ON m.source = o.source AND m.split = o.split AND m.epoch = o.epoch"
    )
    reserved = cur.execute(newest.format(which="e.state <> 'ABORTED'")).fetchall()
    committed = {(s, p): end for s, p, end in cur.execute(newest.format(which="e.state = 'COMMITTED'")).fetchall()}
    for source, split, end in reserved:
        cur.execute(
            "INSERT INTO split_frontier (source, split, reserved_end, committed_end) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (source, split) DO NOTHING",
            [source, split, end, committed.get((source, split))],
        )
