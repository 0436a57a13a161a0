"""Snapshots kept warm in Spark's cache, the analogue of RisingWave's block cache.

A snapshot is immutable: once READY, its files never change, so a cached copy can never go stale
and needs no invalidation protocol, only eviction. That is what makes this cache cheap to get right.

Why a cache at all: vnodes let a read open only the vnode directories its keys hash to, which
helps when an epoch's changes are key-local. When they are spread (0.1% random updates of a large
table touch every one of the 256 vnodes), every restricted read is a scan of the whole snapshot,
and a table is often read more than once per epoch (a keyed source looks up its previous rows by
its primary key; each view reading it restricts it by its own key). Decoding the Parquet once and
filtering the in-memory columnar copy afterwards turns the second and later scans, within a run
and across the epochs of a long-lived session, into memory scans.

When to cache: a read that would touch at least half of a snapshot's vnodes (or an unrestricted
read) costs a full scan anyway, so materializing it into the cache costs little more. A read of a
few vnodes stays a direct read of those few, so key-local workloads never pay for a full scan.

When to skip choosing vnodes: finding which vnodes a restriction's keys hash to is a Spark job of
its own (0.15-0.35 s here, plus planning), however small the table. Once a snapshot of at most
SMALL_ROWS rows is cached, scanning all of it in memory costs less than that job, so a restricted
read filters the cached copy directly (a dimension table, a view's own per-group rows).

Memory stays bounded: rows are persisted MEMORY_AND_DISK, so Spark evicts blocks to local disk
(least recently used first) rather than growing the heap past its storage fraction, and a table
keeps at most one cached snapshot: reading a newer one (after compaction) unpersists the older.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("epochal.storage")

#: A restricted read touching at least this share of a snapshot's vnodes goes through the cache.
WARM_SHARE = 0.5
#: A cached snapshot of at most this many rows answers restricted reads without choosing vnodes:
#: a broadcast semi-join over 10M cached rows took 0.6-0.7 s here (so ~0.06 s per million),
#: choosing vnodes 0.15-0.35 s plus its planning.
SMALL_ROWS = 1_000_000


@dataclass
class _Entry:
    location: str
    rows: DataFrame


class StateCache:
    """Cached snapshot rows by table; at most one snapshot per table."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._by_table: dict[str, _Entry] = {}
        #: reads answered from a cached snapshot (tests check what the cache served)
        self.hits = 0

    def worth_caching(self, vnodes_read: int, vnodes_total: int) -> bool:
        """Whether a read of ``vnodes_read`` of a snapshot's ``vnodes_total`` vnodes should fill the cache."""
        return self.enabled and vnodes_read >= WARM_SHARE * vnodes_total

    def small_and_cached(self, table: str, location: str, rows: int) -> DataFrame | None:
        """The cached copy of snapshot ``location`` when it holds at most SMALL_ROWS ``rows``:
        a restricted read filters it rather than pay a Spark job to find the keys' vnodes."""
        return self.get(table, location) if self.enabled and rows <= SMALL_ROWS else None

    def get(self, table: str, location: str) -> DataFrame | None:
        entry = self._by_table.get(table)
        if entry is None or entry.location != location:
            return None
        self.hits += 1
        return entry.rows

    def put(self, table: str, location: str, rows: DataFrame) -> DataFrame:
        """Cache ``rows`` (the whole snapshot at ``location``) for ``table``; returns the cached frame.
        Persisting is lazy: the first query that scans it fills the cache as it goes."""
        from pyspark import StorageLevel

        self.evict(table)
        cached = rows.persist(StorageLevel.MEMORY_AND_DISK)
        self._by_table[table] = _Entry(location, cached)
        log.info("caching snapshot %s of %s", location, table)
        return cached

    def evict(self, table: str) -> None:
        entry = self._by_table.pop(table, None)
        if entry is not None:
            entry.rows.unpersist()

    def clear(self) -> None:
        for table in list(self._by_table):
            try:
                self.evict(table)
            except Exception:  # the session is already stopped: its cache went with it
                log.debug("could not unpersist the cached snapshot of %s", table, exc_info=True)
