"""The snapshot catalog and retention: which files make up a table's state at an epoch (a
snapshot plus the change files after it), the snapshots compaction announces, writes and
publishes, what retention releases, and the pruning of old epochs' meta-store rows."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable

from epochal.checkpoint import queries as q
from epochal.checkpoint import retired_files
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.records import (
    EpochOrderError,
    EpochState,
    Owner,
    PublishResult,
    Snapshot,
    StateCompacted,
    StateParts,
)
from epochal.epoch import epoch_from_ms, epoch_physical_ms
from epochal.errors import EpochalError
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT, Lease
from epochal.meta.backend import Backend, Cursor
from epochal.settings import Settings

log = logging.getLogger("epochal.catalog")

_SNAPSHOT_COLUMNS = "table_name, epoch, location, distribution_key, spark_schema, rows_out, files_out"


def _snapshot(row: tuple) -> Snapshot:
    return Snapshot(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], row[5] or 0, row[6] or 0)


def _dropped_upto(cur: Cursor, table: str) -> int | None:
    row = cur.execute("SELECT changes_dropped_upto FROM table_retention WHERE table_name = ?", [table]).fetchone()
    return row[0] if row else None


def _delivered_by(cur: Cursor, sinks: Iterable[str], horizon: int) -> int:
    """``horizon`` lowered to what every sink in ``sinks`` still reads as change files (nothing
    before its snapshot batch)."""
    for sink in sinks:
        floor = q.sink_retention_floor(cur, sink)
        horizon = horizon if floor is None else min(horizon, floor)
    return horizon


def _drop_changes(cur: Cursor, table: str, horizon: int) -> list[str]:
    """Forget ``table``'s change files up to ``horizon`` (reads before it need a snapshot, or a
    SOURCE's connector); returns their locations, for the caller to retire."""
    changes = cur.execute(
        "SELECT location FROM collected WHERE asset = ? AND epoch <= ? AND location IS NOT NULL", [table, horizon]
    ).fetchall()
    cur.execute(
        "UPDATE collected SET location = NULL WHERE asset = ? AND epoch <= ? AND location IS NOT NULL", [table, horizon]
    )
    cur.execute(
        "INSERT INTO table_retention (table_name, changes_dropped_upto) VALUES (?, ?) "
        "ON CONFLICT (table_name) DO UPDATE SET changes_dropped_upto = excluded.changes_dropped_upto",
        [table, horizon],
    )
    return [r[0] for r in changes]


def _window_start(cur: Cursor, seconds: int) -> int | None:
    """The oldest committed epoch inside the time-travel window: allocated at most ``seconds``
    before the newest committed epoch (None before the first commit)."""
    committed = q.committed_epoch(cur)
    if committed is None:
        return None
    since = epoch_from_ms(epoch_physical_ms(committed) - seconds * 1000)
    return cur.execute(
        "SELECT min(epoch) FROM epochs WHERE state = 'COMMITTED' AND epoch >= ?", [since]
    ).fetchone()[0]


def _readable_from(cur: Cursor, table: str) -> int | None:
    """The oldest epoch ``table``'s state can still be read at: its oldest snapshot that retention
    left change files after (None: every change file is kept, any epoch reads)."""
    dropped = _dropped_upto(cur, table)
    if dropped is None:
        return None
    row = cur.execute(
        "SELECT min(epoch) FROM snapshots WHERE table_name = ? AND state = 'READY' AND epoch >= ?", [table, dropped]
    ).fetchone()
    # (no snapshot past what was dropped: only epochs after it; cannot happen, retention keeps one)
    return row[0] if row[0] is not None else dropped + 1


def _check_not_compacted(cur: Cursor, table: str, after: int | None, what: str) -> None:
    dropped = _dropped_upto(cur, table)
    if dropped is not None and (after is None or after < dropped):
        raise StateCompacted(
            f"{what}: the change files of {table} up to epoch {dropped} were compacted into a snapshot "
            f"and deleted, and this read needs them (from epoch {after if after is not None else 'the first'} "
            "on). Read state through StateReader.read_state; a view added to a running pipeline "
            "needs a backfill"
        )


def _changes(cur: Cursor, table: str, epoch: int, inclusive: bool, after: int | None) -> list[tuple[int, str]]:
    comparison = "<=" if inclusive else "<"
    # A source that joined a running pipeline has no epoch before it joined: its first one read
    # its splits from their start.
    joined = cur.execute("SELECT joined_epoch FROM table_epochs WHERE table_name = ?", [table]).fetchone()
    if joined is not None and joined[0] is not None:
        after = joined[0] if after is None else max(after, joined[0])
    rows = cur.execute(
        "SELECT e.epoch, c.asset, c.location FROM epochs e "
        "LEFT JOIN collected c ON c.epoch = e.epoch AND c.asset = ? "
        f"WHERE e.state <> 'ABORTED' AND e.epoch {comparison} ? AND e.epoch > ? ORDER BY e.epoch",
        [table, epoch, after if after is not None else -1],
    ).fetchall()
    missing = [e for e, asset, _ in rows if asset is None]
    if missing:
        raise EpochOrderError(
            f"{table} has not written epoch(s) {missing[:5]} that come before {epoch}: a view that "
            "recomputes needs its inputs' earlier epochs; run those epochs first (or run epoch_job "
            "without a partition)"
        )
    return [(e, loc) for e, _, loc in rows if loc is not None]


class SnapshotCatalog:
    def __init__(self, settings: Settings, backend: Backend):
        self.settings = settings
        self.backend = backend

    # ------------------------------------------------------------------ what state is made of

    def committed_epoch(self) -> int | None:
        return self.backend.transaction(q.committed_epoch)

    def committed_locations(
        self, table: str, upto: int | None = None, after: int | None = None, idle: bool = False
    ) -> list[tuple[int, str | None]]:
        """(epoch, location) of every committed epoch of ``table`` in (``after``, ``upto``] (default:
        from the first epoch to the committed epoch). Raises StateCompacted when compaction deleted
        change files in that range: a location that was deleted is never returned. ``idle``: also
        idle epochs (a source read nothing, a view's inputs did not change): no file, location None."""

        def read(cur: Cursor) -> list[tuple[int, str | None]]:
            _check_not_compacted(cur, table, after, "committed changes")
            limit = upto if upto is not None else q.committed_epoch(cur)
            if limit is None:
                return []
            # An idle epoch has no location and no rows; a location compaction cleared has rows.
            which = "(c.location IS NOT NULL OR c.rows_out = 0)" if idle else "c.location IS NOT NULL"
            return cur.execute(
                "SELECT c.epoch, c.location FROM collected c JOIN epochs e ON e.epoch = c.epoch "
                f"WHERE c.asset = ? AND e.state = 'COMMITTED' AND c.epoch <= ? AND c.epoch > ? AND {which} "
                "ORDER BY c.epoch",
                [table, limit, after if after is not None else -1],
            ).fetchall()

        return [tuple(r) for r in self.backend.transaction(read)]

    def changes_upto(self, table: str, epoch: int, inclusive: bool, after: int | None = None) -> list[tuple[int, str]]:
        """(epoch, location) of every epoch of ``table`` in (``after``, ``epoch``], committed or in flight.

        This is the table's state as seen *inside* epoch ``epoch`` (a view reads its inputs at the
        epoch it is computing, before anything commits). It needs every earlier epoch that was not
        aborted: one the table has not written yet means epochs are being processed out of order,
        and the state would silently miss it, so that is an error. So is asking for change files
        that compaction deleted (StateCompacted): use ``state_parts``."""

        def read(cur: Cursor) -> list[tuple[int, str]]:
            _check_not_compacted(cur, table, after, f"changes up to epoch {epoch}")
            return _changes(cur, table, epoch, inclusive, after)

        return self.backend.transaction(read)

    def state_parts(self, table: str, epoch: int, inclusive: bool) -> StateParts:
        """``table``'s state inside ``epoch`` (with that epoch's change when ``inclusive``): the newest
        snapshot at or before it, plus the changes after the snapshot, committed or in flight, with
        ``changes_upto``'s ordering rule. Never older change files: they may be gone."""

        def read(cur: Cursor) -> StateParts:
            comparison = "<=" if inclusive else "<"
            row = cur.execute(
                f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE table_name = ? AND state = 'READY' "
                f"AND epoch {comparison} ? ORDER BY epoch DESC LIMIT 1",
                [table, epoch],
            ).fetchone()
            snapshot = _snapshot(row) if row else None
            after = snapshot.epoch if snapshot else None
            _check_not_compacted(cur, table, after, f"state at epoch {epoch}")
            return StateParts(snapshot, _changes(cur, table, epoch, inclusive, after))

        return self.backend.transaction(read)

    def committed_dead_letter_locations(self, source: str, upto: int | None = None) -> list[str]:
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT c.dead_letter_location FROM collected c JOIN epochs e ON e.epoch = c.epoch "
                "WHERE c.asset = ? AND e.state = 'COMMITTED' AND c.dead_letter_location IS NOT NULL "
                "AND c.epoch <= ? ORDER BY c.epoch",
                [source, upto if upto is not None else (1 << 62)],
            ).fetchall()
        )
        return [r[0] for r in rows]

    # ------------------------------------------------------------------ time travel

    def retained_epochs(self, tables: Iterable[str]) -> tuple[int | None, int | None]:
        """(oldest, newest) committed epoch every table in ``tables`` can be read at: inside the
        time-travel window (``EPOCHAL_TIME_TRAVEL_S``) and not compacted away; (None, None) before
        the first commit."""
        tables = list(tables)

        def read(cur: Cursor) -> tuple[int | None, int | None]:
            committed = q.committed_epoch(cur)
            if committed is None:
                return None, None
            floor = _window_start(cur, self.settings.time_travel_s)
            for table in tables:
                readable = _readable_from(cur, table)
                floor = floor if readable is None else max(floor, readable)
            oldest = cur.execute(
                "SELECT min(epoch) FROM epochs WHERE state = 'COMMITTED' AND epoch >= ? AND epoch <= ?",
                [floor, committed],
            ).fetchone()[0]
            return (oldest if oldest is not None else committed), committed

        return self.backend.transaction(read)

    def committed_at_or_before(self, epoch: int) -> int | None:
        """The newest committed epoch <= ``epoch`` (None: none is)."""
        return self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT max(epoch) FROM epochs WHERE state = 'COMMITTED' AND epoch <= ?", [epoch]
            ).fetchone()[0]
        )

    def is_committed(self, epoch: int) -> bool:
        return bool(
            self.backend.transaction(
                lambda cur: cur.execute(
                    "SELECT count(*) FROM epochs WHERE state = 'COMMITTED' AND epoch = ?", [epoch]
                ).fetchone()[0]
            )
        )

    # ------------------------------------------------------------------ snapshots

    def snapshots(self, table: str) -> list[Snapshot]:
        """``table``'s READY snapshots, oldest first."""
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE table_name = ? AND state = 'READY' ORDER BY epoch",
                [table],
            ).fetchall()
        )
        return [_snapshot(r) for r in rows]

    def change_epochs_since_snapshot(self, table: str) -> tuple[int | None, int, int | None]:
        """(newest snapshot epoch, committed epochs with change files after it, committed epoch)."""

        def read(cur: Cursor) -> tuple[int | None, int, int | None]:
            latest = cur.execute(
                "SELECT max(epoch) FROM snapshots WHERE table_name = ? AND state = 'READY'", [table]
            ).fetchone()[0]
            count = cur.execute(
                "SELECT count(*) FROM collected c JOIN epochs e ON e.epoch = c.epoch WHERE c.asset = ? "
                "AND e.state = 'COMMITTED' AND c.location IS NOT NULL AND c.epoch > ?",
                [table, latest if latest is not None else -1],
            ).fetchone()[0]
            return latest, count, q.committed_epoch(cur)

        return self.backend.transaction(read)

    def begin_snapshot(
        self,
        table: str,
        epoch: int,
        location: str,
        distribution_key: tuple[str, ...],
        schema: str,
        in_flight: bool = False,
        started_at: float | None = None,
    ) -> None:
        """Announce a snapshot about to be written to ``location``, owned by this process: recovery
        keeps its files while the process lives and renews ``snapshot_lease``, and deletes them once
        it is dead. Announce before the first file exists: a recovery's sweep lists directories
        before it reads what to keep, so a directory it sees was announced before it looked.
        ``in_flight``: the snapshot of a view's new statement at the epoch it switches in
        (:mod:`epochal.checkpoint.statements.rebuilds`, which publishes it); compaction snapshots committed epochs.
        ``started_at``: when the writer chose the files it reads (default now): retired files it
        may read stay until it is done (``retired_files.reap``)."""

        def begin(cur: Cursor) -> None:
            if not in_flight and q.epoch_record(cur, epoch).state is not EpochState.COMMITTED:
                raise EpochalError(f"cannot snapshot {table} at epoch {epoch}: only committed epochs are snapshotted")
            now = time.time()
            cur.execute(
                "INSERT INTO snapshots (location, table_name, epoch, state, distribution_key, spark_schema, "
                "owner_host, owner_pid, started_at, heartbeat_at) VALUES (?, ?, ?, 'WRITING', ?, ?, ?, ?, ?, ?)",
                [location, table, epoch, json.dumps(list(distribution_key)), schema]
                + [Owner.token(), os.getpid(), now if started_at is None else min(started_at, now), now],
            )

        self.backend.transaction(begin)

    def snapshot_lease(self, location: str) -> Lease:
        """``with catalog.snapshot_lease(location):`` renews an announced snapshot's lease while its
        files are written, so a long compaction is not reaped as a dead one."""
        interval = max(0.05, self.settings.epoch_timeout_s / LEASE_RENEWALS_PER_TIMEOUT)

        def renew() -> bool:
            return bool(
                self.backend.transaction(
                    lambda cur: cur.execute(
                        "UPDATE snapshots SET heartbeat_at = ? WHERE location = ? AND state = 'WRITING' "
                        "RETURNING location",
                        [time.time(), location],
                    ).fetchall()
                )
            )

        return Lease(f"snapshot {location}", renew, interval)

    def abandon_snapshot(self, location: str) -> None:
        """Forget an unpublished snapshot (its files are deleted by the caller, or by recovery)."""
        self.backend.transaction(
            lambda cur: cur.execute("DELETE FROM snapshots WHERE location = ? AND state = 'WRITING'", [location])
        )

    def publish_snapshot(
        self, location: str, rows: int, files: int, sinks: Iterable[str] = (), keep: int = 2
    ) -> PublishResult:
        """Make a fully written snapshot visible, and apply retention, in one transaction.

        Loses (records nothing) when a snapshot of the table at the same or a later epoch is READY:
        racing compactions are harmless, the loser deletes its files. Retention keeps the newest
        ``keep`` snapshots, and the change files after the oldest of them; older change files are
        released only once every sink in ``sinks`` (those reading the table) has delivered them.
        What retention lets go of is retired (``retired_files``), not deleted: a reader that chose
        it before this publish may still be scanning it. A snapshot that recovery reaped meanwhile
        (its lease ran out) is refused: its files may have been swept while it wrote them."""

        def publish(cur: Cursor) -> PublishResult:
            row = cur.execute(
                "SELECT table_name, epoch FROM snapshots WHERE location = ? AND state = 'WRITING'", [location]
            ).fetchone()
            if row is None:
                raise EpochalError(
                    f"snapshot {location} was never begun, or recovery removed it as abandoned (its lease ran "
                    "out): its files are not trusted; the next compaction writes a new one"
                )
            table, epoch = row
            newer = cur.execute(
                "SELECT count(*) FROM snapshots WHERE table_name = ? AND state = 'READY' AND epoch >= ?", [table, epoch]
            ).fetchone()[0]
            if newer:
                cur.execute("DELETE FROM snapshots WHERE location = ?", [location])
                return PublishResult(recorded=False)
            cur.execute(
                "UPDATE snapshots SET state = 'READY', rows_out = ?, files_out = ?, finished_at = ?, owner_pid = NULL "
                "WHERE location = ?",
                [rows, files, time.time(), location],
            )
            ready = cur.execute(
                "SELECT epoch, location FROM snapshots WHERE table_name = ? AND state = 'READY' ORDER BY epoch DESC",
                [table],
            ).fetchall()
            # A backfill reading the table at its snapshot epoch needs the newest snapshot at or
            # before it, and every change file after it: retention keeps both until it is past them.
            needed = backfill_log.needed_from(cur, table)
            pins = set() if needed is None else {next((e for e, _ in ready if e <= needed), -1)}
            # Time travel: an epoch in the window reads the newest snapshot at or before it plus the
            # change files after that, so the snapshot at or before the window's start stays too,
            # with the change files after it (-1: there is none yet, every change file stays).
            oldest = _window_start(cur, self.settings.time_travel_s)
            if oldest is not None:
                pins.add(next((e for e, _ in ready if e <= oldest), -1))
            pinned = min(pins) if pins else None
            garbage = [loc for e, loc in ready[keep:] if e not in pins]
            for loc in garbage:
                cur.execute("DELETE FROM snapshots WHERE location = ?", [loc])
            kept = ready[:keep]
            if len(kept) < 2:
                # The first snapshot: keep every change file, a reader of any epoch may still need them.
                return PublishResult(recorded=True, retired=retired_files.retire(cur, table, garbage))
            horizon = kept[-1][0]
            if pinned is not None:
                horizon = min(horizon, pinned)
            horizon = _delivered_by(cur, sinks, horizon)
            dropped = _dropped_upto(cur, table)
            if horizon < 0 or (dropped is not None and horizon <= dropped):
                retired = retired_files.retire(cur, table, garbage)
                return PublishResult(recorded=True, retired=retired, changes_dropped_upto=dropped)
            # The locations go in the same transaction that records the snapshot, so a retired file
            # is never listed again; it is deleted once no reader that listed it before can be left.
            garbage += _drop_changes(cur, table, horizon)
            retired = retired_files.retire(cur, table, garbage)
            return PublishResult(recorded=True, retired=retired, changes_dropped_upto=horizon)

        return self.backend.transaction(publish)

    def reap_abandoned(self, cur: Cursor) -> list[str]:
        """Forget WRITING snapshots whose compaction died, or whose lease is older than the epoch
        timeout; their locations are returned for deletion (recovery's sweep deletes them anyway)."""
        now = time.time()
        dead = [
            loc
            for loc, host, pid, started, heartbeat in cur.execute(
                "SELECT location, owner_host, owner_pid, started_at, heartbeat_at FROM snapshots "
                "WHERE state = 'WRITING'"
            ).fetchall()
            if Owner.dead(host, pid)
            or now - (heartbeat if heartbeat is not None else started) > self.settings.epoch_timeout_s
        ]
        for loc in dead:
            cur.execute("DELETE FROM snapshots WHERE location = ?", [loc])
        return dead

    def reap_abandoned_snapshots(self) -> list[str]:
        return self.backend.transaction(self.reap_abandoned)

    def reap_retired(self, grace_s: float, now: float | None = None) -> list[str]:
        """Forget the retired files no reader can hold any more (``retired_files.reap``); returns
        their locations, which the caller deletes."""
        return self.backend.transaction(lambda cur: retired_files.reap(cur, grace_s, now))

    # ------------------------------------------------------------------ history

    def release_changes(self, table: str, sinks: Iterable[str] = ()) -> list[str]:
        """A SOURCE that stores nothing (``epochal.incremental.state_needs``): forget its change
        files of committed epochs that every sink in ``sinks`` delivered and no backfill reads, and
        any snapshot of it from when a view read it as state. They are retired (deleted once no
        reader can hold them, ``reap_retired``); returns their locations. Its rows at those epochs
        are read back from its connector from then on."""

        def release(cur: Cursor) -> list[str]:
            committed = q.committed_epoch(cur)
            if committed is None:
                return []
            horizon = _delivered_by(cur, sinks, committed)
            needed = backfill_log.needed_from(cur, table)
            if needed is not None:  # a backfill reads the changes after its epoch (and maybe a snapshot)
                horizon = min(horizon, needed)
            dropped = _dropped_upto(cur, table)
            if horizon < 0 or (dropped is not None and horizon <= dropped):
                return []
            garbage = _drop_changes(cur, table, horizon)
            if needed is None:
                old = cur.execute("SELECT location FROM snapshots WHERE table_name = ? AND state = 'READY'", [table])
                for (location,) in old.fetchall():
                    cur.execute("DELETE FROM snapshots WHERE location = ?", [location])
                    garbage.append(location)
            return retired_files.retire(cur, table, garbage)

        return self.backend.transaction(release)

    def prune_history(self, tables: Iterable[str], sinks: Iterable[str], keep_epochs: int) -> int:
        """Delete the meta-store rows of old epochs that no reader can reach any more, so the store
        stays small however long the pipeline runs. An epoch's rows go only when it is older than
        the newest ``keep_epochs`` epochs (they stay Dagster partitions, and can be re-run), and
        older than what every table's retention already dropped and every sink delivered (no state
        read, sink catch-up or backfill lists it again). Epochs with dead letters stay: the
        dead-letter tables are read from their rows. Returns how many epochs were pruned."""
        tables, sinks = list(tables), list(sinks)

        def prune(cur: Cursor) -> int:
            horizon: int | None = None
            for table in tables:
                dropped = _dropped_upto(cur, table)
                if dropped is None:
                    return 0  # this table's every change file is still readable
                horizon = dropped if horizon is None else min(horizon, dropped)
            for sink in sinks:
                floor = q.sink_retention_floor(cur, sink)
                if floor is None:
                    continue  # it starts from a snapshot: no epoch's rows are listed for it
                if floor < 0:
                    return 0
                horizon = floor if horizon is None else min(horizon, floor)
            for table in tables:
                needed = backfill_log.needed_from(cur, table)
                if needed is not None:  # a backfill still lists the epochs after it
                    horizon = needed if horizon is None else min(horizon, needed)
            window = cur.execute(
                "SELECT epoch FROM epochs ORDER BY epoch DESC LIMIT 1 OFFSET ?", [keep_epochs]
            ).fetchone()
            if horizon is None or window is None:
                return 0
            limit = min(horizon, window[0])
            old = (
                "SELECT epoch FROM epochs WHERE epoch < ? AND state IN ('COMMITTED', 'ABORTED') AND NOT EXISTS "
                "(SELECT 1 FROM collected c WHERE c.epoch = epochs.epoch AND c.dead_letter_location IS NOT NULL)"
            )
            count = cur.execute(f"SELECT count(*) FROM ({old}) o", [limit]).fetchone()[0]
            if count:
                # (check_results: every sink is past these epochs, so no hold reads them again)
                for table in ("epoch_offsets", "collected", "check_results"):
                    cur.execute(f"DELETE FROM {table} WHERE epoch IN ({old})", [limit])
                # Finished sink batches before the horizon; the newest COMMITTED one of a sink ends
                # at its delivered epoch, which is not before the horizon, so it stays. A committed
                # snapshot batch stays too (one per sink): status shows when the sink started.
                cur.execute(
                    "DELETE FROM sink_batches WHERE last_epoch < ? AND ((state = 'COMMITTED' AND first_epoch <> ?) "
                    "OR (state = 'ABORTED' AND cleaned))",
                    [limit, q.SNAPSHOT_FIRST_EPOCH],
                )
                cur.execute(f"DELETE FROM epochs WHERE epoch IN ({old})", [limit])
            return count

        pruned = self.backend.transaction(prune)
        if pruned:
            log.info("pruned the meta-store rows of %d old epoch(s)", pruned)
        return pruned
