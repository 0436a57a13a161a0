"""The PostgreSQL sink's side of schemas: the Arrow -> PostgreSQL type mapping a target table is
created with, the check of a table that already exists, and the CSV its writers ``COPY`` in.

Arrow -> PostgreSQL types (what ``PostgresTarget.prepare_target`` creates; an existing column
may have the type or a wider one that holds every value exactly, :data:`WIDER`):

=============================  ===================================
Arrow                          PostgreSQL
=============================  ===================================
int64 / int32 / int16          bigint / integer / smallint
float64 / float32              double precision / real
string, large_string           text
bool                           boolean
date32                         date
timestamp[s|ms|us, tz=...]     timestamp with time zone
timestamp[s|ms|us]             timestamp without time zone
decimal128(p, s)               numeric(p, s)
binary, large_binary           bytea
list, struct, map              jsonb (a struct an object, a map an
                               object keyed by its keys' text)
=============================  ===================================

Anything else (nanosecond timestamps, ...) is refused with the column named.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Protocol

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv

from epochal.sinks.base import SinkSchemaError


class PostgresTable(Protocol):
    """The sink's target table as these checks name it (``PostgresTarget`` is one)."""

    name: str
    database: str
    schema: str
    table: str
    type: str
    primary_key: tuple[str, ...]


#: Arrow type -> the PostgreSQL type it is created as, as format_type() spells it.
_SIMPLE_TYPES: dict[pa.DataType, str] = {
    pa.int64(): "bigint",
    pa.int32(): "integer",
    pa.int16(): "smallint",
    pa.float64(): "double precision",
    pa.float32(): "real",
    pa.string(): "text",
    pa.large_string(): "text",
    pa.bool_(): "boolean",
    pa.date32(): "date",
    pa.binary(): "bytea",
    pa.large_binary(): "bytea",
}

#: An existing column of one of these types takes every value of the sink's type exactly, so it is
#: accepted (COPY converts text input to it without rounding or truncation). Nothing else is.
WIDER: dict[str, tuple[str, ...]] = {
    "smallint": ("integer", "bigint", "numeric"),
    "integer": ("bigint", "numeric"),
    "bigint": ("numeric",),
    "real": ("double precision",),
    "text": ("character varying",),
}


def postgres_type(field: pa.Field) -> str:
    """The PostgreSQL type a sink column of Arrow type ``field.type`` is created as."""
    t = field.type
    if t in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[t]
    if pa.types.is_timestamp(t) and t.unit in ("s", "ms", "us"):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_decimal128(t):
        return f"numeric({t.precision},{t.scale})"
    if _is_nested(t):
        return "jsonb"
    raise SinkSchemaError(
        f"column {field.name} has Arrow type {t}, which the PostgreSQL sink does not map: supported are "
        "int64, int32, int16, float64, float32, string, bool, date32, timestamp (s/ms/us, with or without time "
        "zone), decimal128, binary, and lists, structs and maps (as jsonb); cast the column in the sink's view "
        "(e.g. CAST(x AS TIMESTAMP) for nanosecond timestamps)"
    )


def compatible(existing: str, expected: str) -> bool:
    """Whether a column of PostgreSQL type ``existing`` holds every value of ``expected`` exactly."""
    if existing == expected or existing in WIDER.get(expected, ()):
        return True
    # an unconstrained numeric holds any numeric(p, s) value as it is
    return expected.startswith("numeric(") and existing == "numeric"


def existing_columns(target: PostgresTable, conn: psycopg.Connection) -> tuple[int, dict[str, str]] | None:
    """The target table's oid and columns (name -> type as format_type spells it), or None."""
    row = conn.execute(
        "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        [target.schema, target.table],
    ).fetchone()
    if row is None:
        return None
    if row[1] not in ("r", "p"):
        raise SinkSchemaError(
            f"sink {target.name}: {target.schema}.{target.table} in database {target.database} is not a table "
            f"(relkind {row[1]!r}, e.g. a view): point the sink at a table with table = '...'"
        )
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [row[0]],
    ).fetchall()
    return row[0], {n: t for n, t in rows}

def check_existing(
    target: PostgresTable,
    conn: psycopg.Connection, oid: int, existing: dict[str, str], expected: dict[str, str]
) -> None:
    diff = []
    for name, want in expected.items():
        have = existing.get(name)
        if have is None:
            near = [n for n in existing if n.lower() == name.lower()]
            hint = f" (it has {near[0]}: PostgreSQL names are case-sensitive when quoted)" if near else ""
            diff.append(f"missing column {name} {want}{hint}")
        elif not compatible(have, want):
            diff.append(f"column {name} is {have}, the sink writes {want}")
    diff += [f"extra column {n} {t}" for n, t in existing.items() if n not in expected]
    if diff:
        raise SinkSchemaError(
            f"sink {target.name}: table {target.schema}.{target.table} in database {target.database} exists with an "
            f"incompatible schema ({'; '.join(diff)}). Epochal never casts silently: alter or drop that "
            "table, or point the sink at another one with table = '...'"
        )
    if target.type != "upsert":
        return
    keys = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL "
        "AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts GROUP BY i.indexrelid",
        [oid],
    ).fetchall()
    unique = [list(r[0]) for r in keys]
    if not any(sorted(u) == sorted(target.primary_key) for u in unique):
        found = "; ".join(f"({', '.join(u)})" for u in unique) or "none"
        raise SinkSchemaError(
            f"sink {target.name}: an upsert sink needs table {target.schema}.{target.table} to have a PRIMARY KEY or "
            f"unique index on exactly ({', '.join(target.primary_key)}), for INSERT ... ON CONFLICT; its unique "
            f"keys: {found}. Add one (ALTER TABLE ... ADD PRIMARY KEY ({', '.join(target.primary_key)})) or point "
            "the sink at a new table"
        )


def copy_csv(batch: pa.RecordBatch, columns: Sequence[str]) -> bytes:
    """``columns`` of ``batch`` as PostgreSQL CSV: NULL unquoted-empty, "" an empty string
    (pyarrow's CSV writer does exactly that), timestamps in UTC, bytea in hex."""
    arrays = []
    for name in columns:
        column = batch.column(name)
        t = column.type
        if pa.types.is_timestamp(t) and t.tz:
            # The values are UTC instants; written without a zone they are read in the writer's
            # session TimeZone, which is UTC. (Formatting with a zone looks the zone up per value:
            # 40x slower than every other column together.)
            column = column.view(pa.timestamp(t.unit))
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            column = pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())
        elif _is_nested(t):
            column = pa.array([None if v is None else _json_text(v, t) for v in column.to_pylist()], pa.string())
        arrays.append(column)
    buffer = io.BytesIO()
    pa_csv.write_csv(
        pa.RecordBatch.from_arrays(arrays, names=list(columns)), buffer, pa_csv.WriteOptions(include_header=False)
    )
    return buffer.getvalue()


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t)


def _json_text(value: Any, t: pa.DataType) -> str:
    """A value of Arrow type ``t`` (a list, struct or map, or what they hold) as jsonb text:
    decimals as the exact numbers they are, dates and timestamps as ISO text, NaN and infinities
    (which JSON has not) as strings, a map as an object keyed by its keys' text. The type, not the
    value, says what a value is: Arrow gives a map as a list of (key, value) pairs."""
    if value is None:
        return "null"
    if pa.types.is_struct(t):
        return _json_object((f.name, value[f.name], f.type) for f in t)
    if pa.types.is_map(t):
        return _json_object((k, v, t.item_type) for k, v in value)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "[" + ",".join(_json_text(v, t.value_type) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else json.dumps(str(value))
    if isinstance(value, float):
        return json.dumps(value) if math.isfinite(value) else json.dumps(str(value))
    if isinstance(value, (dt.datetime, dt.date)):
        return json.dumps(value.isoformat())
    return json.dumps(value, ensure_ascii=False)


def _json_object(fields: Any) -> str:
    return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{_json_text(v, t)}" for k, v, t in fields) + "}"
