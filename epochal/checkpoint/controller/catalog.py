"""The controller's catalog methods (``SnapshotCatalog``): what a table's state is made of at an
epoch, the change files sinks deliver, and the snapshots compaction writes and retires. The
storage layer reads state through these (``epochal.storage.parts.StateCatalog``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.checkpoint.catalog import SnapshotCatalog
    from epochal.checkpoint.records import PublishResult, StateParts
    from epochal.lease import Lease


class CatalogMethods:
    catalog: SnapshotCatalog

    # ------------------------------------------------------------------ reading state

    def state_parts(self, table: str, epoch: int, inclusive: bool) -> StateParts:
        """``table``'s state inside ``epoch`` (with that epoch's change when ``inclusive``): the newest
        snapshot at or before it, plus the change files after it."""
        return self.catalog.state_parts(table, epoch, inclusive)

    def committed_locations(
        self, table: str, upto: int | None = None, after: int | None = None, idle: bool = False
    ) -> list[tuple[int, str | None]]:
        """(epoch, location) of every committed epoch of ``table`` in (``after``, ``upto``]; ``idle``:
        also epochs without a file. Raises StateCompacted when compaction deleted some of them."""
        return self.catalog.committed_locations(table, upto, after, idle)

    def committed_dead_letter_locations(self, source: str, upto: int | None = None) -> list[str]:
        """Where ``source``'s dead letters of committed epochs (up to ``upto``) are, oldest first."""
        return self.catalog.committed_dead_letter_locations(source, upto)

    # ------------------------------------------------------------------ time travel

    def retained_epochs(self, tables: Iterable[str]) -> tuple[int | None, int | None]:
        """(oldest, newest) committed epoch every table in ``tables`` can be read at, inside the
        time-travel window; (None, None) before the first commit."""
        return self.catalog.retained_epochs(tables)

    def committed_at_or_before(self, epoch: int) -> int | None:
        """The newest committed epoch <= ``epoch``, or None."""
        return self.catalog.committed_at_or_before(epoch)

    def is_committed(self, epoch: int) -> bool:
        """Whether ``epoch`` was committed (and its record is still kept)."""
        return self.catalog.is_committed(epoch)

    # ------------------------------------------------------------------ compaction

    def change_epochs_since_snapshot(self, table: str) -> tuple[int | None, int, int | None]:
        """(newest snapshot epoch, committed epochs with change files after it, committed epoch)."""
        return self.catalog.change_epochs_since_snapshot(table)

    def begin_snapshot(
        self,
        table: str,
        epoch: int,
        location: str,
        distribution_key: tuple[str, ...],
        schema: str,
        in_flight: bool = False,
        started_at: float | None = None,
    ) -> None:
        """Announce a snapshot about to be written to ``location``, owned by this process: a sweep
        never takes a directory it was told about."""
        self.catalog.begin_snapshot(table, epoch, location, distribution_key, schema, in_flight, started_at)

    def snapshot_lease(self, location: str) -> Lease:
        """``with controller.snapshot_lease(location):`` renews an announced snapshot's lease while its
        files are written, so a long compaction is not reaped as a dead one."""
        return self.catalog.snapshot_lease(location)

    def publish_snapshot(
        self, location: str, rows: int, files: int, sinks: Iterable[str] = (), keep: int = 2
    ) -> PublishResult:
        """Make a fully written snapshot visible and apply retention, in one transaction."""
        return self.catalog.publish_snapshot(location, rows, files, sinks, keep)

    def abandon_snapshot(self, location: str) -> None:
        """Forget an unpublished snapshot (its files are deleted by the caller, or by recovery)."""
        self.catalog.abandon_snapshot(location)

    def reap_abandoned_snapshots(self) -> list[str]:
        """Forget snapshots whose writer died before publishing; returns their locations to delete."""
        return self.catalog.reap_abandoned_snapshots()

    def release_changes(self, table: str, sinks: Iterable[str] = ()) -> list[str]:
        """A SOURCE that stores nothing: retire its change files every sink in ``sinks`` delivered and
        no backfill reads; returns their locations."""
        return self.catalog.release_changes(table, sinks)

    def reap_retired(self, grace_s: float, now: float | None = None) -> list[str]:
        """Forget the retired files no reader can hold any more; returns their locations to delete."""
        return self.catalog.reap_retired(grace_s, now)
