"""The snapshot phase of a backfill, with Spark: the view's rows at the snapshot epoch S, written
vnode range by vnode range (the state lives in :mod:`epochal.checkpoint.backfills.log`; this module
changes it only through that log, as :mod:`epochal.backfill.runner` does).

The view's rows at S are its incremental plan run once over its inputs' state at S taken as
inserts: nothing before them, so nothing is retracted. That is done for one vnode range of the
plan's key at a time: a keyed plan's rows at a key depend only on its inputs' rows at that key (the
planner's guarantee, which the live epochs use to read state at the keys a change touches), so the
ranges partition the work and their outputs add up to the view. A linear view is split by any hash
of its rows; a plan without a key (a global aggregate, a full refresh, a leaf over a subquery) is
one range. Each range's rows go to a staging directory, then into the snapshot directory under
names of their own, and only then is the range recorded DONE: a runner killed midway deletes those
names and writes the range again, and a killed backfill resumes at the first range not done.

Range widths start at EPOCHAL_BACKFILL_RANGE_ROWS of input and then follow the measured cost of
the ranges written (:func:`epochal.checkpoint.backfills.state.grown_width`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochal.backfill import source_splits
from epochal.checkpoint.backfills.log import BackfillLost
from epochal.checkpoint.backfills.state import VNODES_TOTAL, Backfill, VnodeRange, evened, grown_width, next_range
from epochal.checkpoint.records import StateCompacted
from epochal.faults import fault_point
from epochal.incremental.binding import sql_over
from epochal.sql import quote, unquote
from epochal.storage.durability import sync_written
from epochal.storage.schemas import cast_like
from epochal.storage.vnode import vnode_column, vnodes_per_directory, write_laid_out

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from epochal.backfill.work import PhaseRunner, Progress
    from epochal.runtime.facade import EpochRuntime

log = logging.getLogger("epochal.backfill")


def run(runner: PhaseRunner, backfill: Backfill, deadline: float, progress: Progress) -> bool:
    """Write vnode ranges until all are done (True, snapshot published) or time runs out."""
    view, epoch = backfill.view, backfill.snapshot_epoch
    warehouse = runner.runtime.warehouse
    root = warehouse.backfill_root(view, epoch)
    target = f"{root}/snapshot"
    done = runner.controller.backfill_done_ranges(view)
    known = {nonce for _, nonce in done}
    # SOURCE inputs first: their history is read split by split from the connector.
    from_splits = source_splits.split_sources(runner, backfill, vnodes_started=bool(done))
    if from_splits and not source_splits.read_splits(runner, backfill, root, deadline, progress):
        return False
    # What a runner that died left: files of ranges never recorded, and its staging.
    _clean_unrecorded(runner, target, known)
    warehouse.delete([f"{root}/staging"])
    # One stored input: its ranges are the snapshots' own vnodes, so a range opens only its
    # directories. (Ranges a runner recorded under the type-independent hash stay with it: "r".)
    storage = (
        len(runner.runtime.pipeline.views[view].upstreams) == 1
        and not from_splits
        and not any(n.startswith("r") for n in known)
    )
    chunking = chunk_keys(runner.runtime, view, storage)
    # The SOURCE inputs' rows as read from their splits, once for every range.
    read_rows = {u: source_splits.source_rows(runner, view, u) for u in from_splits}
    input_rows = _input_rows(runner, backfill, read_rows)
    width = _range_width(runner, backfill, input_rows) if chunking is not None else VNODES_TOTAL
    timed: list[tuple[int, float]] = []  # (width, seconds) of this run's ranges: what sizes the next
    while True:
        ranges = [r for r, _ in done]
        vnodes = next_range(ranges, width if chunking is not None else VNODES_TOTAL)
        if vnodes is None:
            break
        if runner.must_stop(view, deadline, progress, "the next run resumes at the next vnode range", live_first=True):
            return False
        started = time.time()
        # Vnodes per snapshot directory, from the view's rows: at most its inputs' at first, then
        # as many as the ranges so far wrote per row read (an aggregate's far fewer). Ranges that
        # chose differently only make directories that overlap, which readers take.
        share = progress.rows_written / progress.rows_read if progress.rows_read else None
        if share is None and aggregates(runner, view):
            per_directory = None  # far fewer, and how many is counted before the write
        else:
            per_directory = vnodes_per_directory(
                int(input_rows * min(1.0, share or 1.0)), runner.runtime.settings.snapshot_directory_rows
            )
        nonce = f"{'v' if storage else 'r'}{vnodes.lo:03d}-{uuid.uuid4().hex[:8]}-"
        rows_read, rows_written = _write_range(
            runner, backfill, vnodes, chunking, storage, root, target, nonce, read_rows, per_directory
        )
        fault_point("backfill-range-moved")
        runner.controller.record_backfill_chunk(view, vnodes, nonce, rows_read, rows_written)
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
        if not runner.throttle(view, rows_read, time.time() - started, deadline):
            progress.note = "paused (backfill_rate_limit = 0)"
            return False
        if chunking is not None and runner.rate_limit(view) is None:
            # (a rate limit sizes ranges by rows: progress about every 10 s at that rate)
            timed.append((vnodes.size, elapsed))
            width = grown_width(timed, VNODES_TOTAL - done_vnodes)
    # Only recorded ranges are published, moved into a directory no range writer knows. A runner
    # taken over mid-range (it passed its claim check, then stalled) may still move a range into
    # ``target`` at any moment, but never into ``published``: readers list that directory. A
    # publication cut short is finished by the next runner (what was moved is no longer in target).
    published = f"{root}/published"
    moved = warehouse.move_prefixed(target, published, {nonce for _, nonce in done})
    if not warehouse.exists(published):  # a view with no rows at all
        warehouse.make_dir(published)
    files = warehouse.snapshot_files(published)
    rows = warehouse.files_row_count(files)
    key = runner.runtime.distribution_key(view)
    # The schema Spark wrote (a partial aggregate's hidden columns included), from one footer.
    written = warehouse.written_schema([files[0].rsplit("/", 1)[0]]) if files else None
    schema = written or runner.runtime.query_schema(view)
    sync_written(warehouse, [published])  # on the disk (moves included) before it is published
    runner.controller.finish_backfill_snapshot(view, published, key, schema.json(), rows, len(files))
    # (what is left in target is a taken-over runner's unrecorded range)
    warehouse.delete([f"{root}/staging", target])
    if from_splits:  # the view's snapshot is published: the sources' rows read for it are done with
        warehouse.delete([f"{root}/splits"])
    log.info(
        "backfill %s: snapshot at epoch %s written, %d rows in %d files (%d moved in now)",
        view, epoch, rows, len(files), moved,
    )
    return True


def _input_rows(runner: PhaseRunner, backfill: Backfill, read_rows: dict[str, tuple[DataFrame, int]]) -> int:
    """The rows the view's inputs hold at the snapshot epoch, from file footers."""
    inputs = runner.runtime.pipeline.views[backfill.view].upstreams
    epoch = backfill.snapshot_epoch
    return sum(read_rows[u][1] if u in read_rows else _stored_rows(runner, u, epoch) for u in inputs)


def _range_width(runner: PhaseRunner, backfill: Backfill, total: int) -> int:
    """Vnodes per range, for ranges of about EPOCHAL_BACKFILL_RANGE_ROWS of the inputs' ``total``
    rows (fewer under a rate limit: progress about every 10 s)."""
    wanted = runner.runtime.settings.backfill_range_rows
    rate = runner.rate_limit(backfill.view)
    if rate:
        wanted = min(wanted, max(1000, int(rate * 10)))
    per_vnode = max(1.0, total / VNODES_TOTAL)
    # (even ranges: 5 ranges of 51 vnodes would leave a sixth of one vnode, a job for nothing)
    return evened(max(1, min(VNODES_TOTAL, int(wanted / per_vnode))), VNODES_TOTAL)


def _stored_rows(runner: PhaseRunner, table: str, epoch: int) -> int:
    """The rows ``table``'s state at ``epoch`` is stored in, from the meta store and file footers:
    no Spark job (reading the state to count it would scan, or cache, the whole table)."""
    try:
        parts = runner.controller.state_parts(table, epoch, inclusive=True)
    except StateCompacted:
        history = runner.runtime.reader.history
        records = history.records(table, epoch, True) if history and history.covers(table) else None
        if records is None:
            raise
        return records  # a SOURCE that stores nothing: its records at the epoch, from the meta store
    rows = parts.snapshot.rows if parts.snapshot is not None else 0
    return rows + sum(runner.runtime.warehouse.row_count(location) for _, location in parts.changes)


def _clean_unrecorded(runner: PhaseRunner, target: str, known: set[str]) -> None:
    for path in runner.runtime.warehouse.keep_prefixed(target, known):
        log.info("backfill: deleted %s, written for a vnode range never recorded", path)


def _write_range(
    runner: PhaseRunner,
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

    runtime = runner.runtime
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
    rows = rows_over(runner, backfill.view, states)
    key = runtime.distribution_key(backfill.view)
    staging = f"{root}/staging/{nonce.rstrip('-')}"
    if per_directory is None:
        # Counted from the cached rows, which the write then reads: a guess from the input rows
        # would give an aggregate of 100,000 groups over 10M rows 128 files, 2 s more.
        from pyspark import StorageLevel

        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counted = rows.count()
            per_directory = vnodes_per_directory(
                counted * VNODES_TOTAL // vnodes.size, runtime.settings.snapshot_directory_rows
            )
            write_laid_out(rows, key, per_directory, staging, mode="overwrite")
        finally:
            rows.unpersist()
    else:
        write_laid_out(rows, key, per_directory, staging, mode="overwrite")
    written = runtime.warehouse.files_row_count(runtime.warehouse.snapshot_files(staging))
    try:
        # A runner that stalled past its claim (a suspended laptop, a long pause) may have been
        # taken over, and the new runner may have published the snapshot since: its range must not
        # land in it (a reader lists the directory; the range would count twice).
        runner.controller.check_backfill_owner(backfill.view)
    except BackfillLost:
        runtime.warehouse.delete([staging])
        raise
    runtime.warehouse.adopt_vnode_files(staging, target, nonce)
    runtime.warehouse.delete([staging])
    # Rows read: the range's share of the inputs (the read itself lists every file's rows).
    share = total * vnodes.size // VNODES_TOTAL if chunking is not None else total
    return share, written


def aggregates(runner: PhaseRunner, name: str) -> bool:
    """Whether ``name`` is a grouped aggregate kept as partial state: its rows are its groups,
    usually far fewer than its input's."""
    from epochal.incremental.plan import PARTIAL_RULE

    plan = runner.runtime.pipeline.views[name].plan
    return plan is not None and plan.kind == "keyed" and plan.rule == PARTIAL_RULE


def rows_over(runner: PhaseRunner, name: str, states: dict[str, DataFrame]) -> DataFrame:
    """The view's stored rows over inputs ``states`` taken as inserts into empty tables."""

    from epochal.incremental.partial import partial_inserts

    runtime = runner.runtime
    spark = runtime.spark
    view = runtime.pipeline.views[name]
    if view.refresh == "full" or view.plan is None:
        rows = sql_over(spark, view.query, states).toDF(*view.columns)
        return cast_like(rows, runtime.query_schema(name))
    plan = view.plan
    if aggregates(runner, name):
        # The table stores partial state (hidden MIN/MAX values): every input row is an insert
        # into an empty group, so the epoch's merge reduces to one aggregation.
        append_only = all(runtime.pipeline.append_only(u) for u in view.upstreams)
        return partial_inserts(spark, plan, view.columns, states, runtime.query_schema(name), append_only)
    if plan.kind == "keyed":
        # The view at every key of the range: its query over the leaves' rows (what an epoch
        # computes at the keys it touches, without the restriction: the range is the restriction).
        leaves = {leaf.name: sql_over(spark, leaf.sql, states) for leaf in plan.leaves}
        return sql_over(spark, plan.query, leaves).toDF(*view.columns)
    rows = sql_over(spark, plan.query or view.query, states).toDF(*view.columns)
    if plan.typed_like_query:
        rows = cast_like(rows, runtime.query_schema(name))
    return rows


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


__all__ = ["aggregates", "chunk_columns", "chunk_keys", "rows_over", "run"]
