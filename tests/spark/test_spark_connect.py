"""The same pipeline on a Spark Connect server: `dagster job execute` with EPOCHAL_SPARK_REMOTE set
runs every kind of view (linear, keyed, delta join, partial aggregate with kept MIN/MAX values,
full refresh) and a sink's writer tasks on a real Connect server, and each view is checked after every epoch against a
Spark batch over the committed source rows, computed in this process with classic Spark.

Connect analyses a plan when it runs, not when it is built: a view bound to its inputs by name
would read whatever the name meant later (or nothing). This test is what keeps that honest.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.connectors.log import append_records
from epochal.spark.session import DEFAULT_CONF
from tests.connectors.test_connectors import assert_log_read_parses_once, assert_log_reads_ranges
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import make_harness
from tests.incremental.test_incremental_views import EPOCHS, SOURCES, VIEWS
from tests.spark.test_spark_pools import assert_live_waits_only_for_running_backfill_tasks

# One view per way a step computes its change, so that each reaches the server at least once:
VIEWS_ON_CONNECT = {
    "cheap": "SELECT id, cust, price * 2 AS double_price FROM orders WHERE price < 25",  # linear
    "eu_customers": "SELECT id, tier FROM customers WHERE region = 'eu'",  # linear, idle in epoch 3
    "top2": VIEWS["top2"],  # keyed: recomputed at the touched keys
    # a delta-join stage, a partial-aggregate stage, and a projection typed like the written query
    "by_region": VIEWS["by_region"],
}
#: one kept value per MIN/MAX: epoch 3 deletes item a's cheapest order, which empties them, so the
#: group is rebuilt from its input on the server
EXTREMES = "SELECT item, min(price) AS lo, max(price) AS hi, count(*) AS n FROM orders GROUP BY item"
FULL = "SELECT region, count(*) AS custs FROM customers GROUP BY region"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory):
    """A Spark Connect server from the pyspark install (its jars ship the server), local[2]."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    server = subprocess.Popen(
        [
            str(spark_home / "bin" / "spark-submit"),
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "epochal-connect-test",
            "--master", "local[2]",
            "--driver-memory", "1g",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.ui.enabled=false",
            # the scheduler Epochal's managed server starts with: backfills in a pool of their own
            "--conf", f"spark.scheduler.mode={DEFAULT_CONF['spark.scheduler.mode']}",
            "--conf", f"spark.scheduler.allocation.file={DEFAULT_CONF['spark.scheduler.allocation.file']}",
        ],
        # the server's Python workers (a sink's writer tasks) run this interpreter, which has Epochal
        env={**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable},
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"the Spark Connect server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.time() > deadline:
                pytest.fail(f"the Spark Connect server did not listen on {port}:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.mark.slow
def test_every_kind_of_view_runs_on_spark_connect_and_matches_batch(spark, connect_url: str, tmp_path: Path) -> None:
    statements = [f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in VIEWS_ON_CONNECT.items()]
    statements.append(f"CREATE MATERIALIZED VIEW extremes WITH (min_max_cache = 1) AS {EXTREMES};")
    statements.append(f"CREATE MATERIALIZED VIEW regions_full WITH (refresh = 'full') AS {FULL};")
    # a sink too: its writer tasks are Python (mapInArrow) that the server runs, spread over vnodes
    statements.append(
        "CREATE SINK cheap_out FROM cheap WITH (connector = 'duckdb', database = 'out/cheap.duckdb', "
        "table = 'cheap', type = 'upsert', primary_key = 'id', writers = '3');"
    )
    h = make_harness(tmp_path, {"sources.sql": SOURCES, "views.sql": "\n".join(statements)})
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    checked = {**VIEWS_ON_CONNECT, "extremes": EXTREMES, "regions_full": FULL}
    committed: list[int] = []
    # inserts; then updates and deletes of both sources; then only orders change (a MIN goes).
    # Each epoch is a fresh `dagster job execute` (about a minute here): three cover every path.
    # Those run every step on the server (EPOCHAL_DRIVER_ROWS=0: epochs this small would otherwise
    # be computed on the driver); a fourth, with the default, computes its steps on the driver
    # from the snapshots and changes the server wrote, and the server writes its snapshots.
    runs = [(EPOCHS[0], "0"), (EPOCHS[1], "0"), (EPOCHS[3], "0"), (EPOCHS[2], None)]
    for epoch, ((orders, customers), driver_rows) in enumerate(runs, start=1):
        append_records(h.home / "data" / "orders", orders)
        append_records(h.home / "data" / "customers", customers)
        # COMPACT_EVERY=1: every changed table is snapshotted on the server after each commit, so
        # the next epoch (and the checks below) read snapshots the server wrote, not only changes.
        # DEBUG: the materialization events, each naming its engine, are then on the console
        env = {"EPOCHAL_SPARK_REMOTE": connect_url, "EPOCHAL_COMPACT_EVERY": "1", "EPOCHAL_LOG_LEVEL": "DEBUG"}
        if driver_rows is not None:
            env["EPOCHAL_DRIVER_ROWS"] = driver_rows
        run = h.run_subprocess(env=env, timeout=600)
        output = f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
        assert run.returncode == 0, f"epoch {epoch} on Spark Connect failed:\n{output}"
        # each step's materialization names its engine, and the run's event log shows it
        on_driver = "driver (DuckDB)" in run.stdout + run.stderr
        assert on_driver == (driver_rows is None), f"epoch {epoch}: steps on the driver: {on_driver}\n{output}"
        runtime = h.runtime(spark)  # classic Spark reads what the Connect server wrote
        committed.append(runtime.controller.epoch_log.committed_epoch())
        assert committed[-1] is not None and committed == sorted(set(committed)), "each run commits a new epoch"
        # orders changes in every epoch, and so do by_region's stages: compaction on Connect must
        # have snapshotted them at this commit (a failure is only logged, so look for the result)
        for table in ("orders", *(t for t in runtime.pipeline.tables if t.startswith("by_region__"))):
            snapshots = runtime.controller.catalog.snapshots(table)
            assert snapshots and snapshots[-1].epoch == committed[-1], f"{table}: no snapshot at epoch {committed[-1]}"
        assert_views_match_batch(runtime, checked)
        assert_sink_exactly_once(runtime, "cheap_out")


@pytest.mark.parametrize("keyed, parses", [(False, 1), (True, 2)])
def test_log_read_parses_each_line_once_on_spark_connect(
    connect_url: str, tmp_path: Path, keyed: bool, parses: int, capsys, monkeypatch
) -> None:
    """On Connect the server's optimizer plans the read: the parse-once plan must hold there too
    (the explain() text comes from the server)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # pyspark.sql.functions builds Connect columns only while this is set. For this test alone: the
    # other tests' classic sessions in this process must keep their classic columns.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    remote = ConnectSession.builder.remote(connect_url).create()
    try:
        assert_log_read_parses_once(remote, tmp_path, keyed, parses, capsys)
    finally:
        remote.stop()


def test_a_query_over_frames_is_planned_without_a_round_trip_and_keeps_its_frames(
    connect_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Connect a view step's queries are built as plans the server parses when they run (no
    ``spark.sql`` round trip each): each must still read the frames it was given, even after the
    same name is bound to another frame, keep braces in its text, and report a bad column by name
    when analysed."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.connect.plan import SQL
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from epochal.incremental.binding import sql_over

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    remote = ConnectSession.builder.remote(connect_url).create()
    try:
        inserts = remote.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, item STRING")
        deletes = remote.createDataFrame([(3, "c")], "id BIGINT, item STRING")
        query = "SELECT o.id, orders.item, '{x}' AS braces FROM orders o JOIN orders ON orders.id = o.id"
        plus = sql_over(remote, query, {"ORDERS": inserts})
        minus = sql_over(remote, query, {"orders": deletes})
        assert isinstance(plus._plan, SQL), "built locally, not sent to the server first"
        assert sorted(map(tuple, plus.collect())) == [(1, "a", "{x}"), (2, "b", "{x}")]
        assert [tuple(r) for r in minus.collect()] == [(3, "c", "{x}")]
        assert sql_over(remote, "SELECT '{y}' AS v", {"orders": inserts}).first().v == "{y}"
        with pytest.raises(AnalysisException, match="nope"):
            sql_over(remote, "SELECT nope FROM orders", {"orders": inserts}).schema  # noqa: B018
    finally:
        remote.stop()


def test_log_pieces_are_read_by_the_connect_servers_workers(connect_url: str, tmp_path: Path, monkeypatch) -> None:
    """A large log read registers the Python data source with the server, whose workers read the
    pieces: the same rows as through the driver."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    remote = ConnectSession.builder.remote(connect_url).create()
    try:
        assert_log_reads_ranges(remote, tmp_path, monkeypatch, "executors")
    finally:
        remote.stop()


def test_a_backfills_session_gets_only_the_slots_live_sessions_leave(connect_url: str, monkeypatch) -> None:
    """Two runs on one server, as a backfill run and an epoch run: Connect has no thread properties,
    so the backfill's pool travels as its session's ``spark.scheduler.pool`` conf, which the server
    copies into the properties of the jobs it runs."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    backfill = ConnectSession.builder.remote(connect_url).create()
    live = ConnectSession.builder.remote(connect_url).create()
    try:
        assert_live_waits_only_for_running_backfill_tasks(backfill, live)
    finally:
        backfill.stop()
        live.stop()


def test_a_driver_lookup_answers_through_spark_connect(
    connect_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys come from the server as Arrow and the rows DuckDB found go back to it as a local
    relation: on Connect too, the same rows and values as the server's own semi-join."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.types import StructType

    from epochal.storage.driver_lookup import DriverLookup
    from tests.storage.test_driver_lookup import WIDE, spark_semi_join, wide_rows

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    remote = ConnectSession.builder.remote(connect_url).create()
    try:
        schema = StructType.fromDDL(WIDE)
        remote.createDataFrame(wide_rows(60), schema).write.parquet(str(tmp_path / "snap"))
        files = sorted(str(p) for p in (tmp_path / "snap").glob("*.parquet"))
        snapshot = remote.read.schema(schema).parquet(*files)
        keys = snapshot.where("i % 4 = 1").select("id", "s")
        lookup = DriverLookup(max_rows=1000)
        found = lookup.read(remote, schema, files, ("id", "s"), keys)
        assert found is not None and lookup.answered == 1
        expected = sorted(map(repr, spark_semi_join(snapshot, keys, ("id", "s")).collect()))
        assert sorted(map(repr, found.collect())) == expected and len(expected) == 15
    finally:
        remote.stop()
