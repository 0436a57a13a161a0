"""What a source connector must provide.

A connector does two separate things, at two separate times:

* ``plan`` runs when an epoch is *injected* (in the sensor or the controller, no Spark). It fixes
  the offset range every split covers in that epoch. The controller stores the ranges in the meta
  store before anything reads them, so re-running an epoch reads exactly the same records.
* ``read`` runs when the source asset processes the epoch (Spark). It must be a pure function of
  the stored ranges: same ranges, same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from epochal.pipeline.model import Column, SourceDef


@dataclass(frozen=True)
class SplitRange:
    """Offsets ``[start, end)`` of one split that one epoch covers."""

    split: str
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


#: Schema of the dead-letter rows a connector returns (Spark DDL).
DEAD_LETTER_SCHEMA = "split STRING, offset BIGINT, raw STRING, reason STRING"
#: The boolean column of ``SourceBatch.marked``: whether the line is a row (else it was rejected).
FITS = "__epochal_fits"


@dataclass
class SourceBatch:
    #: rows with the source's declared columns, in declared order, with declared types; a source
    #: with a PRIMARY KEY adds ``_op``, ``_split`` and ``_offset`` after them (see epochal/storage/upsert.py)
    rows: "DataFrame"
    #: the lines that could not be read, with whatever columns ``explain`` needs, or None when the
    #: connector cannot produce any. Ask it whether it is empty before asking for ``dead_letters``.
    rejected: "DataFrame | None" = None
    #: turns ``rejected`` into dead letters (DEAD_LETTER_SCHEMA). Called only when some line was
    #: rejected: the log connector's reasons are dozens of expressions, about 0.1-0.2 s of Py4J calls
    #: to build, and almost every epoch has no dead letter.
    explain: "Callable[[DataFrame], DataFrame] | None" = None
    #: every line parsed once: ``rows``' columns and FITS. ``rows`` is its lines where FITS, and
    #: ``rejected`` holds a line iff FITS is false. A reader that asks both (the source step writes
    #: the rows, then asks whether any line was rejected) keeps this in Spark's cache, so the lines
    #: are read and parsed once, not once per question (``marked_rows``).
    marked: "DataFrame | None" = None
    #: how many records the ranges held, for a connector whose offsets do not count records
    #: (postgres-cdc's are LSNs: WAL bytes); None: the ranges' counts are the records
    records: int | None = None

    def records_in(self, ranges: "list[SplitRange]") -> int:
        """The records the batch read from ``ranges`` (at most: rejected ones included)."""
        return self.records if self.records is not None else sum(r.count for r in ranges)

    @property
    def dead_letters(self) -> "DataFrame | None":
        """The rejected lines with the reason each was rejected (DEAD_LETTER_SCHEMA), or None."""
        if self.rejected is None:
            return None
        if self.explain is None:
            raise TypeError("a SourceBatch with rejected lines needs explain to turn them into dead letters")
        return self.explain(self.rejected)


def marked_rows(marked: "DataFrame") -> "DataFrame":
    """The rows of a ``SourceBatch.marked``: its lines that fit, without FITS."""
    from pyspark.sql import functions as F

    return marked.where(F.col(FITS)).drop(FITS)


def observed_rows(marked: "DataFrame") -> "tuple[DataFrame, Callable[[], bool]]":
    """The rows of a ``SourceBatch.marked`` (as ``marked_rows``), and a question, to be asked once
    an action has consumed them, whether any line did not fit: the action counts the misfits as it
    passes (a Spark Observation), so the lines are read and parsed once, with no cache and no
    second job."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation()
    counted = marked.observe(observation, F.sum(F.when(~F.col(FITS), 1).otherwise(0)).alias("misfits"))

    def rejected() -> bool:
        return (observation.get.get("misfits") or 0) > 0

    return marked_rows(counted), rejected


def any_rejected(marked: "DataFrame") -> bool:
    """Whether a ``SourceBatch.marked`` has a line that does not fit (a Spark job)."""
    from pyspark.sql import functions as F

    return not marked.where(~F.col(FITS)).isEmpty()


class SourceConnector(Protocol):
    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        """Ranges for the next epoch given each split's next offset (missing split: start at 0).

        Returns one range per split that currently exists (an empty range is fine)."""

    def read(self, spark: "SparkSession", ranges: list[SplitRange]) -> SourceBatch:
        """The records in ``ranges``, as a lazily evaluated DataFrame (never collected to the driver)."""


@runtime_checkable
class HoldsUpstreamLog(Protocol):
    """A connector over a database's log (postgres-cdc's slot, mysql-cdc's binlog): the upstream
    keeps the log until told that the epochs reading it committed."""

    #: connectors that answer the same value share one held log (a slot): it is released up to the
    #: lowest committed end among them
    wal_holder: tuple[str, ...]

    def wal_end(self, ranges: list[SplitRange]) -> int:
        """Where an epoch of ``ranges`` ends in the log (other splits, such as a snapshot's, aside)."""

    def release_wal(self, committed_end: int) -> None:
        """The epochs before ``committed_end`` are committed for every connector of the holder."""

    def positions(self) -> Mapping[str, object]:
        """Where the log stands upstream, for status and the source step's metadata."""


@runtime_checkable
class ReadsWithSpark(Protocol):
    """A connector that does some work as Spark tasks outside ``read`` (postgres-cdc's snapshot
    chunks are staged in its read, with the session bound here)."""

    def bind_spark(self, spark: Callable[[], SparkSession]) -> None: ...


class ConnectorSpec(Protocol):
    """Static side of a connector: validation at pipeline load, construction at run time."""

    name: str
    #: the options that say which records an offset points to (a log's path, Nexmark's event
    #: stream): changing one under a running source would read other records at the offsets it
    #: committed, so it is refused (``epochal.checkpoint.statements.sources``). The others tune.
    identity_options: tuple[str, ...]
    #: whether a record's field is looked up by the column's spelling in the DDL (``Column.key``:
    #: a log's JSON keys are case-sensitive), so that respelling a column reads another field
    fields_by_spelling: bool

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        """The value identity ``option`` acts with when written as ``value`` (None: not given): its
        default filled in, a number or name in one spelling, a relative path resolved against
        ``home`` (the pipeline's EPOCHAL_HOME) when given. Declarations compare these, so writing
        out a default, '04' for '4', or the absolute path of a relative one is no change; a value
        that does not parse stays as written."""

    def validate(self, columns: "tuple[Column, ...]", options: Mapping[str, str]) -> list[str]:
        """Problems with the declared columns/options, each a full sentence naming the fix.

        Must reject unknown option keys (suggesting the closest known key)."""

    def create(self, source: "SourceDef", home: Path) -> SourceConnector:
        """A connector for ``source``; relative paths in options resolve against ``home``."""
