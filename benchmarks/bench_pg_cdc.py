"""The postgres-cdc source: row changes per second committed (issue 59, part 1).

    python benchmarks/bench_pg_cdc.py                    # 100,000-row snapshot, 3 epochs of 50,000 changes
    python benchmarks/bench_pg_cdc.py --quick            # 10,000-row snapshot, 1 epoch of 10,000 changes
    python benchmarks/bench_pg_cdc.py --changes 200000   # bigger epochs

Against the PostgreSQL server at 127.0.0.1:5432 (user postgres, wal_level=logical), in a database of
its own (``epochal_cdc_bench``, dropped with its slot at the end). One TABLE t(id BIGINT PRIMARY KEY,
k BIGINT, v DECIMAL(12,2), note STRING) FROM a postgres-cdc source. First the snapshot epoch (N rows
staged and read), then per repeat: M row changes upstream (updates of existing ids, inserts, deletes,
1,000 per transaction), then one epoch (inject, the source step, commit), timed. Printed: the
snapshot epoch's time and rows/s, and per change epoch its time, the part spent peeking and decoding
the WAL on the driver (``records``), and the changes committed per second. The table is checked
against ``SELECT count(*), sum(k)`` upstream at the end.

The snapshot against Spark's own reader: the staging of the snapshot (the plan of the first epoch:
key chunks read as Spark tasks into Parquet) is timed against ``spark.read.jdbc`` of the same table
partitioned by key (numPartitions = the session's cores), on the same SparkSession, both read into
the void (``noop``) and written as Parquet; the ratios are printed (issue 59: at most 2x), for the
first staging (cold Python workers) and, with --repeats 0, for the table staged again in each of
--rounds rounds beside that round's JDBC reads (best of, and the median of the rounds' ratios). It needs
the PostgreSQL JDBC driver at /usr/share/java/postgresql.jar (``apt-get install -y
libpostgresql-jdbc-java``), or --jdbc-jar; without it the comparison is skipped.

    python benchmarks/bench_pg_cdc.py --rows 1000000 --repeats 0   # the snapshot ratio at 1M rows
    python benchmarks/bench_pg_cdc.py --rows 1000000 --repeats 0 --chunk-rows 250000   # other chunks
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
from harness import fmt_s, log, median, table

DB = "epochal_cdc_bench"
ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
UPSTREAM = f"host=127.0.0.1 port=5432 user=postgres dbname={DB}"
SLOT = "epochal_cdc_bench"
PIPELINE = f"""
CREATE SOURCE shop WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '5432',
  username = 'postgres', database.name = '{DB}', slot.name = '{SLOT}'{{chunk_rows}});
CREATE TABLE t (id BIGINT, k BIGINT, v DECIMAL(12,2), note STRING, PRIMARY KEY (id)) FROM shop TABLE 'public.t';
"""


def drop_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", [DB])
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def change(conn: Any, first_new: int, count: int, existing: int) -> None:
    """``count`` row changes: 60% updates of existing ids, 30% inserts, 10% deletes, 1,000 a transaction."""
    done = 0
    while done < count:
        n = min(1000, count - done)
        updates, inserts = int(n * 0.6), int(n * 0.3)
        deletes = n - updates - inserts
        with conn.transaction():
            base = (first_new + done) % max(existing, 1)
            conn.execute(
                "UPDATE t SET k = k + 1, note = 'u' WHERE id >= %s::bigint AND id < %s::bigint", [base, base + updates]
            )
            conn.execute(
                "INSERT INTO t SELECT g, g %% 100, g / 7.0, 'n' FROM generate_series(%s::bigint, %s::bigint) g",
                [first_new + done, first_new + done + inserts - 1],
            )
            conn.execute(
                "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE id < %s ORDER BY id DESC LIMIT %s)",
                [first_new, deletes],
            )
        done += n


def compare_with_jdbc(
    spark: Any, rows: int, staging_s: float, root: Path, stage_again: Callable[[], float] | None, rounds: int
) -> dict[str, Any]:
    """``spark.read.jdbc`` of the table partitioned by key, into the void and into Parquet, timed
    (best of ``rounds``) against the snapshot's first staging; prints the ratios. With
    ``stage_again`` (the staging once more, timed) each round also stages the table again, right
    before its JDBC reads, so that a round's three figures share the machine's load of the moment
    (other work on a shared machine moves each by up to 2x): the ratios of the best stagings and the
    median of the rounds' own ratios are printed too."""
    cores = spark.sparkContext.defaultParallelism
    reader = (
        spark.read.format("jdbc")
        .option("url", f"jdbc:postgresql://127.0.0.1:5432/{DB}")
        .option("driver", "org.postgresql.Driver")
        .option("user", "postgres")
        .option("dbtable", "t")
        .option("partitionColumn", "id")
        .option("lowerBound", "0")
        .option("upperBound", str(rows))
        .option("numPartitions", str(cores))
        .option("fetchsize", "50000")
    )
    noop, parquet, again = [], [], []
    for i in range(rounds):
        if stage_again is not None:
            again.append(stage_again())
        noop.append(harness.timed(lambda: reader.load().write.format("noop").mode("overwrite").save())[0])
        target = str(root / f"jdbc-{i}")
        parquet.append(harness.timed(lambda target=target: reader.load().write.parquet(target))[0])
        if again:
            log(
                f"round {i + 1}: staging {again[-1]:.2f} s, JDBC read {noop[-1]:.2f} s, read+Parquet "
                f"{parquet[-1]:.2f} s: ratio {again[-1] / noop[-1]:.2f}x / {again[-1] / parquet[-1]:.2f}x"
            )
    found: dict[str, Any] = {
        "cores": cores,
        "jdbc_noop_s": min(noop),
        "jdbc_parquet_s": min(parquet),
        "staging_s": staging_s,
        "rounds": {"staging_s": again, "jdbc_noop_s": noop, "jdbc_parquet_s": parquet},
    }
    found["ratio_noop"] = staging_s / found["jdbc_noop_s"]
    found["ratio_parquet"] = staging_s / found["jdbc_parquet_s"]
    log(
        f"first snapshot staging (cold Python workers) {staging_s:.2f} s vs spark.read.jdbc ({cores} partitions "
        f"by key, best of {rounds}) {found['jdbc_noop_s']:.2f} s read, {found['jdbc_parquet_s']:.2f} s "
        f"read+Parquet: ratio {found['ratio_noop']:.2f}x / {found['ratio_parquet']:.2f}x"
    )
    if again:
        best = min(again)
        found.update(
            staging_best_s=best,
            ratio_noop_best=best / found["jdbc_noop_s"],
            ratio_parquet_best=best / found["jdbc_parquet_s"],
            ratio_noop_median=median([s / n for s, n in zip(again, noop, strict=True)]),
            ratio_parquet_median=median([s / p for s, p in zip(again, parquet, strict=True)]),
        )
        log(
            f"staged again, best of {rounds} {best:.2f} s: ratio {found['ratio_noop_best']:.2f}x / "
            f"{found['ratio_parquet_best']:.2f}x; the rounds' median ratio {found['ratio_noop_median']:.2f}x / "
            f"{found['ratio_parquet_median']:.2f}x"
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the snapshot")
    parser.add_argument("--changes", type=int, default=50_000, help="row changes per epoch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="--rows 10000 --changes 10000 --repeats 1")
    parser.add_argument("--rounds", type=int, default=2, help="JDBC reads (and, with --repeats 0, stagings)")
    parser.add_argument("--chunk-rows", type=int, help="the source's snapshot.chunk.rows (default: its default)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--jdbc-jar", default="/usr/share/java/postgresql.jar", help="PostgreSQL JDBC driver")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_pg_cdc-<time>.json)")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.changes, args.repeats = 10_000, 10_000, 1
    log(harness.header("postgres-cdc: row changes per second committed"))

    import psycopg
    from inprocess import runtime_for

    from epochal.spark.session import build_spark_session

    conf = {"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"}
    jdbc = Path(args.jdbc_jar).exists()
    if jdbc:
        conf["spark.jars"] = args.jdbc_jar  # the benchmark's comparison only, not the product
    spark = build_spark_session(master="local[2]", app_name="bench_pg_cdc", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    drop_database()
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {DB}")
    results: dict[str, Any] = {}
    try:
        with harness.workdir("bench_pg_cdc", args.keep) as root, psycopg.connect(UPSTREAM, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, k bigint, v numeric(12,2), note text)")
            conn.execute(
                "INSERT INTO t SELECT g, g %% 100, g / 7.0, 'x' FROM generate_series(0, %s) g", [args.rows - 1]
            )
            pipeline = Path(root) / "pipeline"
            pipeline.mkdir()
            chunk_rows = f", snapshot.chunk.rows = '{args.chunk_rows}'" if args.chunk_rows else ""
            # the whole snapshot in the first epoch (by default it is spread over epochs of 1M rows)
            chunk_rows += f", snapshot.epoch.rows = '{max(args.rows, 1)}'"
            (pipeline / "cdc.sql").write_text(PIPELINE.format(chunk_rows=chunk_rows))
            runtime = runtime_for(Path(root) / "home", pipeline, spark, {"EPOCHAL_DRIVER_ROWS": "0"})

            staging: list[float] = []

            def epoch() -> tuple[float, float]:
                started = time.perf_counter()
                record, _ = runtime.start_epoch(None, None)
                staging.append(time.perf_counter() - started)
                r = runtime.controller.offsets(record.epoch, "t")[0]  # the WAL's (then the snapshot's)
                decode_started = time.perf_counter()
                if r.start:
                    runtime.connector("t").records(r.end, r.start)
                decoding = time.perf_counter() - decode_started
                runtime.run_source(record.epoch, "t")
                runtime.commit(record.epoch)
                return time.perf_counter() - started - decoding, decoding

            # Python workers started and Spark warmed up first, as for the JDBC read's best of two
            spark.range(2, numPartitions=2).mapInArrow(lambda batches: batches, "id long").collect()
            connector = runtime.connector("t")
            take = connector._stage
            snapshot_only: list[float] = []
            taken_with: list[tuple] = []

            def timed_take(*a: Any) -> Any:  # the chunks' staging, without the slot's creation
                seconds, taken = harness.timed(lambda: take(*a))
                snapshot_only.append(seconds)
                taken_with.append(a)
                return taken

            connector._stage = timed_take
            snapshot_s, _ = epoch()
            log(
                f"snapshot epoch: {args.rows:,} rows in {snapshot_s:.2f} s; plan {staging[0]:.2f} s, of which "
                f"the snapshot's staging {snapshot_only[0]:.2f} s (the rest: the slot and the publication)"
            )
            if jdbc:
                stage_again = None
                if not args.repeats:
                    # a new exported snapshot of the same rows, every chunk read again, in Python
                    # workers that imported the connector already. Not before change epochs: they
                    # read on the chunk records this rewrites
                    def stage_again() -> float:
                        pending, _ = taken_with[0]  # every chunk again, each record replaced
                        connector._stage(pending, {c.index for c in pending})
                        return snapshot_only[-1]

                found = compare_with_jdbc(spark, args.rows, snapshot_only[0], Path(root), stage_again, args.rounds)
                results["jdbc"] = found
            rows: list[list[str]] = []
            per_s: list[float] = []
            next_id = args.rows
            for i in range(args.repeats):
                change(conn, next_id, args.changes, args.rows)
                next_id += args.changes
                seconds, decoding = epoch()
                per_s.append(args.changes / seconds)
                rows.append([str(i + 1), f"{args.changes:,}", fmt_s(seconds), fmt_s(decoding), f"{per_s[-1]:,.0f}"])
                log(f"epoch {i + 1}: {args.changes:,} changes in {seconds:.2f} s (peek+decode {decoding:.2f} s)")
            want = conn.execute("SELECT count(*), sum(k) FROM t").fetchone()
            got = runtime.state("t").selectExpr("count(*)", "sum(k)").collect()[0]
            if tuple(got) != tuple(want):
                raise SystemExit(f"the CDC table differs from upstream: {tuple(got)} != {tuple(want)}")
            if rows:
                print(table(["epoch", "changes", "epoch s", "peek+decode s", "changes/s"], rows), flush=True)
                log(f"median: {median(per_s):,.0f} row changes/s committed")
            log(f"snapshot {args.rows / snapshot_s:,.0f} rows/s")
            results.update(
                {"snapshot_s": snapshot_s, "staging_s": staging[0], "changes_per_s": per_s, "load": harness.load_now()}
            )
    finally:
        drop_database()
        spark.stop()
    out_file = harness.save(harness.result_path("bench_pg_cdc", args.json), {"args": vars(args), "results": results})
    log(f"result: {out_file}")


if __name__ == "__main__":
    main()
