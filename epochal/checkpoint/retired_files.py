"""Retired files: what retention let go of, kept on disk until no reader can still be scanning it.

Retention (``SnapshotCatalog.publish_snapshot``, ``release_changes``) forgets old snapshots and
change files in the transaction that publishes a newer snapshot, so no read that starts after it
lists them again. A read that started before may still be scanning them: a view step of an epoch in
flight in another run chose its snapshot and change files when it planned, and Spark opens the files
lazily, later. So the files are only recorded here, and deleted (``reap``) once

* every epoch injected up to the retirement (``retired_epoch``) is committed or aborted: a step
  chooses its files after its epoch was injected, so one that may hold them has such an epoch;
* no compaction of the same table that started by the retirement is still writing (it reads the
  table's state without an epoch of its own);
* the grace time (``EPOCHAL_RETENTION_GRACE_S``) has passed: readers tied to no epoch (``epochal
  query`` through DuckDB, a sink's snapshot read) are given that long.

Rows go in the transaction that returns them, before the files are deleted: a crash in between
leaves orphans that recovery's sweep deletes, never a row naming a missing file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from epochal.checkpoint import queries as q
from epochal.meta.backend import Cursor


def retire(cur: Cursor, table: str, locations: Iterable[str], now: float | None = None) -> list[str]:
    """Record ``locations`` of ``table`` as retired now, by the newest injected epoch; returns them."""
    locations = list(dict.fromkeys(locations))
    if not locations:
        return []
    now = time.time() if now is None else now
    newest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
    for location in locations:
        # (a location retired twice keeps its first retirement: the later one is no earlier)
        cur.execute(
            "INSERT INTO retired_files (location, table_name, retired_at, retired_epoch) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (location) DO NOTHING",
            [location, table, now, newest],
        )
    return locations


def reap(cur: Cursor, grace_s: float, now: float | None = None) -> list[str]:
    """Forget the retired files no reader can hold any more (see the module's rules) and return
    their locations, for the caller to delete after the transaction."""
    now = time.time() if now is None else now
    due = cur.execute(
        "SELECT r.location FROM retired_files r WHERE r.retired_at <= ? "
        f"AND NOT EXISTS (SELECT 1 FROM epochs e WHERE e.state IN {q.IN_FLIGHT} AND e.epoch <= r.retired_epoch) "
        "AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.table_name = r.table_name AND s.state = 'WRITING' "
        "AND s.started_at <= r.retired_at) ORDER BY r.location",
        [now - grace_s],
    ).fetchall()
    locations = [r[0] for r in due]
    for location in locations:
        cur.execute("DELETE FROM retired_files WHERE location = ?", [location])
    return locations


def retired_locations(cur: Cursor) -> set[str]:
    """Every retired location not deleted yet: what recovery's sweep must keep."""
    return {r[0] for r in cur.execute("SELECT location FROM retired_files").fetchall()}

