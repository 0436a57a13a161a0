"""View maintenance against a Spark recompute (issue 3): Epochal's change epochs of a grouped
aggregation and a join against Spark batch recomputing the same view over the same state.

    python benchmarks/bench_views.py                       # 10M rows, changes of 0.1% and 1%, 3 repeats
    python benchmarks/bench_views.py --rows 200000 --repeats 1          # smoke run
    python benchmarks/bench_views.py --rows 1000000 --change-rows 10000 --mode incremental,spark

Data and views: see views_common.py. Per view and --mode, each change epoch (start_epoch, run_source,
run_view, commit, in-process, one warm SparkSession) is paired with a full recompute of the same view by
Spark batch over the same state (Parquet in, Parquet out) and with Spark running the view over the
change's new rows alone (the floor under any design that computes each epoch with Spark), in the
order A B C, then C B A. Every epoch records its Spark jobs (step, seconds, input records, from Spark's
status store) and its driver time, the part of the epoch with no Spark job running. After the change
epochs, two epochs with no change (the fixed cost), then a check of each view against Spark batch
over the final state. The state's size: bench_views_sweep.py; Structured Streaming and Spark
Declarative Pipelines: bench_views_streaming.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import views_common as vc
from harness import log


def main(argv: list[str] | None = None) -> int:
    p = vc.parser(__doc__)
    p.add_argument("--only", default="agg,join", help="comma list of views: agg, join (default both)")
    args = vc.parse(p, argv)
    views = [v for v in ("agg", "join") if v in args.only.split(",")]
    if not views:
        p.error("--only: agg and/or join")

    def measure(root: Path, result: dict[str, Any], save: Any) -> None:
        import pyspark

        data = vc.new_data(args, root, args.rows)
        modes = vc.modes_for(args, root, data, result)
        spark = vc.spark_session(args, "bench-views")
        try:
            log(f"Epochal ({', '.join(modes)}) against Spark recompute; pyspark {pyspark.__version__}")
            result["views"] = vc.part1_result(vc.run_part1(args, root, data, spark, modes, views), data)
            result["changes"] = data.changes
        finally:
            spark.stop()

    return vc.run("bench_views", "Epochal view maintenance against a Spark recompute", args, measure,
                  vc.render_part1)


if __name__ == "__main__":
    sys.exit(main())
