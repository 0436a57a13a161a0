"""Where a snapshot backfill's range goes beyond Spark's own aggregate-and-write (issue 15, goal 6):
the kept MIN/MAX values of a partial aggregate, and the vnode layout of what it writes.

    python benchmarks/bench_snapshot_layout.py              # 2M rows, 100,000 groups
    python benchmarks/bench_snapshot_layout.py --rows 10000000 --reps 2

One local Spark session, one Parquet input of --rows rows ``(id, k, v, note)``; each variant reads
it, aggregates by k (count, sum, min, max) and writes the result, --reps times (the first run of
each warms Spark up; the best is reported), in one run, as a ratio to the first variant:

1. Spark's plain ``groupBy(k).agg(...)`` written to one directory (the baseline bench_backfill uses);
2. the same written in Epochal's snapshot layout: one directory per vnode of k (256);
3. Epochal's bulk path for a backfill range of the partial aggregate (``partial_inserts``: the kept
   MIN/MAX values as arrays beside the aggregate), to one directory;
4. that, in the snapshot layout: what a backfill range of the view's stage wrote until runs of
   vnodes shared a directory;
5. that, in the layout a snapshot of the range's rows gets now (``vnodes_per_directory``: a run of
   vnodes per directory, sized by the rows read).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import harness
from harness import log

VIEW = "SELECT k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM t GROUP BY k"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--groups", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", help="result file (default benchmarks/results/bench_snapshot_layout-<time>.json)")
    args = p.parse_args(argv)
    log(harness.header("A snapshot range's write, taken apart"))
    with harness.workdir("bench_snapshot_layout") as root:
        best = measure(args, root)
    base = next(iter(best.values()))
    print()
    print(f"== {args.rows:,} rows into {args.groups:,} groups, best of {args.reps}, local[*]")
    for label, seconds in best.items():
        print(f"{label:<52} {seconds:6.2f}s  {seconds / base:5.2f}x  {args.rows / seconds:>12,.0f} rows/s")
    log(f"result: {harness.save(harness.result_path('bench_snapshot_layout', args.json), {'best_s': best})}")
    return 0


def measure(args: argparse.Namespace, root: Path) -> dict[str, float]:

    from pyspark.sql import functions as F

    from epochal.incremental.partial import partial_inserts
    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime
    from epochal.settings import Settings
    from epochal.spark.session import build_spark_session
    from epochal.storage.vnode import VNODE, vnode_column, vnodes_per_directory, write_laid_out

    spark = build_spark_session("local[*]", "bench-snapshot-layout", {"spark.driver.memory": "4g"})
    try:
        source = str(root / "t")
        spark.range(args.rows).select(
            F.col("id"),
            (F.abs(F.xxhash64("id")) % args.groups).alias("k"),
            (F.abs(F.xxhash64("id", F.lit(8))) % 1_000_000).alias("v"),
            F.concat(F.lit("n"), (F.col("id") % 997).cast("string")).alias("note"),
        ).write.parquet(source)
        pipeline_dir = root / "pipeline"
        pipeline_dir.mkdir()
        (pipeline_dir / "p.sql").write_text(
            f"CREATE TABLE t (id BIGINT, k BIGINT, v BIGINT, note STRING) WITH (connector = 'log', "
            f"path = '{root / 'log'}', format = 'json');\nCREATE MATERIALIZED VIEW agg AS {VIEW};\n"
        )
        pipeline = load_pipeline(pipeline_dir)
        stage = pipeline.views["agg__stage1"]  # the partial aggregate; agg itself projects it
        settings = Settings.from_env({"EPOCHAL_HOME": str(root / "home"), "EPOCHAL_PIPELINE": str(pipeline_dir)})
        runtime = EpochRuntime(settings, pipeline, lambda: spark)
        declared, key = runtime.query_schema(stage.name), runtime.distribution_key(stage.name)

        def plain():  # noqa: ANN202
            rows = spark.read.parquet(source)
            return rows.groupBy("k").agg(
                F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"), F.min("v").alias("lo"), F.max("v").alias("hi")
            )

        def kept():  # noqa: ANN202
            return partial_inserts(spark, stage.plan, stage.columns, {"t": spark.read.parquet(source)}, declared)

        def one_dir(rows, out: str) -> None:  # noqa: ANN001
            rows.write.parquet(out)

        def vnode_dirs(rows, out: str) -> None:  # noqa: ANN001
            rows.withColumn(VNODE, vnode_column(rows.schema, key)).repartition(F.col(VNODE)).write.partitionBy(
                VNODE
            ).parquet(out)

        width = vnodes_per_directory(args.rows)

        def runs_of_vnodes(rows, out: str) -> None:  # noqa: ANN001
            write_laid_out(rows, key, width, out)

        variants = [
            ("Spark groupBy -> one directory", plain, one_dir),
            ("Spark groupBy -> 256 vnode directories", plain, vnode_dirs),
            ("partial_inserts (kept MIN/MAX) -> one directory", kept, one_dir),
            ("partial_inserts -> 256 vnode directories (a range)", kept, vnode_dirs),
            (f"partial_inserts -> runs of {width} vnodes (a range now)", kept, runs_of_vnodes),
        ]
        best = {}
        for label, rows, write in variants:
            times = []
            for i in range(args.reps):
                out = str(root / f"out-{len(best)}-{i}")
                started = time.perf_counter()
                write(rows(), out)
                times.append(time.perf_counter() - started)
                shutil.rmtree(out, ignore_errors=True)
            best[label] = min(times)
            log(f"{label}: {', '.join(f'{t:.2f}s' for t in times)}")
    finally:
        spark.stop()
    return best


if __name__ == "__main__":
    raise SystemExit(main())
