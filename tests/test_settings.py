"""Settings from the environment, and the Java check that runs before Spark starts."""

from __future__ import annotations

import dataclasses
import re
import stat
from pathlib import Path

import pytest

from epochal.cli.main import main
from epochal.errors import ConfigError, JavaMissingError
from epochal.settings import SETTINGS, Settings, parse_spark_conf, settings_markdown
from epochal.spark.session import check_java

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference.md"


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
        ({"EPOCHAL_SPARK_CONF": "novalue"}, "item 1 \\('novalue'\\) has no '='"),
        ({"EPOCHAL_SPARK_CONF": "[1]"}, "not an object"),
        ({"EPOCHAL_STATE_CACHE": "maybe"}, "'maybe' is not a switch: set it to on or off"),
        ({"EPOCHAL_FAULT": "comitted"}, "did you mean committed\\? use one of source-written, committed"),
        ({"EPOCHAL_COMPACT_EVERY": "-3"}, "EPOCHAL_COMPACT_EVERY=-3 is too small: it must be >= 1"),
        ({"EPOCHAL_DAGSTER_INSTANCE_LOCATION": "1"}, "EPOCHAL_DAGSTER_INSTANCE_LOCATION: run `epochal settings`"),
    ],
)
def test_config_mistakes_name_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_every_value_is_read_from_its_variable(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "EPOCHAL_HOME": str(tmp_path / "h"),
            "EPOCHAL_PIPELINE": str(tmp_path / "p"),
            "EPOCHAL_META_URL": "postgresql://u@db/meta",
            "EPOCHAL_WAREHOUSE": "s3a://bucket/w",
            "EPOCHAL_BARRIER_INTERVAL_MS": " 250 ",
            "EPOCHAL_CHECKPOINT_FREQUENCY": "3",
            "EPOCHAL_MAX_IN_FLIGHT": "3",
            "EPOCHAL_PARTITION_WINDOW": "7",
            "EPOCHAL_EPOCH_TIMEOUT_S": "9",
            "EPOCHAL_COMPACT_EVERY": "2",
            "EPOCHAL_STATE_CACHE": "OFF",
            "EPOCHAL_SPARK_MASTER": "local[2]",
            "EPOCHAL_SPARK_REMOTE": "sc://h:15002",
            "EPOCHAL_SPARK_CONF": "spark.a=1",
            "EPOCHAL_FAULT": "committed",
        }
    )
    assert (s.home, s.pipeline_dir, s.meta_url, s.warehouse) == (
        tmp_path / "h", tmp_path / "p", "postgresql://u@db/meta", "s3a://bucket/w"
    )
    assert (s.barrier_interval_ms, s.checkpoint_frequency, s.max_in_flight, s.partition_window) == (250, 3, 3, 7)
    assert (s.epoch_timeout_s, s.compact_every, s.state_cache) == (9, 2, False)
    assert (s.spark_master, s.spark_remote, s.fault) == ("local[2]", "sc://h:15002", "committed")
    assert dict(s.spark_conf) == {"spark.a": "1"}


def test_an_empty_variable_means_the_default(tmp_path: Path) -> None:
    s = Settings.from_env({"EPOCHAL_HOME": str(tmp_path), "EPOCHAL_MAX_IN_FLIGHT": " ", "EPOCHAL_META_URL": ""})
    assert s.max_in_flight == 4 and s.meta_url == f"duckdb:///{tmp_path / 'meta.duckdb'}"


def test_each_setting_is_declared_once() -> None:
    names = [spec.env for spec in SETTINGS]
    assert len(names) == len(set(names)) and all(n.startswith("EPOCHAL_") for n in names)
    # every field of Settings is a setting, so a new field cannot skip the table
    assert len(dataclasses.fields(Settings)) == len(SETTINGS)
    assert Settings.env_name("spark_conf") == "EPOCHAL_SPARK_CONF"


def test_the_reference_table_is_the_generated_one() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    found = re.search(r"<!-- settings:begin -->\n(.*?)\n<!-- settings:end -->", text, re.DOTALL)
    assert found, "docs/reference.md lost its <!-- settings:begin --> / <!-- settings:end --> markers"
    assert found.group(1) == settings_markdown(), (
        "docs/reference.md's settings table differs from epochal/settings.py: paste "
        "`epochal settings --markdown` between the markers"
    )


def test_the_readme_names_only_settings_that_exist() -> None:
    """The README names the first settings to know; a renamed or removed one must not linger there."""
    named = set(re.findall(r"EPOCHAL_[A-Z_]+[A-Z]", (REPO / "README.md").read_text(encoding="utf-8")))
    assert named and named <= {spec.env for spec in SETTINGS}, named - {spec.env for spec in SETTINGS}


def test_settings_command_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [spec.env for spec in SETTINGS]
    assert "Spark master: local[*], spark://host:7077" in lines[[s.env for s in SETTINGS].index("EPOCHAL_SPARK_MASTER")]
    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out == settings_markdown() + "\n"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`epochal query ... | head`: a reader that closed the pipe ends the command without a traceback.
    `true` exits at once, long before the command (which imports for a moment) writes anything."""
    import subprocess
    import sys

    run = subprocess.run(
        f"{sys.executable} -m epochal.cli settings --markdown | true", shell=True, cwd=REPO,
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr


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
