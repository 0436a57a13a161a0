"""Settings, from EPOCHAL_* environment variables.

Every variable is listed in ``SETTINGS`` with its default and meaning; the README table is
generated from the same list (``epochal settings``). A variable that starts with ``EPOCHAL_`` but
is not known is a typo, and we say so instead of silently using the default.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from epochal.errors import ConfigError

DEMO_PIPELINE = Path(__file__).parent / "demo_pipeline"


@dataclass(frozen=True)
class SettingSpec:
    env: str
    default: str
    help: str


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("EPOCHAL_HOME", "./.epochal", "Directory for all state: meta store, warehouse, sink files, logs."),
    SettingSpec("EPOCHAL_PIPELINE", "(bundled demo)", "Directory of .sql files that defines the pipeline."),
    SettingSpec(
        "EPOCHAL_META_URL",
        "duckdb:///$EPOCHAL_HOME/meta.duckdb",
        "Meta store: duckdb:///path or postgresql://user@host/db.",
    ),
    SettingSpec(
        "EPOCHAL_WAREHOUSE",
        "$EPOCHAL_HOME/warehouse",
        "Where table data lives: a local path or any URI Spark writes (s3a://, hdfs://).",
    ),
    SettingSpec("EPOCHAL_BARRIER_INTERVAL_MS", "10000", "How often the barrier sensor injects an epoch."),
    SettingSpec(
        "EPOCHAL_CHECKPOINT_FREQUENCY",
        "1",
        "Every N-th barrier is a checkpoint; only checkpoints commit (with the barriers before them).",
    ),
    SettingSpec("EPOCHAL_MAX_IN_FLIGHT", "4", "Most epochs injected but not yet committed; injection waits beyond it."),
    SettingSpec(
        "EPOCHAL_PARTITION_WINDOW",
        "10000",
        "How many recent epochs stay Dagster partitions; older keys retire, data stays.",
    ),
    SettingSpec(
        "EPOCHAL_EPOCH_TIMEOUT_S",
        "600",
        "An in-flight epoch whose run shows no sign of life this long is failed and recovered.",
    ),
    SettingSpec(
        "EPOCHAL_COMPACT_EVERY",
        "16",
        "Snapshot a table once this many committed epochs of changes follow its last snapshot.",
    ),
    SettingSpec(
        "EPOCHAL_STATE_CACHE",
        "on",
        "Keep snapshots a read scans mostly whole in Spark's cache (memory, spilling to disk): on or off.",
    ),
    SettingSpec("EPOCHAL_SPARK_MASTER", "local[*]", "Spark master URL: local[*], spark://host:7077, yarn, k8s://..."),
    SettingSpec("EPOCHAL_SPARK_REMOTE", "", "Spark Connect server (sc://host:15002); wins over EPOCHAL_SPARK_MASTER."),
    SettingSpec("EPOCHAL_SPARK_CONF", "", "Extra Spark conf as JSON object or key=value pairs separated by commas."),
    SettingSpec(
        "EPOCHAL_FAULT", "", "Testing only: SIGKILL the process at a point (source-written, committed, sink-midway)."
    ),
)
KNOWN_ENV = {s.env for s in SETTINGS}


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number: set it to an integer >= {minimum}") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is too small: it must be >= {minimum}")
    return value


_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _ON or raw in _OFF:
        return raw in _ON
    raise ConfigError(f"{name}={env[name]!r} is not a switch: set it to on or off")


def parse_spark_conf(raw: str) -> dict[str, str]:
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'EPOCHAL_SPARK_CONF is not valid JSON ({exc.msg}): use {{"key": "value"}} or key=value,key=value'
            ) from None
        return {str(k): str(v) for k, v in parsed.items()}
    conf = {}
    for item in raw.split(","):
        if "=" not in item:
            raise ConfigError(f"EPOCHAL_SPARK_CONF item {item!r} has no '=': use key=value,key=value")
        key, value = item.split("=", 1)
        conf[key.strip()] = value.strip()
    return conf


@dataclass(frozen=True)
class Settings:
    home: Path
    pipeline_dir: Path
    meta_url: str
    warehouse: str
    barrier_interval_ms: int = 10_000
    checkpoint_frequency: int = 1
    max_in_flight: int = 4
    partition_window: int = 10_000
    epoch_timeout_s: int = 600
    compact_every: int = 16
    state_cache: bool = True
    spark_master: str = "local[*]"
    spark_remote: str = ""
    spark_conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        for name in env:
            if name.startswith("EPOCHAL_") and name not in KNOWN_ENV:
                close = difflib.get_close_matches(name, sorted(KNOWN_ENV), n=1)
                hint = f"did you mean {close[0]}?" if close else "run `epochal settings` for the list"
                raise ConfigError(f"unknown setting {name}: {hint}")
        home = Path(env.get("EPOCHAL_HOME") or "./.epochal").expanduser().resolve()
        pipeline = Path(env.get("EPOCHAL_PIPELINE") or DEMO_PIPELINE).expanduser().resolve()
        checkpoint_frequency = _int(env, "EPOCHAL_CHECKPOINT_FREQUENCY", 1, 1)
        max_in_flight = _int(env, "EPOCHAL_MAX_IN_FLIGHT", 4, 1)
        if max_in_flight < checkpoint_frequency:
            # Barriers between checkpoints stay in flight until the checkpoint commits them, so a
            # smaller limit could never reach the next checkpoint.
            raise ConfigError(
                f"EPOCHAL_MAX_IN_FLIGHT={max_in_flight} is below EPOCHAL_CHECKPOINT_FREQUENCY="
                f"{checkpoint_frequency}: raise the limit to at least the checkpoint frequency"
            )
        return cls(
            home=home,
            pipeline_dir=pipeline,
            meta_url=env.get("EPOCHAL_META_URL") or f"duckdb:///{home / 'meta.duckdb'}",
            warehouse=env.get("EPOCHAL_WAREHOUSE") or str(home / "warehouse"),
            barrier_interval_ms=_int(env, "EPOCHAL_BARRIER_INTERVAL_MS", 10_000, 1),
            checkpoint_frequency=checkpoint_frequency,
            max_in_flight=max_in_flight,
            partition_window=_int(env, "EPOCHAL_PARTITION_WINDOW", 10_000, 1),
            epoch_timeout_s=_int(env, "EPOCHAL_EPOCH_TIMEOUT_S", 600, 1),
            compact_every=_int(env, "EPOCHAL_COMPACT_EVERY", 16, 1),
            state_cache=_switch(env, "EPOCHAL_STATE_CACHE", True),
            spark_master=env.get("EPOCHAL_SPARK_MASTER") or "local[*]",
            spark_remote=env.get("EPOCHAL_SPARK_REMOTE", ""),
            spark_conf=parse_spark_conf(env.get("EPOCHAL_SPARK_CONF", "")),
        )
