"""A sink added to a pipeline whose tables have history, compacted away (issue 15, part 3).

The pipeline runs epochs with a compaction after each, so the first epochs' change files are gone
and only a vnode snapshot holds them; then sinks are added to its files. ``snapshot = 'true'``
(the default) delivers the table's state at the newest committed epoch before the sink's first
step as one batch, then every later epoch; ``snapshot = 'false'`` delivers only the later epochs.
Each target is checked against an oracle computed independently of the sink path: the produced
records, and the view's query run as a batch over them. A SIGKILL inside the snapshot batch's
two-phase commit still ends with every row exactly once."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from epochal.checkpoint.sinks.batches import SinkBatchState
from epochal.sinks.base import SNAPSHOT_FIRST_EPOCH
from epochal.sinks.spec import validate_sink
from tests.checkpoint.test_controller import mark_delivered
from tests.consistency import batch_view, multiset
from tests.epochal_harness import crash_points, make_harness
from tests.sinks.test_postgres_sink import database, prepared, sql_rows  # noqa: F401 - the fixture
from tests.storage.test_compaction import committed_src, run_epoch

# A TABLE: its rows are stored per epoch and compacted into snapshots, the history a new sink starts
# from. (A CREATE SOURCE that no view reads as state stores nothing: a sink over one starts from its
# connector, tests/storage/test_source_storage.py.)
BASE = """
CREATE TABLE orders (id BIGINT, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW totals AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;
"""
#: the PostgreSQL server the sink tests use (tests/sinks/test_postgres_sink.py's)
PG_PORT = 5432
TOTALS = "SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer"

SINKS = """
CREATE SINK orders_all FROM orders
WITH (connector = 'duckdb', database = 'out/s.duckdb', table = 'orders_all');

CREATE SINK orders_new FROM orders
WITH (connector = 'duckdb', database = 'out/s.duckdb', table = 'orders_new', snapshot = 'false');

CREATE SINK totals_duck FROM totals
WITH (connector = 'duckdb', database = 'out/s.duckdb', table = 'totals', type = 'upsert',
      primary_key = 'customer', snapshot = 'true');

CREATE SINK totals_pg FROM totals
WITH (connector = 'postgres', host = '127.0.0.1', port = '{port}', user = 'postgres', database = '{db}',
      table = 'totals', type = 'upsert', primary_key = 'customer', writers = '3');
"""


def orders(first: int, count: int) -> list[dict]:
    return [{"id": i, "customer": f"c{i % 5}", "amount": i * 3 + 1} for i in range(first, first + count)]


def duck_rows(home: Path, table: str) -> Counter:
    con = duckdb.connect(str(home / "out" / "s.duckdb"), read_only=True)
    try:
        columns = "id, customer, amount" if table.startswith("orders") else "customer, total, n"
        return multiset(con.execute(f"SELECT {columns} FROM {table}").fetchall())
    finally:
        con.close()


def order_rows(records: list[dict]) -> Counter:
    return Counter((r["id"], r["customer"], r["amount"]) for r in records)


def test_a_sink_added_after_compaction_starts_from_a_snapshot_or_after_history(
    spark,  # noqa: ANN001
    tmp_path: Path,
    database: str,  # noqa: F811
) -> None:
    h = make_harness(tmp_path, {"p.sql": BASE})
    env = {"EPOCHAL_COMPACT_EVERY": "1"}
    runtime = h.runtime(spark, env)
    produced: list[dict] = []
    history = []
    for i in range(4):
        batch = orders(10 * i, 6)
        produced += batch
        h.produce([json.dumps(r) for r in batch])
        history.append(run_epoch(runtime, sinks=False, compact=True))
    snapshots = runtime.controller.status()["snapshots"]
    # The first epochs' change files are gone: reading them is what failed with StateCompacted.
    assert snapshots["orders"]["changes_dropped_upto"] is not None
    assert snapshots["totals"]["changes_dropped_upto"] is not None
    runtime.close()

    (h.pipeline_dir / "sinks.sql").write_text(SINKS.format(db=database, port=PG_PORT))
    runtime = h.runtime(spark, env)
    before = len(produced)
    later = []
    reports = {}
    for i in range(4, 6):
        batch = orders(10 * i, 6)
        produced += batch
        h.produce([json.dumps(r) for r in batch])
        e = run_epoch(runtime, sinks=False)
        for sink in runtime.pipeline.sinks:
            reports[(sink, e)] = runtime.run_sink(e, sink).metadata
        assert runtime.compact(e).metadata["failures"] == "none"
        later.append(e)

    coordinator = runtime.controller.sink_coordinator
    committed = runtime.controller.epoch_log.committed_epoch()
    expected_totals = multiset(batch_view(runtime, TOTALS))
    by_customer: dict[str, list[int]] = {}
    for r in produced:
        by_customer.setdefault(r["customer"], []).append(r["amount"])
    # the oracle itself, against the records as produced
    assert expected_totals == Counter({(c, sum(a), len(a)): 1 for c, a in by_customer.items()})

    # snapshot = 'true': every order exactly once, the view by key, in PostgreSQL as in DuckDB
    assert duck_rows(h.home, "orders_all") == order_rows(produced)
    assert duck_rows(h.home, "totals") == expected_totals
    assert multiset(sql_rows(database, "SELECT customer, total, n FROM totals")) == expected_totals
    assert prepared(database) == []
    for sink in ("orders_all", "totals_duck", "totals_pg"):
        assert coordinator.delivered_epoch(sink) == committed, sink
        batches = [b for b in coordinator.batches(sink) if b.state is SinkBatchState.COMMITTED]
        # one snapshot batch at the last epoch before the sink's first step, then each later epoch
        assert [(b.id.first_epoch, b.id.last_epoch) for b in batches] == [
            (SNAPSHOT_FIRST_EPOCH, history[-1]),
            *((e, e) for e in later),
        ], sink
        first = reports[(sink, later[0])]
        assert first["snapshot_epoch"] == history[-1] and first["start"] == "snapshot", first
        assert reports[(sink, later[1])]["snapshot_epoch"] is None
    assert reports[("orders_all", later[0])]["snapshot_rows"] == before
    assert reports[("totals_duck", later[0])]["snapshot_rows"] == 5

    # snapshot = 'false': only the epochs from the sink's first step on
    assert duck_rows(h.home, "orders_new") == order_rows(produced[before:])
    assert [b.id.first_epoch for b in coordinator.batches("orders_new")] == later
    assert reports[("orders_new", later[0])]["start"] == "after history"

    status = runtime.controller.status()
    start = status["sinks"]["orders_all"]["start"]
    assert start["snapshot_epoch"] == history[-1] and start["snapshot_rows"] == before
    assert start["snapshot_delivered"] and start["snapshot_delivered_at"] > 0
    assert status["sinks"]["orders_new"]["start"] == {"snapshot": False, "skipped_upto": history[-1]}
    assert status["sinks"]["orders_new"]["lag_epochs"] == 0
    # Retention goes on: the sinks hold back nothing they have delivered.
    assert status["snapshots"]["orders"]["changes_dropped_upto"] == later[0]
    shown = h.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert f"snapshot @ {history[-1]} ({before} rows)" in shown.stdout
    assert f"started after epoch {history[-1]}" in shown.stdout


def test_a_snapshot_start_compacted_before_delivery_moves_to_the_committed_epoch(spark, tmp_path: Path) -> None:  # noqa: ANN001
    h = make_harness(tmp_path, {"p.sql": BASE})
    env = {"EPOCHAL_COMPACT_EVERY": "1"}
    runtime = h.runtime(spark, env)
    produced: list[dict] = []

    def epoch(i: int, sinks: bool) -> int:
        batch = orders(10 * i, 4)
        produced.extend(batch)
        h.produce([json.dumps(r) for r in batch])
        return run_epoch(runtime, sinks=sinks, compact=True)

    epochs = [epoch(i, False) for i in range(3)]
    runtime.close()
    (h.pipeline_dir / "sinks.sql").write_text(
        "CREATE SINK orders_all FROM orders WITH (connector = 'duckdb', database = 'out/s.duckdb', "
        "table = 'orders_all');\n"
    )
    runtime = h.runtime(spark, env)
    coordinator = runtime.controller.sink_coordinator
    # The sink's first step decides its start (a snapshot at epochs[-1]) but delivers nothing (as if
    # its target were down); two compactions meanwhile release the state at that epoch.
    start = coordinator.start("orders_all", True, epochs[-1] + 1)
    assert start.history_upto == epochs[-1]
    epochs += [epoch(i, False) for i in (3, 4)]
    assert runtime.controller.status()["snapshots"]["orders"]["changes_dropped_upto"] > start.history_upto
    last = epoch(5, True)
    assert duck_rows(h.home, "orders_all") == order_rows(produced)
    batches = [b for b in coordinator.batches("orders_all") if b.state is SinkBatchState.COMMITTED]
    assert [(b.id.first_epoch, b.id.last_epoch) for b in batches] == [(SNAPSHOT_FIRST_EPOCH, last)]


def test_retention_is_not_pinned_by_a_sink_waiting_for_its_snapshot(tmp_path: Path, meta_url: str) -> None:
    ctl, epochs = committed_src(tmp_path, meta_url, 6, sinks=["snap", "late", "old"])
    coordinator = ctl.sink_coordinator
    assert coordinator.start("snap", True, epochs[3]).history_upto == epochs[2]
    assert coordinator.start("late", False, epochs[3]).history_upto == epochs[2]
    # decided once: a later call, or a changed option, keeps the start
    assert coordinator.start("late", True, epochs[5]).history_upto == epochs[2]
    mark_delivered(ctl, "old", epochs[4])

    def snapshot(epoch: int, name: str):  # noqa: ANN202
        ctl.catalog.begin_snapshot("src", epoch, f"/w/src/{name}", ("id",), "{}")
        return ctl.catalog.publish_snapshot(f"/w/src/{name}", 10, 1, sinks=["snap", "late", "old"])

    snapshot(epochs[1], "a")
    # The 'snapshot = false' sink still needs the changes after epochs[2]; the snapshot sink none.
    assert snapshot(epochs[4], "b").changes_dropped_upto == epochs[1]
    assert snapshot(epochs[5], "c").changes_dropped_upto == epochs[2]
    lag = ctl.status()["sinks"]
    assert lag["late"]["lag_epochs"] == 3 and lag["snap"]["lag_epochs"] == 6
    assert lag["snap"]["start"]["snapshot_epoch"] == epochs[2] and not lag["snap"]["start"]["snapshot_delivered"]


def test_the_snapshot_option_is_checked_at_load() -> None:
    options = {"connector": "duckdb", "database": "x.duckdb", "table": "t"}
    assert validate_sink("duckdb", {**options, "snapshot": "false"}, ["id"]) == []
    problems = validate_sink("duckdb", {**options, "snapshot": "yes"}, ["id"])
    assert len(problems) == 1 and "'snapshot' must be 'true'" in problems[0], problems
    assert "did you mean 'snapshot'" in validate_sink("duckdb", {**options, "snapshots": "true"}, ["id"])[0]


CRASH_SINKS = """
CREATE SINK totals_pg FROM totals
WITH (connector = 'postgres', host = '127.0.0.1', port = '{port}', user = 'postgres', database = '{db}',
      table = 'totals', type = 'upsert', primary_key = 'customer', writers = '3');
"""


@pytest.mark.slow
# The two points where a snapshot batch is recommitted from its recorded epoch (PENDING, and some
# writers committed downstream). The others abort or mark a batch whatever it holds, and are killed
# for ordinary batches in test_sink_crashes.py; each point here costs a subprocess run (~2 min).
# The suite kills between two writers' COMMIT PREPARED of the snapshot batch; TESTS_CRASH_MATRIX=all
# also kills once it is PENDING.
@pytest.mark.parametrize("point", crash_points(["sink-pending", "sink-commit-midway"], suite=["sink-commit-midway"]))
def test_a_crash_inside_the_snapshot_batch_still_delivers_it_once(
    spark,  # noqa: ANN001
    tmp_path: Path,
    database: str,  # noqa: F811
    point: str,
    monkeypatch,  # noqa: ANN001
) -> None:
    monkeypatch.setenv("EPOCHAL_COMPACT_EVERY", "1")
    h = make_harness(tmp_path, {"p.sql": BASE})
    instance = dg.DagsterInstance.ephemeral()
    produced: list[dict] = []
    for i in range(3):
        produced += orders(10 * i, 5)
        h.produce([json.dumps(r) for r in orders(10 * i, 5)])
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert h.runtime(spark).controller.status()["snapshots"]["totals"]["changes_dropped_upto"] is not None

    (h.pipeline_dir / "sinks.sql").write_text(CRASH_SINKS.format(db=database, port=PG_PORT))
    produced += orders(30, 5)
    h.produce([json.dumps(r) for r in orders(30, 5)])
    crashed = h.run_subprocess(fault=point, env={"EPOCHAL_COMPACT_EVERY": "1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert point in crashed.stderr
    # killed inside the snapshot batch: no batch of an epoch was reached
    before = h.runtime(spark).controller.sink_coordinator.batches("totals_pg")
    assert all(b.id.snapshot for b in before), before
    if point != "sink-prepared":
        assert [b.state for b in before] == [SinkBatchState.PENDING], before

    produced += orders(40, 5)
    h.produce([json.dumps(r) for r in orders(40, 5)])
    recovered = h.run_in_process(instance)
    assert recovered.success, [e.message for e in recovered.all_events if e.is_failure]

    runtime = h.runtime(spark)
    coordinator = runtime.controller.sink_coordinator
    assert coordinator.delivered_epoch("totals_pg") == runtime.controller.epoch_log.committed_epoch()
    batches = coordinator.batches("totals_pg")
    assert not [b for b in batches if b.state is SinkBatchState.PENDING]
    snapshots = [b for b in batches if b.id.snapshot and b.state is SinkBatchState.COMMITTED]
    assert len(snapshots) == 1, batches
    assert multiset(sql_rows(database, "SELECT customer, total, n FROM totals")) == multiset(
        batch_view(runtime, TOTALS)
    )
    assert prepared(database) == []
    # the target's own progress rows: the snapshot batch's writers once each
    progress = sql_rows(
        database,
        "SELECT first_epoch, count(*) FROM _epochal_sink_progress WHERE sink = 'totals_pg' GROUP BY first_epoch",
    )
    assert dict(progress)[SNAPSHOT_FIRST_EPOCH] == 3, progress
