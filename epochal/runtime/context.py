"""What a step of an epoch may ask for: ``StepContext``.

Every step (source, view, rebuild, sink, commit, compaction) depends on this protocol, never on
``EpochRuntime``, which implements it: a step begins (its epoch claimed, its inputs' collected
changes read), reads its inputs (state at an epoch, schemas, a source's connector), collects its
output (the epoch commits when every table has) and returns a ``StepReport``. What it asks of the
checkpoint it asks through the controller's named methods. Like RisingWave's barrier worker
context (``src/meta/src/barrier/context``): one narrow interface to the rest of the system.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from epochal.checkpoint.controller import CheckpointController
    from epochal.checkpoint.records import Collected, StepStart
    from epochal.connectors.base import SourceConnector
    from epochal.pipeline.model import Pipeline, ViewDef
    from epochal.settings import Settings
    from epochal.storage.state_reader import StateReader
    from epochal.storage.warehouse import Warehouse


class StepContext(Protocol):
    settings: Settings
    #: the pipeline as this process read it; a view being rebuilt adds its new statement's shadow
    pipeline: Pipeline
    warehouse: Warehouse
    reader: StateReader
    controller: CheckpointController
    #: old statements maintained while their views rebuild, by name (their stages read like tables)
    old_versions: dict[str, ViewDef]

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session, started (or attached) on first use."""
        ...

    # ------------------------------------------------------------------ begin

    def begin_step(self, epoch: int, run_id: str | None, **which: str) -> StepStart:
        """Claim ``epoch`` and read what the step needs (``source=`` its offsets, ``table=`` whether
        it wrote before); raises EpochAborted for an aborted epoch, before any work."""
        ...

    # ------------------------------------------------------------------ read inputs

    def read_state(
        self,
        table: str,
        epoch: int,
        inclusive: bool,
        restrict: tuple[tuple[str, ...], DataFrame] | None = None,
        cached: bool = True,
    ) -> tuple[DataFrame, int]:
        """``table``'s rows inside ``epoch`` (with its change when ``inclusive``), optionally only at
        the keys ``restrict`` names, and how many stored rows were read."""
        ...

    def query_schema(self, table: str) -> StructType:
        """``table``'s columns and types as its query (or DDL) gives them."""
        ...

    def view_schema(self, view: ViewDef) -> StructType:
        """The columns and types of ``view``'s statement, which may be an old one being maintained."""
        ...

    def connector(self, source: str) -> SourceConnector:
        """``source``'s connector, built once per runtime."""
        ...

    def distribution_key(self, table: str) -> tuple[str, ...]:
        """The columns whose hash places ``table``'s rows in snapshot vnodes."""
        ...

    # ------------------------------------------------------------------ collect

    def collect(self, epoch: int, collected: Collected, garbage: list[str], release: bool) -> bool:
        """Record the step's output for ``epoch`` (the last table to collect commits it); ``garbage``
        is deleted when another run collected first. Returns whether this call recorded it."""
        ...

    def record_idle(
        self, epoch: int, name: str, started: float, run_id: str | None, release: bool, dead_letters: int | None
    ) -> tuple[Collected, bool]:
        """Collect an empty change without a file (what readers take as no change)."""
        ...

    @property
    def backfill_root(self) -> str | None:
        """Set while this thread writes a committed epoch for a backfill: where its change goes."""
        ...

    def recording_for_backfill(self, root: str, record: Callable[[Collected], None]) -> AbstractContextManager[None]:
        """Within the block, a view step writes under ``root`` and hands what it collected to
        ``record`` instead of the epoch's collect."""
        ...
