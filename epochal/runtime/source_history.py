"""A SOURCE's rows at an epoch, read back from its connector at the offsets the epochs fixed.

A SOURCE that no view reads as state stores nothing once its epochs are delivered
(:mod:`epochal.incremental.state_needs`): its change files go after the commit, when no sink and
no backfill still reads them. Its rows at epoch E are then every record its splits took up to E:
from where each split's history starts to the end of E's range, which the meta store keeps
(:func:`epochal.checkpoint.queries.source_history`). Connectors read a range as a pure function of
its offsets, so these are exactly the rows the epochs wrote, as RisingWave's batch read of a source
reads its connector. The state reader comes here only when the files it would read are gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochal.checkpoint.records import StateCompacted
from epochal.storage.schemas import cast_like
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from epochal.connectors.base import SplitRange
    from epochal.runtime.context import StepContext


class SourceHistory:
    def __init__(self, ctx: StepContext):
        self.ctx = ctx

    def covers(self, table: str) -> bool:
        """Whether ``table`` is a SOURCE, whose rows its connector can read again."""
        source = self.ctx.pipeline.sources.get(table)
        return source is not None and source.kind == "source"

    def records(self, table: str, epoch: int, inclusive: bool) -> int | None:
        """How many records ``read`` would read (lines or events, no Spark), or None when the
        epoch's offsets are gone: the rows cannot be read again."""
        ranges = self._ranges(table, epoch, inclusive)
        return None if ranges is None else sum(r.count for r in ranges)

    def change(self, table: str, epoch: int) -> DataFrame:
        """``table``'s change in ``epoch`` once its file is gone (a committed epoch run again):
        the records of the epoch's own ranges, each an insert, as the source step wrote them."""
        from pyspark.sql import functions as F

        ctx = self.ctx
        ranges = ctx.controller.source_offsets(epoch, table)
        rows = self._typed(ctx.connector(table).read(ctx.spark, [r for r in ranges if r.count > 0]).rows, table)
        return rows.withColumn(WEIGHT, F.lit(1).cast("bigint"))

    def _typed(self, rows: DataFrame, table: str) -> DataFrame:
        """``rows`` with the stored rows' columns and types, so a reader cannot tell where they came from."""
        return cast_like(rows, self.ctx.query_schema(table))

    def _ranges(self, table: str, epoch: int, inclusive: bool) -> list[SplitRange] | None:
        return self.ctx.controller.source_history(table, epoch, inclusive)

    def read(self, table: str, epoch: int, inclusive: bool) -> tuple[DataFrame, int]:
        """``table``'s rows inside ``epoch`` (its records included when ``inclusive``), and how
        many records the connector reads for them."""
        ctx = self.ctx
        ranges = self._ranges(table, epoch, inclusive)
        if ranges is None:
            raise StateCompacted(
                f"source {table} stores nothing, and the offsets of epoch {epoch} are no longer in the meta "
                "store (it was pruned or aborted): its rows at that epoch cannot be read again; read a newer epoch"
            )
        wanted = [r for r in ranges if r.count > 0]
        schema = ctx.query_schema(table)
        if not wanted:
            return ctx.spark.createDataFrame([], schema), 0
        rows = self._typed(ctx.connector(table).read(ctx.spark, wanted).rows, table)
        return rows, sum(r.count for r in wanted)
