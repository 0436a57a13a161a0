"""What a meta-store transaction costs, by how the backend holds its connection: 24 controller
transactions (the reads and writes of an epoch) timed A B A B on each backend.

    python benchmarks/bench_meta_txn.py                    # DuckDB and the local PostgreSQL; under a minute
    python benchmarks/bench_meta_txn.py --postgres none --reps 9

duckdb      on a DuckDB meta store holding a few committed epochs: A as DuckDBBackend does them
            (attach the file to the process's in-memory DuckDB, one transaction, checkpoint, detach),
            B on one connection kept open for all 24 (what keeping a connection would save; it would
            lock every other process out of the file meanwhile).
postgresql  on a fresh database of the server --postgres names (created and dropped): A as
            PostgresBackend does them (connections kept between transactions), B connecting for each
            transaction, as the backend did before it kept them.

No Spark. The ratio is the median of the paired ratios A_i/B_i, after one untimed pair.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import harness
from harness import Comparison, log, median

from epochal.redaction import redact_url

#: The tables of the epoch benchmarks' pipeline (epoch_pipeline.py), as the controller knows them.
BENCH_TABLES = dict(sources=["bid"], views=["big_bids"], sinks=["big_bids_out"])


def committed_epochs(controller: Any, count: int) -> int:
    """Bootstrap ``controller``'s store and commit ``count`` epochs (every table collected, no data);
    the last one's number."""
    from epochal.checkpoint.records import Collected
    from epochal.connectors.base import SplitRange

    controller.recover(controller.epoch_log.recovery_reason() or "bootstrap", discard=lambda locations: None)
    for i in range(count):
        epoch = controller.epoch_log.inject(lambda source, starts, i=i: [SplitRange("0", 10 * i, 10 * i + 10)]).epoch
        for table in ("bid", "big_bids"):
            controller.epoch_log.collect(epoch, Collected(table, f"/loc/{table}/{epoch}"))
    return epoch


def bench_meta_store(root: Path, reps: int) -> Comparison:
    """A fixed mix of 24 meta-store transactions (reads and writes; an epoch took 24 before 49e96c5
    and 18 since), on a DuckDB meta store holding a few committed epochs: A as the DuckDB backend
    does them (attach the file to the process's host DuckDB, one transaction, checkpoint, detach;
    until b82d11b a new database per transaction), B on one connection kept open for all 24 (what a
    backend that keeps its connection for a run or a step would do, locking every other process out
    meanwhile)."""
    import duckdb

    from epochal.checkpoint.controller import CheckpointController
    from epochal.meta.backend import DuckDBBackend, _DuckCursor
    from epochal.settings import Settings

    class KeptOpenBackend(DuckDBBackend):
        con: Any = None

        def transaction(self, fn: Callable[[Any], Any]) -> Any:
            if self.con is None:
                self.con = duckdb.connect(str(self.path))
            self.con.execute("BEGIN TRANSACTION")
            try:
                result = fn(_DuckCursor(self.con))
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            self.con.execute("COMMIT")
            return result

        def close(self) -> None:
            if self.con is not None:
                self.con.close()
                self.con = None

    settings = Settings.from_env({"EPOCHAL_HOME": str(root / "duckdb-home")})
    tables = BENCH_TABLES
    per_txn = DuckDBBackend(root / "duckdb-home" / "meta.duckdb")
    kept = KeptOpenBackend(root / "duckdb-home" / "meta.duckdb")
    epoch = committed_epochs(CheckpointController(settings, backend=per_txn, **tables), 3)

    def one_epoch_of_transactions(backend: DuckDBBackend) -> float:
        seconds = transaction_mix(settings, tables, epoch, backend)
        if isinstance(backend, KeptOpenBackend):
            started = time.perf_counter()
            backend.close()  # closed before A runs again: an open handle would let A share the database
            seconds += time.perf_counter() - started
        return seconds

    comparison = Comparison("meta store", "A  attach + detach per transaction", "B  one connection kept open")
    for i in range(reps + 1):
        a = one_epoch_of_transactions(per_txn)
        b = one_epoch_of_transactions(kept)
        if i:
            comparison.a.append(a)
            comparison.b.append(b)
    return comparison


#: The tables of the benchmark pipeline, as the controller knows them.
BENCH_TABLES = dict(sources=["bid"], views=["big_bids"], sinks=["big_bids_out"])


def transaction_mix(settings: Any, tables: dict[str, list[str]], epoch: int, backend: Any) -> float:
    """Seconds for 24 meta-store transactions, reads and writes mixed as in an epoch."""
    from epochal.checkpoint.controller import CheckpointController

    started = time.perf_counter()
    controller = CheckpointController(settings, backend=backend, **tables)  # schema check: 1 txn
    for _ in range(4):  # 1 + 4 * 6 - 1 = 24 transactions
        controller.epoch_log.epoch(epoch)
        controller.epoch_log.offsets(epoch, "bid")
        controller.epoch_log.collected(epoch)
        backend.transaction(
            lambda cur: cur.execute("UPDATE epochs SET heartbeat_at = ? WHERE epoch = ?", [time.time(), epoch])
        )
        controller.epoch_log.committed_epoch()
    controller.epoch_log.in_flight()
    controller.epoch_log.in_flight()
    controller.epoch_log.in_flight()
    return time.perf_counter() - started


def bench_postgres_meta_store(admin_url: str, root: Path, reps: int) -> Comparison:
    """The same 24 transactions on a PostgreSQL meta store (a fresh database, one committed epoch):
    A as the backend does them (connections kept between transactions), B connecting for each one
    (what it did before it kept them)."""
    import uuid

    import psycopg

    from epochal.checkpoint.controller import CheckpointController
    from epochal.meta.backend import PostgresBackend
    from epochal.settings import Settings

    class ConnectPerTransaction(PostgresBackend):
        def _checkout(self) -> tuple[Any, bool]:
            return self._connect(), False  # never one from the pool A keeps

        def _checkin(self, conn: Any) -> None:
            conn.close()

    name = f"epochal_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))  # keeps the user, host and ?options
    try:
        settings = Settings.from_env({"EPOCHAL_HOME": str(root / "pg-home"), "EPOCHAL_META_URL": url})
        epoch = committed_epochs(CheckpointController(settings, **BENCH_TABLES), 1)
        kept, per_txn = PostgresBackend(url), ConnectPerTransaction(url)
        comparison = Comparison("postgres meta store", "A  connections kept", "B  connect per transaction")
        for i in range(reps + 1):
            a = transaction_mix(settings, BENCH_TABLES, epoch, kept)
            b = transaction_mix(settings, BENCH_TABLES, epoch, per_txn)
            if i:
                comparison.a.append(a)
                comparison.b.append(b)
        return comparison
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def render_postgres_meta_store(c: Comparison, admin_url: str) -> str:
    return "\n".join(
        [
            f"== PostgreSQL: 24 transactions on a fresh meta store ({redact_url(admin_url)})",
            c.render(),
            f"per transaction: A {1000 * median(c.a) / 24:.1f} ms, B {1000 * median(c.b) / 24:.1f} ms",
        ]
    )


def render_meta_store(c: Comparison) -> str:
    return "\n".join(
        [
            "== DuckDB: 24 transactions on a meta store holding 3 committed epochs",
            c.render(),
            f"per transaction: A {1000 * median(c.a) / 24:.1f} ms, B {1000 * median(c.b) / 24:.1f} ms",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="timed pairs a backend (default 5)")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL URL whose user may create databases (a fresh database, dropped after); 'none' skips it",
    )
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_meta_txn-<time>.json)")
    args = parser.parse_args(argv)
    log(harness.header("Meta-store transaction cost"))
    result: dict[str, Any] = {"args": vars(args)}
    reports = []
    with harness.workdir("bench_meta_txn") as root:
        log("DuckDB: attach per transaction against a connection kept open")
        c = bench_meta_store(root, args.reps)
        reports.append(render_meta_store(c))
        result["duckdb"] = c.to_json()
        if args.postgres != "none":
            import psycopg

            log("PostgreSQL: connections kept against connecting per transaction")
            try:
                c = bench_postgres_meta_store(args.postgres, root, args.reps)
                reports.append(render_postgres_meta_store(c, args.postgres))
                result["postgresql"] = c.to_json()
            except psycopg.OperationalError as exc:
                first = str(exc).strip().splitlines()[0]
                reports.append(f"== PostgreSQL: skipped: no server at {redact_url(args.postgres)} ({first}); "
                               "pass --postgres URL, or --postgres none")
    for report in reports:
        print()
        print(report)
    log(f"result: {harness.save(harness.result_path('bench_meta_txn', args.json), result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
