"""Small sink batches written from the run's process (epochal/sinks/driver_writer.py) hold exactly
what Spark's writer tasks would have written: two homes run the same records, one with the driver
path (the default for small batches) and one with EPOCHAL_SINK_DRIVER_ROWS=0, into DuckDB and
PostgreSQL, and the targets are compared with each other and with the records themselves."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from tests.epochal_harness import make_harness
from tests.sinks.test_postgres_sink import database, prepared, sql_rows  # noqa: F401 - the fixture
from tests.storage.test_compaction import run_epoch

PIPELINE = """
CREATE SOURCE orders (id BIGINT, name STRING, price DECIMAL(10, 2), ratio DOUBLE, day DATE, at TIMESTAMP,
                      flag BOOLEAN)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW latest AS
SELECT id, max(name) AS name, sum(price) AS price, max(ratio) AS ratio, max(day) AS day, max(at) AS at,
       bool_or(flag) AS flag, count(*) AS n
FROM orders GROUP BY id;

-- two epochs a batch: a key's old row and its new one meet in one batch, and are netted
CREATE SINK latest_duck FROM latest
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'latest', type = 'upsert', primary_key = 'id',
      commit_checkpoint_interval = '2');

CREATE SINK latest_pg FROM latest
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'latest_{arm}',
      type = 'upsert', primary_key = 'id', commit_checkpoint_interval = '2', writers = '2');

CREATE MATERIALIZED VIEW tagged AS SELECT id, name, array(name, 'x') AS tags FROM orders;

-- an ARRAY column: not a type the driver path reads, so Spark's writers take these batches
CREATE SINK tagged_duck FROM tagged
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'tagged', type = 'append-only');
"""


def records(epoch: int) -> list[dict]:
    out = []
    for j in range(8):
        i = (epoch * 5 + j) % 11  # ids come back in later epochs: the view's rows change
        out.append(
            {
                "id": i,
                "name": None if j == 3 else f"n{i}-{epoch}",
                "price": f"{epoch}.{j:02d}",
                "ratio": None if j == 5 else (-0.0 if j == 6 else (epoch - j) / 7),
                "day": f"2026-11-{1 + (i + epoch) % 28:02d}",
                "at": f"2026-11-27T10:{epoch:02d}:{j:02d}.123456Z",
                "flag": None if j == 2 else j % 2 == 0,
            }
        )
    return out


def duck_rows(home: Path, table: str) -> list[tuple]:
    with duckdb.connect(str(home / "out" / "sink.duckdb"), read_only=True) as con:
        return con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def test_the_driver_path_writes_what_spark_writers_write(spark, tmp_path: Path, database: str) -> None:  # noqa: ANN001, F811
    homes = {}
    for arm, rows in (("driver", "100000"), ("spark", "0")):
        h = make_harness(tmp_path / arm, {"p.sql": PIPELINE.format(db=database, arm=arm)})
        runtime = h.runtime(spark, env={"EPOCHAL_SINK_DRIVER_ROWS": rows})
        for epoch in range(4):
            h.produce([json.dumps(r) for r in records(epoch)])
            run_epoch(runtime)
        homes[arm] = (h.home, runtime.sink_steps.driver_writer)
    (driver_home, driver), (spark_home, by_spark) = homes["driver"], homes["spark"]
    # the upsert sinks' batches (2 each) went through the driver path; the ARRAY sink's 4 did not
    assert (driver.answered, driver.declined) == (4, 4)
    assert (by_spark.answered, by_spark.declined) == (0, 0)

    # the same rows, typed the same, either way
    assert duck_rows(driver_home, "latest") == duck_rows(spark_home, "latest")
    assert duck_rows(driver_home, "tagged") == duck_rows(spark_home, "tagged")
    pg = {arm: sorted(sql_rows(database, f"SELECT * FROM latest_{arm}")) for arm in homes}
    assert pg["driver"] == pg["spark"]
    assert prepared(database) == []

    # and what the records say, computed here
    produced = [r for epoch in range(4) for r in records(epoch)]
    expected: dict[int, dict] = defaultdict(lambda: {"names": [], "price": Decimal(0), "ratios": [], "n": 0})
    for r in produced:
        e = expected[r["id"]]
        e["names"] += [r["name"]] if r["name"] is not None else []
        e["ratios"] += [r["ratio"]] if r["ratio"] is not None else []
        e["price"] += Decimal(r["price"])
        e["n"] += 1
    latest = duck_rows(driver_home, "latest")
    assert [(r[0], r[1], r[2], r[3], r[7]) for r in latest] == [
        (i, max(e["names"], default=None), e["price"], max(e["ratios"], default=None), e["n"])
        for i, e in sorted(expected.items())
    ]
    last_at = max(datetime.fromisoformat(r["at"]) for r in produced)
    assert max(r[5] for r in latest) == last_at.astimezone(UTC)
    assert all(isinstance(r[4], date) for r in latest)
    assert len(duck_rows(driver_home, "tagged")) == len(produced)


def test_a_batch_over_the_limit_goes_to_spark_writers(spark, tmp_path: Path) -> None:  # noqa: ANN001
    pipeline = """
    CREATE SOURCE orders (id BIGINT, amount BIGINT) WITH (connector = 'log', path = 'data/orders', format = 'json');
    CREATE SINK orders_duck FROM orders
    WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'orders', type = 'append-only', writers = '3');
    """
    h = make_harness(tmp_path, {"p.sql": pipeline})
    runtime = h.runtime(spark, env={"EPOCHAL_SINK_DRIVER_ROWS": "10"})
    h.produce([json.dumps({"id": i, "amount": i}) for i in range(10)])
    run_epoch(runtime)
    h.produce([json.dumps({"id": i, "amount": i}) for i in range(10, 21)])  # 11 rows: one too many
    run_epoch(runtime)
    writer = runtime.sink_steps.driver_writer
    assert (writer.answered, writer.declined) == (1, 1)
    first, second = runtime.controller.sink_coordinator.batches("orders_duck")
    assert [r.vnodes for r in first.results] == [(0, 255)]
    assert len(second.results) == 3  # Spark's three writer tasks
    assert duck_rows(h.home, "orders") == [(i, i) for i in range(21)]


@pytest.mark.parametrize("kind", ["append-only", "upsert"])
def test_a_refused_batch_commits_nothing(spark, tmp_path: Path, kind: str) -> None:  # noqa: ANN001
    """The target's own checks hold on the driver path: an append-only sink refuses a retraction,
    and nothing of the batch is committed or left staged."""
    pipeline = f"""
    CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)
    WITH (connector = 'log', path = 'data/orders', format = 'json');
    CREATE MATERIALIZED VIEW totals AS SELECT customer, sum(amount) AS total FROM orders GROUP BY customer;
    CREATE SINK totals_duck FROM totals
    WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'totals', type = '{kind}'
          {", primary_key = 'customer'" if kind == "upsert" else ""});
    """
    h = make_harness(tmp_path, {"p.sql": pipeline})
    runtime = h.runtime(spark)
    h.produce([json.dumps({"id": 1, "customer": "a", "amount": 5})])
    run_epoch(runtime)
    h.produce([json.dumps({"id": 2, "customer": "a", "amount": 7})])  # retracts (a, 5)
    if kind == "append-only":
        with pytest.raises(Exception, match="append-only"):
            run_epoch(runtime)
        assert duck_rows(h.home, "totals") == [("a", 5)]
        assert not list((h.home / "sink-staging").rglob("*.parquet"))
    else:
        run_epoch(runtime)
        assert duck_rows(h.home, "totals") == [("a", 12)]
    assert runtime.sink_steps.driver_writer.answered >= 1


def test_files_this_process_cannot_read_are_left_to_spark(tmp_path: Path) -> None:
    """Change files on an object store, or on a disk only the Spark server sees, are Spark's to read:
    the driver path declines without writing anything, and without failing the sink step."""
    from pyspark.sql.types import LongType, StructField, StructType

    from epochal.sinks.base import BatchId
    from epochal.sinks.driver_writer import DriverWriter
    from epochal.sinks.spec import sink_spec

    options = {"connector": "duckdb", "database": "out/sink.duckdb", "table": "t", "type": "append-only"}
    target = sink_spec("duckdb").create("s", options, ["id"], tmp_path, None)
    schema = StructType([StructField("id", LongType())])
    writer = DriverWriter(100_000)
    batch = BatchId("s", 1, 1, 1, "abcd")
    assert writer.write(target, batch, ["s3://bucket/warehouse/t/part-0.parquet"], schema) is None
    assert writer.write(target, batch, [str(tmp_path / "gone" / "part-0.parquet")], schema) is None
    assert (writer.answered, writer.declined) == (0, 2)
    assert not (tmp_path / "sink-staging").exists()
