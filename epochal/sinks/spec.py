"""Sink connectors by name, and the load-time check of a sink's WITH (...) options.

Every sink takes the options the coordinator reads (:data:`COMMON_OPTIONS`); each connector adds
its own. A connector module registers a :class:`SinkSpec` in :data:`SINK_CONNECTORS` through
:func:`sink_spec`'s lazy table, so the loader does not import psycopg, deltalake or pyiceberg.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.env_refs import RESERVED_ENV_PREFIXES, is_reserved, read_env, referenced_name
from epochal.errors import EpochalError
from epochal.options import unknown_option_problems, whole_number_option
from epochal.sql import POSTGRES_MAX_IDENTIFIER_BYTES
from epochal.storage.vnode import VNODE_COUNT

if TYPE_CHECKING:
    from epochal.sinks.base import SinkTarget

SINK_TYPES = ("append-only", "upsert")
#: Options every sink takes: what it delivers and how the coordinator batches and spreads it.
COMMON_OPTIONS = ("connector", "type", "primary_key", "commit_checkpoint_interval", "writers", "snapshot")
#: `snapshot = 'true'` (default): a sink added to a table with history first delivers the table's
#: state as one batch; 'false': it delivers only the epochs after its first delivery (RisingWave's option).
SNAPSHOT_VALUES = ("true", "false")
#: Default writer tasks per sink; `writers = 'n'` overrides it per sink.
DEFAULT_WRITERS = 2

# `${NAME}` in an option value is read from the environment when the sink runs: how a password
# stays out of the pipeline's files, `epochal status` and the Dagster UI.
#: Variables a sink option may not read: Epochal's and Dagster's own settings (EPOCHAL_META_URL, the
#: Dagster instance's storage), so a pipeline file cannot send their secrets to a target it names.


def reserved_env_problem(key: str, name: str) -> str | None:
    """Why option ``key`` may not read environment variable ``name``, or None."""
    if not is_reserved(name):
        return None
    return (
        f"option {key} = '${{{name}}}' reads {name}, one of Epochal's or Dagster's own settings "
        f"({'*, '.join(RESERVED_ENV_PREFIXES)}*), which a sink may not read: export the value under a name "
        f"of its own (e.g. SINK_{key.upper().replace('.', '_')}) and write '${{SINK_{key.upper().replace('.', '_')}}}'"
    )


@dataclass(frozen=True)
class SinkSpec:
    name: str
    #: options of this connector beyond COMMON_OPTIONS
    options: tuple[str, ...]
    required: tuple[str, ...]
    #: "module:function" building the target: (name, options, columns, home, meta_url) -> SinkTarget
    factory: str
    #: options whose values are secrets (never shown)
    secret: tuple[str, ...] = ()
    #: extra load-time checks: (sink name, options, upstream columns) -> problems
    check: Callable[[str, Mapping[str, str], Sequence[str]], list[str]] | None = None
    #: the options that say which target the rows go to (a changed one is another target:
    #: ``epochal.checkpoint.statements.sinks``), the defaults the target applies, and which are paths
    identity: tuple[str, ...] = ()
    identity_defaults: tuple[tuple[str, str], ...] = ()
    paths: tuple[str, ...] = ()

    def create(
        self, name: str, options: Mapping[str, str], columns: Sequence[str], home: Path, meta_url: str | None
    ) -> SinkTarget:
        module, _, function = self.factory.partition(":")
        build = getattr(importlib.import_module(module), function)
        return build(name, resolve_env(name, options), list(columns), home, meta_url)


def _postgres_check(name: str, options: Mapping[str, str], columns: Sequence[str]) -> list[str]:
    problems: list[str] = []
    whole_number_option(options, "port", 5432, 1, problems, maximum=65535)
    return problems + postgres_name_problems(name, options, columns)


#: The names Epochal itself creates in a PostgreSQL sink's schema; with the writer number and a
#: random tail, the longest staging table is this long (below POSTGRES_MAX_IDENTIFIER_BYTES).
POSTGRES_OWN_NAMES = ("_epochal_sink_progress", f"_epochal_stage_w{VNODE_COUNT - 1}_ffffff")


def postgres_name_problems(sink: str, options: Mapping[str, str], columns: Sequence[str]) -> list[str]:
    """A name the PostgreSQL sink would use that the server would cut to 63 bytes: the table became
    another name than the one Epochal looks for, so the next run failed on DuplicateTable or a false
    schema mismatch. ``sink`` names the table when no ``table`` option does (empty: unknown). A
    ``${ENV}`` value is checked when the sink runs, once it is known."""
    named: list[tuple[str, str, str]] = []  # (the name as the message shows it, the name, the fix)
    for option, default in (("database", "postgres"), ("schema", "public"), ("table", sink)):
        value = options.get(option, default)
        if value and referenced_name(value) is None:
            named.append((f"option '{option}' = '{value}'", value, f"give a shorter {option}"))
    for column in columns:
        fix = "rename it in the SELECT of the table the sink reads (... AS shorter)"
        named.append((f"column '{column}'", column, fix))
    problems = []
    for shown, value, fix in named:
        size = len(value.encode("utf-8"))
        if size > POSTGRES_MAX_IDENTIFIER_BYTES:
            problems.append(
                f"{shown} is {size} bytes, over PostgreSQL's limit of {POSTGRES_MAX_IDENTIFIER_BYTES} bytes on a "
                f"name (the server would cut it silently, and a later run would not find it): {fix}"
            )
    return problems


SINK_CONNECTORS: dict[str, SinkSpec] = {
    "duckdb": SinkSpec(
        "duckdb",
        ("database", "table"),
        ("database", "table"),
        "epochal.sinks.duckdb_sink:DuckDBTarget",
        identity=("database", "table"),
        paths=("database",),
    ),
    "postgres": SinkSpec(
        "postgres",
        ("host", "port", "user", "password", "database", "schema", "table"),
        ("host", "user", "database", "table"),
        "epochal.sinks.postgres_sink:PostgresTarget",
        secret=("password",),
        check=_postgres_check,
        # (table defaults to the sink's name, which a declaration is kept under anyway)
        identity=("host", "port", "database", "schema", "table"),
        identity_defaults=(("port", "5432"), ("database", "postgres"), ("schema", "public")),
    ),
    "deltalake": SinkSpec(
        "deltalake",
        ("location",),
        ("location",),
        "epochal.sinks.delta_sink:DeltaTarget",
        identity=("location",),
        paths=("location",),
    ),
    "iceberg": SinkSpec(
        "iceberg",
        ("catalog.uri", "catalog.name", "warehouse", "namespace", "table"),
        ("table",),
        "epochal.sinks.iceberg_sink:IcebergTarget",
        secret=("catalog.uri",),
        # (catalog.uri is a secret, never recorded: the catalog's name and warehouse stand for it)
        identity=("catalog.name", "warehouse", "namespace", "table"),
        identity_defaults=(("catalog.name", "epochal"), ("namespace", "default")),
        paths=("warehouse",),
    ),
}


def sink_spec(connector: str) -> SinkSpec | None:
    return SINK_CONNECTORS.get(connector.strip().lower())


def primary_key_columns(options: Mapping[str, str], columns: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns ``primary_key`` names: ``'a, b'``, a name holding a comma in backticks or double
    quotes (a quote doubled inside them), spaces around names dropped. With ``columns`` (the
    upstream table's), each is spelled as there: the loader resolves the names ignoring case, as
    SQL does, while Arrow, Iceberg and PostgreSQL's quoted names match exactly."""
    spelled = {c.lower(): c for c in columns}
    return tuple(spelled.get(n.lower(), n) for n in _split_names(options.get("primary_key", "")))


def _split_names(text: str) -> list[str]:
    names: list[str] = []
    current: list[str] = []
    quoted = False  # whether the name being read was quoted (its spaces are its own)
    quote_char = ""
    i = 0
    while i < len(text):
        char = text[i]
        if quote_char:
            if char == quote_char and text[i + 1 : i + 2] == quote_char:
                current.append(char)
                i += 1
            elif char == quote_char:
                quote_char = ""
            else:
                current.append(char)
        elif char in "`\"" and not "".join(current).strip():
            quote_char, quoted, current = char, True, []
        elif char == ",":
            names.append("".join(current) if quoted else "".join(current).strip())
            current, quoted = [], False
        elif not (quoted and char.isspace()):
            current.append(char)
        i += 1
    names.append("".join(current) if quoted else "".join(current).strip())
    return [n for n in names if n]


def commit_checkpoint_interval(options: Mapping[str, str]) -> int:
    """Epochs per downstream transaction (RisingWave's option of the same name)."""
    return whole_number_option(options, "commit_checkpoint_interval", 1, 1, [], maximum=10_000) or 1


def writer_count(options: Mapping[str, str]) -> int:
    return whole_number_option(options, "writers", DEFAULT_WRITERS, 1, [], maximum=VNODE_COUNT) or DEFAULT_WRITERS


def snapshot_option(options: Mapping[str, str]) -> bool:
    return options.get("snapshot", "true").strip().lower() != "false"


def resolve_env(sink: str, options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with every ``${NAME}`` value read from the environment."""
    resolved = dict(options)
    for key, value in options.items():
        name = referenced_name(value)
        if name is not None:
            if problem := reserved_env_problem(key, name):
                raise EpochalError(f"sink {sink}: {problem}")
            resolved[key] = read_env(name, f"sink {sink}: option {key}")
    return resolved


def shown_options(connector: str, options: Mapping[str, str]) -> dict[str, str]:
    """Options as Epochal shows them (UI, status, errors): secrets masked unless they only name an
    environment variable."""
    spec = sink_spec(connector)
    secret = spec.secret if spec else ()
    return {k: (v if k not in secret or referenced_name(v) is not None else "***") for k, v in options.items()}


def validate_sink(
    connector: str, options: Mapping[str, str], upstream_columns: Sequence[str], name: str = ""
) -> list[str]:
    """Problems with a sink's options; ``upstream_columns`` are the columns of the table it reads,
    ``name`` the sink's (empty: not known)."""
    spec = sink_spec(connector)
    if spec is None:
        return [f"unknown sink connector '{connector}': supported sink connectors are: {', '.join(SINK_CONNECTORS)}"]
    problems = unknown_option_problems(f"{spec.name} sink", options, (*COMMON_OPTIONS, *spec.options))
    for key, value in options.items():
        name = referenced_name(value)
        if name is not None and (problem := reserved_env_problem(key, name)):
            problems.append(problem)
    for required in spec.required:
        if not options.get(required):
            problems.append(f"{spec.name} sink needs option {required} = '...'")
    sink_type = options.get("type", "append-only")
    if sink_type not in SINK_TYPES:
        problems.append(f"sink type '{sink_type}' is not supported: use type = 'append-only' or type = 'upsert'")
    keys = primary_key_columns(options)
    if sink_type == "upsert" and not keys:
        problems.append("an upsert sink needs primary_key = 'col[, col...]' naming the key columns")
    if sink_type == "append-only" and keys:
        problems.append("primary_key only applies to type = 'upsert'; remove it or change the type")
    lowered = {c.lower() for c in upstream_columns}
    for key in keys:
        if key.lower() not in lowered:
            problems.append(
                f"primary_key column '{key}' is not a column of the upstream table "
                f"(columns: {', '.join(upstream_columns)})"
            )
    whole_number_option(options, "commit_checkpoint_interval", 1, 1, problems, maximum=10_000)
    whole_number_option(options, "writers", DEFAULT_WRITERS, 1, problems, maximum=VNODE_COUNT)
    snapshot = options.get("snapshot")
    if snapshot is not None and snapshot.strip().lower() not in SNAPSHOT_VALUES:
        problems.append(
            f"option 'snapshot' must be 'true' (deliver the table's existing rows first, the default) or "
            f"'false' (only epochs after the sink's first delivery), got '{snapshot}'"
        )
    if spec.check is not None:
        problems += spec.check(name, options, upstream_columns)
    return problems
