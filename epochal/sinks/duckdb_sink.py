"""The DuckDB sink: delivers committed epochs into a table of a DuckDB file, each exactly once.

Exactly once comes from one rule: an epoch's rows and the record "this sink has delivered epoch E"
are written in the same DuckDB transaction, in the target file itself. A sink step killed halfway
leaves an uncommitted transaction that DuckDB rolls back on the next open, and a re-run skips every
epoch the progress row already covers. The meta store's sink_epochs rows (PENDING, then
COMMITTED) mirror this for `epochal status`; the target's own progress row is the truth, because it
is the only record that cannot disagree with the target's contents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epochal.errors import EpochalError
from epochal.faults import fault_point
from epochal.meta.backend import Cursor, DuckDBBackend
from epochal.sinks.spec import primary_key_columns
from epochal.sql import DUCKDB, quote, string_list
from epochal.storage.warehouse import WEIGHT

PROGRESS_TABLE = "_epochal_sink_progress"


class SinkSchemaError(EpochalError):
    pass


@dataclass(frozen=True)
class Delivery:
    epoch: int
    rows_inserted: int
    rows_deleted: int
    skipped: bool


class DuckDBSink:
    def __init__(self, name: str, options: Mapping[str, str], columns: list[str], home: Path):
        self.name = name
        self.columns = list(columns)
        database = Path(options["database"]).expanduser()
        self.database = database if database.is_absolute() else home / database
        self.table = options["table"]
        self.type = options.get("type", "append-only")
        self.primary_key = primary_key_columns(options)
        self._backend = DuckDBBackend(self.database)

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

    def _expected_schema(self, cur: Cursor, files: list[str]) -> list[tuple[str, str]]:
        cols = ", ".join(quote(c, DUCKDB) for c in self.columns)
        described = cur.execute(f"DESCRIBE SELECT {cols} FROM read_parquet({string_list(files)})").fetchall()
        return [(r[0], r[1]) for r in described]

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

    # ------------------------------------------------------------------ delivery

    def deliver(self, epoch: int, files: list[str]) -> Delivery:
        """Deliver one committed epoch's change (``files``) unless the target already holds it."""

        def run(cur: Cursor) -> Delivery:
            done = self._progress(cur)
            if done is not None and done >= epoch:
                return Delivery(epoch, 0, 0, skipped=True)
            inserted = deleted = 0
            if files:
                self._check_or_create_table(cur, self._expected_schema(cur, files))
                inserted, deleted = self._apply(cur, files)
            fault_point("sink-midway")
            cur.execute(f"DELETE FROM {PROGRESS_TABLE} WHERE sink = ?", [self.name])
            cur.execute(f"INSERT INTO {PROGRESS_TABLE} VALUES (?, ?, ?, now())", [self.name, epoch, inserted + deleted])
            return Delivery(epoch, inserted, deleted, skipped=False)

        return self._backend.transaction(run)

    def _apply(self, cur: Cursor, files: list[str]) -> tuple[int, int]:
        cols = ", ".join(quote(c, DUCKDB) for c in self.columns)
        source = f"read_parquet({string_list(files)})"
        target = quote(self.table, DUCKDB)
        if self.type == "append-only":
            negative = cur.execute(f"SELECT count(*) FROM {source} WHERE {WEIGHT} < 0").fetchone()[0]
            if negative:
                raise EpochalError(
                    f"sink {self.name} is append-only but its upstream deleted or updated {negative} row(s) "
                    "in this epoch: use type = 'upsert' with a primary_key"
                )
            cur.execute(f"INSERT INTO {target} SELECT {cols} FROM {source}")
            return cur.execute(f"SELECT count(*) FROM {source}").fetchone()[0], 0
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
