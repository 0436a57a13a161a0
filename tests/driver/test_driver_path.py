"""Small epochs computed on the driver (epochal/driver/), end to end: keyed log sources with
timestamps, linear views, partial aggregates (COUNT, SUM over integers and doubles, AVG, MIN/MAX with
few kept values, FILTER, HAVING), inner joins and views on views, each compared after every epoch
with its SQL run as a Spark batch over the committed source rows (tests/consistency.py). The
steps say which engine ran them, and the test holds them to it: a driver path that silently fell
back to Spark would pass the oracle and fail here. Epochs too big for the driver, a malformed
record (dead letters are Spark's) and a compaction run between driver epochs, so files written by
either engine are read by the other."""

from __future__ import annotations

import json
from pathlib import Path

from epochal.connectors.log import append_records
from epochal.storage import mirror
from tests.consistency import assert_source_exact, assert_views_match_batch
from tests.epochal_harness import make_harness

SOURCES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, item STRING, qty BIGINT, price DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE TABLE customers (id BIGINT PRIMARY KEY, region STRING, tier INT)
WITH (connector = 'log', path = 'data/customers', format = 'json');
"""

VIEWS = {
    "big_orders": "SELECT id, cust, qty * 2 AS double_qty, price, ts FROM orders WHERE qty > 1 AND item <> 'x'",
    "per_item": "SELECT item, count(*) AS n, sum(qty) AS q, sum(price) AS revenue, avg(price) AS ap, "
    "min(price) AS lo, max(qty) AS hq, max(ts) AS last_ts, min(item) AS first_item, "
    "count(*) FILTER (WHERE qty > 2) AS big FROM orders GROUP BY item HAVING count(*) >= 1",
    "totals": "SELECT count(*) AS n, sum(qty) AS q FROM orders",
    "enriched": "SELECT o.id, o.price, c.region, c.tier FROM orders o JOIN customers c ON o.cust = c.id",
    "per_region": "SELECT region, count(*) AS n, sum(price) AS total FROM enriched GROUP BY region",
}
#: views the driver computes, with their internal stages: every step of these must say so
ON_DRIVER = {
    "big_orders",
    "per_item",
    "per_item__stage1",
    "totals",
    "totals__stage1",
    "enriched",
    "per_region",
    "per_region__stage1",
}


def order(
    i: int, cust: int = 1, item: str = "a", qty: int = 1, price: float = 1.0, minute: int = 0, op: str | None = None
) -> str:
    body: dict = {"id": i}
    if op != "delete":
        body.update(cust=cust, item=item, qty=qty, price=price, ts=f"2026-01-01T10:{minute:02d}:00.5Z")
    if op:
        body["_op"] = op
    return json.dumps(body)


def customer(i: int, region: str = "eu", tier: int = 1, op: str | None = None) -> str:
    body: dict = {"id": i} if op == "delete" else {"id": i, "region": region, "tier": tier}
    if op:
        body["_op"] = op
    return json.dumps(body)


def _epoch(runtime, orders: list[str], customers: list[str], home: Path) -> dict[str, str]:
    """One epoch through the runtime's steps; each step's engine (and the orders' dead letters)."""
    append_records(home / "data" / "orders", orders)
    append_records(home / "data" / "customers", customers)
    record, _ = runtime.start_epoch(None, None)
    reports = [runtime.run_source(record.epoch, name) for name in runtime.pipeline.sources]
    reports += [runtime.run_view(record.epoch, name) for name in runtime.pipeline.view_order()]
    runtime.commit(record.epoch)
    engines = {report.asset: report.metadata.get("engine", "?") for report in reports}
    engines["dead letters"] = reports[0].metadata["dead_letters"]
    return engines


def test_small_epochs_run_on_the_driver_and_equal_the_batch(spark, tmp_path: Path, monkeypatch) -> None:
    # every snapshot is mirrored into DuckDB at compaction (by default only those of 1M rows or more)
    monkeypatch.setattr(mirror, "MIN_MIRROR_ROWS", 1)
    files = {
        "sources.sql": SOURCES,
        "views.sql": "\n".join(
            f"CREATE MATERIALIZED VIEW {name}{' WITH (min_max_cache = 2)' if name == 'per_item' else ''} AS {q};"
            for name, q in VIEWS.items()
        ),
    }
    h = make_harness(tmp_path, files)
    # A first epoch of 40 orders is over EPOCHAL_DRIVER_ROWS = 30: Spark writes it; later ones fit.
    runtime = h.runtime(spark, env={"EPOCHAL_DRIVER_ROWS": "30"})
    first = [order(i, 1 + i % 4, "abc"[i % 3], i % 5, 1.25 * i, i) for i in range(40)]
    engines = _epoch(runtime, first, [customer(c, ["eu", "us"][c % 2], c) for c in range(1, 5)], h.home)
    assert engines["orders"] == "spark" and engines["per_item__stage1"] == "spark", engines
    assert_views_match_batch(runtime, VIEWS)
    steps = [
        # updates that move orders between items, and a delete of item a's cheapest (MIN's kept values)
        (
            [order(0, op="delete"), order(3, 2, "b", 4, 2.5, 3), order(41, 3, "c", 9, 0.75, 41)],
            [customer(2, "apac", 7)],
        ),
        # the kept values of item a's MIN go (2 kept): rebuilt from the input on the driver; a
        # floating-point SUM loses values (rebuilt too); a customer goes
        (
            [order(3, op="delete"), order(6, op="delete"), order(9, op="delete"), order(12, op="delete")],
            [customer(4, op="delete")],
        ),
        # a malformed record: the source's step is Spark's, which writes the dead letter
        ([order(50, 1, "a", 3, 4.0, 50), "{not json"], []),
        ([order(51, 2, "x", 5, 4.0, 51), order(1, 2, "a", 1, 1.0, 1)], [customer(9, "us", 1)]),
    ]
    for number, (orders, customers) in enumerate(steps):
        engines = _epoch(runtime, orders, customers, h.home)
        assert_views_match_batch(runtime, VIEWS)
        if number == 2:
            assert engines["orders"] == "spark" and engines["dead letters"] == 1, engines
        else:
            assert engines["orders"] == "driver (DuckDB)", engines
        assert engines["customers"] in ("driver (DuckDB)", "none (idle)"), engines
        on_spark = sorted(n for n in ON_DRIVER if engines[n] not in ("driver (DuckDB)", "none (idle)"))
        assert not on_spark, (number, on_spark)
        if number == 1:
            runtime.compact(every=1)  # snapshots written by Spark, read by the driver from its mirror from now on
            snapshot = runtime.controller.catalog.state_parts("orders", 2**62, True).snapshot
            assert mirror.existing_mirror(runtime.warehouse.file_path(snapshot.location)), snapshot
    for source in runtime.pipeline.sources:
        assert_source_exact(runtime, source)
    assert runtime.driver_views.answered >= 4 * len(ON_DRIVER) and runtime.driver_sources.answered >= 6


def test_without_the_driver_path_every_step_is_spark_s(spark, tmp_path: Path) -> None:
    files = {"sources.sql": SOURCES, "views.sql": f"CREATE MATERIALIZED VIEW per_item AS {VIEWS['per_item']};"}
    h = make_harness(tmp_path, files)
    runtime = h.runtime(spark, env={"EPOCHAL_DRIVER_ROWS": "0"})
    engines = _epoch(runtime, [order(1), order(2, item="b")], [customer(1)], h.home)
    assert set(engines.values()) == {"spark", 0}, engines
    assert_views_match_batch(runtime, {"per_item": VIEWS["per_item"]})


def test_a_run_of_small_epochs_starts_no_spark(spark, tmp_path: Path) -> None:
    """Once the load-time analysis has recorded the tables' schemas in the home, a runtime whose
    steps all run on the driver never asks for a Spark session: a `dagster job execute` of a small
    epoch attaches to no server and starts no JVM."""
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime

    views = {name: VIEWS[name] for name in ("big_orders", "per_item", "enriched")}
    files = {
        "sources.sql": SOURCES,
        "views.sql": "\n".join(f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in views.items()),
    }
    h = make_harness(tmp_path, files)
    _epoch(h.runtime(spark), [order(1), order(2, 2, "b", 3, 2.0)], [customer(1), customer(2, "us")], h.home)

    def no_spark():
        raise AssertionError("a driver-only epoch asked for Spark")

    settings = h.settings()
    runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), no_spark)
    engines = _epoch(runtime, [order(2, op="delete"), order(3, 1, "b", 2, 0.5, 3)], [customer(1, "apac")], h.home)
    assert set(engines.values()) == {"driver (DuckDB)", 0}, engines
    assert_views_match_batch(h.runtime(spark), views)


def test_a_step_the_driver_declines_says_why_in_its_metadata_and_the_log(spark, tmp_path: Path, caplog) -> None:
    import logging

    h = make_harness(
        tmp_path,
        {
            "p.sql": SOURCES.split("CREATE TABLE customers")[0]
            + "CREATE MATERIALIZED VIEW big_orders AS SELECT id, qty FROM orders WHERE qty > 1;\n"
        },
    )
    runtime = h.runtime(spark, env={"EPOCHAL_DRIVER_ROWS": "2"})
    caplog.set_level(logging.INFO, logger="epochal.driver")

    def epoch(lines: list[str]) -> dict[str, dict]:
        append_records(h.home / "data" / "orders", lines)
        record, _ = runtime.start_epoch(None, None)
        reports = [runtime.run_source(record.epoch, "orders"), runtime.run_view(record.epoch, "big_orders")]
        runtime.commit(record.epoch)
        return {r.asset: r.metadata for r in reports}

    # three records, over EPOCHAL_DRIVER_ROWS = 2: both steps on Spark, each saying so
    big = epoch([order(1, qty=2), order(2, qty=3), order(3)])
    for name, rows in (("orders", "3 records in the epoch"), ("big_orders", "3 rows of change in")):
        assert big[name]["engine"] == "spark"
        assert big[name]["driver_declined"] == f"{rows}, more than EPOCHAL_DRIVER_ROWS (2)", big[name]
    # a record the driver does not parse as Spark does (a dead letter): the source's step says that
    bad = epoch(["{not json"])
    assert bad["orders"]["engine"] == "spark" and "not one the driver parses" in bad["orders"]["driver_declined"]
    # a small epoch it takes says nothing of the kind
    small = epoch([order(4, qty=5)])
    assert small["orders"]["engine"] == small["big_orders"]["engine"] == "driver (DuckDB)"
    assert "driver_declined" not in small["orders"] and "driver_declined" not in small["big_orders"]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    logged = [m for m in logged if "driver path declined" in m]
    assert any("source orders" in m and "3 records in the epoch" in m for m in logged), logged
    assert any("view big_orders" in m and "3 rows of change in" in m for m in logged), logged
