"""Spark SQL as Epochal reads it: sqlglot's Spark dialect, extended where it refuses what Spark accepts.

Every query Epochal parses (a view as written, a plan it generated, a query it binds to frames)
goes through :data:`DIALECT`, so an extension here holds everywhere. Generation is Spark's, unchanged.

* ``GROUP BY window(date_time, '10 seconds')``: sqlglot stops a GROUP BY at the WINDOW keyword,
  taking it for the start of a ``WINDOW w AS (...)`` clause, and then fails on the ``(``. In Spark
  ``window(...)`` there is the time-window function, the canonical windowed aggregation of its
  documentation. The keyword followed by ``(`` is therefore read as that call; ``WINDOW w AS``
  still starts the clause.
* ``exists(tags, x -> x = 'b')``: Spark's higher-order function over an array. sqlglot builds it
  as ``exp.Exists``, the node of ``EXISTS (subquery)``, which the planner would take for a
  subquery to maintain; with an array and a lambda it is read as the plain function it is.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import TokenType


def _exists(args: list[exp.Expression]) -> exp.Expression:
    """``exists(array, lambda)`` as a plain function; anything else as sqlglot builds it."""
    if len(args) == 2 and isinstance(args[1], exp.Lambda):
        return exp.Anonymous(this="exists", expressions=args)
    return exp.Exists.from_arg_list(args)


class EpochalSpark(Spark):
    """sqlglot's Spark dialect, with the extensions the module lists."""

    class Parser(Spark.Parser):
        FUNCTIONS = {**Spark.Parser.FUNCTIONS, "EXISTS": _exists}
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


#: The dialect every parse and generation of Epochal uses (an instance: sqlglot builds one per
#: call when given a class or a name).
DIALECT = EpochalSpark()
