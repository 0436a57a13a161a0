"""What each node of the pipeline does for one epoch: the steps that Dagster ops and assets call.

Dagster-free: the Dagster shell (``platform_defs``) only maps runs and partitions onto these
functions and their returned metadata onto materializations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from epochal.connectors.base import SourceConnector, SplitRange
from epochal.controller import (
    CheckpointController,
    Collected,
    EpochAborted,
    EpochRecord,
    EpochState,
    RecoveryReport,
    Snapshot,
    StateParts,
)
from epochal.epoch import epoch_physical_ms
from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.incremental.binding import sql_over, tables_read
from epochal.pipeline.model import Pipeline
from epochal.settings import Settings
from epochal.sinks.duckdb_sink import DuckDBSink
from epochal.storage.changes import net_rows, signed_parts, unit_changes
from epochal.storage.state_cache import StateCache
from epochal.storage.warehouse import WEIGHT, Warehouse, dead_letter_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("epochal.runtime")

# How long a commit step waits for an older epoch (owned by another run) to commit first.
COMMIT_WAIT_S = 120.0


@dataclass
class StepReport:
    asset: str
    epoch: int
    #: plain values (int/float/str/bool/None) for logs, status and Dagster metadata
    metadata: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.asset}@{self.epoch}: " + ", ".join(f"{k}={v}" for k, v in self.metadata.items())


def _lag_seconds(epoch: int | None) -> float | None:
    return None if epoch is None else round(time.time() - epoch_physical_ms(epoch) / 1000, 3)


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
            settings, sources=list(pipeline.sources), views=pipeline.view_order(), sinks=list(pipeline.sinks)
        )
        self.warehouse = Warehouse(settings.warehouse)
        self.state_cache = StateCache(enabled=settings.state_cache)
        self._connectors: dict[str, SourceConnector] = {}
        self._query_schemas: dict[str, "StructType"] = {}

    def close(self) -> None:
        """Release what this runtime holds in the Spark session (its cached snapshots)."""
        if "spark" in self.__dict__:  # never start Spark just to close it
            self.state_cache.clear()

    @cached_property
    def spark(self) -> "SparkSession":
        return self._spark_factory()

    def connector(self, source: str) -> SourceConnector:
        if source not in self._connectors:
            from epochal.connectors.registry import connector_spec

            definition = self.pipeline.sources[source]
            spec = connector_spec(definition.connector)
            assert spec is not None, "the loader rejects unknown connectors"
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

    def start_epoch(self, run_id: str | None, partition: str | None) -> tuple[EpochRecord, RecoveryReport | None]:
        """The epoch a run works on: the one its partition names, or a newly injected one.

        Without a partition this is the barrier worker's loop body: recover if anything needs it,
        then inject the next epoch, claimed by this process so its death is noticed."""
        if partition is not None:
            try:
                epoch = int(partition)
            except ValueError:
                raise EpochalError(f"partition key {partition!r} is not an epoch number") from None
            record = self.controller.begin_step(epoch, run_id).record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery and cannot run again: its records are re-read "
                    "by a later epoch. Run epoch_job without a partition to go on"
                )
            return record, None
        report = None
        reason = self.controller.recovery_reason()
        if reason:
            report = self.recover(reason)
        return self.controller.inject(self.plan, run_id=run_id, claim=True), report

    def _guard(self, epoch: int, step: Callable[[], StepReport]) -> StepReport:
        """Run a step; a failure marks the epoch failed so the next run recovers."""
        try:
            return step()
        except EpochAborted:
            raise
        except Exception as exc:
            try:
                self.controller.fail(epoch, f"{type(exc).__name__}: {exc}")
            except Exception:  # the meta store itself may be what failed
                log.exception("could not record the failure of epoch %s", epoch)
            raise

    def _collect(self, epoch: int, collected: Collected, garbage: list[str], release: bool) -> bool:
        result = self.controller.collect(epoch, collected, release=release)
        if not result.recorded:
            # Someone committed this epoch first; committed data is immutable, ours is a duplicate.
            self.warehouse.delete(garbage)
        if result.committed:  # the last table to collect commits the epoch
            fault_point("committed")
        return result.recorded

    # ------------------------------------------------------------------ sources

    def run_source(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        """``release``: end this process's claim on the epoch when the step is done. A run that goes
        on to the epoch's other steps keeps it, so its death between steps is noticed too."""
        return self._guard(epoch, lambda: self._run_source(epoch, name, run_id, release))

    def _run_source(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        started = time.time()
        ranges = self.controller.begin_step(epoch, run_id, source=name).offsets
        if not any(r.count > 0 for r in ranges):
            return self._idle_source(epoch, name, ranges, started, run_id, release)
        batch = self.connector(name).read(self.spark, ranges)
        location = self.warehouse.new_location(name, epoch)
        written: list[str] = [location]
        change = self._source_change(epoch, name, batch.rows)
        try:
            rows = self.warehouse.write(change, location)
            dead = 0
            dlq_location = None
            # Almost every epoch has no dead letters: asking first (a job over the epoch's lines that
            # writes nothing) is cheaper than writing an empty Parquet dataset and deleting it again.
            if batch.rejected is not None and not batch.rejected.isEmpty():
                dlq_location = self.warehouse.new_location(dead_letter_table(name), epoch)
                written.append(dlq_location)
                dead = self.warehouse.write(batch.dead_letters, dlq_location)
                log.warning("%s epoch %s: %d record(s) went to %s", name, epoch, dead, dead_letter_table(name))
            records = sum(r.count for r in ranges)
            collected = Collected(name, location, records, rows, dead, dlq_location, time.time() - started, run_id)
            recorded = self._collect(epoch, collected, written, release)
        except EpochAborted:
            self.warehouse.delete(written)
            raise
        fault_point("source-written")
        return self._source_report(epoch, ranges, collected, started, recorded)

    def _idle_source(
        self, epoch: int, name: str, ranges: list[SplitRange], started: float, run_id: str | None, release: bool
    ) -> StepReport:
        """An epoch with no record for the source: its change is empty, recorded without a file and
        without a Spark job (readers take a missing location as no change, ``_upstream_delta``).
        A pipeline whose sources are quiet then pays no Parquet write per source per epoch."""
        empty, recorded = self._record_idle(epoch, name, started, run_id, release, dead_letters=0)
        fault_point("source-written")
        return self._source_report(epoch, ranges, empty, started, recorded)

    def _record_idle(
        self, epoch: int, name: str, started: float, run_id: str | None, release: bool, dead_letters: int | None
    ) -> tuple[Collected, bool]:
        """Collect an empty change without a file (location None, 0 rows): what readers take as
        no change (``_upstream_delta``). Returns what was collected and whether it was recorded."""
        empty = Collected(name, None, 0, 0, dead_letters, None, time.time() - started, run_id)
        return empty, self._collect(epoch, empty, [], release)

    @staticmethod
    def _source_report(
        epoch: int, ranges: list[SplitRange], collected: Collected, started: float, recorded: bool
    ) -> StepReport:
        """A source step's metadata, from what it collected."""
        return StepReport(
            collected.asset,
            epoch,
            {
                "epoch": epoch,
                "records_read": collected.rows_in,
                "rows_out": collected.rows_out,
                "dead_letters": collected.dead_letters,
                "splits": len(ranges),
                "offsets": ", ".join(f"{r.split}:[{r.start},{r.end})" for r in ranges) or "no split yet",
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _source_change(self, epoch: int, name: str, records: "DataFrame") -> "DataFrame":
        """The epoch's change of a source: its records as inserts, or, for a source with a PRIMARY
        KEY, upserts and deletes resolved against the source's state before this epoch."""
        from pyspark.sql import functions as F

        source = self.pipeline.sources[name]
        if not source.primary_key:
            return records.withColumn(WEIGHT, F.lit(1).cast("bigint"))
        from epochal.upsert import upsert_changes

        columns = list(source.column_names)
        # Only the previous rows of the keys this epoch touches matter, and the primary key is the
        # source's distribution key: the read opens just those keys' vnodes of the snapshot.
        touched = records.select(*_quoted(source.primary_key))
        previous, _ = self.read_state(name, epoch, inclusive=False, restrict=(tuple(source.primary_key), touched))
        if previous is None:
            previous = self.spark.createDataFrame([], records.select(*columns).schema)
        return upsert_changes(records, previous, source.primary_key, columns)

    # ------------------------------------------------------------------ views

    def run_view(self, epoch: int, name: str, run_id: str | None = None, release: bool = False) -> StepReport:
        view = self.pipeline.views[name]
        if view.refresh == "full":
            return self._guard(epoch, lambda: self._run_view_full(epoch, name, run_id, release))
        if view.plan is not None and view.plan.kind == "keyed":
            return self._guard(epoch, lambda: self._run_view_keyed(epoch, name, run_id, release))
        return self._guard(epoch, lambda: self._run_view(epoch, name, run_id, release))

    def _run_view_keyed(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        """A view with state: its change is recomputed at the keys the epoch touched, reading only
        the state at those keys (:mod:`epochal.incremental.keyed`)."""
        from epochal.incremental.keyed import keyed_change
        from epochal.incremental.partial import partial_change
        from epochal.incremental.planner import PARTIAL_RULE

        started = time.time()
        view = self.pipeline.views[name]
        assert view.plan is not None
        begun = self.controller.begin_step(epoch, run_id, table=name)
        collected, first = begun.collected, not begun.written_before
        rows_in = self._rows_in(epoch, name, collected)
        if rows_in == 0 and not first:
            return self._idle_view(epoch, name, started, run_id, release)
        deltas = {u: self._upstream_delta(epoch, name, u, collected) for u in view.upstreams}

        def read(table: str, inclusive: bool, restrict):
            return self.read_state(table, epoch, inclusive, restrict)

        if view.plan.rule == PARTIAL_RULE:
            change = partial_change(self.spark, view.plan, name, view.columns, deltas, read, self.query_schema(name))
        else:
            changed = frozenset(u for u in view.upstreams if collected[u].rows_out)
            # The view's first epoch has no rows before it: a one-partition query over empty inputs
            # still returns a row (count(*) = 0), which must not be retracted from a view never
            # written. (A partial aggregate reads its own rows, so it needs no such flag.)
            change = keyed_change(self.spark, view.plan, view.columns, deltas, read, changed, first)
        try:
            rows, recorded = self._publish_view_change(
                epoch, name, unit_changes(change.weighted), rows_in, started, run_id, release
            )
        finally:
            change.release()
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "plan": f"{view.plan.rule} keyed by {', '.join(view.plan.key_classes) or 'nothing (one partition)'}",
                "rows_in": rows_in,
                "rows_changed": rows,
                "state_rows_read": change.state_rows_read,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _run_view_full(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        """refresh = 'full': recompute the view over its inputs' state at this epoch, and emit the
        difference from its previous state as the epoch's change. Correct for any query; costs a
        full recompute plus a diff, growing with the tables rather than with the change."""
        from pyspark.sql import functions as F

        started = time.time()
        view = self.pipeline.views[name]
        self.controller.begin_step(epoch, run_id)
        rows_read = 0
        states = {}
        for upstream in view.upstreams:
            state, read = self.read_state(upstream, epoch, inclusive=True)
            rows_read += read
            assert state is not None, "an upstream collected this epoch, so it has at least one epoch"
            states[upstream] = state
        new = sql_over(self.spark, view.query, states).toDF(*view.columns).withColumn(WEIGHT, F.lit(1).cast("bigint"))
        # The view's own previous state, negated: unit_changes nets it with the new rows anyway,
        # so it is read un-netted (snapshot + later changes) and aggregated only once.
        previous, own_read = self._read_weighted(self.controller.state_parts(name, epoch, inclusive=False), None)
        rows_read += own_read
        weighted = new
        if previous is not None:
            negated = -F.col(WEIGHT) if WEIGHT in previous.columns else F.lit(-1).cast("bigint")
            weighted = new.unionByName(previous.select(*_quoted(view.columns), negated.alias(WEIGHT)))
        change = unit_changes(weighted)
        rows, recorded = self._publish_view_change(epoch, name, change, rows_read, started, run_id, release)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "full",
                "state_rows_read": rows_read,
                "rows_changed": rows,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _rows_in(self, epoch: int, view: str, collected: Mapping[str, Collected]) -> int:
        """Rows the view's upstreams changed in the epoch; raises when one has not run it yet."""
        for upstream in self.pipeline.views[view].upstreams:
            if upstream not in collected:
                raise _not_written(view, upstream, epoch)
        return sum((collected[u].rows_out or 0) for u in self.pipeline.views[view].upstreams)

    def _idle_view(self, epoch: int, name: str, started: float, run_id: str | None, release: bool) -> StepReport:
        """An incremental view whose inputs did not change, after its first epoch: its change is
        empty by construction (linear over nothing, or the same keys before and after), so it is
        recorded like an idle source, without a file and without a Spark job. A quiet pipeline
        then costs a few meta-store transactions per view per epoch, not a Parquet commit each."""
        _, recorded = self._record_idle(epoch, name, started, run_id, release, dead_letters=None)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "rows_in": 0,
                "rows_changed": 0,
                "state_rows_read": 0,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _upstream_delta(self, epoch: int, view: str, upstream: str, collected: Mapping[str, Collected]) -> "DataFrame":
        from pyspark.sql.types import LongType, StructField, StructType

        entry = collected.get(upstream)
        if entry is not None and entry.location is None and entry.rows_out == 0:
            # An idle epoch (_idle_source, _idle_view): no file, no change. A location that
            # compaction cleared has rows and still raises below.
            weighted = StructType([*self.query_schema(upstream).fields, StructField(WEIGHT, LongType())])
            return self.spark.createDataFrame([], weighted)
        if entry is None or entry.location is None:
            raise _not_written(view, upstream, epoch)
        return self.warehouse.read(self.spark, [entry.location])

    def _run_view(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        from pyspark.sql import functions as F

        started = time.time()
        view = self.pipeline.views[name]
        begun = self.controller.begin_step(epoch, run_id, table=name)
        rows_in = self._rows_in(epoch, name, begun.collected)
        if rows_in == 0 and begun.written_before:
            return self._idle_view(epoch, name, started, run_id, release)
        deltas = {u: self._upstream_delta(epoch, name, u, begun.collected) for u in view.upstreams}
        # The view's operators are linear (filter, project, UNION ALL), so the change of the output
        # is the query over the inserted rows minus the query over the deleted rows. When the planner
        # split the view, its query reads the stages that keep the state instead of the text as written.
        query = view.plan.query if view.plan is not None and view.plan.query else view.query
        signed = []
        for sign, rows in signed_parts(deltas):
            out = sql_over(self.spark, query, rows).toDF(*view.columns)
            if view.plan is not None and view.plan.typed_like_query:
                out = out.select(
                    *(F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in self.query_schema(name).fields)
                )
            signed.append(out.withColumn(WEIGHT, F.lit(sign).cast("bigint")))
        change = signed[0].unionByName(signed[1])
        rows, recorded = self._publish_view_change(epoch, name, change, rows_in, started, run_id, release)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "rows_in": rows_in,
                "rows_out": rows,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _publish_view_change(
        self,
        epoch: int,
        name: str,
        change: "DataFrame",
        rows_in: int,
        started: float,
        run_id: str | None,
        release: bool,
    ) -> tuple[int, bool]:
        """Write a view's change for the epoch and collect it; returns (rows written, recorded)."""
        location = self.warehouse.new_location(name, epoch)
        try:
            rows = self.warehouse.write(change, location)
            recorded = self._collect(
                epoch,
                Collected(name, location, rows_in, rows, None, None, time.time() - started, run_id),
                [location],
                release,
            )
        except EpochAborted:
            self.warehouse.delete([location])
            raise
        return rows, recorded

    # ------------------------------------------------------------------ commit

    def commit(self, epoch: int) -> StepReport:
        return self._guard(epoch, lambda: self._commit(epoch))

    def _commit(self, epoch: int) -> StepReport:
        started = time.time()
        by_this_call: list[int] = []
        while True:
            # The step's questions and, when it is done, the end of its claim: one transaction.
            # A barrier still waiting for its checkpoint is then bounded by the epoch timeout,
            # not by this process staying alive.
            step = self.controller.commit_step(epoch)
            if step.committed:
                fault_point("committed")
            by_this_call += step.committed
            record = step.record
            if record.state is EpochState.ABORTED:
                raise EpochAborted(f"epoch {epoch} was aborted by a recovery before it could commit")
            if step.missing and record.state is not EpochState.COMMITTED:
                raise EpochalError(
                    f"epoch {epoch} cannot commit: {', '.join(step.missing)} have not written it; materialize "
                    "them for this partition first"
                )
            if step.released:
                break  # committed, or a barrier that commits with the next checkpoint
            older = [r.epoch for r in step.in_flight if r.epoch < epoch]
            if time.time() - started > COMMIT_WAIT_S:
                raise EpochalError(
                    f"epoch {epoch} is collected but older epoch(s) {older} have not committed after "
                    f"{COMMIT_WAIT_S:.0f}s; their runs may be stuck: see `epochal status`"
                )
            time.sleep(0.2)  # an older epoch's run is finishing; ours commits right after it
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

    # ------------------------------------------------------------------ sinks

    def sink(self, name: str) -> DuckDBSink:
        definition = self.pipeline.sinks[name]
        upstream = definition.from_table
        columns = list(
            self.pipeline.views[upstream].columns
            if upstream in self.pipeline.views
            else self.pipeline.sources[upstream].column_names
        )
        return DuckDBSink(name, definition.options, columns, self.settings.home)

    def run_sink(self, epoch: int, name: str, run_id: str | None = None) -> StepReport:
        # A sink failure does not fail the epoch: the epoch is committed, the sink catches up later.
        started = time.time()
        record = self.controller.epoch(epoch)
        if record.state is EpochState.ABORTED:
            raise EpochAborted(f"epoch {epoch} was aborted by a recovery; sinks only deliver committed epochs")
        sink = self.sink(name)
        upstream = self.pipeline.sinks[name].from_table
        committed = self.controller.committed_epoch()
        target = min(epoch, committed) if committed is not None else None
        delivered_before = sink.delivered_epoch()
        # Restart path of the seed's coordinator: PENDING epochs the target already holds are committed.
        for pending, state in self.controller.sink_state(name).items():
            if state == "PENDING" and delivered_before is not None and pending <= delivered_before:
                self.controller.mark_sink(name, pending, "COMMITTED")
        inserted = deleted = epochs = 0
        if target is not None:
            # ``after``: change files compaction deleted are never needed (retention waits for the
            # sink), unless the sink lost its progress, which is then an error, not a silent gap.
            # Idle epochs of a source (no file) are delivered too, as nothing: the sink's progress
            # then says it holds everything up to the target, not the last epoch that had rows.
            to_deliver = self.controller.committed_locations(upstream, upto=target, after=delivered_before, idle=True)
            for e, location in to_deliver:
                if delivered_before is not None and e <= delivered_before:
                    continue
                self.controller.mark_sink(name, e, "PENDING")
                delivery = sink.deliver(e, [] if location is None else self.warehouse.parquet_files(location))
                self.controller.mark_sink(name, e, "COMMITTED", delivery.rows_inserted + delivery.rows_deleted)
                inserted += delivery.rows_inserted
                deleted += delivery.rows_deleted
                epochs += not delivery.skipped
        delivered = sink.delivered_epoch()
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "epochs_delivered": epochs,
                "rows_inserted": inserted,
                "rows_deleted": deleted,
                "delivered_epoch": delivered,
                "committed_epoch": committed,
                "waiting_for_commit": committed is None or epoch > committed,
                "target": f"{sink.database}:{sink.table}",
                "target_rows": sink.row_count(),
                "seconds": round(time.time() - started, 3),
            },
        )

    # ------------------------------------------------------------------ reading state

    def distribution_key(self, table: str) -> tuple[str, ...]:
        """The columns whose hash places ``table``'s rows in snapshot vnodes. A read restricted by
        exactly these columns opens only the restriction keys' vnodes (``read_state``), so they are
        the columns the table is most often read by: a source's PRIMARY KEY (every epoch of a keyed
        source looks up its previous rows by it), else the key the first incremental view that
        reads the whole table restricts it by, else () meaning every column."""
        source = self.pipeline.sources.get(table)
        if source is not None and source.primary_key:
            return tuple(source.primary_key)
        own = self.pipeline.views[table].plan if table in self.pipeline.views else None
        if own is not None and own.aggregate is not None:
            return own.aggregate.groups  # every epoch reads its own rows at the groups it touches
        for name in self.pipeline.view_order():
            plan = self.pipeline.views[name].plan
            for leaf in plan.leaves if plan is not None else ():
                if leaf.table == table and leaf.key:
                    return tuple(k.strip("`") for k in leaf.key)
        return ()

    def read_state(
        self,
        table: str,
        epoch: int,
        inclusive: bool,
        restrict: "tuple[tuple[str, ...], DataFrame] | None" = None,
    ) -> tuple["DataFrame | None", int]:
        """``table``'s rows as seen inside ``epoch`` (with that epoch's change when ``inclusive``),
        and how many stored rows were read to get them; a table without change files
        (none ran, or every one was idle) is empty, with its columns.

        The rows are the newest snapshot at or before the epoch plus the change files after it
        (committed or in flight, ``controller.state_parts``), never older change files.
        ``restrict = (columns, keys)`` keeps only rows whose ``columns`` equal (null-safe) a row of
        the small DataFrame ``keys``; it is applied before netting, and when ``columns`` is the
        snapshot's distribution key only the keys' vnode directories of the snapshot are read.

        Views and keyed sources read their inputs through this one function, so how state is
        stored (change files, snapshots) is decided here and nowhere else."""
        weighted, rows_read = self._read_weighted(self.controller.state_parts(table, epoch, inclusive), restrict)
        if weighted is None:
            # No change file yet (every epoch so far was idle, or none ran): the table is empty.
            return self._empty_rows(table), 0
        if WEIGHT not in weighted.columns:
            return weighted, rows_read  # a snapshot alone is already net: no aggregation
        return net_rows(weighted), rows_read

    def _empty_rows(self, table: str) -> "DataFrame":
        """No rows, with the table's columns: what a table without change files holds."""
        return self.spark.createDataFrame([], self.query_schema(table))

    def query_schema(self, table: str) -> "StructType":
        """``table``'s columns and types as its query, as written, gives them: Spark analyses the
        query over empty inputs of its upstreams' schemas (no job runs). Remembered per runtime."""
        if table in self._query_schemas:
            return self._query_schemas[table]
        if table in self.pipeline.sources:
            schema = self._declared_schema(table)
        else:
            view = self.pipeline.views[table]
            # The query as written, over empty inputs: analysed, never run (no Spark job). A view
            # the planner split reads its stages, but its query as written reads their inputs.
            known = [*self.pipeline.sources, *self.pipeline.views]
            inputs = {t: self.spark.createDataFrame([], self.query_schema(t)) for t in tables_read(view.query, known)}
            schema = sql_over(self.spark, view.query, inputs).toDF(*view.columns).schema
        self._query_schemas[table] = schema
        return schema

    def _declared_schema(self, source: str) -> "StructType":
        """The source's declared columns and types, as Spark's parser reads the DDL (once per
        source and runtime: ``query_schema`` remembers it)."""
        ddl = ", ".join(f"`{c.name}` {c.type}" for c in self.pipeline.sources[source].columns)
        return self.spark.createDataFrame([], ddl).schema

    def state(self, table: str, epoch: int | None = None) -> "DataFrame":
        """The rows of ``table`` as of committed ``epoch`` (default: the committed epoch), as Spark reads them."""
        committed = self.controller.committed_epoch()
        limit = committed if epoch is None or committed is None else min(epoch, committed)
        rows = None if limit is None else self.read_state(table, limit, inclusive=True)[0]
        if rows is None:
            raise EpochalError(f"table {table} has no committed epoch yet: run epoch_job first")
        return rows

    def _read_weighted(
        self, parts: StateParts, restrict: "tuple[tuple[str, ...], DataFrame] | None"
    ) -> tuple["DataFrame | None", int]:
        """The rows ``parts`` add up to, not yet netted, with rows read. Without change files this is
        the snapshot as it is (no ``_weight`` column: every row counts once); otherwise the snapshot
        rows with weight +1 followed by the changes."""
        from pyspark.sql import functions as F

        if parts.snapshot is None and not parts.changes:
            return None, 0
        base, rows_read = (None, 0) if parts.snapshot is None else self._read_snapshot(parts.snapshot, restrict)
        if not parts.changes:
            return base, rows_read
        locations = [loc for _, loc in parts.changes]
        changes, change_rows = self.warehouse.read_counted(self.spark, locations)
        rows_read += change_rows
        if restrict is not None:
            changes = _semi_join(changes, restrict)
        if base is not None:
            changes = base.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(changes)
        return changes, rows_read

    def _read_snapshot(
        self, snapshot: Snapshot, restrict: "tuple[tuple[str, ...], DataFrame] | None"
    ) -> tuple["DataFrame", int]:
        import json

        from pyspark.sql.types import StructType

        from epochal.storage.vnode import vnode_column

        schema = StructType.fromJson(json.loads(snapshot.spark_schema))
        if snapshot.rows == 0:
            return self.spark.createDataFrame([], schema), 0
        if restrict is not None:
            _check_restriction(snapshot.table, schema, restrict[0], restrict[1])
            small = self.state_cache.small_and_cached(snapshot.table, snapshot.location, snapshot.rows)
            if small is not None:
                return _semi_join(small, restrict), snapshot.rows
        dirs = self.warehouse.vnode_dirs(snapshot.location)
        chosen: list[int] | None = None  # None: every vnode
        if restrict is not None and tuple(restrict[0]) == tuple(snapshot.distribution_key or schema.fieldNames()):
            # At most 256 small ints come to the driver: which vnode directories hold the keys.
            columns, keys = restrict
            typed = _typed_keys(schema, columns, keys, names=list(columns))
            vnodes = [r[0] for r in typed.select(vnode_column(schema, snapshot.distribution_key)).distinct().collect()]
            chosen = [v for v in sorted(vnodes) if v in dirs]
            if not chosen:
                return self.spark.createDataFrame([], schema), 0
        wanted = sorted(dirs) if chosen is None else chosen
        if self.state_cache.worth_caching(len(wanted), len(dirs)):
            # Most of the snapshot is read anyway: scan it from memory (filled on first use).
            rows = self.state_cache.get(snapshot.table, snapshot.location)
            if rows is None:
                files = self.warehouse.all_snapshot_files(snapshot.location)
                rows = self.state_cache.put(snapshot.table, snapshot.location, self._parquet_rows(schema, files))
            rows_read = snapshot.rows
        else:
            files = [f for v in wanted for f in self.warehouse.parquet_files(dirs[v])]
            rows_read = snapshot.rows if chosen is None else self.warehouse.files_row_count(files)
            rows = self._parquet_rows(schema, files)
        return (rows if restrict is None else _semi_join(rows, restrict)), rows_read

    def _parquet_rows(self, schema: Any, files: list[str]) -> "DataFrame":
        if not files:
            return self.spark.createDataFrame([], schema)
        # Files, not directories: no partition discovery (a vnode is not a column) and no listing.
        return self.spark.read.schema(schema).parquet(*files).select(*_quoted(schema.fieldNames()))

    def compact(
        self, epoch: int | None = None, tables: list[str] | None = None, every: int | None = None
    ) -> StepReport:
        """Snapshot the tables that need it (``epochal/storage/compaction.py``); never raises for a
        table's failure, which is logged and reported in the metadata: the epoch is committed."""
        from epochal.storage.compaction import compact_tables

        report = compact_tables(self, tables=tables, every=self.settings.compact_every if every is None else every)
        # Named as the shell's asset, like "epoch_commit": the report becomes its materialization.
        at = epoch if epoch is not None else (report.committed_epoch or 0)
        return StepReport("epoch_compaction", at, report.metadata)


def _not_written(view: str, upstream: str, epoch: int) -> EpochalError:
    return EpochalError(
        f"view {view} reads {upstream}, which has not written epoch {epoch} yet: materialize {upstream} "
        "for this partition first, or run the whole epoch with epoch_job"
    )


def _quoted(names: "list[str] | tuple[str, ...]") -> list[str]:
    return [f"`{n}`" for n in names]


def _check_restriction(table: str, schema: Any, columns: tuple[str, ...], keys: "DataFrame") -> None:
    unknown = [c for c in columns if c not in schema.fieldNames()]
    if not columns or unknown:
        raise EpochalError(f"cannot restrict {table} by columns {list(columns)}: {unknown or 'none given'}")
    missing = [c for c in columns if c not in keys.columns]
    if missing:
        raise EpochalError(f"the restriction keys of {table} lack column(s) {missing}")


def _typed_keys(schema: Any, columns: tuple[str, ...], keys: "DataFrame", names: list[str]) -> "DataFrame":
    """``keys`` cast to the table's column types: the vnode hash and the null-safe comparison
    must see the same values as when the rows were written."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in schema.fields}
    return keys.select(*[F.col(f"`{c}`").cast(types[c]).alias(n) for c, n in zip(columns, names, strict=True)])


def _semi_join(rows: "DataFrame", restrict: "tuple[tuple[str, ...], DataFrame]") -> "DataFrame":
    """The rows whose restriction columns equal (null-safe) some row of the keys: a left-semi join
    against the broadcast keys, so the state is filtered where it is scanned, without a shuffle."""
    from functools import reduce

    from pyspark.sql import functions as F

    columns, keys = restrict
    _check_restriction("the table", rows.schema, tuple(columns), keys)
    names = [f"__epochal_key_{i}" for i in range(len(columns))]
    typed = _typed_keys(rows.schema, tuple(columns), keys, names)
    condition = reduce(
        lambda a, b: a & b,
        [rows[f"`{c}`"].eqNullSafe(typed[n]) for c, n in zip(columns, names, strict=True)],
    )
    return rows.join(F.broadcast(typed), condition, "left_semi")
