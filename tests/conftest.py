"""Shared fixtures. One SparkSession for the whole test session: starting a JVM costs seconds."""

from __future__ import annotations

import os

import pytest

# Runs and CLI commands the tests start in subprocesses compute with a JVM of their own, as before
# the managed server became the default: each test has its own EPOCHAL_HOME, and a server per home
# would leave a JVM per test running. test_spark_server.py runs the server mode on purpose.
os.environ.setdefault("EPOCHAL_SPARK_MODE", "local")
# Retired files go as soon as no epoch that may read them is in flight: the strictest setting for the
# epoch and compaction rules, and tests that check files are deleted need not wait a minute. The
# tests of the grace time itself set it.
os.environ.setdefault("EPOCHAL_RETENTION_GRACE_S", "0")
# Compaction keeps no history for time travel unless a test asks (the retention tests count files);
# the time-travel tests set their window.
os.environ.setdefault("EPOCHAL_TIME_TRAVEL_S", "0")


#: The shared session's conf over Epochal's defaults. Whole-stage code generation off: the tests' tiny
#: epochs over ever new plans spent more in Janino compiling them than in running them
#: (test_incremental_views' stateful views, 315 s with it, 263 s without, on the same machine). Runs
#: the tests start in subprocesses keep Spark's and Epochal's defaults. TESTS_SPARK_CONF (JSON) adds to it.
TEST_SPARK_CONF = {"spark.sql.codegen.wholeStage": "false"}


@pytest.fixture(scope="session")
def spark():
    import json

    from epochal.spark.session import build_spark_session

    conf = {**TEST_SPARK_CONF, **json.loads(os.environ.get("TESTS_SPARK_CONF", "{}"))}
    session = build_spark_session(master="local[2]", app_name="epochal-tests", conf=conf)
    yield session
    session.stop()


POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def postgres_url():
    """A fresh database on the real PostgreSQL server, dropped afterwards."""
    import uuid

    import psycopg

    name = f"epochal_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({exc}); .ci/run starts it")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["duckdb", "postgresql"])
def meta_url(request, tmp_path):
    """The meta-store tests run on the embedded DuckDB store and on a real PostgreSQL server."""
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'meta.duckdb'}"
    return request.getfixturevalue("postgres_url")
