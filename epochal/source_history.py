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

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import StateCompacted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from epochal.runtime import EpochRuntime


class SourceHistory:
    def __init__(self, runtime: EpochRuntime):
        self.runtime = runtime

    def covers(self, table: str) -> bool:
        """Whether ``table`` is a SOURCE, whose rows its connector can read again."""
        source = self.runtime.pipeline.sources.get(table)
        return source is not None and source.kind == "source"

    def read(self, table: str, epoch: int, inclusive: bool) -> tuple[DataFrame, int]:
        """``table``'s rows inside ``epoch`` (its records included when ``inclusive``), and how
        many records the connector reads for them."""
        from pyspark.sql import functions as F

        runtime = self.runtime
        ranges = runtime.controller.backend.transaction(lambda cur: q.source_history(cur, table, epoch, inclusive))
        if ranges is None:
            raise StateCompacted(
                f"source {table} stores nothing, and the offsets of epoch {epoch} are no longer in the meta "
                "store (it was pruned or aborted): its rows at that epoch cannot be read again; read a newer epoch"
            )
        wanted = [r for r in ranges if r.count > 0]
        schema = runtime.query_schema(table)
        if not wanted:
            return runtime.spark.createDataFrame([], schema), 0
        rows = runtime.connector(table).read(runtime.spark, wanted).rows
        # typed as the stored rows are, so a reader cannot tell where they came from
        typed = rows.select(*(F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in schema.fields))
        return typed, sum(r.count for r in wanted)
