"""A sink's step of an epoch: build its target, and deliver the committed epochs it lacks through
the sink coordinator (:mod:`epochal.checkpoint.sink_coordinator`), its batches written by Spark
writer tasks (:mod:`epochal.sinks.spark_writers`). Split from the runtime, which delegates here."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from epochal.checkpoint.records import EpochAborted, EpochState, InvariantViolation
from epochal.checkpoint.sink_coordinator import DeliveryReport
from epochal.sinks.base import BatchId, SinkTarget, WriterResult
from epochal.sinks.spec import commit_checkpoint_interval, sink_spec, writer_count

if TYPE_CHECKING:
    from epochal.runtime import EpochRuntime, StepReport

log = logging.getLogger(__name__)


class SinkSteps:
    def __init__(self, runtime: EpochRuntime):
        self.runtime = runtime
        self._targets: dict[str, SinkTarget] = {}
        #: targets whose table was created or checked by this process
        self._prepared_targets: set[str] = set()

    def sink(self, name: str) -> SinkTarget:
        """The target of sink ``name``, built from its options (``${ENV}`` values read now)."""
        if name not in self._targets:
            definition = self.runtime.pipeline.sinks[name]
            spec = sink_spec(definition.connector)
            if spec is None:
                raise InvariantViolation(
                    f"sink {name} has connector {definition.connector!r}, which the loader refuses"
                )
            upstream = definition.from_table
            columns = list(
                self.runtime.pipeline.views[upstream].columns
                if upstream in self.runtime.pipeline.views
                else self.runtime.pipeline.sources[upstream].column_names
            )
            self._targets[name] = spec.create(
                name, definition.options, columns, self.runtime.settings.home, self.runtime.settings.meta_url
            )
        return self._targets[name]

    def run_sink(self, epoch: int, name: str, run_id: str | None = None) -> StepReport:
        """Deliver every committed epoch up to ``epoch`` that the sink has not delivered, exactly once,
        through the sink coordinator (:mod:`epochal.checkpoint.sink_coordinator`). A sink never
        holds epochs back: it runs after the commit, and a target that is down makes this step retry
        with backoff for EPOCHAL_SINK_RETRY_S, then fail; the sink lags, and the next run catches up."""
        from epochal.retry import retrying
        from epochal.sinks.base import SinkConfigError, SinkError, SinkSchemaError

        started = time.time()
        record = self.runtime.controller.epoch_log.epoch(epoch)
        if record.state is EpochState.ABORTED:
            raise EpochAborted(f"epoch {epoch} was aborted by a recovery; sinks only deliver committed epochs")
        definition = self.runtime.pipeline.sinks[name]
        backfill = self.runtime.controller.backfills.get(definition.from_table)
        if backfill is not None and backfill.phase.active:
            # Its table is not at the committed epoch yet: delivering now would skip its history.
            from epochal.runtime import StepReport

            return StepReport(
                name,
                epoch,
                {"epoch": epoch, "waiting_for_backfill": definition.from_table, "phase": backfill.phase.shown},
            )
        target = self.sink(name)
        coordinator = self.runtime.controller.sink_coordinator
        committed = self.runtime.controller.epoch_log.committed_epoch()
        upto = min(epoch, committed) if committed is not None else None

        def deliver() -> DeliveryReport:
            delivered = coordinator.delivered_epoch(name)
            # Idle epochs (no change file) are delivered too, as nothing: the sink's progress then
            # says it holds everything up to ``upto``. Retention keeps undelivered change files.
            todo = (
                []
                if upto is None
                else self.runtime.controller.catalog.committed_locations(
                    definition.from_table, upto=upto, after=delivered, idle=True
                )
            )
            return coordinator.deliver(
                target,
                todo,
                commit_checkpoint_interval(definition.options),
                lambda b, locs: self._write_batch(target, b, locs),
            )

        def transient(error: BaseException) -> bool:
            return isinstance(error, SinkError) and not isinstance(error, SinkSchemaError | SinkConfigError)

        def retry_log(error: BaseException, attempt: int, sleep: float) -> None:
            log.warning("sink %s: delivery attempt %d failed (%s); retrying in %.1fs", name, attempt, error, sleep)

        try:
            report = retrying(
                retry_on=transient,
                base=0.5,
                cap=10.0,
                deadline=time.monotonic() + self.runtime.settings.sink_retry_s,
                on_retry=retry_log,
            )(deliver)
        except SinkError as error:
            # Name the epochs that wait when the target failed before any batch did (at recovery).
            message = str(error)
            if message.startswith(f"sink {name}:") and upto is not None:
                waiting = [
                    e
                    for e, _ in self.runtime.controller.catalog.committed_locations(
                        definition.from_table, upto=upto, after=coordinator.delivered_epoch(name), idle=True
                    )
                ]
                if waiting:
                    span = f"epoch {waiting[0]}" if len(waiting) == 1 else f"epochs {waiting[0]}..{waiting[-1]}"
                    message = f"sink {name}, {span} ({len(waiting)} waiting):{message[len(f'sink {name}:'):]}"
                    raise type(error)(message) from error
            raise
        lag = coordinator.lag_of(name)
        if report.epochs:
            log.info(
                "sink %s: delivered %d epoch(s) in %d batch(es), %d row(s), in %.1fs; %d epoch(s) behind",
                name,
                report.epochs,
                report.batches,
                report.rows,
                report.seconds,
                lag["lag_epochs"],
            )
        seconds = time.time() - started
        from epochal.runtime import StepReport

        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "epochs_delivered": report.epochs,
                "batches_committed": report.batches,
                "rows_delivered": report.rows,
                "rows_per_second": round(report.rows / seconds, 1) if seconds > 0 else 0.0,
                "batches_recommitted": report.recommitted,
                "delivered_by_another_run": report.busy,
                "orphaned_precommits_aborted": report.orphans_aborted,
                "delivered_epoch": lag["delivered_epoch"],
                "committed_epoch": committed,
                "lag_epochs": lag["lag_epochs"],
                "lag_seconds": lag["lag_seconds"],
                "waiting_for_commit": committed is None or epoch > committed,
                "target": target.describe(),
                "target_rows": target.row_count(),
                "seconds": round(seconds, 3),
            },
        )

    def _write_batch(self, target: SinkTarget, batch: BatchId, locations: list[str | None]) -> list[WriterResult]:
        """Pre-commit one batch: its change files, spread over the sink's writer tasks."""
        from epochal.sinks.spark_writers import run_writers

        definition = self.runtime.pipeline.sinks[target.name]
        files = [f for loc in locations if loc is not None for f in self.runtime.warehouse.parquet_files(loc)]
        schema = None
        if files:
            schema = self.runtime.query_schema(definition.from_table)
            if target.name not in self._prepared_targets:
                import pyarrow as pa
                from pyspark.sql.pandas.types import to_arrow_schema

                # Timestamps as Spark writes them (UTC). Every column nullable: Spark's NOT NULL is
                # what analysis proved of today's query (count(*) is never null), but the writers'
                # files and a changed query need not say so, and a table created NOT NULL would
                # then refuse them (Iceberg compares the two exactly).
                arrow = to_arrow_schema(schema, timezone="UTC")
                target.prepare_target(pa.schema([f.with_nullable(True) for f in arrow]))
                self._prepared_targets.add(target.name)
        return run_writers(
            self.runtime.spark if files else None, target, batch, files, schema, writer_count(definition.options)
        )

