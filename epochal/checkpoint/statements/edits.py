"""A pipeline stuck on a record one of its views cannot compute waits for an edit of that view: the
barrier sensor asks here before it injects, instead of starting a failing run every interval."""

from __future__ import annotations

import re
from collections.abc import Mapping

from epochal.checkpoint import queries as q
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements import views as definitions
from epochal.meta.backend import Cursor

#: the first line of a ``ViewDataError`` (epochal.runtime.data_errors), as a recovery's reason holds it
_FAILED = re.compile(r"ViewDataError: view (?P<view>\w+) cannot compute epoch (?P<epoch>\d+): (?P<what>[^\n]*)")


def waiting_for_an_edit(cur: Cursor, fingerprints: Mapping[str, str]) -> str | None:
    """Why injecting another epoch would only fail again, or None: the newest recovery followed a
    record view V cannot compute, no epoch has committed since, and V's statement in this process
    (``fingerprints``: view -> fingerprint of its statement in the SQL files read) is the one that
    failed, neither edited nor being rebuilt. The barrier sensor then skips with this reason instead
    of starting a failing run each barrier interval; an edit, or an epoch committed some other way
    (a run by hand after the cause was fixed elsewhere), lets it go on."""
    row = cur.execute("SELECT reason, committed_epoch, finished_at FROM recoveries ORDER BY id DESC LIMIT 1").fetchone()
    found = _FAILED.search(row[0] or "") if row is not None and row[2] is not None else None
    if found is None or q.committed_epoch(cur) != row[1]:
        return None
    view = found["view"]
    if view not in fingerprints:
        return None  # dropped from the files: the injection retires it
    rebuild = rebuilds.read(cur, view)
    stored = definitions.stored_statement(cur, view)
    if (rebuild is not None and rebuild.state.active) or stored is None or stored[0] != fingerprints[view]:
        return None  # edited: the injection starts (or goes on with) its rebuild
    return (
        f"no epoch is injected: view {view} cannot compute the records of epoch {found['epoch']} "
        f"({found['what'][:300]}), and every epoch would read them again. Edit {view} in the pipeline's "
        "SQL (ViewDataError in the failed run says how) and reload the code location: the sensor injects "
        "again once the statement changes, or once an epoch commits (a run of epoch_job by hand, after "
        "the cause was fixed some other way)"
    )
