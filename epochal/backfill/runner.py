"""The work of a backfill, with Spark: the snapshot phase, range by range of the key space, then
the log-store phase, epoch by epoch, then the join (:mod:`epochal.checkpoint.backfills.log` holds
the state; this module never changes it but through that log).

**Snapshot phase** (:mod:`epochal.backfill.snapshot_phase`). The view's rows at the snapshot
epoch S, its plan run once over its inputs' state at S, one vnode range of its key at a time; each
range recorded DONE once its files are in place, so a killed backfill resumes at the first range
not done, never from zero.

**Log-store phase.** The inputs' committed change files are the log store. The view writes each
committed epoch after S in order, exactly as a live step would have, recorded against the
committed epoch (retention keeps those files while a backfill needs them).

**Join.** Once the view has written the committed epoch it joins in one transaction, and writes
the epochs in flight whose live step it missed; from then on its own step runs with the others.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

from epochal.backfill import snapshot_phase
from epochal.backfill.work import Progress
from epochal.checkpoint.backfills.log import BackfillLost
from epochal.checkpoint.backfills.state import Backfill, BackfillPhase
from epochal.checkpoint.records import Collected
from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError, require
from epochal.faults import fault_point
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT, Lease
from epochal.runtime.data_errors import ViewDataError, data_failure, user_view
from epochal.spark.session import scheduler_pool

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime

log = logging.getLogger("epochal.backfill")

#: how often a backfill yielding to live epochs looks whether they committed (a meta-store read)
YIELD_POLL_S = 0.1

#: held switches this process has logged (shadow, reason)
_TOLD_HELD: set[tuple[str, str]] = set()


class BackfillRunner:
    def __init__(self, runtime: EpochRuntime):
        self.runtime = runtime
        self.controller = runtime.controller

    # ------------------------------------------------------------------ driving

    def pending(self) -> list[Backfill]:
        """Active backfills of views in the pipeline, upstreams first: a changed view's new
        statement under its shadow name too, until the view switched to it."""
        self.runtime.changes.add_shadows()
        rebuilding = self.controller.active_rebuilds().values()
        # A held switch (the new statement changes a type a reader relies on) waits for the user
        # to change the statement again, which starts its backfill over: work on it now is lost.
        for r in rebuilding:
            if r.held and (r.shadow, r.held) not in _TOLD_HELD:
                # once per reason and process: the barrier sensor asks every tick
                _TOLD_HELD.add((r.shadow, r.held))
                log.info("backfill of %s waits: the switch of %s is held (%s)", r.shadow, r.view, r.held)
        serving_old = {r.shadow for r in rebuilding if r.state is rebuilds.RebuildState.SERVING_OLD and not r.held}
        order = {name: i for i, name in enumerate(self.runtime.pipeline.view_order())}
        # A shadow whose view switched has done its work (it is retired at the next injection).
        active = [
            b
            for b in self.controller.all_backfills()
            if b.phase.active and b.view in order and (rebuilds.rebuilt_view(b.view) is None or b.view in serving_old)
        ]
        return sorted(active, key=lambda b: order[b.view])

    def advance(self, budget_s: float | None = None, views: list[str] | None = None) -> list[Progress]:
        """Work on every pending backfill (or ``views``), upstreams first, for at most ``budget_s``
        seconds (default EPOCHAL_BACKFILL_RUN_S); each view as far as it gets. Returns progress."""
        budget = self.runtime.settings.backfill_run_s if budget_s is None else budget_s
        deadline = time.monotonic() + budget
        reports = []
        for backfill in self.pending():
            named = rebuilds.rebuilt_view(backfill.view) or backfill.view
            if views is not None and backfill.view not in views and named not in views:
                continue
            if time.monotonic() >= deadline:
                break
            reports.append(self.advance_view(backfill.view, deadline))
        return reports

    def advance_view(self, view: str, deadline: float) -> Progress:
        progress = Progress(view)
        started = time.time()
        current = self.controller.backfill(view)
        if current is None or not current.phase.active:
            progress.note = "no backfill to advance" if current is None else f"backfill {current.phase.shown}"
            return self._finish(progress, started)
        stale = self._statement_differs(view)
        if stale is not None:
            # Rows of another statement than the one the meta store expects would be published as it.
            progress.note = stale
            log.warning("backfill %s: %s", view, stale)
            return self._finish(progress, started)
        if not self.controller.claim_backfill(view):
            progress.note = "another runner is working on it"
            return self._finish(progress, started)
        interval = max(0.05, self.runtime.settings.epoch_timeout_s / LEASE_RENEWALS_PER_TIMEOUT)
        try:
            with Lease(f"backfill {view}", lambda: self.controller.renew_backfill(view), interval):
                self._advance(view, deadline, progress)
            self.controller.record_backfill_error(view, None)
        except BackfillLost as lost:
            progress.note = str(lost)
        except Exception as exc:
            failure = data_failure(exc)
            if failure is None:
                self.controller.record_backfill_error(view, f"{type(exc).__name__}: {exc}"[:1000])
                raise
            # Not an epoch's failure (the epochs it writes are committed without it): the
            # backfill's, which fails the same way until the statement changes.
            definition = self.runtime.pipeline.views.get(view)
            owner = user_view(self.runtime.pipeline, definition) if definition else None
            error = ViewDataError(owner.name if owner else view, None, failure, owner.query if owner else None)
            self.controller.record_backfill_error(view, f"{type(error).__name__}: {error}"[:1000])
            raise error from exc
        finally:
            self.controller.release_backfill(view)
        return self._finish(progress, started)

    def _statement_differs(self, view: str) -> str | None:
        """Why this process must not backfill ``view``: its statement is not the one the meta store
        builds the view from (this process read its SQL files before a change, or a change it holds
        has not been acted on by an injection yet); None when it is."""
        try:
            self.runtime.check_statement(view)
        except EpochalError as differs:
            return str(differs)
        return None

    def _finish(self, progress: Progress, started: float) -> Progress:
        progress.seconds = time.time() - started
        # A view's entry holds its stages' splits; a stage or a changed view's new statement,
        # which status shows inside their view's entry, report their own.
        status = self.controller.backfill_status().get(progress.view) or self.controller.backfill_entry(progress.view)
        progress.phase = status.get("phase", progress.phase)
        progress.vnodes_done = status.get("vnodes_done", progress.vnodes_done)
        progress.splits_done = status.get("splits_done", progress.splits_done)
        progress.splits_total = status.get("splits_total", progress.splits_total)
        progress.epochs_behind = status.get("epochs_behind")
        progress.caught_up_epoch = status.get("caught_up_epoch")
        progress.snapshot_epoch = status.get("snapshot_epoch")
        log.info("backfill %s: %s", progress.view, progress.metadata())
        return progress

    def _advance(self, view: str, deadline: float, progress: Progress) -> None:
        backfill = self.controller.backfill(view)
        require(backfill is not None, f"a claimed backfill of {view} has a row")
        if backfill.phase is BackfillPhase.WAITING and not self.controller.start_backfill_snapshot(view):
            progress.note = "waiting for a backfilling upstream to reach the snapshot epoch"
            return
        # (not while paused: a paused backfill's runner comes every sensor tick and does nothing)
        paused = self.rate_limit(view) == 0
        if not paused:
            # Live epochs first from the start: the snapshot epoch is then the one they commit.
            self.yield_to_live(view, deadline, progress)
        moved = None if paused else self.controller.refresh_backfill_snapshot(view)
        if moved is not None:
            log.info("backfill %s: nothing written yet; snapshot epoch %s -> %s (the committed epoch)", view, *moved)
        # Its Spark work in a pool that gets only the slots live epochs leave (a paused backfill
        # starts no Spark for it).
        pool = nullcontext() if paused else scheduler_pool(self.runtime.spark, self.runtime.settings.backfill_pool)
        with pool:
            backfill = self.controller.backfill(view)
            if backfill.phase is BackfillPhase.SNAPSHOT:
                if not snapshot_phase.run(self, backfill, deadline, progress):
                    return
                backfill = self.controller.backfill(view)
            if backfill.phase is BackfillPhase.LOG_STORE:
                if not paused:  # once, not before each of its epochs (yield_to_live says why)
                    self.yield_to_live(view, deadline, progress)
                self._log_store_phase(backfill, deadline, progress)

    # ------------------------------------------------------------------ rate limit

    def rate_limit(self, view: str) -> float | None:
        """Rows per second: the one set while it runs, else the view's WITH, else the setting."""
        set_now = self.controller.backfill_rate_limit(view)
        if set_now is not None:
            return set_now
        written = self.runtime.pipeline.views[view].options.get("backfill_rate_limit")
        if written is not None:
            return float(written)
        return self.runtime.settings.backfill_rate_limit

    def must_stop(self, view: str, deadline: float, progress: Progress, resumes: str, live_first: bool = False) -> bool:
        """Whether to stop before the next piece of work: the time budget is used (``resumes``
        says where the next run goes on) or the backfill is paused; the reason goes in the note.
        ``live_first``: live epochs in flight go first (``yield_to_live``)."""
        if live_first:
            self.yield_to_live(view, deadline, progress)
        if time.monotonic() >= deadline:
            progress.note = f"time budget used; {resumes}"
            return True
        if self.rate_limit(view) == 0:
            progress.note = "paused (backfill_rate_limit = 0)"
            return True
        return False

    def yield_to_live(self, view: str, deadline: float, progress: Progress) -> None:
        """Wait while live epochs are in flight, at most EPOCHAL_BACKFILL_YIELD_S: as RisingWave's
        backfill reads its snapshot between barriers. A live epoch that shares a 2-core machine with
        a backfill's range took 2.5x its time even with the backfill's tasks in a low pool (the
        driver's work competes for the cores too); between pieces the backfill lets it run alone.
        The bound keeps a backfill moving when epochs are always in flight. It waits when its work
        starts, before each snapshot range and split chunk, and once when the log-store phase
        starts, not before each of its epochs: an epoch of the change log costs what the view's
        live step would, and a backfill that waited before each could fall behind for good."""
        limit = self.runtime.settings.backfill_yield_s
        if limit <= 0:
            return
        started = time.monotonic()
        end = min(deadline, started + limit)
        while self.controller.in_flight() and time.monotonic() < end:
            time.sleep(YIELD_POLL_S)
        waited = time.monotonic() - started
        progress.yielded_s += waited
        if waited >= YIELD_POLL_S:
            log.info("backfill %s: waited %.1fs for live epochs in flight to commit", view, waited)

    def throttle(self, view: str, rows: int, seconds: float, deadline: float) -> bool:
        """Sleep so the rows read stay within the rate limit; False when paused (rate 0)."""
        rate = self.rate_limit(view)
        if rate is None:
            return True
        if rate == 0:
            return False
        wait = rows / rate - seconds
        if wait > 0:
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        return True

    # ------------------------------------------------------------------ log-store phase and join

    def _log_store_phase(self, backfill: Backfill, deadline: float, progress: Progress) -> None:
        view = backfill.view
        runtime = self.runtime
        root = runtime.warehouse.backfill_root(view, backfill.snapshot_epoch)
        self._clean_unrecorded_epochs(view, root)
        while True:
            epoch = self.controller.next_backfill_epoch(view)
            if epoch is None and rebuilds.rebuilt_view(view) is not None:
                # A changed view's new statement never joins under its shadow name: the view's own
                # step of the next epoch switches to it.
                progress.note = (
                    f"caught up: {rebuilds.rebuilt_view(view)} switches to its new statement at its next epoch"
                )
                return
            if epoch is None:
                joined, pending = self.controller.join_backfill(view)
                if joined:
                    progress.joined_epoch = self.controller.backfill(view).joined_epoch  # type: ignore[union-attr]
                    progress.note = f"joined at epoch {progress.joined_epoch}"
                    for in_flight in pending:
                        self._write_in_flight(view, in_flight)
                    return
                continue  # an epoch committed meanwhile: write it first
            if self.controller.adopt_backfill_written(view, epoch):
                # A changed view's step wrote its new statement's change there ahead (to switch).
                progress.epochs_written += 1
                continue
            behind = self._upstream_behind(backfill, epoch)
            if behind is not None:
                # Its own runner (another process, when it holds the claim) writes that epoch first.
                progress.note = f"waiting for {behind}, still backfilling, to write epoch {epoch}"
                return
            if self.must_stop(view, deadline, progress, "the next run goes on from the next epoch"):
                return
            started = time.time()
            recorded: list[Collected] = []

            def record(collected: Collected, epoch: int = epoch) -> None:
                fault_point("backfill-epoch-written")
                self.controller.record_backfill_epoch(
                    view, epoch, collected.location, collected.rows_in or 0, collected.rows_out or 0, collected.seconds
                )
                recorded.append(collected)

            with runtime.recording_for_backfill(root, record):
                runtime.view_epoch(epoch, view, run_id="backfill")
            require(len(recorded) == 1, f"the backfill of {view} recorded epoch {epoch} once")
            progress.epochs_written += 1
            log.info(
                "backfill %s: epoch %s written from the change log (%d rows in)", view, epoch, recorded[0].rows_in or 0
            )
            progress.rows_read += recorded[0].rows_in or 0
            progress.rows_written += recorded[0].rows_out or 0
            if not self.throttle(view, recorded[0].rows_in or 0, time.time() - started, deadline):
                progress.note = "paused (backfill_rate_limit = 0)"
                return

    def _upstream_behind(self, backfill: Backfill, epoch: int) -> str | None:
        """An upstream of the view that is backfilling too and has not written committed ``epoch``
        yet (the view's step of it would find no change of its input), or None."""
        for upstream in backfill.upstreams:
            other = self.controller.backfill(upstream)
            if other is not None and other.phase.active:
                if other.phase is not BackfillPhase.LOG_STORE or (other.caught_up_epoch or 0) < epoch:
                    return upstream
        return None

    def _clean_unrecorded_epochs(self, view: str, root: str) -> None:
        """Change files a killed runner wrote under ``root`` but never recorded."""
        for path in self.runtime.warehouse.keep_attempts(root, self.controller.backfill_locations(view)):
            log.info("backfill %s: deleted %s, written by a runner that died before recording it", view, path)

    def _write_in_flight(self, view: str, epoch: int) -> None:
        """An epoch in flight at the join, whose live step skipped the view: written now, with the
        epoch's lease, as its own step would have (an aborted epoch is simply left)."""
        from epochal.checkpoint.records import EpochAborted, EpochState

        try:
            # release: the claim this step takes on the epoch ends with its collect, so the
            # backfill's process ending is never taken for the death of the epoch's run.
            # Live work, which the epoch's commit waits for: back in the default pool (never
            # starting Spark for it: the view's step starts it if it needs it).
            live = scheduler_pool(self.runtime.spark, None) if "spark" in vars(self.runtime) else nullcontext()
            with live:
                self.runtime.run_view(epoch, view, run_id="backfill", release=True)
        except EpochAborted:
            log.info("backfill %s: epoch %s was aborted meanwhile; recovery re-runs it", view, epoch)
        except Exception:
            # A recovery that aborts the epoch deletes its files under the step (an input's change
            # is then missing, whatever the reader calls that): the same abort, not a failure.
            if self.controller.epoch(epoch).state is not EpochState.ABORTED:
                raise
            log.info("backfill %s: epoch %s was aborted while it was written; recovery re-runs it", view, epoch)


__all__ = ["BackfillRunner", "Progress"]
