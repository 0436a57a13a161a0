"""Settings from the environment, and the Java check that runs before Spark starts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from epochal.errors import ConfigError, JavaMissingError
from epochal.settings import Settings, parse_spark_conf
from epochal.spark_session import check_java


def test_defaults_live_under_epochal_home(tmp_path: Path) -> None:
    s = Settings.from_env({"EPOCHAL_HOME": str(tmp_path)})
    assert s.meta_url == f"duckdb:///{tmp_path / 'meta.duckdb'}"
    assert s.warehouse == str(tmp_path / "warehouse")
    assert s.pipeline_dir.name == "demo_pipeline" and s.spark_master == "local[*]"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EPOCHAL_BARIER_INTERVAL_MS": "5"}, "did you mean EPOCHAL_BARRIER_INTERVAL_MS"),
        ({"EPOCHAL_MAX_IN_FLIGHT": "many"}, "not a whole number"),
        ({"EPOCHAL_CHECKPOINT_FREQUENCY": "0"}, "must be >= 1"),
        ({"EPOCHAL_CHECKPOINT_FREQUENCY": "5", "EPOCHAL_MAX_IN_FLIGHT": "2"}, "at least the checkpoint frequency"),
        ({"EPOCHAL_SPARK_CONF": "{bad json"}, "not valid JSON"),
        ({"EPOCHAL_SPARK_CONF": "novalue"}, "has no '='"),
    ],
)
def test_config_mistakes_name_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_spark_conf_accepts_json_and_pairs() -> None:
    assert parse_spark_conf('{"spark.a": 1}') == {"spark.a": "1"}
    assert parse_spark_conf("spark.a=1, spark.b=x=y") == {"spark.a": "1", "spark.b": "x=y"}


def test_missing_java_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojdk"))
    with pytest.raises(JavaMissingError, match="no java was found on JAVA_HOME=.*install a JDK"):
        check_java()


def test_old_java_is_refused_with_the_version(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "jdk8" / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "1.8.0_402"\' >&2\n')
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    with pytest.raises(JavaMissingError, match="has Java 8 .*JDK 17 or newer"):
        check_java()


def test_the_real_java_passes() -> None:
    check_java()
