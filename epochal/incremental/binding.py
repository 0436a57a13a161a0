"""Running a query whose table names stand for DataFrames, the same way on classic Spark and Spark Connect.

Every view step runs its SQL over frames it built for the epoch (a change, a state at some keys):
the query says ``orders`` and means this epoch's inserted orders. Binding those names as temp
views around ``spark.sql`` works on classic Spark only because it analyses the query when
``spark.sql`` is called. Spark Connect resolves names when the plan runs, after the views were
dropped (TABLE_OR_VIEW_NOT_FOUND) or, worse, rebound to the next frame under the same name (the
deletes read as the inserts, silently). So the frames travel with the query instead: its table
references become placeholders of ``spark.sql(query, **frames)``, which classic Spark binds for
the call and Connect ships inside the plan.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp

from epochal.errors import require
from epochal.pipeline.query_checks import DIALECT, cte_references

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Placeholder i stands for the i-th bound name (sorted). The trailing underscores keep marker 1
#: from being a prefix of marker 10; no query of ours spells such a name otherwise.
_MARKER = "__epochal_bound_{}__"


def sql_over(spark: SparkSession, query: str, tables: Mapping[str, DataFrame]) -> DataFrame:
    """``query`` (Spark SQL) with its references to the names of ``tables`` reading those frames.

    Names are matched as Spark matches temp views (case-insensitively); a reference qualified by a
    database, or to a CTE of the query, is left alone. Columns qualified by a bound table's name
    still resolve: the reference keeps that name as its alias."""
    names = tuple(sorted({name.lower() for name in tables}))
    template, used = _template(query, names)
    if not used:  # spark.sql formats (and un-doubles braces) only when given frames
        planned = _connect_plan(spark, query, {})
        return planned if planned is not None else spark.sql(query)
    frames = {name.lower(): frame for name, frame in tables.items()}
    bound = {_MARKER.format(i): frames[names[i]] for i in used}
    planned = _connect_plan(spark, template, bound)
    return planned if planned is not None else spark.sql(template, **bound)


def _connect_plan(spark: SparkSession, template: str, frames: Mapping[str, DataFrame]) -> DataFrame | None:
    """On Spark Connect, the query as a plan that the server parses when it runs, or None elsewhere.

    Connect's ``spark.sql`` sends the query to the server and, for a query (not a command), gets
    the same plan back: a round trip of 11-24 ms that a view step pays for every query it builds
    (about 40 an epoch of the demo). The plan built here is what that round trip returns; errors
    in it surface when it is analysed (its schema, or the job), as the load-time check does.
    Built from pyspark's own plan classes: if they change, this falls back to ``spark.sql``."""
    if not type(spark).__module__.startswith("pyspark.sql.connect."):  # classic: nothing to save
        return None
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
        from pyspark.sql.connect.plan import SQL, SubqueryAlias
        from pyspark.sql.connect.sql_formatter import SQLStringFormatter

        text, views = template, []
        if frames:
            formatter = SQLStringFormatter(spark)
            text = formatter.format(template, **frames)
            views = [SubqueryAlias(df._plan, name) for df, name in formatter._temp_views]
        return ConnectDataFrame(SQL(text, [], {}, views), spark)
    except (ImportError, AttributeError, TypeError):  # another pyspark's internals
        return None


def tables_read(query: str, names: Iterable[str]) -> tuple[str, ...]:
    """The names among ``names`` (lowercased) that ``query`` reads, as ``sql_over`` would bind them."""
    candidates = tuple(sorted({name.lower() for name in names}))
    return tuple(candidates[i] for i in _template(query, candidates)[1])


@functools.lru_cache(maxsize=512)
def _template(query: str, names: tuple[str, ...]) -> tuple[str, tuple[int, ...]]:
    """The query as a ``str.format`` template with a placeholder per reference to a bound name,
    and the indexes of the names it reads. The text is spliced, not regenerated: a user's query
    runs as written. Cached: a view runs the same few queries every epoch."""
    tree = sqlglot.parse_one(query, read=DIALECT)
    ctes = cte_references(tree)
    spans: list[tuple[int, int, str]] = []
    used: set[int] = set()
    for node in tree.find_all(exp.Table):
        name = node.name.lower()
        if id(node) in ctes or node.args.get("db") or node.args.get("catalog") or name not in names:
            continue
        meta = node.this.meta
        require("start" in meta, "a parsed table reference knows where it is in the text")
        index = names.index(name)
        used.add(index)
        written = query[meta["start"] : meta["end"] + 1]
        placeholder = "{" + _MARKER.format(index) + "}"
        spans.append((meta["start"], meta["end"] + 1, placeholder if node.alias else f"{placeholder} AS {written}"))
    # Literal braces (in a string, say) would read as placeholders: str.format wants them doubled.
    parts, at = [], 0
    for start, end, text in sorted(spans):
        parts.append(_escaped(query[at:start]))
        parts.append(text)
        at = end
    parts.append(_escaped(query[at:]))
    return "".join(parts), tuple(sorted(used))


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")
