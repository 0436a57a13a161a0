"""SQL text that Epochal writes itself, spelled by sqlglot rather than by hand.

``quote`` names a column or table in generated Spark, DuckDB or PostgreSQL SQL; ``string_list`` writes
a list of strings (file paths) as a DuckDB list literal; ``numbered_placeholders`` turns the meta store's
``?`` parameters into PostgreSQL's ``$1, $2, ...``. All go through sqlglot, which knows each dialect's
quoting and escaping and where string literals, quoted identifiers and comments are, so a ``?`` or a
quote character inside one is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import sqlglot
import sqlglot.errors
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

#: Spark is the dialect of every query Epochal plans and runs; DuckDB's is named where it is used.
SPARK = "spark"
DUCKDB = "duckdb"

#: Names Spark SQL written by Epochal always quotes (the pipeline dialect's generator, and ``quote``
#: with ``when_needed``): a column called `select`, `from` or `order` is ordinary in JSON records,
#: and the SQL written for it must parse again, in sqlglot and in Spark. Spark's ANSI reserved
#: words, and the words sqlglot's parser does not take as a bare name (measured against the dialect).
SPARK_RESERVED = frozenset(
    """
    all alter and any as authorization between both case cast check collate column constraint create
    cross cube current_date current_time current_timestamp current_user distinct drop else end escape
    except exists false fetch filter for foreign from full glob grant group having ilike in inner
    insert intersect interval into is join lateral leading left like limit lock minus natural not
    notnull null offset on only or order outer overlaps partitioned_by primary qualify references
    regexp returning revoke right rlike rollback rollup select serdeproperties session_user some table
    tablesample then time to trailing true uncache union unique unknown user using values when where
    window with xor
    """.split()
)


#: Columns Epochal adds to a table's rows, or names in the SQL it writes over them, beside the
#: user's columns: a user column of the same name would be overwritten or read in their place
#: (a source's ``_weight`` set to 1, rows repeated ``_n`` times, the DuckDB upsert sink's ``_net``).
#: The loader refuses them as source and view columns (case-insensitive, as Spark's names are).
#: Name -> what Epochal uses it for, as the refusal says.
INTERNAL_COLUMNS: dict[str, str] = {
    "_weight": "each change row's weight (+1 insert, -1 delete)",
    "_n": "a row's count when changes are netted",
    "_net": "a row's net weight in the DuckDB upsert sink",
    "_i": "the copy number when netted rows are expanded",
    "_vnode": "the state's virtual-node partition",
    "_vnodes": "the state's virtual-node run",
}
#: Prefixes of the columns Epochal derives from a user column's name (``_old_total`` from ``total``
#: in an aggregate's state, ``_epochal_k0`` for a key; ``__epochal_corrupt_record`` is Spark's
#: column of a line it cannot parse), so no user column may start with one.
INTERNAL_PREFIXES: tuple[str, ...] = ("_epochal", "__epochal", "_old_", "_delta_", "_gone_", "_in_", "_out_")
#: Further columns a table with a PRIMARY KEY carries while its records are turned into changes
#: (epochal/storage/upsert.py, epochal/driver/sources.py); ``_p_`` prefixes a stored row's columns.
KEYED_INTERNAL_COLUMNS: dict[str, str] = {
    "_op": "each record's operation (upsert or delete)",
    "_split": "each record's position (its split)",
    "_offset": "each record's position (its offset)",
    "_found": "whether a key has a stored row",
    "_upsert": "whether a record is an upsert",
    "_same": "whether an upsert repeats the stored row",
}
KEYED_INTERNAL_PREFIXES: tuple[str, ...] = ("_p_",)


def internal_name_use(name: str, *, keyed: bool = False) -> str | None:
    """What Epochal uses column ``name`` for when it is one of its own (then a user column cannot
    have it), else None. ``keyed``: the column is a table with a PRIMARY KEY's."""
    lowered = name.lower()
    names = {**INTERNAL_COLUMNS, **KEYED_INTERNAL_COLUMNS} if keyed else INTERNAL_COLUMNS
    if lowered in names:
        return names[lowered]
    prefixes = INTERNAL_PREFIXES + KEYED_INTERNAL_PREFIXES if keyed else INTERNAL_PREFIXES
    for prefix in prefixes:
        if lowered.startswith(prefix):
            return f"the columns Epochal derives from a column's name (prefix {prefix})"
    return None


#: PostgreSQL's longest identifier in bytes (NAMEDATALEN - 1): the server truncates a longer one
#: silently, so two names can become one and a table's name differs from the one Epochal asks for.
POSTGRES_MAX_IDENTIFIER_BYTES = 63


@lru_cache(maxsize=4096)
def quote(name: str, dialect: str = SPARK, *, when_needed: bool = False) -> str:
    """``name`` as an identifier of ``dialect``: ```a``b``` for Spark, ``"a""b"`` for DuckDB and PostgreSQL.

    ``when_needed`` leaves a plain name (``auction``) bare and quotes any other (```a b```), as sqlglot
    writes a column in the SQL it generates, so the result compares equal to that SQL's text.
    """
    quoted = not when_needed or (dialect == SPARK and name.lower() in SPARK_RESERVED)
    return exp.to_identifier(name, quoted=True if quoted else None).sql(dialect=dialect)


@lru_cache(maxsize=4096)
def unquote(expr: str, dialect: str = SPARK) -> str:
    """The column name ``expr`` spells when it is one (```a``b``` -> ``a`b``, ``auction`` -> ``auction``),
    the inverse of ``quote``; any other expression (``t.a``, ``date_trunc('hour', ts)``) as written."""
    try:
        node = sqlglot.parse_one(expr, read=dialect)
    except sqlglot.errors.SqlglotError:
        return expr
    return node.name if isinstance(node, exp.Column) and not node.table else expr


def string_literal(value: str, dialect: str = DUCKDB) -> str:
    """``value`` as a string literal of ``dialect``, e.g. ``'it''s.duckdb'``."""
    return exp.Literal.string(value).sql(dialect=dialect)


def string_list(values: Iterable[str], dialect: str = DUCKDB) -> str:
    """``values`` as a list literal of ``dialect``, e.g. ``['a.parquet', 'it''s.parquet']``."""
    return exp.Array(expressions=[exp.Literal.string(v) for v in values]).sql(dialect=dialect)


def duckdb_parquet(files: Iterable[str], union_by_name: bool = False) -> str:
    """DuckDB's read of Epochal's Parquet ``files``. Without hive partitioning: their paths hold
    layout directories (``epoch=E``, ``snapshot=S``, ``_vnode=V``, and whatever a home's path has),
    which DuckDB would otherwise read as columns, over a table's own column of the same name.
    ``union_by_name``: files written before a column existed lack it (NULL there)."""
    by_name = ", union_by_name = true" if union_by_name else ""
    return f"read_parquet({string_list(files)}, hive_partitioning = false{by_name})"


@lru_cache(maxsize=1024)
def numbered_placeholders(sql: str, dialect: str = "postgres") -> str:
    """``sql`` with each ``?`` parameter replaced by ``$1``, ``$2``, ... in order.

    The meta store's SQL is written once with DuckDB's ``?`` parameters and shared by both backends;
    PostgreSQL binds ``$n`` parameters server-side. Only placeholder tokens are replaced: a ``?`` in a
    string literal, a quoted identifier or a comment stays as written. Cached per statement text,
    which the meta store repeats every epoch."""
    pieces: list[str] = []
    done = 0
    number = 0
    for token in Dialect.get_or_raise(dialect).tokenize(sql):
        if token.token_type is TokenType.PLACEHOLDER and token.text == "?":
            number += 1
            pieces += [sql[done : token.start], f"${number}"]
            done = token.end + 1
    pieces.append(sql[done:])
    return "".join(pieces)
