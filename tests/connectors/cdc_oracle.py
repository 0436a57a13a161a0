"""Upstream comparisons for the CDC tests (postgres-cdc, mysql-cdc): the upstream table read again
with psycopg / PyMySQL, independently of the connector, with each value as the declared type holds
it, and the CDC table's state collected from Spark, both as multisets.

Shared by tests/connectors/test_postgres_cdc.py, test_mysql_cdc.py and test_cdc_workload.py.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections import Counter
from typing import Any

import psycopg
import pymysql

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def pg_dsn(database: str) -> str:
    """A connection string of ``database`` on the test server, its session in UTC."""
    return f"host=127.0.0.1 port=5432 user=postgres dbname={database} options='-c TimeZone=UTC'"


def drop_pg_database(database: str) -> None:
    """``database`` and its replication slots gone (a slot left behind keeps WAL forever)."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", [database]
        )
        admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def create_pg_database(database: str) -> None:
    """A new, empty ``database`` (any old one of that name dropped first, with its slots)."""
    drop_pg_database(database)
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")


def pg_rows(conn: psycopg.Connection, query: str) -> Counter:
    """The rows of ``query`` upstream, as a CDC table holds them: a ``timestamptz`` as UTC without
    a zone (Spark collects naive values in the UTC session), a ``timestamp`` as it is."""
    out: Counter = Counter()
    for row in conn.execute(query).fetchall():
        out[tuple(_naive_utc(v) for v in row)] += 1
    return out


def _naive_utc(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def slot_confirmed(slot: str) -> int:
    """The replication slot's confirmed_flush_lsn, as an int."""
    from epochal.connectors.pgoutput import lsn_int

    with psycopg.connect(PG_ADMIN) as admin:
        row = admin.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
    if row is None:
        raise AssertionError(f"replication slot {slot} does not exist")
    return lsn_int(row[0])


def mysql_connect(database: str | None = None) -> pymysql.Connection:
    """A connection to the test MariaDB, autocommit, its session in UTC."""
    return pymysql.connect(
        host="127.0.0.1",
        port=3306,
        user="root",
        database=database,
        autocommit=True,
        init_command="SET time_zone='+00:00'",
    )


def mysql_rows(cur: pymysql.cursors.Cursor, query: str) -> Counter:
    """The rows of ``query`` upstream, as a CDC table holds them: ``tinyint(1)`` as a BOOLEAN, a
    binary string as ``\\x`` and hex digits, a ``float`` rounded to 32 bits (FLOAT)."""
    from pymysql.constants import FIELD_TYPE

    cur.execute(query)
    kinds = [(d[1], d[3]) for d in cur.description]
    out: Counter = Counter()
    for row in cur.fetchall():
        values = []
        for value, (code, length) in zip(row, kinds, strict=True):
            if value is None:
                pass
            elif code == FIELD_TYPE.TINY and length == 1:
                value = bool(value)
            elif isinstance(value, bytes):
                value = "\\x" + value.hex()
            elif code == FIELD_TYPE.FLOAT:
                value = struct.unpack("f", struct.pack("f", value))[0]
            values.append(value)
        out[tuple(values)] += 1
    return out


def state_rows(runtime: Any, table: str) -> Counter:
    """The committed state of ``table`` (a CDC table or a view), collected from Spark."""
    return Counter(tuple(r) for r in runtime.state(table).collect())


def differences(got: Counter, want: Counter) -> tuple[list, list]:
    """(rows only in ``got``, rows only in ``want``), sorted: what an equality assertion shows."""
    return sorted(got - want, key=repr), sorted(want - got, key=repr)


def assert_same_rows(got: Counter, want: Counter, what: str) -> None:
    extra, missing = differences(got, want)
    if extra or missing:
        raise AssertionError(
            f"{what}: {len(extra)} row(s) not upstream, e.g. {extra[:5]}; {len(missing)} missing, e.g. {missing[:5]}"
        )
