"""Runs a keyed plan for one epoch: the view's change at the keys the epoch touched.

    K      = the keys of every leaf, evaluated over the inputs' change (inserts and deletes alike)
    before = the view's query over each leaf's state before the epoch, restricted to K
    after  = the same over the state after the epoch
    change = after - before, as unit changes

Nothing is collected to the driver: K stays a (small, broadcast) Spark DataFrame, and the
restriction is a left-semi join with it, applied where the state is read when the leaf is a
whole table, so that snapshots laid out by vnode are read only at the vnodes of K.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

from epochal.incremental.planner import Leaf, Plan
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Reads a table's state inside an epoch: (table, inclusive, restriction or None) -> (rows, rows read).
StateReader = Callable[[str, bool, "tuple[tuple[str, ...], DataFrame] | None"], "tuple[DataFrame | None, int]"]


@dataclass
class KeyedChange:
    #: the view's change: its columns plus _weight (+1/-1 per row, not yet netted)
    weighted: DataFrame
    #: stored rows read from the inputs' state
    state_rows_read: int
    #: frames cached for the write of ``weighted``: unpersist them once it is written
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


@contextmanager
def _bound(spark: SparkSession, tables: Mapping[str, DataFrame]) -> Iterator[None]:
    """Temp views for the duration of a query's analysis (spark.sql binds them when it is called)."""
    try:
        for name, frame in tables.items():
            frame.createOrReplaceTempView(name)
        yield
    finally:
        for name in tables:
            spark.catalog.dropTempView(name)


def _key_names(width: int) -> list[str]:
    return [f"_epochal_k{i}" for i in range(width)]


def affected_keys(spark: SparkSession, plan: Plan, deltas: Mapping[str, DataFrame]) -> DataFrame | None:
    """The distinct keys the epoch's change touches, over every leaf; None for a one-partition plan."""
    width = len(plan.key_classes)
    if width == 0:
        return None
    names = _key_names(width)
    with _bound(spark, {u: d.drop(WEIGHT) for u, d in deltas.items()}):
        parts = []
        for leaf in plan.leaves:
            keys = ", ".join(f"{expr} AS {name}" for expr, name in zip(leaf.key, names, strict=True))
            parts.append(spark.sql(f"SELECT {keys} FROM ({leaf.sql}) AS _leaf"))
    return reduce(lambda a, b: a.unionByName(b), parts).distinct()


def _restrict(state: DataFrame, leaf: Leaf, keys: DataFrame | None) -> DataFrame:
    from pyspark.sql import functions as F

    if keys is None:
        return state
    names = _key_names(len(leaf.key))
    condition = reduce(
        lambda a, b: a & b, [F.expr(expr).eqNullSafe(keys[name]) for expr, name in zip(leaf.key, names, strict=True)]
    )
    return state.join(F.broadcast(keys), on=condition, how="left_semi")


def keyed_change(
    spark: SparkSession,
    plan: Plan,
    columns: tuple[str, ...],
    deltas: Mapping[str, DataFrame],
    read_state: StateReader,
) -> KeyedChange:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from epochal.runtime import EpochRuntime

    cached: list[DataFrame] = []

    def cache(frame: DataFrame) -> DataFrame:
        # used by both sides of the diff: computed once (spills to disk rather than grow memory)
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return cached[-1]

    keys = affected_keys(spark, plan, deltas)
    if keys is not None:
        keys = cache(keys)
    empty = {u: spark.createDataFrame([], d.drop(WEIGHT).schema) for u, d in deltas.items()}
    rows_read = 0
    before: dict[str, DataFrame] = {}
    after: dict[str, DataFrame] = {}
    for leaf in plan.leaves:
        if leaf.table is not None and keys is not None:
            # A whole table restricted by its own columns: read its state before the epoch once,
            # at the keys' vnodes, and add the epoch's (restricted) change for the state after it.
            columns_ = tuple(k.strip("`") for k in leaf.key)
            state, read = read_state(leaf.table, False, (columns_, keys.toDF(*columns_)))
            rows_read += read
            old = cache(state) if state is not None else empty[leaf.table]
            change = _restrict(deltas[leaf.table], leaf, keys)
            before[leaf.name] = old
            after[leaf.name] = EpochRuntime._net_rows(
                old.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(change)
            )
            continue
        for inclusive, side in ((False, before), (True, after)):
            upstream_states = {}
            for upstream in leaf.upstreams:
                state, read = read_state(upstream, inclusive, None)
                rows_read += read
                upstream_states[upstream] = state if state is not None else empty[upstream]
            with _bound(spark, upstream_states):
                side[leaf.name] = _restrict(spark.sql(leaf.sql), leaf, keys)
    sides = []
    for leaves, sign in ((before, -1), (after, 1)):
        with _bound(spark, leaves):
            out = spark.sql(plan.query).toDF(*columns)
        sides.append(out.withColumn(WEIGHT, F.lit(sign).cast("bigint")))
    return KeyedChange(sides[1].unionByName(sides[0]), rows_read, cached)
