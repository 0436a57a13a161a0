"""What a recomputed view's epoch costs now that it retracts its stored rows (exact for floating
point) against running its query again over the state before the epoch, as it did before.

    python benchmarks/bench_recompute_retraction.py                    # 1M rows, 10,000 a change
    python benchmarks/bench_recompute_retraction.py --rows 5000000 --epochs 8

t(id, k, v DOUBLE, note) of --rows rows is ingested in one epoch and compacted. Two views are
maintained by recompute (neither is a partial aggregate: COUNT(DISTINCT)):

* ``per_k``: GROUP BY k, keyed: the stored retraction reads the view at the touched keys (by the
  key column it selects) where the old way ran the query over the input's state at them;
* ``whole``: over all rows, one partition: the stored retraction reads the view's one row where the
  old way ran the query over the whole input.

Each epoch appends --change rows; the two ways alternate epoch by epoch in one process on one warm
SparkSession (the old way is the same code with the view's rows withheld). Per view it prints the
median step time of each way and their ratio. Ratios only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
from harness import log
from inprocess import runtime_for, write_rows

VIEWS = {
    "per_k": "SELECT k, count(DISTINCT note) AS notes, sum(v) AS total FROM t GROUP BY k",
    "whole": "SELECT count(DISTINCT k) AS ks, sum(v) AS total FROM t",
}
WAYS = ("stored rows", "query again")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--groups", type=int, default=100_000)
    p.add_argument("--change", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=6, help="timed epochs per way (default 6)")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_recompute_retraction-<time>.json)")
    args = p.parse_args(argv)

    log(harness.header("A recomputed view's retraction benchmark"))
    from epochal.incremental import keyed
    from epochal.spark.session import build_spark_session

    spark = build_spark_session(
        "local[*]", "bench-retraction", {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}
    )
    stored_retraction = keyed._retraction
    times: dict[str, dict[str, list[float]]] = {view: {way: [] for way in WAYS} for view in VIEWS}
    with harness.workdir("bench_recompute_retraction") as root:
        log_dir, pipeline, home = root / "log" / "t", root / "pipeline", root / "home"
        pipeline.mkdir(parents=True)
        for i, first in enumerate(range(0, args.rows, 1_000_000)):
            write_rows(log_dir, first, min(1_000_000, args.rows - first), args.groups, f"a-{i:04d}.jsonl")
        views = "".join(f"CREATE MATERIALIZED VIEW {name} AS {query};\n" for name, query in VIEWS.items())
        (pipeline / "01.sql").write_text(
            "CREATE TABLE t (id BIGINT, k BIGINT, v DOUBLE, note STRING) "
            f"WITH (connector = 'log', path = '{log_dir}', format = 'json');\n{views}"
        )
        runtime = runtime_for(home, pipeline, spark, {})
        for name in VIEWS:
            plan = runtime.pipeline.views[name].plan
            log(f"{name}: {plan.rule}, keyed by {plan.key_classes or 'nothing'}, output keys {plan.output_keys}")
        log(f"ingesting {args.rows:,} rows")
        record, _ = runtime.start_epoch(None, None)
        runtime.run_source(record.epoch, "t")
        for name in runtime.pipeline.view_order():
            runtime.run_view(record.epoch, name)
        runtime.commit(record.epoch)
        runtime.compact(every=1)
        for i in range(2 * args.epochs + 2):  # two warm-up epochs, then the ways alternate
            way = WAYS[i % 2]
            keyed._retraction = stored_retraction if way == WAYS[0] else (lambda *_: None)
            write_rows(log_dir, args.rows + i * args.change, args.change, args.groups, f"b-{i:04d}.jsonl")
            record, _ = runtime.start_epoch(None, None)
            runtime.run_source(record.epoch, "t")
            for name in runtime.pipeline.view_order():
                started = time.perf_counter()
                runtime.run_view(record.epoch, name)
                if i >= 2:
                    times[name][way].append(time.perf_counter() - started)
            runtime.commit(record.epoch)
            log(f"epoch {record.epoch} ({way}): " + ", ".join(f"{v} {times[v][way][-1]:.2f}s" for v in VIEWS if i >= 2))
    keyed._retraction = stored_retraction
    spark.stop()

    result = {"rows": args.rows, "groups": args.groups, "change": args.change, "epochs": args.epochs, "views": {}}
    print(f"\n== a recomputed view's step, {args.rows:,} rows, {args.change:,} changed an epoch, medians")
    print(f"{'view':<8} {WAYS[0] + ' (s)':>16} {WAYS[1] + ' (s)':>16} {'ratio':>7}")
    for name in VIEWS:
        a, b = (statistics.median(times[name][way]) for way in WAYS)
        result["views"][name] = {"query": VIEWS[name], **{way: times[name][way] for way in WAYS}, "ratio": a / b}
        print(f"{name:<8} {a:>16.2f} {b:>16.2f} {a / b:>6.2f}x")
    out = harness.save(harness.result_path("bench_recompute_retraction", args.json), result)
    log(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
