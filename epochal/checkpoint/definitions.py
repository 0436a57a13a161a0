"""Whether each view's stored state comes from its current statement, and what happens when not:
a view still backfilling starts again, a joined view is rebuilt with the views built on it, or the
change is refused when a sink holds rows of the old version (``check_definitions``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from epochal.checkpoint.backfill_log import drop_state, forget, read
from epochal.errors import EpochalError
from epochal.meta.backend import Cursor
from epochal.pipeline.model import STAGE_SEPARATOR

log = logging.getLogger("epochal.backfill")


class DefinitionChanged(EpochalError):
    """A view's statement changed under the same name after it committed epochs."""


def check_definitions(
    cur: Cursor,
    fingerprints: Mapping[str, str],
    readers: Mapping[str, list[str]],
    sink_inputs: Mapping[str, str] | None = None,
) -> list[str]:
    """Every view's definition is the one its stored state was computed from; returns the views
    rebuilt because it was not.

    A view still backfilling that changed starts again from a new snapshot (nothing has read it yet).
    A view that joined has stored rows of its old query, and going on from them would be silently
    wrong: it is rebuilt by a backfill from its new statement, with every view built on it (their
    rows came from its old rows), as if they had just been added; the other tables go on. That is
    refused, with the fixes, when a sink reads one of them (its target holds rows of the old version
    and would not receive their difference) or when the sinks are not known (``sink_inputs`` None)."""
    stored = dict(cur.execute("SELECT table_name, fingerprint FROM table_definitions").fetchall())
    changed = []
    for view, fingerprint in fingerprints.items():
        if stored.get(view) == fingerprint:
            continue
        b = read(cur, view)
        if view not in stored:
            cur.execute("INSERT INTO table_definitions VALUES (?, ?)", [view, fingerprint])
        elif b is not None and b.phase.active:
            log.warning("view %s changed while it was backfilling: its backfill starts again", view)
            drop_state(cur, view)
            forget(cur, [view])
            cur.execute("UPDATE table_definitions SET fingerprint = ? WHERE table_name = ?", [fingerprint, view])
        else:
            changed.append(view)
    if not changed:
        return []
    rebuilt = _downstream(changed, readers, fingerprints)
    sinks = sorted(s for s, table in (sink_inputs or {}).items() if table in rebuilt)
    if sinks or sink_inputs is None:
        # An internal stage changes with the view it was split from: name the view.
        named = sorted({v.split(STAGE_SEPARATOR)[0] for v in changed})
        held = (
            f"sink(s) {', '.join(sinks)} read it or a view built on it and hold" if sinks else "a sink may hold"
        )
        raise DefinitionChanged(
            f"the statement of view(s) {', '.join(named)} changed after they committed epochs, and {held} "
            "rows of its old version, which a rebuild would not retract. Give the new statement a new "
            "name (it backfills while the old view keeps serving, then move the sinks to it), or remove the "
            "sinks' statements and rebuild in place with "
            + ", ".join(f"`epochal backfill {v} --rebuild`" for v in named)
        )
    for view in sorted(rebuilt):
        drop_state(cur, view)
        forget(cur, [view])
        if view in fingerprints:
            cur.execute("DELETE FROM table_definitions WHERE table_name = ?", [view])
            cur.execute("INSERT INTO table_definitions VALUES (?, ?)", [view, fingerprints[view]])
    log.warning(
        "the statement of view(s) %s changed: rebuilding %s by backfill from the committed epoch",
        ", ".join(sorted(changed)), ", ".join(sorted(rebuilt)),
    )
    return sorted(rebuilt)


def _downstream(tables: Iterable[str], readers: Mapping[str, list[str]], views: Iterable[str]) -> set[str]:
    """``tables`` and every view that reads them, directly or through other views."""
    known, found, todo = set(views), set(tables), list(tables)
    while todo:
        for reader in readers.get(todo.pop(), []):
            if reader in known and reader not in found:
                found.add(reader)
                todo.append(reader)
    return found
