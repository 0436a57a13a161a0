"""Whether each view's stored state comes from its current statement, and what happens when not
(``check_definitions``):

* a view still backfilling starts again (nothing has read it yet);
* a view that committed epochs keeps serving its old rows while its new statement backfills under
  a shadow name, then switches at one epoch boundary (:mod:`epochal.checkpoint.statements.rebuilds`); its
  internal stages, which only it reads, are rebuilt in place;
* an internal stage that changed alone (its view did not) is rebuilt in place with the views built
  on it; refused when a sink reads one of them.

A process whose SQL files were read before the stored statement was recorded holds an older one:
it is not a change. Acting on it would take the view back to the statement the user left (and,
with the next up-to-date process, forward again, deleting each backfill's files under the runners
reading them), so such a process injects nothing (``StaleStatements``), and its steps do not
compute a view whose state comes from another statement (``stored_statement``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills.rows import drop_for_rebuild, read, rename_state
from epochal.checkpoint.records import InjectionBlocked
from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError
from epochal.meta.backend import Cursor
from epochal.pipeline.model import STAGE_SEPARATOR, old_version_name

log = logging.getLogger("epochal.backfill")


class DefinitionChanged(EpochalError):
    """A view's statement changed under the same name after it committed epochs."""


class StaleStatements(InjectionBlocked):
    """This process read its SQL files before another one recorded newer statements of its views."""


def stale_files_message(what: str, consequence: str) -> str:
    """Why a process that read its SQL files before a newer process recorded ``what`` (its statement,
    declaration) refuses to go on, ``consequence`` saying what it must not do; shared by views,
    sources and sinks."""
    return (
        f"{what} changed after this process read its SQL files (a newer process recorded it): {consequence}. "
        "The next run reads the files afresh; a long-lived process (a code server) needs reloading"
    )


def stale_message(views: Iterable[str]) -> str:
    return stale_files_message(
        f"the statement of {', '.join(sorted(views))}",
        "this one holds the old statement and must not compute or inject with it",
    )


def stored_statement(cur: Cursor, table: str) -> tuple[str, float | None] | None:
    """The fingerprint of the statement ``table``'s steps must compute with from now on, and when
    it was recorded; None when the meta store keeps none (a new view). A changed view's new
    statement for its shadow, and for the view once it switched; else the stored definition. (A
    view still serving its old rows is run by the rebuilding step, which does not ask this.)"""
    view = rebuilds.rebuilt_view(table)
    if view is not None:
        rebuild = rebuilds.read(cur, view)
        return None if rebuild is None else rebuild.new_statement
    rebuild = rebuilds.read(cur, table)
    if rebuild is not None and rebuild.state is rebuilds.RebuildState.SWITCHED:
        # (the definition follows when the switch's epoch commits)
        return rebuild.new_statement
    row = cur.execute("SELECT fingerprint, recorded_at FROM table_definitions WHERE table_name = ?", [table]).fetchone()
    return (row[0], row[1]) if row else None


def check_statement(stored: tuple[str, float | None] | None, table: str, fingerprint: str, loaded_at: float) -> None:
    """Refuse to compute ``table`` with this process's statement (``fingerprint``, its SQL files
    read at ``loaded_at``) when its state comes from another: the rows would mix the two."""
    if stored is None or stored[0] == fingerprint:
        return
    if recorded_after(stored[1], loaded_at):
        raise StaleStatements(stale_message([table]))
    raise DefinitionChanged(
        f"the statement of {table} in this process's SQL files is not the one its stored rows come from, and no "
        "injection has acted on the change yet, so this process cannot compute it. The next injection "
        "(epoch_job without a partition, or the barrier sensor) starts its rebuild; a recovery takes back an "
        "epoch this refused, and re-runs it"
    )


def recorded_after(recorded_at: float | None, loaded_at: float | None) -> bool:
    """Whether a statement (or a source's declaration) recorded at ``recorded_at`` is newer than
    SQL files read at ``loaded_at``."""
    return recorded_at is not None and loaded_at is not None and recorded_at > loaded_at


def check_definitions(
    cur: Cursor,
    fingerprints: Mapping[str, str],
    readers: Mapping[str, list[str]],
    sink_inputs: Mapping[str, str] | None = None,
    append_only_sinks: Iterable[str] = (),
    columns: Mapping[str, Sequence[str]] | None = None,
    loaded_at: float | None = None,
) -> list[str]:
    """Every view's definition is the one its stored state was computed from, or is being built
    (module docstring); returns the internal stages rebuilt in place, and the views rebuilt with them.

    An internal stage that changed while its view did not (the planner split it differently) has
    nothing to serve from: it is rebuilt in place with every view built on it, as if they had just
    been added. That is refused, with the fixes, when a sink reads one of them (its target holds
    rows of the old version and would not receive their difference) or when the sinks are not
    known (``sink_inputs`` None). ``columns``: each view's column names, kept with its definition;
    a view that switches to a new statement must keep them when a sink reads it.

    ``loaded_at``: when this process read its SQL files. A statement recorded after that is newer
    than this process's: ``StaleStatements`` is raised, and nothing is changed."""
    columns = columns or {}
    rows = cur.execute("SELECT table_name, fingerprint, columns, recorded_at FROM table_definitions").fetchall()
    stored = {r[0]: r[1] for r in rows}
    stored_at = {r[0]: r[3] for r in rows}
    stored_columns = {r[0]: tuple(json.loads(r[2])) for r in rows if r[2] is not None}
    rebuilding = rebuilds.active(cur)
    stale = []
    for view, fingerprint in fingerprints.items():
        rebuild = rebuilding.get(view)
        if rebuild is not None:
            newest, at = rebuild.new_statement
        else:
            newest, at = stored.get(view), stored_at.get(view)
        if newest is not None and fingerprint != newest and recorded_after(at, loaded_at):
            stale.append(view)
    if stale:
        raise StaleStatements(stale_message(stale))
    changed = []
    for view, fingerprint in fingerprints.items():
        rebuild = rebuilding.get(view)
        if rebuild is not None:
            if fingerprint != rebuild.new_fingerprint and rebuild.state is rebuilds.RebuildState.SERVING_OLD:
                _check_sink_columns([view], sink_inputs or {}, stored_columns, columns)
                log.warning("view %s changed again while its new statement was backfilling: that starts again", view)
                drop_for_rebuild(cur, rebuild.shadow)
                rebuilds.restart(cur, view, fingerprint)
            # (A switch in flight commits first; the injection after it sees the newer statement.)
            continue
        if stored.get(view) == fingerprint:
            if view not in stored_columns and view in columns:  # kept since this release, or just switched
                # (the statement is the one recorded then: its time stays)
                cur.execute(
                    "UPDATE table_definitions SET columns = ? WHERE table_name = ?",
                    [json.dumps(list(columns[view])), view],
                )
            continue
        b = read(cur, view)
        if view not in stored:
            _remember(cur, view, fingerprint, columns.get(view))
        elif b is not None and b.phase.active:
            log.warning("view %s changed while it was backfilling: its backfill starts again", view)
            drop_for_rebuild(cur, view)
            _remember(cur, view, fingerprint, columns.get(view))
        else:
            changed.append(view)
    if not changed:
        return []
    # A view with committed epochs keeps serving its old rows while its new statement backfills
    # under a shadow name; its own stages, read by nothing else, are simply rebuilt under it.
    committed = q.committed_epoch(cur)
    served = sorted(v for v in changed if STAGE_SEPARATOR not in v and committed is not None)
    _check_switchable(served, sink_inputs, append_only_sinks)
    _check_sink_columns(served, sink_inputs or {}, stored_columns, columns)
    for view in served:
        rebuilds.start(cur, view, stored[view], fingerprints[view], committed)  # type: ignore[arg-type]
        for stage in _keep_old_stages(cur, view):
            if stage in fingerprints and stage not in changed:  # unchanged, but its state went with the old
                _rebuild_in_place(cur, stage, fingerprints, columns)
        log.warning(
            "the statement of view %s changed: its old rows keep serving while the new one backfills as %s, "
            "then readers and sinks switch to it at one epoch, receiving the difference",
            view,
            rebuilds.shadow_name(view),
        )
    stages = [v for v in changed if v not in served and v.split(STAGE_SEPARATOR)[0] in served]
    for stage in stages:
        _rebuild_in_place(cur, stage, fingerprints, columns)
    changed = [v for v in changed if v not in served and v not in stages]
    if not changed:
        return stages
    rebuilt = _downstream(changed, readers, fingerprints)
    sinks = sorted(s for s, table in (sink_inputs or {}).items() if table in rebuilt)
    if sinks or sink_inputs is None:
        # An internal stage changes with the view it was split from: name the view.
        named = sorted({v.split(STAGE_SEPARATOR)[0] for v in changed})
        held = f"sink(s) {', '.join(sinks)} read it or a view built on it and hold" if sinks else "a sink may hold"
        raise DefinitionChanged(
            f"the statement of view(s) {', '.join(named)} changed after they committed epochs, and {held} "
            "rows of its old version, which a rebuild would not retract. Give the new statement a new "
            "name (it backfills while the old view keeps serving, then move the sinks to it), or remove the "
            "sinks' statements and rebuild in place with "
            + ", ".join(f"`epochal backfill {v} --rebuild`" for v in named)
        )
    for view in sorted(rebuilt):
        _rebuild_in_place(cur, view, fingerprints, columns)
    log.warning(
        "the statement of view(s) %s changed: rebuilding %s by backfill from the committed epoch",
        ", ".join(sorted(changed)),
        ", ".join(sorted(rebuilt)),
    )
    return sorted(rebuilt)


def _check_switchable(
    views: list[str], sink_inputs: Mapping[str, str] | None, append_only_sinks: Iterable[str]
) -> None:
    """A view switching to its new statement retracts the rows only the old one had: a sink that
    cannot take a retraction must not read it, and neither may one nobody can rule out."""
    if not views:
        return
    fixes = (
        "Give the new statement a new name (it backfills while the old view keeps serving, then move the "
        "sinks to it), or remove the sinks' statements and rebuild in place with "
        + ", ".join(f"`epochal backfill {v} --rebuild`" for v in views)
    )
    if sink_inputs is None:
        raise DefinitionChanged(
            f"the statement of view(s) {', '.join(views)} changed after they committed epochs, and this "
            f"process does not know the pipeline's sinks: a sink may hold rows of the old version. {fixes}"
        )
    held = sorted(s for s in append_only_sinks if sink_inputs.get(s) in views)
    if held:
        raise DefinitionChanged(
            f"the statement of view(s) {', '.join(views)} changed after they committed epochs, and the "
            f"append-only sink(s) {', '.join(held)} read it: switching to the new statement retracts the rows "
            "only the old one had, which an append-only target cannot take. Make the sink type = 'upsert' "
            f"with a primary_key, or: {fixes}"
        )


def _check_sink_columns(
    views: list[str],
    sink_inputs: Mapping[str, str],
    stored_columns: Mapping[str, tuple[str, ...]],
    columns: Mapping[str, Sequence[str]],
) -> None:
    """A sink's target was made with the columns of the view's old statement: the switch would
    hand it rows of other columns, and the sink would fail at every epoch from then on."""
    for view in views:
        old, new = stored_columns.get(view), tuple(columns.get(view, ()))
        sinks = sorted(s for s, table in sink_inputs.items() if table == view)
        if old is None or not new or old == new or not sinks:
            continue
        dropped = [c for c in old if c not in new]
        added = [c for c in new if c not in old]
        what = "; ".join(
            part
            for part in (
                f"without {', '.join(dropped)}" if dropped else "",
                f"with new {', '.join(added)}" if added else "",
                "in another order" if not dropped and not added else "",
            )
            if part
        )
        raise DefinitionChanged(
            f"the new statement of view {view} has other columns than its stored rows ({what}: "
            f"{', '.join(new)} instead of {', '.join(old)}), and sink(s) {', '.join(sinks)} read it, whose "
            "target has the old columns. Keep the names and order (alias the new expressions: "
            f"... AS {old[0]}, ...), or give the new statement a new name with a sink of its own, or remove "
            f"the sinks' statements and rebuild in place with `epochal backfill {view} --rebuild`"
        )


def record_statements(cur: Cursor, statements: Mapping[str, str]) -> None:
    """Keep each statement (JSON, by fingerprint) that is not kept yet: the old statement of a view
    being rebuilt is found here by the fingerprint of its stored rows."""
    if not statements:
        return
    marks = ", ".join("?" * len(statements))
    known = {
        r[0]
        for r in cur.execute(
            f"SELECT fingerprint FROM view_statements WHERE fingerprint IN ({marks})", list(statements)
        ).fetchall()
    }
    now = time.time()
    for fingerprint, statement in statements.items():
        if fingerprint not in known:
            cur.execute(
                "INSERT INTO view_statements (fingerprint, statement, recorded_at) VALUES (?, ?, ?) "
                "ON CONFLICT (fingerprint) DO NOTHING",
                [fingerprint, statement, now],
            )


def statement(cur: Cursor, fingerprint: str) -> dict | None:
    """The statement kept for ``fingerprint`` (query, options, refresh), or None."""
    row = cur.execute("SELECT statement FROM view_statements WHERE fingerprint = ?", [fingerprint]).fetchone()
    return json.loads(row[0]) if row else None


#: A statement nothing refers to is kept this long: a process that read it may be about to inject.
STATEMENT_KEPT_S = 7 * 24 * 3600.0


def prune_statements(cur: Cursor) -> None:
    """Forget statements that no view's stored rows and no rebuild come from, after a while."""
    cur.execute(
        "DELETE FROM view_statements WHERE recorded_at < ? "
        "AND fingerprint NOT IN (SELECT fingerprint FROM table_definitions) "
        "AND fingerprint NOT IN (SELECT old_fingerprint FROM view_rebuilds) "
        "AND fingerprint NOT IN (SELECT new_fingerprint FROM view_rebuilds)",
        [time.time() - STATEMENT_KEPT_S],
    )


def _remember(cur: Cursor, view: str, fingerprint: str, columns: Sequence[str] | None) -> None:
    """The definition the view's stored rows come from (replacing any earlier one)."""
    cur.execute("DELETE FROM table_definitions WHERE table_name = ?", [view])
    cur.execute(
        "INSERT INTO table_definitions (table_name, fingerprint, columns, recorded_at) VALUES (?, ?, ?, ?)",
        [view, fingerprint, None if columns is None else json.dumps(list(columns)), time.time()],
    )


def _keep_old_stages(cur: Cursor, view: str) -> list[str]:
    """The stored internal stages of ``view``, whose statement changed, move to their old-version
    names (``old_version_name``): the old statement is maintained with them until the switch, while
    the stages under their own names are rebuilt for the new one. Returns the stages moved."""
    prefix = f"{view}{STAGE_SEPARATOR}"
    stages = sorted(
        r[0] for r in cur.execute("SELECT table_name FROM table_epochs").fetchall() if r[0].startswith(prefix)
    )
    for stage in stages:
        old = old_version_name(view, stage)
        drop_for_rebuild(cur, old)  # what an earlier rebuild of the view may have left
        rename_state(cur, stage, old)
    return stages


def _rebuild_in_place(
    cur: Cursor, view: str, fingerprints: Mapping[str, str], columns: Mapping[str, Sequence[str]]
) -> None:
    """Forget the view's state: the injection registers it as a new view, which backfills."""
    drop_for_rebuild(cur, view)
    if view in fingerprints:
        _remember(cur, view, fingerprints[view], columns.get(view))


def _downstream(tables: Iterable[str], readers: Mapping[str, list[str]], views: Iterable[str]) -> set[str]:
    """``tables`` and every view that reads them, directly or through other views."""
    known, found, todo = set(views), set(tables), list(tables)
    while todo:
        for reader in readers.get(todo.pop(), []):
            if reader in known and reader not in found:
                found.add(reader)
                todo.append(reader)
    return found
