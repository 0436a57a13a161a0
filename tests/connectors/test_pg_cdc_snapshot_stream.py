"""A postgres-cdc chunk's staging against the real server, on the driver: its COPY streamed in many
batches (each a Parquet row group) gives exactly the upstream rows, newlines and quotes inside
values included; a task's chunks share one transaction on the exported snapshot; an empty chunk is
staged and recorded too."""

from __future__ import annotations

import time

import psycopg
import pyarrow.parquet as pq
import pytest

from epochal.connectors import pg_cdc_server as server
from epochal.connectors import pg_cdc_snapshot
from epochal.connectors.cdc_chunks import chunks_of, staged_chunks
from epochal.pipeline.model import Column
from tests.connectors.cdc_oracle import create_pg_database, drop_pg_database, pg_dsn

DB = "epochal_pg_cdc_stream_test"
NOTES = ["plain", "two\nlines", 'a "quoted", comma', "", None, "ünïcode"]


@pytest.fixture
def upstream():
    create_pg_database(DB)
    with psycopg.connect(pg_dsn(DB), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, note text, v numeric(12,2))")
        conn.execute(
            "INSERT INTO t SELECT g, (%s::text[])[1 + g %% 6], g / 7.0 FROM generate_series(1, 300) g", [NOTES]
        )
        yield conn
        # the export's temporary slot goes when its backend exits, just after its connection closed:
        # dropping it while it is still active would fail
        for _ in range(50):
            if not conn.execute("SELECT 1 FROM pg_replication_slots WHERE database = %s", [DB]).fetchone():
                break
            time.sleep(0.1)
    drop_pg_database(DB)


def test_streamed_chunks_in_a_shared_snapshot_transaction(upstream, tmp_path, monkeypatch):  # noqa: ANN001
    config = server.ServerConfig("127.0.0.1", 5432, "postgres", "", DB, "public", "t", "unused", "unused")
    columns = (Column("id", "INT"), Column("note", "STRING"), Column("v", "DECIMAL(12,2)"))
    key, types = ("id",), ("int4",)
    chunks = chunks_of([("101",), ("201",), ("1000",)])  # the last one holds no row
    want = upstream.execute("SELECT id, note, v FROM t ORDER BY id").fetchall()
    monkeypatch.setattr(pg_cdc_snapshot, "BATCH_BYTES", 256)  # a few rows a batch
    opened = []
    real = server.snapshot_transaction

    def counted(*args):  # noqa: ANN002, ANN202
        opened.append(args)
        return real(*args)

    monkeypatch.setattr(server, "snapshot_transaction", counted)

    with server.exported_snapshot(config) as (lsn, exported):
        # committed after the export: no chunk may see it, on its own connection or a shared one
        upstream.execute("UPDATE t SET note = 'later' WHERE id IN (1, 150, 250)")

        def stage(chunk):  # noqa: ANN001, ANN202
            return pg_cdc_snapshot.stage_chunk(config, columns, key, types, exported, lsn, tmp_path, chunk)

        staged = [stage(chunks[0])]
        assert len(opened) == 1
        with pg_cdc_snapshot.shared_connections():
            staged += [stage(c) for c in chunks[1:]]
        assert len(opened) == 2  # the three chunks of the scope on one connection

    assert [s.rows for s in staged] == [100, 100, 100, 0]
    recorded = staged_chunks(tmp_path, chunks)
    assert [(recorded[i].rows, recorded[i].position) for i in range(4)] == [(100, lsn)] * 3 + [(0, lsn)]
    got = []
    for s in staged:
        parquet = pq.ParquetFile(s.file)
        assert s.rows == 0 or parquet.num_row_groups > 1
        got += [(r["id"], r["note"], r["v"]) for r in parquet.read().to_pylist()]
    assert got == want


def test_a_copy_the_server_refuses_is_an_error_with_its_message_and_the_connection_stays_usable(upstream) -> None:
    from psycopg import sql

    with psycopg.connect(pg_dsn(DB)) as conn:
        bad = sql.SQL("COPY (SELECT 1 / (id - %s) FROM t) TO STDOUT (FORMAT csv)")
        with pytest.raises(psycopg.OperationalError, match="division by zero"):
            list(pg_cdc_snapshot._copy_out(conn, bad, [150]))  # fails part-way, after rows came
        conn.rollback()
        good = sql.SQL("COPY (SELECT id FROM t WHERE id <= %s) TO STDOUT (FORMAT csv)")
        assert b"".join(pg_cdc_snapshot._copy_out(conn, good, [3])) == b"1\n2\n3\n"


def test_the_snapshot_tasks_fit_a_spark_connect_session_which_has_no_spark_context() -> None:
    class Conf:
        def __init__(self, values: dict[str, str]):
            self.values = values

        def get(self, key: str, default: str | None = None) -> str | None:
            return self.values.get(key, default)

    class ConnectSession:  # what the Connect client's session answers; it has no sparkContext
        def __init__(self, values: dict[str, str]):
            self.conf = Conf(values)

    ConnectSession.__module__ = "pyspark.sql.connect.session"
    assert pg_cdc_snapshot.task_slots(ConnectSession({"spark.default.parallelism": "8"})) == 8
    assert pg_cdc_snapshot.task_slots(ConnectSession({"spark.sql.shuffle.partitions": "4"})) == 4
