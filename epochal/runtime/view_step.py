"""A view's step of an epoch: its change computed from its upstreams' changes (linear views), at the
keys the epoch touched (keyed and partial-aggregate plans), or by a full recompute and diff
(``refresh = 'full'``), then written and collected. The backfill runner runs the same steps for
epochs that committed without the view."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from epochal.checkpoint.records import Collected, EpochAborted, InvariantViolation
from epochal.checkpoint.statements import views as definitions
from epochal.driver.views import DriverChange
from epochal.errors import EpochalError
from epochal.incremental.binding import sql_over
from epochal.pipeline.fingerprints import view_fingerprint
from epochal.runtime.data_errors import ViewDataError, data_failure, user_view
from epochal.runtime.report import StepReport
from epochal.storage.changes import signed_parts, unit_changes
from epochal.storage.schemas import aligned, cast_like
from epochal.storage.state_reader import quoted
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from epochal.driver.views import DriverViews
    from epochal.pipeline.model import ViewDef
    from epochal.runtime.context import StepContext

#: ``check_statement``'s default: the stored statement has not been read yet
_UNREAD = object()


class ViewSteps:
    def __init__(self, ctx: StepContext, driver: DriverViews):
        self.ctx = ctx
        #: computes a small epoch's change on the driver (epochal/driver/views.py)
        self.driver = driver

    def run_checked(
        self, epoch: int, name: str, run_id: str | None, release: bool, stored: object = _UNREAD
    ) -> StepReport:
        """The view's step for ``epoch`` with this process's statement, refused when the view's
        state comes from another (``check_statement``): its rows would mix the two.
        ``stored``: what ``controller.stored_statement`` said, if the caller asked already."""
        self.check_statement(name, stored)
        return self.run(epoch, name, run_id, release)

    def check_statement(self, name: str, stored: object = _UNREAD) -> None:
        """Refuse to compute view ``name`` with this process's statement when its state comes from
        another (``definitions.check_statement``). ``stored``: the controller's ``stored_statement``
        answer, if the caller read it already."""
        definition = self.ctx.pipeline.views.get(name)
        if definition is None:
            return
        if stored is _UNREAD:
            stored = self.ctx.controller.stored_statement(name)
        fingerprint = view_fingerprint(definition)
        definitions.check_statement(stored, name, fingerprint, self.ctx.pipeline.loaded_at)  # type: ignore[arg-type]

    def run(
        self,
        epoch: int,
        name: str,
        run_id: str | None = None,
        release: bool = False,
        definition: ViewDef | None = None,
    ) -> StepReport:
        """The view's step for ``epoch``, without the epoch's lease (``run_view`` holds it; the
        backfill runner writes committed epochs, which have none). ``definition``: the statement
        to maintain the view with, when not the pipeline's (the old one of a view being rebuilt)."""
        view = definition or self.ctx.pipeline.views[name]
        try:
            if view.refresh == "full":
                return self._run_view_full(epoch, view, run_id, release)
            if view.plan is not None and view.plan.kind == "keyed":
                return self._run_view_keyed(epoch, view, run_id, release)
            return self._run_view(epoch, view, run_id, release)
        except EpochalError:
            raise
        except Exception as error:
            failure = data_failure(error)
            if failure is None:
                raise
            # (an internal stage's SQL is the planner's; the user edits the view it was split off)
            owner = user_view(self.ctx.pipeline, view)
            raise ViewDataError(owner.name, epoch, failure, owner.query) from error

    def _run_view_keyed(self, epoch: int, view: ViewDef, run_id: str | None, release: bool) -> StepReport:
        """A view with state: its change is recomputed at the keys the epoch touched, reading only
        the state at those keys (:mod:`epochal.incremental.keyed`)."""
        from epochal.incremental.keyed import keyed_change
        from epochal.incremental.partial import partial_change
        from epochal.incremental.plan import PARTIAL_RULE

        started = time.time()
        name = view.name
        if view.plan is None:
            raise InvariantViolation(f"view {name} is run as keyed but has no incremental plan")
        self._wait_for_order(epoch, view)
        begun = self.ctx.begin_step(epoch, run_id, table=name)
        collected, first = begun.collected, not begun.written_before
        rows_in = self._rows_in(epoch, view, collected)
        if rows_in == 0 and not first:
            return self._idle_view(epoch, name, started, run_id, release)
        driven = self._on_driver(epoch, view, collected, rows_in, started, run_id, release)
        if driven is not None:
            return driven
        deltas = {u: self._upstream_delta(epoch, name, u, collected) for u in view.upstreams}

        def read(table: str, inclusive: bool, restrict):
            return self.ctx.read_state(table, epoch, inclusive, restrict)

        if view.plan.rule == PARTIAL_RULE:
            change = partial_change(
                self.ctx.spark,
                view.plan,
                name,
                view.columns,
                deltas,
                read,
                self.ctx.view_schema(view),
                inserts_only=not any(self._may_delete(epoch, u, collected) for u in view.upstreams),
            )
        else:
            changed = frozenset(u for u in view.upstreams if collected[u].rows_out)
            # The view's first epoch has no rows before it: a one-partition query over empty inputs
            # still returns a row (count(*) = 0), which must not be retracted from a view never
            # written. (A partial aggregate reads its own rows, so it needs no such flag.)
            change = keyed_change(
                self.ctx.spark,
                view.plan,
                view.columns,
                deltas,
                read,
                changed,
                first,
                # a recompute retracts the view's own rows (exact for floating point aggregates)
                stored=lambda restriction: self.ctx.read_state(name, epoch, False, restriction)[0],
                view=name,
            )
        try:
            rows, recorded = self.publish_change(
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
                "engine": "spark",
                # why the driver path (epochal/driver/) left the step to Spark, when it was asked
                "driver_declined": self.driver.declined_because(f"view {name}", epoch),
                "plan": f"{view.plan.rule} keyed by {', '.join(view.plan.key_classes) or 'nothing (one partition)'}",
                "rows_in": rows_in,
                "rows_changed": rows,
                "state_rows_read": change.state_rows_read,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _run_view_full(self, epoch: int, view: ViewDef, run_id: str | None, release: bool) -> StepReport:
        """refresh = 'full': recompute the view over its inputs' state at this epoch, and emit the
        difference from its previous state as the epoch's change. Correct for any query; costs a
        full recompute plus a diff, growing with the tables rather than with the change."""
        from pyspark.sql import functions as F

        started = time.time()
        name = view.name
        self._wait_for_order(epoch, view)
        self.ctx.begin_step(epoch, run_id)
        rows_read = 0
        states = {}
        for upstream in view.upstreams:
            state, read = self.ctx.read_state(upstream, epoch, inclusive=True)
            rows_read += read
            states[upstream] = state
        new = (
            sql_over(self.ctx.spark, view.query, states)
            .toDF(*view.columns)
            .withColumn(WEIGHT, F.lit(1).cast("bigint"))
        )
        # The view's own previous state, negated: unit_changes nets it with the new rows anyway,
        # so it is read un-netted (snapshot + later changes) and aggregated only once.
        previous, own_read = self.ctx.reader.read_weighted(
            self.ctx.controller.state_parts(name, epoch, inclusive=False), None
        )
        rows_read += own_read
        weighted = new
        if previous is not None:
            negated = -F.col(WEIGHT) if WEIGHT in previous.columns else F.lit(-1).cast("bigint")
            weighted = new.unionByName(previous.select(*quoted(view.columns), negated.alias(WEIGHT)))
        change = unit_changes(weighted)
        rows, recorded = self.publish_change(epoch, name, change, rows_read, started, run_id, release)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "full",
                "engine": "spark",
                "state_rows_read": rows_read,
                "rows_changed": rows,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _wait_for_order(self, epoch: int, view: ViewDef) -> None:
        """A view that reads state (its inputs', its own) inside ``epoch`` needs their earlier epochs
        written first; with several epochs in flight, another run may still be writing them."""
        tables = [*view.upstreams, view.name]
        self.ctx.controller.wait_for_order(epoch, tables, f"view {view.name}")

    def _rows_in(self, epoch: int, view: ViewDef, collected: Mapping[str, Collected]) -> int:
        """Rows the view's upstreams changed in the epoch; raises when one has not run it yet."""
        for upstream in view.upstreams:
            if upstream not in collected:
                raise _not_written(view.name, upstream, epoch)
        return sum((collected[u].rows_out or 0) for u in view.upstreams)

    def _idle_view(self, epoch: int, name: str, started: float, run_id: str | None, release: bool) -> StepReport:
        """An incremental view whose inputs did not change, after its first epoch: its change is
        empty by construction (linear over nothing, or the same keys before and after), so it is
        recorded like an idle source, without a file and without a Spark job. A quiet pipeline
        then costs a few meta-store transactions per view per epoch, not a Parquet commit each."""
        _, recorded = self.ctx.record_idle(epoch, name, started, run_id, release, dead_letters=None)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "engine": "none (idle)",
                "rows_in": 0,
                "rows_changed": 0,
                "state_rows_read": 0,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _may_delete(self, epoch: int, upstream: str, collected: Mapping[str, Collected]) -> bool:
        """Whether ``upstream``'s change of the epoch may delete rows (its files' statistics say;
        an idle epoch and a SOURCE's records read again only insert)."""
        entry = collected.get(upstream)
        if entry is not None and entry.location is None:
            history = self.ctx.reader.history
            return not (entry.rows_out == 0 or (history is not None and history.covers(upstream)))
        return entry is None or self.ctx.warehouse.may_delete([entry.location])

    def _upstream_delta(self, epoch: int, view: str, upstream: str, collected: Mapping[str, Collected]) -> "DataFrame":
        from pyspark.sql.types import LongType, StructField, StructType

        entry = collected.get(upstream)
        if entry is not None and entry.location is None and entry.rows_out == 0:
            # An idle epoch (_idle_source, _idle_view): no file, no change. A location that
            # compaction cleared has rows and still raises below.
            weighted = StructType([*self.ctx.query_schema(upstream).fields, StructField(WEIGHT, LongType())])
            return self.ctx.spark.createDataFrame([], weighted)
        history = self.ctx.reader.history
        if entry is not None and entry.location is None and history is not None and history.covers(upstream):
            # A SOURCE that stores nothing let go of the file after the commit (this epoch is run
            # again): the connector reads the epoch's records again.
            return history.change(upstream, epoch)
        if entry is None or entry.location is None:
            raise _not_written(view, upstream, epoch)
        # (a source's change written before a column was declared: read as declared now)
        change = self.ctx.warehouse.read(self.ctx.spark, [entry.location])
        return aligned(change, self.ctx.reader.declared(upstream))

    def _run_view(self, epoch: int, view: ViewDef, run_id: str | None, release: bool) -> StepReport:
        from pyspark.sql import functions as F

        started = time.time()
        name = view.name
        begun = self.ctx.begin_step(epoch, run_id, table=name)
        rows_in = self._rows_in(epoch, view, begun.collected)
        if rows_in == 0 and begun.written_before:
            return self._idle_view(epoch, name, started, run_id, release)
        driven = self._on_driver(epoch, view, begun.collected, rows_in, started, run_id, release)
        if driven is not None:
            return driven
        deltas = {u: self._upstream_delta(epoch, name, u, begun.collected) for u in view.upstreams}
        # The view's operators are linear (filter, project, UNION ALL), so the change of the output
        # is the query over the inserted rows minus the query over the deleted rows. When the planner
        # split the view, its query reads the stages that keep the state instead of the text as written.
        query = view.plan.query if view.plan is not None and view.plan.query else view.query
        signed = []
        for sign, rows in signed_parts(deltas):
            out = sql_over(self.ctx.spark, query, rows).toDF(*view.columns)
            if view.plan is not None and view.plan.typed_like_query:
                out = cast_like(out, self.ctx.view_schema(view))
            signed.append(out.withColumn(WEIGHT, F.lit(sign).cast("bigint")))
        change = signed[0].unionByName(signed[1])
        rows, recorded = self.publish_change(epoch, name, change, rows_in, started, run_id, release)
        return StepReport(
            name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "engine": "spark",
                # why the driver path (epochal/driver/) left the step to Spark, when it was asked
                "driver_declined": self.driver.declined_because(f"view {name}", epoch),
                "rows_in": rows_in,
                "rows_out": rows,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def _on_driver(
        self,
        epoch: int,
        view: ViewDef,
        collected: Mapping[str, Collected],
        rows_in: int,
        started: float,
        run_id: str | None,
        release: bool,
    ) -> StepReport | None:
        """The step computed on the driver by DuckDB (:mod:`epochal.driver.views`) when the epoch's
        change is small and the view's plan is one the driver computes exactly; None: Spark's."""
        driver = self.driver
        if not driver.takes(view, rows_in, epoch):
            return None
        change = driver.change(epoch, view, self.ctx.view_schema(view), collected)
        if change is None:
            return None
        rows, recorded = self.publish_change(epoch, view.name, change, rows_in, started, run_id, release)
        # the keys the Spark step of the same plan reports, so the UI's plots go on across engines
        if view.plan is not None and view.plan.kind == "keyed":
            keyed = ", ".join(view.plan.key_classes) or "nothing (one partition)"
            counts = {"plan": f"{view.plan.rule} keyed by {keyed}", "rows_in": rows_in, "rows_changed": rows}
            counts["state_rows_read"] = change.state_rows_read
        else:
            counts = {"rows_in": rows_in, "rows_out": rows}
        return StepReport(
            view.name,
            epoch,
            {
                "epoch": epoch,
                "mode": "incremental",
                "engine": "driver (DuckDB)",
                **counts,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )

    def publish_change(
        self,
        epoch: int,
        name: str,
        change: "DataFrame | DriverChange",
        rows_in: int,
        started: float,
        run_id: str | None,
        release: bool,
    ) -> tuple[int, bool]:
        """Write a view's change for the epoch and collect it; returns (rows written, recorded)."""
        location = self.ctx.warehouse.new_location(name, epoch)
        if self.ctx.backfill_root is not None:
            # A committed epoch's change written by a backfill: outside the epoch= directories that
            # recovery sweeps up to the committed epoch (it would take the file before it is recorded).
            location = f"{self.ctx.backfill_root}/{location[len(self.ctx.warehouse.table_root(name)) + 1 :]}"
        try:
            if isinstance(change, DriverChange):
                rows = change.write(location)
            else:
                rows = self.ctx.warehouse.write(change, location)
            recorded = self.ctx.collect(
                epoch,
                Collected(name, location, rows_in, rows, None, None, time.time() - started, run_id),
                [location],
                release,
            )
        except EpochAborted:
            self.ctx.warehouse.delete([location])
            raise
        return rows, recorded


def _not_written(view: str, upstream: str, epoch: int) -> EpochalError:
    return EpochalError(
        f"view {view} reads {upstream}, which has not written epoch {epoch} yet: materialize {upstream} "
        "for this partition first, or run the whole epoch with epoch_job"
    )
