"""Sinks into a real PostgreSQL server through the whole runtime: epochs of a log source, a view,
an upsert sink batching two epochs per transaction and an append-only sink, each written by several
Spark writer tasks. The target is read back with psycopg and compared with what the produced
records say it must hold, computed here in Python."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import pytest

from epochal.sinks.base import SinkError
from tests.epochal_harness import make_harness
from tests.sinks.test_postgres_sink import database, prepared, sql_rows  # noqa: F401 - the fixture
from tests.storage.test_compaction import run_epoch

PIPELINE = """
CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW totals AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;

CREATE SINK totals_pg FROM totals
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'totals',
      type = 'upsert', primary_key = 'customer', commit_checkpoint_interval = '2', writers = '3');

CREATE SINK orders_pg FROM orders
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', schema = 'raw',
      table = 'orders');
"""


@pytest.mark.parametrize("writers", ["driver", "spark"])
def test_postgres_sinks_hold_every_committed_epoch_exactly_once(
    spark,  # noqa: ANN001
    tmp_path: Path,
    database: str,  # noqa: F811
    writers: str,
) -> None:
    """``driver``: the small batches are written from the run's process (the default for them);
    ``spark``: by the sink's three Spark writer tasks, as a large batch is."""
    h = make_harness(tmp_path, {"p.sql": PIPELINE.format(db=database)})
    runtime = h.runtime(spark, env={"EPOCHAL_SINK_DRIVER_ROWS": "100000" if writers == "driver" else "0"})
    produced: list[dict] = []
    epochs = []
    for i in range(5):
        batch = [{"id": 10 * i + j, "customer": f"c{(i + j) % 4}", "amount": j + i} for j in range(6)]
        produced += batch
        h.produce([json.dumps(r) for r in batch])
        epochs.append(run_epoch(runtime))
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in produced:
            totals[r["customer"]][0] += r["amount"]
            totals[r["customer"]][1] += 1
        delivered = runtime.controller.sink_coordinator.delivered_epoch("totals_pg")
        if i % 2 == 1:  # a batch of two epochs is full: the upsert sink holds everything
            assert delivered == epochs[-1]
            assert sorted(sql_rows(database, "SELECT customer, total, n FROM totals")) == sorted(
                (c, t, n) for c, (t, n) in totals.items()
            )
        else:  # the sink waits for the batch's second epoch, and says so
            assert delivered == (epochs[-2] if i else None)
            assert runtime.controller.status()["sinks"]["totals_pg"]["lag_epochs"] == 1
        # the append-only sink delivers every epoch, each row once
        assert Counter(sql_rows(database, "SELECT id, customer, amount FROM raw.orders")) == Counter(
            (r["id"], r["customer"], r["amount"]) for r in produced
        )
    assert prepared(database) == []  # no prepared transaction is left behind
    batches = runtime.controller.sink_coordinator.batches("totals_pg")
    assert [(b.id.first_epoch, b.id.last_epoch, b.state.value) for b in batches] == [
        (epochs[0], epochs[1], "COMMITTED"),
        (epochs[2], epochs[3], "COMMITTED"),
    ]
    driver = runtime.sink_steps.driver_writer
    if writers == "spark":  # each writer task covered its vnodes and pre-committed once
        assert all(len(b.results) == 3 for b in batches)
        assert driver.answered == 0
    else:  # one writer, over every vnode, for each batch of both sinks; none left to Spark
        assert all([r.vnodes for r in b.results] == [(0, 255)] for b in batches)
        assert driver.answered == 5 + 2 and driver.declined == 0


class ScratchPostgres:
    """A PostgreSQL server of this test's own (initdb in a temp dir, trust auth on loopback,
    prepared transactions on) that the test can stop and start again on the same port and data."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
        if not bins:
            pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql; .ci/run installs postgresql")
        self.bindir = bins[-1].parent
        # under /tmp, not pytest's tmp_path: the server's user must be able to reach its directory
        self.root = root = Path(tempfile.mkdtemp(prefix="epochal-pg-stopped-"))
        # initdb and postgres refuse to run as root: the child drops to the postgres user
        self.as_postgres: dict = {}
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            self.as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(root / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120, **self.as_postgres,
        )  # fmt: skip
        self.server: subprocess.Popen | None = None

    def start(self) -> None:
        self.server = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "max_prepared_transactions=16", "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **self.as_postgres,
        )  # fmt: skip
        for _ in range(150):
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        pytest.fail("the scratch PostgreSQL did not start")

    def stop(self) -> None:
        if self.server is not None:
            self.server.send_signal(signal.SIGINT)  # fast shutdown: prepared transactions survive it
            self.server.wait(timeout=60)
            self.server = None

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"


def test_a_stopped_server_never_holds_epochs_back_and_the_sink_catches_up(spark, tmp_path: Path) -> None:  # noqa: ANN001
    scratch = ScratchPostgres()
    scratch.start()
    try:
        pipeline = (
            "CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)\n"
            "WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
            f"CREATE SINK orders_pg FROM orders WITH (connector = 'postgres', host = '127.0.0.1', "
            f"port = '{scratch.port}', user = 'postgres', database = 'postgres', table = 'orders');\n"
        )
        h = make_harness(tmp_path / "h", {"p.sql": pipeline})
        runtime = h.runtime(spark, {"EPOCHAL_SINK_RETRY_S": "1"})
        produced: list[tuple] = []

        def epoch(i: int) -> int:
            rows = [(10 * i + j, f"c{j}", j) for j in range(5)]
            produced.extend(rows)
            h.produce([json.dumps({"id": r[0], "customer": r[1], "amount": r[2]}) for r in rows])
            record, _ = runtime.start_epoch(None, None)
            runtime.run_source(record.epoch, "orders")
            runtime.commit(record.epoch)
            return record.epoch

        first = epoch(0)
        runtime.run_sink(first, "orders_pg")
        scratch.stop()
        down = [epoch(i) for i in (1, 2, 3)]
        # the epochs commit while the target is down; each sink step fails, naming sink, epoch and cause
        assert runtime.controller.epoch_log.committed_epoch() == down[-1]
        named = rf"sink orders_pg, epochs {down[0]}..{down[-1]} .*127\.0\.0\.1:{scratch.port}"
        with pytest.raises(SinkError, match=named):
            runtime.run_sink(down[-1], "orders_pg")
        lag = runtime.controller.status()["sinks"]["orders_pg"]
        assert lag["delivered_epoch"] == first and lag["lag_epochs"] == 3 and lag["lag_seconds"] > 0
        scratch.start()
        report = runtime.run_sink(down[-1], "orders_pg")
        assert report.metadata["epochs_delivered"] == 3 and report.metadata["lag_epochs"] == 0
        with psycopg.connect(scratch.url("postgres")) as conn:
            assert Counter(conn.execute("SELECT id, customer, amount FROM orders").fetchall()) == Counter(produced)
            assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0
    finally:
        scratch.stop()
        shutil.rmtree(scratch.root, ignore_errors=True)


def test_a_sink_removed_with_a_batch_not_finished_is_finished_and_its_name_can_come_back(
    spark,  # noqa: ANN001
    tmp_path: Path,
    database: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sink removed from the SQL files while a batch is PENDING (its writers' transactions are
    prepared in PostgreSQL, holding their locks and the VACUUM horizon) is finished at the next
    injection through what the meta store kept of its options: the decided commit lands, nothing
    stays prepared, and its records go, so the name can come back for another table."""
    source = (
        "CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)\n"
        "WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
    )

    def sink(table: str) -> str:
        return (
            f"CREATE SINK orders_pg FROM orders WITH (connector = 'postgres', host = '127.0.0.1', "
            f"user = 'postgres', password = '${{TEST_PG_PASSWORD}}', database = '{database}', "
            f"table = '{table}');\n"
        )

    h = make_harness(tmp_path, {"p.sql": source + sink("orders")})
    monkeypatch.setenv("TEST_PG_PASSWORD", "")  # (trust auth; a reference is what the meta store keeps)
    runtime = h.runtime(spark, {"EPOCHAL_SINK_RETRY_S": "1", "EPOCHAL_SINK_DRIVER_ROWS": "0"})
    produced: list[tuple] = []

    def produce(i: int) -> None:
        rows = [(10 * i + j, f"c{j}", j) for j in range(3)]
        produced.extend(rows)
        h.produce([json.dumps({"id": r[0], "customer": r[1], "amount": r[2]}) for r in rows])

    produce(0)
    run_epoch(runtime)
    produce(1)
    second = run_epoch(runtime, sinks=False)
    target = runtime.sink("orders_pg")

    def server_went_away(*args: object) -> None:
        raise SinkError("the server went away")

    target.commit = server_went_away  # type: ignore[method-assign]
    with pytest.raises(SinkError, match="went away"):
        runtime.run_sink(second, "orders_pg")
    assert prepared(database), "the batch's writers are prepared, its commit decided"
    assert [b.state.value for b in runtime.controller.sink_batches("orders_pg")][-1] == "PENDING"

    # The user removes the sink; the next injection finishes the batch, then retires the sink.
    (h.pipeline_dir / "p.sql").write_text(source)
    runtime = h.runtime(spark)
    produce(2)
    run_epoch(runtime)
    assert prepared(database) == []
    assert Counter(sql_rows(database, "SELECT id, customer, amount FROM orders")) == Counter(produced[:6])
    assert runtime.controller.sink_batches("orders_pg") == []

    # Added back for another table, it is a new sink: a snapshot of the source, not a refusal.
    (h.pipeline_dir / "p.sql").write_text(source + sink("orders_again"))
    runtime = h.runtime(spark)
    produce(3)
    run_epoch(runtime)
    assert Counter(sql_rows(database, "SELECT id, customer, amount FROM orders_again")) == Counter(produced)
