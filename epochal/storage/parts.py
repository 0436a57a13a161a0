"""What a table's state is made of at an epoch (a snapshot and the change files after it), and the
catalog the storage layer asks for it: the checkpoint controller, which keeps these records in the
meta store (``epochal.checkpoint.catalog``) and implements ``StateCatalog``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.lease import Lease
    from epochal.settings import Settings


class StateCompacted(EpochalError):
    """The change files a read needs were compacted into a snapshot and deleted."""


@dataclass(frozen=True)
class Snapshot:
    """A READY snapshot: ``table``'s net rows over every committed epoch <= ``epoch``."""

    table: str
    epoch: int
    location: str
    #: the columns its vnodes hash; () = all columns (see epochal/storage/vnode.py)
    distribution_key: tuple[str, ...]
    #: Spark's JSON of the rows' schema, so an empty snapshot (no files) still reads with its columns
    spark_schema: str
    rows: int
    files: int


@dataclass(frozen=True)
class StateParts:
    """What a table's state at an epoch is made of: a snapshot (or none) plus the changes after it."""

    snapshot: Snapshot | None
    changes: list[tuple[int, str]]


@dataclass(frozen=True)
class PublishResult:
    #: False when a snapshot at this or a later epoch was published first: the caller's files are garbage
    recorded: bool
    #: locations retention released (old snapshots, change files every new reader is past), recorded
    #: in ``retired_files`` by the publishing transaction: deleted later, once no reader can hold them
    retired: list[str] = field(default_factory=list)
    changes_dropped_upto: int | None = None


class StateCatalog(Protocol):
    """What the storage layer asks of the catalog: a table's state parts to read, and the snapshot
    life cycle compaction drives (announce, lease, publish or abandon, retire)."""

    settings: Settings

    def state_parts(self, table: str, epoch: int, inclusive: bool) -> StateParts: ...

    def committed_epoch(self) -> int | None: ...

    def change_epochs_since_snapshot(self, table: str) -> tuple[int | None, int, int | None]: ...

    def begin_snapshot(
        self,
        table: str,
        epoch: int,
        location: str,
        distribution_key: tuple[str, ...],
        schema: str,
        in_flight: bool = False,
        started_at: float | None = None,
    ) -> None: ...

    def snapshot_lease(self, location: str) -> Lease: ...

    def publish_snapshot(
        self, location: str, rows: int, files: int, sinks: Iterable[str] = (), keep: int = 2
    ) -> PublishResult: ...

    def abandon_snapshot(self, location: str) -> None: ...

    def reap_abandoned_snapshots(self) -> list[str]: ...

    def release_changes(self, table: str, sinks: Iterable[str] = ()) -> list[str]: ...

    def reap_retired(self, grace_s: float, now: float | None = None) -> list[str]: ...
