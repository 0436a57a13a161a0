"""A table's rows read back in the shape its readers expect: cast to a query's types
(``cast_like``), or laid out as a source declares its columns now (``aligned``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochal.sql import quote
from epochal.storage.warehouse import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


def cast_like(rows: DataFrame, schema: Any) -> DataFrame:
    """``rows`` with ``schema``'s columns, each cast to its type with every nested part nullable.

    Stored rows read back with nullable nested parts (an array's elements, a map's values, a
    struct's fields), while the query over empty inputs may say they cannot be NULL (array(count(*)))
    and Spark refuses to cast a nullable part to a non-nullable one. Storage keeps NULL-able
    columns anyway, so the cast only widens."""
    from pyspark.sql import functions as F

    return rows.select(*(F.col(quote(f.name)).cast(_nullable(f.dataType)).alias(f.name) for f in schema.fields))


def _nullable(data_type: Any) -> Any:
    from pyspark.sql import types as T

    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    return data_type


def aligned(rows: DataFrame, schema: StructType | None) -> DataFrame:
    """``rows`` of a source with the columns ``schema`` declares, in its order (``_weight`` kept):
    a column declared after the rows were stored is NULL in them, as ALTER TABLE ADD COLUMN gives,
    and one no longer declared is left out. ``rows`` as they are when they already fit, or when
    ``schema`` is None (not a source). Same-named columns keep their stored type: a changed type is
    refused before anything is stored (``epochal.checkpoint.statements.sources``)."""
    if schema is None:
        return rows
    names = [f.name for f in schema.fields]
    present = [c for c in rows.columns if c != WEIGHT]
    if present == names:
        return rows
    from pyspark.sql import functions as F

    have = {c.lower(): c for c in present}
    columns = [
        F.col(quote(have[f.name.lower()])).alias(f.name)
        if f.name.lower() in have
        else F.lit(None).cast(f.dataType).alias(f.name)
        for f in schema.fields
    ]
    if WEIGHT in rows.columns:
        columns.append(F.col(WEIGHT))
    return rows.select(*columns)
