"""Virtual nodes: how a snapshot spreads a table's rows over directories by key.

A row's vnode is ``pmod(xxhash64(distribution key columns), 256)``, RisingWave's idea: a reader that
needs the rows of a few keys computes the keys' vnodes and opens only those directories. The same
expression must run when a snapshot is written and when a restriction is planned, on values of the
same types in the same order, or a key would be looked for in the wrong directory; this module is
that one expression, and callers cast keys to the snapshot's column types before using it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from epochal.sql import quote

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import StructType

VNODE = "_vnode"
VNODE_COUNT = 256


def vnode_column(schema: "StructType", key: Sequence[str]) -> "Column":
    """The vnode of each row, hashing ``key`` (all of ``schema``'s columns when empty) as typed in ``schema``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    fields = {f.name: f for f in schema.fields}
    names = list(key) or list(fields)
    parts = []
    for name in names:
        column = F.col(quote(name))
        if isinstance(fields[name].dataType, FloatType | DoubleType):
            # -0.0 = 0.0 for the join that applies a restriction, but their bits (and hashes) differ:
            # hash one of them, so both land in the same vnode. NULL keeps NULL (the condition is NULL).
            column = F.when(column == 0, F.lit(0.0).cast(fields[name].dataType)).otherwise(column)
        parts.append(column)
    return F.pmod(F.xxhash64(*parts), F.lit(VNODE_COUNT)).cast("int")


def vnode_dir(location: str, vnode: int) -> str:
    return f"{location}/{VNODE}={vnode}"
