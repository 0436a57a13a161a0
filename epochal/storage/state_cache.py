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

Across runs, on a Spark Connect server: the server's sessions share one cache manager, which
matches cached data by plan, so a snapshot a run leaves cached is used by the next run's reads of
the same files with no call of theirs. A run therefore leaves what it cached to the server, and a
registry in the Epochal home (``spark/state_cache.json``: per table, the cached snapshot's location,
schema and files) lets a later run release the older snapshot of a table when it caches a newer
one, from another session, by rebuilding the same plan and unpersisting it. A new run adopts what the
registry says the same server holds (its application id recorded with each entry): without that, the
first epoch of every run paid a Spark job per small cached table to choose vnodes and then cached it
again (counted: 4 extra Spark jobs in a demo run's first epoch; their time was within the noise). Compaction releases a
snapshot before retention deletes its files (a plan over deleted files cannot be built; when that
happens anyway, the server's whole cache is cleared, which costs speed, never correctness). In
one process (local Spark) a run still releases what it cached when it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("epochal.storage")

#: A restricted read touching at least this share of a snapshot's vnodes goes through the cache.
WARM_SHARE = 0.5
#: A cached snapshot of at most this many rows answers restricted reads without choosing vnodes:
#: a broadcast semi-join over 10M cached rows took 0.6-0.7 s here (so ~0.06 s per million),
#: choosing vnodes 0.15-0.35 s plus its planning.
SMALL_ROWS = 1_000_000


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot's cached rows were read as: another session rebuilds the same plan from it
    (Spark matches cached data by plan), to release them."""

    schema_json: str
    files: tuple[str, ...]


#: Builds a snapshot's rows as the reader reads them (the plan the cache holds).
PlanBuilder = Callable[[SnapshotPlan], "DataFrame"]


@dataclass
class _Entry:
    location: str
    rows: DataFrame
    #: left cached on the server for later runs (recorded in the registry): not released at close
    shared: bool = False


def _on_connect(rows: DataFrame) -> bool:
    return type(rows).__module__.startswith("pyspark.sql.connect")


class StateCache:
    """Cached snapshot rows by table; at most one snapshot per table (per server, across runs, when
    ``registry`` is given and the session is a Spark Connect one)."""

    def __init__(self, enabled: bool = True, registry: Path | None = None):
        self.enabled = enabled
        self.registry = registry
        self._by_table: dict[str, _Entry] = {}
        #: snapshots this run already looked up in the registry (one registry read per snapshot)
        self._looked_up: set[tuple[str, str]] = set()
        self._server: tuple[SparkSession, str] | None = None
        #: a run's steps may run on threads: one of them at a time replaces a table's entry
        self._lock = threading.RLock()
        #: reads answered from a cached snapshot (tests check what the cache served)
        self.hits = 0

    def worth_caching(self, directories_read: int, directories_total: int) -> bool:
        """Whether a read of ``directories_read`` of a snapshot's ``directories_total`` directories
        (one per vnode, or per run of vnodes) should fill the cache."""
        return self.enabled and directories_read >= WARM_SHARE * directories_total

    def small_and_cached(
        self, table: str, location: str, rows: int, build: PlanBuilder | None = None
    ) -> DataFrame | None:
        """The cached copy of snapshot ``location`` when it holds at most SMALL_ROWS ``rows``:
        a restricted read filters it rather than pay a Spark job to find the keys' vnodes."""
        return self.get(table, location, build) if self.enabled and rows <= SMALL_ROWS else None

    def get(self, table: str, location: str, build: PlanBuilder | None = None) -> DataFrame | None:
        """The cached rows of snapshot ``location`` of ``table``: this run's, or (given ``build``)
        the ones an earlier run left cached on the same server."""
        entry = self._by_table.get(table)
        if entry is None and build is not None:
            entry = self._adopt(table, location, build)
        if entry is None or entry.location != location:
            return None
        self.hits += 1
        return entry.rows

    def put(
        self,
        table: str,
        location: str,
        rows: DataFrame,
        plan: SnapshotPlan | None = None,
        build: PlanBuilder | None = None,
    ) -> DataFrame:
        """Cache ``rows`` (the whole snapshot at ``location``, read as ``plan``) for ``table``;
        returns the cached frame. Persisting is lazy: the first query that scans it fills the cache
        as it goes (or finds it filled by an earlier run on the same server)."""
        with self._lock:
            existing = self._by_table.get(table)
            if existing is not None and existing.location == location:
                return existing.rows  # another thread cached it first
            return self._put(table, location, rows, plan, build)

    def _put(
        self, table: str, location: str, rows: DataFrame, plan: SnapshotPlan | None, build: PlanBuilder | None
    ) -> DataFrame:
        from pyspark import StorageLevel

        self.evict(table)
        shared = self.registry is not None and plan is not None and build is not None and _on_connect(rows)
        if shared:  # (first: releasing may clear the server's cache, which must not take this one)
            try:
                self._register(table, location, plan, build, rows.sparkSession)  # type: ignore[arg-type]
            except Exception:  # a cache is speed only: it never fails a read
                log.warning("could not record cached snapshot %s; released at the run's end", location, exc_info=True)
                shared = False
        cached = rows.persist(StorageLevel.MEMORY_AND_DISK)
        self._by_table[table] = _Entry(location, cached, shared)
        log.info("caching snapshot %s of %s", location, table)
        return cached

    def evict(self, table: str) -> None:
        with self._lock:
            entry = self._by_table.pop(table, None)
        if entry is not None:
            entry.rows.unpersist()

    def release_locations(
        self, locations: Iterable[str], build: PlanBuilder, spark: Callable[[], SparkSession]
    ) -> None:
        """Snapshots at or under ``locations``, about to be deleted (compaction's garbage, a removed
        table's directory): released here and, when a run left them cached on the server, there
        too, while their files still exist. Spark is only asked for when something is released."""
        doomed = [loc.rstrip("/") for loc in locations]

        def under(location: str) -> bool:
            return any(location == d or location.startswith(d + "/") for d in doomed)

        for table, entry in list(self._by_table.items()):
            if under(entry.location):
                self.evict(table)
        if self.registry is None or not doomed or not self.registry.exists():
            return
        try:
            with self._locked() as registry:
                for table, kept in list(registry.items()):
                    if under(kept["location"]):
                        self._release(kept, build, spark())
                        del registry[table]
        except Exception:  # a cache is speed only: it never fails a compaction
            log.warning("could not release cached snapshots under %s", doomed, exc_info=True)

    def clear(self) -> None:
        """At the end of a run: release what it cached, except what it left to the server."""
        for table, entry in list(self._by_table.items()):
            if entry.shared:
                self._by_table.pop(table)
                continue
            try:
                self.evict(table)
            except Exception:  # the session is already stopped: its cache went with it
                log.debug("could not unpersist the cached snapshot of %s", table, exc_info=True)

    # ------------------------------------------------------------------ the server's registry

    def _server_id(self, spark: SparkSession) -> str:
        """The Spark application behind ``spark`` (a server started again is another application);
        asked once per session."""
        known = self._server
        if known is None or known[0] is not spark:
            known = self._server = (spark, str(spark.conf.get("spark.app.id")))
        return known[1]

    def _adopt(self, table: str, location: str, build: PlanBuilder) -> _Entry | None:
        """The registry's entry for snapshot ``location`` of ``table``, taken over as this run's when
        it was cached on the server this session talks to (a restarted server holds nothing)."""
        if not self.enabled or self.registry is None or (table, location) in self._looked_up:
            return None
        with self._lock:
            if table in self._by_table:
                return self._by_table[table]
            self._looked_up.add((table, location))
            try:  # without the registry's file lock: it is replaced whole, never written in place
                kept = json.loads(self.registry.read_text()).get(table)
            except (OSError, ValueError, AttributeError):
                return None
            if not isinstance(kept, dict) or kept.get("location") != location or not kept.get("server"):
                return None
            try:
                # The same plan: the server's cache manager answers it from the cached data, with no
                # persist() of ours (which would only log that it is cached already).
                rows = build(SnapshotPlan(kept["schema"], tuple(kept["files"])))
                if not _on_connect(rows) or kept["server"] != self._server_id(rows.sparkSession):  # type: ignore[arg-type]
                    return None
                entry = _Entry(location, rows, shared=True)
            except Exception:  # a cache is speed only: the read goes on without it
                log.warning("could not adopt the cached snapshot %s", location, exc_info=True)
                return None
            self._by_table[table] = entry
            log.info("using snapshot %s of %s, cached on the server by an earlier run", location, table)
            return entry

    def _register(
        self, table: str, location: str, plan: SnapshotPlan, build: PlanBuilder, spark: SparkSession
    ) -> None:
        with self._locked() as registry:
            older = registry.get(table)
            if older is not None and older["location"] != location:
                self._release(older, build, spark)
            registry[table] = {
                "location": location,
                "schema": plan.schema_json,
                "files": list(plan.files),
                "server": self._server_id(spark),
            }

    @staticmethod
    def _release(kept: dict, build: PlanBuilder, spark: SparkSession) -> None:
        """Unpersist a snapshot another run left cached, by its plan; if the plan cannot be built
        any more (its files are gone), clear the server's cache rather than leak the entry."""
        try:
            build(SnapshotPlan(kept["schema"], tuple(kept["files"]))).unpersist()
            log.info("released the cached snapshot %s", kept["location"])
        except Exception as exc:
            log.warning(
                "the cached snapshot %s cannot be released by its plan (%s): clearing the server's cache",
                kept["location"],
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            try:
                spark.catalog.clearCache()
            except Exception:
                log.warning("could not clear the server's cache", exc_info=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict]:
        """The registry, read and written under an exclusive lock (runs share it)."""
        if self.registry is None:
            raise RuntimeError("the state cache has no registry (local Spark keeps its cache per run)")
        self.registry.parent.mkdir(parents=True, exist_ok=True)
        with open(self.registry.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                registry = json.loads(self.registry.read_text()) if self.registry.exists() else {}
            except ValueError:  # a torn write of a killed run: start afresh (nothing is lost but speed)
                registry = {}
            yield registry
            tmp = self.registry.with_suffix(".tmp")
            tmp.write_text(json.dumps(registry, indent=1))
            tmp.replace(self.registry)
