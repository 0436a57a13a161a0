"""What a sink connector implements to deliver exactly once through the sink coordinator
(:mod:`epochal.checkpoint.sinks.coordinator`), and the types both sides exchange.

A delivery is a *batch*: the change of ``commit_checkpoint_interval`` consecutive committed epochs
of the sink's upstream table. It goes in two phases, as in the seed's sink coordinator:

1. **Pre-commit, on the executors.** The batch's rows are spread over ``writers`` Spark tasks by
   vnode (the hash of the sink's key, or of the whole row for append-only sinks); each task builds
   the target from its pickled :class:`SinkTarget` and calls :meth:`SinkTarget.write`, which writes
   its rows *without making them visible* (a PostgreSQL prepared transaction, Parquet files no table
   version lists yet) and returns small JSON-able metadata. No sink row passes through the driver.
2. **Commit, on the driver.** The coordinator checks that the writers cover every vnode exactly
   once, persists the batch as PENDING with their metadata, waits for nothing more (sinks only see
   committed epochs), and calls :meth:`SinkTarget.commit`, which must be idempotent: a crash may
   make the coordinator call it again for a batch the target already holds.

A target never writes the meta store; the coordinator never talks to the target except through
these methods.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.errors import EpochalError
from epochal.storage.vnode import VNODE_COUNT

if TYPE_CHECKING:
    import pyarrow as pa

#: The net multiplicity of a row in a batch: +n inserts n copies, -n deletes n copies (upsert:
#: deletes the key's row). Rows with a net weight of 0 never reach a writer.
WEIGHT = "_weight"


class SinkError(EpochalError):
    """A delivery failed as a whole; the message names the sink, the epochs and the cause."""


class SinkSchemaError(SinkError):
    """The target table exists with columns the sink cannot write without a cast."""


class SinkConfigError(SinkError):
    """The target refuses the sink's settings (a wrong password, prepared transactions off)."""


class SinkDataError(SinkError):
    """The target refuses the batch's rows themselves (a value it cannot store, a constraint they
    break): the same rows fail the same way however often they are sent, so it is not retried."""


def null_key_refused(what: str, keys: Sequence[str], table: str, count: int | None = None) -> SinkDataError:
    """An upsert sink given rows with a NULL in its key, which the target's PRIMARY KEY cannot hold
    (a view grouped by a nullable column has a NULL group): the same rows fail the same way every
    time. ``what`` names the batch or writer (``BatchId.describe``)."""
    rows = "some row(s)" if count is None else f"{count} row(s)"
    return SinkDataError(
        f"{what}: {rows} have a NULL in the key ({', '.join(keys)}), which table {table}'s PRIMARY KEY cannot "
        "hold. Nothing of the batch was committed: drop those rows in the view (WHERE ... IS NOT NULL) or "
        "coalesce the key, then give the sink a new name, which starts from the view's rows (the epochs "
        "committed before keep theirs)"
    )


def deletes_refused(what: str, negative: int | None = None) -> SinkDataError:
    """An append-only sink given a change that deletes or updates rows (``negative`` of them, when
    counted): the same batch fails the same way however often it is sent, so it is a data error,
    not retried (it was, for ``EPOCHAL_SINK_RETRY_S``, before the run failed). ``what`` names the
    batch or writer (``BatchId.describe``)."""
    rows = "a row" if negative is None else f"{negative} row(s)"
    return SinkDataError(
        f"{what}: the sink is append-only but its upstream deleted or updated {rows}: use type = 'upsert' "
        "with a primary_key, or deliver a view that only inserts"
    )


class PrecommitLost(SinkError):
    """Raised by :meth:`SinkTarget.commit` when a PENDING batch's pre-commit is gone (a prepared
    transaction rolled back by hand, staged files deleted) and the target does not hold the batch:
    the coordinator aborts the batch and delivers its epochs again."""


#: first_epoch of a sink's *snapshot batch*: the table's state at its last_epoch (the snapshot epoch),
#: delivered as one batch when a sink starts on a table with history (``snapshot = 'true'``). It
#: stands for every epoch up to the snapshot epoch, so it overlaps, and excludes, any batch of those
#: epochs. No real epoch is 0 (epochs count milliseconds since 2021, shifted).
SNAPSHOT_FIRST_EPOCH = 0


@dataclass(frozen=True, order=True)
class BatchId:
    """One delivery attempt of epochs ``first_epoch..last_epoch`` (inclusive) of a sink. A failed
    attempt is aborted and the next one has ``attempt + 1``; at most one attempt of a range is ever
    PENDING or COMMITTED."""

    sink: str
    first_epoch: int
    last_epoch: int
    attempt: int = 1
    #: random, per delivering run: two runs racing to deliver the same epochs pick the same attempt
    #: number, and each must be able to throw away its own pre-commit without touching the other's
    nonce: str = ""

    @property
    def token(self) -> str:
        """A short name for file names and transaction ids, unique per sink and run: an abort that
        matches artifacts by this token only ever touches its own run's."""
        base = f"{self.first_epoch}-{self.last_epoch}-{self.attempt}"
        return f"{base}-{self.nonce}" if self.nonce else base

    @property
    def snapshot(self) -> bool:
        return self.first_epoch == SNAPSHOT_FIRST_EPOCH

    def describe(self) -> str:
        if self.snapshot:
            return f"sink {self.sink}, snapshot at epoch {self.last_epoch}"
        if self.first_epoch == self.last_epoch:
            return f"sink {self.sink}, epoch {self.first_epoch}"
        return f"sink {self.sink}, epochs {self.first_epoch}..{self.last_epoch}"


@dataclass(frozen=True)
class WriterTask:
    """What one Spark task writes: the rows of ``vnodes`` (``first..last`` inclusive) of a batch."""

    batch: BatchId
    writer: int
    writers: int
    vnodes: tuple[int, int]


@dataclass(frozen=True)
class WriterResult:
    """A writer's pre-commit: its vnode range and the target's metadata (JSON-able)."""

    writer: int
    vnodes: tuple[int, int]
    rows: int
    metadata: Mapping[str, Any]


class CountedBatches:
    """A writer's Arrow batches as the target reads them: empty ones skipped, the rows handed out
    counted (the writer's row count in its result)."""

    def __init__(self, batches: Iterable[pa.RecordBatch]):
        self._batches = batches
        self.rows = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for record_batch in self._batches:
            if record_batch.num_rows:
                self.rows += record_batch.num_rows
                yield record_batch


def vnode_ranges(writers: int) -> list[tuple[int, int]]:
    """Split the vnodes into ``writers`` contiguous, inclusive ranges of near-equal size."""
    if not 1 <= writers <= VNODE_COUNT:
        raise SinkError(f"a sink has 1..{VNODE_COUNT} writers, not {writers}")
    bounds = [VNODE_COUNT * i // writers for i in range(writers + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(writers)]


def coverage_problems(results: Sequence[WriterResult]) -> list[str]:
    """Why ``results`` do not cover every vnode exactly once (empty when they do)."""
    seen = [0] * VNODE_COUNT
    problems: list[str] = []
    for result in results:
        first, last = result.vnodes
        if not 0 <= first <= last < VNODE_COUNT:
            problems.append(f"writer {result.writer} reports an invalid vnode range {first}..{last}")
            continue
        for vnode in range(first, last + 1):
            seen[vnode] += 1
    missing = [v for v, n in enumerate(seen) if n == 0]
    twice = [v for v, n in enumerate(seen) if n > 1]
    if missing:
        problems.append(f"{len(missing)} vnode(s) have no writer (first: {missing[0]})")
    if twice:
        problems.append(f"{len(twice)} vnode(s) were written by more than one writer (first: {twice[0]})")
    return problems


class SinkTarget(abc.ABC):
    """A sink's target system. Built on the driver from the sink's options; pickled to the executors
    for :meth:`write`. Keep it small and picklable: options and names, no open connections."""

    #: the sink's name, as in CREATE SINK
    name: str
    #: columns of the upstream table, in order; what the target table has
    columns: list[str]
    #: 'append-only' or 'upsert'
    type: str
    #: the key columns of an upsert sink (empty for append-only); rows are spread by their hash
    primary_key: tuple[str, ...]

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the sink writes, for status and logs: never a password."""

    def local_paths(self) -> list[tuple[str, Path]]:
        """What the target writes on this machine's disk, each with the option that names it (checked
        before a delivery: :mod:`epochal.sinks.writable`); none for a remote target."""
        return []

    @abc.abstractmethod
    def prepare_target(self, schema: pa.Schema) -> None:
        """Driver, before a batch's writers run: create the target table when it is missing, or
        raise :class:`SinkSchemaError` when it exists with an incompatible schema (never cast
        silently). ``schema`` is the upstream table's (without the weight)."""

    @abc.abstractmethod
    def write(self, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> Mapping[str, Any]:
        """Executor: write the task's rows so that they are durable but not visible, and return the
        metadata :meth:`commit` needs. ``batches`` hold the upstream columns and :data:`WEIGHT`
        (never 0; the coordinator nets a batch's epochs first). Append-only: a weight of n > 0 is n
        copies of the row. Upsert: a negative weight deletes the key's row, a positive one writes
        the row for the key (deletes of a key come before its insert). Called once per writer even
        when it has no rows, so that a target with per-writer artifacts (a prepared transaction)
        covers its vnodes. Must be safe to run twice for one task (Spark retries tasks): an earlier
        attempt's artifacts are left for :meth:`abort_orphans`."""

    @abc.abstractmethod
    def commit(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """Driver: make a PENDING batch visible, atomically if the target allows it. Idempotent: a
        batch the target already holds is left as it is (the coordinator may call this again after
        a crash)."""

    @abc.abstractmethod
    def abort(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """Driver: throw away what a batch's writers pre-committed (never committed). Idempotent."""

    @abc.abstractmethod
    def abort_orphans(self, keep: Sequence[BatchId]) -> int:
        """Driver, at the coordinator's recovery: throw away every pre-committed artifact of this
        sink that belongs to no batch in ``keep`` (the PENDING ones), such as the prepared
        transactions of a run killed before it persisted PENDING. Returns how many it threw away."""

    def check_rows(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """Driver, after the writers and before the batch is PENDING: raise :class:`SinkDataError`
        when pre-committed rows break a rule the target would enforce at :meth:`commit` (a CHECK
        constraint, NOT NULL). A PENDING batch must commit, so a refusal found only then holds the
        sink until the target accepts the rows. The default checks nothing: targets whose writers
        already meet every rule (PostgreSQL's prepared transactions) need not."""
        return None

    def spark_write(self, frame: Any, batch: BatchId, writers: int) -> list[WriterResult] | None:
        """Optional: write the batch with Spark's own writer instead of :meth:`write` in Python tasks,
        for a target whose pre-commit is plain files (no per-writer transaction). ``frame`` holds
        the upstream columns and :data:`WEIGHT` (netted for upsert), partitioned as read. One Spark
        job writes every partition or fails as a whole, so its one result covers every vnode.
        None (the default): the coordinator runs :meth:`write` per writer task."""
        return None

    def delivered_epoch(self) -> int | None:
        """The last epoch the target itself records as delivered, when it keeps such a record
        (Delta's application transaction, a progress row); None when it keeps none. Used to check
        the meta store against the target, never instead of it."""
        return None

    def row_count(self) -> int | None:
        """Rows in the target table (for metadata), or None when counting is expensive."""
        return None
