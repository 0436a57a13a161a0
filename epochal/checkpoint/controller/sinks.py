"""The controller's sink methods (``SinkCoordinator``): where a sink starts, what it delivered, its
lag, and delivery through the coordinator's two-phase commit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from epochal.checkpoint.sinks.batches import DeliveryReport, SinkBatch, SinkStart
    from epochal.checkpoint.sinks.coordinator import SinkCoordinator
    from epochal.sinks.base import BatchId, SinkTarget, WriterResult

#: what a delivered epoch hands the writers (its change files' location, or a state read)
T = TypeVar("T")


class SinkMethods:
    sink_coordinator: SinkCoordinator

    def sink_start(
        self,
        sink: str,
        snapshot: bool,
        join_epoch: int,
        declaration: str | None = None,
        loaded_at: float | None = None,
        recipe: str | None = None,
    ) -> SinkStart:
        """Where ``sink`` starts, decided at its first delivery step and kept: from the first epoch,
        after the table's history, or with a snapshot of it. ``recipe``: how to reach the target
        should the sink leave the pipeline with batches not finished (``SinkRecipe`` JSON)."""
        return self.sink_coordinator.start(sink, snapshot, join_epoch, declaration, loaded_at, recipe)

    def finish_removed_sink(self, target: SinkTarget) -> DeliveryReport | None:
        """Finish the batches of a sink that left the pipeline; None while another run delivers it."""
        return self.sink_coordinator.finish(target)

    def move_sink_snapshot(self, sink: str, stale: int, epoch: int) -> SinkStart:
        """Move a snapshot start whose state retention released to ``epoch``, while the target holds
        no snapshot batch yet."""
        return self.sink_coordinator.move_snapshot(sink, stale, epoch)

    def delivered_epoch(self, sink: str) -> int | None:
        """The newest epoch ``sink`` has delivered, or None."""
        return self.sink_coordinator.delivered_epoch(sink)

    def sink_lag(self, sink: str) -> dict[str, Any]:
        """``sink``'s delivered epoch and its lag behind the committed epoch, in epochs and seconds."""
        return self.sink_coordinator.lag_of(sink)

    def sink_batches(self, sink: str) -> list[SinkBatch]:
        """Every batch record of ``sink``, oldest first."""
        return self.sink_coordinator.batches(sink)

    def deliver_sink(
        self,
        target: SinkTarget,
        epochs: Sequence[tuple[int, T]],
        interval: int,
        write: Callable[[BatchId, list[T]], list[WriterResult]],
        snapshot: tuple[int, T] | None = None,
        after: int | None = None,
        held: frozenset[int] = frozenset(),
    ) -> DeliveryReport:
        """Deliver committed ``epochs`` ((epoch, payload), in order) exactly once, in batches of
        ``interval`` epochs, each pre-committed by ``write`` and committed by two-phase commit; no
        batch ends at an epoch of ``held`` (one a check failed: the target never shows it)."""
        return self.sink_coordinator.deliver(target, epochs, interval, write, snapshot, after, held)
