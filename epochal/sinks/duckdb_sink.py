"""The DuckDB sink: delivers committed epochs into a table of a DuckDB file, each exactly once,
through the sink coordinator.

A DuckDB file has one writer, so the executors pre-commit by staging their rows as Parquet files
(under ``EPOCHAL_HOME/sink-staging/<sink>/<batch>/``), and the commit loads a batch's staged files
in one DuckDB transaction that also moves the in-file progress row ("this sink holds every epoch up
to E"). That row is the idempotence key: a commit replayed after a crash finds it and does nothing,
and a transaction killed halfway is rolled back by DuckDB on the next open.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.meta.backend import Cursor, DuckDBBackend
from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    PrecommitLost,
    SinkDataError,
    SinkError,
    SinkSchemaError,
    SinkTarget,
    WriterTask,
    deletes_refused,
    null_key_refused,
)
from epochal.sinks.spec import primary_key_columns
from epochal.sql import DUCKDB, duckdb_parquet, quote
from epochal.storage.durability import sync_tree

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DuckDBTarget", "SinkSchemaError"]

PROGRESS_TABLE = "_epochal_sink_progress"
#: A DuckDB file has one writer, and a reader that holds it open (even read-only) keeps the sink out.
HELD_OPEN_FIX = (
    "a DuckDB shell or notebook reading the sink's table holds the file even read-only, so the sink cannot "
    "write: close it (the delivery is retried, and the epochs wait, nothing is lost), and look at the table "
    "with a connection opened for each query (duckdb -readonly FILE -c 'SELECT ...'); readers that stay "
    "connected need a PostgreSQL, Delta Lake or Iceberg sink"
)


class _RolledBack(Exception):
    """Ends check_rows' trial load: the transaction rolls back."""


class DuckDBTarget(SinkTarget):
    def __init__(
        self, name: str, options: Mapping[str, str], columns: list[str], home: Path, meta_url: str | None = None
    ):
        self.name = name
        self.columns = list(columns)
        database = Path(options["database"]).expanduser()
        self.database = database if database.is_absolute() else home / database
        self.table = options["table"]
        self.type = options.get("type", "append-only")
        self.primary_key = primary_key_columns(options, self.columns)
        self.staging = home / "sink-staging" / name

    @property
    def _backend(self) -> DuckDBBackend:
        # opened where it is used: the target is pickled to executors, which never open the file
        return DuckDBBackend(self.database, locked=(f"sink {self.name}'s DuckDB database", HELD_OPEN_FIX))

    def describe(self) -> str:
        return f"duckdb:{self.database}:{self.table}"

    def local_paths(self) -> list[tuple[str, Path]]:
        return [("database", self.database)]

    # ------------------------------------------------------------------ progress

    @staticmethod
    def _ensure_progress(cur: Cursor) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (sink VARCHAR PRIMARY KEY, epoch BIGINT NOT NULL, "
            "rows_delivered BIGINT NOT NULL, updated_at TIMESTAMP NOT NULL)"
        )

    def _progress(self, cur: Cursor) -> int | None:
        self._ensure_progress(cur)
        row = cur.execute(f"SELECT epoch FROM {PROGRESS_TABLE} WHERE sink = ?", [self.name]).fetchone()
        return row[0] if row else None

    def delivered_epoch(self) -> int | None:
        return self._backend.transaction(self._progress)

    # ------------------------------------------------------------------ schema

    @staticmethod
    def _duckdb_types(schema: pa.Schema) -> list[tuple[str, str]]:
        """The DuckDB column types of an Arrow schema, as DuckDB itself maps them."""
        import duckdb

        empty = schema.empty_table()  # noqa: F841 - read by the query below, by name
        with duckdb.connect() as con:
            return [(r[0], r[1]) for r in con.execute("DESCRIBE SELECT * FROM empty").fetchall()]

    def prepare_target(self, schema: pa.Schema) -> None:
        columns = [schema.field(c) for c in self.columns]
        import pyarrow as pa

        expected = self._duckdb_types(pa.schema(columns))
        self._backend.transaction(lambda cur: self._check_or_create_table(cur, expected))

    def _check_or_create_table(self, cur: Cursor, expected: list[tuple[str, str]]) -> None:
        existing = cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = ? AND table_schema = 'main' ORDER BY ordinal_position",
            [self.table],
        ).fetchall()
        if not existing:
            cols = [f"{quote(n, DUCKDB)} {t}" for n, t in expected]
            if self.type == "upsert":
                cols.append(f"PRIMARY KEY ({', '.join(quote(k, DUCKDB) for k in self.primary_key)})")
            cur.execute(f"CREATE TABLE {quote(self.table, DUCKDB)} ({', '.join(cols)})")
            return
        have = [(n.lower(), t) for n, t in existing]
        want = [(n.lower(), t) for n, t in expected]
        if have != want:
            diff = []
            have_d, want_d = dict(have), dict(want)
            for n, t in want:
                if n not in have_d:
                    diff.append(f"missing column {n} {t}")
                elif have_d[n] != t:
                    diff.append(f"column {n} is {have_d[n]}, the sink writes {t}")
            diff += [f"extra column {n} {t}" for n, t in have if n not in want_d]
            if not diff:
                diff.append("columns are in a different order")
            raise SinkSchemaError(
                f"sink {self.name}: table {self.table} in {self.database} exists with an incompatible schema "
                f"({'; '.join(diff)}). Epochal never casts silently: drop or rename that table, or point the "
                f"sink at another table with table = '...'"
            )
        if self.type == "upsert":
            pk = cur.execute(
                "SELECT constraint_column_names FROM duckdb_constraints() "
                "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'",
                [self.table],
            ).fetchone()
            if pk is None or [c.lower() for c in pk[0]] != [k.lower() for k in self.primary_key]:
                raise SinkSchemaError(
                    f"sink {self.name}: upsert needs table {self.table} to have PRIMARY KEY "
                    f"({', '.join(self.primary_key)}) but it has {pk[0] if pk else 'none'}: recreate the table "
                    "or point the sink at a new one"
                )

    # ------------------------------------------------------------------ two-phase commit

    def _batch_dir(self, batch: BatchId) -> Path:
        return self.staging / batch.token

    def write(self, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> Mapping[str, Any]:
        """Stage the writer's rows as one Parquet file (none when it has no rows)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        path = self._batch_dir(task.batch) / f"w{task.writer}-{uuid.uuid4().hex[:8]}.parquet"
        writer = None
        rows = 0
        try:
            for record_batch in batches:
                if self.type == "append-only":
                    negative = pc.sum(pc.less(record_batch.column(WEIGHT), 0)).as_py() or 0
                    if negative:
                        raise deletes_refused(task.batch.describe(), negative)
                if writer is None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    writer = pq.ParquetWriter(path, record_batch.schema)
                writer.write_batch(record_batch)
                rows += record_batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is not None and self.type == "upsert":
            self._check_unique(task.batch, path)
        if writer is not None:
            # The batch turns PENDING once every writer returns, and the commit loads these files
            # after that, maybe after a power loss: a file still in the page cache would come back
            # empty or torn, and a torn Parquet file fails the load instead of being re-delivered.
            sync_tree(str(path), stop_at=str(self.staging.parent))
        return {"file": str(path) if writer is not None else None, "rows": rows}

    def _check_unique(self, batch: BatchId, path: Path) -> None:
        """The loader proved the key unique in the view, so a key has at most one row to write. A
        writer holds all rows of its keys: it refuses more here, before anything is PENDING."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        inserts = pq.read_table(path).filter(pc.greater(pc.field(WEIGHT), 0))
        per_key = inserts.group_by(list(self.primary_key)).aggregate([(WEIGHT, "sum"), (WEIGHT, "count")])
        clashes = per_key.filter((pc.field(f"{WEIGHT}_sum") > 1) | (pc.field(f"{WEIGHT}_count") > 1))
        if clashes.num_rows:
            path.unlink(missing_ok=True)
            raise SinkError(
                f"{batch.describe()}: {clashes.num_rows} key(s) of ({', '.join(self.primary_key)}) have more than "
                "one row although the key was proven unique at load: this is a bug in Epochal, please report it"
            )

    def check_rows(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """The commit's own load, run and rolled back, when the table has rules of its user's
        (CHECK, NOT NULL, UNIQUE, a foreign key): DuckDB enforces them at the commit, after PENDING.
        With only the upsert's own key, the load cannot fail but on a NULL key, counted instead."""
        import duckdb

        files = [m["file"] for m in metadata if m.get("file")]
        if not files:
            return

        def dry_run(cur: Cursor) -> None:
            if not self._user_rules(cur):
                if self.type == "upsert":
                    self._check_keys_not_null(cur, batch, files)
                return
            try:
                self._apply(cur, files)
            except (duckdb.IntegrityError, duckdb.DataError) as exc:
                raise self._refused(batch, exc, pending=False) from exc
            raise _RolledBack

        try:
            self._backend.transaction(dry_run)
        except _RolledBack:
            pass

    def _user_rules(self, cur: Cursor) -> list[str]:
        """The table's constraints other than the PRIMARY KEY an upsert sink's table has anyway."""
        own = set()
        if self.type == "upsert":
            keys = tuple(k.lower() for k in self.primary_key)
            own = {("PRIMARY KEY", keys)} | {("NOT NULL", (k,)) for k in keys}
        rows = cur.execute(
            "SELECT constraint_type, constraint_column_names, constraint_text FROM duckdb_constraints() "
            "WHERE table_name = ? AND schema_name = 'main'",
            [self.table],
        ).fetchall()
        return [text for kind, cols, text in rows if (kind, tuple(c.lower() for c in cols)) not in own]

    def _check_keys_not_null(self, cur: Cursor, batch: BatchId, files: list[str]) -> None:
        null_key = " OR ".join(f"{quote(k, DUCKDB)} IS NULL" for k in self.primary_key)
        count = cur.execute(
            f"SELECT count(*) FROM {duckdb_parquet(files)} WHERE {WEIGHT} > 0 AND ({null_key})"
        ).fetchone()[0]
        if count:
            raise null_key_refused(batch.describe(), self.primary_key, self.table, count)

    def _refused(self, batch: BatchId, exc: Exception, pending: bool) -> SinkDataError:
        """DuckDB's refusal of the batch's rows, with what happens to the batch and the fix."""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if pending:
            state = (
                "The batch is PENDING (its epochs are committed) and is loaded as soon as the table takes its rows: "
                "relax the table's rule, and the next run delivers it"
            )
        else:
            state = (
                "Nothing of the batch was committed. Relax the table's rule, or fix the view's rows and give the "
                "sink a new name, which starts from the view's rows (the epochs committed before keep theirs)"
            )
        return SinkDataError(f"{batch.describe()}: DuckDB refused the rows for table {self.table}: {message}. {state}")

    def commit(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        import duckdb

        files = [m["file"] for m in metadata if m.get("file")]
        missing = [f for f in files if not Path(f).exists()]

        def run(cur: Cursor) -> None:
            done = self._progress(cur)
            if done is not None and done >= batch.last_epoch:
                return  # committed before: the progress row is the idempotence key
            if missing:
                raise PrecommitLost(f"{len(missing)} staged file(s) of the batch are gone (first: {missing[0]})")
            if files:
                try:
                    self._apply(cur, files)
                except (duckdb.IntegrityError, duckdb.DataError) as exc:
                    # (check_rows ran the same load before PENDING: the table changed since)
                    raise self._refused(batch, exc, pending=True) from exc
            fault_point("sink-midway")
            cur.execute(f"DELETE FROM {PROGRESS_TABLE} WHERE sink = ?", [self.name])
            rows = sum(int(m.get("rows", 0)) for m in metadata)
            cur.execute(f"INSERT INTO {PROGRESS_TABLE} VALUES (?, ?, ?, now())", [self.name, batch.last_epoch, rows])

        self._backend.transaction(run)
        shutil.rmtree(self._batch_dir(batch), ignore_errors=True)

    def abort(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        shutil.rmtree(self._batch_dir(batch), ignore_errors=True)

    def abort_orphans(self, keep: Sequence[BatchId]) -> int:
        if not self.staging.exists():
            return 0
        kept = {b.token for b in keep}
        orphans = [d for d in self.staging.iterdir() if d.name not in kept]
        for directory in orphans:
            shutil.rmtree(directory, ignore_errors=True)
        return len(orphans)

    def _apply(self, cur: Cursor, files: list[str]) -> tuple[int, int]:
        cols = ", ".join(quote(c, DUCKDB) for c in self.columns)
        source = duckdb_parquet(files)
        target = quote(self.table, DUCKDB)
        if self.type == "append-only":
            negative = cur.execute(f"SELECT count(*) FROM {source} WHERE {WEIGHT} < 0").fetchone()[0]
            if negative:
                raise deletes_refused(f"sink {self.name}", negative)
            # a weight of n is n copies of the row
            cur.execute(f"INSERT INTO {target} SELECT {cols} FROM (SELECT *, unnest(range({WEIGHT})) FROM {source})")
            return cur.execute(f"SELECT coalesce(sum({WEIGHT}), 0) FROM {source}").fetchone()[0], 0
        # Upsert: net each row's change; a key's delete and its new value may arrive in one epoch.
        keys = ", ".join(quote(k, DUCKDB) for k in self.primary_key)
        net = f"(SELECT {cols}, sum({WEIGHT}) AS _net FROM {source} GROUP BY ALL)"
        deleted = cur.execute(f"SELECT count(*) FROM {net} WHERE _net < 0").fetchone()[0]
        match = " AND ".join(
            f"{target}.{quote(k, DUCKDB)} IS NOT DISTINCT FROM d.{quote(k, DUCKDB)}" for k in self.primary_key
        )
        cur.execute(f"DELETE FROM {target} USING (SELECT {keys} FROM {net} WHERE _net < 0) d WHERE {match}")
        # The loader proved the key unique in the view, so after netting a key has at most one row
        # to insert. More would mean a planner bug; applying it would keep an arbitrary row.
        clashes = cur.execute(
            f"SELECT count(*) FROM (SELECT {keys} FROM {net} WHERE _net > 0 GROUP BY ALL "
            "HAVING count(*) > 1 OR sum(_net) > 1)"
        ).fetchone()[0]
        if clashes:
            raise EpochalError(
                f"sink {self.name}: {clashes} key(s) of ({', '.join(self.primary_key)}) have more than one row in "
                "this epoch although the key was proven unique at load: this is a bug in Epochal, please report it"
            )
        inserted = cur.execute(f"SELECT count(*) FROM {net} WHERE _net > 0").fetchone()[0]
        cur.execute(f"INSERT OR REPLACE INTO {target} SELECT {cols} FROM {net} WHERE _net > 0")
        return inserted, deleted

    def row_count(self) -> int:
        def count(cur: Cursor) -> int:
            exists = cur.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [self.table]
            ).fetchone()[0]
            return cur.execute(f"SELECT count(*) FROM {quote(self.table, DUCKDB)}").fetchone()[0] if exists else 0

        return self._backend.transaction(count)
