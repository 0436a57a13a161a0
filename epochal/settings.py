"""Settings, from EPOCHAL_* environment variables: each declared once, as a field of ``Settings``.

A field's declaration (``setting(...)``) is the only place a setting is written down: its
variable, default, limits and meaning. From it come the environment parsing (``from_env``), the
check that every ``EPOCHAL_*`` variable is known (a typo is an error that suggests the closest
name, not a silent default), ``epochal settings`` and the table of docs/reference.md (``settings_markdown``,
compared with that file by a test). To add a setting, add one field.
"""

from __future__ import annotations

import difflib
import json
import os
import string
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from epochal.errors import ConfigError
from epochal.faults import FAULT_POINTS
from epochal.redaction import is_secret_conf, is_secret_name, redact_conf, redact_url

DEMO_PIPELINE = Path(__file__).parent / "demo_pipeline"
#: the FAIR pool backfills run in (epochal/spark/fairscheduler.xml defines it)
BACKFILL_POOL = "epochal_backfill"
#: the smallest idle limit EPOCHAL_SPARK_IDLE_STOP_S may ask for (0 means never stop): the managed
#: server's lease is renewed every 30 s (epochal/spark/idle.py), and the limit must leave room for several
MIN_IDLE_STOP_S = 60


@dataclass(frozen=True)
class Setting:
    """One environment variable: what it is called, what leaving it unset means, what it accepts."""

    env: str
    #: the value when the variable is unset or empty, written as one would set it; ``$EPOCHAL_X``
    #: stands for the value of a setting declared before this one
    default: str
    #: one sentence for `epochal settings` and docs/reference.md (Markdown: `code` for literal values)
    help: str
    #: the default as shown, when the text above is not what a reader should see (a package path)
    shown: str | None = None
    minimum: int | None = None
    choices: tuple[str, ...] | None = None
    #: text -> value for types the annotation cannot say how to read (the Spark conf)
    parse: Callable[[str], Any] | None = None
    #: how to show a value that may hold a secret (a password in a URL), in reprs and status
    redact: Callable[[Any], Any] | None = None


def setting(
    env: str,
    default: str,
    help: str,
    *,
    shown: str | None = None,
    minimum: int | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    redact: Callable[[Any], Any] | None = None,
) -> Any:
    """A ``Settings`` field read from ``env``; see ``Setting`` for the arguments."""
    spec = Setting(env, default, help, shown, minimum, choices, parse, redact)
    return field(metadata={"setting": spec})


def parse_spark_conf(raw: str) -> dict[str, str]:
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith(("{", "[")):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'EPOCHAL_SPARK_CONF is not valid JSON ({exc.msg}): use {{"key": "value"}} or key=value,key=value'
            ) from None
        if not isinstance(parsed, dict):
            raise ConfigError('EPOCHAL_SPARK_CONF is JSON but not an object: use {"key": "value"}')
        return {str(k): str(v) for k, v in parsed.items()}
    conf: dict[str, str] = {}
    previous: tuple[str, str] | None = None
    for number, item in enumerate(raw.split(","), 1):
        if "=" not in item:
            # Named by position, and shown only when it can be neither a secret's name and value run
            # together nor the tail of the previous item's secret value (a value that holds a ',').
            hidden = is_secret_name(item) or (
                previous is not None and is_secret_conf(previous[0], f"{previous[1]},{item.strip()}")
            )
            shown = "" if hidden else f" ({item.strip()!r})"
            raise ConfigError(
                f"EPOCHAL_SPARK_CONF item {number}{shown} has no '=': use key=value,key=value, or the JSON "
                'form {"key": "value"} for a value that holds a comma'
            )
        key, value = item.split("=", 1)
        conf[key.strip()] = value.strip()
        previous = (key.strip(), value.strip())
    return conf


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting; made by ``from_env``. A new one is one more field, e.g.
    ``lease_s: int = setting("EPOCHAL_LEASE_S", "30", "How long ...", minimum=1)`` (its type picks the
    parser: int, bool on/off, str with optional choices, Path; others give ``parse=``); then paste `epochal settings
    --markdown` into docs/reference.md. Checks that involve two settings go in ``__post_init__``."""

    home: Path = setting("EPOCHAL_HOME", "./.epochal", "Directory for all state: meta store, warehouse, sink files.")
    pipeline_dir: Path = setting(
        "EPOCHAL_PIPELINE",
        str(DEMO_PIPELINE),
        "Directory of `.sql` files that defines the pipeline.",
        shown="bundled demo",
    )
    meta_url: str = setting(
        "EPOCHAL_META_URL",
        "duckdb:///$EPOCHAL_HOME/meta.duckdb",
        "Meta store: `duckdb:///path` or `postgresql://user@host/db`.",
        redact=redact_url,
    )
    warehouse: str = setting(
        "EPOCHAL_WAREHOUSE",
        "$EPOCHAL_HOME/warehouse",
        "Where table data lives: a local path or a URI Spark writes (`s3a://`, `hdfs://`).",
    )
    barrier_interval_ms: int = setting(
        "EPOCHAL_BARRIER_INTERVAL_MS",
        "10000",
        "How often the barrier sensor injects an epoch, on a fixed grid (the daemon evaluates sensors every 5 s: "
        "no more often than that).",
        minimum=1,
    )
    checkpoint_frequency: int = setting(
        "EPOCHAL_CHECKPOINT_FREQUENCY",
        "1",
        "Every N-th barrier is a checkpoint; only checkpoints commit (with the barriers before them).",
        minimum=1,
    )
    max_in_flight: int = setting(
        "EPOCHAL_MAX_IN_FLIGHT",
        "4",
        "Most epochs injected but not committed; injection waits beyond it. Must be ≥ the checkpoint frequency.",
        minimum=1,
    )
    max_epoch_runs: int = setting(
        "EPOCHAL_MAX_EPOCH_RUNS",
        "1",
        "Most epoch_job runs the barrier sensor keeps going at once; epochs injected meanwhile wait, and the "
        "next run takes all of them. Raise it when Spark has cores to run epochs side by side.",
        minimum=1,
    )
    step_threads: int = setting(
        "EPOCHAL_STEP_THREADS",
        "2",
        "Most steps of one epoch_job run working at once, on threads of its process: views whose inputs "
        "are ready overlap one's driver work with another's Spark job. `1`: one step at a time.",
        minimum=1,
    )
    log_level: str = setting(
        "EPOCHAL_LOG_LEVEL",
        "INFO",
        "The console threshold of epoch_job and backfill_job runs: `INFO` shows Epochal's messages, warnings and "
        "the summary a run ends with; `DEBUG` adds Dagster's own event per step (about 140 lines an epoch). A "
        "run config's `loggers: {console: {config: {log_level: ...}}}` overrides it for one run.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    )
    standby_run: bool = setting(
        "EPOCHAL_STANDBY_RUN",
        "on",
        "`on`: while EPOCHAL_MAX_EPOCH_RUNS epoch_job runs work, the barrier sensor starts one more that stands "
        "by, its process and Spark attach ready, and takes the waiting epochs the moment a working run has "
        "committed its own (no launch gap between runs); `off`: a run is started only when one is needed.",
    )
    partition_window: int = setting(
        "EPOCHAL_PARTITION_WINDOW",
        "10000",
        "Recent epochs kept as Dagster partition keys; older keys retire, their data stays.",
        minimum=1,
    )
    epoch_timeout_s: int = setting(
        "EPOCHAL_EPOCH_TIMEOUT_S",
        "600",
        "An in-flight epoch whose run shows no sign of life this long is recovered.",
        minimum=1,
    )
    compact_every: int = setting(
        "EPOCHAL_COMPACT_EVERY",
        "16",
        "Snapshot a table once this many committed epochs of changes follow its last snapshot.",
        minimum=1,
    )
    retention_grace_s: int = setting(
        "EPOCHAL_RETENTION_GRACE_S",
        "60",
        "Seconds a file that compaction retired (an older snapshot, change files) stays on disk at least, for "
        "readers tied to no epoch (`epochal query`, a sink's snapshot read); it also stays until the epochs in "
        "flight when it was retired are done. `0`: only until then.",
        minimum=0,
    )
    time_travel_s: int = setting(
        "EPOCHAL_TIME_TRAVEL_S",
        "3600",
        "Seconds of committed epochs before the newest one that stay readable (`epochal query --as-of`, "
        "`FOR SYSTEM_TIME AS OF`, `epochal changes`): compaction keeps the snapshots and change files "
        "that reading them needs, and no more. `0`: only the committed epoch.",
        minimum=0,
    )
    sink_retry_s: int = setting(
        "EPOCHAL_SINK_RETRY_S",
        "30",
        "A sink step retries a failing target with backoff this long, then fails and lags; epochs go on.",
        minimum=0,
    )
    backfill_rate_limit: float | None = setting(
        "EPOCHAL_BACKFILL_RATE_LIMIT",
        "",
        "Rows per second a backfill reads, for views without `backfill_rate_limit` in their `WITH`; empty: "
        "unlimited, `0`: paused. `epochal backfill VIEW --rate-limit N` overrides both while it runs.",
        parse=lambda text: _rate_limit(text, "EPOCHAL_BACKFILL_RATE_LIMIT"),
    )
    backfill_run_s: int = setting(
        "EPOCHAL_BACKFILL_RUN_S",
        "300",
        "How long one `backfill_job` run advances backfills before it ends (the sensor requests the next).",
        minimum=1,
    )
    backfill_pool: str = setting(
        "EPOCHAL_BACKFILL_POOL",
        BACKFILL_POOL,
        "Spark FAIR scheduler pool backfills run in. Epochal's Spark (in-process or its server) defines "
        "`epochal_backfill`, which gets only the slots live epochs leave; a cluster's server needs the pool in "
        "its `spark.scheduler.allocation.file` and `spark.scheduler.mode=FAIR`. `default`: Spark's default pool, "
        "shared first come first served with live epochs.",
    )
    backfill_yield_s: int = setting(
        "EPOCHAL_BACKFILL_YIELD_S",
        "5",
        "Seconds a backfill waits for the live epochs in flight to commit, when its work starts, before each vnode "
        "range of its snapshot and each chunk read from a SOURCE's split, and once before its change log: it runs "
        "between them. `0`: it never waits.",
        minimum=0,
    )
    backfill_range_rows: int = setting(
        "EPOCHAL_BACKFILL_RANGE_ROWS",
        "10000000",
        "Input rows a backfill's snapshot phase covers in its first vnode range (a few seconds on a laptop); "
        "later ranges grow towards about 10 s each. Progress is saved after each range.",
        minimum=100,
    )
    backfill_chunk_rows: int = setting(
        "EPOCHAL_BACKFILL_CHUNK_ROWS",
        "2000000",
        "Records per chunk a backfill reads from a SOURCE's split; progress is saved after each.",
        minimum=1000,
    )
    snapshot_directory_rows: int = setting(
        "EPOCHAL_SNAPSHOT_DIRECTORY_ROWS",
        "131072",
        "Rows a snapshot directory holds, about: a smaller table's snapshot puts a run of adjacent vnodes in one "
        "directory (fewer files to write), a larger one gives every vnode its own (narrower key lookups). "
        "0: a directory per vnode always.",
        minimum=0,
    )
    state_cache: bool = setting(
        "EPOCHAL_STATE_CACHE",
        "on",
        "Keep a snapshot that a read scans mostly whole in Spark's cache (memory, spilling to disk): `on` or `off`.",
    )
    driver_lookup_rows: int = setting(
        "EPOCHAL_DRIVER_LOOKUP_ROWS",
        "100000",
        "A read of a few keys' rows from a snapshot of over 1M rows on the driver's filesystem is done by DuckDB on "
        "the driver from its Parquet files when the keys, and the rows found, are at most this many (Spark scans the "
        "whole snapshot for them). `0`: always Spark.",
        minimum=0,
    )
    driver_rows: int = setting(
        "EPOCHAL_DRIVER_ROWS",
        "100000",
        "A step whose inputs changed by at most this many rows is computed on the driver by DuckDB, with no Spark "
        "job, when the driver computes it exactly as Spark would (a log source's records, a linear view, a grouped "
        "aggregate, an inner join; state on the driver's filesystem); any other step runs on Spark. `0`: always "
        "Spark.",
        minimum=0,
    )
    sink_driver_rows: int = setting(
        "EPOCHAL_SINK_DRIVER_ROWS",
        "100000",
        "A sink batch of at most this many rows, in change files on the driver's filesystem, is written from the "
        "run's process with pyarrow through the target's own writer (one writer, same two-phase commit) instead of "
        "by Spark writer tasks in Python workers on the server. `0`: always Spark.",
        minimum=0,
    )
    spark_master: str = setting(
        "EPOCHAL_SPARK_MASTER", "local[*]", "Spark master: `local[*]`, `spark://host:7077`, `yarn`, `k8s://…`"
    )
    spark_remote: str = setting(
        "EPOCHAL_SPARK_REMOTE",
        "",
        "Spark Connect server, `sc://host:15002`; wins over the master.",
        redact=redact_url,
    )
    spark_mode: str = setting(
        "EPOCHAL_SPARK_MODE",
        "server",
        "`server`: runs attach to a local Spark Connect server Epochal starts on first use and keeps warm "
        "(`epochal spark status`, `epochal spark stop`); `local`: each run starts Spark in its own process "
        "(~20 s a run, nothing left running). EPOCHAL_SPARK_REMOTE wins over both.",
        choices=("local", "server"),
    )
    spark_port: int = setting(
        "EPOCHAL_SPARK_PORT",
        "0",
        "Port (on 127.0.0.1) of the Spark server of `server` mode; `0` picks one when the server starts "
        "(15052 if free, else any free port) and keeps it in `$EPOCHAL_HOME/spark/server.json`.",
        minimum=0,
    )
    spark_idle_stop_s: int = setting(
        "EPOCHAL_SPARK_IDLE_STOP_S",
        "1800",
        "The managed Spark server stops itself after this many seconds that no process used it (a run, "
        "a command: each renews a lease while it lives); the next run starts it again. `0`: keep it "
        "until `epochal spark stop`. At least 60.",
        minimum=0,
    )
    spark_warmup_epochs: int = setting(
        "EPOCHAL_SPARK_WARMUP_EPOCHS",
        "8",
        "`epochal spark start` runs this many epochs of the built-in demo in a scratch home against a server it "
        "started, so the JVM has compiled Spark before runs come (a fresh server's first epochs cost 2-5x). A "
        "server started on first use is not warmed. `0`: never.",
        minimum=0,
    )
    spark_session_slots: int = setting(
        "EPOCHAL_SPARK_SESSION_SLOTS",
        "4",
        "Spark Connect sessions kept warm on the server for runs to take, one run each at a time (a new session "
        "cost a run's first epoch ~2 s); a run that finds all taken gets a session of its own. `0`: a new session "
        "for every run.",
        minimum=0,
    )
    spark_conf: Mapping[str, str] = setting(
        "EPOCHAL_SPARK_CONF",
        "",
        "Extra Spark conf: a JSON object or `key=value,key=value`.",
        parse=parse_spark_conf,
        redact=redact_conf,
    )
    fault: str = setting(
        "EPOCHAL_FAULT",
        "",
        "Testing only: SIGKILL the process at a fault point (`epochal/faults.py`), e.g. `committed`.",
        choices=("", *FAULT_POINTS),
    )

    def __post_init__(self) -> None:
        if self.max_in_flight < self.checkpoint_frequency:
            # Barriers between checkpoints stay in flight until the checkpoint commits them, so a
            # smaller limit could never reach the next checkpoint.
            raise ConfigError(
                f"EPOCHAL_MAX_IN_FLIGHT={self.max_in_flight} is below EPOCHAL_CHECKPOINT_FREQUENCY="
                f"{self.checkpoint_frequency}: raise the limit to at least the checkpoint frequency"
            )
        if 0 < self.spark_idle_stop_s < MIN_IDLE_STOP_S:
            # a lease is renewed every 30 s: a shorter limit would stop a server that runs are using
            raise ConfigError(
                f"EPOCHAL_SPARK_IDLE_STOP_S={self.spark_idle_stop_s} is too short: use 0 (never stop) or at "
                f"least {MIN_IDLE_STOP_S} seconds"
            )
        if self.spark_port > 65535:
            raise ConfigError(f"EPOCHAL_SPARK_PORT={self.spark_port} is not a TCP port: use 1-65535, or 0 to pick one")

    def __repr__(self) -> str:
        # A repr ends up in logs and tracebacks: secrets never go with it.
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            redact = f.metadata["setting"].redact
            shown.append(f"{f.name}={(redact(value) if redact else value)!r}")
        return f"Settings({', '.join(shown)})"

    @staticmethod
    def env_name(attribute: str) -> str:
        """The variable a field is read from: ``Settings.env_name("spark_conf")`` is ``EPOCHAL_SPARK_CONF``."""
        return _SPECS[attribute].env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        known = {s.env for s in SETTINGS}
        for name in env:
            if name.startswith("EPOCHAL_") and name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"did you mean {close[0]}?" if close else "run `epochal settings` for the list"
                raise ConfigError(f"unknown setting {name}: {hint}")
        values: dict[str, Any] = {}
        read: dict[str, str] = {}  # env name -> value as text, for later defaults' $EPOCHAL_X
        for f in fields(cls):
            spec: Setting = f.metadata["setting"]
            raw = env.get(spec.env, "")
            if not raw.strip():
                raw = string.Template(spec.default).safe_substitute(read)
            values[f.name] = _parse(spec, _field_types()[f.name], raw)
            read[spec.env] = str(values[f.name])
        return cls(**values)


@cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


def _parse_int(spec: Setting, raw: str) -> int:
    at_least = "" if spec.minimum is None else f" >= {spec.minimum}"
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{spec.env}={raw!r} is not a whole number: set it to an integer{at_least}") from None
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"{spec.env}={value} is too small: it must be{at_least}")
    return value


_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")


def _parse_switch(spec: Setting, raw: str) -> bool:
    word = raw.lower()
    if word not in _ON and word not in _OFF:
        raise ConfigError(f"{spec.env}={raw!r} is not a switch: set it to on or off")
    return word in _ON


def _parse_text(spec: Setting, raw: str) -> str:
    if spec.choices is not None and raw not in spec.choices:
        listed = ", ".join(c for c in spec.choices if c)
        close = difflib.get_close_matches(raw, [c for c in spec.choices if c], n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"{spec.env}={raw!r} is not a known value: {hint}use one of {listed}")
    return raw


def _parse_path(spec: Setting, raw: str) -> Path:
    return Path(raw).expanduser().resolve()


_PARSERS: dict[Any, Callable[[Setting, str], Any]] = {
    int: _parse_int,
    bool: _parse_switch,
    str: _parse_text,
    Path: _parse_path,
}


def _parse(spec: Setting, kind: Any, raw: str) -> Any:
    raw = raw.strip()
    if spec.parse is not None:
        return spec.parse(raw)
    parser = _PARSERS.get(kind)
    if parser is None:  # a declaration mistake, caught by the tests that read every setting
        raise TypeError(f"{spec.env}: no parser for {kind!r}; give setting(..., parse=...)")
    return parser(spec, raw)


_SPECS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(Settings)}
#: Every setting, in declaration order.
SETTINGS: tuple[Setting, ...] = tuple(_SPECS.values())


def shown_default(spec: Setting) -> str:
    return spec.shown if spec.shown is not None else spec.default


def settings_text() -> str:
    """What `epochal settings` prints: one line per setting."""
    width = max(len(s.env) for s in SETTINGS)
    defaults = [shown_default(s) or "(empty)" for s in SETTINGS]
    dwidth = max(len(d) for d in defaults)
    return "\n".join(
        f"{s.env:<{width}}  {d:<{dwidth}}  {s.help.replace('`', '')}" for s, d in zip(SETTINGS, defaults, strict=True)
    )


def settings_markdown() -> str:
    """docs/reference.md's settings table (`epochal settings --markdown`)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        default = shown_default(s)
        cell = "(empty)" if not default else default if s.shown is not None else f"`{default}`"
        rows.append(f"| `{s.env}` | {cell} | {s.help.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


__all__ = ["DEMO_PIPELINE", "SETTINGS", "Setting", "Settings", "parse_spark_conf", "setting"]


def _rate_limit(text: str, where: str) -> float | None:
    """Rows per second: empty means unlimited, 0 pauses."""
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{where}={text!r} is not a number of rows per second (empty: unlimited, 0: paused)"
        ) from None
    if value < 0:
        raise ConfigError(f"{where}={text!r} is negative: give rows per second (empty: unlimited, 0: paused)")
    return value
