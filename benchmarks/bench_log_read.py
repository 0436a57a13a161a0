"""Log connector: what an epoch of a log source costs as the log grows.

    python benchmarks/bench_log_read.py                          # logs of 0.25M, 1M and 4M lines
    python benchmarks/bench_log_read.py --lines 100000 1000000   # other sizes

An epoch reads a fixed range (--epoch lines, at the log's end) of one split. Epochal reads only the
range's bytes (``epochal/connectors/log_lines.py``); the baseline, in the same run, is how the
connector read before: the whole file as one row (``wholetext``), split into lines and sliced.
Each read parses the lines (``LogSource.read``) and counts the rows, so both sides run a Spark job.
Printed: seconds per epoch (median of --repeat) for each log size, and the ratio Epochal /
baseline. Epochal's epoch should stay flat as the log grows; the baseline grows with it, and fails
once the file outgrows the driver's heap (reported as such). Ratios only: the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import harness
from harness import log


def write_log(path: Path, lines: int) -> None:
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    duckdb.sql(
        f"""COPY (SELECT i::BIGINT AS id, (hash(i) % 1000)::BIGINT AS k, 'note-' || (i % 997)::VARCHAR AS note
                  FROM range({lines}) r(i) ORDER BY i) TO '{path}' (FORMAT json)"""
    )


def wholetext_read(spark, path: Path, start: int, count: int) -> int:  # noqa: ANN001
    """The connector's read before: the file as one row, split and sliced, then parsed."""
    from pyspark.sql import functions as F

    text = spark.read.text(str(path), wholetext=True)
    lines = text.select(F.posexplode(F.slice(F.split("value", "\n"), start + 1, count)).alias("pos", "raw"))
    parsed = lines.select(F.from_json("raw", "id BIGINT, k BIGINT, note STRING").alias("r")).where("r.id IS NOT NULL")
    return parsed.count()


def _shown(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    parser.add_argument("--epoch", type=int, default=10_000, help="lines one epoch reads")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_log_read-<time>.json)")
    args = parser.parse_args()
    log(harness.header("A log source's epoch against the log's length"))

    from pyspark.sql import SparkSession

    from epochal.connectors.base import SplitRange
    from epochal.connectors.log import LogConnectorSpec
    from epochal.pipeline.model import Column, Location, SourceDef

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    columns = (Column("id", "BIGINT"), Column("k", "BIGINT"), Column("note", "STRING"))
    results = []
    with harness.workdir("bench_log_read") as home:
        cases = []
        for lines in args.lines:
            path = home / f"log{lines}" / "0.jsonl"
            write_log(path, lines)
            options = {"connector": "log", "path": str(path.parent)}
            connector = LogConnectorSpec().create(SourceDef("s", columns, "log", options, Location("bench", 1)), home)
            connector.plan({})  # the planner counts the file once, as an epoch's injection does
            cases.append((lines, path, connector))
        # Epochal first, every size; then the baseline, which may take the JVM down with it (an
        # OutOfMemoryError in local mode kills the driver) once the file outgrows the heap.
        timings: dict[tuple[str, int], list[float] | str] = {}
        for name in ("epochal", "wholetext"):
            for lines, path, connector in cases:
                start = lines - args.epoch
                if name == "epochal":
                    read = lambda: connector.read(spark, [SplitRange("0", start, lines)]).rows.count()  # noqa: E731,B023
                else:
                    read = lambda: wholetext_read(spark, path, start, args.epoch)  # noqa: E731,B023
                runs: list[float] = []
                for _ in range(args.repeat):
                    began = time.perf_counter()
                    try:
                        rows = read()
                    except Exception as error:  # noqa: BLE001 - the baseline running out of heap is a result
                        timings[name, lines] = f"failed: {str(error).splitlines()[0][:100]}"
                        break
                    if rows != args.epoch:
                        raise SystemExit(f"{name} read {rows} rows, expected {args.epoch}")
                    runs.append(time.perf_counter() - began)
                else:
                    timings[name, lines] = statistics.median(runs)
        for lines, path, _ in cases:
            ours, before = timings["epochal", lines], timings["wholetext", lines]
            ratio = f"{ours / before:.2f}x" if isinstance(ours, float) and isinstance(before, float) else "n/a"
            size_mb = path.stat().st_size / 1e6
            print(
                f"log of {lines:>10,} lines ({size_mb:7.1f} MB), epoch of {args.epoch:,} lines: "
                f"epochal {_shown(ours)} | wholetext {_shown(before)} | ratio {ratio}",
                flush=True,
            )
            results.append({"lines": lines, "mb": round(size_mb, 1), "epochal": ours, "wholetext": before})
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - the baseline's OutOfMemoryError may have taken the JVM down
        pass
    out = harness.save(harness.result_path("bench_log_read", args.json), {"args": vars(args), "logs": results})
    log(f"result: {out}")


if __name__ == "__main__":
    main()
