"""Recovery: take every table back to the committed epoch, abort what is in flight, delete what was
written for it, and make the controller ready to inject again from an initial barrier."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable

from epochal.checkpoint import queries as q
from epochal.checkpoint import retired_files
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.catalog import SnapshotCatalog
from epochal.checkpoint.records import CommitAlignmentError, EpochState, RecoveryReport
from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor
from epochal.retry import retrying

log = logging.getLogger("epochal.checkpoint.controller")

# Recovery backoff as in the seed: 20 ms base, exponential, 5 s cap, with jitter.
RECOVERY_BASE_S = 0.020
RECOVERY_CAP_S = 5.0
RECOVERY_ATTEMPTS = 8

#: ``discard(locations)`` deletes what aborted epochs wrote.
Discard = Callable[[list[str]], None]
#: ``sweep(keep, upto)`` deletes warehouse data of epochs <= ``upto`` (and snapshot attempts) that
#: ``keep()`` does not hold, calling ``keep`` only after it has listed what is there.
Sweep = Callable[[Callable[[], set[str]], int | None], list[str]]


class Recovery:
    def __init__(
        self, backend: Backend, tables: Iterable[str], catalog: SnapshotCatalog, registrable: Iterable[str] = ()
    ):
        self.backend = backend
        self.tables = list(tables)
        self.catalog = catalog
        #: tables the next injection registers when they are new (sources join, views backfill):
        #: one without a committed epoch is not an alignment error for the recovery that precedes it
        self.registrable = set(registrable)

    def run(self, reason: str, discard: Discard, sweep: Sweep | None = None) -> RecoveryReport:
        """Transient failures are retried with exponential backoff and jitter; a commit-alignment
        mismatch is not, because retrying cannot fix it."""
        started = time.time()
        recovery_id = self.backend.transaction(lambda cur: self._start(cur, reason, started))
        # every first run bootstraps: routine, unlike a recovery after a failure
        level = logging.INFO if reason == "bootstrap" else logging.WARNING
        log.log(level, "recovery #%s started: %s", recovery_id, reason)
        attempts = 0
        # What earlier attempts aborted: their transaction committed before a later step failed, and
        # a retry finds nothing in flight, but the report must still say what this recovery aborted.
        aborted: list[int] = []
        locations: list[str] = []

        def attempt() -> RecoveryReport:
            nonlocal attempts
            attempts += 1
            now_aborted, now_locations, committed, paused, latest = self.backend.transaction(self._abort_in_flight)
            aborted.extend(now_aborted)
            locations.extend(now_locations)
            discard(locations)
            swept = sweep(self.live_locations, latest) if sweep else []
            self.backend.transaction(lambda cur: self._finish(cur, recovery_id, committed, aborted, attempts))
            seconds = time.time() - started
            # a WARNING only when it threw work away: a clean start aborts nothing
            log.log(
                logging.WARNING if aborted or locations or swept else logging.INFO,
                "recovery #%s done in %.2fs after %d attempt(s): committed epoch %s, aborted %s, paused=%s",
                recovery_id,
                seconds,
                attempts,
                committed,
                aborted,
                paused,
            )
            return RecoveryReport(reason, committed, aborted, locations + swept, attempts, seconds, paused)

        def retry(exc: BaseException, attempt: int, delay: float) -> None:
            log.warning("recovery attempt %d failed (%s); retrying in %.3fs", attempt, exc, delay)

        def give_up(exc: BaseException, attempt: int) -> BaseException:
            return EpochalError(f"recovery failed after {attempt} attempts: {exc}")

        try:
            # A commit-alignment mismatch is not retried: retrying cannot fix it. Anything else is
            # transient (a storage or meta-store hiccup) until the attempts run out.
            return retrying(
                retry_on=lambda exc: isinstance(exc, Exception) and not isinstance(exc, CommitAlignmentError),
                base=RECOVERY_BASE_S,
                cap=RECOVERY_CAP_S,
                attempts=RECOVERY_ATTEMPTS,
                give_up=give_up,
                on_retry=retry,
            )(attempt)
        except Exception as exc:
            message = str(exc.__cause__ if isinstance(exc, EpochalError) and exc.__cause__ else exc)
            self.backend.transaction(lambda cur: self._fail(cur, recovery_id, message, attempts))
            raise

    @staticmethod
    def _start(cur: Cursor, reason: str, started: float) -> int:
        last = cur.execute("SELECT max(id) FROM recoveries").fetchone()[0]
        recovery_id = (last or 0) + 1
        cur.execute("INSERT INTO recoveries (id, reason, started_at) VALUES (?, ?, ?)", [recovery_id, reason, started])
        return recovery_id

    def _abort_in_flight(self, cur: Cursor) -> tuple[list[int], list[str], int | None, bool, int | None]:
        committed = q.committed_epoch(cur)
        latest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
        known = {r[0] for r in cur.execute("SELECT table_name FROM table_epochs").fetchall()}
        checked = [t for t in backfill_log.aligned(cur, self.tables) if t in known or t not in self.registrable]
        q.check_alignment(cur, checked, committed)
        aborted: list[int] = []
        locations: list[str] = []
        for rec in q.in_flight(cur):
            for loc, dlq in cur.execute(
                "SELECT location, dead_letter_location FROM collected WHERE epoch = ?", [rec.epoch]
            ).fetchall():
                locations.extend(x for x in (loc, dlq) if x)
            q.transition(cur, rec.epoch, rec.state, EpochState.ABORTED, owner_pid=None)
            aborted.append(rec.epoch)
        # Aborted epochs' collect records go: nothing may ever read them again.
        if aborted:
            marks = ", ".join("?" for _ in aborted)
            cur.execute(f"DELETE FROM collected WHERE epoch IN ({marks})", aborted)
        # A view that switched to its new statement in an aborted epoch serves its old rows again.
        locations.extend(rebuilds.revert_aborted(cur, committed))
        # Aborted epochs hand their offset ranges back: every split starts where it is committed.
        cur.execute("DELETE FROM split_frontier WHERE committed_end IS NULL")
        cur.execute("UPDATE split_frontier SET reserved_end = committed_end WHERE reserved_end <> committed_end")
        # A compaction that died left an unpublished snapshot: forgotten here, its files swept below.
        self.catalog.reap_abandoned(cur)
        paused = bool(q.get_flag(cur, "paused"))
        if q.get_flag(cur, "pause_on_next_start"):
            log.warning(
                "pausing injection as pause_on_next_start asks; the setting is now reset. "
                "Run `epochal resume` to inject epochs again"
            )
            q.set_flag(cur, "paused", "1")
            q.set_flag(cur, "pause_on_next_start", None)
            paused = True
        q.set_flag(cur, "barrier_seq", "0")  # the next barrier is the initial one
        q.set_flag(cur, "recovery_requested", None)
        q.set_flag(cur, "bootstrapped", "1")
        return aborted, locations, committed, paused, latest

    def live_locations(self) -> set[str]:
        """Every location an epoch that is not aborted references, every snapshot that is
        recorded or being written by a live compaction, and every retired file not deleted yet (a
        reader that chose it before retention let it go may still scan it): what a sweep must keep.
        Read after the sweep listed the warehouse, so whatever it listed was announced before this read."""

        def read(cur: Cursor) -> set[str]:
            rows = cur.execute(
                "SELECT c.location, c.dead_letter_location FROM collected c "
                "JOIN epochs e ON e.epoch = c.epoch WHERE e.state <> 'ABORTED'"
            ).fetchall()
            snapshots = cur.execute("SELECT location FROM snapshots").fetchall()
            recorded = {x for loc, dlq in rows for x in (loc, dlq) if x} | {loc for (loc,) in snapshots}
            return recorded | retired_files.retired_locations(cur)

        return self.backend.transaction(read)

    @staticmethod
    def _finish(cur: Cursor, rid: int, committed: int | None, aborted: list[int], attempts: int) -> None:
        cur.execute(
            "UPDATE recoveries SET finished_at = ?, committed_epoch = ?, aborted_epochs = ?, attempts = ? WHERE id = ?",
            [time.time(), committed, json.dumps(aborted), attempts, rid],
        )

    @staticmethod
    def _fail(cur: Cursor, rid: int, error: str, attempts: int) -> None:
        cur.execute(
            "UPDATE recoveries SET finished_at = ?, error = ?, attempts = ? WHERE id = ?",
            [time.time(), error[:2000], attempts, rid],
        )
