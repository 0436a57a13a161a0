"""Runs a partial-aggregate plan for one epoch: the groups' stored rows plus the epoch's change.

A partial aggregate's table holds, per group, COUNT(*) and COUNT/SUM/MIN/MAX of its arguments
(:class:`epochal.incremental.planner.PartialAggregate`), and for each MIN/MAX the group's best
values kept in a hidden column (:attr:`PartialColumn.cache`). For the groups an epoch touches:

    d      = the change's rows, aggregated per group with their weights (+1 insert, -1 delete)
    old    = the table's rows at those groups (the view's own state, read at their vnodes)
    new    = old + d:  counts and exact sums add; a MIN/MAX's kept values lose the deleted ones
             and take the inserted ones better than their last; a group whose COUNT(*) reaches
             0 has no row
    change = new - old

COUNT and SUM over exact types (integers, decimals) are invertible, so a delete is a subtraction.
MIN and MAX are not, which is why they keep values: the kept values are always the group's best
ones in order (a prefix of its sorted values), so while any is left the first is the extreme.
Only a group whose kept values all went, with values left in the input, is rebuilt from its
input (read at the group's key, as the recompute rule does); so is a SUM over floating point
that loses a value, because subtraction leaves rounding error behind that no later epoch removes
(1e16 + 1 - 1e16 is 0 in doubles). Everything else reads only the view's own rows of the touched
groups: a change of n rows reads at most n groups, never the input table.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING

from epochal.errors import require
from epochal.incremental.binding import sql_over
from epochal.incremental.keyed import KeyedChange, StateReader, key_names, leaf_states
from epochal.incremental.plan import PartialAggregate, PartialColumn, Plan
from epochal.sql import quote
from epochal.storage.changes import signed_parts
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

_OLD = "_old_"
_DELTA = "_delta_"
_GONE = "_gone_"  # an inexact sum's "a value was deleted" flag
_IN = "_in_"  # a MIN/MAX's best inserted values (at most min_max_cache of them, unordered)
_OUT = "_out_"  # ... and its best deleted values
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
    declared: StructType,
    dry_run: bool = False,
    inserts_only: bool = False,
) -> KeyedChange:
    """The change of partial-aggregate ``table`` for the epoch (``plan.rule`` is PARTIAL_RULE).
    ``columns`` are the table's query's, typed as ``declared`` (the query's schema); the change
    also carries the hidden kept values. ``dry_run``: build every frame, the rebuild of groups
    from their input included, without asking Spark anything (whether a group needs the rebuild
    is a Spark job) and without persisting: the load-time analysis of the plan
    (:mod:`epochal.incremental.analysis`). ``inserts_only``: the deltas are known to delete
    nothing (their files' statistics), so no kept value goes, no sum loses one and no group
    needs its input: that question, a Spark job, is not asked."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    spec = plan.aggregate
    require(spec is not None and len(plan.leaves) == 1, "a partial aggregate reads one input")
    leaf = plan.leaves[0]
    cached: list[DataFrame] = []

    def cache(frame: DataFrame) -> DataFrame:
        if dry_run:
            return frame
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return cached[-1]

    # The change's rows as the aggregate sees them (WHERE applied, arguments and FILTER evaluated),
    # with their weights: the leaf and rows_sql are linear, so each sign is evaluated on its own.
    signed = []
    for sign, rows in signed_parts(deltas):
        leaf_rows = sql_over(spark, leaf.sql, rows)
        signed.append(_aggregated_rows(spark, spec, leaf.name, leaf_rows, sign))
    rows = signed[0].unionByName(signed[1])
    typed = {f.name: f.dataType for f in declared.fields}
    for c in spec.columns:
        if c.cache:
            typed[c.cache] = ArrayType(typed[c.name])
    stored = (*columns, *spec.hidden)
    exact = {c.name: c.kind == "sum" and _exact(rows.schema[c.argument].dataType) for c in spec.columns}

    delta = cache(_per_group(spec, rows, exact, inserts_only=inserts_only))
    # The table's own rows at the touched groups: distributed by its groups, so read at their vnodes.
    # An aggregate over all rows has one group and one row (a COUNT of 0 included), read whole.
    touched = (spec.groups, delta.select(*(quote(g) for g in spec.groups))) if spec.groups else None
    state, rows_read = read_state(table, False, touched)
    old = cache(_with_hidden(state, spec, typed))
    judged = cache(_merged(spec, delta, old, exact, typed))
    # A group whose last row went has no row; the one group over all rows is always there.
    present = F.col(quote(spec.rows)) > 0 if spec.groups else F.lit(True)
    kept = judged.where(~F.col(_REDO) & present).select(*(quote(n) for n in stored))
    outputs = [
        old.withColumn(WEIGHT, F.lit(-1).cast("bigint")),
        kept.withColumn(WEIGHT, F.lit(1).cast("bigint")),
    ]
    redo = judged.where(F.col(_REDO))
    # Only a MIN/MAX or an inexact sum can need its group's input (``_merged``): without one the
    # flag is the constant False, and asking Spark whether any group has it is a job for nothing.
    can_redo = not inserts_only and any(
        c.kind in ("min", "max") or (c.kind == "sum" and not exact[c.name]) for c in spec.columns
    )
    if dry_run or (can_redo and not redo.isEmpty()):
        # The groups whose kept MIN/MAX values all went (or whose float sum lost a value): rebuilt
        # from their input rows after the epoch, read at their keys, as if every row were inserted
        # into an empty group. Over all rows there is one group, and its key is the whole input.
        names = key_names(len(spec.key_groups))
        keys = redo.select(*(F.col(quote(g)).alias(k) for g, k in zip(spec.key_groups, names, strict=True)))
        redo_keys = cache(keys) if spec.groups else None
        empty = {u: spark.createDataFrame([], d.drop(WEIGHT).schema) for u, d in deltas.items()}
        _, after, read = leaf_states(spark, leaf, redo_keys, deltas, read_state, empty, cache)
        rows_read += read
        inserted = _aggregated_rows(spark, spec, leaf.name, after, 1)
        rebuilt = _new_groups(spec, _per_group(spec, inserted, exact, inserts_only=True), typed)
        rebuilt = rebuilt.where(present).select(*(quote(n) for n in stored))
        outputs.append(rebuilt.withColumn(WEIGHT, F.lit(1).cast("bigint")))
    return KeyedChange(reduce(lambda a, b: a.unionByName(b), outputs), rows_read, cached)


def partial_inserts(
    spark: SparkSession,
    plan: Plan,
    columns: tuple[str, ...],
    inputs: Mapping[str, DataFrame],
    declared: StructType,
    append_only: bool = False,
) -> DataFrame:
    """The stored rows of partial-aggregate ``plan`` over ``inputs`` when every row is an insert
    into an empty table (a backfill's snapshot): one aggregation per group. Nothing is deleted, so
    nothing is read back, netted, persisted or rebuilt, and the input is scanned once.

    ``append_only``: the input is not expected to delete, so each MIN/MAX keeps only its best
    value. One value is a prefix of the group's sorted values like any other, so the state stays
    exact; what it saves is the bounded heap per group, which Spark can only sort-aggregate
    (a sort of the whole input), for a plain MIN/MAX it hash-aggregates. Should a delete of that
    value come after all, the group is reread from its input, as when kept values run out."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    spec = plan.aggregate
    require(spec is not None and len(plan.leaves) == 1, "a partial aggregate reads one input")
    leaf = plan.leaves[0]
    rows = _aggregated_rows(spark, spec, leaf.name, sql_over(spark, leaf.sql, inputs), 1)
    typed = {f.name: f.dataType for f in declared.fields}
    for c in spec.columns:
        if c.cache:
            typed[c.cache] = ArrayType(typed[c.name])
    exact = {c.name: c.kind == "sum" and _exact(rows.schema[c.argument].dataType) for c in spec.columns}
    delta = _per_group(spec, rows, exact, inserts_only=True, best_only=append_only)
    present = F.col(quote(spec.rows)) > 0 if spec.groups else F.lit(True)
    return _new_groups(spec, delta, typed).where(present).select(*(quote(n) for n in (*columns, *spec.hidden)))


def _new_groups(spec: PartialAggregate, delta: DataFrame, typed: Mapping[str, DataType]) -> DataFrame:
    """The stored rows of groups that were empty before ``delta`` (inserts only): what ``_merged``
    computes against no old rows, without its join with them (a shuffle and a sort of every group
    for nothing) or its kept-values merge (lambdas Spark interprets row by row): the kept values
    are the best inserted ones, sorted."""
    from pyspark.sql import functions as F

    # counts first: a SUM is NULL where its argument's count is 0, and that count is one of them
    counts = {
        c.name: F.coalesce(F.col(quote(_DELTA + c.name)), F.lit(0)).cast(typed[c.name])
        for c in spec.columns
        if c.kind == "count"
    }
    caches = {
        c.cache: F.slice(
            F.sort_array(F.coalesce(F.col(quote(_IN + c.name)), F.array()), asc=c.kind == "min"),
            1,
            spec.min_max_cache,
        ).cast(typed[c.cache])
        for c in spec.columns
        if c.cache
    }
    rows = delta.withColumns({**counts, **caches})
    values: dict[str, Column] = {name: F.col(quote(name)) for name in counts}
    for c in spec.columns:
        if c.kind == "sum":
            values[c.name] = F.when(F.col(quote(c.nonnull)) > 0, F.col(quote(_DELTA + c.name)))
        elif c.kind in ("min", "max"):
            require(c.cache, "a MIN/MAX of a partial aggregate keeps its values")
            values[c.name] = F.try_element_at(F.col(quote(c.cache)), F.lit(1))
    return rows.select(
        *(F.col(quote(g)) for g in spec.groups),
        *(values[c.name].cast(typed[c.name]).alias(c.name) for c in spec.columns),
        *(F.col(quote(h)) for h in spec.hidden),
    )


def _aggregated_rows(spark: SparkSession, spec: PartialAggregate, leaf: str, rows: DataFrame, sign: int) -> DataFrame:
    """rows_sql over ``rows`` (the leaf named ``leaf``), each row weighted ``sign``."""
    from pyspark.sql import functions as F

    return sql_over(spark, spec.rows_sql, {leaf: rows}).withColumn(WEIGHT, F.lit(sign).cast("bigint"))


def _counted(column: PartialColumn) -> Column:
    """The rows the aggregate takes: FILTER true and (but for COUNT(*)) the argument not NULL."""
    from pyspark.sql import functions as F

    keep = F.col(quote(column.condition)) if column.condition else F.lit(True)
    return keep & F.col(quote(column.argument)).isNotNull() if column.argument else keep


def _per_group(
    spec: PartialAggregate,
    rows: DataFrame,
    exact: Mapping[str, bool],
    inserts_only: bool = False,
    best_only: bool = False,
) -> DataFrame:
    """The change aggregated per group: weighted counts and exact sums, an inexact sum's inserted
    total and whether it lost a value, and per MIN/MAX its best inserted and deleted values (at
    most min_max_cache of each: no more can enter the kept values, or match one of them).
    ``inserts_only``: the rows are all inserts, so what was deleted is known to be nothing.
    ``best_only`` (with ``inserts_only``, into empty groups): a MIN/MAX's best inserted value alone."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    w = F.col(WEIGHT)
    groups = [F.col(quote(g)) for g in spec.groups]
    aggregations = []
    for c in spec.columns:
        if c.kind == "count":
            aggregations.append(F.sum(F.when(_counted(c), w).otherwise(0)).alias(_DELTA + c.name))
        elif c.kind == "sum" and exact[c.name]:
            # Negated rather than multiplied by the weight: a decimal times a BIGINT widens the
            # type, and past 38 digits Spark drops scale, which would round the sum.
            signed_value = F.when(w > 0, F.col(quote(c.argument))).otherwise(-F.col(quote(c.argument)))
            aggregations.append(F.sum(F.when(_counted(c), signed_value)).alias(_DELTA + c.name))
        elif c.kind == "sum":
            aggregations.append(F.sum(F.when(_counted(c) & (w > 0), F.col(quote(c.argument)))).alias(_DELTA + c.name))
            gone = F.lit(False) if inserts_only else F.max(_counted(c) & (w < 0))
            aggregations.append(gone.alias(_GONE + c.name))
        else:
            # min_by/max_by with k keep a bounded heap per group (no sort of the change, and a
            # bulk load aggregates partially before its shuffle); rows whose ordering value is
            # NULL (not counted, or the other sign) are not taken.
            value = F.col(quote(c.argument))
            if best_only:
                require(inserts_only, "a MIN/MAX's best value alone is kept only for groups that were empty")
                extreme = (F.min if c.kind == "min" else F.max)(F.when(_counted(c), value))
                aggregations.append(F.when(extreme.isNotNull(), F.array(extreme)).alias(_IN + c.name))
                dtype = rows.schema[c.argument].dataType
                aggregations.append(F.lit(None).cast(ArrayType(dtype)).alias(_OUT + c.name))
                continue
            best = F.min_by if c.kind == "min" else F.max_by
            for label, sign in ((_IN, w > 0), (_OUT, w < 0)):
                if label == _OUT and inserts_only:
                    dtype = rows.schema[c.argument].dataType
                    aggregations.append(F.lit(None).cast(ArrayType(dtype)).alias(label + c.name))
                    continue
                taken = F.when(_counted(c) & sign, value)
                aggregations.append(best(taken, taken, spec.min_max_cache).alias(label + c.name))
    return rows.groupBy(*groups).agg(*aggregations)


def _with_hidden(state: DataFrame, spec: PartialAggregate, typed: Mapping[str, DataType]) -> DataFrame:
    """The stored rows with every hidden column: a table read before any change file has only its
    query's columns (its rows are none, so nothing is lost)."""
    from pyspark.sql import functions as F

    missing = {c: F.lit(None).cast(typed[c]) for c in spec.hidden if c not in state.columns}
    return state.withColumns(missing) if missing else state


def _kept_values(column: PartialColumn, limit: int, new_count: str) -> str:
    """SQL for a MIN/MAX's kept values after the epoch (best first), from the old ones, the best
    deleted and the best inserted values. ``L`` is the last old kept value: values past it may
    exist in the input unkept, so a delete past it never touched the kept ones and an insert
    past it cannot enter (unless the old kept values were all of the group's)."""
    kept, nonnull = quote(_OLD + column.cache), quote(_OLD + column.nonnull)
    # (a group without deletes or inserts of this column may have NULL for them)
    deleted = f"coalesce({quote(_OUT + column.name)}, array())"
    inserted = f"coalesce({quote(_IN + column.name)}, array())"
    at_most = "<=" if column.kind == "min" else ">="
    ascending = "true" if column.kind == "min" else "false"
    old = f"coalesce({kept}, array())"
    last = f"try_element_at({old}, -1)"
    complete = f"size({old}) >= coalesce({nonnull}, 0)"
    # each delete at or before L removes one equal kept value, if one is left (array_position
    # compares as ordering does: NaN equals NaN, -0.0 equals 0.0)
    removed = (
        f"aggregate(filter({deleted}, d -> d {at_most} {last}), {old}, (acc, d) -> "
        f"CASE WHEN array_position(acc, d) > 0 THEN concat(slice(acc, 1, CAST(array_position(acc, d) - 1 AS INT)), "
        f"slice(acc, CAST(array_position(acc, d) + 1 AS INT), size(acc))) ELSE acc END)"
    )
    entering = f"CASE WHEN {complete} THEN {inserted} ELSE filter({inserted}, x -> x {at_most} {last}) END"
    merged = f"slice(sort_array(concat({removed}, {entering}), {ascending}), 1, {limit})"
    return f"CASE WHEN {quote(new_count)} > 0 THEN {merged} ELSE array() END"


def _merged(
    spec: PartialAggregate,
    delta: DataFrame,
    old: DataFrame,
    exact: Mapping[str, bool],
    typed: Mapping[str, DataType],
) -> DataFrame:
    """Per touched group: the new row (groups, the query's columns, the kept values) and whether
    it must be rebuilt from the input instead (``_REDO``)."""
    from pyspark.sql import functions as F

    prior = old.select(*(F.col(quote(c)).alias(_OLD + c) for c in old.columns))
    same_group = [delta[quote(g)].eqNullSafe(prior[quote(_OLD + g)]) for g in spec.groups]
    joined = delta.join(prior, on=reduce(lambda a, b: a & b, same_group, F.lit(True)), how="left")

    def before(name: str) -> Column:
        return F.col(quote(_OLD + name))

    def added(name: str) -> Column:
        return F.col(quote(_DELTA + name))

    counts = {  # (added is NULL only over all rows, when the change kept no row)
        c.name: (F.coalesce(before(c.name), F.lit(0)) + F.coalesce(added(c.name), F.lit(0))).cast(typed[c.name])
        for c in spec.columns
        if c.kind == "count"
    }
    joined = joined.withColumns(counts)
    caches = {
        c.cache: F.expr(_kept_values(c, spec.min_max_cache, c.nonnull)).cast(typed[c.cache])
        for c in spec.columns
        if c.cache
    }
    joined = joined.withColumns(caches) if caches else joined
    values: dict[str, Column] = {name: F.col(quote(name)) for name in counts}
    needs_input: list[Column] = []
    for c in spec.columns:
        if c.kind == "sum":
            total = F.coalesce(before(c.name), F.lit(0)) + F.coalesce(added(c.name), F.lit(0))
            values[c.name] = F.when(F.col(quote(c.nonnull)) > 0, total)
            if not exact[c.name]:
                needs_input.append(F.coalesce(F.col(quote(_GONE + c.name)), F.lit(False)))
        elif c.kind in ("min", "max"):
            require(c.cache, "a MIN/MAX of a partial aggregate keeps its values")
            kept = F.col(quote(c.cache))
            values[c.name] = F.try_element_at(kept, F.lit(1))
            # The kept values all went while the group still has some: only the input knows them.
            needs_input.append((F.col(quote(c.nonnull)) > 0) & (F.size(kept) == 0))
    recompute = reduce(lambda a, b: a | b, needs_input) if needs_input else F.lit(False)
    return joined.select(
        *(F.col(quote(g)) for g in spec.groups),
        *(values[c.name].cast(typed[c.name]).alias(c.name) for c in spec.columns),
        *(F.col(quote(h)) for h in spec.hidden),
        recompute.alias(_REDO),
    )
