"""Files on the disk before the meta store says they are there.

The meta store commits durably (DuckDB's WAL, PostgreSQL's), while Spark, DuckDB and pyarrow only
write files into the page cache. After a power loss a COMMITTED epoch could then point at empty or
missing files. So before a change is collected or a snapshot published, its files, its directories
and the directory entries that name them are fsynced (on a local filesystem; an object store's PUT
is durable when it returns).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.storage.warehouse import Warehouse

log = logging.getLogger("epochal.storage")


def _fsync(path: str, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(path: str, stop_at: str | None = None) -> int:
    """fsync every file and directory under ``path`` (a file or a directory), then ``path``'s parent
    directories up to ``stop_at`` (included), so that each new entry on the way is durable too.
    Returns the files synced; a missing ``path`` syncs nothing."""
    if not os.path.lexists(path):
        return 0
    files = 0
    if os.path.isdir(path):
        for directory, _, names in os.walk(path, topdown=False):
            for name in names:
                _fsync(os.path.join(directory, name), directory=False)
                files += 1
            _fsync(directory, directory=True)
    else:
        _fsync(path, directory=False)
        files = 1
    # the entries that name it: each parent up to the root given (a table's first epoch made them)
    parent, top = os.path.dirname(os.path.abspath(path)), os.path.abspath(stop_at) if stop_at else None
    while top is not None and parent.startswith(top) and os.path.isdir(parent):
        _fsync(parent, directory=True)
        if parent == top:
            break
        parent = os.path.dirname(parent)
    return files


def sync_locations(paths: Iterable[str | None], root: str) -> None:
    """:func:`sync_tree` of each local path of ``paths`` (None skipped), parents up to ``root``."""
    started, files = time.perf_counter(), 0
    for path in paths:
        if path is not None:
            files += sync_tree(path, root)
    log.debug("synced %d file(s) to disk in %.1f ms", files, (time.perf_counter() - started) * 1000)


def sync_written(warehouse: Warehouse, locations: Iterable[str | None]) -> None:
    """Make the files at ``locations`` (under ``warehouse``) durable, when the warehouse is local."""
    if warehouse.is_local:
        root = warehouse.file_path(warehouse.root)
        sync_locations((None if loc is None else warehouse.file_path(loc) for loc in locations), root)
