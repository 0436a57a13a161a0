"""What changes when a pipeline's statements change between runs: a view being rebuilt gets its new
statement's shadow twin, and tables and sinks that left the pipeline are retired with their files
and meta-store rows. Called by the runtime before a run's first step, by the backfill runner and by
the rebuilding step (:mod:`epochal.runtime.rebuild_step`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from epochal.checkpoint.statements import rebuilds
from epochal.redaction import redact_url
from epochal.sinks.spec import sink_spec

if TYPE_CHECKING:
    from collections.abc import Callable

    from epochal.runtime.context import StepContext

log = logging.getLogger("epochal.runtime")


class PipelineEdits:
    def __init__(self, ctx: StepContext, note_old_versions: Callable[[dict[str, rebuilds.Rebuild]], None]):
        self.ctx = ctx
        #: registers the old statements maintained while their views rebuild (``RebuildSteps``)
        self._note_old_versions = note_old_versions

    def add_shadows(self) -> list[str]:
        """Every view being rebuilt gets its new statement's twin under the shadow name, which the
        backfill runner and the switching step run (:mod:`epochal.checkpoint.statements.rebuilds`); the twin
        of a rebuild that is done goes. Returns the shadows the pipeline holds now."""
        active = self.ctx.controller.active_rebuilds()
        wanted = {r.shadow: view for view, r in active.items() if view in self.ctx.pipeline.views}
        views = {
            n: v for n, v in self.ctx.pipeline.views.items() if rebuilds.rebuilt_view(n) is None or n in wanted
        }
        for shadow, view in wanted.items():
            views.setdefault(shadow, dataclasses.replace(views[view], name=shadow, internal_of=view))
        if views.keys() != self.ctx.pipeline.views.keys():
            self.ctx.pipeline = dataclasses.replace(self.ctx.pipeline, views=views)
        self._note_old_versions(active)
        return sorted(wanted)

    def _retire_cdc_tables(self, gone: list[str]) -> None:
        """A postgres-cdc table that left: out of its publication, its slot dropped with the last one."""
        from epochal.connectors import postgres_cdc

        sources = self.ctx.pipeline.sources.values()
        in_use = {postgres_cdc.wal_holder(s.options) for s in sources if s.connector == postgres_cdc.NAME}
        for table in gone:
            if postgres_cdc.retire_removed_table(self.ctx.settings.home, table, in_use):
                log.info("postgres-cdc table %s left the pipeline: its slot and publication were cleaned up", table)

    def retire_removed(self) -> list[str]:
        """Views whose statement left the pipeline: their meta-store rows and files are deleted
        (the loader already refused the pipeline if anything still reads them)."""
        # (without the shadows ``add_shadows`` put in: whether one is still needed is the meta store's call)
        tables = {t for t in self.ctx.pipeline.tables if rebuilds.rebuilt_view(t) is None}
        self.finish_removed_sinks()
        gone, garbage = self.ctx.controller.retire_removed(
            tables, self.ctx.pipeline.sinks, self.ctx.pipeline.loaded_at
        )
        self._retire_cdc_tables(gone)
        # Its whole directory: what runs killed before recording a file is there too.
        garbage += [self.ctx.warehouse.table_root(t) for t in gone if not t.startswith("sink ")]
        if garbage:
            self.ctx.reader.release_snapshots(garbage)
            self.ctx.warehouse.delete(garbage, prune_parents=True)
        if any(rebuilds.rebuilt_view(g) is not None for g in gone):
            self.add_shadows()  # a finished rebuild's shadow leaves this process's pipeline too
        if [g for g in gone if rebuilds.rebuilt_view(g) is None]:
            log.warning("retired %s: no longer in the pipeline; deleted %d location(s)", gone, len(garbage))
        return gone

    def finish_removed_sinks(self) -> list[str]:
        """Finish the batches of sinks that left the pipeline with some not finished, through their
        recorded recipe: a PENDING batch is committed (its commit was decided), any other pre-commit
        thrown away, so no prepared transaction keeps its locks and the VACUUM horizon downstream,
        and the sink's records can go. A target out of reach is told, with the fix, and tried again
        at the next injection. Returns the sinks finished."""
        controller = self.ctx.controller
        finished = []
        for sink, count, recipe in controller.unfinished_removed_sinks(
            self.ctx.pipeline.sinks, self.ctx.pipeline.loaded_at
        ):
            if recipe is None or recipe.withheld:
                # recorded before recipes were, or a literal secret (not kept) is needed to reach the
                # target (without it the target could be another one): only its statement reaches it
                because = f"its {', '.join(recipe.withheld)} was written literally and is not kept" if recipe else (
                    "it was last delivered by an older Epochal"
                )
                log.warning(
                    "sink %s left the pipeline with %d batch(es) not finished (pre-commits may hold locks in "
                    "its target), and %s: add its statement back for one run to finish them, then remove it "
                    "again (write secrets as ${NAME} so that Epochal can finish a removed sink itself)",
                    sink,
                    count,
                    because,
                )
                continue
            try:
                spec = sink_spec(recipe.connector)
                if spec is None:
                    raise ValueError(f"Epochal has no sink connector {recipe.connector!r} any more")
                settings = self.ctx.settings
                target = spec.create(sink, dict(recipe.options), recipe.columns, settings.home, settings.meta_url)
                try:
                    report = controller.finish_removed_sink(target)
                finally:
                    close = getattr(target, "close", None)
                    if close is not None:
                        close()
            except Exception as exc:  # the target is down, an unset ${NAME}...: tried again next time
                log.warning(
                    "sink %s left the pipeline with %d batch(es) not finished, and its target could not be "
                    "reached to finish them: %s. Each injection tries again; to finish now, add its statement "
                    "back for one run, then remove it",
                    sink,
                    count,
                    redact_url(f"{type(exc).__name__}: {exc}").splitlines()[0],
                )
                continue
            if report is not None:
                log.warning(
                    "sink %s left the pipeline: finished its %d batch(es) (%d committed, %d pre-commit(s) thrown "
                    "away); its records go now, and its target keeps what it received",
                    sink,
                    count,
                    report.recommitted,
                    report.orphans_aborted,
                )
                finished.append(sink)
        return finished

    def delete_dropped(self) -> int:
        """Delete the files of views whose statement changed (``backfill_rows.drop_for_rebuild``
        listed them in the transaction that dropped their rows); returns the locations deleted."""
        controller, warehouse = self.ctx.controller, self.ctx.warehouse
        locations, roots = controller.dropped_files()
        if not locations and not roots:
            return 0
        doomed = [*locations, *(warehouse.backfill_root(view, epoch) for view, epoch in roots)]
        self.ctx.reader.release_snapshots(doomed)
        warehouse.delete(doomed, prune_parents=True)
        controller.clear_dropped(locations, roots)
        log.info("deleted %d location(s) of views rebuilt after their statement changed", len(doomed))
        return len(doomed)
