"""The epoch log: injects epochs with their source offsets, tracks which run works on each (a lease
it renews while work runs), collects each table's output and commits epochs in order, for every
table at once. The Dagster-free counterpart of RisingWave's global barrier worker, with its state in
the meta store rather than in memory: the "workers" are Dagster runs in processes that come and go.
Every decision is one meta-store transaction, so runs, the sensor and the shell can race freely.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.backfills import rows as backfill_rows
from epochal.checkpoint.epoch_claims import EpochClaims
from epochal.checkpoint.records import (
    Collected,
    CollectResult,
    CommitStep,
    EpochAborted,
    EpochRecord,
    EpochState,
    InjectionBlocked,
    InvariantViolation,
    OrderWaitAbandoned,
    Owner,
    StepStart,
    UnknownEpoch,
)
from epochal.checkpoint.statements import rebuilds
from epochal.checkpoint.statements import sources as source_declarations
from epochal.checkpoint.statements import views as definitions
from epochal.connectors.base import SplitRange
from epochal.epoch import barrier_kind, next_epoch, shown_epoch
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor
from epochal.settings import Settings

#: split rows an injection's INSERT carries at most (bound parameters: 5 each)
_ROWS_PER_INSERT = 200

log = logging.getLogger("epochal.checkpoint.controller")

#: Polling while a step waits for an earlier epoch: starts short (the earlier step is often about
#: to collect), backs off to a second (a long wait costs a transaction a second, not more).
ORDER_POLL_FIRST_S = 0.05
ORDER_POLL_MAX_S = 1.0


class EpochLog(EpochClaims):
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        sources: Iterable[str],
        tables: Iterable[str],
        upstreams: Mapping[str, tuple[str, ...]] | None = None,
        fingerprints: Mapping[str, str] | None = None,
        sink_inputs: Mapping[str, str] | None = None,
        append_only_sinks: Iterable[str] = (),
        view_columns: Mapping[str, tuple[str, ...]] | None = None,
        loaded_at: float | None = None,
        statements: Mapping[str, str] | None = None,
        declarations: Mapping[str, str] | None = None,
    ):
        self.settings = settings
        self.backend = backend
        #: when this process read the pipeline's files: it brings back a retired table it names only
        #: if it read them after the retirement (``backfill_rows.bring_back``)
        self.loaded_at = time.time() if loaded_at is None else loaded_at
        self.sources = list(sources)
        #: the state tables of the pipeline: every source and view. An epoch commits when those not
        #: backfilling have written it (``backfill_log.aligned``, read in the commit's transaction)
        self.tables = list(tables)
        #: each view's inputs: a view new to a pipeline with history is registered as a backfill
        self.upstreams = dict(upstreams or {})
        #: each view's definition, as ``view_fingerprint`` gives it: a changed statement is caught
        self.fingerprints = dict(fingerprints or {})
        #: each view's column names: a changed view a sink reads must keep them
        self.view_columns = dict(view_columns or {})
        #: each view's statement (JSON) by fingerprint: a rebuild maintains the old rows with it
        self.statements = dict(statements or {})
        #: each source's declaration (``source_declarations.Declaration`` as JSON): a changed type is caught
        self.declarations = dict(declarations or {})
        self.readers: dict[str, list[str]] = {}
        for view, inputs in self.upstreams.items():
            for upstream in inputs:
                self.readers.setdefault(upstream, []).append(view)
        #: the table each sink reads, or None when not known (then a changed view is refused, since
        #: a sink that holds rows of its old version cannot be ruled out)
        self.sink_inputs = None if sink_inputs is None else dict(sink_inputs)
        #: sinks that cannot take a retraction: a view they read cannot switch to a new statement
        self.append_only_sinks = frozenset(append_only_sinks)

    # ------------------------------------------------------------------ flags

    def _flag(self, key: str, value: bool) -> None:
        self.backend.transaction(lambda cur: q.set_flag(cur, key, "1" if value else None))

    def pause(self) -> None:
        self._flag("paused", True)

    def resume(self) -> None:
        self._flag("paused", False)

    def set_pause_on_next_start(self, value: bool) -> None:
        self._flag("pause_on_next_start", value)

    # ------------------------------------------------------------------ reading

    def committed_epoch(self) -> int | None:
        return self.backend.transaction(q.committed_epoch)

    def in_flight(self) -> list[EpochRecord]:
        return self.backend.transaction(q.in_flight)

    def epoch(self, epoch: int) -> EpochRecord:
        return self.backend.transaction(lambda cur: q.epoch_record(cur, epoch))

    def epochs(self, states: Iterable[EpochState] = tuple(EpochState)) -> list[EpochRecord]:
        names = [s.value for s in states]
        marks = ", ".join("?" for _ in names)
        return self.backend.transaction(
            lambda cur: [
                q.record(r)
                for r in cur.execute(
                    f"SELECT {q.EPOCH_COLUMNS} FROM epochs WHERE state IN ({marks}) ORDER BY epoch", names
                ).fetchall()
            ]
        )

    def offsets(self, epoch: int, source: str) -> list[SplitRange]:
        return self.backend.transaction(lambda cur: q.offsets(cur, epoch, source))

    def collected(self, epoch: int) -> dict[str, Collected]:
        return self.backend.transaction(lambda cur: q.collected(cur, epoch))

    # ------------------------------------------------------------------ injection

    def inject(
        self, plan: Callable[[str, Mapping[str, int]], list[SplitRange]], run_id: str | None = None, claim: bool = False
    ) -> EpochRecord:
        """Allocate the next epoch and fix the offsets each source split covers in it.

        ``plan(source, start_offsets)`` is the connectors' planner. It runs outside any transaction
        (it may read files). The transaction that records the epoch reads the split starts again
        and records only if they are the ones the plan started from; otherwise it plans again. So
        a plan is never recorded over state it did not see: not over another injector's epoch
        (two injectors would hand out one range twice), and not over a recovery that handed an
        aborted epoch's range back (the new epoch would start past it, and the range would never
        be read)."""
        sources = self.sources
        for _ in range(50):
            seen = self.backend.transaction(self._injection_starts)
            planned = {s: plan(s, seen.get(s, {})) for s in sources}

            def record(cur: Cursor) -> EpochRecord | None:
                self._check_can_inject(cur)
                if q.reserved_starts(cur) != seen:
                    return None  # an injection or a recovery moved the starts: plan again from them
                latest = cur.execute("SELECT max(epoch) FROM epochs").fetchone()[0]
                prev = cur.execute("SELECT max(epoch) FROM epochs WHERE state <> 'ABORTED'").fetchone()[0]
                seq = int(q.get_flag(cur, "barrier_seq", "0") or 0)
                kind = barrier_kind(seq, self.settings.checkpoint_frequency)
                epoch = next_epoch(latest)
                now = time.time()
                cur.execute(
                    "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at, "
                    "owner_host, owner_pid, owner_run, heartbeat_at) "
                    "VALUES (?, ?, ?, 'INJECTED', ?, ?, ?, ?, ?)",
                    [epoch, prev, kind.value, now, Owner.token() if claim else None, os.getpid() if claim else None]
                    + [run_id, now],
                )
                ranges = [(source, r) for source, rs in planned.items() for r in rs]
                for source, r in ranges:
                    start = seen.get(source, {}).get(r.split)
                    if start is not None and r.start != start:
                        raise InvariantViolation(
                            f"the {source} connector planned split {r.split} from offset {r.start}, "
                            f"but it was asked to start at {start}: records would be skipped or read twice"
                        )
                # One statement for all splits, not two per split: a log of 80 split files took
                # 160 statements (0.18 s) to inject an epoch, a cost that grew with the splits.
                for chunk in (ranges[i : i + _ROWS_PER_INSERT] for i in range(0, len(ranges), _ROWS_PER_INSERT)):
                    cur.execute(
                        "INSERT INTO epoch_offsets VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk)),
                        [v for source, r in chunk for v in (epoch, source, r.split, r.start, r.end)],
                    )
                    cur.execute(
                        "INSERT INTO split_frontier (source, split, reserved_end, first_offset) VALUES "
                        + ", ".join(["(?, ?, ?, ?)"] * len(chunk))
                        + " ON CONFLICT (source, split) DO UPDATE SET reserved_end = excluded.reserved_end",
                        [v for source, r in chunk for v in (source, r.split, r.end, r.start)],
                    )
                q.set_flag(cur, "barrier_seq", str(seq + 1))
                return EpochRecord(epoch, prev, kind, EpochState.INJECTED, now)

            injected = self.backend.transaction(record)
            if injected is not None:
                log.info(
                    "injected epoch %s (prev %s, %s)", shown_epoch(injected.epoch), injected.prev, injected.kind.value
                )
                return injected
        raise EpochalError("could not inject an epoch: 50 concurrent injections or recoveries won every race; retry")

    def _injection_starts(self, cur: Cursor) -> dict[str, dict[str, int]]:
        self._check_can_inject(cur)
        return q.reserved_starts(cur)

    def _check_can_inject(self, cur: Cursor) -> None:
        # A view that joined after epochs were committed would run from here on without its
        # history (a linear view reads no state to notice): it backfills, outside alignment, and
        # every other table must agree on the committed epoch.
        committed = q.committed_epoch(cur)
        # A table this process names that was retired after it read the pipeline is stale here:
        # another process, with newer files, removed it. One named again in newer files is back.
        backfill_rows.bring_back(cur, self.tables, self.loaded_at)
        retired = set(backfill_rows.retired(cur))
        fingerprints = {v: f for v, f in self.fingerprints.items() if v not in retired}
        definitions.record_statements(cur, self.statements)
        definitions.check_definitions(
            cur, fingerprints, self.readers, self.sink_inputs, self.append_only_sinks, self.view_columns, self.loaded_at
        )
        declared = {s: d for s, d in self.declarations.items() if s not in retired}
        for change in source_declarations.check_declarations(cur, declared, self.loaded_at, self.settings.home):
            log.warning("%s", change)
        known = {*self.sources, *self.upstreams} - retired
        backfill_log.register_new(cur, [t for t in self.tables if t in known], self.upstreams, committed)
        # The new statement of a view being rebuilt backfills under its shadow name (after its
        # stages, which it may wait for).
        shadows = {r.shadow: self.upstreams[v] for v, r in rebuilds.active(cur).items() if v in self.upstreams}
        backfill_log.register_new(cur, list(shadows), shadows, committed)
        q.check_alignment(cur, backfill_log.aligned(cur, self.tables), committed)
        if q.get_flag(cur, "paused"):
            raise InjectionBlocked("injection is paused: run `epochal resume` to inject epochs again")
        if q.get_flag(cur, "recovery_requested"):
            raise InjectionBlocked(
                f"a recovery is pending ({q.get_flag(cur, 'recovery_requested')}): it runs at the start of "
                "the next epoch_job run or barrier sensor tick"
            )
        n = cur.execute(f"SELECT count(*) FROM epochs WHERE state IN {q.IN_FLIGHT}").fetchone()[0]
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
        self,
        epoch: int,
        run_id: str | None,
        source: str | None = None,
        table: str | None = None,
        claim: bool = True,
    ) -> StepStart:
        """Claim ``epoch`` for the calling process (if it dies, the epoch is recovered) and read what a
        step needs, in one transaction: the epoch, a source's offsets, what has been collected, and
        whether ``table`` has written before (a view's first epoch is never idle).

        Raises EpochAborted when a recovery aborted ``epoch``: its output could never be collected,
        so the step must not start its work. (A run goes on with the steps that do not depend on a
        failed one: without this, a run whose keyed source found its epoch aborted went on to read
        and write its other sources, starting a JVM, only to be refused at collect.)

        ``claim=False``: a backfill writing the epoch outside its alignment; the epoch stays with
        the run that owns it."""

        def begin(cur: Cursor) -> StepStart:
            record = q.epoch_record(cur, epoch)
            if record.state is EpochState.ABORTED:
                raise EpochAborted(
                    f"epoch {epoch} was aborted by a recovery and cannot run again: its records are re-read "
                    "by a later epoch. Run epoch_job without a partition to go on"
                )
            if claim:
                cur.execute(
                    "UPDATE epochs SET owner_host = ?, owner_pid = ?, owner_run = ?, heartbeat_at = ? "
                    f"WHERE epoch = ? AND state IN {q.IN_FLIGHT}",
                    [Owner.token(), os.getpid(), run_id, time.time(), epoch],
                )
            ranges = q.offsets(cur, epoch, source) if source is not None else []
            written = self._written_before(cur, table, epoch) if table is not None else None
            return StepStart(record, ranges, q.collected(cur, epoch), written)

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

    def blocked_by(self, epoch: int) -> str | None:
        """Why an epoch older than ``epoch`` cannot finish (failed, its run died or hung), or None."""
        return self.backend.transaction(lambda cur: self._stuck(cur, before=epoch))

    def fail(self, epoch: int, error: str) -> bool:
        """A step failed on ``epoch``: if the epoch is in flight, record why and ask for a recovery.

        A failed re-run of a committed (or aborted) epoch changes nothing: committed data stays,
        and recovering would abort other runs' in-flight epochs for no reason. Returns whether a
        recovery was requested."""

        def mark(cur: Cursor) -> bool:
            if not q.epoch_record(cur, epoch).state.in_flight:
                return False
            cur.execute("UPDATE epochs SET failure = ?, owner_pid = NULL WHERE epoch = ?", [error[:2000], epoch])
            q.set_flag(cur, "recovery_requested", f"epoch {epoch} failed: {error.splitlines()[0][:300]}")
            return True

        return self.backend.transaction(mark)

    def recovery_reason(self) -> str | None:
        """Why a recovery is needed before injecting more, or None."""

        def check(cur: Cursor) -> str | None:
            requested = q.get_flag(cur, "recovery_requested")
            if requested:
                return requested
            if q.get_flag(cur, "bootstrapped") is None:
                return "bootstrap"
            return self._stuck(cur, before=None)

        return self.backend.transaction(check)

    def _stuck(self, cur: Cursor, before: int | None) -> str | None:
        """Why an in-flight epoch (before ``before``, if given) cannot finish: it failed, its run
        died, or its run showed no sign of life for the epoch timeout. Only INJECTED epochs have
        work left; a COLLECTED one only waits for older epochs (or, a barrier, for its checkpoint),
        so how long it waits says nothing about whether anyone is alive."""
        now = time.time()
        rows = cur.execute(
            "SELECT epoch, state, owner_host, owner_pid, heartbeat_at, failure FROM epochs "
            f"WHERE state IN {q.IN_FLIGHT} AND epoch < ? ORDER BY epoch",
            [before if before is not None else 2**63 - 1],
        ).fetchall()
        for epoch, state, host, pid, heartbeat, failure in rows:
            if failure:
                return f"epoch {epoch} failed: {failure.splitlines()[0][:300]}"
            if state != EpochState.INJECTED.value:
                continue
            if Owner.dead(host, pid):
                return f"epoch {epoch}: its run (pid {pid}) died"
            if heartbeat is not None and now - heartbeat > self.settings.epoch_timeout_s:
                return f"epoch {epoch}: no progress for {now - heartbeat:.0f}s (EPOCHAL_EPOCH_TIMEOUT_S)"
        return None

    def wait_for_order(self, epoch: int, tables: Iterable[str], what: str) -> float:
        """Wait until every epoch before ``epoch`` that is not aborted has been collected by each of
        ``tables``: what a step that reads their state inside ``epoch`` needs (several epochs in
        flight is the normal state, and their runs start in any order). Returns the seconds waited.

        Waiting is never a failure. It ends with OrderWaitAbandoned when an earlier epoch failed or
        its run died (the recovery that calls for aborts this epoch too), and with EpochAborted
        when this epoch was aborted meanwhile. The caller holds the epoch's lease, so a long wait
        is not taken for a dead run."""
        tables = set(tables)
        if not tables:
            return 0.0
        started = time.time()
        delay = ORDER_POLL_FIRST_S

        def check(cur: Cursor) -> tuple[EpochState, list[tuple[int, list[str]]], str | None]:
            state = q.epoch_record(cur, epoch).state
            missing: list[tuple[int, list[str]]] = []
            # Committed epochs were collected by every table. A COLLECTED one may still lack a view
            # that joined after its other tables collected it (the backfill writes it next).
            for (earlier,) in cur.execute(
                f"SELECT epoch FROM epochs WHERE state IN {q.IN_FLIGHT} AND epoch < ? ORDER BY epoch", [epoch]
            ).fetchall():
                done = {r[0] for r in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [earlier]).fetchall()}
                if tables - done:
                    missing.append((earlier, sorted(tables - done)))
            return state, missing, self._stuck(cur, before=epoch) if missing else None

        logged = False
        while True:
            state, missing, stuck = self.backend.transaction(check)
            if state is EpochState.ABORTED:
                raise EpochAborted(f"epoch {epoch} was aborted by a recovery while {what} waited for earlier epochs")
            if not missing:
                waited = time.time() - started
                if logged:
                    log.info("%s at epoch %s: earlier epochs done after %.1fs", what, epoch, waited)
                return waited
            if stuck:
                raise OrderWaitAbandoned(
                    f"{what} at epoch {epoch} waits for earlier epoch(s) that cannot finish ({stuck}): the "
                    f"recovery this calls for aborts epoch {epoch} too. Run epoch_job without a partition to go on"
                )
            if not logged and time.time() - started > 5:
                logged = True
                first, waiting_for = missing[0]
                log.info(
                    "%s at epoch %s waits for epoch %s (%s not written yet)", what, epoch, first, ", ".join(waiting_for)
                )
            time.sleep(delay)
            delay = min(ORDER_POLL_MAX_S, delay * 1.5)

    # ------------------------------------------------------------------ collect & commit

    def collect(self, epoch: int, collected: Collected, release: bool = False) -> CollectResult:
        """Record that ``collected.asset`` has written its output for ``epoch`` and commit what is ready,
        in one transaction; ``release`` also ends this process's claim on the epoch.

        Raises EpochAborted when a recovery aborted the epoch meanwhile: a writer whose epoch was
        recovered under it never gets its output recorded (aborted is final), whatever it wrote."""

        retired = False

        def record(cur: Cursor) -> bool:
            nonlocal retired
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
            if backfill_rows.is_retired(cur, collected.asset):
                # A run that read the pipeline before the table was removed: nobody reads it now.
                log.info("epoch %s: %s left the pipeline; its output is discarded", epoch, collected.asset)
                retired = True
                return False
            backfill = backfill_log.read(cur, collected.asset)
            if backfill is not None and backfill.phase.active:
                # A live step that began before its view was rebuilt (its statement changed): its output
                # comes from the old definition, and recording it would let the view join with it. The
                # backfill writes this epoch.
                log.warning(
                    "epoch %s: %s is backfilling; a live step's output for it is discarded", epoch, collected.asset
                )
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
            return CollectResult(recorded=recorded, committed=committed, retired=retired)

        result = self.backend.transaction(record_and_commit)
        if result.committed:
            log.info("committed epoch(s) %s", ", ".join(map(shown_epoch, result.committed)))
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
            record = q.epoch_record(cur, epoch)
            done_tables = q.collected(cur, epoch)
            missing = [t for t in backfill_log.aligned(cur, self.tables) if t not in done_tables]
            done = record.state is EpochState.COMMITTED or (
                record.state is not EpochState.ABORTED and not missing and not record.is_checkpoint
            )
            if done:
                self._release(cur, epoch)
            return CommitStep(committed, record, missing, done, q.committed_epoch(cur), q.in_flight(cur))

        step = self.backend.transaction(attempt)
        if step.committed:
            log.info("committed epoch(s) %s", ", ".join(map(shown_epoch, step.committed)))
        return step

    def _commit_ready(self, cur: Cursor) -> list[int]:
        # Read in this transaction: a backfill joins in one of its own, so a commit is wholly
        # before the join (without the view) or after it (waiting for the view's step).
        tables = backfill_log.aligned(cur, self.tables)
        committed = q.committed_epoch(cur)
        ready: list[EpochRecord] = []  # the collected epochs right after the committed one
        gap = False
        for rec in q.in_flight(cur):
            done = {r[0] for r in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [rec.epoch]).fetchall()}
            complete = set(tables) <= done
            if complete and rec.state is EpochState.INJECTED:
                q.transition(cur, rec.epoch, EpochState.INJECTED, EpochState.COLLECTED)
            if gap or not complete:
                gap = True
                continue
            # Each ready epoch must follow the one before it: a gap would mean an epoch was lost
            # without a recovery, and the committed cut would be inconsistent.
            expected_prev = ready[-1].epoch if ready else committed
            if rec.prev != expected_prev and not (not ready and committed is None):
                raise InvariantViolation(
                    f"epoch {rec.epoch} follows {rec.prev}, but the epoch before it is {expected_prev}: an epoch "
                    "was lost without a recovery; run `epochal recover`"
                )
            ready.append(rec)
        # Barriers wait for the checkpoint after them; commit up to the last collected checkpoint.
        last_checkpoint = max((i for i, r in enumerate(ready) if r.is_checkpoint), default=None)
        if last_checkpoint is None:
            return []
        to_commit = ready[: last_checkpoint + 1]
        now = time.time()
        for rec in to_commit:
            q.transition(cur, rec.epoch, EpochState.COLLECTED, EpochState.COMMITTED, committed_at=now, owner_pid=None)
            # The committed frontier: where recovery sends each split back to. One statement for
            # all splits: one per split made a commit grow with the log's split files (80: 30 ms).
            cur.execute(
                "UPDATE split_frontier SET committed_end = o.end_offset FROM epoch_offsets AS o "
                "WHERE o.epoch = ? AND o.source = split_frontier.source AND o.split = split_frontier.split",
                [rec.epoch],
            )
        top = to_commit[-1].epoch
        # Commit alignment: every table advances to the same epoch in the same transaction.
        for table in tables:
            cur.execute(
                "INSERT INTO table_epochs (table_name, committed_epoch) VALUES (?, ?) "
                "ON CONFLICT (table_name) DO UPDATE SET committed_epoch = excluded.committed_epoch",
                [table, top],
            )
        return [r.epoch for r in to_commit]
