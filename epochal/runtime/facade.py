"""What each node of the pipeline does for one epoch: the steps that Dagster ops and assets call.

Dagster-free: the Dagster shell (``platform_defs``) only maps runs and partitions onto these
functions and their returned metadata onto materializations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

from epochal.checkpoint.backfills.state import BackfillPhase
from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import (
    Collected,
    EpochAborted,
    EpochRecord,
    EpochState,
    InvariantViolation,
    OrderWaitAbandoned,
    RecoveryReport,
    StepStart,
)
from epochal.checkpoint.statements.sources import Declaration, StaleDeclarations
from epochal.checkpoint.statements.views import StaleStatements
from epochal.connectors.base import SourceConnector, SplitRange
from epochal.connectors.registry import connector_spec
from epochal.driver.sources import DriverSources
from epochal.driver.spark_conf import departures
from epochal.driver.views import DriverViews
from epochal.epoch import epoch_physical_ms
from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.pipeline.model import Pipeline, SourceDef
from epochal.runtime import compaction_step as table_layout
from epochal.runtime.epoch_taking import EpochTaking, RunEpochs
from epochal.runtime.pipeline_edits import PipelineChanges, view_fingerprint, view_statement
from epochal.runtime.rebuild_step import RebuildSteps
from epochal.runtime.report import StepReport
from epochal.runtime.schemas import QuerySchemas
from epochal.runtime.sink_step import SinkSteps
from epochal.runtime.source_history import SourceHistory
from epochal.runtime.source_step import SourceSteps
from epochal.runtime.view_step import ViewSteps
from epochal.settings import Settings
from epochal.sinks.base import SinkTarget
from epochal.storage.driver_lookup import DriverLookup
from epochal.storage.state_cache import StateCache
from epochal.storage.state_reader import StateReader
from epochal.storage.warehouse import Warehouse, dead_letter_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from epochal.pipeline.model import ViewDef

log = logging.getLogger("epochal.runtime")

#: ``checked_view_epoch``'s default: the stored statement has not been read yet
_UNREAD = object()

# How long a commit step waits for an older epoch (owned by another, live run) to commit first, so
# that this run's sinks deliver its epoch. Past it the step ends without error: the epoch is
# collected by every table, and the run that commits the older epochs commits it with them.
COMMIT_WAIT_S = 120.0


def _lag_seconds(epoch: int | None) -> float | None:
    return None if epoch is None else round(time.time() - epoch_physical_ms(epoch) / 1000, 3)


def source_declaration(source: SourceDef) -> str:
    """What ``source``'s stored rows depend on (``source_declarations.Declaration``), as JSON."""
    spec = connector_spec(source.connector)
    if spec is None:
        return Declaration.of(source).to_json()
    return Declaration.of(source, spec.identity_options, spec.fields_by_spelling).to_json()


class EpochRuntime:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        spark: Callable[[], "SparkSession"],
        controller: CheckpointController | None = None,
    ):
        self.settings = settings
        self.pipeline = pipeline
        self._spark_factory = spark
        self.controller = controller or CheckpointController(
            settings,
            sources=list(pipeline.sources),
            views=pipeline.view_order(),
            sinks=list(pipeline.sinks),
            upstreams={name: view.upstreams for name, view in pipeline.views.items()},
            fingerprints={name: view_fingerprint(view) for name, view in pipeline.views.items()},
            view_columns={name: tuple(view.columns) for name, view in pipeline.views.items()},
            sink_inputs={name: sink.from_table for name, sink in pipeline.sinks.items()},
            append_only_sinks=[n for n, s in pipeline.sinks.items() if s.options.get("type") != "upsert"],
            loaded_at=pipeline.loaded_at,
            statements={
                view_fingerprint(v): view_statement(v) for v in pipeline.views.values() if v.internal_of is None
            },
            declarations={name: source_declaration(source) for name, source in pipeline.sources.items()},
        )
        self.warehouse = Warehouse(settings.warehouse)
        # On a Spark Connect server, cached snapshots outlive the run (``StateCache``): the registry
        # of what is cached there is per Epochal home, like the server it manages.
        registry = settings.home / "spark" / "state_cache.json"
        self.state_cache = StateCache(enabled=settings.state_cache, registry=registry)
        self.reader = StateReader(
            lambda: self.spark,
            self.controller.catalog,
            self.warehouse,
            self.state_cache,
            self.query_schema,
            SourceHistory(self),
            DriverLookup(settings.driver_lookup_rows),
            lambda table: self.query_schema(table) if table in self.pipeline.sources else None,
        )
        #: small epochs' source and view steps computed on the driver (epochal/driver/)
        catalog = self.controller.catalog
        driver_rows = settings.driver_rows
        departed = departures(settings.spark_conf)
        if driver_rows and departed:
            log.warning("every step runs on Spark: the driver computes as Spark does only without %s", departed)
            driver_rows = 0
        self.driver_views = DriverViews(self.warehouse, catalog, self.query_schema, driver_rows)
        self.driver_sources = DriverSources(self.warehouse, catalog, self.query_schema, driver_rows)
        self._connectors: dict[str, SourceConnector] = {}
        self.schemas = QuerySchemas(self)
        #: old statements maintained while their views rebuild (:mod:`epochal.runtime.rebuild_step`), by
        #: name: their stages are not in the pipeline, yet read like its tables
        self.old_versions = self.schemas.old_versions
        self.sink_steps = SinkSteps(self)
        self.source_steps = SourceSteps(self)
        self.view_steps = ViewSteps(self)
        self.rebuild_steps = RebuildSteps(self)
        self.changes = PipelineChanges(self)
        self._plans_checked = False
        # A run's steps may run on several threads (``platform_defs.executor``): what one step sets
        # for itself (``recording_for_backfill``) is per thread, and lazy set-up happens once.
        self._per_thread = threading.local()
        self._lock = threading.RLock()
        self.taking = EpochTaking(self)

    @property
    def _record_backfill(self) -> Callable[[Collected], None] | None:
        """Set by ``recording_for_backfill`` while this thread writes a committed epoch for a backfill."""
        return getattr(self._per_thread, "record_backfill", None)

    @property
    def backfill_root(self) -> str | None:
        return getattr(self._per_thread, "backfill_root", None)

    def check_plans(self) -> None:
        """Once per runtime, before its first step touches data: Spark analyses every plan of the
        pipeline over empty inputs, so that one it refuses is an error naming its view, never a
        failed epoch (:mod:`epochal.incremental.analysis`; skipped, without starting Spark, when
        EPOCHAL_HOME holds the fingerprint of these plans already analysed)."""
        if self._plans_checked:
            return
        with self._lock:
            if not self._plans_checked:
                from epochal.incremental.analysis import check_pipeline

                check_pipeline(lambda: self.spark, self.pipeline, self.query_schema, self.settings.home)
                self._plans_checked = True

    def close(self) -> None:
        """Release what this runtime holds: the lease on the epochs its run took, and its cached
        snapshots in the Spark session."""
        self.taking.close()
        if "spark" in self.__dict__:  # never start Spark just to close it
            self.state_cache.clear()

    @cached_property
    def spark(self) -> "SparkSession":
        return self._spark_factory()

    def connector(self, source: str) -> SourceConnector:
        with self._lock:
            return self._connector(source)

    def _connector(self, source: str) -> SourceConnector:
        if source not in self._connectors:
            definition = self.pipeline.sources[source]
            spec = connector_spec(definition.connector)
            if spec is None:
                raise InvariantViolation(
                    f"source {source} has connector {definition.connector!r}, which the loader refuses"
                )
            self._connectors[source] = spec.create(definition, self.settings.home)
        return self._connectors[source]

    # ------------------------------------------------------------------ epochs

    def plan(self, source: str, starts: Mapping[str, int]) -> list[SplitRange]:
        return self.connector(source).plan(starts)

    def recover(self, reason: str) -> RecoveryReport:
        tables = [*self.pipeline.tables, *(dead_letter_table(s) for s in self.pipeline.sources)]
        return self.controller.recover(
            reason,
            discard=self.warehouse.delete,
            sweep=lambda keep, upto: self.warehouse.sweep(tables, keep, upto),
        )

    def apply_pipeline_changes(self) -> None:
        """What every injection does first (a run's or the barrier sensor's): tables and sinks that
        left the SQL files are retired, and the files of views rebuilt after a change are deleted."""
        self.changes.retire_removed()
        self.changes.delete_dropped()

    def start_epoch(self, run_id: str | None, partition: str | None) -> tuple[EpochRecord, RecoveryReport | None]:
        """The epoch a run works on (:meth:`EpochTaking.start_epoch`)."""
        return self.taking.start_epoch(run_id, partition)

    def take_epochs(self, run_id: str | None, partition: str | None, waiting: bool) -> RunEpochs:
        """The epochs a run of epoch_job works on, oldest first (:meth:`EpochTaking.take_epochs`)."""
        return self.taking.take_epochs(run_id, partition, waiting)

    def begin_step(self, epoch: int, run_id: str | None, **which: str) -> StepStart:
        """Begin a step (EpochAborted for an aborted epoch), then check the plans: a step of an
        aborted epoch fails before it starts Spark, and one that goes on never runs a refused plan."""
        # A step recorded for a backfill never takes the epoch from the run that owns it.
        begun = self.controller.epoch_log.begin_step(epoch, run_id, claim=self._record_backfill is None, **which)
        self.check_plans()
        return begun

    def _guard(self, epoch: int, step: Callable[[], StepReport]) -> StepReport:
        """Run a step under the epoch's lease (renewed while it runs, so a slow step is not taken
        for a dead one); a failure marks the epoch failed so the next run recovers, except that a
        process holding stale SQL gives the epoch back to the next run instead."""
        try:
            with self.controller.epoch_log.lease(epoch):
                return step()
        except EpochAborted:
            raise
        except (StaleStatements, StaleDeclarations):
            # This process read its SQL files before a newer one recorded other statements: the
            # process is out of date, not the epoch. It gives the epoch back to a run that reads
            # the files afresh (take_waiting), as take_epochs does when its own check finds it
            # stale; failing the epoch would start a recovery aborting every epoch in flight.
            try:
                self.controller.epoch_log.release(epoch)
            except Exception:  # the meta store itself may be what failed: the epoch timeout recovers it
                log.exception("could not give epoch %s back", epoch)
            raise
        except Exception as exc:
            aborted = False
            try:
                requested = self.controller.epoch_log.fail(epoch, f"{type(exc).__name__}: {exc}")
                aborted = not requested and self.controller.epoch_log.epoch(epoch).state is EpochState.ABORTED
            except Exception:  # the meta store itself may be what failed
                log.exception("could not record the failure of epoch %s", epoch)
            if aborted:
                # A recovery aborted the epoch and deleted its files under the step (Spark then
                # reports a missing file): that abort is what happened, not a failure of its own.
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery while this step ran ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); its records are re-read by a later "
                    "epoch. Run epoch_job without a partition to go on"
                ) from exc
            raise

    def collect(self, epoch: int, collected: Collected, garbage: list[str], release: bool) -> bool:
        if self._record_backfill is not None:
            self._record_backfill(collected)
            return True
        result = self.controller.epoch_log.collect(epoch, collected, release=release)
        if not result.recorded:
            # Someone committed this epoch first (committed data is immutable, ours is a duplicate),
            # or the table left the pipeline while this run wrote it: then its directory goes too,
            # as it went when the table left (what this write created under it is all that is there).
            self.warehouse.delete(garbage, prune_parents=True)
            if result.retired:
                self.warehouse.remove_empty_table_roots(garbage)
        if result.committed:  # the last table to collect commits the epoch
            fault_point("committed")
        return result.recorded

    # ------------------------------------------------------------------ sources

    def run_source(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        """``release``: end this process's claim on the epoch when the step is done. A run that goes
        on to the epoch's other steps keeps it, so its death between steps is noticed too."""
        return self._guard(epoch, lambda: self.source_steps.run(epoch, name, run_id, release))

    def record_idle(
        self, epoch: int, name: str, started: float, run_id: str | None, release: bool, dead_letters: int | None
    ) -> tuple[Collected, bool]:
        """Collect an empty change without a file (location None, 0 rows): what readers take as
        no change (``ViewSteps._upstream_delta``). Returns what was collected and whether it was recorded."""
        empty = Collected(name, None, 0, 0, dead_letters, None, time.time() - started, run_id)
        return empty, self.collect(epoch, empty, [], release)

    # ------------------------------------------------------------------ views

    def run_view(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        from epochal.checkpoint.backfills import log as backfill_log
        from epochal.checkpoint.backfills import rows as backfill_rows
        from epochal.checkpoint.statements import rebuilds
        from epochal.checkpoint.statements import views as definitions

        # (one transaction for all four: every view step of every epoch asks)
        rebuild, backfill, retired, stored = self.controller.backend.transaction(
            lambda cur: (
                rebuilds.read(cur, name),
                backfill_log.read(cur, name),
                backfill_rows.is_retired(cur, name),
                definitions.stored_statement(cur, name),
            )
        )
        if retired:
            return self._retired(epoch, name)
        if rebuild is not None and rebuild.state.active:
            if rebuild.state is rebuilds.RebuildState.SERVING_OLD or rebuild.switched_epoch == epoch:
                # Its statement changed: the old rows serve until the step that switches.
                return self._guard(epoch, lambda: self.rebuild_steps.run(epoch, name, run_id, release))
        if (
            backfill is not None
            and backfill.phase is BackfillPhase.JOINED
            and backfill.caught_up_epoch is not None
            and epoch <= backfill.caught_up_epoch
        ):
            # The epoch committed without the view while it backfilled, and its backfill then read
            # or wrote it (its snapshot epoch, or a log-store epoch) and joined before this step
            # came: the view's state already holds the epoch. Running the step would read state
            # from before the snapshot, which the view never had.
            return StepReport(name, epoch, {"epoch": epoch, "mode": "written by its backfill"})
        if backfill is not None and backfill.phase is not BackfillPhase.JOINED:
            # Outside commit alignment: the epoch commits without it, the backfill writes it later.
            return StepReport(
                name,
                epoch,
                {
                    "epoch": epoch,
                    "mode": "backfilling",
                    "phase": backfill.phase.shown,
                    "vnodes_done": backfill.vnodes_done,
                    "backfill_rows": backfill.rows_read,
                },
            )
        return self._guard(epoch, lambda: self.checked_view_epoch(epoch, name, run_id, release, stored))

    def checked_view_epoch(
        self, epoch: int, name: str, run_id: str | None, release: bool, stored: object = _UNREAD
    ) -> StepReport:
        """The view's step for ``epoch`` with this process's statement, refused when the view's
        state comes from another (``definitions.check_statement``): its rows would mix the two.
        ``stored``: what ``definitions.stored_statement`` said, if the caller asked already."""
        self.check_statement(name, stored)
        return self.view_epoch(epoch, name, run_id, release)

    def check_statement(self, name: str, stored: object = _UNREAD) -> None:
        """Refuse to compute view ``name`` with this process's statement when its state comes from
        another (``definitions.check_statement``). ``stored``: ``definitions.stored_statement``'s
        answer, if the caller read it already."""
        from epochal.checkpoint.statements import views as definitions

        definition = self.pipeline.views.get(name)
        if definition is None:
            return
        if stored is _UNREAD:
            stored = self.controller.backend.transaction(lambda cur: definitions.stored_statement(cur, name))
        fingerprint = view_fingerprint(definition)
        definitions.check_statement(stored, name, fingerprint, self.pipeline.loaded_at)  # type: ignore[arg-type]

    @staticmethod
    def _retired(epoch: int, name: str) -> StepReport:
        """The step of a table another process retired after this one read the pipeline: nothing to
        do (the epoch commits without it; the next run, with the pipeline as it is now, has no step)."""
        log.info("%s left the pipeline after this run read it: its step for epoch %s does nothing", name, epoch)
        return StepReport(name, epoch, {"epoch": epoch, "mode": "retired: no longer in the pipeline"})

    @contextmanager
    def recording_for_backfill(self, root: str, record: Callable[[Collected], None]) -> Iterator[None]:
        """Within the block, a view step writes its change under ``root`` (a backfill's directory,
        which recovery's sweep never lists) and hands what it collected to ``record`` instead of
        the epoch's collect: the backfill writes epochs that committed without the view."""
        self._per_thread.record_backfill, self._per_thread.backfill_root = record, root
        try:
            yield
        finally:
            self._per_thread.record_backfill, self._per_thread.backfill_root = None, None

    def view_epoch(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        """The view's step for ``epoch``, without the epoch's lease (``run_view`` holds it; the
        backfill runner writes committed epochs, which have none)."""
        return self.view_steps.run(epoch, name, run_id, release)

    # ------------------------------------------------------------------ commit

    def commit(self, epoch: int) -> StepReport:
        return self._guard(epoch, lambda: self._commit(epoch))

    def _commit(self, epoch: int) -> StepReport:
        started = time.time()
        by_this_call: list[int] = []
        delay = 0.05
        rechecked = retired_unknown = False
        while True:
            # The step's questions and, when it is done, the end of its claim: one transaction.
            # A barrier still waiting for its checkpoint is then bounded by the epoch timeout,
            # not by this process staying alive.
            step = self.controller.epoch_log.commit_step(epoch)
            if step.committed:
                fault_point("committed")
            by_this_call += step.committed
            record = step.record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(f"epoch {epoch} was aborted by a recovery before it could commit")
            if step.missing and record.state is not EpochState.COMMITTED:
                unknown = [t for t in step.missing if t not in self.pipeline.tables]
                if unknown and not retired_unknown:
                    # Not in this run's files: removed from them (no injection has retired it yet,
                    # e.g. the sensor's tick read the files before), or joined since they were read.
                    retired_unknown = True
                    self.changes.retire_removed()
                    continue
                if unknown:
                    raise EpochalError(
                        f"epoch {epoch} cannot commit: {', '.join(unknown)} joined the pipeline after this run "
                        "read its SQL files, and this run cannot write them. A recovery takes the epoch back, "
                        "and the next run, which reads the files afresh, computes it with them"
                    )
                if not self._written_by_live_runner(epoch, step.missing):
                    if not rechecked:  # (its runner may have written it, and let go, since this step read)
                        rechecked = True
                        continue
                    raise EpochalError(self._missing_message(epoch, step.missing))
            if step.released:
                break  # committed, or a barrier that commits with the next checkpoint
            # Collected by every table, behind older epochs that other runs are still working on.
            # Waiting for order is never a failure: only an older epoch that cannot finish ends it.
            stuck = self.controller.epoch_log.blocked_by(epoch)
            if stuck:
                raise OrderWaitAbandoned(
                    f"epoch {epoch} is collected but cannot commit before an older epoch that cannot finish "
                    f"({stuck}); the recovery this calls for aborts it. Run epoch_job without a partition to go on"
                )
            if time.time() - started > COMMIT_WAIT_S:
                self.controller.epoch_log.release(epoch)
                break  # the older epochs' runs commit it with theirs
            time.sleep(delay)
            delay = min(1.0, delay * 1.5)
        committed, in_flight = step.committed_epoch, step.in_flight
        return StepReport(
            "epoch_commit",
            epoch,
            {
                "epoch": epoch,
                "state": record.state.value,
                "kind": record.kind.value,
                "committed_epoch": committed,
                "committed_by_this_step": ", ".join(map(str, by_this_call)) or "none",
                "in_flight": len(in_flight),
                "lag_seconds": _lag_seconds(committed),
                "tables": len(self.controller.tables),
            },
        )

    def _written_by_live_runner(self, epoch: int, missing: list[str]) -> bool:
        """Whether every table ``epoch`` misses joined by backfill while it was in flight, and a
        live runner holds each one's backfill: the runner writes such epochs right after the join
        (and its collect commits the epoch), so this is a wait for order, not a failure."""
        from epochal.checkpoint.backfills import log as backfill_log

        handed = self.controller.backend.transaction(lambda cur: backfill_log.joined_before(cur, missing, epoch))
        return set(handed) == set(missing) and self.controller.backfills.held(handed) == sorted(handed)

    def _missing_message(self, epoch: int, missing: list[str]) -> str:
        """Why ``epoch`` cannot commit. A view that joined by backfill while the epoch was in flight
        had its live step skipped; its runner writes that epoch, and one killed first left it
        unwritten: no partition run can mend that, a recovery re-runs the epoch with the view."""
        from epochal.checkpoint.backfills import log as backfill_log

        handed = self.controller.backend.transaction(lambda cur: backfill_log.joined_before(cur, missing, epoch))
        if handed:
            return (
                f"epoch {epoch} cannot commit: {', '.join(handed)} joined the live flow while it was in flight, and "
                "the backfill runner that writes such epochs stopped before writing it. A recovery (the next run, "
                "or `epochal recover`) takes the epoch back and re-runs it with them"
            )
        return f"epoch {epoch} cannot commit: {', '.join(missing)} have not written it; materialize them first"

    # ------------------------------------------------------------------ sinks (epochal/runtime/sink_step.py)

    def sink(self, name: str) -> SinkTarget:
        """The target of sink ``name``, built from its options (``${ENV}`` values read now)."""
        return self.sink_steps.sink(name)

    def run_sink(self, epoch: int, name: str, run_id: str | None = None) -> StepReport:
        """Deliver the committed epochs up to ``epoch`` that sink ``name`` lacks (:class:`SinkSteps`)."""
        return self.sink_steps.run_sink(epoch, name, run_id)

    # ------------------------------------------------------------------ reading state

    def distribution_key(self, table: str) -> tuple[str, ...]:
        """The columns whose hash places ``table``'s rows in snapshot vnodes (``table_layout``)."""
        return table_layout.distribution_key(self.pipeline, self.old_versions, table)

    def read_state(
        self,
        table: str,
        epoch: int,
        inclusive: bool,
        restrict: "tuple[tuple[str, ...], DataFrame] | None" = None,
        cached: bool = True,
    ) -> tuple["DataFrame", int]:
        """``table``'s rows inside ``epoch`` and the stored rows read: ``StateReader.read_state``."""
        return self.reader.read_state(table, epoch, inclusive, restrict, cached)

    def query_schema(self, table: str) -> "StructType":
        """``table``'s columns and types as its query gives them (:class:`QuerySchemas`)."""
        return self.schemas.query_schema(table)

    def view_schema(self, view: "ViewDef") -> "StructType":
        return self.schemas.view_schema(view)

    def state(self, table: str, epoch: int | None = None) -> "DataFrame":
        """The rows of ``table`` as of committed ``epoch`` (default: the committed epoch), as Spark reads them."""
        table = self.table_name(table)
        committed = self.controller.epoch_log.committed_epoch()
        if committed is None:
            raise EpochalError(f"table {table} has no committed epoch yet: run epoch_job first")
        limit = committed if epoch is None else min(epoch, committed)
        return self.read_state(table, limit, inclusive=True)[0]

    def table_name(self, name: str) -> str:
        """The state table ``name`` means: names are case-insensitive, as in Spark, and the loader
        keeps them lowercased (CREATE MATERIALIZED VIEW DailyRev is the table dailyrev)."""
        tables = [*self.pipeline.tables, *(dead_letter_table(s) for s in self.pipeline.sources)]
        if name in tables:
            return name
        folded = {t.lower(): t for t in tables}
        if name.lower() in folded:
            return folded[name.lower()]
        # otherwise the catalog would report the epochs it has not written, as if it were late
        raise EpochalError(f"no table {name} in the pipeline: its tables are {', '.join(sorted(tables))}")

    def compact(
        self, epoch: int | None = None, tables: list[str] | None = None, every: int | None = None
    ) -> StepReport:
        """Snapshot the tables that need it; never raises for a table's failure (``table_layout``)."""
        return table_layout.compact(self, epoch, tables, every)
