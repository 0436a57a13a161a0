"""The work of a backfill, with Spark: the snapshot phase, range by range of the key space, then
the log-store phase, epoch by epoch, then the join (:mod:`epochal.checkpoint.backfill_log` holds
the state; this module never changes it but through that log).

**Snapshot phase.** The view's rows at the snapshot epoch S are its incremental plan run once over
its inputs' state at S taken as inserts: nothing before them, so nothing is retracted. That is
done for one vnode range of the plan's key at a time: a keyed plan's rows at a key depend only on
its inputs' rows at that key (the planner's guarantee, which the live epochs use to read state at
the keys a change touches), so the ranges partition the work and their outputs add up to the
view. A linear view is split by any hash of its rows; a plan without a key (a global aggregate,
a full refresh, a leaf over a subquery) is one range. Each range's rows go to a staging
directory, then into the snapshot directory under names of their own, and only then is the range
recorded DONE: a runner killed midway deletes those names and writes the range again, and a
killed backfill resumes at the first range not done, never from zero.

**Log-store phase.** The inputs' committed change files are the log store. The view writes each
committed epoch after S in order, exactly as a live step would have, recorded against the
committed epoch (retention keeps those files while a backfill needs them).

**Join.** Once the view has written the committed epoch it joins in one transaction, and writes
the epochs in flight whose live step it missed; from then on its own step runs with the others.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epochal.backfill import source_splits
from epochal.backfill.state import (
    VNODES_TOTAL,
    Backfill,
    BackfillPhase,
    VnodeRange,
    evened,
    grown_width,
    next_range,
)
from epochal.checkpoint import rebuilds
from epochal.checkpoint.backfill_log import BackfillLog, BackfillLost
from epochal.checkpoint.records import Collected, StateCompacted
from epochal.errors import require
from epochal.faults import fault_point
from epochal.incremental.binding import sql_over
from epochal.lease import LEASE_RENEWALS_PER_TIMEOUT, Lease
from epochal.sql import quote, unquote
from epochal.storage.vnode import vnode_column, vnodes_per_directory, write_laid_out

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from epochal.runtime import EpochRuntime

log = logging.getLogger("epochal.backfill")

#: held switches this process has logged (shadow, reason)
_TOLD_HELD: set[tuple[str, str]] = set()


@dataclass
class Progress:
    """What one runner did for one view, for logs and the backfill asset's metadata."""

    view: str
    phase: str = ""
    vnodes_done: int = 0
    rows_read: int = 0
    rows_written: int = 0
    epochs_written: int = 0
    epochs_behind: int | None = None
    seconds: float = 0.0
    joined_epoch: int | None = None
    note: str = ""
    caught_up_epoch: int | None = None
    snapshot_epoch: int | None = None
    #: splits of the SOURCE inputs read from their connector that are done reading, of how many
    splits_done: int = 0
    splits_total: int = 0

    def metadata(self) -> dict[str, Any]:
        rate = round(self.rows_read / self.seconds, 1) if self.seconds > 0 else 0.0
        return {
            "phase": self.phase,
            "vnodes_done": self.vnodes_done,
            "vnodes_total": VNODES_TOTAL,
            "splits_done": self.splits_done,
            "splits_total": self.splits_total,
            "rows_read": self.rows_read,
            "rows_written": self.rows_written,
            "rows_per_second": rate,
            "epochs_written": self.epochs_written,
            "epochs_behind": self.epochs_behind,
            "snapshot_epoch": self.snapshot_epoch,
            "caught_up_epoch": self.caught_up_epoch,
            "joined_epoch": self.joined_epoch,
            "seconds": round(self.seconds, 3),
            "note": self.note,
        }


class BackfillRunner:
    def __init__(self, runtime: EpochRuntime):
        self.runtime = runtime
        self.log: BackfillLog = runtime.controller.backfills

    # ------------------------------------------------------------------ driving

    def pending(self) -> list[Backfill]:
        """Active backfills of views in the pipeline, upstreams first: a changed view's new
        statement under its shadow name too, until the view switched to it."""
        self.runtime.changes.add_shadows()
        rebuilding = self.runtime.controller.backend.transaction(rebuilds.active).values()
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
            for b in self.log.all()
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
        current = self.log.get(view)
        if current is None or not current.phase.active:
            progress.note = "no backfill to advance" if current is None else f"backfill {current.phase.shown}"
            return self._finish(progress, started)
        if not self.log.claim(view):
            progress.note = "another runner is working on it"
            return self._finish(progress, started)
        interval = max(0.05, self.runtime.settings.epoch_timeout_s / LEASE_RENEWALS_PER_TIMEOUT)
        try:
            with Lease(f"backfill {view}", lambda: self.log.renew(view), interval):
                self._advance(view, deadline, progress)
            self.log.record_error(view, None)
        except BackfillLost as lost:
            progress.note = str(lost)
        except Exception as exc:
            self.log.record_error(view, f"{type(exc).__name__}: {exc}"[:1000])
            raise
        finally:
            self.log.release(view)
        return self._finish(progress, started)

    def _finish(self, progress: Progress, started: float) -> Progress:
        progress.seconds = time.time() - started
        # A view's entry holds its stages' splits; a stage or a changed view's new statement,
        # which status shows inside their view's entry, report their own.
        status = self.log.status().get(progress.view) or self.log.entry(progress.view)
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
        backfill = self.log.get(view)
        require(backfill is not None, f"a claimed backfill of {view} has a row")
        if backfill.phase is BackfillPhase.WAITING and not self.log.start_snapshot(view):
            progress.note = "waiting for a backfilling upstream to reach the snapshot epoch"
            return
        # (not while paused: a paused backfill's runner comes every sensor tick and does nothing)
        moved = None if self.rate_limit(view) == 0 else self.log.refresh_snapshot(view)
        if moved is not None:
            log.info("backfill %s: nothing written yet; snapshot epoch %s -> %s (the committed epoch)", view, *moved)
        backfill = self.log.get(view)
        if backfill.phase is BackfillPhase.SNAPSHOT:
            if not self._snapshot_phase(backfill, deadline, progress):
                return
            backfill = self.log.get(view)
        if backfill.phase is BackfillPhase.LOG_STORE:
            self._log_store_phase(backfill, deadline, progress)

    # ------------------------------------------------------------------ rate limit

    def rate_limit(self, view: str) -> float | None:
        """Rows per second: the one set while it runs, else the view's WITH, else the setting."""
        set_now = self.log.rate_limit(view)
        if set_now is not None:
            return set_now
        written = self.runtime.pipeline.views[view].options.get("backfill_rate_limit")
        if written is not None:
            return float(written)
        return self.runtime.settings.backfill_rate_limit

    def must_stop(self, view: str, deadline: float, progress: Progress, resumes: str) -> bool:
        """Whether to stop before the next piece of work: the time budget is used (``resumes``
        says where the next run goes on) or the backfill is paused; the reason goes in the note."""
        if time.monotonic() >= deadline:
            progress.note = f"time budget used; {resumes}"
            return True
        if self.rate_limit(view) == 0:
            progress.note = "paused (backfill_rate_limit = 0)"
            return True
        return False

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

    # ------------------------------------------------------------------ snapshot phase

    def _snapshot_phase(self, backfill: Backfill, deadline: float, progress: Progress) -> bool:
        """Write vnode ranges until all are done (True, snapshot published) or time runs out."""
        view, epoch = backfill.view, backfill.snapshot_epoch
        warehouse = self.runtime.warehouse
        root = warehouse.backfill_root(view, epoch)
        target = f"{root}/snapshot"
        done = self.log.done_ranges(view)
        known = {nonce for _, nonce in done}
        # SOURCE inputs first: their history is read split by split from the connector.
        from_splits = source_splits.split_sources(self, backfill, vnodes_started=bool(done))
        if from_splits and not source_splits.read_splits(self, backfill, root, deadline, progress):
            return False
        # What a runner that died left: files of ranges never recorded, and its staging.
        self._clean_unrecorded(target, known)
        warehouse.delete([f"{root}/staging"])
        # One stored input: its ranges are the snapshots' own vnodes, so a range opens only its
        # directories. (Ranges a runner recorded under the type-independent hash stay with it: "r".)
        storage = (
            len(self.runtime.pipeline.views[view].upstreams) == 1
            and not from_splits
            and not any(n.startswith("r") for n in known)
        )
        chunking = chunk_keys(self.runtime, view, storage)
        # The SOURCE inputs' rows as read from their splits, once for every range.
        read_rows = {u: source_splits.source_rows(self, view, u) for u in from_splits}
        input_rows = self._input_rows(backfill, read_rows)
        width = self._range_width(backfill, input_rows) if chunking is not None else VNODES_TOTAL
        timed: list[tuple[int, float]] = []  # (width, seconds) of this run's ranges: what sizes the next
        while True:
            ranges = [r for r, _ in done]
            vnodes = next_range(ranges, width if chunking is not None else VNODES_TOTAL)
            if vnodes is None:
                break
            if self.must_stop(view, deadline, progress, "the next run resumes at the next vnode range"):
                return False
            started = time.time()
            # Vnodes per snapshot directory, from the view's rows: at most its inputs' at first, then
            # as many as the ranges so far wrote per row read (an aggregate's far fewer). Ranges that
            # chose differently only make directories that overlap, which readers take.
            share = progress.rows_written / progress.rows_read if progress.rows_read else None
            if share is None and self._aggregates(view):
                per_directory = None  # far fewer, and how many is counted before the write
            else:
                per_directory = vnodes_per_directory(
                    int(input_rows * min(1.0, share or 1.0)), self.runtime.settings.snapshot_directory_rows
                )
            nonce = f"{'v' if storage else 'r'}{vnodes.lo:03d}-{uuid.uuid4().hex[:8]}-"
            rows_read, rows_written = self._write_range(
                backfill, vnodes, chunking, storage, root, target, nonce, read_rows, per_directory
            )
            fault_point("backfill-range-moved")
            self.log.record_chunk(view, vnodes, nonce, rows_read, rows_written)
            fault_point("backfill-range-done")
            done.append((vnodes, nonce))
            progress.rows_read += rows_read
            progress.rows_written += rows_written
            progress.vnodes_done += vnodes.size
            done_vnodes = sum(r.size for r, _ in done)
            elapsed = time.time() - started
            log.info(
                "backfill %s: vnodes [%d, %d) written, %d/%d done, %d rows read in %.1fs (%.0f rows/s)",
                view,
                vnodes.lo,
                vnodes.hi,
                done_vnodes,
                VNODES_TOTAL,
                rows_read,
                elapsed,
                rows_read / elapsed if elapsed > 0 else 0.0,
            )
            if not self.throttle(view, rows_read, time.time() - started, deadline):
                progress.note = "paused (backfill_rate_limit = 0)"
                return False
            if chunking is not None and self.rate_limit(view) is None:
                # (a rate limit sizes ranges by rows: progress about every 10 s at that rate)
                timed.append((vnodes.size, elapsed))
                width = grown_width(timed, VNODES_TOTAL - done_vnodes)
        if not warehouse.exists(target):  # a view with no rows at all
            warehouse.make_dir(target)
        files = warehouse.snapshot_files(target)
        rows = warehouse.files_row_count(files)
        key = self.runtime.distribution_key(view)
        # The schema Spark wrote (a partial aggregate's hidden columns included), from one footer.
        written = warehouse.written_schema([files[0].rsplit("/", 1)[0]]) if files else None
        schema = written or self.runtime.query_schema(view)
        self.log.finish_snapshot(view, target, key, schema.json(), rows, len(files))
        warehouse.delete([f"{root}/staging"])
        if from_splits:  # the view's snapshot is published: the sources' rows read for it are done with
            warehouse.delete([f"{root}/splits"])
        log.info("backfill %s: snapshot at epoch %s written, %d rows in %d files", view, epoch, rows, len(files))
        return True

    def _input_rows(self, backfill: Backfill, read_rows: dict[str, tuple[DataFrame, int]]) -> int:
        """The rows the view's inputs hold at the snapshot epoch, from file footers."""
        inputs = self.runtime.pipeline.views[backfill.view].upstreams
        epoch = backfill.snapshot_epoch
        return sum(read_rows[u][1] if u in read_rows else self._stored_rows(u, epoch) for u in inputs)

    def _range_width(self, backfill: Backfill, total: int) -> int:
        """Vnodes per range, for ranges of about EPOCHAL_BACKFILL_RANGE_ROWS of the inputs' ``total``
        rows (fewer under a rate limit: progress about every 10 s)."""
        wanted = self.runtime.settings.backfill_range_rows
        rate = self.rate_limit(backfill.view)
        if rate:
            wanted = min(wanted, max(1000, int(rate * 10)))
        per_vnode = max(1.0, total / VNODES_TOTAL)
        # (even ranges: 5 ranges of 51 vnodes would leave a sixth of one vnode, a job for nothing)
        return evened(max(1, min(VNODES_TOTAL, int(wanted / per_vnode))), VNODES_TOTAL)

    def _stored_rows(self, table: str, epoch: int) -> int:
        """The rows ``table``'s state at ``epoch`` is stored in, from the meta store and file footers:
        no Spark job (reading the state to count it would scan, or cache, the whole table)."""
        try:
            parts = self.runtime.controller.catalog.state_parts(table, epoch, inclusive=True)
        except StateCompacted:
            history = self.runtime.reader.history
            records = history.records(table, epoch, True) if history and history.covers(table) else None
            if records is None:
                raise
            return records  # a SOURCE that stores nothing: its records at the epoch, from the meta store
        rows = parts.snapshot.rows if parts.snapshot is not None else 0
        return rows + sum(self.runtime.warehouse.row_count(location) for _, location in parts.changes)

    def _clean_unrecorded(self, target: str, known: set[str]) -> None:
        for path in self.runtime.warehouse.keep_prefixed(target, known):
            log.info("backfill: deleted %s, written for a vnode range never recorded", path)

    def _write_range(
        self,
        backfill: Backfill,
        vnodes: VnodeRange,
        chunking: dict[str, Callable[[DataFrame], Column]] | None,
        storage: bool,
        root: str,
        target: str,
        nonce: str,
        read_rows: dict[str, tuple[DataFrame, int]],
        per_directory: int | None,
    ) -> tuple[int, int]:
        """The view's rows at the snapshot epoch for one vnode range, into ``target``'s directories
        of ``per_directory`` vnodes each (None: as many as the range's rows, counted first, call
        for). Returns (input rows read, rows written)."""

        runtime = self.runtime
        view = runtime.pipeline.views[backfill.view]
        epoch = backfill.snapshot_epoch
        states: dict[str, DataFrame] = {}
        total = 0
        columns = chunk_columns(runtime, backfill.view) if storage and vnodes.size < VNODES_TOTAL else None
        for upstream in view.upstreams:
            ranged = None
            if upstream in read_rows:
                # (its rows were counted as read when they came from the connector)
                state = read_rows[upstream][0]
                hashed = None if chunking is None else chunking.get(upstream)
                if hashed is not None and vnodes.size < VNODES_TOTAL:
                    state = state.where(hashed(state).between(vnodes.lo, vnodes.hi - 1))
                states[upstream] = state
                continue
            if columns is not None:
                ranged = runtime.reader.read_vnode_range(upstream, epoch, columns[upstream], vnodes.lo, vnodes.hi)
            if ranged is not None:  # only the range's vnode directories were read
                states[upstream], read = ranged
                total += read * VNODES_TOTAL // vnodes.size
                continue
            # (not through the warm snapshot cache: each range scans only the columns it needs,
            # where filling the cache scans and keeps them all, for reads that do not come back)
            state, read = runtime.read_state(upstream, epoch, inclusive=True, cached=False)
            total += read
            hashed = None if chunking is None else chunking.get(upstream)
            if hashed is not None and vnodes.size < VNODES_TOTAL:
                state = state.where(hashed(state).between(vnodes.lo, vnodes.hi - 1))
            states[upstream] = state
        rows, release = self._rows_over(backfill.view, states)
        key = runtime.distribution_key(backfill.view)
        staging = f"{root}/staging/{nonce.rstrip('-')}"
        persisted = per_directory is None
        try:
            if per_directory is None:
                # Counted from the cached rows, which the write then reads: a guess from the input
                # rows would give an aggregate of 100,000 groups over 10M rows 128 files, 2 s more.
                from pyspark import StorageLevel

                rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
                counted = rows.count()
                per_directory = vnodes_per_directory(
                    counted * VNODES_TOTAL // vnodes.size, runtime.settings.snapshot_directory_rows
                )
            write_laid_out(rows, key, per_directory, staging, mode="overwrite")
        finally:
            if persisted:
                rows.unpersist()
            release()
        written = runtime.warehouse.files_row_count(runtime.warehouse.snapshot_files(staging))
        runtime.warehouse.adopt_vnode_files(staging, target, nonce)
        runtime.warehouse.delete([staging])
        # Rows read: the range's share of the inputs (the read itself lists every file's rows).
        share = total * vnodes.size // VNODES_TOTAL if chunking is not None else total
        return share, written

    def _aggregates(self, name: str) -> bool:
        """Whether ``name`` is a grouped aggregate kept as partial state: its rows are its groups,
        usually far fewer than its input's."""
        from epochal.incremental.plan import PARTIAL_RULE

        plan = self.runtime.pipeline.views[name].plan
        return plan is not None and plan.kind == "keyed" and plan.rule == PARTIAL_RULE

    def _rows_over(self, name: str, states: dict[str, DataFrame]) -> tuple[DataFrame, Callable[[], None]]:
        """The view's stored rows over inputs ``states`` taken as inserts into empty tables, and
        what releases the frames cached for them once they are written."""

        from epochal.incremental.partial import partial_inserts
        from epochal.incremental.plan import PARTIAL_RULE

        runtime = self.runtime
        spark = runtime.spark
        view = runtime.pipeline.views[name]
        nothing: Callable[[], None] = lambda: None  # noqa: E731
        if view.refresh == "full" or view.plan is None:
            rows = sql_over(spark, view.query, states).toDF(*view.columns)
            return _cast_like(rows, runtime.query_schema(name)), nothing
        plan = view.plan
        if plan.kind == "keyed" and plan.rule == PARTIAL_RULE:
            # The table stores partial state (hidden MIN/MAX values): every input row is an insert
            # into an empty group, so the epoch's merge reduces to one aggregation.
            append_only = all(runtime.pipeline.append_only(u) for u in view.upstreams)
            rows = partial_inserts(spark, plan, view.columns, states, runtime.query_schema(name), append_only)
            return rows, nothing
        if plan.kind == "keyed":
            # The view at every key of the range: its query over the leaves' rows (what an epoch
            # computes at the keys it touches, without the restriction: the range is the restriction).
            leaves = {leaf.name: sql_over(spark, leaf.sql, states) for leaf in plan.leaves}
            return sql_over(spark, plan.query, leaves).toDF(*view.columns), nothing
        rows = sql_over(spark, plan.query or view.query, states).toDF(*view.columns)
        if plan.typed_like_query:
            rows = _cast_like(rows, runtime.query_schema(name))
        return rows, nothing

    # ------------------------------------------------------------------ log-store phase and join

    def _log_store_phase(self, backfill: Backfill, deadline: float, progress: Progress) -> None:
        view = backfill.view
        runtime = self.runtime
        root = runtime.warehouse.backfill_root(view, backfill.snapshot_epoch)
        self._clean_unrecorded_epochs(view, root)
        while True:
            epoch = self.log.next_epoch(view)
            if epoch is None and rebuilds.rebuilt_view(view) is not None:
                # A changed view's new statement never joins under its shadow name: the view's own
                # step of the next epoch switches to it.
                progress.note = (
                    f"caught up: {rebuilds.rebuilt_view(view)} switches to its new statement at its next epoch"
                )
                return
            if epoch is None:
                joined, pending = self.log.join(view)
                if joined:
                    progress.joined_epoch = self.log.get(view).joined_epoch  # type: ignore[union-attr]
                    progress.note = f"joined at epoch {progress.joined_epoch}"
                    for in_flight in pending:
                        self._write_in_flight(view, in_flight)
                    return
                continue  # an epoch committed meanwhile: write it first
            if self.log.adopt_written(view, epoch):
                # A changed view's step wrote its new statement's change there ahead (to switch).
                progress.epochs_written += 1
                continue
            if self.must_stop(view, deadline, progress, "the next run goes on from the next epoch"):
                return
            started = time.time()
            recorded: list[Collected] = []

            def record(collected: Collected, epoch: int = epoch) -> None:
                fault_point("backfill-epoch-written")
                self.log.record_epoch(
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

    def _clean_unrecorded_epochs(self, view: str, root: str) -> None:
        """Change files a killed runner wrote under ``root`` but never recorded."""
        for path in self.runtime.warehouse.keep_attempts(root, self.log.recorded_locations(view)):
            log.info("backfill %s: deleted %s, written by a runner that died before recording it", view, path)

    def _write_in_flight(self, view: str, epoch: int) -> None:
        """An epoch in flight at the join, whose live step skipped the view: written now, with the
        epoch's lease, as its own step would have (an aborted epoch is simply left)."""
        from epochal.checkpoint.records import EpochAborted, EpochState

        try:
            # release: the claim this step takes on the epoch ends with its collect, so the
            # backfill's process ending is never taken for the death of the epoch's run.
            self.runtime.run_view(epoch, view, run_id="backfill", release=True)
        except EpochAborted:
            log.info("backfill %s: epoch %s was aborted meanwhile; recovery re-runs it", view, epoch)
        except Exception:
            # A recovery that aborts the epoch deletes its files under the step (an input's change
            # is then missing, whatever the reader calls that): the same abort, not a failure.
            if self.runtime.controller.epoch_log.epoch(epoch).state is not EpochState.ABORTED:
                raise
            log.info("backfill %s: epoch %s was aborted while it was written; recovery re-runs it", view, epoch)


def chunk_columns(runtime: EpochRuntime, name: str) -> dict[str, tuple[str, ...]] | None:
    """Per input table, the columns whose hash splits the backfill into vnode ranges (() is the
    whole row), or None when the view cannot be split (one range: a global aggregate, a full
    refresh, a leaf over a subquery, a table read under two keys)."""
    view = runtime.pipeline.views[name]
    plan = view.plan
    if view.refresh == "full" or plan is None:
        return None
    if plan.kind != "keyed":
        # Linear: any split of the input rows adds up to the view; hash whole rows.
        return dict.fromkeys(view.upstreams, ())
    if not plan.key_classes:
        return None
    keys: dict[str, tuple[str, ...]] = {}
    for leaf in plan.leaves:
        if leaf.table is None:
            return None
        columns = tuple(unquote(k) for k in leaf.key)
        if keys.get(leaf.table, columns) != columns:
            return None  # a table read twice, under different keys
        keys[leaf.table] = columns
    if any(u not in keys for u in view.upstreams):
        return None
    return {u: keys[u] for u in view.upstreams}


def chunk_keys(runtime: EpochRuntime, name: str, storage: bool = False) -> dict[str, Any] | None:
    """Per input table, a function giving each row's vnode in the backfill's key space, or None
    (``chunk_columns``). ``storage``: the snapshots' own hash (``vnode_column``), for a view over
    one table, whose ranges then read only their vnode directories. Otherwise values equal under
    SQL's comparison get the same vnode in every input: a join of an INT with a BIGINT key hashes
    both as the same double."""
    columns = chunk_columns(runtime, name)
    if columns is None:
        return None
    if storage:
        return {u: (lambda frame, cols=cols: vnode_column(frame.schema, cols)) for u, cols in columns.items()}
    def canonical(cols: tuple[str, ...]) -> Callable[[DataFrame], Column]:
        return lambda frame: _canonical_vnode(frame, list(cols or frame.columns))

    return {u: canonical(cols) for u, cols in columns.items()}


def _canonical_vnode(frame: DataFrame, columns: list[str]) -> Column:
    """pmod(xxhash64(values), 256) over values in a type-independent form: numbers as doubles
    (-0.0 as 0.0), everything else as text; NULL keys hash as NULL and land in vnode 0's range."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType

    types = {f.name: f.dataType for f in frame.schema.fields}
    parts = []
    for c in columns:
        col = F.col(quote(c))
        if isinstance(types[c], NumericType):
            value = col.cast("double")
            parts.append(F.when(value == 0, F.lit(0.0)).otherwise(value))
        else:
            parts.append(col.cast("string"))
    return F.coalesce(F.pmod(F.xxhash64(*parts), F.lit(VNODES_TOTAL)).cast("int"), F.lit(0))


def _cast_like(rows: DataFrame, schema: Any) -> DataFrame:
    from pyspark.sql import functions as F

    return rows.select(*(F.col(quote(f.name)).cast(f.dataType).alias(f.name) for f in schema.fields))


__all__ = ["BackfillRunner", "Progress", "chunk_columns", "chunk_keys"]
