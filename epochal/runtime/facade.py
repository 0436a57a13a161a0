"""What each node of the pipeline does for one epoch: the entry points that Dagster ops and assets,
the backfill runner and the CLI call. ``EpochRuntime`` builds the steps (one module per kind) and is
the ``StepContext`` they run in; it holds the epoch's lease around a step and routes a view's step.

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

import epochal.runtime.compaction_step as compaction_step
from epochal.checkpoint.backfills.state import BackfillPhase
from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import (
    Collected,
    EpochAborted,
    EpochRecord,
    EpochState,
    InvariantViolation,
    RecoveryReport,
    StepStart,
)
from epochal.checkpoint.statements.rebuilds import RebuildState
from epochal.checkpoint.statements.sources import StaleDeclarations
from epochal.checkpoint.statements.views import StaleStatements
from epochal.connectors.base import HoldsUpstreamLog, ReadsWithSpark, SourceConnector, SplitRange
from epochal.connectors.registry import connector_spec
from epochal.driver.sources import DriverSources
from epochal.driver.spark_conf import departures
from epochal.driver.views import DriverViews
from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.pipeline.fingerprints import view_fingerprint, view_statement
from epochal.pipeline.model import Pipeline
from epochal.runtime.check_step import CheckSteps
from epochal.runtime.commit_step import CommitStep
from epochal.runtime.epoch_taking import EpochTaking, RunEpochs
from epochal.runtime.pipeline_edits import PipelineEdits
from epochal.runtime.rebuild_step import RebuildSteps
from epochal.runtime.report import StepReport, measured, retired_report
from epochal.runtime.schemas import QuerySchemas
from epochal.runtime.sink_step import SinkSteps
from epochal.runtime.source_history import SourceHistory
from epochal.runtime.source_step import SourceSteps, source_declaration
from epochal.runtime.view_step import ViewSteps
from epochal.settings import Settings
from epochal.sinks.base import SinkTarget
from epochal.storage.driver_lookup import DriverLookup
from epochal.storage.durability import sync_written
from epochal.storage.state_cache import StateCache
from epochal.storage.state_reader import StateReader
from epochal.storage.warehouse import Warehouse, dead_letter_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from epochal.pipeline.model import ViewDef

log = logging.getLogger("epochal.runtime")


def controller_for(settings: Settings, pipeline: Pipeline) -> CheckpointController:
    """The checkpoint controller over ``settings``' meta store, told what ``pipeline`` holds."""
    return CheckpointController(
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
        statements={view_fingerprint(v): view_statement(v) for v in pipeline.views.values() if v.internal_of is None},
        declarations={name: source_declaration(source) for name, source in pipeline.sources.items()},
    )


class EpochRuntime:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        spark: Callable[[], SparkSession],
        controller: CheckpointController | None = None,
    ):
        self.settings = settings
        self.pipeline = pipeline
        self._spark_factory = spark
        self.controller = controller or controller_for(settings, pipeline)
        self.warehouse = Warehouse(settings.warehouse)
        # On a Spark Connect server, cached snapshots outlive the run (``StateCache``): the registry
        # of what is cached there is per Epochal home, like the server it manages.
        registry = settings.home / "spark" / "state_cache.json"
        self.state_cache = StateCache(enabled=settings.state_cache, registry=registry)
        self.reader = StateReader(
            lambda: self.spark,
            self.controller,
            self.warehouse,
            self.state_cache,
            self.query_schema,
            SourceHistory(self),
            DriverLookup(settings.driver_lookup_rows),
            lambda table: self.query_schema(table) if table in self.pipeline.sources else None,
        )
        #: small epochs' source and view steps computed on the driver (epochal/driver/)
        driver_rows = settings.driver_rows
        departed = departures(settings.spark_conf)
        if driver_rows and departed:
            log.warning("every step runs on Spark: the driver computes as Spark does only without %s", departed)
            driver_rows = 0
        self.driver_views = DriverViews(self.warehouse, self.controller, self.query_schema, driver_rows)
        self.driver_sources = DriverSources(self.warehouse, self.controller, self.query_schema, driver_rows)
        self._connectors: dict[str, SourceConnector] = {}
        self.schemas = QuerySchemas(self)
        #: old statements maintained while their views rebuild (:mod:`epochal.runtime.rebuild_step`),
        #: by name: their stages are not in the pipeline, yet read like its tables
        self.old_versions = self.schemas.old_versions
        # The steps, each on this runtime as its StepContext and on what it shares with another.
        self.source_steps = SourceSteps(self, self.driver_sources)
        self.view_steps = ViewSteps(self, self.driver_views)
        self.changes = PipelineEdits(
            self, note_old_versions=lambda rebuilds: self.rebuild_steps.note_old_versions(rebuilds)
        )
        self.rebuild_steps = RebuildSteps(self, self.view_steps, add_shadows=self.changes.add_shadows)
        self.commit_step = CommitStep(self, retire_removed=self.changes.retire_removed)
        self.check_steps = CheckSteps(self)
        self.sink_steps = SinkSteps(self, self.check_steps)
        self._plans_checked = False
        # A run's steps may run on several threads (``platform_defs.executor``): what one step sets
        # for itself (``recording_for_backfill``) is per thread, and lazy set-up happens once.
        self._per_thread = threading.local()
        self._lock = threading.RLock()
        self.taking = EpochTaking(
            self.controller,
            self.settings,
            check_plans=self.check_plans,
            recover=self.recover,
            apply_pipeline_changes=self.apply_pipeline_changes,
            plan=self.plan,
            attach_spark=lambda: self.spark,
        )

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
    def spark(self) -> SparkSession:
        return self._spark_factory()

    def connector(self, source: str) -> SourceConnector:
        with self._lock:
            if source not in self._connectors:
                definition = self.pipeline.sources[source]
                spec = connector_spec(definition.connector)
                if spec is None:
                    raise InvariantViolation(
                        f"source {source} has connector {definition.connector!r}, which the loader refuses"
                    )
                connector = spec.create(definition, self.settings.home)
                if isinstance(connector, ReadsWithSpark):  # postgres-cdc stages snapshot chunks as tasks
                    connector.bind_spark(lambda: self.spark)
                self._connectors[source] = connector
            return self._connectors[source]

    # ------------------------------------------------------------------ epochs

    def plan(self, source: str, starts: Mapping[str, int]) -> list[SplitRange]:
        self._release_committed_wal(source)
        return self.connector(source).plan(starts)

    def _release_committed_wal(self, source: str) -> None:
        """A connector that holds upstream WAL (postgres-cdc's slot: ``wal_holder``) may let go of
        what the committed epoch read: up to the lowest committed end among the sources that share
        it, never an in-flight epoch's (epochs are pipelined; a recovery reads those again)."""
        connector = self.connector(source)
        if not isinstance(connector, HoldsUpstreamLog):
            return
        committed = self.controller.committed_epoch()
        if committed is None:
            return
        ends = []
        for peer in self.pipeline.sources:
            other = self.connector(peer)
            if isinstance(other, HoldsUpstreamLog) and other.wal_holder == connector.wal_holder:
                ranges = self.controller.offsets(committed, peer)
                if not ranges:
                    return  # a table of the slot with nothing committed yet holds it where it is
                ends.append(other.wal_end(ranges))
        connector.release_wal(min(ends))

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

    def waiting_for_an_edit(self) -> str | None:
        """Why the barrier sensor should not inject now: the pipeline is stuck on a record one of its
        views cannot compute, and this process's SQL files have not changed that view; else None."""
        fingerprints = {name: view_fingerprint(view) for name, view in self.pipeline.views.items()}
        return self.controller.waiting_for_an_edit(fingerprints)

    # ------------------------------------------------------------------ StepContext: begin, collect

    def begin_step(self, epoch: int, run_id: str | None, **which: str) -> StepStart:
        """Begin a step (EpochAborted for an aborted epoch), then check the plans: a step of an
        aborted epoch fails before it starts Spark, and one that goes on never runs a refused plan."""
        # A step recorded for a backfill never takes the epoch from the run that owns it.
        begun = self.controller.begin_step(epoch, run_id, claim=self._record_backfill is None, **which)
        self.check_plans()
        return begun

    def collect(self, epoch: int, collected: Collected, garbage: list[str], release: bool) -> bool:
        if self._record_backfill is not None:
            self._record_backfill(collected)  # (its snapshot is synced when it is published)
            return True
        # on the disk before the meta store records them: a committed epoch never names lost files
        sync_written(self.warehouse, [collected.location, collected.dead_letter_location])
        result = self.controller.collect(epoch, collected, release=release)
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

    def record_idle(
        self, epoch: int, name: str, started: float, run_id: str | None, release: bool, dead_letters: int | None
    ) -> tuple[Collected, bool]:
        """Collect an empty change without a file (location None, 0 rows): what readers take as
        no change (``ViewSteps._upstream_delta``). Returns what was collected and whether it was recorded."""
        empty = Collected(name, None, 0, 0, dead_letters, None, time.time() - started, run_id)
        return empty, self.collect(epoch, empty, [], release)

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

    def _guard(self, epoch: int, step: Callable[[], StepReport]) -> StepReport:
        """Run a step under the epoch's lease (renewed while it runs, so a slow step is not taken
        for a dead one); a failure marks the epoch failed so the next run recovers, except that a
        process holding stale SQL gives the epoch back to the next run instead."""
        try:
            with self.controller.lease(epoch):
                return step()
        except EpochAborted:
            raise
        except (StaleStatements, StaleDeclarations):
            # This process read its SQL files before a newer one recorded other statements: the
            # process is out of date, not the epoch. It gives the epoch back to a run that reads
            # the files afresh (take_waiting), as take_epochs does when its own check finds it
            # stale; failing the epoch would start a recovery aborting every epoch in flight.
            try:
                self.controller.release(epoch)
            except Exception:  # the meta store itself may be what failed: the epoch timeout recovers it
                log.exception("could not give epoch %s back", epoch)
            raise
        except Exception as exc:
            aborted = False
            try:
                requested = self.controller.fail(epoch, f"{type(exc).__name__}: {exc}")
                aborted = not requested and self.controller.epoch(epoch).state is EpochState.ABORTED
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

    # ------------------------------------------------------------------ the steps

    def run_source(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        """``release``: end this process's claim on the epoch when the step is done. A run that goes
        on to the epoch's other steps keeps it, so its death between steps is noticed too."""
        return measured(self._guard(epoch, lambda: self.source_steps.run(epoch, name, run_id, release)))

    def run_view(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        return measured(self._routed_view(epoch, name, run_id, release))

    def _routed_view(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        """The view's step, routed by what the meta store says of it (one transaction, every step
        asks): retired, rebuilding its changed statement, written by its backfill, or backfilling."""
        facts = self.controller.view_step_facts(name)
        if facts.retired:
            return retired_report(epoch, name)
        rebuild, backfill = facts.rebuild, facts.backfill
        if rebuild is not None and rebuild.state.active:
            if rebuild.state is RebuildState.SERVING_OLD or rebuild.switched_epoch == epoch:
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

        def checked() -> StepReport:
            # (through ``view_epoch``, the one seam for a view's epoch, which the backfill runner uses too)
            self.view_steps.check_statement(name, facts.stored)
            return self.view_epoch(epoch, name, run_id, release)

        return self._guard(epoch, checked)

    def check_statement(self, name: str) -> None:
        """Refuse to compute view ``name`` with this process's statement when its state comes from
        another (:meth:`ViewSteps.check_statement`)."""
        self.view_steps.check_statement(name)

    def view_epoch(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        """The view's step for ``epoch``, without the epoch's lease (``run_view`` holds it; the
        backfill runner writes committed epochs, which have none)."""
        return self.view_steps.run(epoch, name, run_id, release)

    def commit(self, epoch: int) -> StepReport:
        report = measured(self._guard(epoch, lambda: self.commit_step.run(epoch)))
        if report.metadata.get("state") == "COMMITTED" and self.pipeline.checks:
            # After the commit, before the sinks (they run after this step): every check at each
            # epoch this step committed (older ones waiting for order commit with it), and this one.
            by_this_step = str(report.metadata.get("committed_by_this_step", "none"))
            epochs = sorted({epoch, *(int(e) for e in by_this_step.split(", ") if e.isdigit())})
            try:
                report.checks = [r for e in epochs for r in self.check_steps.evaluate_epoch(e)]
            except EpochalError as error:
                # The epoch is committed whatever a check says; a sink downstream evaluates the
                # check again before it delivers, and fails there, with this error, if it still fails.
                log.warning("%s", error)
                report.metadata["checks_error"] = str(error)
            failed = [f"{r.check}@{r.epoch}" if len(epochs) > 1 else r.check for r in report.checks if not r.passed]
            report.metadata["checks_failed"] = ", ".join(failed) or "none"
        return report

    def sink(self, name: str) -> SinkTarget:
        """The target of sink ``name``, built from its options (``${ENV}`` values read now)."""
        return self.sink_steps.sink(name)

    def run_sink(self, epoch: int, name: str, run_id: str | None = None) -> StepReport:
        """Deliver the committed epochs up to ``epoch`` that sink ``name`` lacks (:class:`SinkSteps`)."""
        return measured(self.sink_steps.run_sink(epoch, name, run_id))

    def compact(
        self, epoch: int | None = None, tables: list[str] | None = None, every: int | None = None
    ) -> StepReport:
        """Snapshot the tables that need it; never raises for a table's failure (``compaction_step``)."""
        return compaction_step.compact(self, self.driver_views.max_rows > 0, epoch, tables, every)

    # ------------------------------------------------------------------ StepContext: reading state

    def distribution_key(self, table: str) -> tuple[str, ...]:
        """The columns whose hash places ``table``'s rows in snapshot vnodes (``compaction_step``)."""
        return compaction_step.distribution_key(self.pipeline, self.old_versions, table)

    def read_state(
        self,
        table: str,
        epoch: int,
        inclusive: bool,
        restrict: tuple[tuple[str, ...], DataFrame] | None = None,
        cached: bool = True,
        keys_at_most: int | None = None,
    ) -> tuple[DataFrame, int]:
        """``table``'s rows inside ``epoch`` and the stored rows read: ``StateReader.read_state``."""
        return self.reader.read_state(table, epoch, inclusive, restrict, cached, keys_at_most=keys_at_most)

    def query_schema(self, table: str) -> StructType:
        """``table``'s columns and types as its query gives them (:class:`QuerySchemas`)."""
        return self.schemas.query_schema(table)

    def view_schema(self, view: ViewDef) -> StructType:
        return self.schemas.view_schema(view)

    def state(self, table: str, epoch: int | None = None) -> DataFrame:
        """The rows of ``table`` as of committed ``epoch`` (default: the committed epoch), as Spark reads them."""
        table = self.table_name(table)
        committed = self.controller.committed_epoch()
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
