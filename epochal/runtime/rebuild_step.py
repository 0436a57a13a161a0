"""A view's step while its changed statement is being rebuilt (:mod:`epochal.checkpoint.statements.rebuilds`):
the old rows serve unchanged (an empty change, no Spark job) until the shadow has caught up, then
one step switches: the shadow's change of the epoch, the new rows' snapshot at the epoch, and the
view's change there, new rows minus old rows, for its readers, sinks and downstream views."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from epochal.checkpoint.records import Collected, EpochAborted
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements.rebuilds import OldRows
from epochal.errors import PipelineError, require
from epochal.faults import fault_point
from epochal.pipeline.fingerprints import view_fingerprint
from epochal.pipeline.model import old_version_name
from epochal.pipeline.replan import plan_statement
from epochal.runtime.data_errors import ViewDataError
from epochal.runtime.report import StepReport
from epochal.sql import quote
from epochal.storage.changes import net_rows, unit_changes
from epochal.storage.vnode import vnodes_per_directory, write_laid_out
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from collections.abc import Callable

    from epochal.pipeline.model import ViewDef
    from epochal.runtime.context import StepContext
    from epochal.runtime.view_step import ViewSteps

log = logging.getLogger("epochal.rebuild")


class RebuildSteps:
    def __init__(self, ctx: StepContext, views: ViewSteps, add_shadows: Callable[[], list[str]]):
        self.ctx = ctx
        #: the view steps that maintain the old statement, and write the new one's epochs
        self.views = views
        #: gives each view being rebuilt its new statement's shadow (``PipelineEdits.add_shadows``)
        self._add_shadows = add_shadows
        #: (view, new statement's fingerprint) -> why its switch waits, or None (``_type_change``)
        self._type_changes: dict[tuple[str, str], str | None] = {}
        #: (view, old statement's fingerprint) -> its definition today, or why there is none
        self._old_definitions: dict[tuple[str, str], tuple[list[ViewDef], str | None]] = {}

    def run(self, epoch: int, view: str, run_id: str | None, release: bool) -> StepReport:
        ctx = self.ctx
        started = time.time()
        ctx.controller.wait_for_order(epoch, [view], f"view {view}")
        begun = ctx.begin_step(epoch, run_id, table=view)
        if view in begun.collected:  # a retry of a step that finished: its output stands
            return StepReport(view, epoch, {"epoch": epoch, "mode": "rebuilding", "recorded": False})
        controller = ctx.controller
        rebuild = controller.rebuild(view)
        if rebuild is None or not rebuild.state.active or rebuild.switched_epoch not in (None, epoch):
            # It switched at an earlier epoch while this step waited for that one: the new
            # statement's rows serve from there, maintained as any view's (the old statement's
            # stages did not write the switch's epoch, and are retired with the rebuild).
            return self.views.run_checked(epoch, view, run_id, release)
        shadow = rebuild.shadow  # type: ignore[union-attr]
        self._add_shadows()
        inputs = ctx.pipeline.views[shadow].upstreams if shadow in ctx.pipeline.views else ()
        held = None
        # A process holding another new statement than the rebuild's (it read its SQL files before
        # the change, or holds one no injection acted on yet) serves the old rows: it must neither
        # judge the new statement's types nor write its epochs.
        current = shadow in ctx.pipeline.views and (
            view_fingerprint(ctx.pipeline.views[shadow]) == rebuild.new_fingerprint  # type: ignore[union-attr]
        )
        if not current and rebuild.state is not rebuilds.RebuildState.SERVING_OLD:  # type: ignore[union-attr]
            # (the step that switches, again: it cannot serve the old rows at the switch's epoch)
            self.views.check_statement(view, rebuild.new_statement)  # type: ignore[union-attr]
        if not current:
            log.info("%s: this process holds another statement than the one being built; the old rows serve", view)
        elif rebuild.state is rebuilds.RebuildState.SERVING_OLD:  # type: ignore[union-attr]
            held = self._type_change(view, shadow, epoch, rebuild.new_fingerprint)  # type: ignore[union-attr]
            if held != rebuild.held:  # type: ignore[union-attr]
                controller.hold_rebuild(view, held)
            if held:
                log.warning("%s keeps serving its old statement: %s", view, held)
        gap = None
        if current and not held:
            gap = controller.rebuild_switch_gap(view, epoch, inputs)
        outside = controller.outside_alignment()
        # Its inputs' changes of this epoch come from their live steps: a stage still backfilling has none.
        ready = gap is not None and all(u in begun.collected and u not in outside for u in inputs)
        if ready and gap:
            ready = self._write_ahead(view, shadow, gap, run_id)
        if not ready:
            # status() shows the shadow's backfill under the view's own name.
            progress = controller.backfill_status().get(view, {})
            about = {
                "new_statement_phase": progress.get("phase", "waiting"),
                "new_statement_epochs_behind": progress.get("epochs_behind"),
                **({"switch_held": held} if held else {}),
            }
            old = self._maintained_old(view, rebuild)  # type: ignore[arg-type]
            if old:
                from pyspark.errors import AnalysisException

                try:
                    # The old statement's stages first (they are its inputs), then the view.
                    for stage in old[:-1]:
                        self.views.run(epoch, stage.name, run_id, False, definition=stage)
                    report = self.views.run(epoch, view, run_id, release, definition=old[-1])
                except AnalysisException as error:
                    # (e.g. its stored rows are none and their columns are read as the new statement's)
                    self._freeze(view, f"Spark refused the old statement: {error}")
                except ViewDataError as error:
                    # A record the old statement cannot compute (often why it was edited): maintained
                    # on, it would fail every epoch until the switch, and the switch needs epochs.
                    self._freeze(view, f"the old statement fails on epoch {epoch}'s records: {error.failure.message}")
                else:
                    report.metadata.update({"mode": "rebuilding", "serving": "old statement, maintained", **about})
                    return report
            _, recorded = ctx.record_idle(epoch, view, started, run_id, release, dead_letters=None)
            return StepReport(
                view,
                epoch,
                {
                    "epoch": epoch,
                    "mode": "rebuilding",
                    "serving": "old statement, frozen",
                    **about,
                    "rows_changed": 0,
                    "seconds": round(time.time() - started, 3),
                    "recorded": recorded,
                },
            )
        return self._switch(epoch, view, shadow, started, run_id, release)

    def _maintained_old(self, view: str, rebuild: rebuilds.Rebuild) -> list[ViewDef]:
        """The old statement to run this epoch's step with (its stages, then the view), or nothing
        when the old rows serve frozen. The first step decides (PENDING), and a maintained version
        that can no longer be (a table it reads left the pipeline) freezes from then on: never the
        other way, since rows that missed an epoch's change are no version of the view at all."""
        mode = rebuild.old_rows
        if mode is OldRows.FROZEN:
            return []
        definitions_, why_not = self._old_definition(view, rebuild.old_fingerprint)
        if definitions_:
            why_not = self._why_not_maintained(view, definitions_)
        if why_not is None:
            if mode is OldRows.PENDING:
                # (decided against the row as it is now: a step of another epoch may have decided first)
                mode = self.ctx.controller.decide_old_rows(view, OldRows.MAINTAINED)
                if mode is OldRows.FROZEN:
                    self.ctx.old_versions.pop(view, None)
                    return []
                log.info("%s: its old statement keeps being maintained until the switch", view)
            self._register(view, definitions_)
            return definitions_
        self._freeze(view, why_not or "its old statement cannot be planned")
        return []

    def _freeze(self, view: str, why: str) -> None:
        self.ctx.controller.decide_old_rows(view, OldRows.FROZEN)
        self.ctx.old_versions.pop(view, None)
        log.warning("%s: its old rows serve frozen until the switch: %s", view, why)

    def _register(self, view: str, old: list[ViewDef]) -> None:
        """While the old statement is maintained, readers of the view (sinks, the views on it) take
        its rows as typed by that statement (``EpochRuntime.query_schema``): the new one's types may
        differ, which holds the switch (``_type_change``) but not the old rows."""
        for definition in old:
            self.ctx.old_versions[definition.name] = definition

    def note_old_versions(self, active: dict[str, rebuilds.Rebuild]) -> None:
        """Register the old statements being maintained, for a process whose steps read such a view
        before (or without) running its step; forget those whose view switched or froze."""
        for view in [v for v in self.ctx.old_versions if v in self.ctx.pipeline.views]:
            rebuild = active.get(view)
            if rebuild is None or rebuild.state is not rebuilds.RebuildState.SERVING_OLD:
                del self.ctx.old_versions[view]
        for view, rebuild in active.items():
            if view in self.ctx.pipeline.views and rebuild.state is rebuilds.RebuildState.SERVING_OLD:
                if rebuild.old_rows is OldRows.MAINTAINED:
                    old, _ = self._old_definition(view, rebuild.old_fingerprint)
                    self._register(view, old)

    def _old_definition(self, view: str, fingerprint: str) -> tuple[list[ViewDef], str | None]:
        """The view as its old statement defines it over today's pipeline: its internal stages under
        their old-version names, then the view (under its own), or why it cannot be. Once per
        statement and runtime (planning parses and plans the SQL; no Spark job)."""
        remembered = self._old_definitions.get((view, fingerprint))
        if remembered is not None:
            return remembered
        ctx = self.ctx
        kept = ctx.controller.kept_statement(fingerprint)
        found: tuple[list[ViewDef], str | None]
        if kept is None:
            found = ([], "its old statement was not kept (it ran before Epochal kept statements)")
        else:
            # Planned under the old version's name, so that its stages get their old-version names.
            name = old_version_name(view, view)
            location = ctx.pipeline.views[view].location
            try:
                planned = plan_statement(
                    name, kept["query"], kept["options"], kept["refresh"], ctx.pipeline, location
                )
            except PipelineError as error:
                found = ([], f"its old statement no longer plans over the pipeline: {error}")
            else:
                top = dataclasses.replace(planned.pop(name), name=view)
                found = ([*planned.values(), top], None)
        self._old_definitions[(view, fingerprint)] = found
        return found

    def _why_not_maintained(self, view: str, old: list[ViewDef]) -> str | None:
        """Why the old statement cannot run this epoch, or None. Its stages must have their state
        (kept when the statement changed). Every other table it reads must be in the pipeline and
        committed with it (not backfilling, not being rebuilt itself: its changes would be of
        another version), and be upstream of the view as the pipeline has it, so that a run writes
        it before the view's step."""
        pipeline = self.ctx.pipeline
        ancestors: set[str] = set()
        pending = list(pipeline.upstreams(view))
        while pending:
            table = pending.pop()
            if table not in ancestors:
                ancestors.add(table)
                pending.extend(pipeline.upstreams(table))
        stages = {d.name for d in old[:-1]}
        facts = self.ctx.controller.old_statement_blockers()
        stored, blocked = facts.stored, facts.blocked
        for stage in sorted(stages - stored):
            return f"its internal stage {stage} has no state (it was planned differently when it ran)"
        for table in sorted({u for d in old for u in d.upstreams} - stages):
            if table not in ancestors:
                return f"it reads {table}, which its new statement does not read"
            if table in blocked:
                return f"it reads {table}, which is backfilling, being rebuilt or retired"
        return None

    def _type_change(self, view: str, shadow: str, epoch: int, fingerprint: str) -> str | None:
        """Why the switch must wait, if the new statement changes the type of a column that
        something reads: a sink's target was made with the old types, and a view on it holds rows
        of them (its stored files and its new changes would disagree). None when the types agree
        or nothing reads the view. Once per statement and runtime (Spark analyses, no job runs)."""
        if (view, fingerprint) in self._type_changes:
            return self._type_changes[(view, fingerprint)]
        ctx = self.ctx
        pipeline = ctx.pipeline
        # (a planner stage of a view reading it is named as its view, the name the user wrote)
        readers = sorted(
            {s for s, sink in pipeline.sinks.items() if sink.from_table == view}
            | {
                d.internal_of or v
                for v, d in pipeline.views.items()
                if view in d.upstreams and rebuilds.rebuilt_view(v) is None
            }
        )
        problem = None
        old, _ = ctx.read_state(view, epoch, inclusive=False) if readers else (None, 0)
        if old is not None:
            old_types = {f.name: f.dataType.simpleString() for f in old.schema.fields}
            changed = [
                (f.name, old_types[f.name], f.dataType.simpleString())
                for f in ctx.query_schema(shadow).fields
                if f.name in old_types and old_types[f.name] != f.dataType.simpleString()
            ]
            if changed:
                name, was, _ = changed[0]
                alias = name if name.isidentifier() else quote(name)
                problem = (
                    f"the new statement changes the type of {', '.join(f'{c} {a} -> {b}' for c, a, b in changed)}, "
                    f"and {', '.join(readers)} read(s) {view} with the old types. Cast to the old type in the "
                    f"new statement (CAST(... AS {was}) AS {alias}), or give it a new name"
                )
        self._type_changes[(view, fingerprint)] = problem
        return problem

    def _write_ahead(self, view: str, shadow: str, gap: list[int], run_id: str | None) -> bool:
        """The new statement's change of each epoch in ``gap`` (after its backfill's position, before
        this one), written as its backfill would and recorded ahead. False, and nothing written, when
        its backfill runner is busy with it: a later epoch switches."""
        ctx = self.ctx
        controller = ctx.controller
        if not controller.claim_backfill(shadow):
            return False
        try:
            backfill = controller.backfill(shadow)
            require(backfill is not None, f"the new statement of {view} has a backfill")
            root = ctx.warehouse.backfill_root(shadow, backfill.snapshot_epoch)  # type: ignore[union-attr]
            for epoch in gap:
                captured: list[Collected] = []
                with ctx.recording_for_backfill(root, captured.append):
                    self.views.run(epoch, shadow, run_id=run_id)
                require(len(captured) == 1, f"the new statement of {view} wrote epoch {epoch} once")
                change = captured[0]
                try:
                    controller.record_backfill_ahead(
                        shadow, epoch, change.location, change.rows_in or 0, change.rows_out or 0, change.seconds
                    )
                except BaseException:
                    if change.location is not None:
                        ctx.warehouse.delete([change.location])
                    raise
        finally:
            controller.release_backfill(shadow)
        return True

    def _switch(
        self, epoch: int, view: str, shadow: str, started: float, run_id: str | None, release: bool
    ) -> StepReport:
        from pyspark.sql import functions as F

        ctx = self.ctx
        ctx.old_versions.pop(view, None)  # from this epoch its rows are the new statement's
        warehouse, controller = ctx.warehouse, ctx.controller
        backfill = controller.backfill(shadow)
        require(backfill is not None, f"the new statement of {view} has a backfill")
        # 1. The shadow's change of this epoch, as its own live step would write it.
        captured: list[Collected] = []
        root = warehouse.backfill_root(shadow, backfill.snapshot_epoch)  # type: ignore[union-attr]
        with ctx.recording_for_backfill(root, captured.append):
            self.views.run(epoch, shadow, run_id=run_id)
        require(len(captured) == 1, f"the new statement of {view} wrote epoch {epoch} once")
        change = captured[0]
        # 2. The new rows at this epoch, as the view's snapshot there (announced first: a sweep
        #    never takes a directory it was told about).
        before, rows_read = ctx.read_state(shadow, epoch, inclusive=False)
        weighted = before.withColumn(WEIGHT, F.lit(1).cast("bigint"))
        if change.location is not None:
            weighted = weighted.unionByName(warehouse.read(ctx.spark, [change.location]))
        new_rows = net_rows(weighted)
        key = ctx.distribution_key(view)
        location = warehouse.new_snapshot_location(view, epoch)
        controller.begin_snapshot(view, epoch, location, key, new_rows.schema.json(), in_flight=True)
        diff_location: str | None = None
        try:
            with controller.snapshot_lease(location):
                width = vnodes_per_directory(rows_read, ctx.settings.snapshot_directory_rows)
                write_laid_out(new_rows, key, width, location)
            files = warehouse.snapshot_files(location)
            rows = warehouse.files_row_count(files)
            # 3. The view's change: the new rows minus the old rows before this epoch, in the new
            #    rows' columns (a column the old rows lack is NULL in their retraction).
            new_state = (
                warehouse.read(ctx.spark, [location])
                if files
                else ctx.spark.createDataFrame([], new_rows.schema)
            )
            old_state, old_read = ctx.read_state(view, epoch, inclusive=False)
            old_columns = set(old_state.columns)
            old_aligned = old_state.select(
                *(
                    (F.col(quote(f.name)) if f.name in old_columns else F.lit(None)).cast(f.dataType).alias(f.name)
                    for f in new_rows.schema.fields
                )
            )
            diff = unit_changes(
                new_state.select(*(quote(f.name) for f in new_rows.schema.fields))
                .withColumn(WEIGHT, F.lit(1).cast("bigint"))
                .unionByName(old_aligned.withColumn(WEIGHT, F.lit(-1).cast("bigint")))
            )
            diff_location = warehouse.new_location(view, epoch)
            changed = warehouse.write(diff, diff_location)
            controller.switch_rebuild(view, epoch, location, rows, len(files))
        except BaseException:
            warehouse.delete([location], prune_parents=True)
            controller.abandon_snapshot(location)
            if diff_location is not None:
                warehouse.delete([diff_location])
            raise
        fault_point("rebuild-switched")
        if change.location is not None:
            warehouse.delete([change.location])  # in the snapshot now; nothing else reads it
        # 4. Collected like any step of the view: the epoch commits it with every other table.
        try:
            seconds = time.time() - started
            collected = Collected(view, diff_location, rows_read + old_read, changed, None, None, seconds, run_id)
            recorded = ctx.collect(epoch, collected, [diff_location], release)
        except EpochAborted:
            warehouse.delete([diff_location])
            raise
        return StepReport(
            view,
            epoch,
            {
                "epoch": epoch,
                "mode": "switched to the new statement",
                "serving": "new statement",
                "rows_changed": changed,
                "state_rows": rows,
                "state_rows_read": rows_read + old_read,
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
            },
        )
