"""Secrets stay secret: a password in EPOCHAL_META_URL, a token in EPOCHAL_SPARK_REMOTE and secret
Spark conf keys never appear in `epochal status`, errors, logs, or what Dagster stores and shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from epochal.errors import ConfigError
from epochal.redaction import is_secret_name, redact_conf, redact_url
from epochal.settings import Settings
from tests.conftest import POSTGRES_ADMIN_URL
from tests.epochal_harness import REPO, make_harness

TINY_PIPELINE = {
    "pipeline.sql": """
CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
                   date_time TIMESTAMP, extra STRING)
WITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid', 'nexmark.split.num' = '1',
      'max.events.per.epoch' = '50');

CREATE MATERIALIZED VIEW big_bids AS SELECT auction, price FROM bid WHERE price > 1000;
""",
}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://alice:pw1@db:5432/meta", "postgresql://alice:***@db:5432/meta"),
        ("postgresql://db/meta?user=alice&password=pw1", "postgresql://db/meta?user=alice&password=***"),
        (
            "postgres://alice:pw1@db/meta?sslmode=require&sslpassword=pw2",
            "postgres://alice:***@db/meta?sslmode=require&sslpassword=***",
        ),
        ("postgresql://alice:p@w/1@db/meta", "postgresql://alice:***@db/meta"),  # unencoded '@' and '/'
        ("postgresql://alice:pw1@db:notaport/meta", "postgresql://alice:***@db:notaport/meta"),
        ("sc://host:15002/;token=tk1;user_id=bob", "sc://host:15002/;token=***;user_id=bob"),
        ("postgresql://alice@db/meta?application_name=a@b", "postgresql://alice@db/meta?application_name=a@b"),
        ("duckdb:////tmp/x/meta.duckdb", "duckdb:////tmp/x/meta.duckdb"),
        # a password is everything between the user's ':' and the last '@' before the host
        ("postgresql://alice:pa;ss@db/meta", "postgresql://alice:***@db/meta"),
        ("postgresql://alice:pa?ss@db/meta?sslmode=require", "postgresql://alice:***@db/meta?sslmode=require"),
        ("postgresql://alice:a#b;c?d@e@db:5432,db2/meta", "postgresql://alice:***@db:5432,db2/meta"),
        ("postgresql://alice:pa%ss@db/meta", "postgresql://alice:***@db/meta"),
        ("postgresql://db/meta?sslmode=require&password=pa%ss", "postgresql://db/meta?sslmode=require&password=***"),
        ("postgresql://db:5432/meta", "postgresql://db:5432/meta"),
        # libpq conninfo, bare and quoted, and a URL inside a message
        ("host=db user=alice password=pa;ss dbname=meta", "host=db user=alice password=*** dbname=meta"),
        ("host=db password = 'a b\\' c' dbname=meta", "host=db password = *** dbname=meta"),
        (
            "cannot reach postgresql://alice:pw1@db/meta: refused",
            "cannot reach postgresql://alice:***@db/meta: refused",
        ),
    ],
)
def test_urls_lose_their_secrets_and_keep_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_spark_conf_keys_that_hold_secrets() -> None:
    secret = [
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.session.token",
        "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net",
        "spark.ssl.keyStorePassword",
        "spark.authenticate.secret",
        "spark.sql.catalog.lake.credential",
    ]
    public = ["spark.sql.shuffle.partitions", "spark.executor.memory", "spark.authenticate", "spark.sql.keyword"]
    assert [k for k in secret + public if is_secret_name(k)] == secret
    assert redact_conf({"spark.hadoop.fs.s3a.secret.key": "s", "spark.executor.memory": "2g"}) == {
        "spark.hadoop.fs.s3a.secret.key": "***",
        "spark.executor.memory": "2g",
    }


def test_settings_repr_hides_secrets(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "EPOCHAL_HOME": str(tmp_path),
            "EPOCHAL_META_URL": "postgresql://u:pw1@db/meta?password=pw2",
            "EPOCHAL_SPARK_REMOTE": "sc://h:15002/;token=tk3",
            "EPOCHAL_SPARK_CONF": '{"spark.hadoop.fs.s3a.secret.key": "sk4", "spark.executor.memory": "2g"}',
        }
    )
    shown = repr(s)
    assert not [x for x in ("pw1", "pw2", "tk3", "sk4") if x in shown], shown
    assert "2g" in shown and s.meta_url.endswith("password=pw2")  # the value itself is intact


def test_a_bad_spark_conf_item_is_not_echoed_when_it_may_hold_a_secret() -> None:
    with pytest.raises(ConfigError, match="item 2 has no '='") as raised:
        Settings.from_env({"EPOCHAL_SPARK_CONF": "spark.executor.memory=2g,fs.s3a.secret.key:sk5"})
    assert "sk5" not in str(raised.value)


def test_an_unsupported_meta_store_url_is_named_without_its_password() -> None:
    from epochal.meta.backend import open_backend

    with pytest.raises(ConfigError, match=r"unsupported meta store URL 'mysql://u:\*\*\*@h/d'") as raised:
        open_backend("mysql://u:pw7@h/d")
    assert "pw7" not in str(raised.value)


def test_a_password_psycopg_cannot_parse_is_named_without_the_password() -> None:
    """A '%' not followed by two hex digits: psycopg's ProgrammingError quotes the password; what
    Epochal raises (and a traceback prints) names the problem and the fix, never the password."""
    import traceback

    from epochal.meta.backend import open_backend

    password = f"pa%zz{uuid.uuid4().hex}"
    backend = open_backend(f"postgresql://postgres:{password}@127.0.0.1:5432/postgres")
    with pytest.raises(ConfigError, match="percent-encode special characters in the user and password") as raised:
        backend.transaction(lambda cur: cur.execute("SELECT 1"))
    shown = "".join(traceback.format_exception(raised.value))
    assert "postgresql://postgres:***@127.0.0.1:5432/postgres" in shown
    assert password not in shown and password[2:] not in shown, shown


@dataclass
class SecretPg:
    role: str
    database: str
    password: str  # in the URL's user info
    query_password: str  # in its ?password=

    def url(self, port: int = 5432) -> str:
        return (
            f"postgresql://{self.role}:{self.password}@127.0.0.1:{port}/{self.database}"
            f"?password={self.query_password}&application_name=epochal-test"
        )

    def query_only_url(self) -> str:
        """The form whose password `epochal status --json` used to print: no '@' at all."""
        return f"postgresql://127.0.0.1:5432/{self.database}?user={self.role}&password={self.query_password}"


@pytest.fixture
def secret_pg() -> Iterator[SecretPg]:
    """A role with a password that owns a fresh database (the server trusts loopback, so any
    password logs in: what matters here is where the password shows up)."""
    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:10]
    pg = SecretPg(f"epochal_secret_{tag}", f"epochal_secret_{tag}", f"pw{uuid.uuid4().hex}", f"qp{uuid.uuid4().hex}")
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(pg.role), pg.password))
        owned = sql.SQL("CREATE DATABASE {} OWNER {}")
        admin.execute(owned.format(sql.Identifier(pg.database), sql.Identifier(pg.role)))
    yield pg
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(pg.database)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(pg.role)))


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


def test_dagster_shows_variable_names_not_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster import serialize_value

    from platform_defs.definitions import build_definitions
    from tests.dagster_internals import RepositorySnap

    h = make_harness(tmp_path, TINY_PIPELINE)
    secrets = ["sk" + uuid.uuid4().hex, "tk" + uuid.uuid4().hex, "pw" + uuid.uuid4().hex]
    conf = {"spark.hadoop.fs.s3a.secret.key": secrets[0], "spark.sql.shuffle.partitions": "3"}
    for name, value in {
        **h.env,
        "EPOCHAL_SPARK_CONF": json.dumps(conf),
        "EPOCHAL_SPARK_REMOTE": f"sc://localhost:15002/;token={secrets[1]}",
        "EPOCHAL_META_URL": f"postgresql://u:{secrets[2]}@127.0.0.1:1/db",
    }.items():
        monkeypatch.setenv(name, value)
    defs = build_definitions()
    # What the UI's resource and launchpad pages show, and what every run of the job stores.
    repo = defs.get_repository_def()
    shown = serialize_value(RepositorySnap.from_def(repo))
    shown += serialize_value(repo.get_job("epoch_job").get_job_snapshot())
    assert not _leaks(shown, secrets)
    assert "spark.sql.shuffle.partitions" in shown  # conf without secrets stays visible
    assert {"EPOCHAL_SPARK_CONF", "EPOCHAL_SPARK_REMOTE"} <= set(repo.get_env_vars_by_top_level_resource())
    # ... and a run still gets the values, from the environment.
    with dg.build_resources({"spark": defs.resources["spark"]}) as resources:
        assert resources.spark.session_conf() == {k: str(v) for k, v in conf.items()}
        assert resources.spark.remote == f"sc://localhost:15002/;token={secrets[1]}"


def test_secrets_come_only_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from resources.spark import EpochalSparkResource

    monkeypatch.delenv("EPOCHAL_SPARK_CONF", raising=False)
    settings = Settings.from_env({"EPOCHAL_HOME": str(tmp_path), "EPOCHAL_SPARK_CONF": "fs.s3a.secret.key=sk6"})
    with pytest.raises(ConfigError, match="set EPOCHAL_SPARK_CONF in the environment") as raised:
        EpochalSparkResource.from_settings(settings)
    assert "sk6" not in str(raised.value)


def test_an_unreachable_meta_store_is_named_without_its_password(tmp_path: Path, secret_pg: SecretPg) -> None:
    h = make_harness(tmp_path, TINY_PIPELINE)
    proc = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "status"],
        cwd=REPO, env={**os.environ, **h.env, "EPOCHAL_META_URL": secret_pg.url(port=1)},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert f"postgresql://{secret_pg.role}:***@127.0.0.1:1/{secret_pg.database}?password=***" in proc.stderr
    assert not _leaks(proc.stdout + proc.stderr, [secret_pg.password, secret_pg.query_password])


@pytest.mark.slow
def test_a_real_run_keeps_every_secret_out(tmp_path: Path, secret_pg: SecretPg) -> None:
    """`dagster job execute` on PostgreSQL with a password and a secret Spark key: neither shows in
    its output, in anything the Dagster instance recorded, or in `epochal status`; Spark gets the key."""
    from dagster import serialize_value

    h = make_harness(tmp_path, TINY_PIPELINE)
    dagster_home, spark_events = tmp_path / "dagster_home", tmp_path / "spark_events"
    dagster_home.mkdir()
    spark_events.mkdir()
    spark_secret = "sk" + uuid.uuid4().hex
    secrets = [secret_pg.password, secret_pg.query_password, spark_secret]
    conf = {
        "spark.hadoop.fs.s3a.secret.key": spark_secret,
        # Spark's event log lists the session's conf (with Spark's own redaction): proof the key got there
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": spark_events.as_uri(),
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.compress": "false",
    }
    env = {
        **os.environ,
        **h.env,
        "DAGSTER_HOME": str(dagster_home),
        "EPOCHAL_META_URL": secret_pg.url(),
        "EPOCHAL_SPARK_CONF": json.dumps(conf),
        "EPOCHAL_SPARK_MASTER": "local[2]",
    }
    run = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert not _leaks(run.stdout + run.stderr, secrets)

    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        [record] = instance.get_runs()
        assert record.is_success
        stored = [
            serialize_value(record),
            json.dumps(record.run_config),
            serialize_value(instance.get_job_snapshot(record.job_snapshot_id)),
            serialize_value(instance.get_execution_plan_snapshot(record.execution_plan_snapshot_id)),
            *(serialize_value(entry) for entry in instance.all_logs(record.run_id)),
        ]
    finally:
        instance.dispose()
    assert not _leaks("\n".join(stored), secrets)
    # compute logs, sqlite files, anything else the instance wrote
    for path in dagster_home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in secrets if s.encode() in data], path

    [event_log] = [p for p in spark_events.iterdir() if p.is_file()]
    spark_view = event_log.read_text(errors="replace")
    assert '"spark.hadoop.fs.s3a.secret.key"' in spark_view and spark_secret not in spark_view

    for url in (secret_pg.url(), secret_pg.query_only_url()):
        for args in (["status", "--json"], ["status"]):
            status = subprocess.run(
                [sys.executable, "-m", "epochal.cli", *args],
                cwd=REPO, env={**env, "EPOCHAL_META_URL": url}, capture_output=True, text=True, timeout=120,
            )
            assert status.returncode == 0, status.stderr
            assert not _leaks(status.stdout + status.stderr, secrets), (url, args)
            if "--json" in args:
                shown = json.loads(status.stdout)
                assert shown["committed_epoch"] and "***" in shown["meta_store"]


def test_a_sink_password_in_the_pipeline_file_never_reaches_the_asset_graph(tmp_path: Path) -> None:
    """The UI shows each sink's CREATE SINK: a literal password is masked there, an ${ENV}
    reference is shown as written (it is the way the docs recommend)."""
    from assets.epoch_assets import build_epoch_assets
    from epochal.pipeline.loader import load_pipeline

    (tmp_path / "p.sql").write_text(
        "CREATE SOURCE orders (id BIGINT) WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
        "CREATE SINK a FROM orders WITH (connector = 'postgres', host = 'db', user = 'u', database = 'd',\n"
        "    table = 't', password = 'hunter2-literal');\n"
        "CREATE SINK b FROM orders WITH (connector = 'postgres', host = 'db', user = 'u', database = 'd',\n"
        "    table = 't2', password = '${PG_PASSWORD}');\n"
    )
    assets = build_epoch_assets(load_pipeline(tmp_path))
    described = " ".join(a.descriptions_by_key[k] or "" for a in assets for k in a.keys)
    assert "hunter2-literal" not in described and "password = '***'" in described
    assert "password = '${PG_PASSWORD}'" in described


def test_spark_conf_values_that_hold_secrets_under_innocent_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Azure SAS key, a metastore JDBC URL and a catalog URI with credentials are secrets by their
    key or value: the settings as shown and the Spark resource's config (what the UI shows) hold none of them."""
    from resources.spark import EpochalSparkResource

    conf = {
        "spark.hadoop.fs.azure.sas.logs.acct.blob.core.windows.net": "sv=2022-11-02&sp=r&sig=sas1",
        "spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://db/hive?user=hive&password=jdbc2",
        "spark.sql.catalog.lake.uri": "postgresql://alice:uri3@db/catalog",
        "spark.hadoop.javax.jdo.option.ConnectionURL2": "jdbc:oracle:thin:hive/ora4@db:1521/hive",
        "spark.executor.memory": "2g",
        "spark.sql.catalog.hms.uri": "thrift://metastore:9083",
    }
    secrets = ["sas1", "jdbc2", "uri3", "ora4"]
    raw = json.dumps(conf)
    monkeypatch.setenv("EPOCHAL_SPARK_CONF", raw)
    settings = Settings.from_env({"EPOCHAL_HOME": str(tmp_path), "EPOCHAL_SPARK_CONF": raw})
    assert not _leaks(repr(settings), secrets), repr(settings)
    shown = redact_conf(conf)
    assert shown["spark.sql.catalog.lake.uri"] == "postgresql://alice:***@db/catalog"  # the rest stays readable
    assert shown["spark.executor.memory"] == "2g" and shown["spark.sql.catalog.hms.uri"] == "thrift://metastore:9083"
    resource = EpochalSparkResource.from_settings(settings)
    assert not _leaks(json.dumps(resource.spark_config), secrets)
    assert set(resource.spark_config) == {"spark.executor.memory", "spark.sql.catalog.hms.uri"}
    assert resource.session_conf() == conf, "a run still gets every value, from the environment"


def test_a_secret_value_holding_a_comma_is_not_echoed_by_the_conf_parser() -> None:
    with pytest.raises(ConfigError, match=r"item 3 has no '='.*JSON form") as raised:
        Settings.from_env({"EPOCHAL_SPARK_CONF": "spark.executor.memory=2g,fs.s3a.secret.key=ab,tail5"})
    assert "tail5" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"item 2 has no '='") as raised:  # a URL's password, too
        Settings.from_env({"EPOCHAL_SPARK_CONF": "spark.sql.catalog.c.uri=postgresql://u:pw,tail6@db/c"})
    assert "tail6" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"item 2 \('b.jar'\) has no '='"):  # nothing secret: shown
        Settings.from_env({"EPOCHAL_SPARK_CONF": "spark.jars=a.jar,b.jar"})


def test_a_sink_option_cannot_read_epochals_own_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`${NAME}` reads the environment for a sink's secrets; `${EPOCHAL_META_URL}` (or any EPOCHAL_* or
    DAGSTER_* name) would hand the meta store's password to a target the pipeline file names."""
    from epochal.errors import EpochalError
    from epochal.pipeline.loader import load_pipeline
    from epochal.sinks.spec import resolve_env

    monkeypatch.setenv("EPOCHAL_META_URL", "postgresql://u:meta7@db/meta")
    (tmp_path / "p.sql").write_text(
        "CREATE SOURCE orders (id BIGINT) WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
        "CREATE SINK a FROM orders WITH (connector = 'postgres', host = 'db', user = 'u', database = 'd',\n"
        "    table = 't', password = '${EPOCHAL_META_URL}');\n"
    )
    with pytest.raises(EpochalError, match=r"option password = '\$\{EPOCHAL_META_URL\}' reads EPOCHAL_META_URL.*"
                       r"may not read: export the value under a name of its own") as raised:
        load_pipeline(tmp_path)
    assert "meta7" not in str(raised.value)
    with pytest.raises(EpochalError, match="sink a: option table = '.*DAGSTER_PG_PASSWORD"):
        resolve_env("a", {"table": "${DAGSTER_PG_PASSWORD}"})
    monkeypatch.setenv("PG_PASSWORD", "pg8")
    assert resolve_env("a", {"password": "${PG_PASSWORD}"}) == {"password": "pg8"}  # the user's own names work
