"""Staging a postgres-cdc table's snapshot in primary-key chunks, read as parallel Spark tasks.

The driver exports one snapshot (a temporary slot's consistent point, LSN L) and splits the key
space (``cdc_chunks``); the chunks are dealt to as many Spark tasks as the session has cores. Each
task opens one connection, joins the exported snapshot (``SET TRANSACTION SNAPSHOT``) and stages its
chunks one after the other in that transaction: a chunk's rows are streamed with ``COPY ... TO
STDOUT`` and written as one Parquet file (a row group per batch of the stream, so a task's memory
stays bounded whatever the chunk's size), durably, then the chunk's record
(``cdc_chunks.record_chunk``): every chunk is kept on its own on resume. The exporting connection
stays open until every task ended. Work that grows with the rows runs in the tasks; the driver only
plans and waits. Without a SparkSession (a connector used on its own) the same function runs on the
driver, one chunk after the other.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors import pg_cdc_server as server
from epochal.connectors.cdc_chunks import (
    Chunk,
    StagedChunk,
    chunk_file_path,
    chunk_record_path,
    chunks_of,
    integer_boundaries,
    record_chunk,
    sync_directory,
)
from epochal.connectors.cdc_snapshot import arrow_schema
from epochal.connectors.pg_cdc_changes import parser, typed_row
from epochal.storage.durability import sync_tree

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from epochal.pipeline.model import Column

log = logging.getLogger("epochal.connectors.postgres_cdc")

_INTEGERS = ("int2", "int4", "int8")
#: compared byte by byte on the server, so that the server's order is Python's (code points)
_COLLATABLE = ("text", "varchar", "bpchar")
#: declared types whose values Arrow's CSV reader parses from PostgreSQL's text exactly as Python does
_PARSED_BY_ARROW = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "STRING", "DATE")
#: COPY output parsed and written as one Parquet row group at a time: bounds a task's memory (the
#: text, its Arrow table and the row group being encoded) whatever the chunk's rows
BATCH_BYTES = 32 << 20
#: the staged files are read once, by the same machine's Spark, right after: not compressed (Snappy
#: was about half of a chunk's Parquet write, and a chunk's unique keys and numbers hardly shrink)
PARQUET_COMPRESSION = "none"

#: the snapshot transactions a task's chunks share (``shared_connections``), None outside one
_SHARED: contextvars.ContextVar[_Connections | None] = contextvars.ContextVar("pg_cdc_shared", default=None)


def key_types(conn: psycopg.Connection, config: server.ServerConfig, key: Sequence[str]) -> tuple[str, ...]:
    """The upstream types (pg_type.typname) of the key's columns."""
    by_name = {c.name: c.typname for c in server.upstream_columns(conn, config) or []}
    return tuple(by_name.get(k, "") for k in key)


def _key_sql(key: Sequence[str], types: Sequence[str]):  # noqa: ANN202 - psycopg Composable
    """The key's columns, comma-separated, text ones in byte order."""
    from psycopg import sql

    parts = [
        sql.SQL('{} COLLATE "C"' if t in _COLLATABLE else "{}").format(sql.Identifier(k))
        for k, t in zip(key, types, strict=True)
    ]
    return sql.SQL(", ").join(parts)


def plan_chunks(
    conn: psycopg.Connection, config: server.ServerConfig, key: Sequence[str], types: Sequence[str], chunk_rows: int
) -> tuple[list[Chunk], int]:
    """The table's chunks of about ``chunk_rows`` rows, and its rows as estimated (exact when the
    table was never analyzed). A one-column integer key is split by min/max in equal widths; any
    other key at every ``chunk_rows``-th key in key order (an index-only scan on the server; only
    the boundaries come back)."""
    from psycopg import sql

    table = sql.Identifier(config.schema, config.table)
    (estimate,) = conn.execute(
        "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [config.quoted]
    ).fetchone()
    if not estimate or estimate <= 0:
        (estimate,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    if estimate <= chunk_rows:
        return chunks_of([]), int(estimate)
    if len(key) == 1 and types[0] in _INTEGERS:
        low, high = conn.execute(
            sql.SQL("SELECT min({k}), max({k}) FROM {t}").format(k=sql.Identifier(key[0]), t=table)
        ).fetchone()
        if low is None:
            return chunks_of([]), 0
        return chunks_of(integer_boundaries(low, high, int(estimate), chunk_rows)), int(estimate)
    rows = conn.execute(
        sql.SQL(
            "SELECT {keys} FROM (SELECT {cols}, row_number() OVER (ORDER BY {order}) AS n FROM {t}) s "
            "WHERE n % {c} = 1 AND n > 1 ORDER BY n"
        ).format(
            keys=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in key),
            cols=sql.SQL(", ").join(sql.Identifier(k) for k in key),
            order=_key_sql(key, types),
            t=table,
            c=sql.Literal(chunk_rows),
        )
    ).fetchall()
    return chunks_of([tuple(r) for r in rows]), int(estimate)


def chunk_query(
    config: server.ServerConfig, columns: Sequence[str], key: Sequence[str], types: Sequence[str], chunk: Chunk
):  # noqa: ANN201
    """The SELECT of ``chunk``'s rows (every value as text) and its parameters."""
    from psycopg import sql

    where, params = [], []
    ordered = sql.SQL("({})").format(_key_sql(key, types))
    marks = sql.SQL("({})").format(sql.SQL(", ").join(sql.SQL("%s") for _ in key))
    if chunk.lower is not None:
        where.append(sql.SQL("{} >= {}").format(ordered, marks))
        params += list(chunk.lower)
    if chunk.upper is not None:
        where.append(sql.SQL("{} < {}").format(ordered, marks))
        params += list(chunk.upper)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
        sql.Identifier(config.schema, config.table),
    )
    if where:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(where))
    return query, params


def stage_chunk(
    config: server.ServerConfig,
    columns: tuple[Column, ...],
    key: tuple[str, ...],
    types: tuple[str, ...],
    snapshot: str,
    position: int,
    directory: Path,
    chunk: Chunk,
    replace: bool = False,
) -> StagedChunk:
    """Reads ``chunk`` in the exported ``snapshot`` (at ``position``) and stages it: its Parquet
    file on the disk first, then its record (``record_chunk``: the first one stands, unless
    ``replace``). Runs in a Spark task (or on the driver); within ``shared_connections`` it reads in
    the task's one transaction on the snapshot, else in its own."""
    from psycopg import sql

    schema = arrow_schema(columns)
    path = chunk_file_path(directory, chunk.index, position)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    query, params = chunk_query(config, [c.name for c in columns], key, types, chunk)
    copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT csv)").format(query)
    where = f"{config.qualified} (snapshot chunk {chunk.index})"
    shared = _SHARED.get()
    opened = nullcontext(shared.get(config, snapshot)) if shared else server.snapshot_transaction(config, snapshot)
    with opened as conn:
        rows = _copy_to_parquet(conn, copy, params, columns, key, schema, tmp, where)
    sync_tree(str(tmp))
    os.replace(tmp, path)
    # the file's entry on the disk before a record names it (a record is kept on resume)
    sync_directory(directory)
    # syncs the directory again: the record's entry
    return record_chunk(directory, StagedChunk(chunk, position, rows, str(path)), replace)


def _copy_to_parquet(
    conn: psycopg.Connection,
    copy: object,
    params: list,
    columns: tuple[Column, ...],
    key: tuple[str, ...],
    schema: pa.Schema,
    path: Path,
    where: str,
) -> int:
    """Streams the COPY's rows into a Parquet file at ``path``, a row group per ``BATCH_BYTES`` of
    text; returns the rows. The server sends one row per CopyData message (the protocol's "always
    one per row") and ``_copy_out`` yields one message at a time, so a batch always ends at a row's
    end, even with a newline inside a quoted value."""
    import pyarrow.parquet as pq

    rows = 0
    writer = pq.ParquetWriter(
        path, schema, compression=PARQUET_COMPRESSION, use_dictionary=dictionary_columns(columns, key)
    )
    with writer:
        data = bytearray()
        for block in _copy_out(conn, copy, params):
            data += block
            if len(data) >= BATCH_BYTES:
                rows += _write_batch(writer, data, columns, schema, where)
                data = bytearray()  # a new one: Arrow may still view the old (no resize then)
        if data or not rows:  # an empty chunk still writes its (empty) table
            rows += _write_batch(writer, data, columns, schema, where)
    return rows


def _copy_out(conn: psycopg.Connection, copy: object, params: list) -> Iterator[bytes]:
    """The rows of ``COPY ... TO STDOUT``, one CopyData message each, read with libpq's blocking
    ``PQgetCopyData`` in a plain loop: psycopg's ``Copy`` iterator waits through its generator
    machinery per row, 0.53 s against 0.36 s for a million rows (a third of a chunk's time). The
    statement's parameters are bound client-side, as psycopg binds a COPY's."""
    import psycopg
    from psycopg import pq

    statement = psycopg.ClientCursor(conn).mogrify(copy, params)  # type: ignore[arg-type]
    pgconn = conn.pgconn
    started = pgconn.exec_(statement.encode())
    if started.status != pq.ExecStatus.COPY_OUT:
        raise psycopg.OperationalError(f"COPY of a snapshot chunk failed: {_error(started)}")
    while True:
        size, block = pgconn.get_copy_data(0)
        if size < 0:
            break
        yield block
    failed = None
    while (result := pgconn.get_result()) is not None:  # drained, so the connection takes commands
        if result.status != pq.ExecStatus.COMMAND_OK:
            failed = failed or _error(result)
    if size == -2 or failed:
        raise psycopg.OperationalError(f"COPY of a snapshot chunk failed: {failed or _error(pgconn)}")


def _error(source: object) -> str:
    message = getattr(source, "error_message", b"") or b""
    return message.decode(errors="replace").strip() or "no message from the server"


def dictionary_columns(columns: tuple[Column, ...], key: tuple[str, ...]) -> list[str]:
    """The columns worth a Parquet dictionary: text outside the key, where repeated values are
    common and long. A key's values are unique and a number's fixed-width: a dictionary there is
    filled and thrown away (it was most of the write's time for a BIGINT key and a DECIMAL)."""
    return [c.name for c in columns if c.type == "STRING" and c.name not in key]


def _write_batch(writer: object, data: bytearray, columns: tuple[Column, ...], schema: pa.Schema, where: str) -> int:
    table = typed_table(data, columns, schema, where)
    writer.write_table(table)  # type: ignore[attr-defined]
    return table.num_rows


class _Connections:
    """One snapshot transaction per (server, snapshot), opened on first use, closed with the scope."""

    def __init__(self, stack: ExitStack):
        self._stack = stack
        self._open: dict[tuple[server.ServerConfig, str], psycopg.Connection] = {}

    def get(self, config: server.ServerConfig, snapshot: str) -> psycopg.Connection:
        if (config, snapshot) not in self._open:
            self._open[config, snapshot] = self._stack.enter_context(server.snapshot_transaction(config, snapshot))
        return self._open[config, snapshot]


@contextmanager
def shared_connections() -> Iterator[None]:
    """Within it, ``stage_chunk`` calls share one connection per snapshot: a task's chunks cost one
    connection and one ``SET TRANSACTION SNAPSHOT`` (every read still sees exactly the exported
    snapshot: a REPEATABLE READ transaction's statements all see its snapshot). An error ends the
    transaction with the scope; the chunks staged before it keep their records."""
    with ExitStack() as stack:
        token = _SHARED.set(_Connections(stack))
        try:
            yield
        finally:
            _SHARED.reset(token)


def typed_table(
    csv: bytes | bytearray, columns: tuple[Column, ...], schema: pa.Schema, where: str = "the upstream table"
) -> pa.Table:
    """The rows of a ``COPY ... (FORMAT csv)`` of values as text, as the declared columns' values:
    the same values ``typed_row`` gives for each text (the WAL's), converted a column at a time in
    Arrow; a column Arrow cannot convert whole goes through ``typed_row``'s parser value by value."""
    import pyarrow as pa

    names = [c.name for c in columns]
    if not csv:
        return schema.empty_table()
    # the types Arrow parses straight from the text as Python does (ints, decimals, doubles, dates,
    # strings); the others are read as text and converted after; any value Arrow refuses: all as text
    direct = {
        c.name: schema.field(i).type
        for i, c in enumerate(columns)
        if c.type in _PARSED_BY_ARROW or c.type.startswith("DECIMAL")
    }
    try:
        text = _read_csv(csv, names, {n: direct.get(n, pa.string()) for n in names})
    except pa.ArrowInvalid:
        direct = {}
        text = _read_csv(csv, names, {n: pa.string() for n in names})
    arrays = [
        text.column(i).combine_chunks()
        if c.name in direct
        else _typed_column(text.column(i).combine_chunks(), c.type, schema.field(i).type, c.name, where)
        for i, c in enumerate(columns)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _read_csv(csv: bytes | bytearray, names: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    import pyarrow as pa
    from pyarrow import csv as pacsv

    return pacsv.read_csv(
        pa.BufferReader(pa.py_buffer(csv)),  # the bytes where they are, not a copy
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False),  # a task is one core
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        # COPY's csv: NULL is an unquoted empty field, an empty string a quoted one
        convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False, null_values=[""]
        ),
    )


def _typed_column(values: pa.Array, declared: str, target: pa.DataType, column: str, where: str) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        if declared == "STRING":
            return values
        if declared == "BOOLEAN":  # boolout writes t, a ::text cast true
            return pc.or_(pc.equal(values, "t"), pc.equal(values, "true"))
        if declared == "FLOAT":  # as float() then float32: the same rounding as the WAL's values
            return pc.cast(pc.cast(values, pa.float64()), target, safe=False)
        if declared == "TIMESTAMP":
            try:
                return pc.cast(values, target)  # timestamptz: printed with its offset (+00)
            except pa.ArrowInvalid:  # timestamp: no offset, taken as UTC
                return pc.cast(pc.cast(values, pa.timestamp("us")), target)
        return pc.cast(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        parse = parser(declared)
        texts = values.to_pylist()
        return pa.array(list(typed_row(texts, [parse] * len(texts), [column] * len(texts), where)), target)


def stage_chunks(
    spark: SparkSession | None,
    stage_one: Callable[[Chunk], StagedChunk],
    chunks: Sequence[Chunk],
    directory: Path,
    label: str,
    total: int,
    tasks: int | None = None,
) -> None:
    """Stages ``chunks`` with ``stage_one``: as Spark tasks (mapInArrow over a range of task
    numbers), ``tasks`` of them (default: the session's cores), task t staging chunks t, t + tasks,
    ... in order in one shared transaction; or on the driver without Spark. Logs progress while
    they run."""
    if not chunks:
        return
    done = threading.Event()
    watcher = threading.Thread(target=_progress, args=(done, chunks, directory, label, total), daemon=True)
    watcher.start()
    try:
        if spark is None:
            with shared_connections():
                for chunk in chunks:
                    stage_one(chunk)
        else:
            todo = list(chunks)
            # a task per core: each chunk more in a task costs a COPY, not a task, a Python worker's
            # round trip and a connection; dealt in turn, so that uneven ranges spread over the tasks
            count = max(1, min(len(todo), tasks or task_slots(spark)))

            def task(batches: Iterator) -> Iterator:  # pickled to the executors
                import pyarrow as pa

                for batch in batches:
                    for number in batch.column(0).to_pylist():
                        with shared_connections():
                            staged = [stage_one(chunk) for chunk in todo[number::count]]
                        yield pa.RecordBatch.from_pydict(
                            {"index": [s.chunk.index for s in staged], "rows": [s.rows for s in staged]},
                            pa.schema([("index", pa.int64()), ("rows", pa.int64())]),
                        )

            spark.range(count, numPartitions=count).mapInArrow(task, "index long, rows long").collect()
    finally:
        done.set()
        watcher.join()


def task_slots(spark: SparkSession) -> int:
    """How many tasks the session runs at once: its default parallelism; on Spark Connect, whose
    client has no SparkContext, ``spark.default.parallelism`` if the server sets it, else the
    session's shuffle partitions."""
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        return spark.sparkContext.defaultParallelism
    for key in ("spark.default.parallelism", "spark.sql.shuffle.partitions"):
        value = spark.conf.get(key, None)
        if value and str(value).isdigit():
            return int(value)
    return 2


def _progress(done: threading.Event, chunks: Sequence[Chunk], directory: Path, label: str, total: int) -> None:
    """Logs each chunk staged (its record appeared) with the rows staged so far of the estimate."""
    import json

    seen: set[int] = set()
    rows = 0
    while True:
        finished = done.wait(2.0)
        for chunk in chunks:
            path = chunk_record_path(directory, chunk.index)
            if chunk.index not in seen and path.exists():
                seen.add(chunk.index)
                try:
                    rows += int(json.loads(path.read_text())["rows"])
                except (OSError, ValueError):
                    continue
                log.info(
                    "%s: snapshot chunk %d staged: %d/%d chunks, %d rows of about %d",
                    label,
                    chunk.index,
                    len(seen),
                    len(chunks),
                    rows,
                    total,
                )
        if finished:
            return
