"""A sink's step of an epoch: build its target, and deliver the committed epochs it lacks through
the sink coordinator (:mod:`epochal.checkpoint.sinks.coordinator`), its batches written by Spark
writer tasks (:mod:`epochal.sinks.spark_writers`), or a small one from this process
(:mod:`epochal.sinks.driver_writer`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint.records import EpochAborted, EpochState, InvariantViolation, StateCompacted
from epochal.checkpoint.sinks.batches import DeliveryReport, SinkStart
from epochal.checkpoint.statements.sinks import SinkDeclaration, SinkRecipe
from epochal.errors import require
from epochal.runtime.check_step import CheckSteps, Hold
from epochal.runtime.report import StepReport
from epochal.sinks.base import BatchId, SinkTarget, WriterResult
from epochal.sinks.driver_writer import DriverWriter
from epochal.sinks.spec import (
    commit_checkpoint_interval,
    primary_key_columns,
    sink_spec,
    snapshot_option,
    writer_count,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from epochal.runtime.context import StepContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateAt:
    """The payload of a snapshot batch: the upstream table's state at ``epoch``, read through its
    snapshot and the change files after it (so it works after compaction deleted older ones)."""

    epoch: int


#: what one epoch of a batch hands the writers: its change files' location (None: an idle epoch)
Payload = str | None | StateAt


def sink_declaration(from_table: str, connector: str, options: Mapping[str, str]) -> str:
    """What a sink reads and where it writes (``SinkDeclaration``), as JSON."""
    spec = sink_spec(connector)
    identity, defaults, paths = (spec.identity, dict(spec.identity_defaults), spec.paths) if spec else ((), {}, ())
    return SinkDeclaration.of(
        from_table, connector, options, primary_key_columns(options), identity, defaults, paths
    ).to_json()


class SinkSteps:
    def __init__(self, ctx: StepContext, checks: CheckSteps):
        self.ctx = ctx
        #: the checks that hold epochs back from a sink (docs/checks.md)
        self.checks = checks
        self._targets: dict[str, SinkTarget] = {}
        #: targets whose table was created or checked by this process
        self._prepared_targets: set[str] = set()
        #: writes a small batch from this process rather than by Spark writer tasks (driver_writer.py)
        self.driver_writer = DriverWriter(ctx.settings.sink_driver_rows)

    def sink(self, name: str) -> SinkTarget:
        """The target of sink ``name``, built from its options (``${ENV}`` values read now)."""
        if name not in self._targets:
            definition = self.ctx.pipeline.sinks[name]
            spec = sink_spec(definition.connector)
            if spec is None:
                raise InvariantViolation(
                    f"sink {name} has connector {definition.connector!r}, which the loader refuses"
                )
            upstream = definition.from_table
            columns = list(
                self.ctx.pipeline.views[upstream].columns
                if upstream in self.ctx.pipeline.views
                else self.ctx.pipeline.sources[upstream].column_names
            )
            self._targets[name] = spec.create(
                name, definition.options, columns, self.ctx.settings.home, self.ctx.settings.meta_url
            )
        return self._targets[name]

    def run_sink(self, epoch: int, name: str, run_id: str | None = None) -> StepReport:
        """Deliver every committed epoch up to ``epoch`` that the sink has not delivered, exactly once,
        through the sink coordinator (:mod:`epochal.checkpoint.sinks.coordinator`). A sink never
        holds epochs back: it runs after the commit, and a target that is down makes this step retry
        with backoff for EPOCHAL_SINK_RETRY_S, then fail; the sink lags, and the next run catches up."""
        from epochal.retry import retrying
        from epochal.sinks.base import SinkConfigError, SinkDataError, SinkError, SinkSchemaError

        started = time.time()
        controller = self.ctx.controller
        record = controller.epoch(epoch)
        if record.state is EpochState.ABORTED:
            raise EpochAborted(f"epoch {epoch} was aborted by a recovery; sinks only deliver committed epochs")
        definition = self.ctx.pipeline.sinks[name]
        backfill = controller.backfill(definition.from_table)
        if backfill is not None and backfill.phase.active:
            # Its table is not at the committed epoch yet: delivering now would skip its history.
            return StepReport(
                name,
                epoch,
                {"epoch": epoch, "waiting_for_backfill": definition.from_table, "phase": backfill.phase.shown},
            )
        target = self.sink(name)
        _check_writable(target)
        committed = controller.committed_epoch()
        upto = min(epoch, committed) if committed is not None else None

        # Where the sink starts is decided at its first delivery step and kept: a sink added to a
        # table with history delivers the state at the newest committed epoch before this one as one
        # snapshot batch (snapshot = 'true'), or skips that history; one there from the first epoch
        # has none. This epoch and later ones are delivered as epochs.
        start = controller.sink_start(
            name,
            snapshot_option(definition.options),
            epoch,
            sink_declaration(definition.from_table, definition.connector, definition.options),
            self.ctx.pipeline.loaded_at,
            SinkRecipe.of(definition.connector, definition.options, target.columns).to_json(),
        )

        hold = Hold(None, frozenset(), None)

        def deliver() -> DeliveryReport:
            nonlocal hold
            delivered = controller.delivered_epoch(name)
            after, snapshot = delivered, None
            if delivered is None and start.skipped_upto is not None:
                after = start.skipped_upto
            elif delivered is None and start.delivers_snapshot:
                at, snapshot_hold = self._checked_snapshot_epoch(name, self._snapshot_epoch(name, start), upto)
                if at is None:  # every committed epoch since the snapshot's failed an error check
                    hold = snapshot_hold
                    return DeliveryReport(name, lag_epochs=len(snapshot_hold.held))
                after, snapshot = at, (at, StateAt(at))
            # Idle epochs (no change file) are delivered too, as nothing: the sink's progress then
            # says it holds everything up to ``upto``. Retention keeps undelivered change files.
            todo: list[tuple[int, Payload]] = (
                []
                if upto is None
                else controller.committed_locations(definition.from_table, upto=upto, after=after, idle=True)
            )
            # A failing error check upstream holds its epochs: deliver up to the newest epoch that
            # passed, in batches that end only at passing epochs (decided from recorded results).
            hold = self.checks.hold(name, [e for e, _ in todo])
            todo = [(e, p) for e, p in todo if hold.deliver_upto is not None and e <= hold.deliver_upto]
            return controller.deliver_sink(
                target,
                todo,
                commit_checkpoint_interval(definition.options),
                lambda b, payloads: self._write_batch(target, b, payloads),
                snapshot=snapshot,
                after=after,
                held=hold.held,
            )

        def transient(error: BaseException) -> bool:
            permanent = SinkSchemaError | SinkConfigError | SinkDataError
            return isinstance(error, SinkError) and not isinstance(error, permanent)

        def retry_log(error: BaseException, attempt: int, sleep: float) -> None:
            log.warning("sink %s: delivery attempt %d failed (%s); retrying in %.1fs", name, attempt, error, sleep)

        try:
            report = retrying(
                retry_on=transient,
                base=0.5,
                cap=10.0,
                deadline=time.monotonic() + self.ctx.settings.sink_retry_s,
                on_retry=retry_log,
            )(deliver)
        except SinkError as error:
            # Name the epochs that wait when the target failed before any batch did (at recovery).
            message = str(error)
            if message.startswith(f"sink {name}:") and upto is not None:
                waiting = [
                    e
                    for e, _ in controller.committed_locations(
                        definition.from_table, upto=upto, after=self._listed_after(name, start), idle=True
                    )
                ]
                if waiting:
                    span = f"epoch {waiting[0]}" if len(waiting) == 1 else f"epochs {waiting[0]}..{waiting[-1]}"
                    message = f"sink {name}, {span} ({len(waiting)} waiting):{message[len(f'sink {name}:') :]}"
                    raise type(error)(message) from error
            raise
        lag = controller.sink_lag(name)
        if upto is not None and upto == committed:  # (a re-run of an older partition sees less: it says nothing)
            controller.note_check_hold(name, hold.holding)
        if hold.holding is not None:
            log.warning("sink %s: %s; it stays at epoch %s", name, hold.shown(), lag["delivered_epoch"])
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
                # the snapshot batch this step delivered (or re-committed after a crash), if any
                "snapshot_epoch": report.snapshot_epoch,
                "snapshot_rows": report.snapshot_rows,
                "start": "snapshot"
                if start.delivers_snapshot
                else ("after history" if start.skipped_upto is not None else "first epoch"),
                "held_by_check": hold.shown(),
                "target": target.describe(),
                "target_rows": target.row_count(),
                "seconds": round(seconds, 3),
            },
        )

    def _listed_after(self, name: str, start: SinkStart) -> int | None:
        """The epoch after which the sink's undelivered epochs lie."""
        delivered = self.ctx.controller.delivered_epoch(name)
        if delivered is not None or start.history_upto is None:
            return delivered
        return start.history_upto

    def _snapshot_epoch(self, name: str, start: SinkStart) -> int:
        """The epoch of the sink's snapshot batch: its recorded start, so that a delivery killed
        before its batch was PENDING delivers the same snapshot again. Retention does not hold that
        state for a sink that has delivered nothing (it would pin every snapshot and change file);
        when it released it, nothing of the snapshot can be in the target yet, so the start moves to
        the committed epoch, whose state is always readable."""
        require(start.history_upto is not None, f"sink {name}: a snapshot start without a snapshot epoch")
        at = start.history_upto
        table = self.ctx.pipeline.sinks[name].from_table
        controller = self.ctx.controller
        try:
            controller.state_parts(table, at, inclusive=True)
            return at
        except StateCompacted:
            history = self.ctx.reader.history
            if history is not None and history.covers(table) and history.records(table, at, True) is not None:
                return at  # a SOURCE's rows at any epoch whose offsets are kept: read from its connector
            committed = controller.committed_epoch()
            require(committed is not None, f"sink {name}: a snapshot start but no committed epoch")
            moved = controller.move_sink_snapshot(name, at, committed)
            log.warning(
                "sink %s: the state at epoch %d was compacted before its snapshot batch was delivered; "
                "the snapshot is taken at epoch %s instead",
                name,
                at,
                moved.history_upto,
            )
            require(moved.history_upto is not None, f"sink {name}: a moved snapshot start lost its epoch")
            return moved.history_upto

    def _checked_snapshot_epoch(self, name: str, at: int, upto: int | None) -> tuple[int | None, Hold]:
        """The epoch of the sink's snapshot batch: ``at`` unless an error check upstream failed
        there. A snapshot is a state the target shows, so it then moves to the newest later
        committed epoch that passed (nothing of it is in the target yet: ``move_snapshot`` changes
        nothing once a snapshot batch is PENDING), or is None, with the hold, while none has."""
        first = self.checks.hold(name, [at])
        if first.holding is None:
            return at, first
        table = self.ctx.pipeline.sinks[name].from_table
        controller = self.ctx.controller
        listed = [] if upto is None else controller.committed_locations(table, upto=upto, after=at, idle=True)
        later = [e for e, _ in listed]
        hold = self.checks.hold(name, [at, *later])
        if hold.deliver_upto is None:
            return None, hold
        moved = controller.move_sink_snapshot(name, at, hold.deliver_upto)
        require(moved.history_upto is not None, f"sink {name}: a moved snapshot start lost its epoch")
        log.warning(
            "sink %s: check %s failed at epoch %d, the state its snapshot batch was to show; the snapshot is "
            "taken at epoch %s, the newest that passed",
            name,
            first.holding.check,
            at,
            moved.history_upto,
        )
        return moved.history_upto, hold

    def _write_batch(self, target: SinkTarget, batch: BatchId, payloads: list[Payload]) -> list[WriterResult]:
        """Pre-commit one batch: its change files, or for a snapshot batch the table's state, spread
        over the sink's writer tasks."""
        from epochal.sinks.spark_writers import run_writers

        definition = self.ctx.pipeline.sinks[target.name]
        writers = writer_count(definition.options)
        if batch.snapshot:
            require(
                len(payloads) == 1 and isinstance(payloads[0], StateAt),
                f"{batch.describe()}: a snapshot batch is one state read, not {payloads!r}",
            )
            return self._write_snapshot(target, batch, payloads[0], writers)
        locations = [p for p in payloads if not isinstance(p, StateAt)]
        files = [f for loc in locations if loc is not None for f in self.ctx.warehouse.parquet_files(loc)]
        schema = None
        if files:
            schema = self.ctx.query_schema(definition.from_table)
            self._prepare(target, schema)
            written = self.driver_writer.write(target, batch, files, schema)
            if written is not None:
                return written
        return run_writers(self.ctx.spark if files else None, target, batch, files, schema, writers)

    def _write_snapshot(self, target: SinkTarget, batch: BatchId, state: StateAt, writers: int) -> list[WriterResult]:
        """The table's rows at the snapshot epoch, each with weight 1 (a row the table holds twice
        comes twice), through the same writers as change files: read on the executors, never
        collected to the driver."""
        from pyspark.sql import functions as F

        from epochal.sinks.base import WEIGHT
        from epochal.sinks.spark_writers import write_frame
        from epochal.sql import quote

        table = self.ctx.pipeline.sinks[target.name].from_table
        schema = self.ctx.query_schema(table)
        self._prepare(target, schema)
        rows, _ = self.ctx.read_state(table, state.epoch, inclusive=True)
        types = {f.name: f.dataType for f in schema.fields}
        change = rows.select(
            *[F.col(quote(c)).cast(types[c]).alias(c) for c in target.columns],
            F.lit(1).cast("long").alias(WEIGHT),
        )
        return write_frame(self.ctx.spark, target, batch, change, schema, writers)

    def _prepare(self, target: SinkTarget, schema: object) -> None:
        """Create or check the target table once per process, from the upstream ``schema``."""
        if target.name in self._prepared_targets:
            return
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        # Timestamps as Spark writes them (UTC). Every column nullable: Spark's NOT NULL is
        # what analysis proved of today's query (count(*) is never null), but the writers'
        # files and a changed query need not say so, and a table created NOT NULL would
        # then refuse them (Iceberg compares the two exactly).
        arrow = to_arrow_schema(schema, timezone="UTC")
        target.prepare_target(pa.schema([f.with_nullable(True) for f in arrow]))
        self._prepared_targets.add(target.name)


def _check_writable(target: SinkTarget) -> None:
    """Refuse at once, naming the user's option and path, a local target this process can never
    write: the delivery's retries would fail the same way for EPOCHAL_SINK_RETRY_S."""
    from epochal.sinks.base import SinkConfigError
    from epochal.sinks.writable import unwritable

    for option, path in target.local_paths():
        why = unwritable(path)
        if why is not None:
            raise SinkConfigError(
                f"sink {target.name}: cannot write {option} = '{path}': {why}. Fix: set {option} to a path in a "
                "directory this user can write (or make that directory writable), then run again; the committed "
                "epochs wait for the sink, nothing is lost"
            )
