"""Every plan a view runs, analysed by Spark over empty inputs before any epoch runs it.

The planner writes SQL with sqlglot, which knows Spark's syntax but not its analyser: a plan can
parse and still be refused by Spark (a time window in a join condition, say), and then the first
epoch finds out, and every epoch after it fails the same way. So before a runtime's first step
touches data, every DataFrame an epoch of each view and internal stage builds is built over empty
frames of its inputs' stored schemas and asked for its schema: the query as written, the linear
query over the inputs' change, the keyed recompute before and after the epoch with its key
restriction, every term of a delta join, the partial aggregate with its rebuild from the input,
and the unit changes written at the end. Spark analyses each one when it is built; no job runs.

A failure is a :class:`PipelineError` located at the view's definition, naming the view, the
internal stage and the part of the plan, raised before any epoch writes anything. A query people
wrote that Spark refuses (a type error sqlglot cannot see) is reported the same way, as theirs to
fix; a generated plan Spark refuses is a planner bug, reported as one.

Analysing costs a little (a few milliseconds to a few tens per query, over Py4J), and a pipeline
runs an epoch per process: so a pipeline that passed leaves a fingerprint in ``EPOCHAL_HOME`` (its
sources, views and plans, the pyspark version and the code that builds the frames), and a runtime
that finds the same fingerprint skips the analysis without starting Spark for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.errors import PipelineError, PipelineIssue
from epochal.incremental.binding import sql_over
from epochal.incremental.plan import PARTIAL_RULE
from epochal.pipeline.model import Pipeline, ViewDef
from epochal.storage.schemas import cast_like
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("epochal.analysis")

#: File in EPOCHAL_HOME holding the fingerprint of the last pipeline whose plans all analysed.
FINGERPRINT_FILE = "analysed_plans"
#: the schemas of the analysed pipeline's tables, beside its fingerprint
SCHEMAS_FILE = "analysed_schemas.json"

QuerySchema = Callable[[str], "StructType"]


@dataclass(frozen=True)
class PlanFailure:
    """A part of a table's epoch that Spark refuses to analyse."""

    #: the view people wrote (the owner of an internal stage)
    view: str
    #: the view or internal stage whose plan failed
    table: str
    #: what failed: "query" (the query as written) or the plan's rule
    part: str
    error: str

    def issue(self, pipeline: Pipeline) -> PipelineIssue:
        location = pipeline.views[self.table].location
        if self.part == VARIANT_PART:
            message = f"view {self.view}: {self.error}"
        elif self.part == "query" and self.table == self.view:
            message = f"view {self.view}: Spark cannot analyse the query: {self.error}; fix the query"
        else:
            what = "its plan" if self.table == self.view else f"the plan of its internal stage {self.table}"
            message = (
                f"view {self.view}: {what} ({self.part}) does not analyse in Spark, so its first epoch would "
                f"fail: {self.error}. This is a bug in Epochal's planner (please report it with the query); "
                "WITH (refresh = 'full') recomputes the view every epoch meanwhile"
            )
        return PipelineIssue(location.file, location.line, message)


def check_pipeline(
    spark: Callable[[], SparkSession],
    pipeline: Pipeline,
    query_schema: QuerySchema | None = None,
    home: Path | None = None,
) -> float | None:
    """Raise :class:`PipelineError` when Spark refuses any plan of ``pipeline``; the seconds the
    analysis took, or None when ``home`` holds the fingerprint of this pipeline already analysed
    (then Spark is not even started: ``spark`` is called only when the analysis runs).
    ``query_schema``: a table's columns and types as its query gives them (the runtime's, which
    it remembers); by default they are analysed here."""
    marker = home / FINGERPRINT_FILE if home is not None else None
    print_ = fingerprint(pipeline)
    if marker is not None and _read(marker) == print_ and home is not None and analysed_schemas(home, print_):
        return None
    started = time.perf_counter()
    session = spark()
    schema_of = query_schema or written_schemas(session, pipeline)
    failures = analyse_pipeline(session, pipeline, schema_of)
    if failures:
        raise PipelineError([failure.issue(pipeline) for failure in failures])
    seconds = time.perf_counter() - started
    log.info("Spark analysed the plans of %d view(s) in %.2fs", len(pipeline.views), seconds)
    if marker is not None and home is not None:
        tables = {t: schema_of(t).json() for t in [*pipeline.sources, *pipeline.view_order()]}
        _write(home / SCHEMAS_FILE, json.dumps({"fingerprint": print_, "tables": tables}))
        _write(marker, print_)
    return seconds


def analysed_schemas(home: Path, print_: str) -> dict[str, str] | None:
    """The tables' schemas (Spark's JSON) the analysis of the pipeline with fingerprint ``print_``
    recorded in ``home``; None when it recorded none, or those of another pipeline. A run whose
    steps all run on the driver then types its tables without starting Spark."""
    text = _read(home / SCHEMAS_FILE)
    try:
        recorded = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(recorded, dict) or recorded.get("fingerprint") != print_:
        return None
    tables = recorded.get("tables")
    return tables if isinstance(tables, dict) else None


def analyse_pipeline(spark: SparkSession, pipeline: Pipeline, query_schema: QuerySchema) -> list[PlanFailure]:
    """Every plan Spark refuses, in dependency order. A table whose input failed is skipped: its
    root cause is reported already."""
    from pyspark.sql.types import ArrayType, StructField, StructType

    stored: dict[str, StructType] = {}
    failures: list[PlanFailure] = []
    for source in pipeline.sources:
        stored[source] = query_schema(source)
    for name in pipeline.view_order():
        view = pipeline.views[name]
        owner = view.internal_of or name
        if not all(u in stored for u in view.upstreams):
            continue
        try:
            declared = query_schema(name)
        except Exception as error:  # noqa: BLE001 - Spark's errors have many types; each is reported
            failures.append(PlanFailure(owner, name, "query", _spark_message(error)))
            continue
        variant = [f.name for f in declared.fields if _holds_variant(f.dataType)]
        if variant:
            failures.append(PlanFailure(owner, name, VARIANT_PART, _variant_refusal(variant)))
            continue
        fields = list(declared.fields)
        if view.plan is not None and view.plan.aggregate is not None:
            # a partial aggregate's table also keeps its MIN/MAX values, in hidden columns
            typed = {f.name: f.dataType for f in declared.fields}
            fields += [StructField(c.cache, ArrayType(typed[c.name])) for c in view.plan.aggregate.columns if c.cache]
        stored[name] = StructType(fields)  # (a partial aggregate reads its own rows)
        try:
            _analyse_view(spark, view, stored, declared)
        except Exception as error:  # noqa: BLE001
            failures.append(PlanFailure(owner, name, _part(view), _spark_message(error)))
            del stored[name]
    return failures


def written_schemas(spark: SparkSession, pipeline: Pipeline) -> QuerySchema:
    """A table's columns and types as written: a source's declared ones, a view's query over empty
    inputs of its upstreams' (as ``EpochRuntime.query_schema`` finds them, without a runtime)."""
    from epochal.incremental.binding import tables_read

    known: dict[str, StructType] = {}

    def schema(table: str) -> StructType:
        if table not in known:
            if table in pipeline.sources:
                ddl = ", ".join(f"`{c.name}` {c.type}" for c in pipeline.sources[table].columns)
                known[table] = spark.createDataFrame([], ddl).schema
            else:
                view = pipeline.views[table]
                names = [*pipeline.sources, *pipeline.views]
                inputs = {t: spark.createDataFrame([], schema(t)) for t in tables_read(view.query, names)}
                known[table] = sql_over(spark, view.query, inputs).toDF(*view.columns).schema
        return known[table]

    return schema


#: the part of a refusal of VARIANT columns (a refusal of the query as written, not a planner bug)
VARIANT_PART = "variant"


def _holds_variant(data_type: object) -> bool:
    """Whether a Spark type is or holds (in a struct, array or map) a VARIANT."""
    from pyspark.sql.types import ArrayType, MapType, StructType, VariantType

    if isinstance(data_type, VariantType):
        return True
    if isinstance(data_type, ArrayType):
        return _holds_variant(data_type.elementType)
    if isinstance(data_type, MapType):
        return _holds_variant(data_type.keyType) or _holds_variant(data_type.valueType)
    if isinstance(data_type, StructType):
        return any(_holds_variant(f.dataType) for f in data_type.fields)
    return False


def _variant_refusal(columns: list[str]) -> str:
    # Every table's changes are netted by grouping on all of its columns (a row is its identity:
    # storage/changes.py, the driver's GROUP BY ALL), and Spark cannot group or compare a VARIANT.
    shown = ", ".join(columns)
    return (
        f"column(s) {shown} hold a VARIANT, which a view cannot store: its changes are netted by comparing "
        "whole rows, and Spark cannot compare or group VARIANT values. Store it as JSON text, "
        "to_json(...) AS v (or CAST(... AS STRING)), and parse_json(v) where it is read"
    )


def _part(view: ViewDef) -> str:
    if view.refresh == "full":
        return "full refresh"
    if view.plan is None or view.plan.kind == "linear":
        return "linear"
    return "keyed recompute" if view.plan.rule == "recompute" else view.plan.rule


def _analyse_view(spark: SparkSession, view: ViewDef, stored: Mapping[str, StructType], declared: StructType) -> None:
    """Build, over empty inputs, every frame an epoch of ``view`` builds, and analyse them."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    from epochal.incremental.keyed import keyed_change
    from epochal.incremental.partial import partial_change
    from epochal.storage.changes import signed_parts, unit_changes

    def empty(schema: StructType) -> DataFrame:
        return spark.createDataFrame([], schema)

    def read_state(table: str, inclusive: bool, restrict: tuple[tuple[str, ...], DataFrame] | None):  # noqa: ANN202
        return _restricted(empty(stored[table]), table, restrict), 0

    deltas = {u: empty(StructType([*stored[u].fields, StructField(WEIGHT, LongType())])) for u in view.upstreams}
    plan = view.plan
    if view.refresh == "full":
        states = {u: empty(stored[u]) for u in view.upstreams}
        weighted = sql_over(spark, view.query, states).toDF(*view.columns).withColumn(WEIGHT, F.lit(1))
    elif plan is None or plan.kind == "linear":
        query = plan.query if plan is not None and plan.query else view.query
        parts = []
        for sign, rows in signed_parts(deltas):
            out = sql_over(spark, query, rows).toDF(*view.columns)
            if plan is not None and plan.typed_like_query:
                out = cast_like(out, declared)
            parts.append(out.withColumn(WEIGHT, F.lit(sign).cast("bigint")))
        weighted = reduce(lambda a, b: a.unionByName(b), parts)
    elif plan.rule == PARTIAL_RULE:
        change = partial_change(spark, plan, view.name, view.columns, deltas, read_state, declared, dry_run=True)
        weighted = change.weighted
    else:
        # every input changed and the view has a past: every term of the delta rule, and both the
        # recompute before and after the epoch
        # (and the retraction of the view's own rows at the keys, restricted as the runtime does)
        weighted = keyed_change(
            spark,
            plan,
            view.columns,
            deltas,
            read_state,
            None,
            first=False,
            dry_run=True,
            stored=lambda restrict: _restricted(empty(declared), view.name, restrict),
            view=view.name,
        ).weighted
    unit_changes(weighted).schema  # noqa: B018 - asking for the schema is what analyses the plan


def _restricted(rows: DataFrame, table: str, restrict: tuple[tuple[str, ...], DataFrame] | None) -> DataFrame:
    """``rows`` restricted as the runtime restricts a table's state (a left-semi join with the
    keys, cast to the table's types): the restriction's columns must be the table's."""
    from pyspark.sql import functions as F

    if restrict is None:
        return rows
    columns, keys = restrict
    unknown = [c for c in columns if c not in rows.columns]
    if not columns or unknown:
        raise ValueError(f"the plan restricts {table} by columns it does not have: {unknown or 'none'}")
    types = {f.name: f.dataType for f in rows.schema.fields}
    names = [f"__epochal_key_{i}" for i in range(len(columns))]
    typed = keys.select(*(F.col(f"`{c}`").cast(types[c]).alias(n) for c, n in zip(columns, names, strict=True)))
    condition = reduce(
        lambda a, b: a & b, [rows[f"`{c}`"].eqNullSafe(typed[n]) for c, n in zip(columns, names, strict=True)]
    )
    return rows.join(F.broadcast(typed), condition, "left_semi")


_ERROR_CLASS = re.compile(r"\[[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*\]")
_JAVA_PREFIX = re.compile(r"^(?::\s*)?(?:[a-z][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error):\s*")


def _spark_message(error: BaseException) -> str:
    """The line of a Spark error that says what is wrong (Py4J errors start with the call that
    failed, then the Java exception), without the stack trace."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    chosen = next((line for line in lines if _ERROR_CLASS.search(line)), lines[0] if lines else type(error).__name__)
    chosen = _JAVA_PREFIX.sub("", chosen)
    chosen = chosen.split(" SQLSTATE:", 1)[0].rstrip(" ;.")
    return chosen if len(chosen) <= 400 else chosen[:397] + "..."


# ---------------------------------------------------------------------------------------- fingerprint


def fingerprint(pipeline: Pipeline) -> str:
    """What the analysis depends on: the sources' columns, every view's query, columns and plan,
    the pyspark version, and the code that builds an epoch's frames."""
    import pyspark

    from epochal.incremental import binding, keyed, partial
    from epochal.storage import changes

    digest = hashlib.sha256(pyspark.__version__.encode())
    for module in (binding, keyed, partial, changes):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(Path(__file__).read_bytes())
    for source in pipeline.sources.values():
        digest.update(repr((source.name, source.columns, source.primary_key)).encode())
    for name in pipeline.view_order():
        view = pipeline.views[name]
        digest.update(repr((name, view.query, view.upstreams, view.columns, view.refresh, view.plan)).encode())
    return digest.hexdigest()


def _read(marker: Path) -> str | None:
    try:
        return marker.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _write(marker: Path, text: str) -> None:
    """Atomically (a reader never sees half a fingerprint); a home that cannot be written only
    means the next runtime analyses again."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        partial = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        partial.write_text(text + "\n", encoding="utf-8")
        os.replace(partial, marker)
    except OSError as error:
        log.warning("could not record the analysed plans in %s: %s", marker, error)
