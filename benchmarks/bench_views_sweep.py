"""Epoch cost against the state's size (issue 17): the same fixed change at several sizes of t, an
Epochal epoch against a Spark recompute at each, the crossover, and which Spark jobs grow.

    python benchmarks/bench_views_sweep.py --sizes 1000000,5000000,10000000,20000000 --change-rows 10000 \
        --repeats 3 --warmup 1                                  # issue 17's sweep: about 20 min here
    python benchmarks/bench_views_sweep.py --sizes 100000,300000 --change-rows 1000 --repeats 1 --warmup 1 \
        --driver-memory 2g                                      # smoke run

Each size gets its own data (views_common.py) and runs bench_views.py's measurement (--only views,
--mode modes): the initial load, --warmup untimed change epochs (the first after the load fills the
snapshot cache), --repeats timed ones, each paired with a Spark recompute of the same state, then
epochs with no change and a check against Spark batch. All sizes share one SparkSession, smallest
first, so a size that does not fit leaves the smaller ones measured. It prints epoch and recompute
against the size, epoch@largest / epoch@smallest (issue 17's target: at most 1.5x), the crossover
(the smallest size where the paired epoch/recompute is below 1, and where the line through
log(ratio) against log(size) crosses 1 below it), and the 8 Spark jobs of the epoch that grow most.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import views_common as vc
from harness import fmt_s, fmt_x, log, median, table
from views_common import jobs_cell, ratio, time_cells


def run_sweep(args: Any, root: Path, views: list[str], result: dict[str, Any], save: Any) -> None:
    """Part 1 at each --sizes size (its own data dir, one SparkSession for all sizes, smallest first),
    into result["sweep"]."""
    modes = result["modes"]
    spark = vc.spark_session(args, "bench-views-sweep")
    try:
        for rows in args.sizes:
            size_root = root / f"sweep-{rows}"
            size_root.mkdir()
            entry: dict[str, Any] = {"rows": rows, "started": dt.datetime.now().astimezone().isoformat(),
                                     "load_start": os.getloadavg()}
            result["sweep"][str(rows)] = entry
            began = time.perf_counter()
            try:
                data = vc.new_data(args, size_root, rows)
                series = vc.run_part1(args, size_root, data, spark, modes, views, rows=rows)
                entry["views"] = vc.part1_result(series, data)
                entry["changes"] = data.changes
            except Exception as exc:  # a size that does not fit: say what failed, keep the others
                entry["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:1500]}"
                log(f"  {rows:,} rows FAILED after {time.perf_counter() - began:.0f} s: {entry['error'][:500]}")
                traceback.print_exc()
                spark.catalog.clearCache()
            finally:
                entry["seconds"] = time.perf_counter() - began
                entry["load_end"] = os.getloadavg()
                save()
                shutil.rmtree(size_root, ignore_errors=True)
    finally:
        spark.stop()


@dataclass
class SweepPoint:
    """One view at one state size: the paired series of the same change."""

    rows: int
    events: int
    epochs: list[dict[str, Any]]
    recompute: list[float]
    change_only: list[float]
    verified: str

    @property
    def epoch(self) -> float:
        return median([e["epoch"] for e in self.epochs])

    @property
    def ratio(self) -> float | None:
        return ratio([e["epoch"] for e in self.epochs], self.recompute)


def sweep_points(result: dict[str, Any]) -> dict[str, list[SweepPoint]]:
    """view -> its points by size, from the sweep and from the main run (at --rows) when its change
    was the same fixed number of rows; empty when the run had no sweep."""
    args = result.get("args", {})
    if not result.get("sweep"):
        return {}
    sources = [(int(n), e["views"]) for n, e in result["sweep"].items() if "views" in e]
    if result.get("views") and args.get("change_rows"):
        sources.append((args["rows"], result["views"]))
    out: dict[str, list[SweepPoint]] = {}
    for rows, views in sources:
        for key, s in views.items():
            for fraction, epochs in s["epochs"].items():
                out.setdefault(key, []).append(SweepPoint(
                    rows, s["events"][fraction], epochs, s["recompute"][fraction],
                    s.get("change_only", {}).get(fraction, []), s["verified"]))
    for points in out.values():
        points.sort(key=lambda p: p.rows)
    return out


def crossover(points: list[SweepPoint]) -> str:
    """The state size above which an epoch beats a recompute: the smallest measured size whose paired
    epoch/recompute is below 1, and where the line through log(ratio) against log(size) between it
    and the size below it crosses 1."""
    import math

    measured = [(p.rows, p.ratio) for p in points if p.ratio]
    first = next((i for i, (_, r) in enumerate(measured) if r < 1), None)
    if first is None:
        return f"not reached up to {measured[-1][0]:,} rows" if measured else "n/a"
    size, r = measured[first]
    if first == 0:
        return f"at or below {size:,} rows (the smallest size measured; epoch/recompute {r:.3f}x there)"
    below, r_below = measured[first - 1]
    x0, x1, y0, y1 = math.log(below), math.log(size), math.log(r_below), math.log(r)
    at = math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0))
    return (f"first below 1 at {size:,} rows ({r:.3f}x; {r_below:.3f}x at {below:,}); "
            f"log-linear interpolation: about {at:,.0f} rows")


def render_sweep(result: dict[str, Any], sweep: dict[str, list[SweepPoint]]) -> list[str]:
    lines = []
    failed = {n: e["error"] for n, e in result.get("sweep", {}).items() if "error" in e}
    headers = ["view", "rows of t", "events", "n", "Epochal epoch", "Spark jobs", "job time", "driver", "source",
               "view step", "Spark recompute", "epoch/recompute", "Spark over change", "check"]
    rows = []
    for key, points in sweep.items():
        for p in points:
            rows.append([key, f"{p.rows:,}", f"{p.events:,}", str(len(p.epochs)), fmt_s(p.epoch),
                         jobs_cell(p.epochs), *time_cells(p.epochs),
                         fmt_s(median([e["sources"] for e in p.epochs])), fmt_s(median([e["view"] for e in p.epochs])),
                         fmt_s(median(p.recompute)), fmt_x(p.ratio),
                         fmt_s(median(p.change_only)) if p.change_only else "n/a", p.verified])
    lines.append("== the same change against the state's size (medians; epoch/recompute is the median of paired "
                 "ratios; job time = time with a Spark job running, driver = the rest of the epoch)")
    lines.append(table(headers, rows))
    for n, error in failed.items():
        lines.append(f"{int(n):,} rows: FAILED: {error}")
    for key, points in sweep.items():
        lo, hi = points[0], points[-1]
        if hi.rows == lo.rows:
            continue
        rec = median(hi.recompute) / median(lo.recompute)
        lines.append(f"{key}: epoch@{hi.rows:,} / epoch@{lo.rows:,} = {fmt_x(hi.epoch / lo.epoch)} (target <= 1.5x; "
                     f"a ratio of medians from different times of the run); recompute grew {fmt_x(rec)}; "
                     f"crossover (epoch < recompute): {crossover(points)}")
    # which of the epoch's Spark jobs grow with the state: median seconds per (step, call site)
    for key, points in sweep.items():
        if len(points) < 2 or not all("jobs" in e for p in points for e in p.epochs):
            continue
        # a job is named by its step and its rank in the step (the same code path runs the same jobs
        # in the same order at every size; the call site Spark records is mostly a JDK frame)
        per_size: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
        for p in points:
            sums: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for e in p.epochs:
                rank: dict[str, int] = {}
                for j in e["jobs"]:
                    rank[j["step"]] = rank.get(j["step"], 0) + 1
                    site = (j["step"], f"#{rank[j['step']]} {j['name'].split(' at ', 1)[0]}")
                    sums.setdefault(site, []).append((j["s"] or 0.0, j.get("input_rows", 0)))
            for site, xs in sums.items():
                per_size.setdefault(site, {})[p.rows] = (median([x[0] for x in xs]), median([x[1] for x in xs]))
        lo, hi = points[0].rows, points[-1].rows
        grown = sorted(per_size.items(), key=lambda kv: kv[1].get(hi, (0.0,))[0] - kv[1].get(lo, (0.0,))[0],
                       reverse=True)
        lines.append(f"{key}: the epoch's Spark jobs by step and rank, the 8 that grow most from {lo:,} to {hi:,} "
                     "rows: median seconds (median input records of its stages: Parquet rows, or cached column "
                     "batches of 10,000 rows each); driver time without a job: "
                     + ", ".join(f"{p.rows:,}: {time_cells(p.epochs)[1]}" for p in points))
        if not grown:  # every step on the driver (issue 17): no Spark job to rank
            lines.append("  (no Spark job at any size)")
            continue
        lines.append(table(["step", "job", *(f"{p.rows:,}" for p in points)],
                           [[step, site, *(f"{fmt_s(v[p.rows][0])} ({v[p.rows][1]:,.0f})" if p.rows in v else "-"
                                           for p in points)]
                            for (step, site), v in grown[:8]]))
    return lines


def render(result: dict[str, Any]) -> str:
    sweep = sweep_points(result)
    return "\n".join(render_sweep(result, sweep)) if sweep else "no sweep in this result"


def main(argv: list[str] | None = None) -> int:
    p = vc.parser(__doc__, rows=0, change_rows=10_000)
    p.add_argument("--sizes", default="1000000,5000000,10000000,20000000",
                   help="comma list of t sizes (default 1000000,5000000,10000000,20000000)")
    p.add_argument("--only", default="agg,join", help="comma list of views: agg, join (default both)")
    args = vc.parse(p, argv)
    args.sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    args.rows = args.sizes[0] if args.sizes else 0  # (the header's and the modes' probe size)
    views = [v for v in ("agg", "join") if v in args.only.split(",")]
    if not views or not args.sizes:
        p.error("--only: agg and/or join; --sizes: at least one size")

    def measure(root: Path, result: dict[str, Any], save: Any) -> None:
        probe = root / "probe"
        probe.mkdir()
        vc.modes_for(args, probe, vc.Data(probe, 1, 1, args.seed), result)
        log(f"the state's size: {', '.join(f'{n:,}' for n in args.sizes)} rows of t, the same change at each; "
            f"views {', '.join(views)}")
        result["sweep"] = {}
        run_sweep(args, root, views, result, save)

    return vc.run("bench_views_sweep", "Epochal epoch against the state's size", args, measure, render)


if __name__ == "__main__":
    sys.exit(main())
