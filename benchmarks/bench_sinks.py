"""Sink benchmark: delivering one large epoch through a sink target, against Spark's own writer.

    python benchmarks/bench_sinks.py                          # PostgreSQL, 1M rows, 2 writers, 3 reps
    python benchmarks/bench_sinks.py --rows 200000 --writers 4 --reps 5

PostgreSQL part: one epoch of ``--rows`` rows (bigint, text, double, timestamp), written once as
the epoch's change files, is delivered two ways, interleaved, into fresh tables of a scratch
database on the local server:

* **Epochal**: the coordinator's own writer path, ``run_writers``: Spark reads the change files,
  spreads the rows over ``--writers`` vnode ranges, and each writer task runs
  ``PostgresTarget.write`` (COPY, then PREPARE TRANSACTION); the driver collects the writers'
  metadata and ``commit``s (COMMIT PREPARED each). Timed from the Spark action to the end of the
  commit: what a batch costs end to end, exactly once.
* **Spark JDBC**: ``df.write.jdbc(..., mode="append")`` with the PostgreSQL JDBC driver (Debian's
  libpostgresql-jdbc-java, ``/usr/share/java/postgresql.jar``) at Spark's defaults (batched INSERTs,
  one transaction per partition, no exactly-once).

Both read the same change files and write into empty tables (truncated between reps, outside the timing). It
prints each rep, the median rows/s of both and the median of the paired ratios (Epochal / JDBC).
The machine is shared and noisy, so the ratio of interleaved pairs is the figure to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import harness
from harness import log

from epochal.sinks.base import WEIGHT, BatchId
from epochal.sinks.postgres_sink import PostgresTarget

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def make_database() -> str:
    import psycopg

    name = f"epochal_bench_sinks_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True, connect_timeout=5) as conn:
        if int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) == 0:
            sys.exit("the local PostgreSQL has max_prepared_transactions = 0; .ci/run shows how to turn it on")
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"):
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_sql(database: str, statement: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def deliver_epochal(spark, files: list[str], schema, target: PostgresTarget, batch: BatchId, writers: int) -> int:
    """One batch through the coordinator's own writer path (``run_writers`` over the epoch's change
    files: vnode spread, writer tasks on the executors, metadata back), then the commit on the
    driver. Returns the rows the writers report."""
    from epochal.sinks.spark_writers import run_writers

    results = run_writers(spark, target, batch, files, schema, writers)
    if len(results) != writers:
        raise RuntimeError(f"expected {writers} writers' results, got {len(results)}")
    target.commit(batch, [r.metadata for r in results])
    return sum(r.rows for r in results)


def bench_postgres(spark, rows: int, writers: int, reps: int, change_dir: Path) -> dict:
    from pyspark.sql import functions as F

    database = make_database()
    print(f"== PostgreSQL: {rows:,} rows, {writers} writers, {reps} timed reps (database {database})")
    try:
        df = (
            spark.range(rows, numPartitions=writers)
            .select(
                F.col("id"),
                F.concat(F.lit("customer-"), (F.col("id") % 10_000).cast("string")).alias("name"),
                (F.col("id") * 1.25).alias("amount"),
                F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id")).alias("ts"),
                F.lit(1).cast("long").alias(WEIGHT),
            )
            .cache()
        )
        df.count()
        # the epoch's change files, as the warehouse holds them: both sides read these
        df.write.mode("overwrite").parquet(str(change_dir / "change"))
        files = sorted(str(f) for f in (change_dir / "change").glob("*.parquet"))
        plain = spark.read.parquet(*files).drop(WEIGHT)
        schema = plain.schema
        columns = plain.columns
        options = {"host": "127.0.0.1", "user": "postgres", "database": database, "table": "bench_epochal",
                   "type": "append-only", "writers": str(writers)}  # fmt: skip
        target = PostgresTarget("bench_sink", options, columns, change_dir, None)
        target.prepare_target(df.limit(0).toArrow().schema)
        url = f"jdbc:postgresql://127.0.0.1:5432/{database}"
        jdbc_props = {"user": "postgres", "driver": "org.postgresql.Driver"}

        def epochal_once(epoch: int) -> float:
            run_sql(database, "TRUNCATE bench_epochal, _epochal_sink_progress")
            started = time.perf_counter()
            batch = BatchId("bench_sink", epoch, epoch, 1, uuid.uuid4().hex[:6])
            written = deliver_epochal(spark, files, schema, target, batch, writers)
            elapsed = time.perf_counter() - started
            if written != rows or run_sql(database, "SELECT count(*) FROM bench_epochal")[0][0] != rows:
                raise RuntimeError(f"the sink delivered {written} rows, expected {rows}")
            return elapsed

        def jdbc_once() -> float:
            if run_sql(database, "SELECT to_regclass('bench_jdbc') IS NOT NULL")[0][0]:
                run_sql(database, "TRUNCATE bench_jdbc")
            started = time.perf_counter()
            plain.write.jdbc(url, "bench_jdbc", mode="append", properties=jdbc_props)
            elapsed = time.perf_counter() - started
            if run_sql(database, "SELECT count(*) FROM bench_jdbc")[0][0] != rows:
                raise RuntimeError("Spark JDBC wrote a different number of rows")
            return elapsed

        print("warm-up (not timed) ...", flush=True)
        epochal_once(1)
        jdbc_once()
        pairs = []
        for rep in range(reps):
            # alternate which goes first, so neither always runs on the warmer cache
            if rep % 2 == 0:
                e, j = epochal_once(rep + 2), jdbc_once()
            else:
                j, e = jdbc_once(), epochal_once(rep + 2)
            pairs.append((e, j))
            print(f"rep {rep + 1}: Epochal {rows / e:>10,.0f} rows/s ({e:.2f} s)   "
                  f"Spark JDBC {rows / j:>10,.0f} rows/s ({j:.2f} s)   ratio {j / e:.2f}x", flush=True)  # fmt: skip
        df.unpersist()
    finally:
        drop_database(database)
    result = {
        "rows": rows,
        "writers": writers,
        "reps": reps,
        "epochal_rows_per_s": statistics.median(rows / e for e, _ in pairs),
        "jdbc_rows_per_s": statistics.median(rows / j for _, j in pairs),
        "ratio": statistics.median(j / e for e, j in pairs),
    }
    print(
        f"PostgreSQL: Epochal sink {result['epochal_rows_per_s']:,.0f} rows/s, Spark JDBC "
        f"{result['jdbc_rows_per_s']:,.0f} rows/s: Epochal / JDBC = {result['ratio']:.2f}x (median of paired "
        f"ratios; target >= 0.5x)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2, help="writer tasks (Spark partitions)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="postgres", help="comma-separated parts: postgres")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_sinks-<time>.json)")
    args = parser.parse_args()
    if not JDBC_JAR.exists():
        sys.exit(f"{JDBC_JAR} is missing: apt-get install -y libpostgresql-jdbc-java")

    from epochal.spark.session import build_spark_session

    # The writers run in Spark's Python workers, which import epochal: the same interpreter, and the
    # repo (harness put it on PYTHONPATH).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log(harness.header("PostgreSQL sink against Spark's JDBC writer"))

    spark = build_spark_session(
        master=args.master,
        app_name="epochal-bench-sinks",
        conf={"spark.jars": str(JDBC_JAR), "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    result = {"args": vars(args)}
    try:
        parts = {p.strip() for p in args.only.split(",")}
        if "postgres" in parts:
            with harness.workdir("bench_sinks") as root:
                result["postgres"] = bench_postgres(spark, args.rows, args.writers, args.reps, root)
    finally:
        spark.stop()
    log(f"result: {harness.save(harness.result_path('bench_sinks', args.json), result)}")


if __name__ == "__main__":
    main()
