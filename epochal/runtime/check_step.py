"""Evaluating the pipeline's checks (``CREATE CHECK``, docs/checks.md) at a committed epoch, and
what they hold back from a sink.

A check's query (Spark SQL) runs in DuckDB over its table's committed state at the epoch, the cut
`epochal query --as-of` reads (:mod:`epochal.query.cut`). Each result is recorded once in the meta
store (:mod:`epochal.checkpoint.checks`): the commit step evaluates the epochs it commits, and a
sink's step evaluates any epoch it is about to deliver that has no result yet (a run killed after
its commit), so a sink never delivers an epoch no check has looked at.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint.checks import SAMPLE_ROWS, CheckResult
from epochal.checkpoint.records import StateCompacted
from epochal.errors import EpochalError

if TYPE_CHECKING:
    import duckdb

    from epochal.pipeline.checks import CheckDef
    from epochal.runtime.context import StepContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hold:
    """What a sink may deliver of the epochs it lacks."""

    #: the newest of them every check holding the sink passed (or was released) at; None: none did
    deliver_upto: int | None
    #: the epochs a check holds (failed, not released): no batch may end at one
    held: frozenset[int]
    #: the first failing result after ``deliver_upto``: what holds the sink now (None: nothing)
    holding: CheckResult | None

    def shown(self) -> str | None:
        if self.holding is None:
            return None
        r = self.holding
        return f"held by check {r.check} (epoch {r.epoch}: {r.failed_rows} offending row(s) in {r.table})"


class CheckSteps:
    def __init__(self, ctx: StepContext):
        self.ctx = ctx

    def evaluate(self, check: CheckDef, epoch: int) -> CheckResult:
        """``check``'s result at committed ``epoch``: the recorded one, or evaluated now and recorded."""
        kept = self.ctx.controller.check_result(check.name, epoch)
        if kept is not None:
            return kept
        if any(self._unproven(check, t, epoch) for t in (check.table, *check.also_reads)):
            # a view still backfilling holds part of its rows (its sinks wait for the join anyway), one
            # being rebuilt the rows of its old statement: no verdict, and none recorded, until they are whole
            return CheckResult(check.name, epoch, check.table, check.severity, True, 0, [], time.time())
        started = time.time()
        count, sample = self._row_count(check, epoch) if check.row_count else self._offending(check, epoch)
        result = self.ctx.controller.record_check(
            CheckResult(
                check=check.name,
                epoch=epoch,
                table=check.table,
                severity=check.severity,
                passed=count == 0,
                failed_rows=count,
                sample=sample,
                evaluated_at=time.time(),
            )
        )
        level = logging.INFO if result.passed else logging.WARNING
        log.log(
            level,
            "check %s (%s) on %s at epoch %d: %s in %.2fs",
            check.name,
            check.severity,
            check.table,
            epoch,
            "passed" if result.passed else f"FAILED, {result.failed_rows} offending row(s)",
            time.time() - started,
        )
        return result

    def evaluate_epoch(self, epoch: int) -> list[CheckResult]:
        """Every check of the pipeline at committed ``epoch``."""
        return [self.evaluate(check, epoch) for check in self.ctx.pipeline.checks.values()]

    def hold(self, sink: str, epochs: list[int]) -> Hold:
        """What the ``error`` checks upstream of ``sink`` let it deliver of ``epochs`` (committed,
        ascending): decided from the recorded results only."""
        checks = self.ctx.pipeline.checks_holding(sink)
        if not checks or not epochs:
            return Hold(epochs[-1] if epochs else None, frozenset(), None)
        held: set[int] = set()
        first_failing: dict[int, CheckResult] = {}
        passed_upto: int | None = None
        for epoch in epochs:
            failing = [r for r in (self.evaluate(c, epoch) for c in checks) if r.holds]
            if failing:
                held.add(epoch)
                first_failing[epoch] = failing[0]
            else:
                passed_upto = epoch
        holding = next(
            (first_failing[e] for e in sorted(held) if passed_upto is None or e > passed_upto), None
        )
        return Hold(passed_upto, frozenset(held), holding)

    def _row_count(self, check: CheckDef, epoch: int) -> tuple[int, list[dict]]:
        """A built-in row-count check from the stored counts: a table's rows at an epoch are its
        snapshot's recorded rows plus the sum of the weights of the change files after it."""
        try:
            view, table = self._count(check.table, epoch), self._count(check.also_reads[0], epoch)
        except StateCompacted:  # (an epoch older than retention keeps: nothing to count, nothing proven)
            return 0, []
        wrong = view != table if check.row_count == "equal" else view > table
        if check.row_count == "at_most_some" and table > 0 and view == 0:
            wrong = True
        return (1, [{"view_rows": view, "input_rows": table}]) if wrong else (0, [])

    def _count(self, table: str, epoch: int) -> int:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from epochal.storage.warehouse import WEIGHT

        parts = self.ctx.controller.state_parts(table, epoch, inclusive=True)
        count = parts.snapshot.rows if parts.snapshot is not None and parts.snapshot.rows else 0
        warehouse = self.ctx.warehouse
        for _, location in parts.changes:
            for path in warehouse.parquet_files(location):
                # only the weight column of each change file (pyarrow: no DuckDB connection to open)
                weights = pq.read_table(warehouse.file_path(path), columns=[WEIGHT], filesystem=warehouse.fs)
                count += int(pc.sum(weights.column(WEIGHT)).as_py() or 0)
        return count

    def _unproven(self, check: CheckDef, table: str, epoch: int) -> bool:
        controller = self.ctx.controller
        backfill = controller.backfill(table)
        if backfill is not None and backfill.phase.active:
            return True
        rebuild = controller.rebuild(table) if check.builtin and table in self.ctx.pipeline.views else None
        return rebuild is not None and (
            rebuild.state.active or rebuild.switched_epoch is None or epoch < rebuild.switched_epoch
        )

    def _offending(self, check: CheckDef, epoch: int) -> tuple[int, list[dict]]:
        """How many rows ``check``'s query returns at ``epoch``, and the first SAMPLE_ROWS of them."""
        import duckdb
        import sqlglot

        from epochal.pipeline.dialect import DIALECT

        sql = sqlglot.transpile(check.query, read=DIALECT, write="duckdb")[0]
        con = duckdb.connect()
        try:
            for table in (check.table, *check.also_reads):
                self._table_view(con, table, epoch)
            count = int(con.execute(f"SELECT count(*) FROM ({sql}) AS offending").fetchone()[0])
            result = con.execute(f"SELECT * FROM ({sql}) AS offending LIMIT {SAMPLE_ROWS}")
            columns = [d[0] for d in result.description]
            sample = [dict(zip(columns, row, strict=True)) for row in result.fetchall()]
        except duckdb.Error as error:
            # A Spark function DuckDB has no counterpart of (soundex, find_in_set): the loader took
            # the query as Spark SQL, so Spark runs it.
            return self._offending_on_spark(check, epoch, str(error).splitlines()[0])
        finally:
            con.close()
        return count, sample

    def _offending_on_spark(self, check: CheckDef, epoch: int, duckdb_error: str) -> tuple[int, list[dict]]:
        """``_offending`` on Spark, over each table's committed rows at ``epoch`` as a temporary
        view of a name of its own (steps on threads share the session's views)."""
        import uuid

        import sqlglot
        from sqlglot import exp

        from epochal.pipeline.dialect import DIALECT

        spark = self.ctx.spark
        views: dict[str, str] = {}
        try:
            for table in (check.table, *check.also_reads):
                rows, _ = self.ctx.read_state(table, epoch, inclusive=True)
                views[table.lower()] = f"__epochal_check_{uuid.uuid4().hex[:12]}"
                rows.createOrReplaceTempView(views[table.lower()])
            query = sqlglot.parse_one(check.query, read=DIALECT)
            for table in query.find_all(exp.Table):
                if table.name.lower() in views and not table.db:
                    if not table.alias:  # (columns qualified by the table's name still resolve)
                        table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
                    table.set("this", exp.to_identifier(views[table.name.lower()]))
            offending = spark.sql(query.sql(dialect=DIALECT))
            count = offending.count()
            sample = [row.asDict(recursive=True) for row in offending.limit(SAMPLE_ROWS).collect()]
        except Exception as error:  # noqa: BLE001 (Spark's errors have no common base on both APIs)
            raise EpochalError(
                f"check {check.name} ({check.location}): its query failed at epoch {epoch}, in DuckDB "
                f"({duckdb_error}) and in Spark ({str(error).strip().splitlines()[0]}); fix the query "
                f"(it runs over {check.table}'s committed rows)"
            ) from None
        finally:
            for view in views.values():
                spark.catalog.dropTempView(view)
        return count, sample

    def _table_view(self, con: duckdb.DuckDBPyConnection, table: str, epoch: int) -> None:
        """View ``table``: its committed rows at ``epoch``, as `epochal query --as-of` reads them
        (epochal/query/cut.py): the newest snapshot at the epoch plus the change files after it,
        netted by weight. A SOURCE that stores nothing is read from its connector, through Spark."""
        from epochal.sql import DUCKDB, duckdb_parquet, quote
        from epochal.storage.warehouse import WEIGHT

        ctx = self.ctx
        pipeline = ctx.pipeline
        names = pipeline.sources[table].column_names if table in pipeline.sources else pipeline.views[table].columns
        cols = ", ".join(quote(n, DUCKDB) for n in names)
        view = quote(table, DUCKDB)
        try:
            parts = ctx.controller.state_parts(table, epoch, inclusive=True)
        except StateCompacted:
            rows, _ = ctx.read_state(table, epoch, inclusive=True)
            con.register(f"__epochal_rows_{table}", rows.toArrow())
            con.execute(f"CREATE VIEW {view} AS SELECT {cols} FROM {quote(f'__epochal_rows_{table}', DUCKDB)}")
            return
        snapshot = [] if parts.snapshot is None else ctx.warehouse.snapshot_files(parts.snapshot.location)
        changes = [f for _, loc in parts.changes for f in ctx.warehouse.parquet_files(loc)]
        if not snapshot and not changes:
            # nothing committed yet: no rows (typed as text; a check's query over it finds none)
            empty = ", ".join(f"NULL::VARCHAR AS {quote(n, DUCKDB)}" for n in names)
            con.execute(f"CREATE VIEW {view} AS SELECT {empty} WHERE false")
            return
        weighted = [f"SELECT {cols}, 1::BIGINT AS {WEIGHT} FROM {duckdb_parquet(snapshot)}"] if snapshot else []
        if changes:
            weighted.append(f"SELECT {cols}, {WEIGHT} FROM {duckdb_parquet(changes)}")
        con.execute(
            f"CREATE VIEW {view} AS WITH net AS (SELECT {cols}, sum({WEIGHT})::BIGINT AS _n "
            f"FROM ({' UNION ALL '.join(weighted)}) GROUP BY ALL HAVING sum({WEIGHT}) > 0) "
            f"SELECT {cols} FROM (SELECT {cols}, unnest(range(_n)) FROM net)"
        )
