"""The partial aggregate's epoch on the driver (epochal/driver/partial.py) against Spark's
(epochal/incremental/partial.py): the same plan, the same random changes (inserts, updates, deletes,
NULLs, ties, few kept MIN/MAX values), the state each one builds compared after every epoch. Where
the driver declines (a group whose kept values all went, a floating-point sum losing a value) the
system computes the epoch with Spark, and so does this test, for both states."""

from __future__ import annotations

import random
from collections import Counter

import duckdb
import pyarrow as pa
import pytest

from epochal.driver.partial import partial_change_on_driver
from epochal.driver.tables import NotOnDriver, arrow_schema
from epochal.incremental.binding import sql_over
from epochal.incremental.partial import partial_change
from epochal.storage.state_reader import semi_join
from epochal.storage.warehouse import WEIGHT
from tests.incremental.test_incremental_planner import plan

T_COLUMNS = ["id", "k", "v", "d", "s"]
T_SCHEMA = "id BIGINT, k BIGINT, v BIGINT, d DOUBLE, s STRING"
#: the canonical partial form: every SUM/MIN/MAX beside the COUNT of its argument; a FILTER too
STAGE = (
    "SELECT t.k AS k, COUNT(*) AS n, COUNT(t.v) AS cv, SUM(t.v) AS sv, MIN(t.v) AS lo, MAX(t.v) AS hi, "
    "COUNT(t.d) AS cd, SUM(t.d) AS sd, MAX(t.d) AS hd, COUNT(t.s) AS cs, MIN(t.s) AS ls, "
    "COUNT(t.v) FILTER (WHERE t.s <> 'b') AS fc, SUM(t.v) FILTER (WHERE t.s <> 'b') AS fs FROM t AS t GROUP BY t.k"
)
OVER_ALL = "SELECT COUNT(*) AS n, COUNT(t.v) AS cv, SUM(t.v) AS sv, MIN(t.v) AS lo, MAX(t.v) AS hi FROM t AS t"


def _random_epoch(rng: random.Random, rows: dict[int, tuple]) -> list[tuple]:
    """A change of t: upserts and deletes of random ids, as unit rows with weights."""
    change = []
    for _ in range(rng.randint(1, 7)):
        i = rng.randrange(12)
        if i in rows:
            change.append((*rows.pop(i), -1))
        if rng.random() < 0.7:
            row = (
                i,
                rng.randrange(3),
                rng.choice([None, 1, 2, 2, 3, 5, 8]),
                rng.choice([None, 0.5, 1.25, -0.0, 0.0, 3.0]),
                rng.choice([None, "a", "b", "é", "z"]),
            )
            rows[i] = row
            change.append((*row, 1))
    return change


@pytest.mark.parametrize("query", [STAGE, OVER_ALL], ids=["grouped", "over-all-rows"])
def test_the_driver_s_partial_aggregate_builds_spark_s_state(spark, query: str) -> None:
    planned = plan(query, {"t": T_COLUMNS}, internal=True, min_max_cache=2).plan
    spec, leaf = planned.aggregate, planned.leaves[0]
    empty = spark.createDataFrame([], T_SCHEMA)
    declared = sql_over(spark, query, {"t": empty}).schema
    from pyspark.sql.types import ArrayType, StructField, StructType

    typed = {f.name: f.dataType for f in declared.fields}
    stored = StructType(
        [*declared.fields, *(StructField(c.cache, ArrayType(typed[c.name])) for c in spec.columns if c.cache)]
    )
    names = stored.fieldNames()
    weighted = f"{T_SCHEMA}, {WEIGHT} BIGINT"
    answered = declined = rebuilt = 0
    for seed in range(2):
        rng = random.Random(seed)
        t_rows: dict[int, tuple] = {}
        spark_state: Counter = Counter()
        driver_state: Counter = Counter()
        for _ in range(6):
            before = list(t_rows.values())
            change = _random_epoch(rng, t_rows)
            delta = spark.createDataFrame(change, weighted)

            def read(table, inclusive, restrict, state=spark_state, before=before):
                if table == "t":  # a group Spark rebuilds from its input, read before the epoch
                    frame = spark.createDataFrame(before, T_SCHEMA)
                    return (frame if restrict is None else semi_join(frame, restrict)), len(before)
                frame = spark.createDataFrame(_rows(state), stored)
                return (frame if restrict is None else semi_join(frame, restrict)), sum(state.values())

            expected = partial_change(spark, planned, "p", tuple(declared.fieldNames()), {"t": delta}, read, declared)
            spark_change = [tuple(r) for r in expected.weighted.collect()]
            expected.release()
            _apply(spark_state, spark_change, names)
            rows = pa.concat_tables([_aggregated(spark, spec, leaf, delta, sign) for sign in (1, -1)])

            def read_groups(columns, keys, state=driver_state):
                table = pa.Table.from_pylist(
                    [dict(zip(names, r, strict=True)) for r in _rows(state)], schema=arrow_schema(stored)
                )
                if keys is None:
                    return table, table.num_rows
                wanted = {tuple(r.values()) for r in keys.to_pylist()}
                found = [tuple(r[c] for c in columns) in wanted for r in table.to_pylist()]
                return table.filter(pa.array(found, pa.bool_())), table.num_rows

            after = list(t_rows.values())

            def read_input(groups, after=after):
                """The rows the aggregate takes of t after the epoch, at the groups to rebuild."""
                nonlocal rebuilt
                rebuilt += 1
                frame = sql_over(spark, leaf.sql, {"t": spark.createDataFrame(after, T_SCHEMA)})
                taken = sql_over(spark, spec.rows_sql, {leaf.name: frame}).toArrow()
                wanted = {tuple(r.values()) for r in groups.to_pylist()}
                keep = [tuple(r[g] for g in spec.groups) in wanted for r in taken.to_pylist()]
                return taken.filter(pa.array(keep, pa.bool_())), len(after)

            try:
                with duckdb.connect() as con:
                    change_rows, _ = partial_change_on_driver(con, spec, rows, read_groups, stored, read_input)
                answered += 1
                _apply(driver_state, [tuple(r.values()) for r in change_rows.to_pylist()], names)
            except NotOnDriver:
                declined += 1
                _apply(driver_state, spark_change, names)
            assert _normal(driver_state) == _normal(spark_state), (seed, change)
    # every epoch on the driver; over groups, some lost all their kept values or a float summand
    # and were rebuilt from their input rows (over all rows, the whole input: Spark's to read)
    if query == STAGE:
        assert declined == 0 and rebuilt > 0, (answered, declined, rebuilt)
    else:
        assert answered > 5, (answered, declined)


def _aggregated(spark, spec, leaf, delta, sign: int) -> pa.Table:
    """rows_sql over the change's rows of one sign, with the weight: what the driver step feeds in."""
    from pyspark.sql import functions as F

    part = delta.where(F.col(WEIGHT) > 0 if sign > 0 else F.col(WEIGHT) < 0).drop(WEIGHT)
    rows = sql_over(spark, spec.rows_sql, {leaf.name: sql_over(spark, leaf.sql, {"t": part})})
    return rows.withColumn(WEIGHT, F.lit(sign).cast("bigint")).toArrow()


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def _apply(state: Counter, change: list[tuple], names: list[str]) -> None:
    for row in change:
        state[tuple(_frozen(v) for v in row[: len(names)])] += row[len(names)]
    for row in [r for r, n in state.items() if n == 0]:
        del state[row]
    if any(n < 0 for n in state.values()):
        raise AssertionError(f"a change retracted a row the state did not hold: {state}")


def _rows(state: Counter) -> list[tuple]:
    return [tuple(list(v) if isinstance(v, tuple) else v for v in row) for row, n in state.items() for _ in range(n)]


def _normal(state: Counter) -> Counter:
    """Floating point sums may add in another order: compared to 9 digits, as the oracle does."""

    def value(v):
        if isinstance(v, float):
            return round(v, 9) + 0.0  # -0.0 is 0.0
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v

    return Counter({tuple(value(v) for v in row): n for row, n in state.items()})
