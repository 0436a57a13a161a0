"""The Python API of reading: SQL over one committed cut (now or in the time-travel window), and
the net change of a table between two retained epochs, for code outside a run (a Dagster asset
downstream, a notebook). Each call opens the pipeline of ``settings`` (default: the environment's
EPOCHAL_* settings, as the `epochal` command does) and reads only committed epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.query.changes import Changes, table_changes
from epochal.query.cut import run_query
from epochal.query.time_travel import AsOf, retained

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings


@dataclass(frozen=True)
class Answer:
    """A query's columns and rows, cut at ``epoch``."""

    columns: list[str]
    rows: list[tuple]
    epoch: int | None

    def records(self) -> list[dict]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def open_runtime(settings: "Settings | None" = None) -> "EpochRuntime":
    """The pipeline of ``settings`` (default: from the environment), for reading; Spark starts only
    if a query names a SOURCE that stores nothing."""
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings
    from epochal.spark.attach import session_for

    settings = settings or Settings.from_env()

    def spark():  # noqa: ANN202
        return session_for(settings, "epochal-query")

    return EpochRuntime(settings, load_pipeline(settings.pipeline_dir), spark)


def query(sql: str, as_of: AsOf | None = None, settings: "Settings | None" = None) -> Answer:
    """Read-only SQL (DuckDB) over every table at one committed epoch: ``as_of`` (an epoch, an ISO
    timestamp or a datetime, inside the time-travel window), the query's ``FOR SYSTEM_TIME AS OF``,
    or the newest."""
    columns, rows, epoch = run_query(open_runtime(settings), sql, as_of)
    return Answer(columns, rows, epoch)


def changes(table: str, start: AsOf, end: AsOf | None = None, settings: "Settings | None" = None) -> Changes:
    """The net change of ``table`` from ``start`` (excluded) to ``end`` (included; default the newest
    committed epoch): ``Changes.rows`` with ``op`` first, ``Changes.end`` to start from next time."""
    return table_changes(open_runtime(settings), table, start, end)


def retained_epochs(settings: "Settings | None" = None) -> tuple[int, int]:
    """(oldest, newest) committed epoch a read can ask for."""
    return retained(open_runtime(settings))
