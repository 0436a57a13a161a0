"""A seeded random writer of multi-statement transactions over two upstream tables, on a thread
with its own connection: what tests/connectors/test_cdc_workload.py runs while epochs run and runs
die, and what benchmarks/bench_cdc_throughput.py measures the CDC sources against.

The tables (the same on PostgreSQL and MariaDB)::

    acct (id int PRIMARY KEY, owner text, balance numeric(12,2), note text)   -- REPLICA IDENTITY FULL
    item (id bigint PRIMARY KEY, acct int, qty int, tag text)

Each transaction is 1-5 statements drawn from ``KINDS``: inserts (``note`` up to 10,000 random hex
characters, which PostgreSQL stores out of line, TOASTed), updates to NULL, an update that leaves
the TOASTed ``note`` unchanged, primary-key changes, deletes, a key deleted and inserted again in
one transaction; one in 20 is rolled back. The rows a statement changes are picked among those
that exist (a SELECT in the transaction), new keys from a counter above every key used: no
statement fails, so every committed transaction is one the CDC table must hold.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

PG_DDL = [
    "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2), note text)",
    # an update that leaves a TOASTed note unchanged sends no value for it: the whole old row has it
    "ALTER TABLE acct REPLICA IDENTITY FULL",
    "CREATE TABLE item (id bigint PRIMARY KEY, acct int, qty int, tag text)",
]
MYSQL_DDL = [
    "CREATE TABLE acct (id int PRIMARY KEY, owner varchar(20), balance decimal(12,2), note text)",
    "CREATE TABLE item (id bigint PRIMARY KEY, acct int, qty int, tag varchar(20))",
]
#: the CDC tables as a pipeline declares them, after the CREATE SOURCE named ``{source}``
TABLES_SQL = """
CREATE TABLE acct (id INT, owner STRING, balance DECIMAL(12,2), note STRING, PRIMARY KEY (id))
  FROM {source} TABLE '{acct}';
CREATE TABLE item (id BIGINT, acct INT, qty INT, tag STRING, PRIMARY KEY (id)) FROM {source} TABLE '{item}';
"""
ACCT_COLUMNS = "SELECT id, owner, balance, note FROM acct"
ITEM_COLUMNS = "SELECT id, acct, qty, tag FROM item"
OWNERS = ["ann", "bob", "cy", "dee", None]
BIG = 10_000  # characters of a large note: 8 kB and more is stored out of line (TOAST) on PostgreSQL

KINDS = (
    "insert_acct",
    "insert_items",
    "acct_to_null",
    "item_to_null",
    "toast_unchanged",
    "toast_changed",
    "acct_key",
    "item_key",
    "delete_acct",
    "delete_item",
    "reinsert_item",
    "bulk_update",
)


class Workload:
    """Writes transactions on ``connect()``'s connection (autocommit off) until ``stop`` or
    ``limit`` transactions, sleeping ``pause`` (a range, seconds) between them; ``seed`` fixes the
    statements, not the timing. ``counts`` tallies the statements of committed transactions that changed
    rows, ``rows`` the row changes they made (what the CDC sources must carry)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        seed: int,
        first_key: int,
        pause: tuple[float, float] = (0.0, 0.0),
        limit: int | None = None,
    ):
        self.connect = connect
        self.rng = random.Random(seed)
        self.next_key = first_key
        self.pause = pause
        self.limit = limit
        self.stop = threading.Event()
        self.committed = 0
        self.rolled_back = 0
        self.rows = 0
        self.counts: Counter = Counter()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # --- running ----------------------------------------------------------------------------

    def start(self) -> Workload:
        self._thread = threading.Thread(target=self._run, name="cdc-workload", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop, wait for the transaction under way, and raise what the writer met."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the workload failed after {self.committed} transactions") from self.error

    def _run(self) -> None:
        try:
            conn = self.connect()
            try:
                while not self.stop.is_set() and (self.limit is None or self.committed < self.limit):
                    self.transaction(conn)
                    if self.pause[1] > 0:
                        time.sleep(self.rng.uniform(*self.pause))
            finally:
                conn.close()
        except BaseException as error:  # reported by finish()
            self.error = error

    def transaction(self, conn: Any) -> None:
        cur = conn.cursor()
        changed = {}
        for kind in [self.rng.choice(KINDS) for _ in range(self.rng.randint(1, 5))]:
            changed[kind] = changed.get(kind, 0) + getattr(self, kind)(cur)
        rows = sum(changed.values())
        if self.rng.random() < 0.05:
            conn.rollback()
            self.rolled_back += 1
        else:
            conn.commit()
            self.committed += 1
            self.rows += rows
            self.counts.update(kind for kind, n in changed.items() if n)
        cur.close()

    def seed(self, conn: Any, accounts: int, item_inserts: int) -> None:
        """The rows there before the pipeline first reads the tables, in one transaction."""
        cur = conn.cursor()
        for _ in range(accounts):
            self.insert_acct(cur)
        for _ in range(item_inserts):
            self.insert_items(cur)
        conn.commit()
        cur.close()

    # --- statements: each returns the rows it changed ---------------------------------------

    def _key(self) -> int:
        self.next_key += 1
        return self.next_key

    def _pick(self, cur: Any, table: str, where: str = "TRUE") -> int | None:
        """An existing key of ``table`` (the first at or above a random one), None when none is."""
        cur.execute(f"SELECT id FROM {table} WHERE {where} AND id >= %s ORDER BY id LIMIT 1", [self._below()])
        row = cur.fetchone()
        if row is None:
            cur.execute(f"SELECT id FROM {table} WHERE {where} ORDER BY id LIMIT 1")
            row = cur.fetchone()
        return None if row is None else int(row[0])

    def _below(self) -> int:
        return self.rng.randint(0, self.next_key)

    def _note(self) -> str | None:
        roll = self.rng.random()
        if roll < 0.4:
            return self.rng.randbytes(BIG // 2).hex()  # random: it does not compress below the TOAST threshold
        return None if roll < 0.6 else f"n{self.rng.randint(0, 99)}"

    def _item(self, key: int, acct: int | None) -> list[Any]:
        return [key, acct, self.rng.choice([None, *range(1, 10)]), self.rng.choice([None, "red", "blue"])]

    def insert_acct(self, cur: Any) -> int:
        balance = f"{self.rng.randint(-10_000, 10_000) / 100:.2f}"
        cur.execute(
            "INSERT INTO acct VALUES (%s, %s, %s, %s)", [self._key(), self.rng.choice(OWNERS), balance, self._note()]
        )
        return 1

    def insert_items(self, cur: Any) -> int:
        acct = self._pick(cur, "acct")
        values = [v for _ in range(self.rng.randint(1, 4)) for v in self._item(self._key(), acct)]
        cur.execute("INSERT INTO item VALUES " + ", ".join(["(%s, %s, %s, %s)"] * (len(values) // 4)), values)
        return len(values) // 4

    def acct_to_null(self, cur: Any) -> int:
        return _changed(cur, "UPDATE acct SET owner = NULL, note = NULL WHERE id = %s", [self._pick(cur, "acct")])

    def item_to_null(self, cur: Any) -> int:
        return _changed(cur, "UPDATE item SET qty = NULL, tag = NULL WHERE id = %s", [self._pick(cur, "item")])

    def toast_unchanged(self, cur: Any) -> int:
        """An update of a row with a large note that leaves the note as it is."""
        key = self._pick(cur, "acct", f"length(note) >= {BIG}")
        return _changed(
            cur, "UPDATE acct SET balance = balance + 1, owner = %s WHERE id = %s", [self.rng.choice(OWNERS), key]
        )

    def toast_changed(self, cur: Any) -> int:
        return _changed(cur, "UPDATE acct SET note = %s WHERE id = %s", [self._note(), self._pick(cur, "acct")])

    def acct_key(self, cur: Any) -> int:
        return _changed(cur, "UPDATE acct SET id = %s WHERE id = %s", [self._key(), self._pick(cur, "acct")])

    def item_key(self, cur: Any) -> int:
        return _changed(
            cur,
            "UPDATE item SET id = %s, qty = %s WHERE id = %s",
            [self._key(), self.rng.randint(1, 9), self._pick(cur, "item")],
        )

    def delete_acct(self, cur: Any) -> int:
        return _changed(cur, "DELETE FROM acct WHERE id = %s", [self._pick(cur, "acct")])

    def delete_item(self, cur: Any) -> int:
        return _changed(cur, "DELETE FROM item WHERE id = %s", [self._pick(cur, "item")])

    def reinsert_item(self, cur: Any) -> int:
        """A key deleted and inserted again, with other values, in one transaction."""
        key = self._pick(cur, "item")
        if key is None:
            return 0
        deleted = _changed(cur, "DELETE FROM item WHERE id = %s", [key])
        cur.execute("INSERT INTO item VALUES (%s, %s, %s, %s)", self._item(key, self._pick(cur, "acct")))
        return deleted + 1

    def bulk_update(self, cur: Any) -> int:
        """Every item of one account, several rows by one statement."""
        return _changed(cur, "UPDATE item SET qty = COALESCE(qty, 0) + 1 WHERE acct = %s", [self._pick(cur, "acct")])


def _changed(cur: Any, sql: str, params: list[Any]) -> int:
    """Run ``sql``; the rows it changed (psycopg's execute returns the cursor, PyMySQL's a count)."""
    cur.execute(sql, params)
    return max(cur.rowcount, 0)
