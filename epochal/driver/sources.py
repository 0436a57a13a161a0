"""A log source's epoch computed on the driver: its records parsed in Python
(``epochal.connectors.log_driver``: Spark's rows or None), a keyed source's upserts and deletes
resolved against its previous rows, read by DuckDB at the touched keys (``tables.state_at``), the
change written as Spark writes it. The rules are ``epochal.storage.upsert``'s:

- per key only the last record of the epoch counts, in ``(_split, _offset)`` order;
- each previous row of a touched key is retracted, and the last record's row added when it is an
  upsert; an upsert of the row that is already there changes nothing.

Any record Spark would send to the dead letters, a type or size the driver does not take, a float
key (Spark compares NaN and -0.0 otherwise than Python does) or a connector other than the log's
leaves the step to Spark, which writes the dead letters too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from epochal.connectors.base import SplitRange
from epochal.driver.engine import DriverEngine
from epochal.driver.tables import NotOnDriver, arrow_schema, conformed, connect, with_weight
from epochal.sql import DUCKDB, quote
from epochal.storage.upsert import OFFSET_COLUMN, OP_COLUMN, SPLIT_COLUMN, UPSERT
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql.types import StructType

    from epochal.pipeline.model import SourceDef


class DriverSources(DriverEngine):
    def change(self, epoch: int, source: SourceDef, connector: object, ranges: list[SplitRange]) -> pa.Table | None:
        """The source's change for ``epoch`` (its columns and ``_weight``, unit rows), or None when
        Spark must read it."""
        from epochal.connectors.log import LogSource

        step = f"source {source.name}"
        # the connector first: another connector's offsets need not count records (posix_fs: bytes)
        why = None
        if not isinstance(connector, LogSource):
            why = f"the driver path reads log sources only, not {source.connector}"
        why = why or self.too_big(sum(r.count for r in ranges), "records in the epoch")
        if why is not None:
            self.decline(step, epoch, why)
            return None
        from epochal.connectors.log_driver import read_on_driver

        schema = self.query_schema(source.name)

        def compute() -> pa.Table:
            records = read_on_driver(connector, ranges)
            if records is None:
                raise NotOnDriver("a record is not one the driver parses as Spark does")
            if not source.primary_key:
                rows = conformed(records, schema)
                return rows.append_column(WEIGHT, pa.array([1] * rows.num_rows, pa.int64()))
            with connect() as con:
                return self._upserts(con, epoch, source, schema, records)

        return self.attempt(step, epoch, "reads it", compute)

    def _upserts(
        self, con: duckdb.DuckDBPyConnection, epoch: int, source: SourceDef, schema: StructType, records: pa.Table
    ) -> pa.Table:
        key = list(source.primary_key)
        arrow = arrow_schema(schema)
        for k in key:
            if pa.types.is_floating(arrow.field(k).type):
                raise NotOnDriver("a floating-point key is compared by Spark")
        keys_sql = ", ".join(_q(k) for k in key)
        con.register("_records", records)
        try:
            # the last record of each key wins (NULL keys are one key, as Spark's window has them)
            last = con.sql(
                f"SELECT * FROM _records QUALIFY row_number() OVER (PARTITION BY {keys_sql} "
                f"ORDER BY {_q(SPLIT_COLUMN)} DESC, {_q(OFFSET_COLUMN)} DESC) = 1"
            ).to_arrow_table()
        finally:
            con.unregister("_records")
        keys = conformed(last.select(key), _part(schema, key))
        previous, _ = self.state_before(con, source.name, epoch, schema, (key, keys))
        con.register("_last", last)
        con.register("_previous", previous)
        try:
            return conformed(con.sql(_upsert_sql(key, schema.fieldNames())).to_arrow_table(), with_weight(schema))
        finally:
            con.unregister("_last")
            con.unregister("_previous")


def _part(schema: StructType, names: list[str]) -> StructType:
    from pyspark.sql.types import StructType

    return StructType([schema[name] for name in names])


def _q(name: str) -> str:
    return quote(name, DUCKDB)


def _upsert_sql(key: list[str], columns: list[str]) -> str:
    """``epochal.storage.upsert.upsert_changes`` in DuckDB: each previous row of a touched key retracted,
    the last record's row added when it upserts; an upsert of the row already there (equal as
    ``<=>`` has it: NaN to NaN, -0.0 to 0.0, which DuckDB's IS NOT DISTINCT FROM agrees with)
    changes nothing. A previous row held twice meets the record twice, as in Spark's join."""
    same_key = " AND ".join(f"l.{_q(k)} IS NOT DISTINCT FROM p.{_q(k)}" for k in key)
    same_row = " AND ".join(f"l.{_q(c)} IS NOT DISTINCT FROM p.{_q(c)}" for c in columns)
    previous = ", ".join(f"p.{_q(c)} AS {_q('_p_' + c)}" for c in columns)
    joined = (
        f"SELECT l.*, {previous}, coalesce(p._found, false) AS _found, l.{_q(OP_COLUMN)} = '{UPSERT}' AS _upsert, "
        f"coalesce(({same_row}), false) AS _same FROM _last AS l "
        f"LEFT JOIN (SELECT *, true AS _found FROM _previous) AS p ON {same_key}"
    )
    retract = ", ".join(f"{_q('_p_' + c)} AS {_q(c)}" for c in columns)
    add = ", ".join(_q(c) for c in columns)
    return (
        f"WITH j AS ({joined}) "
        f"SELECT {retract}, -1::BIGINT AS {_q(WEIGHT)} FROM j WHERE _found AND NOT (_upsert AND _same) "
        f"UNION ALL SELECT {add}, 1::BIGINT AS {_q(WEIGHT)} FROM j WHERE _upsert AND NOT (_found AND _same)"
    )
