"""What the driver's source and view steps share: where the state is, the tables' schemas, the
largest change they take, a table's state before an epoch at a few keys, and the rule that a step
the driver cannot finish goes to Spark with nothing written."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from epochal.driver.tables import NotOnDriver, state_at

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from epochal.storage.parts import StateCatalog
    from epochal.storage.warehouse import Warehouse

log = logging.getLogger("epochal.driver")

T = TypeVar("T")


class DriverEngine:
    def __init__(
        self,
        warehouse: Warehouse,
        catalog: StateCatalog,
        query_schema: Callable[[str], StructType],
        max_rows: int,
    ):
        self.warehouse = warehouse
        self.catalog = catalog
        self.query_schema = query_schema
        #: the most rows of change (records of a source, input rows of a view) a step takes here; 0: never
        self.max_rows = max_rows
        #: steps computed here, and ones handed to Spark (shown by benchmarks and step reports)
        self.answered = 0
        self.declined = 0
        #: why the driver left a step to Spark, by (step, epoch), until the Spark step reports it
        #: (steps run on threads: each reads its own entry)
        self._why: dict[tuple[str, int], str] = {}

    def decline(self, step: str, epoch: int, reason: str) -> None:
        """Leave ``step`` to Spark for ``reason``, which the step's report and the log then give."""
        self.declined += 1
        self._why[(step, epoch)] = reason
        log.info("%s epoch %s: runs on Spark, the driver path declined: %s", step, epoch, reason)

    def declined_because(self, step: str, epoch: int) -> str | None:
        """Why the driver declined ``step`` of ``epoch`` (once: the entry is dropped), or None."""
        return self._why.pop((step, epoch), None)

    def too_big(self, rows: int, what: str) -> str | None:
        """Why a change of ``rows`` is not taken here at all, or None when it may be."""
        if self.max_rows <= 0:
            return "the driver path is off (EPOCHAL_DRIVER_ROWS = 0)"
        if rows > self.max_rows:
            return f"{rows} {what}, more than EPOCHAL_DRIVER_ROWS ({self.max_rows})"
        if not self.warehouse.is_local:
            return "the warehouse is not on the local disk (the driver path reads local files only)"
        return None

    def state_before(
        self,
        con: duckdb.DuckDBPyConnection,
        table: str,
        epoch: int,
        schema: StructType,
        restrict: tuple[Sequence[str], pa.Table] | None,
    ) -> tuple[pa.Table, int]:
        """``table``'s rows before ``epoch`` (restricted to the keys of ``restrict``), and the
        stored rows read for them."""
        parts = self.catalog.state_parts(table, epoch, inclusive=False)
        return state_at(con, self.warehouse, parts, schema, restrict)

    def attempt(self, step: str, epoch: int, spark_does: str, compute: Callable[[], T]) -> T | None:
        """``compute()``, or None when Spark must do the step (``spark_does``: "reads it",
        "computes it"). Nothing is written before ``compute`` returns, so giving up is free."""
        import duckdb

        try:
            result = compute()
        except NotOnDriver as why:
            self.decline(step, epoch, str(why))
            return None
        except duckdb.Error as error:  # Spark does it, and raises its own error if it has one
            self.decline(step, epoch, f"DuckDB stopped ({error}); Spark {spark_does}")
            return None
        except Exception as error:  # a fault of the driver path's own: nothing was written
            log.warning("%s epoch %s: the driver path failed; Spark %s", step, epoch, spark_does, exc_info=True)
            self.decline(step, epoch, f"the driver path failed ({type(error).__name__}: {error}); Spark {spark_does}")
            return None
        self.answered += 1
        return result
