"""`epochal query`: read-only SQL, in DuckDB, over the committed state of every table at one epoch.

Every source and view becomes a DuckDB view over its newest snapshot at the epoch plus the change
files after it, netted by ``_weight`` (a snapshot alone is read as it is); each source's dead
letters are ``<source>__dead_letters``. The committed epoch is read once and every table is cut at
it, so a query joining two tables never mixes epochs even while new epochs commit underneath.

A SOURCE that stores nothing (``epochal.incremental.state_needs``) is read from its connector at
the committed offsets, through Spark, as RisingWave's batch read of a source; only when the query
names it, since that starts Spark and reads the source's whole history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochal.checkpoint.backfills.state import BackfillPhase
from epochal.checkpoint.records import StateCompacted
from epochal.errors import EpochalError
from epochal.query.time_travel import AsOf, resolve_as_of, system_time
from epochal.sql import DUCKDB, duckdb_parquet, quote
from epochal.storage.warehouse import WEIGHT, dead_letter_table

if TYPE_CHECKING:
    import duckdb

    from epochal.checkpoint.backfills.state import Backfill
    from epochal.runtime.facade import EpochRuntime

READ_ONLY = {"SELECT", "EXPLAIN"}

# Spark simpleString types -> DuckDB, for the empty views of tables with no committed data yet.
_SPARK_TO_DUCKDB = {
    "bigint": "BIGINT",
    "int": "INTEGER",
    "smallint": "SMALLINT",
    "tinyint": "TINYINT",
    "double": "DOUBLE",
    "float": "FLOAT",
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMPTZ",
}


def _empty_view(columns: list[tuple[str, str]]) -> str:
    cols = ", ".join(f"NULL::{_SPARK_TO_DUCKDB.get(t.lower(), 'VARCHAR')} AS {quote(n, DUCKDB)}" for n, t in columns)
    return f"SELECT {cols} WHERE false"


def _columns_of(runtime: "EpochRuntime", table: str) -> list[tuple[str, str]]:
    pipeline = runtime.pipeline
    if table in pipeline.sources:
        return [(c.name, c.type) for c in pipeline.sources[table].columns]
    return [(c, "string") for c in pipeline.views[table].columns]


def committed_connection(
    runtime: "EpochRuntime", sql: str = "", epoch: int | None = None, also: dict[str, tuple[str, int]] | None = None
) -> tuple["duckdb.DuckDBPyConnection", int | None]:
    """An in-memory DuckDB connection with one view per table, all cut at the same committed epoch:
    ``epoch`` (one ``resolve_as_of`` accepted), default the newest. ``sql``: the query, so that a
    SOURCE that stores nothing is read from its connector only if the query names it. ``also``:
    more views, name -> (table, epoch), for the tables a query reads ``FOR SYSTEM_TIME AS OF``."""
    import duckdb

    controller, warehouse = runtime.controller, runtime.warehouse
    if epoch is None:
        epoch = controller.committed_epoch()
    con = duckdb.connect()
    backfills = {b.view: b for b in controller.all_backfills() if b.phase is not BackfillPhase.JOINED}
    shown = controller.backfill_status() if backfills else {}
    named = _tables_named(sql)
    for table in runtime.pipeline.tables:
        _table_view(runtime, con, table, epoch, table, table.lower() in named, backfills, shown)
    for name, (table, at) in (also or {}).items():
        _table_view(runtime, con, table, at, name, True, backfills, shown)
    for source in runtime.pipeline.sources:
        locations = controller.committed_dead_letter_locations(source, epoch)
        dlq = [f for loc in locations for f in warehouse.parquet_files(loc)]
        body = (
            f"SELECT * FROM {duckdb_parquet(dlq)}"
            if dlq
            else _empty_view([("split", "string"), ("offset", "bigint"), ("raw", "string"), ("reason", "string")])
        )
        con.execute(f"CREATE VIEW {quote(dead_letter_table(source), DUCKDB)} AS {body}")
    return con, epoch


def _table_view(
    runtime: "EpochRuntime",
    con: "duckdb.DuckDBPyConnection",
    table: str,
    epoch: int | None,
    name: str,
    named: bool,
    backfills: dict[str, "Backfill"],
    shown: dict,
) -> None:
    """View ``name``: ``table`` at committed ``epoch``."""
    controller, warehouse = runtime.controller, runtime.warehouse
    columns = _columns_of(runtime, table)
    cols = ", ".join(quote(n, DUCKDB) for n, _ in columns)
    view = quote(name, DUCKDB)
    if table in backfills:
        # Not joined yet: its rows are not at the committed epoch. Reading it fails, saying how far it is.
        message = _not_joined(backfills[table], shown.get(table, {})).replace("'", "''")
        typed = _empty_view(columns).removesuffix(" WHERE false")
        con.execute(f"CREATE VIEW {view} AS {typed} FROM range(1) WHERE error('{message}')")
        return
    # The newest snapshot at the epoch plus the change files after it, as the Spark readers do.
    try:
        parts = controller.state_parts(table, epoch, inclusive=True) if epoch is not None else None
    except StateCompacted:
        if epoch is None or not runtime.reader.history or not runtime.reader.history.covers(table):
            raise
        _from_connector(runtime, con, table, epoch, named=named, name=name)
        return
    snapshot = [] if parts is None or parts.snapshot is None else warehouse.snapshot_files(parts.snapshot.location)
    changes = [] if parts is None else [f for _, loc in parts.changes for f in warehouse.parquet_files(loc)]
    if not snapshot and not changes:
        con.execute(f"CREATE VIEW {view} AS {_empty_view(columns)}")
    elif not changes:
        # A snapshot alone is already net, one row per unit: no aggregation.
        con.execute(f"CREATE VIEW {view} AS SELECT {cols} FROM {duckdb_parquet(snapshot)}")
    else:
        weighted = f"SELECT {cols}, {WEIGHT} FROM {duckdb_parquet(changes)}"
        if snapshot:
            weighted = f"SELECT {cols}, 1::BIGINT AS {WEIGHT} FROM {duckdb_parquet(snapshot)} UNION ALL {weighted}"
        con.execute(
            f"CREATE VIEW {view} AS WITH net AS (SELECT {cols}, sum({WEIGHT})::BIGINT AS _n "
            f"FROM ({weighted}) GROUP BY ALL HAVING sum({WEIGHT}) > 0) "
            f"SELECT {cols} FROM (SELECT {cols}, unnest(range(_n)) FROM net)"
        )


def _tables_named(sql: str) -> set[str]:
    """The table names ``sql`` mentions (lower case); every word when it does not parse, so a
    table is never missed."""
    import re

    import sqlglot
    from sqlglot import exp

    try:
        return {t.name.lower() for tree in sqlglot.parse(sql, read="duckdb") if tree for t in tree.find_all(exp.Table)}
    except sqlglot.errors.ParseError:
        return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}


def _from_connector(
    runtime: "EpochRuntime", con: "duckdb.DuckDBPyConnection", table: str, epoch: int, named: bool, name: str
) -> None:
    """View ``name``: ``table``, a SOURCE that stores nothing, as its connector's records at ``epoch``."""
    view = quote(name, DUCKDB)
    if not named:
        # (never read: the query does not name it; if it reaches it anyway, it says why)
        message = f"source {table} stores nothing and is read from its connector: name it in the query".replace(
            "'", "''"
        )
        typed = _empty_view(_columns_of(runtime, table)).removesuffix(" WHERE false")
        con.execute(f"CREATE VIEW {view} AS {typed} FROM range(1) WHERE error('{message}')")
        return
    rows, _ = runtime.reader.read_state(table, epoch, inclusive=True)
    con.register(f"__epochal_rows_{name}", rows.toArrow())
    con.execute(f"CREATE VIEW {view} AS SELECT * FROM {quote(f'__epochal_rows_{name}', DUCKDB)}")


def _not_joined(backfill: "Backfill", shown: dict) -> str:
    if backfill.phase is BackfillPhase.CANCELLED:
        return (
            f"view {backfill.view} has no rows: its backfill was cancelled. Restart it with "
            f"`epochal backfill {backfill.view} --restart`, or remove the view from the pipeline"
        )
    return (
        f"view {backfill.view} is backfilling and has not joined the pipeline yet: phase {backfill.phase.shown}, "
        + (f"{shown['splits_done']}/{shown['splits_total']} source splits read, " if shown.get("splits_total") else "")
        + f"{backfill.vnodes_done}/256 vnodes, {backfill.rows_read} rows read, written up to epoch "
        f"{backfill.caught_up_epoch}. Run backfill_job (or `epochal backfill {backfill.view} --run`) to advance it"
    )


def run_query(
    runtime: "EpochRuntime", sql: str, as_of: AsOf | None = None
) -> tuple[list[str], list[tuple], int | None]:
    """Columns, rows and the committed epoch the answer is cut at: ``as_of`` (an epoch or a
    timestamp, ``resolve_as_of``), default the newest; a table the query reads ``FOR SYSTEM_TIME AS
    OF`` another epoch is read at that one."""
    import duckdb

    epoch = None if as_of is None else resolve_as_of(runtime, as_of)
    sql, also = system_time(sql, lambda moment: resolve_as_of(runtime, moment), runtime.pipeline.tables)
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise EpochalError(f"query does not parse: {exc}") from None
    if len(statements) != 1:
        raise EpochalError(f"give exactly one statement, not {len(statements)}")
    kind = statements[0].type.name
    if kind not in READ_ONLY:
        raise EpochalError(f"epochal query is read-only: {kind} is not allowed, only SELECT (and EXPLAIN)")
    con, epoch = committed_connection(runtime, sql, epoch, also)
    try:
        result = con.execute(sql)
    except duckdb.Error as exc:
        tables = ", ".join([*runtime.pipeline.tables, *(dead_letter_table(s) for s in runtime.pipeline.sources)])
        raise EpochalError(f"query failed: {str(exc).splitlines()[0]} (tables: {tables})") from None
    columns = [d[0] for d in result.description]
    return columns, result.fetchall(), epoch
