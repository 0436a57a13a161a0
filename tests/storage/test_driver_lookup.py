"""A few keys' rows of a large snapshot looked up by DuckDB on the driver (epochal/storage/driver_lookup.py):
the same rows Spark's semi-join finds, for every type it accepts and either way Spark writes
timestamps; what it cannot answer exactly goes back to Spark; and a keyed pipeline maintained
through it, with compaction between epochs, matches the batch oracle. Real Spark and DuckDB."""

from __future__ import annotations

import datetime
import decimal
import json
import random
from functools import reduce
from pathlib import Path

import pytest

from epochal.storage.driver_lookup import DriverLookup
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch, multiset
from tests.epochal_harness import make_harness
from tests.storage.test_compaction import FILES, VIEWS, records, run_epoch

#: test_compaction's pipeline, and a keyed view that reads the orders' state by customer (not its
#: key): a distinct count, recomputed at the customers an epoch touches
FILES_WITH_KEYED_VIEWS = {
    "pipeline.sql": FILES["pipeline.sql"]
    + """
CREATE MATERIALIZED VIEW amounts AS
SELECT customer, count(DISTINCT amount) AS amounts, max(id) AS last_id FROM orders GROUP BY customer;
"""
}
VIEWS_WITH_KEYED = {
    **VIEWS,
    "amounts": "SELECT customer, count(DISTINCT amount) AS amounts, max(id) AS last_id FROM orders GROUP BY customer",
}

WIDE = (
    "id BIGINT, s STRING, d DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, dec DECIMAL(20,4), f DOUBLE, "
    "b BOOLEAN, bin BINARY, i INT, sh SMALLINT, snapshot INT"
)
#: where a snapshot's files are (warehouse.py): DuckDB must not take the path's keys for columns
SNAPSHOT_DIR = "t/snapshot=1/attempt/_vnode=3"


def wide_rows(n: int) -> list[tuple]:
    utc = datetime.UTC
    return [
        (
            i if i % 7 else None,  # null keys: a null-safe match, as Spark's restriction is
            f"s{i}" if i % 5 else None,
            datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
            datetime.datetime(2024, 3, 31, 1, 30, tzinfo=utc) + datetime.timedelta(hours=i),
            datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i),
            decimal.Decimal(i) / 7,
            float("nan") if i == 3 else -0.0 if i == 4 else i / 3,
            i % 2 == 0,
            bytes([i % 256]),
            i,
            i % 100,
            i * 10,  # a column named like the path's `snapshot=1`
        )
        for i in range(60)
    ]


def spark_semi_join(snapshot, keys, columns):  # noqa: ANN001, ANN201
    renamed = keys.select(*[keys[c].alias(f"k_{c}") for c in columns])
    condition = reduce(lambda a, b: a & b, [snapshot[c].eqNullSafe(renamed[f"k_{c}"]) for c in columns])
    return snapshot.join(renamed, condition, "left_semi")


@pytest.mark.parametrize("timestamps", ["INT96", "TIMESTAMP_MICROS"])
def test_a_lookup_finds_the_rows_and_values_spark_finds(spark, tmp_path: Path, timestamps: str) -> None:
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(WIDE)
    before = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", timestamps)  # INT96 is Spark's default
    try:
        spark.createDataFrame(wide_rows(60), schema).repartition(3).write.parquet(str(tmp_path / SNAPSHOT_DIR))
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", before)
    files = sorted(str(p) for p in (tmp_path / SNAPSHOT_DIR).glob("*.parquet"))
    snapshot = spark.read.schema(schema).parquet(*files)
    for columns in [("id",), ("s", "d"), ("ntz", "dec"), ("b", "bin", "i", "sh"), ("snapshot",)]:
        keys = snapshot.where("i % 3 = 0").select(*columns).union(snapshot.where("i = 0").select(*columns))
        lookup = DriverLookup(max_rows=1000)
        assert lookup.applies(schema, columns, files), columns
        found = lookup.read(spark, schema, files, columns, keys)
        assert found is not None and lookup.answered == 1, columns
        assert found.schema == schema
        # repr: NaN equals NaN, and -0.0 stays -0.0, only as text
        expected = sorted(map(repr, spark_semi_join(snapshot, keys, columns).collect()))
        assert sorted(map(repr, found.collect())) == expected, columns
        assert len(expected) >= 18  # every third row, nulls included
    # a session in another zone sees the same instants
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        found = DriverLookup(1000).read(spark, schema, files, ("id",), snapshot.select("id"))
        assert sorted(map(repr, found.select("id", "ts").collect())) == sorted(
            map(repr, snapshot.select("id", "ts").collect())
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_what_a_lookup_cannot_answer_exactly_goes_back_to_spark(spark, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from pyspark.sql.types import StructType

    from epochal.storage import driver_lookup

    schema = StructType.fromDDL(WIDE)
    spark.createDataFrame(wide_rows(60), schema).repartition(3).write.parquet(str(tmp_path / "snap"))
    files = sorted(str(p) for p in (tmp_path / "snap").glob("*.parquet"))
    lookup = DriverLookup(max_rows=10)
    # keys whose equality differs (Spark's join makes -0.0 and 0.0 one key), or needs DuckDB's ICU
    assert not lookup.applies(schema, ("f",), files)
    assert not lookup.applies(schema, ("ts",), files)
    assert lookup.applies(schema, ("id",), files)
    # a column whose value would not come back as written, an object store, the lookup off
    nested = StructType.fromDDL("id BIGINT, tags ARRAY<STRING>")
    assert not lookup.applies(nested, ("id",), files)
    assert not lookup.applies(schema, ("id",), ["s3://bucket/t/part-0.parquet"])
    assert not DriverLookup(max_rows=0).applies(schema, ("id",), files)
    # more keys, or more rows found, than it takes
    snapshot = spark.read.schema(schema).parquet(*files)
    assert lookup.read(spark, schema, files, ("id",), snapshot.select("id")) is None
    assert lookup.read(spark, schema, files, ("b",), snapshot.select("b").distinct()) is None  # 2 keys, 60 rows
    assert lookup.declined == 2 and lookup.answered == 0
    # keys that found too many rows in a snapshot are not looked up there again (a join's state read
    # by its join key does so every epoch); too many keys is a matter of the epoch, and is
    assert not lookup.applies(schema, ("b",), files)
    assert lookup.applies(schema, ("id",), files) and lookup.applies(schema, ("b",), files[::-1])
    # a file DuckDB cannot read: Spark reads it
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    assert lookup.read(spark, schema, [str(broken)], ("id",), snapshot.select("id").limit(2)) is None
    assert lookup.declined == 3 and not lookup.applies(schema, ("id",), [str(broken)])
    # rows too wide to hand to Spark as a local relation
    monkeypatch.setattr(driver_lookup, "MAX_FOUND_BYTES", 100)
    assert lookup.read(spark, schema, files, ("id",), snapshot.select("id").limit(5)) is None
    assert lookup.declined == 4
    # no key at all: no rows, without DuckDB
    empty = lookup.read(spark, schema, files, ("id",), snapshot.select("id").limit(0))
    assert empty is not None and empty.count() == 0 and empty.schema == schema


def test_a_keyed_pipeline_looked_up_on_the_driver_matches_the_batch_oracle(spark, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The orders source upserts and deletes by id against its snapshot, and keyed views read the
    orders of the customers an epoch touches, all through DuckDB (the snapshots here are tiny, so
    every size counts as large), with compactions in between."""
    from epochal.storage import driver_lookup, state_cache

    monkeypatch.setattr(driver_lookup, "MIN_SNAPSHOT_ROWS", 0)
    monkeypatch.setattr(state_cache, "SMALL_ROWS", 0)  # else the cached copy of a tiny snapshot serves
    h = make_harness(tmp_path, FILES_WITH_KEYED_VIEWS)
    runtime = h.runtime(spark)
    lookup = runtime.reader.lookup
    rng = random.Random(11)
    produced = [json.dumps({"id": i, "customer": f"c{i % 7}", "amount": float(i % 30)}) for i in range(120)]
    h.produce(produced)
    runtime.compact(run_epoch(runtime), every=1)
    for round_ in range(4):
        lines = records(rng, 25, ids=140)  # updates, deletes and new ids
        h.produce(lines)
        produced += lines
        e = run_epoch(runtime, compact=round_ % 2 == 1)
    # the source's lookups by id, and the keyed views' reads of the orders by customer
    assert lookup.answered >= 8 and lookup.declined == 0, (lookup.answered, lookup.declined)
    # An epoch on Spark (the driver path off) with more records than the lookup takes keys: the
    # source's read by id is left to Spark without collecting its keys to the driver first; the
    # views' reads by customer (7 keys) still come here.
    runtime = h.runtime(spark, {"EPOCHAL_DRIVER_ROWS": "0"})
    lookup = runtime.reader.lookup
    asked: list[tuple[str, ...]] = []
    read = lookup.read

    def noted(spark, schema, files, columns, keys):  # noqa: ANN001, ANN202
        asked.append(columns)
        return read(spark, schema, files, columns, keys)

    monkeypatch.setattr(lookup, "max_rows", 20)
    monkeypatch.setattr(lookup, "read", noted)
    lines = records(rng, 25, ids=140)
    h.produce(lines)
    produced += lines
    e = run_epoch(runtime)
    assert ("id",) not in asked and asked, asked
    assert_views_match_batch(runtime, VIEWS_WITH_KEYED)
    assert_sink_exactly_once(runtime, "large_out")
    # the source's state itself, against its records replayed in order
    latest: dict[int, tuple] = {}
    for line in produced:
        record = json.loads(line)
        if record.get("_op") == "delete":
            latest.pop(record["id"], None)
        else:
            latest[record["id"]] = (record["id"], record["customer"], record["amount"])
    state, _ = runtime.read_state("orders", e, inclusive=True)
    assert multiset(state.collect()) == multiset(latest.values())
