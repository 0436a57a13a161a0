"""The work of a source backfill, with Spark: a new view's SOURCE inputs read split by split from
their connectors up to the offsets committed at the snapshot epoch (states and rules:
:mod:`epochal.checkpoint.backfills.splits`; meta store: :mod:`epochal.checkpoint.backfills.split_rows`).

Each chunk is one split's records ``[offset, offset + n)``, read through the connector exactly as
an epoch reads its ranges (malformed lines are left out: the live epochs already sent them to the
source's dead letters), written under the backfill's directory, then recorded with the split's new
offset in one transaction. The snapshot phase then computes the view from those rows, range by
range of the key space, as it does from a stored input's snapshot.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from epochal.checkpoint.backfills.log import BackfillLost
from epochal.checkpoint.backfills.splits import next_chunk
from epochal.connectors.base import SourceConnector, SplitRange
from epochal.errors import EpochalError, require
from epochal.faults import fault_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from epochal.backfill.work import PhaseRunner, Progress
    from epochal.checkpoint.backfills.state import Backfill

log = logging.getLogger("epochal.backfill")


def split_sources(runner: PhaseRunner, backfill: Backfill, vnodes_started: bool) -> list[str]:
    """The view's inputs declared CREATE SOURCE, whose history is their connector's (a TABLE's
    is its stored rows): read from their splits unless the backfill decided otherwise earlier."""
    pipeline = runner.runtime.pipeline
    candidates = [u for u in backfill.upstreams if u in pipeline.sources and pipeline.sources[u].kind == "source"]
    if not candidates:
        return []
    return runner.controller.begin_backfill_splits(backfill.view, candidates, vnodes_started)


def read_splits(runner: PhaseRunner, backfill: Backfill, root: str, deadline: float, progress: Progress) -> bool:
    """Read chunks until every split of the view's split sources reached its target (True) or the
    time budget, or a pause, stops it (False; the next run resumes at the recorded offsets)."""
    runtime, view = runner.runtime, backfill.view
    directory = f"{root}/splits"
    # What a runner that died left: chunk directories written but never recorded.
    recorded = set(runner.controller.backfill_split_chunks(view))
    for source_dir in runtime.warehouse.child_dirs(directory):
        for chunk_dir in runtime.warehouse.child_dirs(source_dir):
            if chunk_dir not in recorded:
                runtime.warehouse.delete([chunk_dir])
                log.info("backfill %s: deleted %s, read from a split but never recorded", view, chunk_dir)
    while True:
        states = runner.controller.backfill_split_states(view)
        pending = [s for s in states if not s.done_reading]
        progress.splits_total = len(states)
        progress.splits_done = len(states) - len(pending)
        if not pending:
            return True
        if runner.must_stop(
            view, deadline, progress, "the next run resumes each split at its recorded offset", live_first=True
        ):
            return False
        # The split with the least read first: splits advance together, as RisingWave's readers do.
        state = min(pending, key=lambda s: (s.rows, s.source, s.split))
        chunk = next_chunk(state, chunk_rows(runner, view))
        require(chunk is not None, f"split {state.split} of {state.source}, still backfilling, has records to read")
        started = time.time()
        connector = runtime.connector(state.source)
        check_still_there(connector, state.source, chunk)
        batch = connector.read(runtime.spark, [chunk])
        location = f"{directory}/{state.source}/{chunk.split}-{chunk.start}-{uuid.uuid4().hex[:8]}"
        rows = runtime.warehouse.write(batch.rows, location)
        fault_point("backfill-split-read")
        try:
            moved = runner.controller.record_backfill_split_read(view, state, chunk, rows, location)
        except BackfillLost:  # taken over while it read: the chunk is nobody's
            runtime.warehouse.delete([location])
            raise
        fault_point("backfill-split-recorded")
        progress.rows_read += rows
        elapsed = time.time() - started
        log.info(
            "backfill %s: split %s of %s read [%d, %d) of %d, %d rows in %.1fs (%.0f rows/s)%s",
            view,
            chunk.split,
            state.source,
            chunk.start,
            chunk.end,
            state.target,
            rows,
            elapsed,
            rows / elapsed if elapsed > 0 else 0.0,
            ", caught up" if moved.done_reading else "",
        )
        if not runner.throttle(view, rows, elapsed, deadline):
            progress.note = "paused (backfill_rate_limit = 0)"
            return False


def check_still_there(connector: SourceConnector, source: str, chunk: SplitRange) -> None:
    """Refuse to read a chunk the split no longer holds (a log file truncated or replaced since
    the source read it): reading would silently return fewer records. The connector's own planning
    guard says so: planning from the chunk's end fails when the split holds fewer records."""
    try:
        connector.plan({chunk.split: chunk.end})
    except EpochalError as error:
        raise EpochalError(
            f"source {source} cannot be backfilled from its connector: split {chunk.split} no longer holds "
            f"records [{chunk.start}, {chunk.end}) that its committed epochs read ({error})"
        ) from error


def chunk_rows(runner: PhaseRunner, view: str) -> int:
    """Records per chunk: EPOCHAL_BACKFILL_CHUNK_ROWS, fewer under a rate limit (progress about
    every 10 s)."""
    wanted = runner.runtime.settings.backfill_chunk_rows
    rate = runner.rate_limit(view)
    if rate:
        wanted = min(wanted, max(1000, int(rate * 10)))
    return wanted


def source_rows(runner: PhaseRunner, view: str, source: str) -> tuple[DataFrame, int]:
    """``source``'s rows at the snapshot epoch as the backfill read them from its splits, and how
    many there are (from the files' footers)."""
    runtime = runner.runtime
    locations = runner.controller.backfill_split_chunks(view, source)
    rows = sum(runtime.warehouse.row_count(location) for location in locations)
    if rows == 0:  # (a chunk of blank or malformed lines only may have written no file to take a schema from)
        return runtime.spark.createDataFrame([], runtime.query_schema(source)), 0
    return runtime.warehouse.read_counted(runtime.spark, locations)
