"""The checkpoint controller: injects epochs, collects each table's output, commits epochs for all
tables at once, and recovers to the last committed epoch after a failure.

It is the Dagster-free counterpart of RisingWave's global barrier worker. Where that worker keeps
its state in memory and rebuilds it by recovery, ours lives entirely in the meta store, because the
"workers" here are Dagster runs in separate processes that come and go. Every decision (inject,
collect, commit, abort) is one meta-store transaction, so concurrent runs, the sensor and the shell
can race without double commits.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epochal.connectors.base import SplitRange
from epochal.epoch import BarrierKind, barrier_kind, next_epoch
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor, open_backend
from epochal.meta.schema import DDL, SCHEMA_VERSION
from epochal.settings import Settings

log = logging.getLogger("epochal.controller")

# Recovery backoff as in the seed: 20 ms base, exponential, 5 s cap, with jitter.
RECOVERY_BASE_S = 0.020
RECOVERY_CAP_S = 5.0
RECOVERY_ATTEMPTS = 8


class EpochState(enum.Enum):
    INJECTED = "INJECTED"
    COLLECTED = "COLLECTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    @property
    def in_flight(self) -> bool:
        return self in (EpochState.INJECTED, EpochState.COLLECTED)


# The only legal moves; ``_transition`` asserts every state change against this table.
#  INJECTED  -> COLLECTED : every table of the pipeline has collected the epoch.
#  COLLECTED -> COMMITTED : every earlier epoch is committed and a checkpoint at or after this epoch
#                           is collected (barriers commit together with the next checkpoint).
#  INJECTED/COLLECTED -> ABORTED : recovery; everything written for the epoch is discarded.
#  COMMITTED and ABORTED are final: committed data is never rewritten, aborted epochs never revive.
_TRANSITIONS = {
    EpochState.INJECTED: {EpochState.COLLECTED, EpochState.ABORTED},
    EpochState.COLLECTED: {EpochState.COMMITTED, EpochState.ABORTED},
    EpochState.COMMITTED: set(),
    EpochState.ABORTED: set(),
}


def _transition(cur: Cursor, epoch: int, old: EpochState, new: EpochState, **extra: Any) -> None:
    assert new in _TRANSITIONS[old], f"illegal epoch transition {old.name} -> {new.name} for {epoch}"
    sets = ", ".join(["state = ?", *(f"{k} = ?" for k in extra)])
    cur.execute(
        f"UPDATE epochs SET {sets} WHERE epoch = ? AND state = ?",
        [new.value, *extra.values(), epoch, old.value],
    )


class InjectionBlocked(EpochalError):
    """No epoch can be injected now (paused, or the in-flight limit is reached)."""


class EpochAborted(EpochalError):
    """The epoch was aborted by a recovery; its work must not be collected."""


class UnknownEpoch(EpochalError):
    pass


class EpochOrderError(EpochalError):
    """A step needs an earlier epoch that has not been processed yet."""


class CommitAlignmentError(EpochalError):
    """Tables disagree on their committed epoch: reported, never guessed around."""


class StateCompacted(EpochalError):
    """The change files a read needs were compacted into a snapshot and deleted."""


@dataclass(frozen=True)
class Snapshot:
    """A READY snapshot: ``table``'s net rows over every committed epoch <= ``epoch``."""

    table: str
    epoch: int
    location: str
    #: the columns its vnodes hash; () = all columns (see epochal/storage/vnode.py)
    distribution_key: tuple[str, ...]
    #: Spark's JSON of the rows' schema, so an empty snapshot (no files) still reads with its columns
    spark_schema: str
    rows: int
    files: int


@dataclass(frozen=True)
class StateParts:
    """What a table's state at an epoch is made of: a snapshot (or none) plus the changes after it."""

    snapshot: Snapshot | None
    changes: list[tuple[int, str]]


@dataclass(frozen=True)
class PublishResult:
    #: False when a snapshot at this or a later epoch was published first: the caller's files are garbage
    recorded: bool
    #: locations retention released (old snapshots, change files every reader is past): delete them
    garbage: list[str] = field(default_factory=list)
    changes_dropped_upto: int | None = None


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    prev: int | None
    kind: BarrierKind
    state: EpochState
    injected_at: float
    committed_at: float | None = None
    failure: str | None = None

    @property
    def is_checkpoint(self) -> bool:
        # The initial barrier after a recovery is committed like a checkpoint (RisingWave too).
        return self.kind is not BarrierKind.BARRIER


@dataclass(frozen=True)
class Collected:
    asset: str
    location: str | None
    rows_in: int | None = None
    rows_out: int | None = None
    dead_letters: int | None = None
    dead_letter_location: str | None = None
    seconds: float | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class CollectResult:
    #: False when the epoch was already committed: committed data is immutable, so the caller's
    #: freshly written copy was not recorded and should be deleted.
    recorded: bool
    committed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StepStart:
    record: EpochRecord
    offsets: list[SplitRange]
    collected: dict[str, Collected]
    #: whether the step's table (``begin_step(table=...)``) has a snapshot or a change file from an
    #: earlier epoch that was not aborted; None when no table was named
    written_before: bool | None = None


@dataclass(frozen=True)
class CommitStep:
    """One attempt of a run's commit step on its epoch, read in the transaction that tried it."""

    #: the epochs this attempt committed (any run's, oldest first)
    committed: list[int]
    record: EpochRecord
    #: tables that have not collected the epoch yet
    missing: list[str]
    #: the run is done with the epoch (it is committed, or a barrier waiting for its checkpoint),
    #: and its claim was released in the same transaction
    released: bool
    committed_epoch: int | None
    in_flight: list[EpochRecord]


@dataclass(frozen=True)
class RecoveryReport:
    reason: str
    committed_epoch: int | None
    aborted: list[int]
    discarded_locations: list[str]
    attempts: int
    seconds: float
    paused: bool


class Owner:
    """Who is working on an epoch, so a crashed run can be told from a slow one."""

    host = socket.gethostname()

    @staticmethod
    def pid_alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie (killed, not yet reaped by its parent) is dead for our purposes.
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return True


class CheckpointController:
    def __init__(
        self,
        settings: Settings,
        sources: Iterable[str],
        views: Iterable[str] = (),
        sinks: Iterable[str] = (),
        backend: Backend | None = None,
    ):
        self.settings = settings
        self.sources = list(sources)
        #: the state tables whose commit is aligned: every source and view
        self.tables = [*self.sources, *views]
        self.sinks = list(sinks)
        self.backend = backend or open_backend(settings.meta_url)
        self.backend.transaction(self._ensure_schema)

    # ------------------------------------------------------------------ schema & settings

    @staticmethod
    def _ensure_schema(cur: Cursor) -> None:
        for ddl in DDL:
            cur.execute(ddl)
        row = cur.execute("SELECT value FROM controller WHERE key = 'schema_version'").fetchone()
        if row is None:
            cur.execute("INSERT INTO controller VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        elif int(row[0]) != SCHEMA_VERSION:
            raise EpochalError(
                f"meta store schema version {row[0]} is not {SCHEMA_VERSION}, the one this Epochal uses: "
                "upgrade Epochal or point EPOCHAL_META_URL at a matching store"
            )

    @staticmethod
    def _get(cur: Cursor, key: str, default: str | None = None) -> str | None:
        row = cur.execute("SELECT value FROM controller WHERE key = ?", [key]).fetchone()
        return row[0] if row else default

    @staticmethod
    def _set(cur: Cursor, key: str, value: str | None) -> None:
        cur.execute("DELETE FROM controller WHERE key = ?", [key])
        if value is not None:
            cur.execute("INSERT INTO controller VALUES (?, ?)", [key, value])

    def _flag(self, key: str, value: bool) -> None:
        self.backend.transaction(lambda cur: self._set(cur, key, "1" if value else None))

    def pause(self) -> None:
        self._flag("paused", True)

    def resume(self) -> None:
        self._flag("paused", False)

    def set_pause_on_next_start(self, value: bool) -> None:
        self._flag("pause_on_next_start", value)

    # ------------------------------------------------------------------ reading

    @staticmethod
    def _record(row: tuple) -> EpochRecord:
        return EpochRecord(
            epoch=row[0],
            prev=row[1],
            kind=BarrierKind(row[2]),
            state=EpochState(row[3]),
            injected_at=row[4],
            committed_at=row[5],
            failure=row[6],
        )

    _EPOCH_COLS = "epoch, prev_epoch, kind, state, injected_at, committed_at, failure"

    def _committed_epoch(self, cur: Cursor) -> int | None:
        row = cur.execute("SELECT max(epoch) FROM epochs WHERE state = 'COMMITTED'").fetchone()
        return row[0] if row else None

    def committed_epoch(self) -> int | None:
        return self.backend.transaction(self._committed_epoch)

    def _in_flight(self, cur: Cursor) -> list[EpochRecord]:
        rows = cur.execute(
            f"SELECT {self._EPOCH_COLS} FROM epochs WHERE state IN ('INJECTED', 'COLLECTED') ORDER BY epoch"
        ).fetchall()
        return [self._record(r) for r in rows]

    def in_flight(self) -> list[EpochRecord]:
        return self.backend.transaction(self._in_flight)

    def _epoch(self, cur: Cursor, epoch: int) -> EpochRecord:
        row = cur.execute(f"SELECT {self._EPOCH_COLS} FROM epochs WHERE epoch = ?", [epoch]).fetchone()
        if row is None:
            raise UnknownEpoch(
                f"epoch {epoch} was never injected by the checkpoint controller: run epoch_job "
                "without a partition (or let the barrier sensor run) to inject epochs"
            )
        return self._record(row)

    def epoch(self, epoch: int) -> EpochRecord:
        return self.backend.transaction(lambda cur: self._epoch(cur, epoch))

    def epochs(self, states: Iterable[EpochState] = tuple(EpochState)) -> list[EpochRecord]:
        names = [s.value for s in states]
        marks = ", ".join("?" for _ in names)
        return self.backend.transaction(
            lambda cur: [
                self._record(r)
                for r in cur.execute(
                    f"SELECT {self._EPOCH_COLS} FROM epochs WHERE state IN ({marks}) ORDER BY epoch", names
                ).fetchall()
            ]
        )

    @staticmethod
    def _offsets(cur: Cursor, epoch: int, source: str) -> list[SplitRange]:
        rows = cur.execute(
            "SELECT split, start_offset, end_offset FROM epoch_offsets WHERE epoch = ? AND source = ? ORDER BY split",
            [epoch, source],
        ).fetchall()
        return [SplitRange(split, start, end) for split, start, end in rows]

    def offsets(self, epoch: int, source: str) -> list[SplitRange]:
        return self.backend.transaction(lambda cur: self._offsets(cur, epoch, source))

    @staticmethod
    def _collected(cur: Cursor, epoch: int) -> dict[str, Collected]:
        rows = cur.execute(
            "SELECT asset, location, rows_in, rows_out, dead_letters, dead_letter_location, seconds, run_id "
            "FROM collected WHERE epoch = ?",
            [epoch],
        ).fetchall()
        return {r[0]: Collected(*r) for r in rows}

    def collected(self, epoch: int) -> dict[str, Collected]:
        return self.backend.transaction(lambda cur: self._collected(cur, epoch))

    @staticmethod
    def _dropped_upto(cur: Cursor, table: str) -> int | None:
        row = cur.execute("SELECT changes_dropped_upto FROM table_retention WHERE table_name = ?", [table]).fetchone()
        return row[0] if row else None

    def _check_not_compacted(self, cur: Cursor, table: str, after: int | None, what: str) -> None:
        dropped = self._dropped_upto(cur, table)
        if dropped is not None and (after is None or after < dropped):
            raise StateCompacted(
                f"{what}: the change files of {table} up to epoch {dropped} were compacted into a snapshot "
                f"and deleted, and this read needs them (from epoch {after if after is not None else 'the first'} "
                "on). Read state through EpochRuntime.read_state; a sink or view added to a running pipeline "
                "needs a backfill"
            )

    def committed_locations(
        self, table: str, upto: int | None = None, after: int | None = None, idle: bool = False
    ) -> list[tuple[int, str | None]]:
        """(epoch, location) of every committed epoch of ``table`` in (``after``, ``upto``] (default:
        from the first epoch to the committed epoch). Raises StateCompacted when compaction deleted
        change files in that range: a location that was deleted is never returned. ``idle``: also
        idle epochs (a source read nothing, a view's inputs did not change): no file, location None."""

        def read(cur: Cursor) -> list[tuple[int, str | None]]:
            self._check_not_compacted(cur, table, after, "committed changes")
            limit = upto if upto is not None else self._committed_epoch(cur)
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

    def _changes(
        self, cur: Cursor, table: str, epoch: int, inclusive: bool, after: int | None
    ) -> list[tuple[int, str]]:
        comparison = "<=" if inclusive else "<"
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

    def changes_upto(
        self, table: str, epoch: int, inclusive: bool, after: int | None = None
    ) -> list[tuple[int, str]]:
        """(epoch, location) of every epoch of ``table`` in (``after``, ``epoch``], committed or in flight.

        This is the table's state as seen *inside* epoch ``epoch`` (a view reads its inputs at the
        epoch it is computing, before anything commits). It needs every earlier epoch that was not
        aborted: one the table has not written yet means epochs are being processed out of order,
        and the state would silently miss it, so that is an error. So is asking for change files
        that compaction deleted (StateCompacted): use ``state_parts``."""

        def read(cur: Cursor) -> list[tuple[int, str]]:
            self._check_not_compacted(cur, table, after, f"changes up to epoch {epoch}")
            return self._changes(cur, table, epoch, inclusive, after)

        return self.backend.transaction(read)

    _SNAPSHOT_COLS = "table_name, epoch, location, distribution_key, spark_schema, rows_out, files_out"

    @staticmethod
    def _snapshot(row: tuple) -> Snapshot:
        return Snapshot(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], row[5] or 0, row[6] or 0)

    def state_parts(self, table: str, epoch: int, inclusive: bool) -> StateParts:
        """``table``'s state inside ``epoch`` (with that epoch's change when ``inclusive``): the newest
        snapshot at or before it, plus the changes after the snapshot, committed or in flight, with
        ``changes_upto``'s ordering rule. Never older change files: they may be gone."""

        def read(cur: Cursor) -> StateParts:
            comparison = "<=" if inclusive else "<"
            row = cur.execute(
                f"SELECT {self._SNAPSHOT_COLS} FROM snapshots WHERE table_name = ? AND state = 'READY' "
                f"AND epoch {comparison} ? ORDER BY epoch DESC LIMIT 1",
                [table, epoch],
            ).fetchone()
            snapshot = self._snapshot(row) if row else None
            after = snapshot.epoch if snapshot else None
            self._check_not_compacted(cur, table, after, f"state at epoch {epoch}")
            return StateParts(snapshot, self._changes(cur, table, epoch, inclusive, after))

        return self.backend.transaction(read)

    # ------------------------------------------------------------------ snapshots

    def snapshots(self, table: str) -> list[Snapshot]:
        """``table``'s READY snapshots, oldest first."""
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                f"SELECT {self._SNAPSHOT_COLS} FROM snapshots WHERE table_name = ? AND state = 'READY' ORDER BY epoch",
                [table],
            ).fetchall()
        )
        return [self._snapshot(r) for r in rows]

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
            return latest, count, self._committed_epoch(cur)

        return self.backend.transaction(read)

    def begin_snapshot(
        self, table: str, epoch: int, location: str, distribution_key: tuple[str, ...], schema: str
    ) -> None:
        """Announce a snapshot about to be written to ``location``, owned by this process: recovery
        keeps its files while the process lives, and deletes them once it is dead."""

        def begin(cur: Cursor) -> None:
            if self._epoch(cur, epoch).state is not EpochState.COMMITTED:
                raise EpochalError(f"cannot snapshot {table} at epoch {epoch}: only committed epochs are snapshotted")
            cur.execute(
                "INSERT INTO snapshots (location, table_name, epoch, state, distribution_key, spark_schema, "
                "owner_host, owner_pid, started_at) VALUES (?, ?, ?, 'WRITING', ?, ?, ?, ?, ?)",
                [location, table, epoch, json.dumps(list(distribution_key)), schema]
                + [Owner.host, os.getpid(), time.time()],
            )

        self.backend.transaction(begin)

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
        released only once every sink in ``sinks`` (those reading the table) has delivered them."""

        def publish(cur: Cursor) -> PublishResult:
            row = cur.execute("SELECT table_name, epoch FROM snapshots WHERE location = ?", [location]).fetchone()
            if row is None:
                raise EpochalError(f"snapshot {location} was never begun, or recovery removed it as abandoned")
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
            garbage = [loc for _, loc in ready[keep:]]
            for loc in garbage:
                cur.execute("DELETE FROM snapshots WHERE location = ?", [loc])
            kept = ready[:keep]
            if len(kept) < 2:
                # The first snapshot: keep every change file, a reader of any epoch may still need them.
                return PublishResult(recorded=True, garbage=garbage)
            horizon = kept[-1][0]
            for sink in sinks:
                delivered = cur.execute(
                    "SELECT max(epoch) FROM sink_epochs WHERE sink = ? AND state = 'COMMITTED'", [sink]
                ).fetchone()[0]
                horizon = min(horizon, delivered if delivered is not None else -1)
            dropped = self._dropped_upto(cur, table)
            if horizon < 0 or (dropped is not None and horizon <= dropped):
                return PublishResult(recorded=True, garbage=garbage, changes_dropped_upto=dropped)
            changes = cur.execute(
                "SELECT epoch, location FROM collected WHERE asset = ? AND epoch <= ? AND location IS NOT NULL",
                [table, horizon],
            ).fetchall()
            # The locations go in the same transaction that records the snapshot, so a deleted file
            # is never listed again; a crash before the files are deleted leaves garbage recovery sweeps.
            cur.execute(
                "UPDATE collected SET location = NULL WHERE asset = ? AND epoch <= ? AND location IS NOT NULL",
                [table, horizon],
            )
            cur.execute(
                "INSERT INTO table_retention (table_name, changes_dropped_upto) VALUES (?, ?) "
                "ON CONFLICT (table_name) DO UPDATE SET changes_dropped_upto = excluded.changes_dropped_upto",
                [table, horizon],
            )
            garbage += [loc for _, loc in changes]
            return PublishResult(recorded=True, garbage=garbage, changes_dropped_upto=horizon)

        return self.backend.transaction(publish)

    def _reap_abandoned_snapshots(self, cur: Cursor) -> list[str]:
        """Forget WRITING snapshots whose compaction died (or hung past the epoch timeout); their
        locations are returned for deletion (recovery's sweep deletes them anyway)."""
        now = time.time()
        dead = [
            loc
            for loc, host, pid, started in cur.execute(
                "SELECT location, owner_host, owner_pid, started_at FROM snapshots WHERE state = 'WRITING'"
            ).fetchall()
            if (host == Owner.host and pid is not None and not Owner.pid_alive(pid))
            or now - started > self.settings.epoch_timeout_s
        ]
        for loc in dead:
            cur.execute("DELETE FROM snapshots WHERE location = ?", [loc])
        return dead

    def reap_abandoned_snapshots(self) -> list[str]:
        return self.backend.transaction(self._reap_abandoned_snapshots)

    def committed_dead_letter_locations(self, source: str) -> list[str]:
        rows = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT c.dead_letter_location FROM collected c JOIN epochs e ON e.epoch = c.epoch "
                "WHERE c.asset = ? AND e.state = 'COMMITTED' AND c.dead_letter_location IS NOT NULL ORDER BY c.epoch",
                [source],
            ).fetchall()
        )
        return [r[0] for r in rows]

    # ------------------------------------------------------------------ injection

    def inject(
        self, plan: Callable[[str, Mapping[str, int]], list[SplitRange]], run_id: str | None = None, claim: bool = False
    ) -> EpochRecord:
        """Allocate the next epoch and fix the offsets each source split covers in it.

        ``plan(source, start_offsets)`` is the connectors' planner. It runs outside any transaction
        (it may read files); the transaction that records the epoch re-checks that nobody injected
        meanwhile, and plans again if someone did, so two injectors never hand out one range twice.
        """
        sources = self.sources
        for _ in range(50):
            snapshot = self.backend.transaction(lambda cur: self._injection_snapshot(cur, sources))
            planned = {s: plan(s, snapshot["starts"].get(s, {})) for s in sources}

            def record(cur: Cursor) -> EpochRecord | None:
                latest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
                if latest != snapshot["latest"]:
                    return None  # raced with another injector: plan again from the new ends
                self._check_can_inject(cur)
                prev = self._committed_or_last_in_flight(cur)
                seq = int(self._get(cur, "barrier_seq", "0"))
                kind = barrier_kind(seq, self.settings.checkpoint_frequency)
                epoch = next_epoch(latest)
                now = time.time()
                cur.execute(
                    "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at, "
                    "owner_host, owner_pid, owner_run, heartbeat_at) "
                    "VALUES (?, ?, ?, 'INJECTED', ?, ?, ?, ?, ?)",
                    [
                        epoch,
                        prev,
                        kind.value,
                        now,
                        Owner.host if claim else None,
                        os.getpid() if claim else None,
                        run_id,
                        now,
                    ],
                )
                for source, ranges in planned.items():
                    for r in ranges:
                        cur.execute(
                            "INSERT INTO epoch_offsets VALUES (?, ?, ?, ?, ?)",
                            [epoch, source, r.split, r.start, r.end],
                        )
                self._set(cur, "barrier_seq", str(seq + 1))
                return EpochRecord(epoch, prev, kind, EpochState.INJECTED, now)

            injected = self.backend.transaction(record)
            if injected is not None:
                log.info("injected epoch %s (prev %s, %s)", injected.epoch, injected.prev, injected.kind.value)
                return injected
        raise EpochalError("could not inject an epoch: 50 concurrent injections won every race; retry")

    def _injection_snapshot(self, cur: Cursor, sources: list[str]) -> dict[str, Any]:
        self._check_can_inject(cur)
        latest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
        starts: dict[str, dict[str, int]] = {}
        # Each split continues where the newest epoch that is not aborted stopped: in-flight epochs
        # keep their ranges reserved, aborted ones hand theirs back.
        rows = cur.execute(
            "SELECT o.source, o.split, o.end_offset FROM epoch_offsets o "
            "JOIN (SELECT o2.source, o2.split, max(o2.epoch) AS epoch FROM epoch_offsets o2 "
            "      JOIN epochs e ON e.epoch = o2.epoch WHERE e.state <> 'ABORTED' GROUP BY o2.source, o2.split) m "
            "ON m.source = o.source AND m.split = o.split AND m.epoch = o.epoch"
        ).fetchall()
        for source, split, end in rows:
            starts.setdefault(source, {})[split] = end
        return {"latest": latest, "starts": starts}

    def _committed_or_last_in_flight(self, cur: Cursor) -> int | None:
        row = cur.execute("SELECT max(epoch) FROM epochs WHERE state <> 'ABORTED'").fetchone()
        return row[0] if row else None

    def _check_can_inject(self, cur: Cursor) -> None:
        if self._get(cur, "paused"):
            raise InjectionBlocked("injection is paused: run `epochal resume` to inject epochs again")
        if self._get(cur, "recovery_requested"):
            raise InjectionBlocked(
                f"a recovery is pending ({self._get(cur, 'recovery_requested')}): it runs at the start of "
                "the next epoch_job run or barrier sensor tick"
            )
        n = cur.execute("SELECT count(*) FROM epochs WHERE state IN ('INJECTED', 'COLLECTED')").fetchone()[0]
        if n >= self.settings.max_in_flight:
            raise InjectionBlocked(
                f"{n} epochs are in flight, the limit (EPOCHAL_MAX_IN_FLIGHT) is {self.settings.max_in_flight}: "
                "wait for them to commit, or raise the limit"
            )

    def can_inject(self) -> str | None:
        """None if an epoch can be injected now, else the reason it cannot."""
        try:
            self.backend.transaction(self._check_can_inject)
        except InjectionBlocked as blocked:
            return str(blocked)
        return None

    # ------------------------------------------------------------------ liveness

    def begin_step(
        self, epoch: int, run_id: str | None, source: str | None = None, table: str | None = None
    ) -> StepStart:
        """Claim ``epoch`` for the calling process (if it dies, the epoch is recovered) and read what a
        step needs, in one transaction: the epoch, a source's offsets, what has been collected, and
        whether ``table`` has written before (a view's first epoch is never idle)."""

        def begin(cur: Cursor) -> StepStart:
            record = self._epoch(cur, epoch)
            cur.execute(
                "UPDATE epochs SET owner_host = ?, owner_pid = ?, owner_run = ?, heartbeat_at = ? "
                "WHERE epoch = ? AND state IN ('INJECTED', 'COLLECTED')",
                [Owner.host, os.getpid(), run_id, time.time(), epoch],
            )
            offsets = self._offsets(cur, epoch, source) if source is not None else []
            written = self._written_before(cur, table, epoch) if table is not None else None
            return StepStart(record, offsets, self._collected(cur, epoch), written)

        return self.backend.transaction(begin)

    @staticmethod
    def _written_before(cur: Cursor, table: str, epoch: int) -> bool:
        """A snapshot, or a change file of an epoch before ``epoch`` that was not aborted: what
        ``state_parts(table, epoch, inclusive=False)`` would find something in. Unlike it, this
        does not ask for every earlier epoch (an idle view's empty change needs none of them)."""
        row = cur.execute(
            "SELECT EXISTS (SELECT 1 FROM snapshots WHERE table_name = ? AND state = 'READY' AND epoch < ?) "
            "OR EXISTS (SELECT 1 FROM collected c JOIN epochs e ON e.epoch = c.epoch WHERE c.asset = ? "
            "AND c.location IS NOT NULL AND e.state <> 'ABORTED' AND c.epoch < ?)",
            [table, epoch, table, epoch],
        ).fetchone()
        return bool(row[0])

    @staticmethod
    def _release(cur: Cursor, epoch: int) -> None:
        # The epoch now waits for other steps, bounded by the epoch timeout, not by this process.
        cur.execute(
            "UPDATE epochs SET owner_pid = NULL, heartbeat_at = ? WHERE epoch = ? AND owner_pid = ? AND owner_host = ?",
            [time.time(), epoch, os.getpid(), Owner.host],
        )

    def fail(self, epoch: int, error: str) -> bool:
        """A step failed on ``epoch``: if the epoch is in flight, record why and ask for a recovery.

        A failed re-run of a committed (or aborted) epoch changes nothing: committed data stays,
        and recovering would abort other runs' in-flight epochs for no reason. Returns whether a
        recovery was requested."""

        def mark(cur: Cursor) -> bool:
            if not self._epoch(cur, epoch).state.in_flight:
                return False
            cur.execute("UPDATE epochs SET failure = ?, owner_pid = NULL WHERE epoch = ?", [error[:2000], epoch])
            self._set(cur, "recovery_requested", f"epoch {epoch} failed: {error.splitlines()[0][:300]}")
            return True

        return self.backend.transaction(mark)

    def recovery_reason(self) -> str | None:
        """Why a recovery is needed before injecting more, or None."""

        def check(cur: Cursor) -> str | None:
            requested = self._get(cur, "recovery_requested")
            if requested:
                return requested
            if self._get(cur, "bootstrapped") is None:
                return "bootstrap"
            now = time.time()
            rows = cur.execute(
                "SELECT epoch, owner_host, owner_pid, heartbeat_at, failure FROM epochs "
                "WHERE state IN ('INJECTED', 'COLLECTED') ORDER BY epoch"
            ).fetchall()
            for epoch, host, pid, heartbeat, failure in rows:
                if failure:
                    return f"epoch {epoch} failed: {failure.splitlines()[0][:300]}"
                if pid is not None and host == Owner.host and not Owner.pid_alive(pid):
                    return f"epoch {epoch}: its run (pid {pid}) died"
                if heartbeat is not None and now - heartbeat > self.settings.epoch_timeout_s:
                    return f"epoch {epoch}: no progress for {now - heartbeat:.0f}s (EPOCHAL_EPOCH_TIMEOUT_S)"
            return None

        return self.backend.transaction(check)

    # ------------------------------------------------------------------ collect & commit

    def collect(self, epoch: int, collected: Collected, release: bool = False) -> CollectResult:
        """Record that ``collected.asset`` has written its output for ``epoch`` and commit what is ready,
        in one transaction; ``release`` also ends this process's claim on the epoch."""

        def record(cur: Cursor) -> bool:
            row = cur.execute("SELECT state FROM epochs WHERE epoch = ?", [epoch]).fetchone()
            if row is None:
                raise UnknownEpoch(f"epoch {epoch} was never injected")
            state = EpochState(row[0])
            if state is EpochState.ABORTED:
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery; its output is discarded. Run epoch_job "
                    "without a partition to go on from the committed epoch"
                )
            if state is EpochState.COMMITTED:
                return False
            cur.execute("DELETE FROM collected WHERE epoch = ? AND asset = ?", [epoch, collected.asset])
            cur.execute(
                "INSERT INTO collected VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    epoch,
                    collected.asset,
                    collected.location,
                    collected.rows_in,
                    collected.rows_out,
                    collected.dead_letters,
                    collected.dead_letter_location,
                    collected.seconds,
                    collected.run_id,
                    time.time(),
                ],
            )
            cur.execute("UPDATE epochs SET heartbeat_at = ? WHERE epoch = ?", [time.time(), epoch])
            return True

        def record_and_commit(cur: Cursor) -> CollectResult:
            recorded = record(cur)
            committed = self._commit_ready(cur) if recorded else []
            if release:
                self._release(cur, epoch)
            return CollectResult(recorded=recorded, committed=committed)

        result = self.backend.transaction(record_and_commit)
        if result.committed:
            log.info("committed epoch(s) %s", result.committed)
        return result

    def commit_step(self, epoch: int) -> CommitStep:
        """Commit every epoch that is ready, oldest first, and read where ``epoch`` stands, in one
        transaction; when the calling run is done with ``epoch`` (it is committed, or a barrier
        that waits for its checkpoint), its claim ends in the same transaction.

        Safe to call from any number of racing processes: the state checks and updates happen in
        one transaction, so each epoch moves to COMMITTED exactly once. One transaction rather
        than one per question: an idle epoch costs a handful of them in all, so each one counts."""

        def attempt(cur: Cursor) -> CommitStep:
            committed = self._commit_ready(cur)
            record = self._epoch(cur, epoch)
            collected = self._collected(cur, epoch)
            missing = [t for t in self.tables if t not in collected]
            done = record.state is EpochState.COMMITTED or (
                record.state is not EpochState.ABORTED and not missing and not record.is_checkpoint
            )
            if done:
                self._release(cur, epoch)
            return CommitStep(committed, record, missing, done, self._committed_epoch(cur), self._in_flight(cur))

        step = self.backend.transaction(attempt)
        if step.committed:
            log.info("committed epoch(s) %s", step.committed)
        return step

    def _commit_ready(self, cur: Cursor) -> list[int]:
        tables = self.tables
        committed = self._committed_epoch(cur)
        ready: list[EpochRecord] = []  # the collected epochs right after the committed one
        gap = False
        for rec in self._in_flight(cur):
            done = {r[0] for r in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [rec.epoch]).fetchall()}
            complete = set(tables) <= done
            if complete and rec.state is EpochState.INJECTED:
                _transition(cur, rec.epoch, EpochState.INJECTED, EpochState.COLLECTED)
            if gap or not complete:
                gap = True
                continue
            # Each ready epoch must follow the one before it: a gap would mean an epoch was lost
            # without a recovery, and the committed cut would be inconsistent.
            expected_prev = ready[-1].epoch if ready else committed
            assert rec.prev == expected_prev or (not ready and committed is None), (
                f"epoch {rec.epoch} follows {rec.prev}, expected {expected_prev}"
            )
            ready.append(rec)
        # Barriers wait for the checkpoint after them; commit up to the last collected checkpoint.
        last_checkpoint = max((i for i, r in enumerate(ready) if r.is_checkpoint), default=None)
        if last_checkpoint is None:
            return []
        to_commit = ready[: last_checkpoint + 1]
        now = time.time()
        for rec in to_commit:
            _transition(cur, rec.epoch, EpochState.COLLECTED, EpochState.COMMITTED, committed_at=now, owner_pid=None)
        top = to_commit[-1].epoch
        # Commit alignment: every table advances to the same epoch in the same transaction.
        for table in tables:
            cur.execute(
                "INSERT INTO table_epochs (table_name, committed_epoch) VALUES (?, ?) "
                "ON CONFLICT (table_name) DO UPDATE SET committed_epoch = excluded.committed_epoch",
                [table, top],
            )
        return [r.epoch for r in to_commit]

    # ------------------------------------------------------------------ recovery

    def recover(
        self,
        reason: str,
        discard: Callable[[list[str]], None],
        sweep: Callable[[set[str], int | None], list[str]] | None = None,
    ) -> RecoveryReport:
        """Take every table back to the committed epoch and make the controller ready to inject.

        ``discard(locations)`` deletes data written for aborted epochs. ``sweep(keep, upto)``
        optionally deletes warehouse data of epochs <= ``upto`` that no live epoch references
        (written by a run that died before it could collect) and returns what it removed; epochs
        injected after the abort are newer than ``upto`` and never touched. Transient failures are
        retried with exponential backoff and jitter; a commit-alignment mismatch is not, because
        retrying cannot fix it.
        """
        started = time.time()
        recovery_id = self.backend.transaction(lambda cur: self._start_recovery(cur, reason, started))
        log.warning("recovery #%s started: %s", recovery_id, reason)
        attempt = 0
        while True:
            attempt += 1
            try:
                aborted, locations, committed, paused, latest = self.backend.transaction(self._abort_in_flight)
                discard(locations)
                swept = sweep(self._live_locations(), latest) if sweep else []
                self.backend.transaction(
                    lambda cur: self._finish_recovery(cur, recovery_id, committed, aborted, attempt)
                )
                seconds = time.time() - started
                log.warning(
                    "recovery #%s done in %.2fs after %d attempt(s): committed epoch %s, aborted %s, paused=%s",
                    recovery_id,
                    seconds,
                    attempt,
                    committed,
                    aborted,
                    paused,
                )
                return RecoveryReport(reason, committed, aborted, locations + swept, attempt, seconds, paused)
            except CommitAlignmentError as exc:
                message = str(exc)
                self.backend.transaction(lambda cur: self._fail_recovery(cur, recovery_id, message, attempt))
                raise
            except Exception as exc:  # transient: storage or meta store hiccup
                if attempt >= RECOVERY_ATTEMPTS:
                    message = str(exc)
                    self.backend.transaction(lambda cur: self._fail_recovery(cur, recovery_id, message, attempt))
                    raise EpochalError(f"recovery failed after {attempt} attempts: {exc}") from exc
                delay = random.uniform(0, min(RECOVERY_CAP_S, RECOVERY_BASE_S * 2**attempt))
                log.warning("recovery attempt %d failed (%s); retrying in %.3fs", attempt, exc, delay)
                time.sleep(delay)

    def _start_recovery(self, cur: Cursor, reason: str, started: float) -> int:
        last = cur.execute("SELECT max(id) FROM recoveries").fetchone()[0]
        recovery_id = (last or 0) + 1
        cur.execute("INSERT INTO recoveries (id, reason, started_at) VALUES (?, ?, ?)", [recovery_id, reason, started])
        return recovery_id

    def _check_alignment(self, cur: Cursor, committed: int | None) -> None:
        rows = dict(cur.execute("SELECT table_name, committed_epoch FROM table_epochs").fetchall())
        if committed is None:
            return
        wrong = {t: rows.get(t) for t in self.tables if rows.get(t) != committed}
        if wrong:
            listing = ", ".join(f"{t}={e}" for t, e in sorted(wrong.items(), key=lambda kv: kv[0]))
            new = [t for t, e in wrong.items() if e is None]
            hint = (
                f"table(s) {', '.join(sorted(new))} joined the pipeline after epochs were committed; adding a "
                "view to a running pipeline needs a backfill, which Epochal does not do yet: remove the new "
                "definition, or start over with a fresh EPOCHAL_HOME"
                if new and len(new) == len(wrong)
                else "the meta store was edited or damaged; restore it from a backup"
            )
            raise CommitAlignmentError(
                f"commit alignment violated: the pipeline is committed at epoch {committed} but {listing}: {hint}"
            )

    def _abort_in_flight(self, cur: Cursor) -> tuple[list[int], list[str], int | None, bool, int | None]:
        committed = self._committed_epoch(cur)
        latest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
        self._check_alignment(cur, committed)
        aborted: list[int] = []
        locations: list[str] = []
        for rec in self._in_flight(cur):
            for loc, dlq in cur.execute(
                "SELECT location, dead_letter_location FROM collected WHERE epoch = ?", [rec.epoch]
            ).fetchall():
                locations.extend(x for x in (loc, dlq) if x)
            _transition(cur, rec.epoch, rec.state, EpochState.ABORTED, owner_pid=None)
            aborted.append(rec.epoch)
        # Aborted epochs' collect records go: nothing may ever read them again.
        if aborted:
            marks = ", ".join("?" for _ in aborted)
            cur.execute(f"DELETE FROM collected WHERE epoch IN ({marks})", aborted)
        cur.execute("DELETE FROM sink_epochs WHERE state = 'PENDING' AND epoch > ?", [committed or 0])
        # A compaction that died left an unpublished snapshot: forgotten here, its files swept below.
        self._reap_abandoned_snapshots(cur)
        paused = bool(self._get(cur, "paused"))
        if self._get(cur, "pause_on_next_start"):
            log.warning(
                "pausing injection as pause_on_next_start asks; the setting is now reset. "
                "Run `epochal resume` to inject epochs again"
            )
            self._set(cur, "paused", "1")
            self._set(cur, "pause_on_next_start", None)
            paused = True
        self._set(cur, "barrier_seq", "0")  # the next barrier is the initial one
        self._set(cur, "recovery_requested", None)
        self._set(cur, "bootstrapped", "1")
        return aborted, locations, committed, paused, latest

    def _live_locations(self) -> set[str]:
        """Every location an epoch that is not aborted references, and every snapshot that is
        recorded or being written by a live compaction: what a sweep must keep."""

        def read(cur: Cursor) -> set[str]:
            rows = cur.execute(
                "SELECT c.asset, c.location, c.dead_letter_location FROM collected c "
                "JOIN epochs e ON e.epoch = c.epoch WHERE e.state <> 'ABORTED'"
            ).fetchall()
            snapshots = cur.execute("SELECT location FROM snapshots").fetchall()
            return {x for _, loc, dlq in rows for x in (loc, dlq) if x} | {loc for (loc,) in snapshots}

        return self.backend.transaction(read)

    def _finish_recovery(self, cur: Cursor, rid: int, committed: int | None, aborted: list[int], attempts: int) -> None:
        cur.execute(
            "UPDATE recoveries SET finished_at = ?, committed_epoch = ?, aborted_epochs = ?, attempts = ? WHERE id = ?",
            [time.time(), committed, json.dumps(aborted), attempts, rid],
        )

    def _fail_recovery(self, cur: Cursor, rid: int, error: str, attempts: int) -> None:
        cur.execute(
            "UPDATE recoveries SET finished_at = ?, error = ?, attempts = ? WHERE id = ?",
            [time.time(), error[:2000], attempts, rid],
        )

    # ------------------------------------------------------------------ sinks

    def sink_state(self, sink: str) -> dict[int, str]:
        rows = self.backend.transaction(
            lambda cur: cur.execute("SELECT epoch, state FROM sink_epochs WHERE sink = ?", [sink]).fetchall()
        )
        return dict(rows)

    def mark_sink(self, sink: str, epoch: int, state: str, rows: int | None = None) -> None:
        assert state in ("PENDING", "COMMITTED", "ABORTED")
        self.backend.transaction(
            lambda cur: (
                cur.execute("DELETE FROM sink_epochs WHERE sink = ? AND epoch = ?", [sink, epoch]),
                cur.execute("INSERT INTO sink_epochs VALUES (?, ?, ?, ?, ?)", [sink, epoch, state, rows, time.time()]),
            )
        )

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        def read(cur: Cursor) -> dict[str, Any]:
            committed = self._committed_epoch(cur)
            table_epochs = dict(cur.execute("SELECT table_name, committed_epoch FROM table_epochs").fetchall())
            in_flight = []
            for rec in self._in_flight(cur):
                done = sorted(
                    r[0] for r in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [rec.epoch]).fetchall()
                )
                in_flight.append(
                    {
                        "epoch": rec.epoch,
                        "prev": rec.prev,
                        "kind": rec.kind.value,
                        "state": rec.state.value,
                        "collected": done,
                        "injected_at": rec.injected_at,
                        "failure": rec.failure,
                    }
                )
            last = cur.execute(
                "SELECT id, reason, started_at, finished_at, committed_epoch, aborted_epochs, attempts, error "
                "FROM recoveries ORDER BY id DESC LIMIT 1"
            ).fetchone()
            sinks = dict(
                cur.execute(
                    "SELECT sink, max(epoch) FROM sink_epochs WHERE state = 'COMMITTED' GROUP BY sink"
                ).fetchall()
            )
            counts = dict(cur.execute("SELECT state, count(*) FROM epochs GROUP BY state").fetchall())
            snapshots: dict[str, dict[str, Any]] = {}
            for table, epoch, rows_out, files_out, finished in cur.execute(
                "SELECT table_name, epoch, rows_out, files_out, finished_at FROM snapshots WHERE state = 'READY' "
                "ORDER BY epoch"
            ).fetchall():
                snapshots[table] = {"epoch": epoch, "rows": rows_out, "files": files_out, "at": finished}
            retention = dict(cur.execute("SELECT table_name, changes_dropped_upto FROM table_retention").fetchall())
            return {
                "committed_epoch": committed,
                "tables": {t: table_epochs.get(t) for t in self.tables},
                "in_flight": in_flight,
                "paused": bool(self._get(cur, "paused")),
                "pause_on_next_start": bool(self._get(cur, "pause_on_next_start")),
                "recovery_requested": self._get(cur, "recovery_requested"),
                "sinks": {s: sinks.get(s) for s in self.sinks},
                # newest snapshot per table, and the epoch up to which its change files were deleted
                "snapshots": {
                    t: {**snapshots[t], "changes_dropped_upto": retention.get(t)} if t in snapshots else None
                    for t in self.tables
                },
                "epoch_counts": {s.value: counts.get(s.value, 0) for s in EpochState},
                "last_recovery": None
                if last is None
                else {
                    "id": last[0],
                    "reason": last[1],
                    "started_at": last[2],
                    "finished_at": last[3],
                    "committed_epoch": last[4],
                    "aborted_epochs": json.loads(last[5]) if last[5] else [],
                    "attempts": last[6],
                    "error": last[7],
                },
                "meta_store": self.backend.url if "@" not in self.backend.url else "postgresql://***",
            }

        return self.backend.transaction(read)
