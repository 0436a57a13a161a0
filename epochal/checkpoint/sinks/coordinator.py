"""The sink coordinator: delivers committed epochs into a sink's target exactly once, with two-phase
commit (the seed's ``meta_sink_coordinator_worker.rs``).

One row per delivery attempt (``sink_batches``): a *batch* is ``commit_checkpoint_interval``
consecutive committed epochs of the sink's upstream table, delivered in one downstream transaction.

* The writers pre-commit on the executors (:mod:`epochal.sinks.spark_writers`) and return
  metadata. The coordinator checks that they cover every vnode exactly once; otherwise the attempt
  is ABORTED (its pre-commit thrown away) and the batch is tried again.
* The attempt is persisted PENDING with the writers' metadata *before* anything is committed. The
  epochs are committed upstream already (sinks only read committed epochs), so a PENDING batch must
  reach the target: whoever finds it, after any crash, commits it again (commits are idempotent).
* After the target's commit, the batch is marked COMMITTED; retention keeps an epoch's change
  files until every sink's COMMITTED batches reach it.
* Recovery (the start of every delivery) commits PENDING batches, throws away every pre-commit that
  belongs to no PENDING batch (a run killed between its writers and PENDING), and cleans ABORTED
  attempts whose cleaning did not finish.

A sink added to a table with history starts with a *snapshot batch* (epochs ``0..S``: the table's
state at S, see :data:`epochal.sinks.base.SNAPSHOT_FIRST_EPOCH`), or after that history; where it
starts is decided once, at its first delivery (:mod:`epochal.checkpoint.sinks.starts`). What the rows
say, for status and lag, is read by :mod:`epochal.checkpoint.sinks.status`; a writer's error is named
by :mod:`epochal.checkpoint.sinks.writer_errors`.

A slow or failing target never holds epochs back: delivery runs after the epoch commit, lags, and
catches up from the change files, which retention keeps until they are delivered.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import InvariantViolation, Owner
from epochal.checkpoint.sinks import starts as sink_starts
from epochal.checkpoint.sinks import status as sink_status
from epochal.checkpoint.sinks.batches import (
    BATCH_COLUMNS,
    SINK_TRANSITIONS,
    DeliveryReport,
    SinkBatch,
    SinkBatchState,
    SinkStart,
    results_json,
)
from epochal.checkpoint.sinks.claims import SinkClaims
from epochal.checkpoint.sinks.writer_errors import describe_error, error_kind
from epochal.checkpoint.statements import sinks as sink_declarations
from epochal.faults import fault_point
from epochal.lease import Lease
from epochal.meta.backend import Backend, Cursor
from epochal.redaction import redact_url
from epochal.sinks.base import (
    SNAPSHOT_FIRST_EPOCH,
    BatchId,
    PrecommitLost,
    SinkDataError,
    SinkError,
    SinkTarget,
    WriterResult,
    coverage_problems,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Coverage failures tried again before the delivery fails (each is a fresh attempt).
COVERAGE_ATTEMPTS = 3


class SinkCoordinator:
    """The meta-store side of every sink's deliveries, and the delivery protocol. Knows nothing of
    Spark or of any target system: the writers run through the ``write`` callback and the target
    through :class:`SinkTarget`."""

    def __init__(self, backend: Backend, claim_timeout_s: float = 600.0, claim_wait_s: float = 30.0):
        self.backend = backend
        #: one run delivers a sink at a time (claims.py)
        self.claims = SinkClaims(backend, claim_timeout_s, claim_wait_s)

    # ------------------------------------------------------------------ reading (status.py)

    def batches(self, sink: str) -> list[SinkBatch]:
        return self.backend.transaction(lambda cur: sink_status.batches(cur, sink))

    def delivered_epoch(self, sink: str) -> int | None:
        return self.backend.transaction(lambda cur: q.sink_delivered(cur, sink))

    def lag_of(self, sink: str) -> dict[str, Any]:
        return self.backend.transaction(lambda cur: sink_status.lag(cur, sink))

    # ------------------------------------------------------------------ where a sink starts (starts.py)

    def start(
        self,
        sink: str,
        snapshot: bool,
        join_epoch: int,
        declaration: str | None = None,
        loaded_at: float | None = None,
        recipe: str | None = None,
    ) -> SinkStart:
        """Where ``sink`` starts: decided at its first call (a delivery step of ``join_epoch``) and
        recorded. A sink moved to another target under the same name raises ``SinkTargetChanged``,
        and the refusal is kept for ``epochal status``. ``recipe`` (``SinkRecipe`` JSON) is kept to
        finish the sink's batches should it leave the pipeline with some not finished."""
        try:
            return self.backend.transaction(
                lambda cur: sink_starts.decide(cur, sink, snapshot, join_epoch, declaration, loaded_at, recipe)
            )
        except sink_declarations.SinkTargetChanged as refused:
            reason = str(refused)
            self.backend.transaction(lambda cur: sink_declarations.note_refusal(cur, sink, reason))
            raise

    def move_snapshot(self, sink: str, stale: int, epoch: int) -> SinkStart:
        """Move a snapshot start whose state can no longer be read (retention released its snapshot
        and change files) to ``epoch``, while the target holds no snapshot batch yet."""
        return self.backend.transaction(lambda cur: sink_starts.move_snapshot(cur, sink, stale, epoch))

    # ------------------------------------------------------------------ transitions

    def _transition(
        self,
        cur: Cursor,
        batch: BatchId,
        to: SinkBatchState,
        results: Sequence[WriterResult] = (),
        error: str | None = None,
        cleaned: bool = False,
        owner: str | None = None,
    ) -> bool:
        """The one place a batch attempt changes state. Returns False (and changes nothing) when a
        PENDING attempt loses to another attempt of the same epochs that is PENDING or COMMITTED."""
        row = cur.execute(
            "SELECT state FROM sink_batches WHERE sink = ? AND first_epoch = ? AND attempt = ? AND nonce = ?",
            [batch.sink, batch.first_epoch, batch.attempt, batch.nonce],
        ).fetchone()
        current = SinkBatchState(row[0]) if row else None
        if to not in SINK_TRANSITIONS[current]:
            raise InvariantViolation(
                f"{batch.describe()} (attempt {batch.attempt}): a sink batch cannot go from "
                f"{current.value if current else 'nothing'} to {to.value}"
            )
        now = time.time()
        if current is None:
            if to is SinkBatchState.PENDING and owner is not None:
                # A run that lost its claim (taken over as silent) may have lost its pre-commit to the
                # new owner's recovery: it must not persist it.
                if SinkClaims.holder(cur, batch.sink) != owner:
                    return False
            if to is SinkBatchState.PENDING:
                # Exactly one attempt of a range of epochs is ever PENDING or COMMITTED: a racing run
                # that persisted first wins, and this one throws its pre-commit away.
                rival = cur.execute(
                    "SELECT count(*) FROM sink_batches WHERE sink = ? AND state IN ('PENDING', 'COMMITTED') "
                    "AND first_epoch <= ? AND last_epoch >= ?",
                    [batch.sink, batch.last_epoch, batch.first_epoch],
                ).fetchone()[0]
                if rival:
                    return False
            cur.execute(
                f"INSERT INTO sink_batches ({BATCH_COLUMNS}, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    batch.sink,
                    batch.first_epoch,
                    batch.last_epoch,
                    batch.attempt,
                    batch.nonce,
                    to.value,
                    results_json(results),
                    sum(r.rows for r in results),
                    error,
                    cleaned,
                    now,
                    now,
                ],
            )
            return True
        updated = cur.execute(
            "UPDATE sink_batches SET state = ?, error = coalesce(?, error), cleaned = ?, updated_at = ? "
            "WHERE sink = ? AND first_epoch = ? AND attempt = ? AND nonce = ? AND state = ? RETURNING attempt",
            [to.value, error, cleaned, now, batch.sink, batch.first_epoch, batch.attempt, batch.nonce, current.value],
        ).fetchall()
        if len(updated) != 1:
            raise InvariantViolation(f"{batch.describe()}: the {current.value} row changed under its transition")
        return True

    def _mark(self, batch: BatchId, to: SinkBatchState, **fields: Any) -> bool:
        return self.backend.transaction(lambda cur: self._transition(cur, batch, to, **fields))

    def _note_pending_error(self, batch: BatchId, error: str) -> None:
        self.backend.transaction(
            lambda cur: cur.execute(
                "UPDATE sink_batches SET error = ?, updated_at = ? WHERE sink = ? AND first_epoch = ? AND attempt = ? "
                "AND nonce = ? AND state = 'PENDING'",
                [redact_url(error)[:2000], time.time(), batch.sink, batch.first_epoch, batch.attempt, batch.nonce],
            )
        )

    def _mark_cleaned(self, batch: BatchId) -> None:
        self.backend.transaction(
            lambda cur: cur.execute(
                "UPDATE sink_batches SET cleaned = ? WHERE sink = ? AND first_epoch = ? AND attempt = ? AND nonce = ?",
                [True, batch.sink, batch.first_epoch, batch.attempt, batch.nonce],
            )
        )

    # ------------------------------------------------------------------ recovery

    def recover(self, target: SinkTarget, report: DeliveryReport | None = None) -> DeliveryReport:
        """Bring ``target`` to what the meta store says: PENDING batches committed (again), every
        pre-commit of no PENDING batch thrown away, ABORTED attempts cleaned."""
        report = report or DeliveryReport(target.name)
        batches = self.batches(target.name)
        pending = [b for b in batches if b.state is SinkBatchState.PENDING]
        for batch in pending:
            if self._commit(target, batch.id, batch.results):
                report.recommitted += 1
                report.rows += batch.rows
                if batch.id.snapshot:
                    report.snapshot_epoch, report.snapshot_rows = batch.id.last_epoch, batch.rows
        still_pending = [b.id for b in self.batches(target.name) if b.state is SinkBatchState.PENDING]
        report.orphans_aborted += target.abort_orphans(still_pending)
        for batch in batches:
            if batch.state is SinkBatchState.ABORTED and not batch.cleaned:
                target.abort(batch.id, batch.metadata)
                self._mark_cleaned(batch.id)
        if report.recommitted or report.orphans_aborted:
            log.info(
                "sink %s recovery: %d pending batch(es) committed, %d orphaned pre-commit(s) thrown away",
                target.name,
                report.recommitted,
                report.orphans_aborted,
            )
        return report

    def finish(self, target: SinkTarget) -> DeliveryReport | None:
        """Finish the batches of a sink that left the pipeline (``recover`` under the sink's claim, so
        no run still delivering it runs beside): its PENDING batches are committed (the commit was
        decided), its other pre-commits thrown away. None when another run holds the claim."""
        owner = Owner.tag(secrets.token_hex(4))
        if not self.claims.take(target.name, owner):
            return None
        try:
            return self.recover(target)
        finally:
            self.claims.release(target.name, owner)

    def _commit(self, target: SinkTarget, batch: BatchId, results: Sequence[WriterResult]) -> bool:
        """Commit a PENDING batch into the target and mark it COMMITTED; False when its pre-commit
        was lost (it is then ABORTED and its epochs are delivered again)."""
        try:
            target.commit(batch, [r.metadata for r in results])
        except PrecommitLost as lost:
            log.warning("%s: %s; delivering its epochs again", batch.describe(), lost)
            self._mark(batch, SinkBatchState.ABORTED, error=str(lost), cleaned=False)
            return False
        except SinkDataError as refused:
            # The batch stays PENDING (its epochs are committed upstream); the error is kept on
            # it for status until the target takes its rows.
            self._note_pending_error(batch, str(refused))
            raise
        fault_point("sink-committed")
        self._mark(batch, SinkBatchState.COMMITTED)
        return True

    # ------------------------------------------------------------------ delivery

    def deliver(
        self,
        target: SinkTarget,
        epochs: Sequence[tuple[int, T]],
        interval: int,
        write: Callable[[BatchId, list[T]], list[WriterResult]],
        snapshot: tuple[int, T] | None = None,
        after: int | None = None,
        held: frozenset[int] = frozenset(),
    ) -> DeliveryReport:
        """Deliver ``epochs`` ((epoch, payload) of committed epochs, in order, none delivered yet) in
        batches of ``interval`` epochs. A batch is delivered only when it is full, as RisingWave
        commits a sink every ``commit_checkpoint_interval`` checkpoints. ``write`` runs the
        writers of one batch over the payloads (the epochs' change files) and returns their
        pre-commits.

        ``snapshot = (S, payload)``: a sink that has delivered nothing first delivers ``payload``
        (the table's state at epoch S) as one batch through the same two phases, which stands for
        every epoch up to S. ``after``: the epoch ``epochs`` were listed after (the caller's idea of
        the sink's progress); if the sink's progress is older once recovery ran (another run
        delivered a snapshot at an earlier epoch meanwhile), the list misses epochs and this call
        leaves them to the next delivery instead of skipping them. ``held``: epochs an ``error`` check
        failed at (epochal/checkpoint/checks.py); a batch never ends at one, so it grows until an
        epoch that passed and the target goes from the last passing state to the next in one
        transaction (the caller lists ``epochs`` up to an epoch that passed)."""
        started = time.time()
        owner = Owner.tag(secrets.token_hex(4))
        if not self.claims.wait_for(target.name, owner):
            delivered = self.delivered_epoch(target.name)
            report = DeliveryReport(target.name, busy=True, delivered_epoch=delivered)
            report.lag_epochs = sum(1 for e, _ in epochs if delivered is None or e > delivered)
            log.info("sink %s: another run is delivering; this one leaves the epochs to it", target.name)
            return report
        todo: list[tuple[int, T]] = []

        def renew() -> bool:
            return self.claims.renew(target.name, owner)

        try:
            with Lease(f"sink {target.name}", renew, self.claims.renew_interval):
                report = self.recover(target)
                delivered = self.delivered_epoch(target.name)
                if snapshot is not None and delivered is None:
                    rows = self._deliver_batch(
                        target, SNAPSHOT_FIRST_EPOCH, snapshot[0], [snapshot[1]], write, report, owner
                    )
                    if rows is None:  # another run took the claim over and delivers the snapshot
                        report.lost_race = True
                        epochs = []
                    else:
                        report.batches += 1
                        report.rows += rows
                        report.snapshot_epoch, report.snapshot_rows = snapshot[0], rows
                        delivered = snapshot[0]
                progress = delivered if delivered is not None else self._progress(target.name)
                if after is not None and (progress is None or progress < after):
                    log.warning(
                        "sink %s: delivered up to %s, but the epochs to deliver were listed after %s; "
                        "the next delivery lists them again",
                        target.name,
                        progress,
                        after,
                    )
                    report.lost_race = True
                    epochs = []
                todo = [(e, p) for e, p in epochs if delivered is None or e > delivered]
                while len(todo) >= interval:
                    size = interval
                    while size <= len(todo) and todo[size - 1][0] in held:
                        size += 1
                    if size > len(todo):
                        break  # every epoch left ends in a held one: they wait for an epoch that passes
                    chunk, todo = todo[:size], todo[size:]
                    outcome = self._deliver_batch(
                        target, chunk[0][0], chunk[-1][0], [p for _, p in chunk], write, report, owner
                    )
                    if outcome is None:  # another run took the claim over and delivers these epochs
                        report.lost_race = True
                        break
                    report.batches += 1
                    report.epochs += len(chunk)
                    report.rows += outcome
        finally:
            self.claims.release(target.name, owner)
        report.delivered_epoch = self.delivered_epoch(target.name)
        report.lag_epochs = len(todo)
        report.seconds = round(time.time() - started, 3)
        return report

    def _progress(self, sink: str) -> int | None:
        return self.backend.transaction(lambda cur: q.sink_progress(cur, sink))

    def _deliver_batch(
        self,
        target: SinkTarget,
        first: int,
        last: int,
        payloads: list[T],
        write: Callable[[BatchId, list[T]], list[WriterResult]],
        report: DeliveryReport,
        owner: str | None = None,
    ) -> int | None:
        """One batch of epochs ``first..last`` (a snapshot batch: first is SNAPSHOT_FIRST_EPOCH),
        through as many attempts as coverage needs: the rows delivered, or None when another run
        persisted the batch first."""
        attempts = self.backend.transaction(
            lambda cur: cur.execute(
                "SELECT coalesce(max(attempt), 0) FROM sink_batches WHERE sink = ? AND first_epoch = ?",
                [target.name, first],
            ).fetchone()[0]
        )
        for attempt in range(attempts + 1, attempts + 1 + COVERAGE_ATTEMPTS):
            batch = BatchId(target.name, first, last, attempt, secrets.token_hex(4))
            try:
                results = write(batch, payloads)
            except Exception as error:
                # The writers' partial pre-commits are thrown away now; a run killed here leaves
                # them to the next recovery's abort_orphans.
                message = describe_error(batch, error)
                self._abort(target, batch, [], message)
                report.aborted_attempts += 1
                # the target's kind of error (schema, config: not worth retrying) is kept
                raise error_kind(error)(message) from error
            fault_point("sink-prepared")
            problems = coverage_problems(results)
            if problems:
                message = f"{batch.describe()}: the writers did not cover every vnode once: {'; '.join(problems)}"
                log.warning("%s; aborting attempt %d and trying again", message, attempt)
                self._abort(target, batch, results, message)
                report.aborted_attempts += 1
                report.errors.append(message)
                continue
            try:
                target.check_rows(batch, [r.metadata for r in results])
            except Exception as refused:
                message = describe_error(batch, refused)
                self._abort(target, batch, results, message)
                report.aborted_attempts += 1
                raise error_kind(refused)(message) from refused
            if not self._mark(batch, SinkBatchState.PENDING, results=results, owner=owner):
                log.info("%s: another run persisted these epochs first; this run's pre-commit goes", batch.describe())
                target.abort(batch, [r.metadata for r in results])
                return None
            fault_point("sink-pending")
            if not self._commit(target, batch, results):
                continue
            return sum(r.rows for r in results)
        raise SinkError(
            f"sink {target.name}, epochs {first}..{last}: {COVERAGE_ATTEMPTS} attempts did not cover every vnode "
            f"({'; '.join(report.errors[-1:])}). This is a bug in Epochal's writer distribution, please report it"
        )

    def _abort(self, target: SinkTarget, batch: BatchId, results: Sequence[WriterResult], message: str) -> None:
        self._mark(batch, SinkBatchState.ABORTED, results=results, error=message[:2000])
        try:
            target.abort(batch, [r.metadata for r in results])
        except Exception:  # the next recovery cleans it: the row says it is not cleaned yet
            log.exception("%s: could not throw the aborted pre-commit away now; recovery will", batch.describe())
            return
        self._mark_cleaned(batch)
