"""Runs a keyed plan for one epoch: the view's change at the keys the epoch touched.

    K      = the keys of every leaf, evaluated over the inputs' change (inserts and deletes alike)
    before = the view's query over each leaf's state before the epoch, restricted to K
    after  = the same over the state after the epoch (the state before plus the restricted change)
    change = after - before, as unit changes

A plan of inner joins only uses the delta rule instead: the sum over the leaves that changed of the
query with that leaf replaced by its change and the others by their state at K.

No table is collected to the driver: K is a cached Spark DataFrame, broadcast to the executors (its
size follows the epoch's change, bounded by max.events.per.epoch, never the table's), and the
restriction is a left-semi join with it, applied where the state is read when the leaf is a
whole table, so that snapshots laid out by vnode are read only at the vnodes of K.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

from epochal.incremental.binding import sql_over
from epochal.incremental.plan import Leaf, Plan
from epochal.storage.changes import net_rows, signed_parts
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("epochal.incremental")

#: Reads a table's state inside an epoch: (table, inclusive, restriction or None) -> (rows, rows read).
StateReader = Callable[[str, bool, "tuple[tuple[str, ...], DataFrame] | None"], "tuple[DataFrame | None, int]"]
#: Reads the view's own rows before the epoch, at a restriction (its columns, the keys) or all of
#: them for None -> the rows.
StoredReader = Callable[["tuple[tuple[str, ...], DataFrame] | None"], "DataFrame | None"]


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


def key_names(width: int) -> list[str]:
    return [f"_epochal_k{i}" for i in range(width)]


def affected_keys(spark: SparkSession, plan: Plan, deltas: Mapping[str, DataFrame]) -> DataFrame | None:
    """The distinct keys the epoch's change touches, over every leaf; None for a one-partition plan."""
    width = len(plan.key_classes)
    if width == 0:
        return None
    names = key_names(width)
    changes = {u: d.drop(WEIGHT) for u, d in deltas.items()}
    parts = []
    for leaf in plan.leaves:
        keys = ", ".join(f"{expr} AS {name}" for expr, name in zip(leaf.key, names, strict=True))
        # VALUES: constant rows, in no epoch's change (typed like its keys, for the union)
        unchanged = "" if leaf.upstreams else " WHERE false"
        parts.append(sql_over(spark, f"SELECT {keys} FROM ({leaf.sql}) AS _leaf{unchanged}", changes))
    return reduce(lambda a, b: a.unionByName(b), parts).distinct()


def _restrict(state: DataFrame, leaf: Leaf, keys: DataFrame | None) -> DataFrame:
    from pyspark.sql import functions as F

    if keys is None:
        return state
    names = key_names(len(leaf.key))
    condition = reduce(
        lambda a, b: a & b, [F.expr(expr).eqNullSafe(keys[name]) for expr, name in zip(leaf.key, names, strict=True)]
    )
    # Broadcast: without the hint Spark may plan a sort-merge join and shuffle the whole state
    # before adaptive execution notices K is small. K grows with the epoch's change (bounded by
    # max.events.per.epoch), never with the table.
    return state.join(F.broadcast(keys), on=condition, how="left_semi")


def _keys_as(keys: DataFrame, columns: list[str]) -> tuple[tuple[str, ...], DataFrame]:
    """A restriction by ``columns``, the i-th equal to key class i of ``keys``: one column each
    (two key classes may meet in one column, and restricting by either is enough)."""
    first: dict[str, str] = {}
    for column, key_name in zip(columns, key_names(len(columns)), strict=True):
        first.setdefault(column, key_name)
    return tuple(first), keys.select(*(keys[key_name].alias(name) for name, key_name in first.items()))


def leaf_states(
    spark: SparkSession,
    leaf: Leaf,
    keys: DataFrame | None,
    deltas: Mapping[str, DataFrame],
    read_state: StateReader,
    empty: Mapping[str, DataFrame],
    cache: Callable[[DataFrame], DataFrame],
) -> tuple[DataFrame, DataFrame, int]:
    """The leaf's rows at ``keys`` (all of them for None) before and after the epoch, and the
    stored rows read for them. ``empty``: an empty frame per upstream; ``cache`` persists a frame
    read more than once and releases it with the step."""
    from pyspark.sql import functions as F

    if leaf.table is not None and keys is not None:
        # A whole table restricted by its own columns: read its state before the epoch once, at
        # the keys' vnodes, and add the epoch's (restricted) change for the state after it.
        # One column per restricted column: two key classes may meet in one column of a leaf,
        # and restricting by either is enough (a coarser restriction only adds whole partitions
        # that are the same before and after the epoch, so they cancel in the diff).
        state, read = read_state(leaf.table, False, _keys_as(keys, [expr.strip("`") for expr in leaf.key]))
        old = cache(state) if state is not None else empty[leaf.table]
        change = _restrict(deltas[leaf.table], leaf, keys)
        new = net_rows(old.withColumn(WEIGHT, F.lit(1).cast("bigint")).unionByName(change))
        return old, new, read
    sides = []
    read = 0
    for inclusive in (False, True):
        upstream_states = {}
        for upstream in leaf.upstreams:
            state, rows = read_state(upstream, inclusive, None)
            read += rows
            upstream_states[upstream] = state if state is not None else empty[upstream]
        sides.append(_restrict(sql_over(spark, leaf.sql, upstream_states), leaf, keys))
    return sides[0], sides[1], read


def keyed_change(
    spark: SparkSession,
    plan: Plan,
    columns: tuple[str, ...],
    deltas: Mapping[str, DataFrame],
    read_state: StateReader,
    changed: frozenset[str] | None = None,
    first: bool = False,
    dry_run: bool = False,
    stored: StoredReader | None = None,
    view: str = "",
) -> KeyedChange:
    """The view's change for the epoch. ``changed``: the upstreams whose change is not empty
    (default: all); the delta rule skips the terms of the others, and never reads their state.
    ``first``: the view has no earlier epoch, so nothing is retracted. ``dry_run``: persist
    nothing (the load-time analysis of the plan, :mod:`epochal.incremental.analysis`, only builds
    the frames). ``stored``: the view's own rows, which a recompute retracts where it can (see
    :func:`_retraction`). ``view``: its name, for the log."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    cached: list[DataFrame] = []
    rows_read = 0
    changed = frozenset(deltas) if changed is None else changed

    def cache(frame: DataFrame) -> DataFrame:
        if dry_run:
            return frame
        # read by more than one query of the step: computed once (spills to disk rather than grow memory)
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return cached[-1]

    # A VALUES leaf's rows are in no change, so the keys would miss those that only they reach
    # (a LEFT JOIN's unmatched rows, a UNION ALL branch): the first epoch computes them all.
    constant = first and any(not leaf.upstreams for leaf in plan.leaves)
    keys = None if constant else affected_keys(spark, plan, deltas)
    recompute = plan.rule == "recompute" and not first
    if keys is not None and recompute and _needs_whole_retraction(plan, view, columns, stored):
        keys = None  # recomputed whole, so that every stored row can be retracted as it is
    if keys is not None:
        keys = cache(keys)
    empty = {u: spark.createDataFrame([], d.drop(WEIGHT).schema) for u, d in deltas.items()}
    states: dict[str, tuple[DataFrame, DataFrame]] = {}

    def state_of(leaf: Leaf) -> tuple[DataFrame, DataFrame]:
        """The leaf's rows at the affected keys, before and after the epoch (read on first use)."""
        nonlocal rows_read
        if leaf.name not in states:
            old, new, read = leaf_states(spark, leaf, keys, deltas, read_state, empty, cache)
            rows_read += read
            states[leaf.name] = (old, new)
        return states[leaf.name]

    def run(bindings: Mapping[str, DataFrame], sign: int) -> DataFrame:
        out = sql_over(spark, plan.query, bindings).toDF(*columns)
        return out.withColumn(WEIGHT, F.lit(sign).cast("bigint"))

    outputs: list[DataFrame] = []
    if plan.rule == "delta join":
        # Inner joins are bilinear: the change of L1 ⋈ ... ⋈ Ln is the sum over i of the join with
        # Li replaced by its change, the leaves before it at their new state and those after at
        # their old one. A term whose leaf did not change is zero: its inputs' state is never read.
        for i, leaf in enumerate(plan.leaves):
            if not changed.intersection(leaf.upstreams):
                continue
            others = {other.name: state_of(other)[1 if j < i else 0] for j, other in enumerate(plan.leaves) if j != i}
            for sign, rows in signed_parts(deltas):
                part = sql_over(spark, leaf.sql, rows)
                outputs.append(run({**others, leaf.name: part}, sign))
    else:
        if not first:
            retracted = _retraction(plan, columns, keys, stored)
            if retracted is None:
                retracted = run({leaf.name: state_of(leaf)[0] for leaf in plan.leaves}, -1)
            outputs.append(retracted)
        outputs.append(run({leaf.name: state_of(leaf)[1] for leaf in plan.leaves}, 1))
    if not outputs:  # no input changed: the (empty) change, with the view's columns
        nothing = {leaf.name: sql_over(spark, leaf.sql, empty) for leaf in plan.leaves}
        outputs.append(run(nothing, 1))
    return KeyedChange(reduce(lambda a, b: a.unionByName(b), outputs), rows_read, cached)


#: Per (view, query, columns): whether it is recomputed whole (found once per process from the
#: view's stored types, and logged once when it is).
_whole: dict[tuple[str, str, tuple[str, ...]], bool] = {}


def _needs_whole_retraction(plan: Plan, view: str, columns: tuple[str, ...], stored: StoredReader | None) -> bool:
    """Whether a keyed recompute must run over the whole view: its output does not select its key
    (so its stored rows at K cannot be found, see :func:`_retraction`) and holds floating point,
    whose recomputed old value may miss the stored one in the last bit. Integer, decimal and text
    outputs recompute exactly, so they stay keyed."""
    if stored is None or (plan.output_keys and len(plan.output_keys) == len(plan.key_classes)):
        return False
    known = _whole.get((view, plan.query, columns))
    if known is not None:
        return known
    rows = stored(None)
    if rows is None:
        return False
    inexact = [f.name for f in rows.schema.fields if any(t in f.dataType.simpleString() for t in ("double", "float"))]
    _whole[(view, plan.query, columns)] = bool(inexact)
    if inexact:
        log.warning(
            "view %s is recomputed whole every epoch: it does not select its key (%s), and its floating-point "
            "columns %s could only be retracted at the changed keys by recomputing them, which can miss the "
            "stored value in the last bit. Select the key columns to make its epochs read only the keys they change.",
            view or "(unnamed)",
            ", ".join(plan.key_classes),
            inexact,
        )
    return bool(inexact)


def _retraction(
    plan: Plan, columns: tuple[str, ...], keys: DataFrame | None, stored: StoredReader | None
) -> DataFrame | None:
    """The rows a recompute retracts, read from the view itself: None when it cannot (no reader,
    or a keyed plan whose output does not select its keys), and the query before the epoch is run
    again instead.

    Why not always run the query again: a SUM or AVG of floating point adds in whatever order Spark
    reads the rows, so the same rows can give a value that differs from the stored one in the last
    bit. A retraction that misses the stored row leaves it in the view for good (and adds a row
    with the negative weight). The stored rows are exactly what the view holds, so retracting them
    is exact; they are the query before the epoch at K because the view is, by its invariant."""
    from pyspark.sql import functions as F

    if stored is None:
        return None
    if keys is None:  # one partition: the whole view is recomputed, so all of it is retracted
        rows = stored(None)
    elif plan.output_keys and len(plan.output_keys) == len(plan.key_classes):
        rows = stored(_keys_as(keys, [columns[position] for position in plan.output_keys]))
    else:
        return None
    if rows is None:
        return None
    return rows.select(*(F.col(f"`{c}`") for c in columns)).withColumn(WEIGHT, F.lit(-1).cast("bigint"))
