"""RisingWave's shared CDC source, resolved at load.

``CREATE SOURCE shop WITH (connector = 'postgres-cdc', ...)`` declares a connection, no columns;
``CREATE TABLE orders (...) FROM shop TABLE 'public.orders'`` declares a table read through it.
Each such table becomes an ordinary source of the connector, with the shared source's options and
``table.name``; the shared source itself holds no rows and is no table of the pipeline. The
connector's ``server_problems`` (the server is up and logical, the table, its key, replica identity
and types) are asked here, at load, where the declared key is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from epochal.pipeline.ddl import SHARED_CONNECTORS, Options, ParsedSource

if TYPE_CHECKING:
    from epochal.connectors.base import ConnectorSpec

TABLE_OPTION = "table.name"


def resolve_shared_sources(
    named: dict[str, Any],
    add_issue: Callable[[str, int, str], None],
    lookup: Callable[[str], ConnectorSpec | None],
) -> dict[str, Any]:
    """``named`` (name -> the loader's definitions) without the shared sources, and with each table
    that reads FROM one turned into a source of its connector."""
    shared: dict[str, Any] = {}
    for name, definition in named.items():
        parsed = definition.parsed
        if isinstance(parsed, ParsedSource) and parsed.kind == "source" and not parsed.columns:
            connector = parsed.options.values.get("connector", "").lower()
            if connector not in SHARED_CONNECTORS:
                where = definition.location
                add_issue(
                    where.file,
                    where.line,
                    f"source {name} has no column list: only a "
                    f"{' or '.join(SHARED_CONNECTORS)} source is declared without one (tables read it with "
                    f"FROM {name} TABLE '...'); add the columns, e.g. {name} (id BIGINT, ts TIMESTAMP)",
                )
            shared[name] = definition
    resolved: dict[str, Any] = {}
    for name, definition in named.items():
        if name in shared:
            continue
        parsed = definition.parsed
        connector = parsed.options.values.get("connector", "").lower() if isinstance(parsed, ParsedSource) else ""
        if connector in SHARED_CONNECTORS:
            # its records are keyed changes: only a table with the upstream key, declared FROM a source, reads them
            where = definition.location
            add_issue(
                where.file,
                where.line,
                f"{parsed.kind} {name}: a {connector} table is declared FROM a source "
                f"of the connection: CREATE SOURCE s WITH (connector = '{connector}', ...); then CREATE TABLE "
                f"{name} (..., PRIMARY KEY (...)) FROM s TABLE 'schema.table'",
            )
            continue
        if isinstance(parsed, ParsedSource) and parsed.from_source:
            where = definition.location
            source = shared.get(parsed.from_source)
            if source is None:
                add_issue(
                    where.file,
                    where.line,
                    f"table {name} reads FROM {parsed.from_source}, which is no "
                    f"CREATE SOURCE {parsed.from_source} WITH (connector = '{' or '.join(SHARED_CONNECTORS)}', ...) of "
                    "the pipeline: "
                    "declare it, or correct the name",
                )
                continue
            values = {**source.parsed.options.values, TABLE_OPTION: parsed.from_table}
            parsed = replace(parsed, options=Options(values, {}))
            definition = replace(definition, parsed=parsed)
            spec = lookup(values.get("connector", "").lower())
            check = getattr(spec, "server_problems", None)
            if check is not None and not spec.validate(parsed.columns, values):
                for message in check(parsed.columns, parsed.primary_key, values):
                    add_issue(where.file, where.line, f"table {name}: {message}")
        resolved[name] = definition
    return resolved
