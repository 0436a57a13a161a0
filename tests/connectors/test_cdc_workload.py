"""The CDC sources under a live workload (issue 59, item 5): a seeded random writer commits
multi-statement transactions over two upstream tables (tests/connectors/cdc_workload.py) while
epochs run, the first of them taking the tables' snapshots, and a real run is SIGKILLed after a
source wrote its epoch, then recovered. At the quiet point (the writer stopped, one more epoch
committed) each CDC table equals ``SELECT *`` of its upstream table, re-read with psycopg / PyMySQL;
the view over both equals the same join and GROUP BY computed here in Python over those rows; the
committed epochs' ranges tile the log from the snapshot without a gap, nothing the tables hold is
after the last one, and the slot's confirmed LSN (PostgreSQL) / the stored committed binlog offset
(MariaDB) is the committed epoch's end: nothing was skipped.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.connectors.cdc_oracle import (
    assert_same_rows,
    create_pg_database,
    drop_pg_database,
    mysql_connect,
    mysql_rows,
    pg_dsn,
    pg_rows,
    slot_confirmed,
    state_rows,
)
from tests.connectors.cdc_workload import (
    ACCT_COLUMNS,
    ITEM_COLUMNS,
    KINDS,
    MYSQL_DDL,
    PG_DDL,
    TABLES_SQL,
    Workload,
)
from tests.consistency import committed_offsets
from tests.epochal_harness import make_harness, run_epoch

DB = "epochal_cdc_load"
SLOT = "epochal_cdc_load"
SEED = 59
VIEW = """
CREATE MATERIALIZED VIEW owner_items AS
SELECT a.owner, count(*) AS n, sum(i.qty) AS qty FROM item i JOIN acct a ON i.acct = a.id GROUP BY a.owner;
"""
PG_SOURCE = f"""
CREATE SOURCE up WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432', username = 'postgres',
  database.name = '{DB}', schema.name = 'public', slot.name = '{SLOT}');
"""
MYSQL_SOURCE = f"""
CREATE SOURCE up WITH (connector = 'mysql-cdc', hostname = '127.0.0.1', port = '3306', username = 'root',
  database.name = '{DB}', server.id = '5477');
"""


@dataclass
class Upstream:
    kind: str
    pipeline: str
    #: a new connection for the writer, autocommit off
    connect: Callable[[], Any]
    #: the rows of a query, read on a connection of its own
    rows: Callable[[str], Counter]


def _pg_rows(query: str) -> Counter:
    with psycopg.connect(pg_dsn(DB)) as conn:
        return pg_rows(conn, query)


def _mysql_rows(query: str) -> Counter:
    conn = mysql_connect(DB)
    try:
        with conn.cursor() as cur:
            return mysql_rows(cur, query)
    finally:
        conn.close()


def _mysql_writer() -> Any:
    conn = mysql_connect(DB)
    conn.autocommit(False)
    return conn


@pytest.fixture(params=["postgres", "mariadb"])
def upstream(request: pytest.FixtureRequest) -> Iterator[Upstream]:
    if request.param == "postgres":
        create_pg_database(DB)
        with psycopg.connect(pg_dsn(DB), autocommit=True) as conn:
            for statement in PG_DDL:
                conn.execute(statement)
        tables = TABLES_SQL.format(source="up", acct="public.acct", item="public.item")
        yield Upstream("postgres", PG_SOURCE + tables + VIEW, lambda: psycopg.connect(pg_dsn(DB)), _pg_rows)
        drop_pg_database(DB)
        return
    conn = mysql_connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"USE {DB}")
        for statement in MYSQL_DDL:
            cur.execute(statement)
    tables = TABLES_SQL.format(source="up", acct=f"{DB}.acct", item=f"{DB}.item")
    yield Upstream("mariadb", MYSQL_SOURCE + tables + VIEW, _mysql_writer, _mysql_rows)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
    conn.close()


def owner_items(accts: Counter, items: Counter) -> Counter:
    """The view's query over upstream rows, in Python: items joined to their account's owner,
    counted and their qty summed per owner (a NULL owner is a group; a sum of only NULLs is NULL)."""
    owner = {a[0]: a[1] for a in accts}
    groups: dict[Any, list] = {}
    for (_, acct, qty, _), times in items.items():
        if acct in owner:
            group = groups.setdefault(owner[acct], [0, None])
            group[0] += times
            if qty is not None:
                group[1] = (group[1] or 0) + qty * times
    return Counter((name, n, qty) for name, (n, qty) in groups.items())


def test_random_transactions_through_a_killed_run_equal_upstream(spark, tmp_path: Path, upstream: Upstream) -> None:
    h = make_harness(tmp_path, {"cdc.sql": upstream.pipeline})
    workload = Workload(upstream.connect, SEED, first_key=0, pause=(0.01, 0.08))
    seeding = upstream.connect()
    workload.seed(seeding, accounts=30, item_inserts=40)
    seeding.close()
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")

    workload.start()
    try:
        run_epoch(runtime)  # the snapshots, taken while the writer commits
        run_epoch(runtime)
        # A real run, SIGKILLed after a source wrote its epoch: recovery aborts the epoch, and the
        # next one reads its range again, with what was committed since.
        killed = h.run_subprocess(fault="source-written", timeout=240)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
        runtime.close()
        runtime = h.runtime(spark)
        (cut,) = runtime.controller.epoch_log.in_flight()
        assert runtime.recover("test: a run was SIGKILLed").aborted == [cut.epoch]
        run_epoch(runtime)
    finally:
        workload.finish()
    quiet = run_epoch(runtime)

    done = f"seed {SEED}: {workload.committed} transactions, {workload.rows} row changes, {dict(workload.counts)}"
    assert workload.committed >= 100 and workload.rolled_back > 0, done
    assert all(workload.counts[kind] > 0 for kind in KINDS), done
    accts, items = upstream.rows(ACCT_COLUMNS), upstream.rows(ITEM_COLUMNS)
    assert_same_rows(state_rows(runtime, "acct"), accts, f"CDC table acct ({done})")
    assert_same_rows(state_rows(runtime, "item"), items, f"CDC table item ({done})")
    assert_same_rows(state_rows(runtime, "owner_items"), owner_items(accts, items), f"view owner_items ({done})")
    assert any(note is not None and len(note) >= 10_000 for _, _, _, note in accts)

    # Nothing skipped: the committed ranges tile each table's log from its snapshot (start 0), the
    # quiet epoch's ends are where the next epoch starts, and the log holds none of the table's
    # changes after them.
    ends = {}
    for table in ("acct", "item"):
        # the log's ranges (postgres-cdc's snapshot split counts key chunks applied: it tiles too)
        ranges = [r for r in committed_offsets(runtime, table) if not r.split.endswith("#snapshot")]
        assert ranges[-1].epoch == quiet and cut.epoch not in {r.epoch for r in ranges}
        ends[table] = ranges[-1].end
    following = runtime.controller.epoch_log.inject(runtime.plan).epoch  # hands the committed ends over
    for table, end in ends.items():
        planned = runtime.controller.offsets(following, table)[0]  # postgres-cdc: then the snapshot's
        assert planned.start == end
        assert runtime.connector(table).records(planned.end, planned.start) == []
    if upstream.kind == "postgres":
        # both tables share the slot: it is confirmed up to the lower of their committed ends
        assert slot_confirmed(SLOT) == min(ends.values())
        with psycopg.connect(pg_dsn(DB)) as conn:  # the large notes were stored out of line
            toast = conn.execute("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'acct'")
            assert toast.fetchone()[0] > 0
    else:
        for table, end in ends.items():
            assert json.loads((h.home / "cdc" / table / "committed.json").read_text())["end"] == end
