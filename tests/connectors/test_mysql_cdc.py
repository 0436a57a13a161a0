"""The mysql-cdc source against the real MariaDB server (127.0.0.1:3306, root without a password,
binlog in ROW format: .ci/run configures it).

The CDC table is checked against ``SELECT *`` of the upstream table read independently with PyMySQL.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from pathlib import Path

import pytest

from epochal.connectors import mysql_cdc_server
from epochal.connectors.mysql_cdc_types import RowChange, binlog_records, bytes_between, pack, privilege_problems
from epochal.errors import EpochalError, PipelineError
from epochal.pipeline.loader import load_pipeline
from epochal.runtime.cdc_status import cdc_lines, cdc_status
from tests.connectors.cdc_oracle import mysql_connect, mysql_rows, state_rows
from tests.epochal_harness import make_harness

DB = "epochal_cdc_test"
USER = "epochal_cdc_test"
SOURCE = f"""
CREATE SOURCE shop WITH (connector = 'mysql-cdc', hostname = '127.0.0.1', port = '3306',
  username = 'root', database.name = '{DB}', server.id = '5401');
"""
ORDERS = f"""
CREATE TABLE orders (id BIGINT, customer INT, amount DECIMAL(12,2), status STRING, updated_at TIMESTAMP,
  seen TIMESTAMP, flag BOOLEAN, day DATE, doc STRING, raw STRING, ratio FLOAT, score DOUBLE, code STRING,
  small SMALLINT, PRIMARY KEY (id)) FROM shop TABLE '{DB}.orders';
"""
UPSTREAM_DDL = [
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount decimal(12,2), status text, "
    "updated_at datetime(6), seen timestamp(3) NULL, flag tinyint(1), day date, doc json, raw varbinary(20), "
    "ratio float, score double, code char(10), small smallint)",
    "CREATE TABLE nokey (id int, v text)",
    "CREATE TABLE typed (id int PRIMARY KEY, v decimal(5,1), w bit(3), u bigint unsigned)",
]


@pytest.fixture(scope="module")
def upstream():
    conn = mysql_connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"DROP USER IF EXISTS '{USER}'@'%'")
        cur.execute(f"CREATE DATABASE {DB}")
        cur.execute(f"USE {DB}")
        for statement in UPSTREAM_DDL:
            cur.execute(statement)
        yield cur
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"DROP USER IF EXISTS '{USER}'@'%'")
    conn.close()


def _row(i: int) -> tuple:
    return (
        i,
        i % 3,
        "10.50",
        "new",
        f"2026-01-0{1 + i % 9} 10:00:0{i % 10}.25",
        f"2026-02-01 0{i % 10}:00:00.5",
        i % 2,
        f"2026-03-{10 + i % 9}",
        f'{{"n": {i}}}',
        bytes([i, 255]),
        0.1 + i,
        1e300 / (i + 1),
        f"c{i}",
        -i,
    )


def _insert(cur, ids: list[int]) -> None:  # noqa: ANN001
    cur.execute(  # one statement, several rows
        "INSERT INTO orders VALUES " + ", ".join(["(" + ", ".join(["%s"] * 14) + ")"] * len(ids)),
        [v for i in ids for v in _row(i)],
    )


def _expected(cur) -> Counter:  # noqa: ANN001
    """``SELECT *`` of upstream, with each value as the declared type holds it."""
    return mysql_rows(cur, "SELECT * FROM orders")


def test_snapshot_then_binlog_changes_equal_upstream(spark, tmp_path: Path, upstream, monkeypatch) -> None:
    _insert(upstream, list(range(1, 9)))
    h = make_harness(tmp_path, {"shop.sql": SOURCE + ORDERS})
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")

    # Rows changed while the snapshot is read (by the first source step, after the epoch's binlog
    # range was fixed at injection): those written before the snapshot's position are in its rows
    # and their binlog records, in the next epoch's range, are left out; those after it come through
    # the binlog on top. Neither lost nor doubled.
    taken = mysql_cdc_server.consistent_snapshot

    def write(*statements: str, insert: list[int] | None = None) -> None:
        other = mysql_connect()
        with other.cursor() as cur:
            cur.execute(f"USE {DB}")
            cur.execute("BEGIN")
            for statement in statements:
                cur.execute(statement)
            if insert:
                _insert(cur, insert)
            cur.execute("COMMIT")
        other.close()

    def racing_snapshot(config, columns):  # noqa: ANN001, ANN202
        write("UPDATE orders SET status = 'paid', amount = 99.99 WHERE id IN (1, 2)", "DELETE FROM orders WHERE id = 3")
        context = taken(config, columns)
        offset, batches = context.__enter__()
        write("UPDATE orders SET status = 'late' WHERE id IN (1, 4)", insert=[100])

        class Wrapped:
            def __enter__(self):  # noqa: ANN204
                return offset, batches

            def __exit__(self, *exc):  # noqa: ANN002, ANN204
                return context.__exit__(*exc)

        return Wrapped()

    monkeypatch.setattr(mysql_cdc_server, "consistent_snapshot", racing_snapshot)
    reports = []

    def epoch() -> int:
        number = runtime.controller.epoch_log.inject(runtime.plan).epoch
        reports.append(runtime.run_source(number, "orders"))
        runtime.commit(number)
        return number

    epoch()
    monkeypatch.setattr(mysql_cdc_server, "consistent_snapshot", taken)
    statuses = {r[0]: r[3] for r in state_rows(runtime, "orders")}
    assert statuses == {i: "paid" if i < 3 else "new" for i in (1, 2, 4, 5, 6, 7, 8)}
    assert reports[0].metadata["records_read"] == 7  # the snapshot's rows: the binlog's are past its range
    epoch()
    got, want = state_rows(runtime, "orders"), _expected(upstream)
    assert got == want, (sorted(got - want), sorted(want - got))
    assert {r[0] for r in got} == {1, 2, 4, 5, 6, 7, 8, 100}
    assert reports[1].metadata["records_read"] == 3  # 1 and 4 late, 100: the three before the snapshot left out

    # Multi-statement transactions: an update to NULL, a changed primary key, deletes, a row
    # inserted and deleted in one transaction, a second transaction on the same keys, and a
    # binlog rotation between them (the range crosses files).
    upstream.execute("BEGIN")
    upstream.execute("UPDATE orders SET status = NULL, seen = NULL, doc = NULL, raw = NULL WHERE id = 4")
    upstream.execute("UPDATE orders SET id = 40 WHERE id = 5")
    upstream.execute("DELETE FROM orders WHERE id IN (6, 100)")
    _insert(upstream, [9, 10])
    upstream.execute("DELETE FROM orders WHERE id = 10")
    upstream.execute("COMMIT")
    upstream.execute("FLUSH BINARY LOGS")
    upstream.execute("BEGIN")
    upstream.execute("UPDATE orders SET amount = 1234567890.12, id = 41 WHERE id = 40")
    upstream.execute("UPDATE orders SET status = 'late', flag = NULL WHERE id = 9")
    upstream.execute("COMMIT")
    second = epoch()
    got, want = state_rows(runtime, "orders"), _expected(upstream)
    assert got == want, (sorted(got - want), sorted(want - got))
    assert {r[0] for r in got} == {1, 2, 4, 7, 8, 9, 41}
    (second_range,) = runtime.controller.offsets(second, "orders")
    assert second_range.end >> 32 == (second_range.start >> 32) + 1

    # A re-read of an epoch's range reads the same changes, even after more were committed.
    connector = runtime.connector("orders")
    before = connector.records(second_range.end, second_range.start)
    upstream.execute("UPDATE orders SET status = 'after' WHERE id = 1")
    assert connector.records(second_range.end, second_range.start) == before
    assert [r[-1] for r in before].count("delete") == 5  # 5 -> 40, 6, 100, 10, 40 -> 41
    epoch()
    assert state_rows(runtime, "orders") == _expected(upstream)

    # status and the asset metadata show the server's binlog position, the committed end and the bytes between
    upstream.execute("UPDATE orders SET status = 'pending' WHERE id = 2")
    # an injection hands the committed end over (nothing to confirm upstream)
    runtime.controller.epoch_log.inject(runtime.plan)
    shown = cdc_status(runtime)["orders"]
    assert re.fullmatch(r"mysql-bin\.\d{6}:\d+", shown["server_binlog_position"])
    assert shown["binlog_bytes_behind"] > 0 and shown["lag_seconds"] >= 0
    assert any(
        line.startswith("  orders ") and "binlog bytes behind" in line for line in cdc_lines(cdc_status(runtime))
    )
    assert "server_binlog_position" in reports[-1].metadata

    # An upstream ADD COLUMN is a clear error at the epoch that meets it, not rows of another shape.
    upstream.execute("ALTER TABLE orders ADD COLUMN note text")
    upstream.execute("UPDATE orders SET note = 'x' WHERE id = 1")
    changed = runtime.controller.epoch_log.inject(runtime.plan).epoch
    with pytest.raises(EpochalError, match=rf"upstream table {DB}.orders changed .*added note"):
        runtime.connector("orders").read(spark, runtime.controller.offsets(changed, "orders"))

    # A range whose binlog was purged is refused by name, with the fix, not read short.
    upstream.execute("FLUSH BINARY LOGS")
    upstream.execute("SHOW MASTER STATUS")
    newest = upstream.fetchone()[0]
    upstream.execute(f"PURGE BINARY LOGS TO '{newest}'")
    with pytest.raises(EpochalError, match="was purged from the server .*binlog_expire_logs_seconds"):
        connector.records(second_range.end, second_range.start)


def test_load_refuses_what_cannot_be_read(tmp_path: Path, upstream) -> None:
    def problems(table_sql: str, **source: str) -> str:
        text = SOURCE
        for key, value in source.items():
            if f"{key} = " in text:
                text = re.sub(f"{key} = '[^']*'", f"{key} = '{value}'", text)
            else:
                text = text.replace("WITH (", f"WITH ({key} = '{value}', ")
        directory = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        (directory / "p.sql").write_text(text + table_sql)
        with pytest.raises(PipelineError) as caught:
            load_pipeline(directory)
        return str(caught.value)

    no_key = problems("CREATE TABLE t (id INT, v STRING, PRIMARY KEY (id)) FROM shop TABLE 'nokey';")
    assert f"upstream table {DB}.nokey has no primary key" in no_key and "ADD PRIMARY KEY" in no_key
    typed = problems(
        "CREATE TABLE t (id INT, v DECIMAL(5,2), w STRING, u BIGINT, PRIMARY KEY (id)) FROM shop TABLE 'typed';"
    )
    assert "column 'v' is DECIMAL(5,2), but upstream it is decimal(5,1), which maps to DECIMAL(5,1)" in typed
    assert "column 'w' is STRING, but upstream it is bit(3), which maps to no type" in typed
    assert "column 'u' is BIGINT, but upstream it is bigint(20) unsigned, which maps to no type" in typed
    missing = problems(f"CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE '{DB}.nothere';")
    assert f"table {DB}.nothere does not exist" in missing
    down = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", port="1")
    assert "cannot connect to MySQL/MariaDB at root@127.0.0.1:1" in down
    literal = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", password="hunter2")
    assert "option 'password' is written out: write it as password = '${NAME}'" in literal
    # a user without the replication privileges nor SELECT on the table
    upstream.execute(f"CREATE USER '{USER}'@'%'")
    unprivileged = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", username=USER)
    assert f"user '{USER}'@'%' lacks REPLICATION SLAVE (to read the binlog): GRANT REPLICATION SLAVE" in unprivileged
    assert re.search(rf"may not read {DB}.typed \(.*\): GRANT SELECT ON {DB}.typed TO '{USER}'@'%'", unprivileged)
    # TRUNCATE writes a statement, no row events: it is refused by name at the epoch that meets it
    config = mysql_cdc_server.ServerConfig("127.0.0.1", 3306, "root", "", DB, "typed", 5401)
    with mysql_cdc_server.connect(config) as conn:
        start = mysql_cdc_server.current_offset(conn)
        upstream.execute("INSERT INTO typed VALUES (1, 2.5, NULL, 7)")
        upstream.execute("TRUNCATE TABLE typed")
        upstream.execute("TRUNCATE nokey")
        end = mysql_cdc_server.current_offset(conn)
    changes = mysql_cdc_server.read_changes(config, start, end)
    assert [c.kind for c in changes] == ["insert", "truncate"]
    with pytest.raises(EpochalError, match=rf"upstream table {DB}.typed was truncated .*delete the rows with DELETE"):
        binlog_records(changes, f"{DB}.typed", [("id", "INT")], ["id"], ["id", "v", "w", "u"], start, end)
    direct = problems(
        "CREATE TABLE t (id INT, PRIMARY KEY (id)) WITH (connector = 'mysql-cdc', hostname = 'h', "
        f"username = 'u', database.name = '{DB}', server.id = '1', table.name = 'typed');"
    )
    assert "table t: a mysql-cdc table is declared FROM a source of the connection" in direct
    no_id = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", **{"server.id": "x"})
    assert "option 'server.id' = 'x' is not a replica id" in no_id


def test_a_range_is_read_from_its_start_not_from_the_oldest_binlog(upstream, monkeypatch) -> None:
    """The binlog dump starts at the range's file and position. (It once started at the oldest
    binlog whatever the range: every read decoded the whole history, and once that outlasted the
    server's patience each reconnect began again, and an epoch's read never ended.)"""
    from pymysqlreplication import BinLogStreamReader

    upstream.execute("CREATE TABLE IF NOT EXISTS spans (id int PRIMARY KEY, v text)")
    upstream.execute("INSERT INTO spans VALUES (1, 'before the range')")
    upstream.execute("FLUSH BINARY LOGS")  # an older binlog file with the table's rows in it
    config = mysql_cdc_server.ServerConfig("127.0.0.1", 3306, "root", "", DB, "spans", 5401)
    with mysql_cdc_server.connect(config) as conn:
        start = mysql_cdc_server.current_offset(conn)
        upstream.execute("INSERT INTO spans VALUES (2, 'in the range')")
        end = mysql_cdc_server.current_offset(conn)
    fetch = BinLogStreamReader.fetchone

    def spying(self):  # noqa: ANN001, ANN202
        event = fetch(self)
        # stop at the first event before the range (the whole history could take minutes to read)
        if event is not None and (at := pack(self.log_file, event.packet.log_pos - event.event_size)) < start:
            raise AssertionError(f"read an event at {at}, before the range's start {start}")
        return event

    monkeypatch.setattr(BinLogStreamReader, "fetchone", spying)
    changes = mysql_cdc_server.read_changes(config, start, end)
    assert [(c.kind, c.after["id"]) for c in changes] == [("insert", 2)]


def test_binlog_records_and_positions_are_pure() -> None:
    columns = [("id", "INT"), ("v", "STRING"), ("ok", "BOOLEAN"), ("at", "TIMESTAMP")]
    upstream = ["id", "v", "ok", "at"]
    at = dt.datetime(2026, 1, 1, 10)
    changes = [
        RowChange("insert", 100, None, {"id": 1, "v": "a", "ok": 1, "at": at}),
        RowChange("update", 200, {"id": 1, "v": "a", "ok": 1, "at": at}, {"id": 2, "v": None, "ok": 0, "at": at}),
        RowChange(
            "update", 210, {"id": 2, "v": None, "ok": 0, "at": at}, {"id": 2, "v": b"\x00\xff", "ok": 0, "at": None}
        ),
        RowChange("delete", 220, {"id": 2, "v": "x", "ok": 0, "at": None}, None),
    ]
    utc = at.replace(tzinfo=dt.UTC)
    assert binlog_records(changes, "d.t", columns, ["id"], upstream, 0, 150) == [(1, "a", True, utc, "upsert")]
    assert binlog_records(changes, "d.t", columns, ["id"], upstream, 150, 221) == [
        (1, None, None, None, "delete"),
        (2, None, False, utc, "upsert"),
        (2, "\\x00ff", False, None, "upsert"),
        (2, None, None, None, "delete"),
    ]
    dropped = [RowChange("insert", 100, None, {"id": 1, "v": "a", "ok": 1})]
    with pytest.raises(EpochalError, match="dropped at"):
        binlog_records(dropped, "d.t", columns, ["id"], upstream, 0, 150)
    # offsets order as the binlog does, across files
    assert pack("mysql-bin.000002", 4) > pack("mysql-bin.000001", 2**31)
    sizes = [("mysql-bin.000001", 1000), ("mysql-bin.000002", 500), ("mysql-bin.000003", 300)]
    assert bytes_between(pack("mysql-bin.000001", 900), pack("mysql-bin.000003", 50), sizes) == 100 + 500 + 50
    assert privilege_problems(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`"], "root") == []
    assert privilege_problems(["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%`"], "u") == []
    (lacking,) = privilege_problems(["GRANT REPLICATION SLAVE ON *.* TO `u`@`%`"], "u")
    assert "lacks REPLICATION CLIENT" in lacking
