"""A keyed source's lookup of the previous rows of the keys an epoch changes (issue 17): DuckDB on the
driver reading the snapshot's Parquet files (EPOCHAL_DRIVER_LOOKUP_ROWS, the default) against Spark
scanning the whole snapshot from its warm cache (the lookup off), at several state sizes.

    python benchmarks/bench_driver_lookup.py                                   # 1M, 5M, 10M rows
    python benchmarks/bench_driver_lookup.py --sizes 1000000,20000000 --pairs 3 --view join

The data and the pipeline are bench_views.py's: `t` (id BIGINT PRIMARY KEY, k, v, note) read from
JSON Lines by the log connector, and one view over it (`agg`: a grouped aggregation, `join`: t joined
with d). At each size: the initial load and its snapshot, one untimed change epoch per arm (the Spark
arm fills its cache there), then `--pairs` pairs of change epochs of `--change-rows` events (8 in 10
updates, 1 delete, 1 insert), the arm flipped every epoch in the order A B, B A. Both arms share the
one Spark, the state and the data: only the lookup differs. It prints per size and arm the median
epoch and source step, and the median of the paired ratios (on / off), the epoch at the largest size
against the smallest, and checks the view against Spark batch over the final state.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import harness
from harness import log
from views_common import SPARK_CONF, Data, EpochalPipeline, verify


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000000,5000000,10000000", help="rows of t (default 1M, 5M, 10M)")
    p.add_argument("--change-rows", type=int, default=10_000, help="events per change epoch (default 10,000)")
    p.add_argument("--pairs", type=int, default=2, help="timed epoch pairs per size (default 2)")
    p.add_argument("--view", choices=("agg", "join"), default="agg")
    p.add_argument("--groups", type=int, default=100_000)
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_driver_lookup-<time>.json)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    header = (f"{harness.header('Driver lookup benchmark')}; view {args.view}; {args.change_rows:,}-event changes; "
              f"{args.pairs} pair(s) per size")
    log(header)
    with harness.workdir("bench_driver_lookup", args.keep) as root:
        results = measure(args, sizes, root)
    print(header)

    print("| rows of t | lookup | epoch | source step | view step | on / off (paired) | check |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for rows, r in results.items():
        for arm in ("on", "off"):
            print(
                f"| {rows:,} | {arm} | {r[arm]['epoch']:.2f} s | {r[arm]['source']:.2f} s | {r[arm]['view']:.2f} s | "
                + (f"**{r['paired_on_off']:.2f}x** | {r['verified']} |" if arm == "on" else " | |")
            )
    small, large = min(results), max(results)
    for arm in ("on", "off"):
        print(
            f"lookup {arm}: epoch at {large:,} / epoch at {small:,} = "
            f"{results[large][arm]['epoch'] / results[small][arm]['epoch']:.2f}x"
        )
    out = harness.save(harness.result_path("bench_driver_lookup", args.json), {"header": header, "results": results})
    log(f"result: {out}")
    return 0 if all(r["verified"] == "ok" for r in results.values()) else 1


def measure(args: argparse.Namespace, sizes: list[int], root: Path) -> dict[int, dict]:
    from epochal.spark.session import build_spark_session

    results: dict[int, dict] = {}
    with harness.stderr_to(root / "stderr.log"):
        spark = build_spark_session(
            master="local[2]",
            app_name="bench-driver-lookup",
            conf={**SPARK_CONF, "spark.driver.memory": args.driver_memory},
        )
        spark.sparkContext.setLogLevel("ERROR")
        for rows in sizes:
            home = root / f"rows-{rows}"
            home.mkdir()
            data = Data(home, rows, args.groups, 7)
            data.initial_state = data.initial()["state"]
            pipe = EpochalPipeline(home, args.view, "incremental", data, spark)
            lookup = pipe.runtime.reader.lookup
            limit = lookup.max_rows
            started = time.perf_counter()
            pipe.epoch(initial=True)
            log(f"{rows:,} rows: initial load and snapshot {time.perf_counter() - started:.1f} s")
            times: dict[str, list[dict]] = {"on": [], "off": []}
            order = [("on", "off") if i % 2 == 0 else ("off", "on") for i in range(args.pairs + 1)]
            for i, pair in enumerate(order):
                for arm in pair:
                    lookup.max_rows = limit if arm == "on" else 0
                    data.change(args.change_rows / rows, args.change_rows)
                    answered = lookup.answered
                    epoch = pipe.epoch()
                    epoch["looked_up"] = lookup.answered - answered
                    warm = i == 0
                    if not warm:
                        times[arm].append(epoch)
                    log(
                        f"  lookup {arm:3}: epoch {epoch['epoch']:.2f} s, source {epoch['sources']:.2f} s, "
                        f"view {epoch['view']:.2f} s, {epoch['spark_jobs']:.0f} jobs, "
                        f"{epoch['looked_up']} driver lookup(s)" + (" (warm-up)" if warm else "")
                    )
            lookup.max_rows = limit
            checked = verify(spark, pipe, data.changes[-1]["state"], str(data.d_parquet))
            pipe.runtime.close()
            paired = [a["epoch"] / b["epoch"] for a, b in zip(times["on"], times["off"], strict=True)]
            results[rows] = {
                arm: {
                    "epoch": statistics.median(e["epoch"] for e in eps),
                    "source": statistics.median(e["sources"] for e in eps),
                    "view": statistics.median(e["view"] for e in eps),
                    "epochs": eps,
                }
                for arm, eps in times.items()
            }
            results[rows]["paired_on_off"] = statistics.median(paired)
            results[rows]["verified"] = checked
            log(f"  {rows:,}: on/off {statistics.median(paired):.2f}x (median of paired ratios); view check: {checked}")
            data.db.close()
            shutil.rmtree(home, ignore_errors=True)
        spark.stop()
    return results


if __name__ == "__main__":
    sys.exit(main())
