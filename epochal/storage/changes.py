"""Arithmetic on weighted changes: a table's columns plus ``_weight``, the signed multiplicity of a row.

Every table stores its epochs as *unit* changes (one row per unit, weight +1 or -1), and every
reader turns a sequence of them back into rows by netting. Both directions live here so that the
runtime, the keyed view step and compaction agree on what a change means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from epochal.sql import quote
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def net_rows(changes: DataFrame) -> DataFrame:
    """The multiset a sequence of changes adds up to: each row as many times as its net weight.
    A row whose net weight is negative (deleted more often than inserted) is not there at all."""
    from pyspark.sql import functions as F

    columns = [quote(c) for c in changes.columns if c != WEIGHT]
    net = changes.groupBy(*columns).agg(F.sum(WEIGHT).alias("_n")).where("_n > 0")
    return net.withColumn("_i", F.explode(F.sequence(F.lit(1), F.col("_n")))).select(*columns)


def unit_changes(weighted: DataFrame) -> DataFrame:
    """Net weights per row, as the one-row-per-unit (+1/-1) changes the storage layout keeps."""
    from pyspark.sql import functions as F

    columns = [quote(c) for c in weighted.columns if c != WEIGHT]
    net = weighted.groupBy(*columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)
    return (
        net.withColumn("_i", F.explode(F.sequence(F.lit(1), F.abs(F.col(WEIGHT)))))
        .withColumn(WEIGHT, F.signum(F.col(WEIGHT)).cast("bigint"))
        .select(*columns, WEIGHT)
    )


def signed_parts(deltas: Mapping[str, DataFrame]) -> list[tuple[int, dict[str, DataFrame]]]:
    """The deltas split by sign, without ``_weight``: ``[(1, inserted rows), (-1, deleted rows)]``.

    A linear query over changes is the query over the inserted rows minus the query over the
    deleted ones (DBSP's linearity), and each stored row is one unit, so a row's sign is all the
    weight there is to carry across the query."""
    from pyspark.sql import functions as F

    return [
        (sign, {name: delta.where(keep).drop(WEIGHT) for name, delta in deltas.items()})
        for sign, keep in ((1, F.col(WEIGHT) > 0), (-1, F.col(WEIGHT) < 0))
    ]
