"""Runs a partial-aggregate plan for one epoch: the groups' stored rows plus the epoch's change.

A partial aggregate's table holds, per group, COUNT(*) and COUNT/SUM/MIN/MAX of its arguments
(:class:`epochal.incremental.planner.PartialAggregate`). For the groups an epoch touches:

    d      = the change's rows, aggregated per group with their weights (+1 insert, -1 delete)
    old    = the table's rows at those groups (the view's own state, read at their vnodes)
    new    = old + d:  counts and exact sums add; MIN/MAX take the least/greatest of old and the
             inserted values; a group whose COUNT(*) reaches 0 has no row
    change = new - old

COUNT and SUM over exact types (integers, decimals) are invertible, so a delete is a subtraction.
MIN and MAX are not: when a deleted value is at or beyond the stored extreme, the group is
recomputed from its input (read at the group's key, as the recompute rule does), and so is a SUM
over floating point that loses a value: subtraction leaves rounding error behind that no later
epoch removes (1e16 + 1 - 1e16 is 0 in doubles). Everything else reads only the view's own rows of
the touched groups: a change of n rows reads at most n groups, never the input table.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING

from epochal.incremental.keyed import KeyedChange, StateReader, bound_views, key_names, leaf_states
from epochal.incremental.planner import PartialColumn, Plan
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

_OLD = "_old_"
_DELTA = "_delta_"
_GONE = "_gone_"  # deleted values: MIN of them for min, MAX for max, "any" for an inexact sum
_REDO = "_epochal_recompute"


def _exact(data_type: DataType) -> bool:
    """Types whose sum is exactly invertible: a delete can be subtracted."""
    from pyspark.sql.types import ByteType, DecimalType, IntegerType, LongType, ShortType

    return isinstance(data_type, (ByteType, ShortType, IntegerType, LongType, DecimalType))


def partial_change(
    spark: SparkSession,
    plan: Plan,
    table: str,
    columns: tuple[str, ...],
    deltas: Mapping[str, DataFrame],
    read_state: StateReader,
) -> KeyedChange:
    """The change of partial-aggregate ``table`` for the epoch (``plan.rule`` is PARTIAL_RULE)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spec = plan.aggregate
    assert spec is not None and len(plan.leaves) == 1, "a partial aggregate reads one input"
    leaf = plan.leaves[0]
    cached: list[DataFrame] = []

    def cache(frame: DataFrame) -> DataFrame:
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return cached[-1]

    # The change's rows as the aggregate sees them (WHERE applied, arguments and FILTER evaluated),
    # with their weights: the leaf and rows_sql are linear, so each sign is evaluated on its own.
    signed = []
    for sign, keep in ((1, F.col(WEIGHT) > 0), (-1, F.col(WEIGHT) < 0)):
        with bound_views(spark, {u: d.where(keep).drop(WEIGHT) for u, d in deltas.items()}):
            leaf_rows = spark.sql(leaf.sql)
        with bound_views(spark, {leaf.name: leaf_rows}):
            signed.append(spark.sql(spec.rows_sql).withColumn(WEIGHT, F.lit(sign).cast("bigint")))
    rows = signed[0].unionByName(signed[1])
    empty = {u: spark.createDataFrame([], d.drop(WEIGHT).schema) for u, d in deltas.items()}

    def run(bindings: Mapping[str, DataFrame]) -> DataFrame:
        with bound_views(spark, bindings):
            return spark.sql(plan.query).toDF(*columns)

    with bound_views(spark, empty):
        table_schema = run({leaf.name: spark.sql(leaf.sql)}).schema  # analysis only: no job
    exact = {c.name: c.kind == "sum" and _exact(rows.schema[c.argument].dataType) for c in spec.columns}

    def counted(column: PartialColumn) -> Column:
        """The rows the aggregate takes: FILTER true and (but for COUNT(*)) the argument not NULL."""
        keep = F.col(column.condition) if column.condition else F.lit(True)
        return keep & F.col(column.argument).isNotNull() if column.argument else keep

    w = F.col(WEIGHT)
    aggregations = []
    for c in spec.columns:
        if c.kind == "count":
            aggregations.append(F.sum(F.when(counted(c), w).otherwise(0)).alias(_DELTA + c.name))
        elif c.kind == "sum" and exact[c.name]:
            # Negated rather than multiplied by the weight: a decimal times a BIGINT widens the
            # type, and past 38 digits Spark drops scale, which would round the sum.
            signed_value = F.when(w > 0, F.col(c.argument)).otherwise(-F.col(c.argument))
            aggregations.append(F.sum(F.when(counted(c), signed_value)).alias(_DELTA + c.name))
        else:
            inserted = F.when(counted(c) & (w > 0), F.col(c.argument))
            deleted = F.when(counted(c) & (w < 0), F.col(c.argument))
            pick = {"min": F.min, "max": F.max, "sum": F.sum}[c.kind]
            aggregations.append(pick(inserted).alias(_DELTA + c.name))
            gone = F.max(deleted.isNotNull()) if c.kind == "sum" else pick(deleted)
            aggregations.append(gone.alias(_GONE + c.name))
    delta = cache(rows.groupBy(*(F.col(f"`{g}`") for g in spec.groups)).agg(*aggregations))

    # The table's own rows at the touched groups: distributed by its groups, so read at their vnodes.
    # An aggregate over all rows has one group and one row (a COUNT of 0 included), read whole.
    touched = (spec.groups, delta.select(*(f"`{g}`" for g in spec.groups))) if spec.groups else None
    state, rows_read = read_state(table, False, touched)
    old = cache(state if state is not None else spark.createDataFrame([], table_schema))
    prior = old.select(*(F.col(f"`{c}`").alias(_OLD + c) for c in old.columns))
    same_group = [delta[f"`{g}`"].eqNullSafe(prior[f"`{_OLD}{g}`"]) for g in spec.groups]
    joined = delta.join(prior, on=reduce(lambda a, b: a & b, same_group, F.lit(True)), how="left")

    def before(name: str) -> Column:
        return F.col(f"`{_OLD}{name}`")

    def added(name: str) -> Column:
        return F.col(f"`{_DELTA}{name}`")

    values: dict[str, Column] = {}
    needs_input: list[Column] = []
    for c in spec.columns:
        if c.kind == "count":  # (added is NULL only over all rows, when the change kept no row)
            values[c.name] = F.coalesce(before(c.name), F.lit(0)) + F.coalesce(added(c.name), F.lit(0))
    for c in spec.columns:
        gone = F.col(f"`{_GONE}{c.name}`")
        if c.kind == "sum":
            total = F.coalesce(before(c.name), F.lit(0)) + F.coalesce(added(c.name), F.lit(0))
            values[c.name] = F.when(values[c.nonnull] > 0, total)
            if not exact[c.name]:
                needs_input.append(F.coalesce(gone, F.lit(False)))
        elif c.kind in ("min", "max"):
            values[c.name] = (F.least if c.kind == "min" else F.greatest)(before(c.name), added(c.name))
            # A deleted value at (or beyond) the extreme may have been it: only the input can say
            # what the extreme is now. Beyond can only mean the stored state is not what the input
            # holds, which recomputing also mends.
            beyond = gone <= before(c.name) if c.kind == "min" else gone >= before(c.name)
            needs_input.append(gone.isNotNull() & (before(c.name).isNull() | beyond))
    recompute = reduce(lambda a, b: a | b, needs_input) if needs_input else F.lit(False)
    typed = {f.name: f.dataType for f in table_schema.fields}
    judged = joined.select(
        *(F.col(f"`{g}`") for g in spec.groups),
        *(values[c.name].cast(typed[c.name]).alias(c.name) for c in spec.columns),
        recompute.alias(_REDO),
    )
    judged = cache(judged)
    # A group whose last row went has no row; the one group over all rows is always there.
    present = F.col(f"`{spec.rows}`") > 0 if spec.groups else F.lit(True)
    kept = judged.where(~F.col(_REDO) & present).select(*(f"`{n}`" for n in columns))
    outputs = [
        old.withColumn(WEIGHT, F.lit(-1).cast("bigint")),
        kept.withColumn(WEIGHT, F.lit(1).cast("bigint")),
    ]
    redo = judged.where(F.col(_REDO))
    if not redo.isEmpty():
        # The groups that lost an extreme: the aggregate's own query over their input rows after
        # the epoch, read at their keys (RisingWave's MIN/MAX state does the same from its table).
        # Over all rows there is one group, and its key is the whole input (None).
        names = key_names(len(spec.key_groups))
        keys = redo.select(*(F.col(f"`{g}`").alias(k) for g, k in zip(spec.key_groups, names, strict=True)))
        redo_keys = cache(keys) if spec.groups else None
        _, after, read = leaf_states(spark, leaf, redo_keys, deltas, read_state, empty, cache)
        rows_read += read
        recomputed = run({leaf.name: after})
        outputs.append(recomputed.withColumn(WEIGHT, F.lit(1).cast("bigint")))
    return KeyedChange(reduce(lambda a, b: a.unionByName(b), outputs), rows_read, cached)
