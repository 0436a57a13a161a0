"""The Spark Python data source that reads pieces of log files on executors (see ``log_lines``).

Kept apart so that loading a pipeline does not import pyspark. Executors unpickle it by
reference, so their Python must have Epochal installed, as for the rest of Epochal on a cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from epochal.connectors import log_lines
from epochal.connectors.log_lines import DATA_SOURCE_NAME, LINES_SCHEMA, LinePiece, piece_batches


class _Partition(InputPartition):
    def __init__(self, path: str, piece: LinePiece):
        super().__init__((path, piece))
        self.path = path
        self.piece = piece


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.parts = [(path, LinePiece(*fields)) for path, fields in json.loads(options["pieces"])]

    def partitions(self) -> Sequence[InputPartition]:
        return [_Partition(path, piece) for path, piece in self.parts]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, _Partition):
            raise TypeError(f"not a log line piece: {partition!r}")
        yield from piece_batches(partition.path, partition.piece)


class LogLinesDataSource(DataSource):
    """Spark reads pieces of log files on its executors: ``option("pieces", json)``, a list of
    ``[path, [split, first_line, start, end, lines]]``. Internal: ``read_lines`` builds the option."""

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> str | StructType:
        return LINES_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(self.options)


def read_lines(spark: SparkSession, pieces: Sequence[tuple[str, LinePiece]]) -> DataFrame:
    """The lines of ``pieces`` (``(path, piece)``) as one lazy DataFrame of LINES_SCHEMA."""
    import pyarrow as pa

    total = sum(piece.end - piece.start for _, piece in pieces)
    # read as the module's attribute, so a test can move the threshold
    if total <= log_lines.SPARK_DRIVER_READ_BYTES:
        batches = [batch for path, piece in pieces for batch in piece_batches(path, piece)]
        if not batches:
            return spark.createDataFrame([], LINES_SCHEMA)
        return spark.createDataFrame(pa.Table.from_batches(batches))
    spark.dataSource.register(LogLinesDataSource)
    option = json.dumps([[path, list(_fields(piece))] for path, piece in pieces])
    return spark.read.format(DATA_SOURCE_NAME).option("pieces", option).load()


def _fields(piece: LinePiece) -> tuple[str, int, int, int, int]:
    return (piece.split, piece.first_line, piece.start, piece.end, piece.lines)
