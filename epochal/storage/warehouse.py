"""Where table data lives, and how it is laid out.

    {warehouse}/{table}/epoch={E}/{attempt}/part-*.parquet
    {warehouse}/{table}/snapshot={S}/{attempt}/_vnode={V}/part-*.parquet       (a large table)
    {warehouse}/{table}/snapshot={S}/{attempt}/_vnodes={LO}-{HI}/part-*.parquet  (a small one)

Every epoch of every table is a directory of Parquet files holding that epoch's *change*: the
table's columns plus ``_weight`` (+1 insert, -1 delete; one row per unit of change). An idle epoch
(a source that read no record, an incremental view whose inputs did not change) has none: its
empty change is recorded without a location. Every write
goes to a fresh ``attempt`` directory, so two runs racing on one epoch never write the same files;
the meta store records which attempt was collected, and only recorded, committed attempts are ever
read. Anything else is garbage that recovery deletes.

The state of a table at epoch C is the sum of its changes over all committed epochs <= C. A
*snapshot* at committed epoch S holds that sum for C = S, netted (one row per unit, no ``_weight``)
and spread over vnode directories (``epochal/storage/vnode.py``), so the state at C >= S is the
snapshot plus the changes after S (``epochal/storage/compaction.py``). Spark writes; Spark and
DuckDB both read (DuckDB via explicit file lists, never by globbing a table).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from epochal.storage.vnode import directory_span

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

WEIGHT = "_weight"
#: The footer entry where Spark records the schema of the rows it wrote (ParquetReadSupport).
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
DEAD_LETTER_SUFFIX = "__dead_letters"

log = logging.getLogger("epochal.storage")


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    # Hadoop's s3a:// is S3 to everyone else.
    scheme, rest = uri.split("://", 1)
    normalized = f"s3://{rest}" if scheme in ("s3a", "s3n") else uri
    return pafs.FileSystem.from_uri(normalized)


def _with_schema(spark: SparkSession, locations: list[str], schema: StructType | None) -> DataFrame:
    # Without a schema, Spark infers it with a Spark job of its own per read (it opens one footer
    # on an executor: 70 ms of analysis per read here, and one job per read) to find what the
    # footer's record already says.
    return (spark.read if schema is None else spark.read.schema(schema)).parquet(*locations)


def _recorded_schema(footer: pq.FileMetaData) -> StructType | None:
    """The schema Spark recorded in ``footer``; None if there is none, or it names a type this
    pyspark cannot (a newer writer): then Spark infers."""
    import json

    from pyspark.sql.types import StructType

    recorded = (footer.metadata or {}).get(SPARK_SCHEMA_KEY)
    if recorded is None:
        return None
    try:
        return StructType.fromJson(json.loads(recorded))
    except ValueError:
        log.debug("unreadable Spark schema record in a Parquet footer; Spark infers the schema")
        return None


def _may_delete(footer: pq.FileMetaData) -> bool:
    """Whether a change file may hold a row of negative weight: its ``_weight`` column's minimum
    in some row group is below 0, or unknown (no statistics, or no such column)."""
    paths = [footer.schema.column(i).path for i in range(footer.num_columns)]
    if WEIGHT not in paths:
        return True
    column = paths.index(WEIGHT)
    for group in range(footer.num_row_groups):
        chunk = footer.row_group(group).column(column)
        if chunk.num_values == 0:
            continue
        stats = chunk.statistics
        if stats is None or not stats.has_min_max or stats.min < 0:
            return True
    return False


class Warehouse:
    def __init__(self, root: str):
        self.root = root.rstrip("/")
        self.fs, self._root_path = _filesystem(self.root)
        #: on the driver's own filesystem (the embedded default), where DuckDB reads the files too
        self.is_local = isinstance(self.fs, pafs.LocalFileSystem)

    # ------------------------------------------------------------------ layout

    def table_root(self, table: str) -> str:
        return f"{self.root}/{table}"

    def new_location(self, table: str, epoch: int) -> str:
        return f"{self.table_root(table)}/epoch={epoch}/{uuid.uuid4().hex[:12]}"

    def new_snapshot_location(self, table: str, epoch: int) -> str:
        return f"{self.table_root(table)}/snapshot={epoch}/{uuid.uuid4().hex[:12]}"

    def _path(self, location: str) -> str:
        return _filesystem(location)[1]

    def file_path(self, location: str) -> str:
        """``location`` as a path of ``fs`` (the scheme dropped), for reads and writes through pyarrow."""
        return self._path(location)

    # ------------------------------------------------------------------ writing & reading with Spark

    def write(self, df: DataFrame, location: str) -> int:
        """Write ``df`` as the complete content of ``location``; returns the rows written."""
        # "error", not its alias "errorifexists": the Spark Connect client knows only the former
        df.write.mode("error").parquet(location)
        return self.row_count(location)

    def read(self, spark: SparkSession, locations: Iterable[str]) -> DataFrame:
        """The rows at ``locations`` (one table's change files), with the schema Spark wrote."""
        locations = list(locations)
        return _with_schema(spark, locations, self.written_schema(locations))

    def read_counted(self, spark: SparkSession, locations: Iterable[str]) -> tuple[DataFrame, int]:
        """``read``, and the rows the files hold: each location is listed and each footer opened
        once for both."""
        frame, rows, _ = self.read_changes(spark, locations)
        return frame, rows

    def read_changes(self, spark: SparkSession, locations: Iterable[str]) -> tuple[DataFrame, int, bool]:
        """``read_counted`` of change files, and whether any of their rows may be a delete (a
        ``_weight`` below 0), from the footers' column statistics: a state whose changes since
        its snapshot only insert is their union, and netting it (a shuffle of every row of the
        table) would change nothing. Files without statistics count as deleting."""
        locations = list(locations)
        footers = [self._footers(self.parquet_files(location)) for location in locations]
        newest = next((found[0] for found in reversed(footers) if found), None)
        schema = None if newest is None else _recorded_schema(newest)
        rows = sum(f.num_rows for found in footers for f in found)
        deletes = any(_may_delete(f) for found in footers for f in found)
        return _with_schema(spark, locations, schema), rows, deletes

    def may_delete(self, locations: Iterable[str]) -> bool:
        """Whether the change files at ``locations`` may hold a delete (``read_changes``)."""
        return any(_may_delete(f) for location in locations for f in self._footers(self.parquet_files(location)))

    def written_schema(self, locations: Iterable[str]) -> StructType | None:
        """The Spark schema recorded in a file footer at the last of ``locations`` that has a file,
        as Spark's own inference takes it (it prefers this record, and reads one file unless asked
        to merge). Locations come oldest first, and the newest writer's columns are the table's
        (a partial aggregate written before it kept hidden columns has fewer; readers add them).
        None when there is no file, or Spark did not write it: then Spark infers."""
        for location in reversed(list(locations)):
            files = self.parquet_files(location)
            if files:
                return _recorded_schema(self._footers(files[:1])[0])
        return None

    # ------------------------------------------------------------------ files, for DuckDB and stats

    def parquet_files(self, location: str, recursive: bool = False) -> list[str]:
        """The data files at ``location`` (and below it when ``recursive``); Spark's and Hadoop's
        hidden and marker files (``.crc``, ``_SUCCESS``) are not data."""
        path = self._path(location)
        prefix = location[: len(location) - len(path)]
        infos = self.fs.get_file_info(pafs.FileSelector(path, recursive=recursive))
        return sorted(
            prefix + info.path
            for info in infos
            if info.type == pafs.FileType.File
            and info.base_name.endswith(".parquet")
            and not info.base_name.startswith((".", "_"))
        )

    def row_count(self, location: str) -> int:
        return self.files_row_count(self.parquet_files(location))

    def files_row_count(self, files: Iterable[str]) -> int:
        # Parquet footers hold the counts: no second Spark job to count what was just written.
        return sum(footer.num_rows for footer in self._footers(files))

    def _footers(self, files: Iterable[str]) -> list[pq.FileMetaData]:
        footers = []
        for path in files:
            with self.fs.open_input_file(self._path(path)) as fh:
                footers.append(pq.ParquetFile(fh).metadata)
        return footers

    # ------------------------------------------------------------------ snapshots (a directory per vnode, or per run)

    def snapshot_dirs(self, location: str) -> list[tuple[int, int, str]]:
        """A snapshot's directories as (first vnode, last vnode, directory), by first vnode: one per
        vnode (``_vnode=V``) or per run of vnodes (``_vnodes=LO-HI``); a vnode without rows has none."""
        path = self._path(location)
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"snapshot {location} is missing from the warehouse")
        found = []
        for info in self.fs.get_file_info(pafs.FileSelector(path)):
            span = directory_span(info.base_name) if info.type == pafs.FileType.Directory else None
            if span is not None:
                found.append((*span, f"{location}/{info.base_name}"))
        return sorted(found)

    def vnode_dirs(self, location: str) -> dict[int, list[str]]:
        """The directories that hold each vnode of a snapshot (a vnode without rows has none; a
        directory of a run of vnodes is listed under each of them)."""
        covering: dict[int, list[str]] = {}
        for first, last, directory in self.snapshot_dirs(location):
            for vnode in range(first, last + 1):
                covering.setdefault(vnode, []).append(directory)
        return covering

    def snapshot_files(self, location: str) -> list[str]:
        """The Parquet files of a snapshot, directory by directory."""
        return [f for _, _, directory in self.snapshot_dirs(location) for f in self.parquet_files(directory)]

    def all_snapshot_files(self, location: str) -> list[str]:
        """Every Parquet file of a snapshot, from one recursive listing (one paginated LIST on an
        object store, where listing each of 256 vnode directories would be 256 round trips)."""
        return self.parquet_files(location, recursive=True)

    # ------------------------------------------------------------------ backfill snapshots, built range by range

    def backfill_root(self, table: str, snapshot_epoch: int) -> str:
        """Where a backfill of ``table`` keeps its work. Not an ``epoch=`` or ``snapshot=`` directory:
        recovery's sweep never takes it, since a backfill spans many runs and records its own files."""
        return f"{self.table_root(table)}/backfill={snapshot_epoch}"

    def adopt_vnode_files(self, staging: str, target: str, prefix: str) -> int:
        """Move the files of snapshot-layout directory ``staging`` into ``target``'s directories of
        the same names, each name prefixed by ``prefix``; returns the files moved. A move that dies
        midway leaves files named ``prefix*``, which ``drop_prefixed`` deletes before a retry."""
        moved = 0
        for _, _, directory in self.snapshot_dirs(staging):
            destination = self._path(f"{target}/{directory.rsplit('/', 1)[-1]}")
            self.fs.create_dir(destination, recursive=True)
            for file in self.parquet_files(directory):
                name = file.rsplit("/", 1)[-1]
                self.fs.move(self._path(file), f"{destination}/{prefix}{name}")
                moved += 1
        return moved

    def move_prefixed(self, source: str, destination: str, prefixes: set[str]) -> int:
        """Move the files below ``source`` whose names start with one of ``prefixes`` to the same
        relative paths below ``destination``; the others stay. Returns the files moved. Run again
        after dying midway, it moves the rest."""
        if not prefixes or not self.exists(source):
            return 0
        base = self._path(source)
        moved = 0
        for info in self.fs.get_file_info(pafs.FileSelector(base, recursive=True)):
            if info.type != pafs.FileType.File or not info.base_name.startswith(tuple(prefixes)):
                continue
            relative = info.path[len(base) :].lstrip("/")
            into = f"{self._path(destination)}/{relative}"
            self.fs.create_dir(into.rsplit("/", 1)[0], recursive=True)
            self.fs.move(info.path, into)
            moved += 1
        return moved

    def keep_prefixed(self, target: str, prefixes: set[str]) -> list[str]:
        """Delete the files below ``target`` whose names start with none of ``prefixes`` (what a
        writer that died left before it recorded its prefix); returns what was deleted."""
        if not self.exists(target):
            return []
        dropped = []
        for info in self.fs.get_file_info(pafs.FileSelector(self._path(target), recursive=True)):
            if info.type == pafs.FileType.File and not info.base_name.startswith(tuple(prefixes) or ("\0",)):
                self.fs.delete_file(info.path)
                dropped.append(info.path)
        return dropped

    def keep_attempts(self, root: str, recorded: Iterable[str]) -> list[str]:
        """Delete the attempt directories under ``root``'s ``epoch=`` directories that are not in
        ``recorded`` (written by a writer that died before recording them); returns them."""
        if not self.exists(root):
            return []
        kept = {self._path(loc) for loc in recorded}
        dropped = []
        for epoch_dir in self.fs.get_file_info(pafs.FileSelector(self._path(root))):
            if epoch_dir.type != pafs.FileType.Directory or not epoch_dir.base_name.startswith("epoch="):
                continue
            for attempt in self.fs.get_file_info(pafs.FileSelector(epoch_dir.path)):
                if attempt.type == pafs.FileType.Directory and attempt.path not in kept:
                    self.fs.delete_dir(attempt.path)
                    dropped.append(attempt.path)
        return dropped

    def child_dirs(self, location: str) -> list[str]:
        """The directories directly below ``location``, as locations; none when it does not exist."""
        if not self.exists(location):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self._path(location)))
        return sorted(f"{location}/{i.base_name}" for i in infos if i.type == pafs.FileType.Directory)

    def exists(self, location: str) -> bool:
        return self.fs.get_file_info(self._path(location)).type != pafs.FileType.NotFound

    def make_dir(self, location: str) -> None:
        self.fs.create_dir(self._path(location), recursive=True)

    def table_file_count(self, table: str) -> int:
        """Parquet files under ``table``'s directory, snapshots and changes alike."""
        root = self._path(self.table_root(table))
        if self.fs.get_file_info(root).type == pafs.FileType.NotFound:
            return 0
        infos = self.fs.get_file_info(pafs.FileSelector(root, recursive=True))
        return sum(1 for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))

    # ------------------------------------------------------------------ cleanup

    def delete(self, locations: Iterable[str], prune_parents: bool = False) -> None:
        """Delete attempt directories; ``prune_parents`` also removes an ``epoch=``/``snapshot=``
        directory left empty, so compaction does not leave a trail of empty directories behind."""
        for location in locations:
            path = self._path(location)
            if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
                self.fs.delete_dir(path)
                log.info("deleted %s", location)
            if prune_parents:
                self._remove_if_empty(path.rsplit("/", 1)[0])

    def remove_empty_table_roots(self, locations: Iterable[str]) -> None:
        """Remove the table directories of attempt ``locations`` (``<table>/epoch=E/<attempt>``)
        that are left empty: a table that left the pipeline while a run still wrote it."""
        for location in locations:
            self._remove_if_empty(self._path(location).rsplit("/", 2)[0])

    def _remove_if_empty(self, path: str) -> None:
        """Remove directory ``path`` if it is empty, never what is in it: a writer may have just
        created an attempt there (pyarrow's delete_dir is recursive). Locally rmdir checks and
        removes in one call; elsewhere (an object store, HDFS) it is listed, then deleted."""
        try:
            if self.is_local:
                os.rmdir(path)
            elif not self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
                self.fs.delete_dir(path)
        except OSError:  # not empty (a writer's new attempt), or already gone
            pass

    def sweep(self, tables: Iterable[str], keep: Callable[[], set[str]], upto: int | None) -> list[str]:
        """Delete attempt directories of ``tables``, for epochs <= ``upto``, that ``keep()`` does not
        hold, and snapshot attempts it does not hold, whatever their epoch.

        They are what a run (or a compaction) wrote before it died, and before it could record the
        write. Newer epochs may be being written right now by a live run, so they are never touched.
        The directories are listed *before* ``keep()`` is asked: a compaction announces its snapshot
        before it creates the directory, so every directory listed was announced before ``keep()``
        reads the meta store, and one announced after that read was not listed. (Asking first would
        let a snapshot announced between the read and the listing be deleted while it is written.)"""
        candidates: list[tuple[str, str]] = []  # (attempt path, its parent: an epoch= or snapshot= dir)
        parents: set[str] = set()  # directories to remove once empty
        for table in tables:
            root = self._path(self.table_root(table))
            if self.fs.get_file_info(root).type == pafs.FileType.NotFound:
                continue
            for epoch_dir in self.fs.get_file_info(pafs.FileSelector(root)):
                if epoch_dir.type != pafs.FileType.Directory:
                    continue
                if epoch_dir.base_name.startswith("snapshot="):
                    # Snapshots are only ever taken of committed epochs, so ``upto`` does not protect
                    # one being written; ``keep`` does: it holds every recorded snapshot, and those
                    # a live compaction has announced. Anything else was left by a dead compaction.
                    pass
                elif not epoch_dir.base_name.startswith("epoch="):
                    continue
                elif upto is None or int(epoch_dir.base_name[len("epoch=") :]) > upto:
                    continue
                attempts = self.fs.get_file_info(pafs.FileSelector(epoch_dir.path))
                if not attempts:
                    parents.add(epoch_dir.path)  # emptied by the discard of an aborted epoch
                for attempt in attempts:
                    if attempt.type == pafs.FileType.Directory:
                        candidates.append((attempt.path, epoch_dir.path))
        kept = {self._path(loc) for loc in keep()} if candidates else set()
        removed: list[str] = []
        for path, parent in candidates:
            if path not in kept:
                self.fs.delete_dir(path)
                removed.append(path)
                parents.add(parent)
        for parent in parents:
            # An epoch's directory gets no new attempt once its epoch is aborted, but a snapshot
            # epoch's may (the next compaction at that epoch): a recursive delete could take its
            # files, so snapshot directories are left for compaction's own pruning.
            if parent.rsplit("/", 1)[-1].startswith("epoch="):
                self._remove_if_empty(parent)
        if removed:
            log.warning("recovery removed %d unreferenced attempt(s): %s", len(removed), removed[:5])
        return removed


def dead_letter_table(source: str) -> str:
    return f"{source}{DEAD_LETTER_SUFFIX}"
