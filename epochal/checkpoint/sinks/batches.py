"""A sink's batches as the meta store keeps them (``sink_batches`` rows, their states), where a sink
added to a running pipeline starts (``SinkStart``), and what a delivery reports (``DeliveryReport``)."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epochal.sinks.base import BatchId, WriterResult


class SinkBatchState(enum.Enum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


#: The only transitions a batch attempt makes. ``None`` is "no row yet": an attempt is persisted
#: PENDING (writers covered every vnode) or ABORTED (they did not, or the pre-commit failed).
#: PENDING -> ABORTED only when the target no longer holds the pre-commit and never committed it
#: (a prepared transaction rolled back by hand): the epochs are then delivered by a new attempt.
SINK_TRANSITIONS: Mapping[SinkBatchState | None, frozenset[SinkBatchState]] = {
    None: frozenset({SinkBatchState.PENDING, SinkBatchState.ABORTED}),
    SinkBatchState.PENDING: frozenset({SinkBatchState.COMMITTED, SinkBatchState.ABORTED}),
    SinkBatchState.COMMITTED: frozenset(),
    SinkBatchState.ABORTED: frozenset(),
}


@dataclass(frozen=True)
class SinkBatch:
    id: BatchId
    state: SinkBatchState
    results: tuple[WriterResult, ...]
    rows: int
    error: str | None
    cleaned: bool
    updated_at: float

    @property
    def metadata(self) -> list[Mapping[str, Any]]:
        return [r.metadata for r in self.results]


@dataclass(frozen=True)
class SinkStart:
    """Where a sink starts, decided once at its first delivery (``sink_starts``): the table's history
    up to ``history_upto`` (the newest committed epoch before that delivery's epoch) is delivered as
    one snapshot batch (``snapshot``) or never; None: the sink was there from the first epoch."""

    snapshot: bool
    history_upto: int | None

    @property
    def delivers_snapshot(self) -> bool:
        return self.snapshot and self.history_upto is not None

    @property
    def skipped_upto(self) -> int | None:
        """The newest epoch a ``snapshot = 'false'`` start never delivers."""
        return None if self.snapshot else self.history_upto


@dataclass
class DeliveryReport:
    """What one call of :meth:`SinkCoordinator.deliver` did, for logs and Dagster metadata."""

    sink: str
    batches: int = 0
    epochs: int = 0
    rows: int = 0
    #: PENDING batches of earlier runs committed by this one's recovery
    recommitted: int = 0
    #: pre-commits of dead runs thrown away
    orphans_aborted: int = 0
    aborted_attempts: int = 0
    delivered_epoch: int | None = None
    #: committed epochs still waiting (a batch not yet full, or the delivery stopped on an error)
    lag_epochs: int = 0
    #: the epoch of the snapshot batch this call delivered (or re-committed), and its rows
    snapshot_epoch: int | None = None
    snapshot_rows: int = 0
    seconds: float = 0.0
    lost_race: bool = False
    #: another run held the sink's delivery claim for the whole wait: it delivers, this one did not
    busy: bool = False
    errors: list[str] = field(default_factory=list)


def results_json(results: Sequence[WriterResult]) -> str:
    return json.dumps(
        [{"writer": r.writer, "vnodes": list(r.vnodes), "rows": r.rows, "metadata": dict(r.metadata)} for r in results]
    )


def results_from_json(text: str | None) -> tuple[WriterResult, ...]:
    if not text:
        return ()
    return tuple(
        WriterResult(d["writer"], (d["vnodes"][0], d["vnodes"][1]), d["rows"], d["metadata"]) for d in json.loads(text)
    )


BATCH_COLUMNS = (
    "sink, first_epoch, last_epoch, attempt, nonce, state, metadata, rows_written, error, cleaned, updated_at"
)


def batch_from_row(row: Sequence[Any]) -> SinkBatch:
    sink, first, last, attempt, nonce, state, metadata, rows, error, cleaned, updated = row
    return SinkBatch(
        BatchId(sink, first, last, attempt, nonce or ""),
        SinkBatchState(state),
        results_from_json(metadata),
        rows or 0,
        error,
        bool(cleaned),
        updated,
    )
