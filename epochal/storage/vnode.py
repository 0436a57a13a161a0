"""Virtual nodes: how a snapshot spreads a table's rows over directories by key.

A row's vnode is ``pmod(xxhash64(distribution key columns), 256)``, RisingWave's idea: a reader that
needs the rows of a few keys computes the keys' vnodes and opens only those directories.

A large snapshot has a directory per vnode (``_vnode=V``). A small one has a directory per run of
adjacent vnodes (``_vnodes=LO-HI``, a power-of-two run chosen so that a directory holds about
``directory_rows`` rows): 256 directories of a few hundred rows each cost far more to write (a
file, a commit and a rename each) than the reads they narrow save. A reader of some vnodes opens
the directories that cover them and, where a directory covers more, filters by the vnode. The same
expression must run when a snapshot is written and when a restriction is planned, on values of the
same types in the same order, or a key would be looked for in the wrong directory; this module is
that one expression, and callers cast keys to the snapshot's column types before using it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from epochal.sql import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

VNODE = "_vnode"
#: the directory column of a snapshot whose directories each hold a run of vnodes ("LO-HI")
VNODE_RUN = "_vnodes"
VNODE_COUNT = 256
#: rows a snapshot directory holds, about, before vnodes get directories of their own
DEFAULT_DIRECTORY_ROWS = 131_072


def vnode_column(schema: "StructType", key: Sequence[str]) -> "Column":
    """The vnode of each row, hashing ``key`` (all of ``schema``'s columns when empty) as typed in ``schema``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    fields = {f.name: f for f in schema.fields}
    # Over every column, MAPs are left out: Spark refuses to hash them (and no read restricts by one).
    names = list(key) or [n for n, f in fields.items() if not _holds_map(f.dataType)]
    if not names:
        return F.lit(0)  # (only MAP columns: one vnode)
    parts = []
    for name in names:
        column = F.col(quote(name))
        if isinstance(fields[name].dataType, FloatType | DoubleType):
            # -0.0 = 0.0 for the join that applies a restriction, but their bits (and hashes) differ:
            # hash one of them, so both land in the same vnode. NULL keeps NULL (the condition is NULL).
            column = F.when(column == 0, F.lit(0.0).cast(fields[name].dataType)).otherwise(column)
        parts.append(column)
    return F.pmod(F.xxhash64(*parts), F.lit(VNODE_COUNT)).cast("int")


def _holds_map(data_type: "DataType") -> bool:
    """Whether ``data_type`` is or contains a MAP, which xxhash64 refuses."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _holds_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_holds_map(f.dataType) for f in data_type.fields)
    return False


def vnodes_per_directory(rows: int, directory_rows: int = DEFAULT_DIRECTORY_ROWS) -> int:
    """Adjacent vnodes a snapshot of about ``rows`` rows puts in one directory: a power of two from
    1 (every vnode its own directory) to 256 (one directory), the most that keeps a directory at
    about ``directory_rows`` rows or fewer. ``directory_rows`` 0: always 1."""
    width = 1
    while directory_rows > 0 and width < VNODE_COUNT and max(rows, 0) * width * 2 <= directory_rows * VNODE_COUNT:
        width *= 2
    return width


def directory_span(name: str) -> tuple[int, int] | None:
    """The vnodes (first, last) a snapshot directory named ``name`` holds; None if it is none."""
    if name.startswith(f"{VNODE}="):
        vnode = int(name[len(VNODE) + 1 :])
        return vnode, vnode
    if name.startswith(f"{VNODE_RUN}="):
        first, _, last = name[len(VNODE_RUN) + 1 :].partition("-")
        return int(first), int(last)
    return None


def write_laid_out(rows: "DataFrame", key: Sequence[str], width: int, location: str, mode: str = "error") -> None:
    """Write ``rows`` as a snapshot at ``location``: one shuffle by directory, so each directory is
    one file (one task writes it). ``width``: vnodes per directory (:func:`vnodes_per_directory`)."""
    from pyspark.sql import functions as F

    vnode = vnode_column(rows.schema, key)
    if width == 1:
        name, column = VNODE, vnode
    else:
        first = (F.floor(vnode / width) * width).cast("int")
        name, column = VNODE_RUN, F.concat(first.cast("string"), F.lit("-"), (first + width - 1).cast("string"))
    # (mode "error", not its alias "errorifexists": Spark Connect's client lacks the alias)
    rows.withColumn(name, column).repartition(F.col(name)).write.mode(mode).partitionBy(name).parquet(location)
