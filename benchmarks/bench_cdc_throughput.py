"""postgres-cdc and mysql-cdc end to end: row changes per second committed (issue 59, item 5).

    python benchmarks/bench_cdc_throughput.py                 # 2 repeats of 1,500 transactions per server
    python benchmarks/bench_cdc_throughput.py --quick         # 1 repeat of 300 transactions
    python benchmarks/bench_cdc_throughput.py --only postgres

The writer of tests/connectors/test_cdc_workload.py (tests/connectors/cdc_workload.py: multi-statement
transactions over two tables, inserts, updates to NULL, key changes, deletes, 10,000-character notes)
against the PostgreSQL server at 127.0.0.1:5432 and the MariaDB server at 127.0.0.1:3306, each in a
database of its own (``epochal_cdc_tput``, dropped at the end). First the snapshot epoch; then per
repeat the writer commits N transactions as fast as it can (the baseline: the rate upstream
commits row changes, on the same machine), then one epoch (inject, both tables' source steps, commit)
commits them in Epochal, timed. Printed per server and repeat: the row changes, the writer's rate,
the epoch's rate (row changes per second committed) and their ratio. The CDC tables are checked
against ``SELECT *`` upstream at the end.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import harness
from harness import fmt_s, log, median, table

DB = "epochal_cdc_tput"
SLOT = "epochal_cdc_tput"
SOURCES = {
    "postgres": f"""CREATE SOURCE up WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
  username = 'postgres', database.name = '{DB}', slot.name = '{SLOT}');""",
    "mariadb": f"""CREATE SOURCE up WITH (connector = 'mysql-cdc', hostname = '127.0.0.1', port = '3306',
  username = 'root', database.name = '{DB}', server.id = '5488');""",
}


def upstream(kind: str) -> tuple[Any, Any, Any]:
    """(connect for the writer, rows of a query, drop) for a fresh database on ``kind``'s server."""
    from tests.connectors import cdc_oracle as oracle
    from tests.connectors.cdc_workload import MYSQL_DDL, PG_DDL

    if kind == "postgres":
        import psycopg

        oracle.create_pg_database(DB)
        with psycopg.connect(oracle.pg_dsn(DB), autocommit=True) as conn:
            for statement in PG_DDL:
                conn.execute(statement)

        def pg_rows(query: str) -> Any:
            with psycopg.connect(oracle.pg_dsn(DB)) as conn:
                return oracle.pg_rows(conn, query)

        return (lambda: psycopg.connect(oracle.pg_dsn(DB))), pg_rows, (lambda: oracle.drop_pg_database(DB))

    def run(*statements: str) -> None:
        conn = oracle.mysql_connect()
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        conn.close()

    run(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}", f"USE {DB}", *MYSQL_DDL)

    def writer() -> Any:
        conn = oracle.mysql_connect(DB)
        conn.autocommit(False)
        return conn

    def mysql_rows(query: str) -> Any:
        conn = oracle.mysql_connect(DB)
        with conn.cursor() as cur:
            found = oracle.mysql_rows(cur, query)
        conn.close()
        return found

    return writer, mysql_rows, (lambda: run(f"DROP DATABASE IF EXISTS {DB}"))


def measure(kind: str, spark: Any, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from inprocess import runtime_for

    from tests.connectors.cdc_oracle import state_rows
    from tests.connectors.cdc_workload import ACCT_COLUMNS, ITEM_COLUMNS, TABLES_SQL, Workload

    connect, rows_of, drop = upstream(kind)
    try:
        pipeline = root / kind / "pipeline"
        pipeline.mkdir(parents=True)
        names = ("public.acct", "public.item") if kind == "postgres" else (f"{DB}.acct", f"{DB}.item")
        (pipeline / "cdc.sql").write_text(SOURCES[kind] + TABLES_SQL.format(source="up", acct=names[0], item=names[1]))
        workload = Workload(connect, seed=59, first_key=0)
        conn = connect()
        workload.seed(conn, accounts=200, item_inserts=300)
        runtime = runtime_for(root / kind / "home", pipeline, spark, {"EPOCHAL_DRIVER_ROWS": "0"})
        runtime.recover("bootstrap")

        def epoch() -> float:
            started = time.perf_counter()
            record, _ = runtime.start_epoch(None, None)
            for source in ("acct", "item"):
                runtime.run_source(record.epoch, source)
            runtime.commit(record.epoch)
            return time.perf_counter() - started

        snapshot_s = epoch()
        log(f"{kind}: snapshot epoch {snapshot_s:.2f} s")
        repeats = []
        for i in range(args.repeats):
            rows_before, started = workload.rows, time.perf_counter()
            for _ in range(args.transactions):
                workload.transaction(conn)
            write_s = time.perf_counter() - started
            changes = workload.rows - rows_before
            epoch_s = epoch()
            repeats.append({"changes": changes, "write_s": write_s, "epoch_s": epoch_s})
            log(f"{kind} {i + 1}: {changes:,} row changes written in {write_s:.2f} s, committed in {epoch_s:.2f} s")
        conn.close()
        for table_name, query in (("acct", ACCT_COLUMNS), ("item", ITEM_COLUMNS)):
            if state_rows(runtime, table_name) != rows_of(query):
                raise SystemExit(f"{kind}: CDC table {table_name} differs from upstream")
        runtime.close()
        return {"snapshot_s": snapshot_s, "repeats": repeats}
    finally:
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=1500, help="transactions per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=sorted(SOURCES), help="one server only")
    parser.add_argument("--quick", action="store_true", help="--transactions 300 --repeats 1")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_cdc_throughput-<time>.json)")
    args = parser.parse_args()
    if args.quick:
        args.transactions, args.repeats = 300, 1
    log(harness.header("CDC end to end: row changes per second committed, beside the writer's own rate"))

    from epochal.spark.session import build_spark_session

    spark = build_spark_session(
        master="local[2]",
        app_name="bench_cdc_throughput",
        conf={"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    try:
        with harness.workdir("bench_cdc_throughput", args.keep) as root:
            for kind in [args.only] if args.only else sorted(SOURCES, reverse=True):
                results[kind] = measure(kind, spark, Path(root), args)
                for i, r in enumerate(results[kind]["repeats"]):
                    written, committed = r["changes"] / r["write_s"], r["changes"] / r["epoch_s"]
                    rows.append(
                        [kind, str(i + 1), f"{r['changes']:,}", fmt_s(r["write_s"]), f"{written:,.0f}"]
                        + [fmt_s(r["epoch_s"]), f"{committed:,.0f}", f"{committed / written:.2f}"]
                    )
                per_s = [r["changes"] / r["epoch_s"] for r in results[kind]["repeats"]]
                log(f"{kind}: median {median(per_s):,.0f} row changes/s committed")
    finally:
        spark.stop()
    print(
        table(["server", "repeat", "row changes", "write s", "written/s", "epoch s", "committed/s", "ratio"], rows),
        flush=True,
    )
    results["load"] = harness.load_now()
    out_file = harness.save(
        harness.result_path("bench_cdc_throughput", args.json), {"args": vars(args), "results": results}
    )
    log(f"result: {out_file}")


if __name__ == "__main__":
    main()
