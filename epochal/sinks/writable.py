"""Whether a sink can write its local target at all, asked before the first attempt.

A target on a path this process can never write (a directory without write permission, a path under
a regular file, a read-only filesystem) fails the same way on every attempt, so retrying it only
delays the error; and the error the writer meets names an internal file (a ``.lock`` beside a DuckDB
database) instead of the option the user wrote. This names the user's path, the cause and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path


def unwritable(path: Path) -> str | None:
    """Why this process cannot create or write ``path`` (a file or a directory, with what is created
    beside it), or None when it can as far as the filesystem says before trying."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return f"{existing} is a file, not a directory, so nothing can be created under it"
    # A file target (a DuckDB database) writes beside itself too (its lock and WAL files).
    folder = existing if existing.is_dir() else existing.parent
    if existing.is_file() and not os.access(existing, os.W_OK):
        return f"{existing} is not writable by this user (uid {os.getuid()})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the directory {folder} is not writable by this user (uid {os.getuid()})"
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only filesystem"
    return None
