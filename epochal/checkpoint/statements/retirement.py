"""Tables and sinks that left the pipeline's SQL files: their meta-store rows are retired in one
transaction, and the caller deletes their files (``EpochRuntime.apply_pipeline_changes``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.backfills import rows as backfill_rows
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements import sinks as sink_statements
from epochal.checkpoint.statements import views as definitions
from epochal.checkpoint.statements.sinks import SinkRecipe
from epochal.meta.backend import Cursor
from epochal.pipeline.model import OLD_VERSION_SEPARATOR

log = logging.getLogger("epochal.runtime")


def _removed_sinks(cur: Cursor, sinks: Iterable[str], loaded_at: float) -> list[str]:
    """Sinks with delivery records that the SQL files read at ``loaded_at`` no longer name (a sink
    first delivered after this process read its files is newer than they are, not removed)."""
    recorded = {
        r[0]
        for r in cur.execute("SELECT sink, min(created_at) FROM sink_batches GROUP BY sink").fetchall()
        if r[1] <= loaded_at
    } | {r[0] for r in cur.execute("SELECT sink, decided_at FROM sink_starts").fetchall() if r[1] <= loaded_at}
    return sorted(recorded - set(sinks))


def _unfinished_batches(cur: Cursor, sink: str) -> int:
    """Batches whose pre-commit may still be in the target (a prepared transaction, staged files)."""
    return cur.execute(
        "SELECT count(*) FROM sink_batches WHERE sink = ? AND (state = 'PENDING' OR NOT cleaned) "
        "AND state <> 'COMMITTED'",
        [sink],
    ).fetchone()[0]


def unfinished_removed_sinks(
    cur: Cursor, sinks: Iterable[str], loaded_at: float
) -> list[tuple[str, int, SinkRecipe | None]]:
    """Removed sinks (``_removed_sinks``) with batches not finished: (sink, how many, its recipe)."""
    found = []
    for sink in _removed_sinks(cur, sinks, loaded_at):
        count = _unfinished_batches(cur, sink)
        if count:
            found.append((sink, count, sink_statements.recipe(cur, sink)))
    return found


def retire_removed(
    cur: Cursor, tables: set[str], sinks: Iterable[str], loaded_at: float
) -> tuple[list[str], list[str]]:
    """Retire what the SQL files read at ``loaded_at`` no longer name: ``tables`` and ``sinks`` are
    the ones they do name (views being rebuilt aside). Returns what left (``sink <name>`` for a
    sink) and the locations of their files to delete."""
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
    for sink in _removed_sinks(cur, sinks, loaded_at):
        open_batches = _unfinished_batches(cur, sink)
        if open_batches:
            # a pre-commit may still hold locks downstream: kept until ``unfinished_removed_sinks``'
            # caller finished them
            log.warning(
                "sink %s left the pipeline with %d batch(es) not finished; its records stay until they are",
                sink,
                open_batches,
            )
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
