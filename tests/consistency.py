"""Independent checks of a pipeline's committed state.

Views are compared with a batch computation of the same SQL over the committed source rows;
sources with a re-read of every committed offset range straight from the connector; sinks with
the view they deliver. All comparisons are multisets.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import duckdb

from epochal.connectors.base import SplitRange
from epochal.runtime import EpochRuntime


def _normal(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, Decimal):
        return Decimal(value).normalize()
    return value


def multiset(rows: Iterable[Iterable[Any]]) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in rows)


def committed_ranges(runtime: EpochRuntime, source: str) -> list[SplitRange]:
    """Every committed epoch's ranges of ``source``; asserts they tile each split from 0 without gap or overlap."""
    from epochal.controller import EpochState

    ranges: list[SplitRange] = []
    for record in runtime.controller.epochs([EpochState.COMMITTED]):
        ranges += runtime.controller.offsets(record.epoch, source)
    by_split: dict[str, int] = {}
    for r in ranges:
        assert r.start == by_split.get(r.split, 0), f"{source} split {r.split}: gap or overlap at {r.start}"
        by_split[r.split] = r.end
    return [SplitRange(split, 0, end) for split, end in by_split.items()]


def assert_source_exact(runtime: EpochRuntime, source: str) -> int:
    """The committed source equals a fresh read of all committed offsets: nothing lost, nothing doubled."""
    columns = list(runtime.pipeline.sources[source].column_names)
    expected = runtime.connector(source).read(runtime.spark, committed_ranges(runtime, source)).rows
    state = multiset(runtime.state(source).select(*columns).collect())
    assert state == multiset(expected.select(*columns).collect()), f"{source} differs from its committed offsets"
    return sum(state.values())


def batch_view(runtime: EpochRuntime, query: str, reads: list[str] | None = None):  # noqa: ANN201
    """``query`` run as an ordinary Spark batch query over the committed source rows.

    Views it reads (``reads``; default every view) are computed the same way, from the sources up:
    nothing Epochal maintained is read, so the oracle is independent of the machinery it checks."""
    pipeline = runtime.pipeline
    needed: set[str] = set()
    pending = list(pipeline.views if reads is None else reads)
    while pending:  # the views ``query`` depends on, transitively
        name = pending.pop()
        if name in pipeline.views and name not in needed:
            needed.add(name)
            pending.extend(pipeline.views[name].upstreams)
    registered = list(pipeline.sources)
    for source in registered:
        runtime.state(source).createOrReplaceTempView(source)
    try:
        for view in (v for v in pipeline.view_order() if v in needed):
            definition = pipeline.views[view]
            runtime.spark.sql(definition.query).toDF(*definition.columns).createOrReplaceTempView(view)
            registered.append(view)
        return runtime.spark.sql(query).collect()
    finally:
        for name in registered:
            runtime.spark.catalog.dropTempView(name)


def assert_view_matches_batch(runtime: EpochRuntime, view: str, query: str) -> int:
    state = multiset(runtime.state(view).collect())
    expected = multiset(batch_view(runtime, query, reads=list(runtime.pipeline.views[view].upstreams)))
    assert state == expected, f"view {view} differs from the batch query: {len(state)} vs {len(expected)} distinct rows"
    return sum(state.values())


def sink_rows(runtime: EpochRuntime, sink: str) -> Counter:
    s = runtime.sink(sink)
    con = duckdb.connect(str(s.database), read_only=True)
    try:
        cols = ", ".join(f'"{c}"' for c in s.columns)
        return multiset(con.execute(f'SELECT {cols} FROM "{s.table}"').fetchall())
    finally:
        con.close()


def assert_sink_exactly_once(runtime: EpochRuntime, sink: str) -> int:
    """The sink's target holds the view's committed rows exactly once (upsert: once per distinct row)."""
    definition = runtime.pipeline.sinks[sink]
    view_rows = multiset(runtime.state(definition.from_table).collect())
    target = sink_rows(runtime, sink)
    if definition.options.get("type") == "upsert":
        view_rows = Counter(dict.fromkeys(view_rows, 1))
    assert target == view_rows, f"sink {sink}: {sum(target.values())} rows, view has {sum(view_rows.values())}"
    assert runtime.sink(sink).delivered_epoch() == runtime.controller.committed_epoch()
    return sum(target.values())


def frame(spark: Any, rows: list[tuple], ddl: str) -> Any:
    """A DataFrame of ``rows`` built from literals: unlike createDataFrame(list), which scans a
    Python RDD, it needs no Python worker processes, and the property tests build many."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    fields = StructType.fromDDL(ddl).fields
    if not rows:
        return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in fields])
    structs = [
        F.struct(*[F.lit(value).cast(f.dataType).alias(f.name) for value, f in zip(row, fields, strict=True)])
        for row in rows
    ]
    return spark.range(1).select(F.inline(F.array(*structs)))
