"""A source's step of an epoch: its planned offsets read through its connector, its change (inserts,
or upserts and deletes resolved against the source's rows before the epoch) and its dead letters
written, then collected."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from epochal.checkpoint.records import Collected, EpochAborted
from epochal.checkpoint.statements import sources as source_declarations
from epochal.checkpoint.statements.sources import Declaration
from epochal.connectors.base import SourceBatch, SplitRange, any_rejected, marked_rows, observed_rows
from epochal.connectors.registry import connector_spec
from epochal.epoch import epoch_age_s, shown_epoch
from epochal.faults import fault_point
from epochal.runtime.cdc_status import cdc_positions
from epochal.runtime.report import StepReport, retired_report
from epochal.storage.parts import StateCompacted
from epochal.storage.state_reader import quoted
from epochal.storage.warehouse import WEIGHT, dead_letter_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from epochal.driver.sources import DriverSources
    from epochal.pipeline.model import SourceDef
    from epochal.runtime.context import StepContext

log = logging.getLogger("epochal.runtime")


def source_declaration(source: SourceDef) -> str:
    """What ``source``'s stored rows depend on (``source_declarations.Declaration``), as JSON."""
    spec = connector_spec(source.connector)
    if spec is None:
        return Declaration.of(source).to_json()
    return Declaration.of(source, spec.identity_options, spec.fields_by_spelling).to_json()


class SourceSteps:
    def __init__(self, ctx: StepContext, driver: DriverSources):
        self.ctx = ctx
        #: computes a small epoch's change on the driver (epochal/driver/sources.py)
        self.driver = driver

    def _lag(self, epoch: int, name: str, ranges: list[SplitRange]) -> dict[str, int | float]:
        """How far the source is behind its splits' ends once this epoch is read: ``lag_records``,
        the records past the epoch's offsets summed over the splits (a split that appeared since
        counts whole), and ``lag_seconds``, 0 when there are none, else the age of the epoch's
        barrier: how far the source's data trails the clock while records wait. A connector that
        cannot tell its splits' ends (a generator such as Nexmark) reports neither."""
        connector = self.ctx.connector(name)
        # a CDC source: its slot's and the server's LSNs, the WAL retained (epochal/runtime/cdc_status.py)
        upstream = cdc_positions(connector, self.ctx.controller.committed_epoch)
        if upstream is not None:
            return upstream
        split_ends = getattr(connector, "split_ends", None)
        if split_ends is None:
            return {}
        ends = {r.split: r.end for r in ranges}
        behind = sum(max(0, end - ends.get(split, 0)) for split, end in split_ends().items())
        return {"lag_records": behind, "lag_seconds": epoch_age_s(epoch, time.time()) if behind else 0.0}

    def run(self, epoch: int, name: str, run_id: str | None, release: bool) -> StepReport:
        started = time.time()
        facts = self.ctx.controller.source_step_facts(name)
        if facts.retired:
            return retired_report(epoch, name)
        # Records decoded by a declaration other than the stored rows' would not fit them.
        declaration = source_declaration(self.ctx.pipeline.sources[name])
        source_declarations.check_step(facts.declaration, name, declaration, self.ctx.pipeline.loaded_at)
        if self.ctx.pipeline.sources[name].primary_key:
            # Upserts resolve against the source's rows before this epoch: its earlier epochs first.
            self.ctx.controller.wait_for_order(epoch, [name], f"source {name}")
        ranges = self.ctx.begin_step(epoch, run_id, source=name).offsets
        if not any(r.count > 0 for r in ranges):
            return self._idle_source(epoch, name, ranges, started, run_id, release)
        connector = self.ctx.connector(name)
        warehouse = self.ctx.warehouse
        driven = self.driver.change(epoch, self.ctx.pipeline.sources[name], connector, ranges)
        if driven is not None:  # every record parsed: no dead letter (epochal/driver/sources.py)
            from epochal.driver.tables import write_change

            schema = self.ctx.query_schema(name)
            return self._publish(
                epoch,
                name,
                ranges,
                lambda at: write_change(warehouse, driven, schema, at),
                None,
                started,
                run_id,
                release,
                "driver (DuckDB)",
            )
        declined = self.driver.declined_because(f"source {name}", epoch)
        batch = connector.read(self.ctx.spark, ranges)
        report = self._run_on_spark(epoch, name, ranges, batch, started, run_id, release)
        if declined:  # why the driver path (epochal/driver/) left the step to Spark
            report.metadata["driver_declined"] = declined
        return report

    def _run_on_spark(
        self,
        epoch: int,
        name: str,
        ranges: list[SplitRange],
        batch: SourceBatch,
        started: float,
        run_id: str | None,
        release: bool,
    ) -> StepReport:
        warehouse = self.ctx.warehouse
        lines = batch.records_in(ranges)
        keyed = bool(self.ctx.pipeline.sources[name].primary_key)
        # how many rows the table holds before the epoch, counted up to the epoch's records: it
        # decides how the upserts resolve against them (``_source_change``)
        stored = self._stored_rows(name, epoch, lines) if keyed else None
        if batch.marked is None:
            change = self._source_change(epoch, name, batch.rows, lines, stored)
            return self._publish(
                epoch, name, ranges, lambda at: warehouse.write(change, at), batch, started, run_id, release, "spark"
            )
        marked = None
        if not keyed or stored == 0:
            # The records are the change (or, keyed, an initial load's: no earlier row to join):
            # its write reads every line once and counts the misfits on the way (300,000 lines: its
            # job took 2.1 s with the cache below, 1.5 s without).
            rows, rejected = observed_rows(batch.marked)
        else:
            # Every line is read and parsed once, into Spark's cache, for the change's write, the
            # lookup of the keys it touches and the question whether any line was rejected. Measured
            # against an Observation where the earlier rows are read whole (1M lines over 1M rows,
            # back to back): 8.1 s with the cache, 8.7 s without.
            from pyspark import StorageLevel

            marked = batch.marked.persist(StorageLevel.MEMORY_AND_DISK)
            rows, rejected = marked_rows(marked), lambda: any_rejected(marked)
        try:
            change = self._source_change(epoch, name, rows, lines, stored)
            return self._publish(
                epoch,
                name,
                ranges,
                lambda at: warehouse.write(change, at),
                batch,
                started,
                run_id,
                release,
                "spark",
                rejected=rejected,
            )
        finally:
            if marked is not None:
                marked.unpersist()

    def _publish(
        self,
        epoch: int,
        name: str,
        ranges: list[SplitRange],
        write: Callable[[str], int],
        batch: SourceBatch | None,
        started: float,
        run_id: str | None,
        release: bool,
        engine: str,
        rejected: Callable[[], bool] | None = None,
    ) -> StepReport:
        """Write the epoch's change (``write`` at a fresh location) and its dead letters, if
        ``batch`` has any (``rejected`` says whether it has, else its rejected lines are asked),
        then collect them."""
        location = self.ctx.warehouse.new_location(name, epoch)
        written: list[str] = [location]
        try:
            rows = write(location)
            dead = 0
            dlq_location = None
            # Almost every epoch has no dead letters: asking first (a job over the epoch's lines that
            # writes nothing) is cheaper than writing an empty Parquet dataset and deleting it again.
            if rejected is None and batch is not None and batch.rejected is not None:
                rejected = lambda: not batch.rejected.isEmpty()  # noqa: E731
            if batch is not None and rejected is not None and rejected():
                dlq_location = self.ctx.warehouse.new_location(dead_letter_table(name), epoch)
                written.append(dlq_location)
                dead = self.ctx.warehouse.write(batch.dead_letters, dlq_location)
                shown = shown_epoch(epoch)
                log.warning("%s epoch %s: %d record(s) went to %s", name, shown, dead, dead_letter_table(name))
            records = batch.records_in(ranges) if batch is not None else sum(r.count for r in ranges)
            collected = Collected(name, location, records, rows, dead, dlq_location, time.time() - started, run_id)
            recorded = self.ctx.collect(epoch, collected, written, release)
        except EpochAborted:
            self.ctx.warehouse.delete(written)
            raise
        fault_point("source-written")
        return self._source_report(epoch, ranges, collected, started, recorded, engine)

    def _idle_source(
        self, epoch: int, name: str, ranges: list[SplitRange], started: float, run_id: str | None, release: bool
    ) -> StepReport:
        """An epoch with no record for the source: its change is empty, recorded without a file and
        without a Spark job (readers take a missing location as no change, ``ViewSteps._upstream_delta``).
        A pipeline whose sources are quiet then pays no Parquet write per source per epoch."""
        empty, recorded = self.ctx.record_idle(epoch, name, started, run_id, release, dead_letters=0)
        fault_point("source-written")
        return self._source_report(epoch, ranges, empty, started, recorded, "none (idle)")

    def _source_report(
        self, epoch: int, ranges: list[SplitRange], collected: Collected, started: float, recorded: bool, engine: str
    ) -> StepReport:
        """A source step's metadata, from what it collected, and the engine that read it."""
        return StepReport(
            collected.asset,
            epoch,
            {
                "epoch": epoch,
                "engine": engine,
                "records_read": collected.rows_in,
                "rows_out": collected.rows_out,
                "dead_letters": collected.dead_letters,
                # where this epoch's dead letters are (None, left out of the metadata, when it has none)
                "dead_letter_location": collected.dead_letter_location,
                "splits": len(ranges),
                "offsets": ", ".join(f"{r.split}:[{r.start},{r.end})" for r in ranges) or "no split yet",
                "seconds": round(time.time() - started, 3),
                "recorded": recorded,
                **self._lag(epoch, collected.asset, ranges),
            },
        )

    def _source_change(
        self, epoch: int, name: str, records: "DataFrame", lines: int, stored: int | None
    ) -> "DataFrame":
        """The epoch's change of a source: its records as inserts, or, for a source with a PRIMARY
        KEY, upserts and deletes resolved against the source's state before this epoch (``lines``:
        how many records there are at most; ``stored``: ``_stored_rows``)."""
        from pyspark.sql import functions as F

        source = self.ctx.pipeline.sources[name]
        if not source.primary_key:
            return records.withColumn(WEIGHT, F.lit(1).cast("bigint"))
        from epochal.storage.upsert import upsert_changes

        columns = list(source.column_names)
        if stored == 0:  # an initial load: no earlier row to resolve against, no join
            return upsert_changes(records, None, source.primary_key, columns)
        restrict = None
        if not _reads_state_whole(stored, lines):
            # Only the previous rows of the keys this epoch touches matter, and the primary key is
            # the source's distribution key: the read opens just those keys' vnodes of the snapshot.
            restrict = (tuple(source.primary_key), records.select(*quoted(source.primary_key)))
        previous, _ = self.ctx.read_state(name, epoch, inclusive=False, restrict=restrict, keys_at_most=lines)
        return upsert_changes(records, previous, source.primary_key, columns)

    def _stored_rows(self, name: str, epoch: int, bound: int) -> int | None:
        """``name``'s stored rows before ``epoch`` (its snapshot's and its change files', counted from
        the catalog and the files' footers, no Spark job), counted until they pass ``bound``; None
        when the state was compacted away (a SOURCE that keeps no rows)."""
        try:
            parts = self.ctx.controller.state_parts(name, epoch, inclusive=False)
        except StateCompacted:
            return None
        stored = 0 if parts.snapshot is None else parts.snapshot.rows
        for _, location in parts.changes:
            if stored > bound:
                break
            stored += self.ctx.warehouse.row_count(location)
        return stored


def _reads_state_whole(stored: int | None, lines: int) -> bool:
    """Whether a keyed epoch of ``lines`` records reads the table's earlier rows whole: when they
    are no more than its records (an initial load, a table's first big epochs), restricting them to
    the epoch's keys (the keys' vnodes collected, the keys broadcast to filter every part) costs
    more than reading them all, and the join matches only the touched keys' rows either way."""
    return stored is not None and stored <= lines
