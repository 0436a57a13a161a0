"""Epochs driven in this process, without Dagster: the runtime's own steps on one warm SparkSession.

Shared by the benchmarks that time epochs or steps in-process (bench_backfill, bench_codegen_cache,
bench_dataframe_debugging, bench_recompute_retraction); ``harness`` is imported first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import harness  # noqa: F401  (this checkout first)


def write_rows(directory: Path, first: int, count: int, groups: int, name: str) -> None:
    """Rows ``first`` .. ``first + count`` of t(id, k, v, note) as one JSON Lines file of a log
    source, deterministic (hashes of the id), hidden until complete."""
    import duckdb

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    duckdb.sql(
        f"""COPY (SELECT i::BIGINT AS id, (hash(i, 7) % {groups})::BIGINT AS k,
                    (hash(i, 8) % 1000000)::BIGINT AS v, 'n' || (i % 997)::VARCHAR AS note
                  FROM range({first}, {first + count}) r(i)) TO '{tmp}' (FORMAT json)"""
    )
    tmp.rename(directory / name)


def runtime_for(home: Path, pipeline: Path, spark: Any, knobs: dict[str, str]) -> Any:
    """An EpochRuntime over ``pipeline`` in ``home`` on ``spark``, with the settings ``knobs``."""
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings

    settings = Settings.from_env(
        {"EPOCHAL_HOME": str(home), "EPOCHAL_PIPELINE": str(pipeline), "EPOCHAL_BACKFILL_RUN_S": "100000", **knobs}
    )
    return EpochRuntime(settings, load_pipeline(pipeline), lambda: spark)


def epoch(runtime: Any, timed: frozenset[str] | None = None) -> float:
    """One epoch through every table; the seconds of its start, sources, commit and the views in
    ``timed`` (None: all). A backfilled view that joined adds a step of its own to each later epoch:
    that is more work, not the backfill slowing the same work, so bench_backfill leaves it out."""
    counted = 0.0
    started = time.perf_counter()
    record, _ = runtime.start_epoch(None, None)
    for source in runtime.pipeline.sources:
        runtime.run_source(record.epoch, source)
    counted += time.perf_counter() - started
    for view in runtime.pipeline.view_order():
        started = time.perf_counter()
        runtime.run_view(record.epoch, view)
        if timed is None or view in timed:
            counted += time.perf_counter() - started
    started = time.perf_counter()
    runtime.commit(record.epoch)
    return counted + time.perf_counter() - started
