"""The postgres-cdc source against the real PostgreSQL server (127.0.0.1:5432, wal_level=logical).

The CDC table is checked against ``SELECT *`` of the upstream table read independently with psycopg.
"""

from __future__ import annotations

import os
import re
import struct
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from epochal.connectors import pg_cdc_server
from epochal.connectors.pg_cdc_changes import UnreadableValue, UpstreamChanged, wal_records
from epochal.connectors.pgoutput import lsn_int, lsn_text
from epochal.errors import EpochalError, PipelineError
from epochal.pipeline.loader import load_pipeline
from epochal.runtime.cdc_status import cdc_lines, cdc_status
from tests.connectors.cdc_oracle import (
    create_pg_database,
    drop_pg_database,
    pg_dsn,
    pg_rows,
    slot_confirmed,
    state_rows,
)
from tests.epochal_harness import make_harness

DB = "epochal_cdc_test"
UPSTREAM = pg_dsn(DB)
SLOT = "epochal_cdc_test_slot"

SOURCE = f"""
CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
  username = 'postgres', password = '${{CDC_TEST_PASSWORD}}', database.name = '{DB}',
  schema.name = 'public', slot.name = '{SLOT}', publication.name = '{SLOT}');
"""
ORDERS = """
CREATE TABLE orders (id BIGINT, customer INT, amount DECIMAL(12,2), status STRING, updated_at TIMESTAMP,
  seen TIMESTAMPTZ_IS_TIMESTAMP, flag BOOLEAN, day DATE, ref STRING, doc STRING, raw STRING, ratio FLOAT,
  score DOUBLE, code STRING, PRIMARY KEY (id)) FROM shop TABLE 'public.orders';
""".replace("TIMESTAMPTZ_IS_TIMESTAMP", "TIMESTAMP")
BIDS = """CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  date_time TIMESTAMP, extra STRING) WITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid');"""
ITEMS = "CREATE TABLE items (sku STRING PRIMARY KEY, qty INT) FROM shop TABLE 'items';"
UPSTREAM_DDL = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount numeric(12,2), status text, updated_at timestamp,
  seen timestamptz, flag boolean, day date, ref uuid, doc jsonb, raw bytea, ratio real, score double precision,
  code varchar(10));
CREATE TABLE items (sku text PRIMARY KEY, qty int);
CREATE TABLE nokey (id int, v text);
CREATE TABLE typed (id int PRIMARY KEY, v numeric(5,1), w int4range);
CREATE TABLE notes (id int PRIMARY KEY, qty int, note text);
CREATE TABLE special (id int PRIMARY KEY, at timestamp, day date, amount numeric(12,2));
"""
NOTES = "CREATE TABLE notes (id INT, qty INT, note STRING, PRIMARY KEY (id)) FROM shop TABLE 'notes';"


SPECIAL = """CREATE TABLE special (id INT, at TIMESTAMP, day DATE, amount DECIMAL(12,2), PRIMARY KEY (id))
  FROM shop TABLE 'special';"""


@pytest.fixture(scope="module")
def upstream():
    create_pg_database(DB)
    with psycopg.connect(UPSTREAM, autocommit=True) as conn:
        conn.execute(UPSTREAM_DDL)
        yield conn
    drop_pg_database(DB)


def _row(i: int, status: str | None = "new", amount: str = "10.50") -> tuple:
    return (
        i,
        i % 3,
        amount,
        status,
        f"2026-01-0{1 + i % 9} 10:00:0{i % 10}.25",
        f"2026-02-01 0{i % 10}:00:00+02",
        i % 2 == 0,
        f"2026-03-{10 + i % 9}",
        f"00000000-0000-0000-0000-{i:012d}",
        f'{{"n": {i}}}',
        bytes([i, 255]),
        0.5 + i,
        1e300 / (i + 1),
        f"c{i}",
    )


def _insert(conn: psycopg.Connection, ids: range | list[int]) -> None:
    conn.execute(  # one statement, several rows
        "INSERT INTO orders VALUES " + ", ".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(ids)),
        [v for i in ids for v in _row(i)],
    )


def _expected(conn: psycopg.Connection) -> Counter:
    """``SELECT *`` of upstream, with each value as the declared type holds it."""
    return pg_rows(
        conn,
        "SELECT id, customer, amount, status, updated_at, seen, flag, day, ref::text, doc::text, "
        "'\\x' || encode(raw, 'hex'), ratio, score, code FROM orders",
    )


def test_snapshot_then_live_changes_equal_upstream_through_recovery(
    spark, tmp_path: Path, upstream, monkeypatch
) -> None:
    monkeypatch.setenv("CDC_TEST_PASSWORD", "")
    _insert(upstream, range(1, 9))
    upstream.execute("INSERT INTO items VALUES ('a', 1), ('b', 2)")
    # two tables share the slot: it is advanced to the lower of their committed ends
    h = make_harness(tmp_path, {"shop.sql": SOURCE + ORDERS + ITEMS})
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")

    # Rows changed while the snapshot is read (the epoch's WAL range was fixed at injection, before):
    # those committed before the snapshot's consistent point are in its rows and their WAL records,
    # in the next epoch's range, are left out; those after it come through the WAL on top. Neither
    # lost nor doubled.
    taken = pg_cdc_server.exported_snapshot

    @contextmanager
    def racing_snapshot(config):  # noqa: ANN001, ANN202
        if config.table != "orders":
            with taken(config) as taking:
                yield taking
            return
        with psycopg.connect(UPSTREAM, autocommit=True) as other:
            with other.transaction():
                other.execute("UPDATE orders SET status = 'paid', amount = 99.99 WHERE id IN (1, 2)")
                other.execute("DELETE FROM orders WHERE id = 3")
            with taken(config) as (lsn, exported):
                with other.transaction():
                    other.execute("UPDATE orders SET status = 'late' WHERE id IN (1, 4)")
                    _insert(other, [100])
                yield lsn, exported

    monkeypatch.setattr(pg_cdc_server, "exported_snapshot", racing_snapshot)

    def epoch(run: bool = True) -> int:
        number = runtime.controller.epoch_log.inject(runtime.plan).epoch
        if run:
            finish(number)
        return number

    reports = []

    def finish(number: int) -> None:
        reports.append(runtime.run_source(number, "orders"))
        runtime.run_source(number, "items")
        runtime.commit(number)

    first = epoch()
    monkeypatch.setattr(pg_cdc_server, "exported_snapshot", taken)
    after_snapshot = {r[0]: r[3] for r in state_rows(runtime, "orders")}
    assert after_snapshot == {1: "paid", 2: "paid", 4: "new", 5: "new", 6: "new", 7: "new", 8: "new"}
    assert reports[0].metadata["records_read"] == 7  # the snapshot's rows; the WAL had nothing before it
    assert reports[0].metadata["snapshot_chunks"] == "1/1"
    epoch()
    got, want = state_rows(runtime, "orders"), _expected(upstream)
    assert got == want, (sorted(got - want), sorted(want - got))
    assert len(got) == 8  # 1..8 without 3, with 100
    assert reports[1].metadata["records_read"] == 3  # 1 and 4 late, 100: the three before the snapshot left out

    # Multi-statement transactions: an update to NULL, a changed primary key, deletes, a row
    # inserted and deleted in one transaction, and a second transaction on the same keys.
    with upstream.transaction():
        upstream.execute("UPDATE orders SET status = NULL, seen = NULL, doc = NULL WHERE id = 4")
        upstream.execute("UPDATE orders SET id = 40 WHERE id = 5")
        upstream.execute("DELETE FROM orders WHERE id IN (6, 100)")
        _insert(upstream, [9, 10])
        upstream.execute("DELETE FROM orders WHERE id = 10")
    with upstream.transaction():
        upstream.execute("UPDATE orders SET amount = 1234567890.12, id = 41 WHERE id = 40")
        upstream.execute("UPDATE orders SET status = 'late' WHERE id = 9")
        upstream.execute("UPDATE items SET sku = 'c', qty = NULL WHERE sku = 'a'")
    second = epoch()
    assert state_rows(runtime, "orders") == _expected(upstream)
    assert {r[0] for r in state_rows(runtime, "orders")} == {1, 2, 4, 7, 8, 9, 41}
    assert Counter(map(tuple, runtime.state("items").collect())) == Counter([("b", 2), ("c", None)])

    # A re-read of an epoch's range reads the same changes, even after more were committed.
    second_range, snapshot_range = runtime.controller.offsets(second, "orders")
    assert snapshot_range.split == "public.orders#snapshot" and snapshot_range.count == 0  # done
    connector = runtime.connector("orders")
    before = connector.records(second_range.end, second_range.start)
    upstream.execute("UPDATE orders SET status = 'after' WHERE id = 1")
    assert connector.records(second_range.end, second_range.start) == before
    assert [r[-1] for r in before].count("delete") == 5  # 5 -> 40, 6, 100, 10, 40 -> 41

    # An epoch read and then aborted by a recovery is read again, with what came after it.
    third = epoch(run=False)
    runtime.run_source(third, "orders")
    assert third in runtime.recover("test: the run died after reading one source").aborted
    upstream.execute("UPDATE orders SET customer = 7 WHERE id = 2")
    plan = runtime.plan

    def plan_with_a_write_between(source: str, starts: dict) -> list:
        ranges = plan(source, starts)
        if source == "orders":  # items is planned after: at a later LSN
            upstream.execute("UPDATE items SET qty = 3 WHERE sku = 'b'")
        return ranges

    monkeypatch.setattr(runtime, "plan", plan_with_a_write_between)
    fourth = epoch()
    monkeypatch.setattr(runtime, "plan", plan)
    assert fourth > third
    assert state_rows(runtime, "orders") == _expected(upstream)

    # The slot's confirmed position follows the committed epochs, never an in-flight one.
    ends = {t: runtime.controller.offsets(fourth, t)[0].end for t in ("orders", "items")}
    assert ends["orders"] < ends["items"]
    assert Counter(map(tuple, runtime.state("items").collect())) == Counter([("b", 3), ("c", None)])
    in_flight = epoch(run=False)
    assert slot_confirmed(SLOT) == ends["orders"]
    assert runtime.controller.offsets(in_flight, "items")[0].start == ends["items"]
    # status and the asset metadata show where the slot and the server are, and what is retained
    (shown,) = [v for k, v in cdc_status(runtime).items() if k == "orders"]
    assert shown["slot_confirmed_lsn"] == lsn_text(ends["orders"])
    assert lsn_int(shown["server_lsn"]) >= ends["items"] and shown["slot_retained_wal_bytes"] > 0
    lines = cdc_lines(cdc_status(runtime))
    assert any(line.startswith("  orders ") and lsn_text(ends["orders"]) in line for line in lines)
    assert reports[-1].metadata["server_lsn"] and "slot_retained_wal_bytes" in reports[-1].metadata
    # records counted as records, not as the LSN range's WAL bytes: ids 1 (aborted epoch's range) and 2
    assert reports[-1].metadata["records_read"] == 2

    # An upstream ADD COLUMN is a clear error at the epoch that meets it, not rows of another shape.
    upstream.execute("ALTER TABLE orders ADD COLUMN note text")
    upstream.execute("UPDATE orders SET note = 'x' WHERE id = 1")
    changed = epoch(run=False)
    with pytest.raises(UpstreamChanged, match=r"upstream table public.orders changed .*column\(s\) note added"):
        runtime.connector("orders").read(spark, runtime.controller.offsets(changed, "orders"))

    # A table that leaves the pipeline leaves the publication; with the last table of the slot, the
    # slot and the publication Epochal created are dropped (a slot left behind keeps WAL forever).
    def upstream_objects() -> tuple[list, list]:
        slots = upstream.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", [DB]).fetchall()
        published = upstream.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", [SLOT])
        return [r[0] for r in slots], [r[0] for r in published.fetchall()]

    assert upstream_objects() == ([SLOT], ["orders", "items"]) or upstream_objects() == ([SLOT], ["items", "orders"])
    (h.pipeline_dir / "shop.sql").write_text(SOURCE + ITEMS)
    h.runtime(spark).apply_pipeline_changes()
    assert upstream_objects() == ([SLOT], ["items"])
    (h.pipeline_dir / "shop.sql").write_text(BIDS)
    h.runtime(spark).apply_pipeline_changes()
    assert upstream_objects() == ([], [])
    assert not upstream.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [SLOT]).fetchall()
    assert first < second


def test_an_unchanged_toasted_value_is_taken_from_the_row(spark, tmp_path: Path, upstream, monkeypatch) -> None:
    """PostgreSQL does not send a large (TOASTed) value that an update left unchanged, unless the
    table's replica identity is FULL (``notes``'s is the default): the value is the row's, from the
    key's earlier record in the same epoch or else from the table's state."""
    monkeypatch.setenv("CDC_TEST_PASSWORD", "")

    def big(i: int) -> str:
        return f"{i}-" + os.urandom(6000).hex()  # random: it does not compress under the TOAST threshold

    upstream.execute("INSERT INTO notes VALUES (1, 1, %s), (2, 2, 'small')", [big(1)])
    h = make_harness(tmp_path, {"shop.sql": SOURCE + NOTES})
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")

    def epoch(run: bool = True) -> int:
        number = runtime.controller.epoch_log.inject(runtime.plan).epoch
        if run:
            runtime.run_source(number, "notes")
            runtime.commit(number)
        return number

    def expected() -> Counter:
        return pg_rows(upstream, "SELECT id, qty, note FROM notes")

    epoch()  # the snapshot
    with upstream.transaction():
        upstream.execute("UPDATE notes SET qty = 10 WHERE id = 1")  # the value is in the state
        upstream.execute("INSERT INTO notes VALUES (3, 3, %s)", [big(3)])
        upstream.execute("UPDATE notes SET qty = 30 WHERE id = 3")  # in the epoch's earlier record
        upstream.execute("UPDATE notes SET qty = 31 WHERE id = 3")  # and again
        upstream.execute("UPDATE notes SET qty = NULL, note = NULL WHERE id = 2")
    second = epoch()
    assert state_rows(runtime, "notes") == expected()
    taken, _ = runtime.controller.offsets(second, "notes")  # the WAL's range, the snapshot's
    sent = runtime.connector("notes").records(taken.end, taken.start)
    assert [r[:2] + r[3:] for r in sent if len(r) == 5] == [
        (1, 10, "upsert", ("note",)),
        (3, 30, "upsert", ("note",)),
        (3, 31, "upsert", ("note",)),
    ]
    upstream.execute("UPDATE notes SET qty = 32 WHERE id = 3")  # from the state again, a later epoch
    epoch()
    assert state_rows(runtime, "notes") == expected()

    # A changed primary key with the value unchanged: no row holds it under the new key
    upstream.execute("UPDATE notes SET id = 4 WHERE id = 3")
    moved = epoch(run=False)
    with pytest.raises(EpochalError, match="changed the primary key .*REPLICA IDENTITY FULL"):
        runtime.run_source(moved, "notes")
    runtime.recover("test: the epoch failed")
    (h.pipeline_dir / "shop.sql").write_text(BIDS)  # drops the slot
    h.runtime(spark).apply_pipeline_changes()


def test_load_refuses_what_cannot_be_read(tmp_path: Path, upstream) -> None:
    def problems(table_sql: str, **source: str) -> str:
        text = SOURCE.replace("${CDC_TEST_PASSWORD}", "")
        for key, value in source.items():
            text = re.sub(f"{key} = '[^']*'", f"{key} = '{value}'", text)
        directory = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        (directory / "p.sql").write_text(text + table_sql)
        with pytest.raises(PipelineError) as caught:
            load_pipeline(directory)
        return str(caught.value)

    no_key = problems("CREATE TABLE t (id INT, v STRING, PRIMARY KEY (id)) FROM shop TABLE 'public.nokey';")
    assert "has no primary key" in no_key and "REPLICA IDENTITY" in no_key
    typed = problems("CREATE TABLE t (id INT, v DECIMAL(5,2), w STRING, PRIMARY KEY (id)) FROM shop TABLE 'typed';")
    assert "column 'v' is DECIMAL(5,2), but upstream it is numeric(5,1), which maps to DECIMAL(5,1)" in typed
    assert "column 'w' is STRING, but upstream it is int4range, which maps to no type" in typed
    missing = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'public.nothere';")
    assert "table public.nothere does not exist" in missing
    down = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", port="1")
    assert "cannot connect to PostgreSQL at postgres@127.0.0.1:1/" in down
    literal = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM shop TABLE 'typed';", password="hunter2")
    assert "option 'password' is written out: write it as password = '${NAME}'" in literal
    direct = problems(
        f"CREATE TABLE t (id INT, PRIMARY KEY (id)) WITH (connector = 'postgres-cdc', hostname = 'h', "
        f"username = 'u', database.name = '{DB}', slot.name = 's', table.name = 'typed');"
    )
    assert "table t: a postgres-cdc table is declared FROM a source of the connection" in direct
    unknown = problems("CREATE TABLE t (id INT, PRIMARY KEY (id)) FROM nowhere TABLE 'typed';")
    assert "reads FROM nowhere" in unknown


def _relation(oid: int, columns: list[str]) -> bytes:
    body = struct.pack("!I", oid) + b"public\0orders\0" + b"d" + struct.pack("!h", len(columns))
    for i, name in enumerate(columns):
        body += struct.pack("!B", 1 if i == 0 else 0) + name.encode() + b"\0" + struct.pack("!Ii", 23, -1)
    return b"R" + body


def _tuple(values: list[str | None]) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        out += b"n" if v is None else b"t" + struct.pack("!i", len(v.encode())) + v.encode()
    return out


def test_pgoutput_transactions_are_kept_whole_by_commit_lsn_and_changes_are_refused_by_name() -> None:
    def begin(lsn: int) -> bytes:
        return b"B" + struct.pack("!QqI", lsn, 0, 1)

    commit = b"C" + struct.pack("!BQQq", 0, 0, 0, 0)
    messages = [
        _relation(7, ["id", "v"]),
        begin(100),
        b"I" + struct.pack("!I", 7) + b"N" + _tuple(["1", "a"]),
        commit,
        begin(200),
        b"U" + struct.pack("!I", 7) + b"K" + _tuple(["1", None]) + b"N" + _tuple(["2", None]),  # key 1 -> 2, v NULL
        b"D" + struct.pack("!I", 7) + b"K" + _tuple(["2", None]),
        b"I" + struct.pack("!I", 7) + b"N" + _tuple(["3", "c"]),
        commit,
    ]
    columns = [("id", "INT"), ("v", "STRING")]
    table = ("public", "orders")
    assert wal_records(messages, table, columns, ["id"], ["id", "v"], 0, 150) == [(1, "a", "upsert")]
    assert wal_records(messages, table, columns, ["id"], ["id", "v"], 150, 201) == [
        (1, None, "delete"),
        (2, None, "upsert"),
        (2, None, "delete"),
        (3, "c", "upsert"),
    ]
    assert wal_records(messages, table, columns, ["id"], ["id", "v"], 201, 300) == []
    with pytest.raises(UpstreamChanged, match=r"column\(s\) w added"):
        wal_records([_relation(7, ["id", "v", "w"])], table, columns, ["id"], ["id", "v"], 0, 300)
    # An unchanged TOASTed value comes from the whole old row (REPLICA IDENTITY FULL), never from a
    # key tuple, whose other columns are NULL: that is an error naming the fix.
    toasted = _tuple(["1", None])[:-1] + b"u"
    full = b"U" + struct.pack("!I", 7) + b"O" + _tuple(["1", "big"]) + b"N" + toasted
    assert wal_records(
        [_relation(7, ["id", "v"]), begin(100), full, commit], table, columns, ["id"], ["id", "v"], 0, 300
    ) == [(1, "big", "upsert")]
    # A key tuple (the default replica identity) does not have it: the record names it, and the
    # row's value is taken from Epochal's state (storage.upsert.UNCHANGED_COLUMN).
    keyed = b"U" + struct.pack("!I", 7) + b"K" + _tuple(["1", None]) + b"N" + toasted
    assert wal_records(
        [_relation(7, ["id", "v"]), begin(100), keyed, commit], table, columns, ["id"], ["id", "v"], 0, 300
    ) == [(1, None, "upsert", ("v",))]
    # ... unless the key changed (2 -> 1): no row holds the value under the new key
    moved = b"U" + struct.pack("!I", 7) + b"K" + _tuple(["2", None]) + b"N" + toasted
    with pytest.raises(EpochalError, match="changed the primary key .*REPLICA IDENTITY FULL"):
        wal_records([_relation(7, ["id", "v"]), begin(100), moved, commit], table, columns, ["id"], ["id", "v"], 0, 300)
    truncate = b"T" + struct.pack("!iBI", 1, 0, 7)
    with pytest.raises(UpstreamChanged, match="public.orders .*was truncated"):
        wal_records(
            [_relation(7, ["id", "v"]), begin(100), truncate, commit], table, columns, ["id"], ["id", "v"], 0, 300
        )


def test_infinite_timestamps_are_spark_s_ends_and_a_nan_is_refused_by_column(
    spark, tmp_path: Path, upstream, monkeypatch
) -> None:
    """PostgreSQL's 'infinity' and '-infinity' (timestamp, date) become the ends of Spark's range, in
    the snapshot and in the WAL alike (as Debezium maps them to its extreme values); a numeric NaN,
    which no DECIMAL holds, stops the epoch with an error naming the column, the table and the fix."""
    monkeypatch.setenv("CDC_TEST_PASSWORD", "")
    upstream.execute("INSERT INTO special VALUES (1, 'infinity', '-infinity', 1.5), (2, '-infinity', 'infinity', 2)")
    h = make_harness(tmp_path, {"shop.sql": SOURCE + SPECIAL})
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")

    def epoch() -> None:
        number = runtime.controller.epoch_log.inject(runtime.plan).epoch
        runtime.run_source(number, "special")
        runtime.commit(number)

    def rows() -> set[tuple]:
        shown = runtime.state("special").selectExpr(
            "id", "unix_micros(at)", "cast(day AS STRING)", "cast(amount AS STRING)"
        )
        return {tuple(r) for r in shown.collect()}

    last, first = 253402300799999999, -62135596800000000  # 9999-12-31 23:59:59.999999 and 0001-01-01, UTC
    epoch()  # the snapshot
    assert rows() == {(1, last, "0001-01-01", "1.50"), (2, first, "9999-12-31", "2.00")}
    upstream.execute("INSERT INTO special VALUES (3, 'infinity', 'infinity', 3)")
    epoch()  # the WAL
    assert (3, last, "9999-12-31", "3.00") in rows()
    upstream.execute("INSERT INTO special VALUES (4, now(), current_date, 'NaN')")
    with pytest.raises(UnreadableValue, match=r"column 'amount' of public.special .*holds 'NaN'.*CHECK constraint"):
        epoch()
    upstream.execute("DELETE FROM special")
    runtime.recover("test: done")
    (h.pipeline_dir / "shop.sql").write_text(BIDS)  # the slot and the publication go with the table
    h.runtime(spark).apply_pipeline_changes()


def test_a_value_the_declared_type_cannot_hold_is_named_in_the_snapshot_too() -> None:
    from epochal.connectors.cdc_snapshot import arrow_schema
    from epochal.connectors.pg_cdc_snapshot import typed_table
    from epochal.pipeline.model import Column

    columns = (Column("id", "INT"), Column("amount", "DECIMAL(12,2)"), Column("at", "TIMESTAMP"))
    table = typed_table(b"1,2.50,infinity\n2,,-infinity\n", columns, arrow_schema(columns), "public.t (chunk 0)")
    assert table.column("at").to_pylist()[0].year == 9999 and table.column("at").to_pylist()[1].year == 1
    with pytest.raises(UnreadableValue, match=r"column 'amount' of public.t \(chunk 0\) holds 'NaN'"):
        typed_table(b"1,NaN,2024-01-01 00:00:00\n", columns, arrow_schema(columns), "public.t (chunk 0)")
