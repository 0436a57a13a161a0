"""The PostgreSQL sink target against real servers: the shared one on 127.0.0.1:5432 (trust auth,
prepared transactions on), and a scratch server this module starts itself with password auth and
``max_prepared_transactions = 0``, so the wrong-password and no-2PC errors come from a real server.

Tests call the target as the coordinator does, driver-side: ``write`` per writer, then ``commit`` or
``abort``. Every test drops its database after rolling back whatever it left prepared.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkDataError,
    SinkError,
    SinkSchemaError,
    WriterTask,
)
from epochal.sinks.postgres_sink import PostgresTarget, max_prepared_transactions_message
from epochal.sinks.spec import sink_spec, validate_sink

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
WORKTREE = Path(__file__).resolve().parents[2]


def _drop_database(url_base: str, name: str) -> None:
    """Roll back what the test left prepared in ``name`` (a database holding prepared transactions
    cannot be dropped, even WITH (FORCE)), then drop it."""
    with psycopg.connect(f"{url_base}/{name}", autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"):
            conn.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
    with psycopg.connect(f"{url_base}/postgres", autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


@pytest.fixture
def database():
    name = f"epochal_sink_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {ADMIN} ({exc}); .ci/run starts it")
    with admin:
        slots = int(admin.execute("SHOW max_prepared_transactions").fetchone()[0])
        if slots == 0:
            pytest.fail("the PostgreSQL on 127.0.0.1:5432 has max_prepared_transactions = 0; .ci/run turns it on")
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    _drop_database("postgresql://postgres@127.0.0.1:5432", name)


def sql_rows(database: str, query: str) -> list[tuple]:
    """What another session sees."""
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description else []


def prepared(database: str) -> list[str]:
    return [r[0] for r in sql_rows(database, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def target(database: str, table: str = "out", sink: str = "out_sink", columns=("id", "name"), **options):
    opts = {"connector": "postgres", "host": "127.0.0.1", "user": "postgres", "database": database, "table": table}
    opts.update(options)
    return PostgresTarget(sink, opts, list(columns), Path("."), None)


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def rows(schema: pa.Schema, data: list[tuple], weights: list[int] | None = None) -> pa.RecordBatch:
    weights = weights or [1] * len(data)
    arrays = [pa.array([r[i] for r in data], f.type) for i, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays([*arrays, pa.array(weights, pa.int64())], names=[*schema.names, WEIGHT])


def write_all(t: PostgresTarget, batch: BatchId, parts: list[list[pa.RecordBatch]]) -> list[dict]:
    """Each part is one writer's input, as the coordinator spreads a batch."""
    n = len(parts)
    bounds = [256 * i // n for i in range(n + 1)]
    return [
        dict(t.write(WriterTask(batch, w, n, (bounds[w], bounds[w + 1] - 1)), iter(part)))
        for w, part in enumerate(parts)
    ]


# ---------------------------------------------------------------------------------------------- delivery


def test_append_only_is_invisible_until_commit_and_commit_is_idempotent(database: str) -> None:
    t = target(database, writers="3")
    t.prepare_target(SCHEMA)
    batch = BatchId("out_sink", 1, 2, 1, "n1")
    metadata = write_all(
        t,
        batch,
        [
            [rows(SCHEMA, [(1, "a"), (2, None)], [1, 2])],  # weight 2: two copies
            [rows(SCHEMA, [(3, "")]), rows(SCHEMA, [(4, 'q"uote,\nline')])],
            [],  # a writer with no rows still prepares: it carries its progress row
        ],
    )
    assert [m["rows"] for m in metadata] == [3, 2, 0]
    assert all(m["gid"].startswith("epochal:out_sink:public.out:1-2-1-n1:w") for m in metadata)
    # Prepared, durable, and invisible to everyone else.
    assert sorted(prepared(database)) == sorted(m["gid"] for m in metadata)
    assert sql_rows(database, "SELECT count(*) FROM out") == [(0,)]
    assert t.delivered_epoch() is None

    t.commit(batch, metadata)
    expected = [(1, "a"), (2, None), (2, None), (3, ""), (4, 'q"uote,\nline')]
    assert sorted(sql_rows(database, "SELECT id, name FROM out"), key=repr) == sorted(expected, key=repr)
    assert prepared(database) == []
    assert t.delivered_epoch() == 2 and t.row_count() == 5

    t.commit(batch, metadata)  # the coordinator may commit again after a crash
    assert t.row_count() == 5 and t.delivered_epoch() == 2


def test_upsert_deletes_before_inserts_and_updates_by_key(database: str) -> None:
    t = target(database, type="upsert", primary_key="id", writers="2")
    t.prepare_target(SCHEMA)
    first = BatchId("out_sink", 1, 1)
    t.commit(first, write_all(t, first, [[rows(SCHEMA, [(1, "a"), (2, "b")])], [rows(SCHEMA, [(3, "c")])]]))
    second = BatchId("out_sink", 2, 3)
    metadata = write_all(
        t,
        second,
        [
            # key 1 deleted; key 2 updated (its old row goes, its new one comes, in either order)
            [rows(SCHEMA, [(2, "B"), (1, "a"), (2, "b")], [1, -1, -1])],
            # key 3 written again without a delete first (ON CONFLICT updates it), key 4 is new
            [rows(SCHEMA, [(3, "C"), (4, "d")])],
        ],
    )
    assert sorted(sql_rows(database, "SELECT id, name FROM out")) == [(1, "a"), (2, "b"), (3, "c")]
    t.commit(second, metadata)
    assert sorted(sql_rows(database, "SELECT id, name FROM out")) == [(2, "B"), (3, "C"), (4, "d")]
    assert t.delivered_epoch() == 3
    # the staging tables lived and died inside the prepared transactions
    assert sql_rows(database, "SELECT count(*) FROM pg_class WHERE relname LIKE '_epochal_stage%'") == [(0,)]


def test_every_mapped_type_round_trips(database: str) -> None:
    schema = pa.schema(
        [
            ("i64", pa.int64()),
            ("i32", pa.int32()),
            ("i16", pa.int16()),
            ("f64", pa.float64()),
            ("f32", pa.float32()),
            ("s", pa.string()),
            ("ls", pa.large_string()),
            ("b", pa.bool_()),
            ("d", pa.date32()),
            ("tz", pa.timestamp("us", tz="America/St_Johns")),
            ("ts", pa.timestamp("us")),
            ("dec", pa.decimal128(12, 3)),
            ("bin", pa.binary()),
        ]
    )
    moment = dt.datetime(2026, 3, 1, 12, 30, 45, 123456)
    data = [
        (
            2**62,
            -(2**31),
            -(2**15),
            0.1,
            1.5,
            "",
            'ü,"x"\n\\N',
            True,
            dt.date(2026, 1, 2),
            moment.replace(tzinfo=dt.UTC),
            moment,
            Decimal("-123456789.125"),
            b"\x00\xff,\n",
        ),
        (None,) * 13,
        (
            1,
            2,
            3,
            math.inf,
            -math.inf,
            "NULL",
            "\\",
            False,
            dt.date(1, 1, 1),
            dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
            dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
            Decimal("0.001"),
            b"",
        ),
        (0, 0, 0, 5e-324, 3.4028234663852886e38, "tab\there", "x" * 10_000, None, None, None, None, None, None),
        (-1, -1, -1, math.nan, math.nan, " ", " lead", True, None, None, None, None, None),
    ]
    # timestamptz values travel as UTC text: the writer must not read them in the server's zone
    sql_rows(database, f"ALTER DATABASE {database} SET TimeZone = 'Asia/Kathmandu'")
    t = target(database, table="typed", columns=schema.names)
    t.prepare_target(schema)
    types = dict(
        sql_rows(database, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'typed'")
    )
    assert types == {
        "i64": "bigint", "i32": "integer", "i16": "smallint", "f64": "double precision", "f32": "real",
        "s": "text", "ls": "text", "b": "boolean", "d": "date", "tz": "timestamp with time zone",
        "ts": "timestamp without time zone", "dec": "numeric", "bin": "bytea",
    }  # fmt: skip
    batch = BatchId("out_sink", 7, 7)
    t.commit(batch, write_all(t, batch, [[rows(schema, data)]]))
    got = sorted(sql_rows(database, "SELECT * FROM typed"), key=lambda r: (r[0] is None, r[0] or 0))
    want = sorted(data, key=lambda r: (r[0] is None, r[0] or 0))
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(schema.names, g, w, strict=True):
            if isinstance(b, float) and math.isnan(b):
                assert math.isnan(a), name
            elif name == "f32" and b is not None:
                assert a == pytest.approx(b, rel=1e-7), name
            elif name == "bin" and b is not None:
                assert bytes(a) == b, name
            else:
                assert a == b, (name, a, b)


# ---------------------------------------------------------------------------------------------- abort


def test_abort_orphans_rolls_back_unknown_batches_and_keeps_pending_ones(database: str) -> None:
    t = target(database, writers="2")
    t.prepare_target(SCHEMA)
    other = target(database, table="other", sink="other_sink")
    other.prepare_target(SCHEMA)
    kept = BatchId("out_sink", 1, 1, 1, "run1")
    orphan = BatchId("out_sink", 2, 2, 1, "run2")
    kept_meta = write_all(t, kept, [[rows(SCHEMA, [(1, "kept")])], []])
    orphan_meta = write_all(t, orphan, [[rows(SCHEMA, [(2, "orphan")])], []])
    other_meta = write_all(other, BatchId("other_sink", 2, 2, 1, "run2"), [[rows(SCHEMA, [(9, "x")])]])

    assert t.abort_orphans([kept]) == 2
    remaining = set(prepared(database))
    assert remaining == {m["gid"] for m in kept_meta + other_meta}  # another sink's are never touched
    assert t.abort_orphans([kept]) == 0
    t.commit(kept, kept_meta)
    assert sql_rows(database, "SELECT id, name FROM out") == [(1, "kept")]
    with pytest.raises(PrecommitLost, match="out_sink, epoch 2"):
        t.commit(orphan, orphan_meta)

    # abort: the listed gids, and any other gid of the batch (a writer whose result never came back)
    third = BatchId("out_sink", 2, 2, 2, "run1")
    meta = write_all(t, third, [[rows(SCHEMA, [(3, "c")])], [rows(SCHEMA, [(4, "d")])]])
    t.abort(third, [*meta[:1], {"writer": 1}])  # writer 1 failed: no gid
    t.abort(third, meta[:1])  # idempotent
    with pytest.raises(SinkError, match="not this batch's"):
        t.abort(third, kept_meta)  # never another batch's
    assert set(prepared(database)) == {m["gid"] for m in other_meta}
    assert sql_rows(database, "SELECT id FROM out") == [(1,)]


def test_task_retry_replaces_the_earlier_attempts_prepared_transaction(database: str) -> None:
    # Upsert: the first attempt's prepared transaction holds row locks on the very keys the retry
    # writes; without rolling it back, the retry would wait on them forever.
    t = target(database, type="upsert", primary_key="id", writers="1")
    t.prepare_target(SCHEMA)
    batch = BatchId("out_sink", 1, 1)
    task = WriterTask(batch, 0, 1, (0, 255))
    first = t.write(task, iter([rows(SCHEMA, [(1, "a")])]))
    started = time.monotonic()
    retry = t.write(task, iter([rows(SCHEMA, [(1, "a")])]))
    assert time.monotonic() - started < 30
    assert first["gid"] != retry["gid"] and prepared(database) == [retry["gid"]]
    t.commit(batch, [retry])
    assert sql_rows(database, "SELECT id, name FROM out") == [(1, "a")]


def test_commit_finishes_a_batch_whose_commit_was_cut_midway(database: str) -> None:
    t = target(database, writers="2")
    t.prepare_target(SCHEMA)
    batch = BatchId("out_sink", 4, 5)
    metadata = write_all(t, batch, [[rows(SCHEMA, [(1, "a")])], [rows(SCHEMA, [(2, "b")])]])
    sql_rows(database, f"COMMIT PREPARED '{metadata[0]['gid']}'")  # what a crash after the first leaves
    assert t.delivered_epoch() is None  # half a batch is not delivered
    t.commit(batch, metadata)
    assert sorted(sql_rows(database, "SELECT id FROM out")) == [(1,), (2,)] and t.delivered_epoch() == 5


def test_commit_killed_midway_by_sigkill_then_recommitted(database: str) -> None:
    """A real SIGKILL at the `sink-commit-midway` fault point, in a separate process."""
    t = target(database, writers="3")
    t.prepare_target(SCHEMA)
    batch = BatchId("out_sink", 1, 1)
    metadata = write_all(t, batch, [[rows(SCHEMA, [(i, "x")])] for i in range(3)])
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from epochal.sinks.base import BatchId
        from epochal.sinks.postgres_sink import PostgresTarget
        t = PostgresTarget("out_sink", {{"host": "127.0.0.1", "user": "postgres", "database": {database!r},
                                         "table": "out"}}, ["id", "name"], Path("."), None)
        t.commit(BatchId("out_sink", 1, 1), {metadata!r})
        """
    )
    env = {**os.environ, "EPOCHAL_FAULT": "sink-commit-midway", "PYTHONPATH": str(WORKTREE)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert len(prepared(database)) == 2 and sql_rows(database, "SELECT count(*) FROM out") == [(1,)]
    assert t.delivered_epoch() is None
    t.commit(batch, metadata)
    assert sorted(sql_rows(database, "SELECT id FROM out")) == [(0,), (1,), (2,)] and t.delivered_epoch() == 1


def test_a_lost_writer_makes_commit_fail_loudly(database: str) -> None:
    t = target(database, writers="2")
    t.prepare_target(SCHEMA)
    batch = BatchId("out_sink", 3, 3)
    metadata = write_all(t, batch, [[rows(SCHEMA, [(1, "a")])], [rows(SCHEMA, [(2, "b")])]])
    sql_rows(database, f"ROLLBACK PREPARED '{metadata[1]['gid']}'")  # by hand, outside Epochal
    with pytest.raises(SinkError, match=r"sink out_sink, epoch 3: .*writer\(s\) \[0\].*writer\(s\) \[1\]") as info:
        t.commit(batch, metadata)
    assert not isinstance(info.value, PrecommitLost)  # half the batch is in: not something to retry


def test_epochs_the_target_already_holds_are_refused(database: str) -> None:
    t = target(database, writers="1")
    t.prepare_target(SCHEMA)
    first = BatchId("out_sink", 1, 3)
    t.commit(first, write_all(t, first, [[rows(SCHEMA, [(1, "a")])]]))
    with pytest.raises(SinkError, match=r"sink out_sink, epochs 3\.\.4: .*already holds this sink's epochs up to 3"):
        write_all(t, BatchId("out_sink", 3, 4), [[rows(SCHEMA, [(2, "b")])]])
    assert prepared(database) == [] and t.row_count() == 1


# ---------------------------------------------------------------------------------------------- errors


def test_schema_mismatch_is_refused_with_the_differences(database: str) -> None:
    sql_rows(database, "CREATE TABLE out (id integer, name varchar(10), extra text)")
    t = target(database)
    with pytest.raises(SinkSchemaError) as info:
        t.prepare_target(SCHEMA)
    message = str(info.value)
    assert "sink out_sink" in message and "public.out" in message
    assert "column id is integer, the sink writes bigint" in message
    assert "column name is character varying(10), the sink writes text" in message
    assert "extra column extra text" in message and "never casts silently" in message

    # a wider type that holds every value is fine; a missing unique key for upsert is not
    sql_rows(database, "CREATE TABLE wide (id numeric, name text)")
    target(database, table="wide").prepare_target(SCHEMA)
    with pytest.raises(SinkSchemaError, match=r"unique index on exactly \(id\).*its unique keys: none"):
        target(database, table="wide", type="upsert", primary_key="id").prepare_target(SCHEMA)
    sql_rows(database, "CREATE UNIQUE INDEX ON wide (id)")
    target(database, table="wide", type="upsert", primary_key="id").prepare_target(SCHEMA)

    # a list is jsonb; an existing text column does not take it
    target(database, table="t2", columns=["tags"]).prepare_target(pa.schema([("tags", pa.list_(pa.string()))]))
    assert sql_rows(database, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                    "'public.t2'::regclass AND attname = 'tags'") == [("jsonb",)]
    sql_rows(database, "CREATE TABLE t4 (tags text)")
    with pytest.raises(SinkSchemaError, match=r"column tags is text, the sink writes jsonb"):
        target(database, table="t4", columns=["tags"]).prepare_target(pa.schema([("tags", pa.list_(pa.string()))]))
    with pytest.raises(SinkSchemaError, match=r"column ns has Arrow type timestamp\[ns\]"):
        target(database, table="t3", columns=["ns"]).prepare_target(pa.schema([("ns", pa.timestamp("ns"))]))


def test_a_refused_row_rolls_the_writer_back(database: str) -> None:
    sql_rows(database, "CREATE TABLE out (id bigint CHECK (id > 0), name text)")
    t = target(database, writers="1")
    t.prepare_target(SCHEMA)
    with pytest.raises(SinkError) as info:
        write_all(t, BatchId("out_sink", 5, 6), [[rows(SCHEMA, [(1, "ok"), (-1, "bad")])]])
    message = str(info.value)
    assert "sink out_sink, epochs 5..6" in message
    assert 'violates check constraint "out_id_check"' in message  # PostgreSQL's own message
    assert "rolled back" in message
    assert prepared(database) == [] and sql_rows(database, "SELECT count(*) FROM out") == [(0,)]
    assert sql_rows(database, "SELECT count(*) FROM _epochal_sink_progress") == [(0,)]

    upsert = target(database, table="keyed", type="upsert", primary_key="id", writers="1")
    upsert.prepare_target(SCHEMA)
    # A NULL key (a view grouped by a nullable column) is named as the key, with the fix, not as
    # PostgreSQL's not-null violation of the writer's staging table
    with pytest.raises(SinkDataError) as null_key:
        write_all(upsert, BatchId("out_sink", 1, 1), [[rows(SCHEMA, [(None, "no key")])]])
    message = str(null_key.value)
    assert message.startswith("sink out_sink, epoch 1, writer 0: some row(s) have a NULL in the key (id)"), message
    assert "table public.keyed's PRIMARY KEY" in message and "WHERE ... IS NOT NULL" in message, message
    assert "_epochal_stage" not in message, message
    assert prepared(database) == []


def test_rows_without_a_sink_column_are_refused(database: str) -> None:
    t = target(database, writers="1")
    t.prepare_target(SCHEMA)
    missing = pa.RecordBatch.from_pydict({"id": [1], WEIGHT: [1]})
    with pytest.raises(SinkError, match=r"sink out_sink, epoch 1, writer 0: the rows do not fit public.out"):
        write_all(t, BatchId("out_sink", 1, 1), [[missing]])
    assert prepared(database) == [] and t.row_count() == 0


def test_append_only_refuses_deletes(database: str) -> None:
    t = target(database, writers="1")
    t.prepare_target(SCHEMA)
    with pytest.raises(SinkError, match=r"sink out_sink, epoch 2.*: the sink is append-only .* 1 row\(s\)"):
        write_all(t, BatchId("out_sink", 2, 2), [[rows(SCHEMA, [(1, "a"), (2, "b")], [1, -1])]])
    assert prepared(database) == [] and t.row_count() == 0


def test_server_down_names_the_address() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = PostgresTarget(
        "down_sink",
        {
            "host": "127.0.0.1",
            "port": str(port),
            "user": "postgres",
            "password": "hunter2-secret",
            "database": "x",
            "table": "t",
        },
        ["id"],
        None,
        None,
    )
    with pytest.raises(SinkError) as info:
        t.prepare_target(pa.schema([("id", pa.int64())]))
    message = str(info.value)
    assert "sink down_sink" in message and f"127.0.0.1:{port}" in message and "is the server running" in message
    assert "hunter2" not in message
    with pytest.raises(SinkError, match=f"sink down_sink, epoch 1: cannot connect to PostgreSQL at 127.0.0.1:{port}"):
        t.write(WriterTask(BatchId("down_sink", 1, 1), 0, 1, (0, 255)), iter([]))


def test_options_are_checked_at_load() -> None:
    base = {"connector": "postgres", "host": "h", "user": "u", "database": "d", "table": "t"}
    assert validate_sink("postgres", base, ["id"]) == []
    assert any("'port'" in p for p in validate_sink("postgres", {**base, "port": "54x"}, ["id"]))
    assert any("'port'" in p for p in validate_sink("postgres", {**base, "port": "70000"}, ["id"]))
    with pytest.raises(SinkConfigError, match="port"):
        PostgresTarget("s", {**base, "port": "abc"}, ["id"], None, None)
    # the spec builds the target with ${ENV} resolved
    os.environ["SINK_TEST_PG_PASSWORD"] = "from-env-secret"
    try:
        built = sink_spec("postgres").create(
            "s", {**base, "password": "${SINK_TEST_PG_PASSWORD}"}, ["id"], Path("."), None
        )
    finally:
        del os.environ["SINK_TEST_PG_PASSWORD"]
    assert isinstance(built, PostgresTarget) and built.describe() == "postgres://u@h:5432/d/public.t"
    assert "from-env-secret" not in repr(built) + str(vars(built))


# ------------------------------------------------------------------------ a server with passwords


@pytest.fixture(scope="module")
def scratch_server():
    """A throwaway PostgreSQL (initdb in a temp dir) with scram password auth on loopback and the
    stock ``max_prepared_transactions = 0``: the shared server trusts loopback, so it would accept
    any password."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not bins:
        pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql; .ci/run installs postgresql")
    bindir = bins[-1].parent
    root = Path(tempfile.mkdtemp(prefix="epochal-pg-scratch-"))
    # initdb and postgres refuse to run as root; Popen(user=...) drops to postgres in the child, so
    # the server's pid is the postmaster itself and a signal to it shuts it down.
    as_postgres: dict = {}
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password_file = root / "pw"
    password_file.write_text("right-password-7f3\n")
    if as_postgres:
        shutil.chown(password_file, "postgres")
    data = root / "data"
    subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "sinkadmin", "--pwfile", str(password_file),
         "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8"],
        check=True, capture_output=True, timeout=120, **as_postgres,
    )  # fmt: skip
    server = subprocess.Popen(
        [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
         "-c", "listen_addresses=127.0.0.1", "-c", "max_prepared_transactions=0", "-c", "fsync=off",
         "-c", "shared_buffers=16MB"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **as_postgres,
    )  # fmt: skip
    try:
        url = f"postgresql://sinkadmin:right-password-7f3@127.0.0.1:{port}/postgres"
        for _ in range(100):
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if server.poll() is not None:
                    pytest.fail(f"scratch PostgreSQL did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        yield port
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)


def scratch_target(port: int, password: str) -> PostgresTarget:
    options = {"host": "127.0.0.1", "port": str(port), "user": "sinkadmin", "password": password,
               "database": "postgres", "table": "out"}  # fmt: skip
    return PostgresTarget("pw_sink", options, ["id", "name"], None, None)


def test_wrong_password_names_the_user_never_the_password(scratch_server: int) -> None:
    wrong = scratch_target(scratch_server, "wrong-password-d41")
    with pytest.raises(SinkConfigError) as info:
        wrong.prepare_target(SCHEMA)
    message = str(info.value)
    assert "sink pw_sink" in message and "user sinkadmin" in message and f"127.0.0.1:{scratch_server}" in message
    assert "PG_PASSWORD" in message
    with pytest.raises(SinkConfigError) as on_write:
        wrong.write(WriterTask(BatchId("pw_sink", 1, 1), 0, 1, (0, 255)), iter([]))
    right = scratch_target(scratch_server, "right-password-7f3")
    shown = " ".join(
        [message, str(on_write.value), repr(info.value), repr(wrong), repr(right), wrong.describe(), str(vars(right))]
    )
    for secret in ("wrong-password-d41", "right-password-7f3"):
        assert secret not in shown
    assert pickle.loads(pickle.dumps(right))._password.value == "right-password-7f3"  # executors get it


def test_no_prepared_transactions_fails_before_any_writer(scratch_server: int) -> None:
    t = scratch_target(scratch_server, "right-password-7f3")
    with pytest.raises(SinkConfigError) as info:
        t.prepare_target(SCHEMA)
    assert str(info.value) == max_prepared_transactions_message("pw_sink", "127.0.0.1", scratch_server)
    assert str(info.value) == (
        f"sink pw_sink: PostgreSQL at 127.0.0.1:{scratch_server} has max_prepared_transactions = 0, so it cannot "
        "take part in two-phase commit: set max_prepared_transactions (e.g. 64) in postgresql.conf or ALTER SYSTEM "
        "SET max_prepared_transactions = 64, then restart the server"
    )
    # and a writer that runs anyway (tables made by hand) fails at PREPARE with the same advice
    url = f"postgresql://sinkadmin:right-password-7f3@127.0.0.1:{scratch_server}/postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS out (id bigint, name text)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _epochal_sink_progress (sink text, target text, first_epoch bigint, "
            "last_epoch bigint, token text, writer int, writers int, rows bigint, gid text, "
            "prepared_at timestamptz DEFAULT now())"
        )
    with pytest.raises(SinkConfigError, match="max_prepared_transactions = 0"):
        t.write(WriterTask(BatchId("pw_sink", 1, 1), 0, 1, (0, 255)), iter([rows(SCHEMA, [(1, "a")])]))
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM out").fetchone() == (0,)


# ---------------------------------------------------------------------------------------------- long names


def test_names_over_63_bytes_are_refused_at_load(tmp_path: Path) -> None:
    """PostgreSQL cuts a name to 63 bytes (NAMEDATALEN - 1) without an error: a table, schema or
    column over it was created under another name, and every later run failed on DuplicateTable or
    a false schema mismatch. Bytes, not characters: 32 'é' are 64 bytes."""
    from epochal.errors import PipelineError
    from epochal.pipeline.loader import load_pipeline

    long_column = "c" * 64
    (tmp_path / "p.sql").write_text(
        "CREATE SOURCE s (id BIGINT) WITH (connector = 'log', path = 'data/s');\n"
        f"CREATE MATERIALIZED VIEW v AS SELECT id, id AS {long_column} FROM s;\n"
        "CREATE SINK out FROM v WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres',\n"
        f"  database = 'postgres', schema = '{'é' * 32}',\n"
        f"  table = '{'t' * 64}');\n"
    )
    with pytest.raises(PipelineError) as info:
        load_pipeline(tmp_path)
    assert [(i.line, i.message) for i in info.value.issues] == [
        (
            3,
            f"sink out: column '{long_column}' is 64 bytes, over PostgreSQL's limit of 63 bytes on a name (the "
            "server would cut it silently, and a later run would not find it): rename it in the SELECT of the "
            "table the sink reads (... AS shorter)",
        ),
        (
            4,
            f"sink out: option 'schema' = '{'é' * 32}' is 64 bytes, over PostgreSQL's limit of 63 bytes on a name "
            "(the server would cut it silently, and a later run would not find it): give a shorter schema",
        ),
        (
            5,
            f"sink out: option 'table' = '{'t' * 64}' is 64 bytes, over PostgreSQL's limit of 63 bytes on a name "
            "(the server would cut it silently, and a later run would not find it): give a shorter table",
        ),
    ]


def test_names_of_63_bytes_deliver_on_every_run(database: str) -> None:
    """At the limit the real server keeps the names whole: the second run's prepare_target finds
    the table and columns the first created (a cut column name was a false schema mismatch)."""
    table, schema, column = "t" * 63, "s" * 61 + "é", "é" * 31 + "x"
    assert [len(n.encode()) for n in (table, schema, column)] == [63, 63, 63]
    arrow = pa.schema([("id", pa.int64()), (column, pa.string())])
    for run in (1, 2):
        t = target(database, table=table, schema=schema, columns=("id", column), type="upsert", primary_key="id")
        t.prepare_target(arrow)
        batch = BatchId("out_sink", run, run, 1, f"r{run}")
        t.commit(batch, write_all(t, batch, [[rows(arrow, [(run, "é")])]]))
    assert sql_rows(database, f'SELECT id, "{column}" FROM "{schema}"."{table}" ORDER BY id') == [(1, "é"), (2, "é")]


def test_a_long_name_from_the_environment_is_refused_before_the_server(monkeypatch) -> None:
    """A ${ENV} table name the loader cannot see is refused when the sink is built, before it
    connects; Epochal's own names in the schema fit whatever the writer count."""
    from epochal.sinks.spec import POSTGRES_OWN_NAMES
    from epochal.sql import POSTGRES_MAX_IDENTIFIER_BYTES

    assert max(len(n.encode()) for n in POSTGRES_OWN_NAMES) <= POSTGRES_MAX_IDENTIFIER_BYTES
    monkeypatch.setenv("SINK_TEST_PG_TABLE", "t" * 64)
    options = {"connector": "postgres", "host": "127.0.0.1", "port": "1", "user": "postgres", "database": "d"}
    with pytest.raises(SinkConfigError, match="sink long: option 'table' = 't{64}' is 64 bytes, over PostgreSQL's"):
        sink_spec("postgres").create("long", {**options, "table": "${SINK_TEST_PG_TABLE}"}, ["id"], Path("."), None)
    with pytest.raises(SinkConfigError, match="column 'é{32}' is 64 bytes"):
        PostgresTarget("wide", {**options, "table": "t"}, ["id", "é" * 32], None, None)


def test_the_limit_is_the_servers() -> None:
    """The real server's own limit, and what it does past it: cut the name, not refuse it."""
    from epochal.sql import POSTGRES_MAX_IDENTIFIER_BYTES

    with psycopg.connect(ADMIN, autocommit=True) as conn:
        assert int(conn.execute("SHOW max_identifier_length").fetchone()[0]) == POSTGRES_MAX_IDENTIFIER_BYTES
        cut = conn.execute("SELECT %s::name", ("t" * 64,)).fetchone()[0]
    assert cut == "t" * 63
