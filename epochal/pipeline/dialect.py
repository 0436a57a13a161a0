"""Spark SQL as Epochal reads it: sqlglot's Spark dialect, extended where it refuses what Spark accepts.

Every query Epochal parses (a view as written, a plan it generated, a query it binds to frames)
goes through :data:`DIALECT`, so an extension here holds everywhere. A stateful view runs the SQL
sqlglot generates from its plan, not the text as written, so generation must keep meaning: where
sqlglot's Spark generator rewrites a call for an older Spark and loses it, the call is written as
Spark 4 takes it.

* ``GROUP BY window(date_time, '10 seconds')``: sqlglot stops a GROUP BY at the WINDOW keyword,
  taking it for the start of a ``WINDOW w AS (...)`` clause, and then fails on the ``(``. In Spark
  ``window(...)`` there is the time-window function, the canonical windowed aggregation of its
  documentation. The keyword followed by ``(`` is therefore read as that call; ``WINDOW w AS``
  still starts the clause.
* ``exists(tags, x -> x = 'b')``: Spark's higher-order function over an array. sqlglot builds it
  as ``exp.Exists``, the node of ``EXISTS (subquery)``, which the planner would take for a
  subquery to maintain; with an array and a lambda it is read as the plain function it is.
* ``percentile_cont(0.5) WITHIN GROUP (ORDER BY price DESC)`` (and ``percentile_disc``): sqlglot
  writes ``PERCENTILE_APPROX(price, 0.5)`` for Spark 2, an approximation that also drops DESC.
* ``to_char(x, '999.99')``: sqlglot writes ``CAST(x AS STRING)``, dropping the format.
* ``max_by(x, y, 3)`` / ``min_by``: sqlglot drops the count, which turns an array into one value.
* ``to_date(s, 'yyyy-MM-dd')``: sqlglot drops the default format, and the call becomes a cast,
  which also takes other shapes of string (a time after the date) where the format refuses them.
* ``'customer''s'``: Spark 4 reads a doubled quote inside a string as one quote, as the SQL
  standard does (``"a""b"`` too); sqlglot's Spark reads two adjacent literals and joins them, so a
  plan would say ``customers``. (Literals apart, ``'a' 'b'``, are still joined, as in Spark.)
* ``payload:page.views[0]::int``: Spark 4's path into a VARIANT (``parse_json(s):a.b``), which
  sqlglot's Spark refuses as a syntax error. It is read as sqlglot's Databricks reads it (a
  ``JSONExtract`` marked ``variant_extract``) and written back as the path it was, keys' case kept.
* ``parse_json(s)``: sqlglot's Spark drops the call (Spark 2 had no VARIANT), so a plan read the
  string; ``CAST(parse_json(s) AS STRUCT<...>)`` became ``from_json``. Both are written as they were.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ErrorLevel
from sqlglot.generator import Generator
from sqlglot.tokens import TokenType

from epochal.sql import SPARK_RESERVED


def _exists(args: list[exp.Expression]) -> exp.Expression:
    """``exists(array, lambda)`` as a plain function; anything else as sqlglot builds it."""
    if len(args) == 2 and isinstance(args[1], exp.Lambda):
        return exp.Anonymous(this="exists", expressions=args)
    return exp.Exists.from_arg_list(args)


def _to_char(generator: Generator, node: exp.ToChar) -> str:
    fmt = node.args.get("format")
    return generator.func("TO_CHAR", node.this, fmt) if fmt is not None else generator.tochar_sql(node)


def _by(name: str):  # noqa: ANN202 - a sqlglot transform
    def sql(generator: Generator, node: exp.ArgMax | exp.ArgMin) -> str:
        return generator.func(name, node.this, node.expression, node.args.get("count"))

    return sql


def _is_variant_path(node: exp.Expression | None) -> bool:
    return isinstance(node, exp.JSONExtract) and bool(node.args.get("variant_extract"))


def _variant_path(generator: Generator, node: exp.JSONExtract) -> str:
    if _is_variant_path(node):
        return f"{generator.sql(node, 'this')}:{generator.sql(node, 'expression')}"
    return Spark.Generator.TRANSFORMS[exp.JSONExtract](generator, node)


def _path_root(generator: Generator, node: exp.JSONPathRoot) -> str:
    # (a variant path starts at the column: v:a.b, where a JSON path string says $.a.b)
    if _is_variant_path(node.parent and node.parent.parent):
        return ""
    return Spark.Generator.TRANSFORMS[exp.JSONPathRoot](generator, node)


def _to_date(generator: Generator, node: exp.TsOrDsToDate) -> str:
    if node.args.get("format") is None:  # (also the conversions sqlglot adds itself: written as before)
        return Spark.Generator.TRANSFORMS[exp.TsOrDsToDate](generator, node)
    return generator.func("TO_DATE", node.this, generator.format_time(node))


class EpochalSpark(Spark):
    """sqlglot's Spark dialect, with the extensions the module lists."""

    class Tokenizer(Spark.Tokenizer):
        # A quote doubled inside a string of its own quote is one quote. sqlglot takes the string's
        # own delimiter, doubled, as that escape; the other quote doubled is read the same way only
        # in a string that also has its own doubled, or a backslash (``'a""b''c'``), which Spark
        # reads as ``a""b'c``: rare enough to leave to sqlglot's one set of escapes.
        STRING_ESCAPES = [*Spark.Tokenizer.STRING_ESCAPES, "'", '"']

    class Parser(Spark.Parser):
        FUNCTIONS = {**Spark.Parser.FUNCTIONS, "EXISTS": _exists}
        # v:a.b[0]::int, one extraction per colon (as Spark: v:a:b extracts twice)
        COLON_IS_VARIANT_EXTRACT = True
        COLON_CHAIN_IS_SINGLE_EXTRACT = False
        _MODIFIERS = frozenset(Spark.Parser.QUERY_MODIFIER_TOKENS)
        _MODIFIERS_BUT_WINDOW = _MODIFIERS - {TokenType.WINDOW}

        # sqlglot consults this set only where a GROUP BY list may end (Parser._parse_group): a
        # token in it ends the list. WINDOW followed by "(" is Spark's window() function instead.
        @property  # type: ignore[override]
        def QUERY_MODIFIER_TOKENS(self) -> frozenset[TokenType]:  # noqa: N802 - sqlglot's name
            if self._curr is not None and self._curr.token_type == TokenType.WINDOW:
                following = self._next
                if following is not None and following.token_type == TokenType.L_PAREN:
                    return self._MODIFIERS_BUT_WINDOW
            return self._MODIFIERS

    class Generator(Spark.Generator):
        # Quoted wherever they are written as a name (sqlglot's Spark quotes none): a column
        # called `select`, `from` or `order` is ordinary in JSON records (``SPARK_RESERVED``).
        RESERVED_KEYWORDS = SPARK_RESERVED

        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - sqlglot's arguments
            # A call sqlglot cannot write for Spark is an error, not a warning beside SQL that
            # means something else (the probe's to_char and max_by were such warnings).
            kwargs.setdefault("unsupported_level", ErrorLevel.RAISE)
            super().__init__(*args, **kwargs)

        TRANSFORMS = {
            # (without an entry, WITHIN GROUP is written as parsed)
            **{k: v for k, v in Spark.Generator.TRANSFORMS.items() if k is not exp.WithinGroup},
            exp.ToChar: _to_char,
            exp.ArgMax: _by("MAX_BY"),
            exp.ArgMin: _by("MIN_BY"),
            exp.TsOrDsToDate: _to_date,
            exp.JSONExtract: _variant_path,
            exp.JSONPathRoot: _path_root,
        }

        # (sqlglot's Spark drops parse_json(s), leaving the string: a VARIANT is Spark 4's)
        PARSE_JSON_NAME = "PARSE_JSON"

        def cast_sql(self, expression: exp.Cast, safe_prefix: str | None = None) -> str:
            # sqlglot's Spark turns CAST(parse_json(s) AS STRUCT<...>) into from_json(s, ...), which
            # gives NULL where Spark 4's cast of a VARIANT fails: written as it was
            if isinstance(expression.this, exp.ParseJSON):
                return Generator.cast_sql(self, expression, safe_prefix=safe_prefix)
            return super().cast_sql(expression, safe_prefix=safe_prefix)

        def jsonpath_sql(self, expression: exp.JSONPath) -> str:
            if _is_variant_path(expression.parent):  # a path, not a string: v:a.b, not v:'a.b'
                return self.expressions(expression, sep="", flat=True).lstrip(".")
            return super().jsonpath_sql(expression)



#: The dialect every parse and generation of Epochal uses (an instance: sqlglot builds one per
#: call when given a class or a name).
DIALECT = EpochalSpark()
