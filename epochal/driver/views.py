"""A view's epoch computed on the driver, when its inputs changed little: the change files read as
Arrow, the view's SQL run by DuckDB (``duck_sql``: Spark's result or an error, never another
value), a partial aggregate's groups merged in Python (``partial``), the change written as Spark
writes it (``tables``). No Spark job, no query plan, no Py4J: the fixed cost of a Spark step
(about 0.3 s a query, 16-24 jobs an epoch) is what a small change costs today (issue 17).

Whatever the driver cannot compute exactly is Spark's: a plan other than a linear view, a partial
aggregate or an inner join of whole tables (``joins``), a type or construct outside what
``duck_sql`` and ``partial`` verify, a change of more than ``max_rows`` rows, state on an object
store, a group that must be rebuilt from its input, an error from DuckDB (Spark then raises it
with its own message, or computes what DuckDB refused).
Such a step raises ``NotOnDriver`` inside this module and runs on Spark, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from epochal.checkpoint.records import Collected
from epochal.driver.duck_sql import duckdb_sql
from epochal.driver.engine import DriverEngine
from epochal.driver.joins import delta_join_on_driver
from epochal.driver.partial import partial_change_on_driver
from epochal.driver.tables import (
    NotOnDriver,
    arrow_schema,
    conformed,
    connect,
    netted,
    read_change,
    semi_joined,
    with_weight,
    write_change,
)
from epochal.incremental.plan import PARTIAL_RULE, Plan
from epochal.storage.warehouse import WEIGHT, Warehouse

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql.types import StructType

    from epochal.pipeline.model import ViewDef


@dataclass
class DriverChange:
    """A view's change for an epoch, computed on the driver, ready to be written."""

    rows: pa.Table
    schema: StructType
    state_rows_read: int
    warehouse: Warehouse

    def write(self, location: str) -> int:
        return write_change(self.warehouse, self.rows, self.schema, location)


class DriverViews(DriverEngine):
    def takes(self, view: ViewDef, rows_in: int, epoch: int | None = None) -> bool:
        """Whether to try ``view``'s step here at all (cheap: no file is opened). With ``epoch``, a
        step not taken is declined with its reason (:meth:`declined_because`)."""
        why = self.too_big(rows_in, "rows of change in")
        if why is None and view.refresh == "full":
            why = "refresh = 'full' recomputes the whole view, which Spark does"
        if why is None and not (
            view.plan is None or view.plan.kind == "linear" or view.plan.rule in (PARTIAL_RULE, "delta join")
        ):
            why = f"its plan ({view.plan.rule}) is not one the driver computes"
        if why is not None and epoch is not None:
            self.decline(f"view {view.name}", epoch, why)
        return why is None

    def change(
        self, epoch: int, view: ViewDef, stored: StructType, collected: Mapping[str, Collected]
    ) -> DriverChange | None:
        """``view``'s change for ``epoch`` (``stored``: its schema as written, the query's columns
        as the query types them), or None when Spark must compute it."""

        def compute() -> DriverChange:
            with connect() as con:
                deltas = {u: self._delta(u, collected) for u in view.upstreams}
                if view.plan is not None and view.plan.rule == "delta join":
                    return self._delta_join(con, epoch, view, view.plan, stored, deltas)
                if view.plan is not None and view.plan.kind == "keyed":
                    return self._partial(con, epoch, view, view.plan, stored, deltas)
                return self._linear(con, view, stored, deltas)

        return self.attempt(f"view {view.name}", epoch, "computes it", compute)

    def _delta(self, upstream: str, collected: Mapping[str, Collected]) -> pa.Table:
        schema = self.query_schema(upstream)
        entry = collected.get(upstream)
        if entry is None:
            raise NotOnDriver(f"{upstream} has not written the epoch")  # Spark names it
        if entry.location is None:
            if entry.rows_out == 0:  # an idle epoch: no file, no change
                return arrow_schema(with_weight(schema)).empty_table()
            raise NotOnDriver(f"{upstream}'s change is read again from its connector")
        return read_change(self.warehouse, entry.location, schema)

    def _signed_query(
        self, con: duckdb.DuckDBPyConnection, query: str, deltas: Mapping[str, pa.Table], sign: int
    ) -> pa.Table:
        """``query`` (Spark SQL over the upstreams) run by DuckDB over the inserted (sign 1) or
        deleted (-1) rows of each delta: a linear query over a change is the query over each."""
        inputs = {name: self.query_schema(name) for name in deltas}
        translated = duckdb_sql(query, inputs)
        for name, delta in deltas.items():
            keep = pc.greater(delta[WEIGHT], 0) if sign > 0 else pc.less(delta[WEIGHT], 0)
            con.register(name, delta.filter(keep).drop_columns([WEIGHT]))
        try:
            return con.sql(translated).to_arrow_table()
        finally:
            for name in deltas:
                con.unregister(name)

    def _linear(
        self, con: duckdb.DuckDBPyConnection, view: ViewDef, stored: StructType, deltas: Mapping[str, pa.Table]
    ) -> DriverChange:
        # When the planner split the view, its query reads the stages instead of the text as written.
        query = view.plan.query if view.plan is not None and view.plan.query else view.query
        parts = []
        for sign in (1, -1):
            out = self._signed_query(con, query, deltas, sign)
            if out.num_columns != len(view.columns):
                raise NotOnDriver(f"the query gave {out.num_columns} columns for {len(view.columns)}")
            # columns by position, named as the view names them (Spark's toDF)
            out = conformed(out.rename_columns(list(view.columns)), stored)
            parts.append(out.append_column(WEIGHT, pa.array([sign] * out.num_rows, pa.int64())))
        return DriverChange(pa.concat_tables(parts), stored, 0, self.warehouse)

    def _partial(
        self,
        con: duckdb.DuckDBPyConnection,
        epoch: int,
        view: ViewDef,
        plan: Plan,
        stored: StructType,
        deltas: Mapping[str, pa.Table],
    ) -> DriverChange:
        from pyspark.sql.types import ArrayType, StructField, StructType

        spec = plan.aggregate
        if spec is None or len(plan.leaves) != 1:
            raise NotOnDriver("not a partial aggregate over one input")
        typed = {f.name: f.dataType for f in stored.fields}
        hidden = [StructField(c.cache, ArrayType(typed[c.name])) for c in spec.columns if c.cache]
        table = StructType([*stored.fields, *hidden])
        rows_sql = _inlined(spec.rows_sql, plan.leaves[0].name, plan.leaves[0].sql)
        signed = []
        for sign in (1, -1):
            out = self._signed_query(con, rows_sql, deltas, sign)
            signed.append(out.append_column(WEIGHT, pa.array([sign] * out.num_rows, pa.int64())))
        rows = pa.concat_tables(signed, promote_options="permissive")
        for group in spec.groups:
            if pa.types.is_floating(rows.schema.field(group).type):
                # Spark stores such a key normalized (-0.0 as 0.0, one NaN): not reproduced here
                raise NotOnDriver("a floating-point group key is grouped by Spark")

        def read_groups(columns, keys):
            return self.state_before(con, view.name, epoch, table, None if keys is None else (columns, keys))

        def read_input(groups: pa.Table) -> tuple[pa.Table, int]:
            """The aggregate's input rows of ``groups`` after the epoch, read at their keys."""
            leaf = plan.leaves[0]
            if leaf.table is None or not spec.groups:
                raise NotOnDriver("a group is rebuilt from its whole input, which Spark reads")
            restrict: dict[str, pa.ChunkedArray] = {}
            for expr, group in zip(leaf.key, spec.key_groups, strict=True):
                restrict.setdefault(expr.strip("`"), groups[group])
            columns, keys = list(restrict), pa.table(restrict)
            schema = self.query_schema(leaf.table)
            before, read = self.state_before(con, leaf.table, epoch, schema, (columns, keys))
            after = netted(
                con, before, semi_joined(con, conformed(deltas[leaf.table], with_weight(schema)), (columns, keys))
            )
            weighted = after.append_column(WEIGHT, pa.array([1] * after.num_rows, pa.int64()))
            return self._signed_query(con, rows_sql, {leaf.table: weighted}, 1), read

        change, read = partial_change_on_driver(con, spec, rows, read_groups, table, read_input)
        return DriverChange(change, table, read, self.warehouse)

    def _delta_join(
        self,
        con: duckdb.DuckDBPyConnection,
        epoch: int,
        view: ViewDef,
        plan: Plan,
        stored: StructType,
        deltas: Mapping[str, pa.Table],
    ) -> DriverChange:
        def state_before(table, restrict):
            return self.state_before(con, table, epoch, self.query_schema(table), restrict)

        change, read = delta_join_on_driver(con, plan, view.columns, stored, deltas, self.query_schema, state_before)
        return DriverChange(change, stored, read, self.warehouse)


def _inlined(query: str, name: str, sql: str) -> str:
    """``query`` with its reads of ``name`` replaced by the subquery ``sql`` (a leaf: the rows the
    aggregate takes, as SQL over the upstream tables), so that one query reads the upstreams."""
    import sqlglot
    from sqlglot import exp

    from epochal.pipeline.dialect import DIALECT

    tree = sqlglot.parse_one(query, read=DIALECT)
    leaf = sqlglot.parse_one(sql, read=DIALECT)
    for table in list(tree.find_all(exp.Table)):
        if table.name.lower() == name.lower() and not table.args.get("db"):
            alias = table.alias or name
            table.replace(exp.Subquery(this=leaf.copy(), alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return tree.sql(dialect=DIALECT)
