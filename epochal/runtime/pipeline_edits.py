"""What changes when a pipeline's statements change between runs: a view being rebuilt gets its new
statement's shadow twin, and tables and sinks that left the pipeline are retired with their files
and meta-store rows. Called by the runtime before a run's first step, by the backfill runner and by
the rebuilding step (:mod:`epochal.runtime.rebuild_step`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import TYPE_CHECKING

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.backfills import rows as backfill_rows
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements import views as definitions
from epochal.pipeline.model import OLD_VERSION_SEPARATOR

if TYPE_CHECKING:
    from epochal.meta.backend import Cursor
    from epochal.pipeline.model import ViewDef
    from epochal.runtime.facade import EpochRuntime

log = logging.getLogger("epochal.runtime")


class PipelineChanges:
    def __init__(self, runtime: "EpochRuntime"):
        self.runtime = runtime

    def add_shadows(self) -> list[str]:
        """Every view being rebuilt gets its new statement's twin under the shadow name, which the
        backfill runner and the switching step run (:mod:`epochal.checkpoint.statements.rebuilds`); the twin
        of a rebuild that is done goes. Returns the shadows the pipeline holds now."""
        active = self.runtime.controller.backend.transaction(rebuilds.active)
        wanted = {r.shadow: view for view, r in active.items() if view in self.runtime.pipeline.views}
        views = {
            n: v for n, v in self.runtime.pipeline.views.items() if rebuilds.rebuilt_view(n) is None or n in wanted
        }
        for shadow, view in wanted.items():
            views.setdefault(shadow, dataclasses.replace(views[view], name=shadow, internal_of=view))
        if views.keys() != self.runtime.pipeline.views.keys():
            self.runtime.pipeline = dataclasses.replace(self.runtime.pipeline, views=views)
        self.runtime.rebuild_steps.note_old_versions(active)
        return sorted(wanted)

    def retire_removed(self) -> list[str]:
        """Views whose statement left the pipeline: their meta-store rows and files are deleted
        (the loader already refused the pipeline if anything still reads them)."""
        # (without the shadows ``add_shadows`` put in: whether one is still needed is the meta store's call)
        tables = {t for t in self.runtime.pipeline.tables if rebuilds.rebuilt_view(t) is None}
        loaded_at = self.runtime.pipeline.loaded_at

        def retire(cur: "Cursor") -> tuple[list[str], list[str]]:
            # A switch to a view's new statement that committed: its shadow has done its work.
            finished = rebuilds.finish_committed(cur, q.committed_epoch(cur))
            rebuilding = [v for v in rebuilds.active(cur) if v in tables]
            serving = {rebuilds.shadow_name(v) for v in rebuilding}
            rows = cur.execute("SELECT table_name, registered_at FROM table_epochs").fetchall()
            backfills = backfill_log.all_backfills(cur)
            known = {r[0] for r in rows} | {b.view for b in backfills}
            # (the old statement's stages, maintained until the switch)
            serving |= {t for t in known for v in rebuilding if t.startswith(f"{v}{OLD_VERSION_SEPARATOR}")}
            # A table that joined after this process read its SQL files is newer than they are: not
            # naming it is not removing it (a run of the newer files is computing it).
            newer = {t for t, at in rows if at is not None and at > loaded_at}
            newer |= {b.view for b in backfills if b.started_at > loaded_at}
            gone = sorted(known - tables - serving - newer)
            rebuilds.forget(cur, [t for t in gone if t not in finished])
            definitions.prune_statements(cur)
            # A removed sink's delivery records go too (its target keeps what it received), its start
            # with them: a sink added back under the name is a new one, starting from a snapshot, not
            # from history compaction may have released.
            # (a sink first delivered after this process read its files is newer)
            sinks = {
                r[0]
                for r in cur.execute("SELECT sink, min(created_at) FROM sink_batches GROUP BY sink").fetchall()
                if r[1] <= loaded_at
            } | {r[0] for r in cur.execute("SELECT sink, decided_at FROM sink_starts").fetchall() if r[1] <= loaded_at}
            for sink in sorted(sinks - set(self.runtime.pipeline.sinks)):
                open_batches = cur.execute(
                    "SELECT count(*) FROM sink_batches WHERE sink = ? AND (state = 'PENDING' OR NOT cleaned) "
                    "AND state <> 'COMMITTED'",
                    [sink],
                ).fetchone()[0]
                if open_batches:  # a pre-commit may still hold locks downstream: kept for its recovery
                    log.warning("sink %s left the pipeline with %d batch(es) not finished", sink, open_batches)
                    continue
                cur.execute("DELETE FROM sink_batches WHERE sink = ?", [sink])
                cur.execute("DELETE FROM sink_claims WHERE sink = ?", [sink])
                cur.execute("DELETE FROM sink_declarations WHERE sink = ?", [sink])
                cur.execute("DELETE FROM sink_starts WHERE sink = ?", [sink])
                gone.append(f"sink {sink}")
            retired = backfill_log.retire(cur, [t for t in gone if not t.startswith("sink ")])
            # (a shadow is the meta store's own table: its name comes back with the view's next change)
            # (nor are an old version's stages: their names come back with the view's next change)
            backfill_rows.mark_retired(
                cur,
                [
                    t
                    for t in gone
                    if not t.startswith("sink ") and rebuilds.rebuilt_view(t) is None and OLD_VERSION_SEPARATOR not in t
                ],
            )
            return gone, retired

        gone, garbage = self.runtime.controller.backend.transaction(retire)
        # Its whole directory: what runs killed before recording a file is there too.
        garbage += [self.runtime.warehouse.table_root(t) for t in gone if not t.startswith("sink ")]
        if garbage:
            self.runtime.reader.release_snapshots(garbage)
            self.runtime.warehouse.delete(garbage, prune_parents=True)
        if any(rebuilds.rebuilt_view(g) is not None for g in gone):
            self.add_shadows()  # a finished rebuild's shadow leaves this process's pipeline too
        if [g for g in gone if rebuilds.rebuilt_view(g) is None]:
            log.warning("retired %s: no longer in the pipeline; deleted %d location(s)", gone, len(garbage))
        return gone

    def delete_dropped(self) -> int:
        """Delete the files of views whose statement changed (``backfill_rows.drop_for_rebuild``
        listed them in the transaction that dropped their rows); returns the locations deleted."""
        backend, warehouse = self.runtime.controller.backend, self.runtime.warehouse
        locations, roots = backend.transaction(backfill_rows.dropped_files)
        if not locations and not roots:
            return 0
        doomed = [*locations, *(warehouse.backfill_root(view, epoch) for view, epoch in roots)]
        self.runtime.reader.release_snapshots(doomed)
        warehouse.delete(doomed, prune_parents=True)
        backend.transaction(lambda cur: backfill_rows.clear_dropped(cur, locations, roots))
        log.info("deleted %d location(s) of views rebuilt after their statement changed", len(doomed))
        return len(doomed)


def view_fingerprint(view: "ViewDef") -> str:
    """What a view's stored rows depend on: its query (whitespace aside), columns and refresh mode."""
    text = " ".join(view.query.split()) + "|" + ",".join(view.columns) + "|" + view.refresh
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def view_statement(view: "ViewDef") -> str:
    """The statement as the meta store keeps it (``view_statements``): enough to plan it again."""
    return json.dumps({"query": view.query, "options": dict(view.options), "refresh": view.refresh}, sort_keys=True)
