"""The columns and types of a pipeline's tables as their queries give them: Spark analyses a
view's query over empty inputs of its upstreams' schemas (no job runs), a source's from its DDL.
Remembered per runtime; a view being rebuilt is typed by its old statement while that is
maintained (:mod:`epochal.runtime.rebuild_step`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from epochal.incremental.binding import sql_over, tables_read
from epochal.sql import quote

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from epochal.pipeline.model import ViewDef
    from epochal.runtime.context import StepContext


class QuerySchemas:
    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self._tables: dict[str, StructType] = {}
        self._statements: dict[tuple[str, str, tuple[str, ...]], StructType] = {}
        #: old statements maintained while their views rebuild, and their stages, by name
        self.old_versions: dict[str, ViewDef] = {}
        self._analysed: dict[str, StructType] | None = None

    def _recorded(self) -> dict[str, StructType]:
        """The schemas the load-time analysis recorded for this very pipeline in the home
        (``analysis.analysed_schemas``): typing a table then starts no Spark, which a run whose
        steps all run on the driver never needs otherwise."""
        if self._analysed is None:
            from pyspark.sql.types import StructType

            from epochal.incremental.analysis import analysed_schemas, fingerprint

            recorded = analysed_schemas(self.ctx.settings.home, fingerprint(self.ctx.pipeline)) or {}
            self._analysed = {t: StructType.fromJson(json.loads(text)) for t, text in recorded.items()}
        return self._analysed

    def query_schema(self, table: str) -> StructType:
        """``table``'s columns and types as its query, as written, gives them."""
        old = self.old_versions.get(table)
        if old is not None:  # a view being rebuilt: its rows are still its old statement's
            return self.view_schema(old)
        if table in self._tables:
            return self._tables[table]
        recorded = self._recorded().get(table)
        if recorded is not None:
            self._tables[table] = recorded
            return recorded
        pipeline = self.ctx.pipeline
        if table in pipeline.sources:
            ddl = ", ".join(f"{quote(c.name)} {c.type}" for c in pipeline.sources[table].columns)
            schema = self.ctx.spark.createDataFrame([], ddl).schema
        else:
            schema = self.view_schema(pipeline.views[table])
        self._tables[table] = schema
        return schema

    def view_schema(self, view: ViewDef) -> StructType:
        """The columns and types of ``view``'s query as written, which may be a statement other
        than the pipeline's (the old statement of a view being rebuilt). A view the planner split
        reads its stages, but its query as written reads their inputs. Remembered per statement."""
        remembered = (view.name, view.query, view.columns)
        if remembered in self._statements:
            return self._statements[remembered]
        if self.ctx.pipeline.views.get(view.name) is view and view.name in self._recorded():
            return self._recorded()[view.name]
        pipeline, spark = self.ctx.pipeline, self.ctx.spark
        # (an old statement's stage reads the old version of the stage before it, by that name)
        known = [*pipeline.sources, *pipeline.views, *self.old_versions]
        inputs = {t: spark.createDataFrame([], self.query_schema(t)) for t in tables_read(view.query, known)}
        schema = sql_over(spark, view.query, inputs).toDF(*view.columns).schema
        self._statements[remembered] = schema
        return schema
