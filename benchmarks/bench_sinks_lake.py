"""Lake sink throughput: an epoch delivered to Delta Lake by the sink against Spark writing the same
rows as plain Parquet.

    python benchmarks/bench_sinks_lake.py                  # 1M rows, 2 writers, 5 timed pairs
    python benchmarks/bench_sinks_lake.py --rows 200000 --reps 2

Sink:     the coordinator's own path over an epoch's change files: ``run_writers`` (append-only:
          Spark's Parquet writer into a staging directory, files moved into the table uncommitted;
          upsert: ``mapInArrow`` writer tasks calling ``target.write``), then ``target.commit`` (one
          Delta commit with the application transaction). Timed: the Spark job plus the commit.
Baseline: ``spark.read.parquet(change files).drop('_weight').write.parquet(dir)`` of the same rows,
          same codec (zstd), a fresh directory each time.

Measured interleaved (sink, baseline, sink, ...) after one warm-up of each, on one SparkSession; the
ratio is the median of the per-pair ratios baseline_time / sink_time (the sink's share of Spark's
plain write speed; the target is >= 0.7). An upsert part (``--upsert``) times a batch that changes
10% of the keys of a table holding the rows, for information. Everything goes under a temp dir that is
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import harness
from harness import log

# The Python workers unpickle the target, so they must import this checkout's epochal (harness put
# it on PYTHONPATH), with this interpreter's packages (deltalake), not whatever `python3` is first on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

#: seconds of each delivery's check of the table's row rules (``target.check_rows``), in order
CHECKS: list[float] = []


def deliver(spark, files, schema, target, batch, writers: int) -> tuple[float, float, int]:
    """The coordinator's own path (epochal.sinks.spark_writers.run_writers over the batch's change
    files, the check of the table's row rules, then the target's commit): seconds for the writers'
    Spark job, for the check and the commit, files."""
    from epochal.sinks.spark_writers import run_writers

    start = time.perf_counter()
    results = run_writers(spark, target, batch, files, schema, writers)
    written = time.perf_counter()
    metadata = [r.metadata for r in results]
    target.check_rows(batch, metadata)
    checked = time.perf_counter()
    CHECKS.append(checked - written)
    target.commit(batch, metadata)
    return written - start, time.perf_counter() - written, sum(len(m["files"]) for m in metadata)


def change_files(frame, directory: Path) -> list[str]:
    """``frame`` (columns and _weight) written as an epoch's change files, as the warehouse holds them."""
    frame.write.mode("overwrite").parquet(str(directory))
    return sorted(str(p) for p in directory.glob("*.parquet"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=2, help="Spark tasks (= local cores used)")
    parser.add_argument("--reps", type=int, default=5, help="timed (sink, baseline) pairs")
    parser.add_argument("--upsert", action="store_true", help="also time an upsert batch changing 10%% of keys")
    parser.add_argument("--arrow-batch", type=int, default=10_000,
                        help="spark.sql.execution.arrow.maxRecordsPerBatch: rows per batch mapInArrow hands a writer")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--rules", action="store_true",
                        help="give the table a CHECK constraint (amount >= 0), which each delivery checks")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_sinks_lake-<time>.json)")
    args = parser.parse_args()
    log(harness.header("Delta Lake sink against a plain Parquet write"))
    with harness.workdir("bench_sinks_lake", args.keep) as root:
        return measure(args, root)


def measure(args: argparse.Namespace, root: Path) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable

    from epochal.sinks.base import BatchId
    from epochal.sinks.delta_sink import DeltaTarget
    from epochal.spark.session import build_spark_session

    spark = build_spark_session(master=f"local[{args.writers}]", app_name="bench-sinks-lake",
                                conf={"spark.sql.parquet.compression.codec": "zstd",
                                      "spark.ui.showConsoleProgress": "false",
                                      "spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch)})
    try:
        df = spark.range(0, args.rows, 1, args.writers).selectExpr(
            "id AS k", "concat('name-', CAST(id % 1000 AS STRING)) AS name", "CAST(id % 997 AS DOUBLE) * 1.5 AS amount",
            "CAST(1 AS BIGINT) AS _weight",
        ).cache()
        df.count()
        columns = ["k", "name", "amount"]
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

        spark_schema = StructType(
            [StructField("k", LongType()), StructField("name", StringType()), StructField("amount", DoubleType())]
        )
        files = change_files(df, root / "change")
        schema = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
        target = DeltaTarget("bench_out", {"location": str(root / "delta")}, columns, root, None)
        target.prepare_target(schema)
        if args.rules:
            DeltaTable(target.location).alter.add_constraint({"amount_not_negative": "amount >= 0"})

        epoch = 0
        sink_times, base_times, ratios, commits = [], [], [], []
        for rep in range(args.reps + 1):  # rep 0 warms up both paths
            epoch += 1
            write_s, commit_s, written = deliver(
                spark, files, spark_schema, target, BatchId("bench_out", epoch, epoch), args.writers
            )
            start = time.perf_counter()
            spark.read.parquet(*files).drop("_weight").write.mode("overwrite").parquet(str(root / f"plain-{rep}"))
            base_s = time.perf_counter() - start
            shutil.rmtree(root / f"plain-{rep}", ignore_errors=True)
            sink_s = write_s + commit_s
            label = "warm-up" if rep == 0 else f"pair {rep}"
            print(f"{label}: sink {sink_s:.2f}s (writers {write_s:.2f}s, commit {commit_s:.3f}s, {written} files), "
                  f"df.write.parquet {base_s:.2f}s", flush=True)
            if rep:
                sink_times.append(sink_s)
                base_times.append(base_s)
                ratios.append(base_s / sink_s)
                commits.append(commit_s)
        table = DeltaTable(target.location)
        assert table.transaction_version("bench_out") == epoch
        assert target.row_count() == args.rows * epoch

        sink_median, base_median = statistics.median(sink_times), statistics.median(base_times)
        ratio = statistics.median(ratios)
        print()
        print(f"rows per epoch      {args.rows:,} in {args.writers} Spark tasks, Arrow batches of {args.arrow_batch:,} "
              f"rows, {args.reps} timed pairs (medians)")
        print(f"Delta sink          {sink_median:.2f}s  {args.rows / sink_median:,.0f} rows/s "
              f"(commit {statistics.median(commits) * 1000:.0f} ms)")
        print(f"df.write.parquet    {base_median:.2f}s  {args.rows / base_median:,.0f} rows/s")
        print(f"row rules check     {statistics.median(CHECKS[1:]) * 1000:.0f} ms of the sink's time "
              f"({'one CHECK constraint' if args.rules else 'a table without rules: opening it to find none'})")
        print(f"ratio               {ratio:.2f}x of the plain write (target >= 0.7x)  "
              f"[pairs: {', '.join(f'{r:.2f}' for r in ratios)}]")
        result = {"args": vars(args), "sink_s": sink_times, "plain_write_s": base_times, "commit_s": commits,
                  "check_s": CHECKS[1:], "ratio": ratio}

        if args.upsert:
            keys = DeltaTarget("bench_up", {"location": str(root / "delta-upsert"), "type": "upsert",
                                            "primary_key": "k"}, columns, root, None)
            keys.prepare_target(schema)
            deliver(spark, files, spark_schema, keys, BatchId("bench_up", 1, 1), args.writers)
            # 10% of the keys: their old rows (weight -1) and new rows (+1)
            changed = df.where("k % 10 = 0")
            change = changed.withColumn("_weight", changed["_weight"] * -1).unionByName(
                changed.withColumn("amount", changed["amount"] + 1)).repartition(args.writers, "k")
            changed_files = change_files(change, root / "change-upsert")
            write_s, commit_s, written = deliver(
                spark, changed_files, spark_schema, keys, BatchId("bench_up", 2, 2), args.writers
            )
            print(f"upsert of {args.rows // 10:,} keys: writers (copy-on-write on the executors) {write_s:.2f}s, "
                  f"commit {commit_s:.2f}s ({written} new files)")
            assert keys.row_count() == args.rows
            result["upsert"] = {"writers_s": write_s, "commit_s": commit_s, "files": written}
    finally:
        spark.stop()
    log(f"result: {harness.save(harness.result_path('bench_sinks_lake', args.json), result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
