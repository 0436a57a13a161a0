"""Load-time validation of sink definitions, per connector."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from epochal.options import unknown_option_problems

SINK_TYPES = ("append-only", "upsert")
DUCKDB_OPTIONS = ("connector", "database", "table", "type", "primary_key")


def primary_key_columns(options: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(c.strip() for c in options.get("primary_key", "").split(",") if c.strip())


def validate_sink(connector: str, options: Mapping[str, str], upstream_columns: Sequence[str]) -> list[str]:
    """Problems with a sink's options; ``upstream_columns`` are the columns of the table it reads."""
    if connector != "duckdb":
        return [f"unknown sink connector '{connector}': supported sink connectors are: duckdb"]
    problems = unknown_option_problems("duckdb sink", options, DUCKDB_OPTIONS)
    for required in ("database", "table"):
        if not options.get(required):
            problems.append(f"duckdb sink needs option {required} = '...'")
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
    return problems
