"""The warm snapshot cache across runs on the managed Spark Connect server: a run's first read of a
snapshot when the previous run released what it cached (the behaviour before: every run starts
cold) against when it left it to the server (``StateCache`` with its registry).

    python benchmarks/bench_state_cache.py                  # 5M rows, 3 interleaved pairs
    python benchmarks/bench_state_cache.py --rows 2000000 --reps 5

A "run" is a new Spark Connect session with its own ``StateCache`` and ``StateReader``, as a
Dagster run's process has: it caches the table's snapshot and times its first query, a keyed
lookup of 100 keys (what a view's step reads of its input), then ends. Pairs interleave:

A. released  no registry: the run unpersists what it cached when it ends, so the next run refills.
B. kept      the registry on: the run leaves the snapshot cached; the timed run is the one after.

The snapshot is written once with pyarrow (int64 key, int64 value, a 20-character string), in 8
files. Prints the medians and the median of the per-pair ratios B/A (the machine is shared).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from pathlib import Path

import harness
from harness import log


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_state_cache-<time>.json)")
    args = parser.parse_args()
    log(harness.header("The warm snapshot cache across runs"))
    with harness.workdir("bench_state_cache") as root:
        result = measure(args, root)
    log(f"result: {harness.save(harness.result_path('bench_state_cache', args.json), result)}")


def measure(args: argparse.Namespace, root: Path) -> dict:

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from epochal.spark.server import ServerConfig, start, stop
    from epochal.spark.server import status as server_status
    from epochal.storage.state_cache import SnapshotPlan, StateCache
    from epochal.storage.state_reader import StateReader

    home, port = root / "home", _free_port()
    snapshot = root / "snapshot"
    snapshot.mkdir()
    rng = np.random.default_rng(7)
    per_file = args.rows // 8
    for part in range(8):
        keys = rng.integers(0, args.rows, per_file)
        table = pa.table({"k": keys, "v": keys * 3, "s": pa.array([f"{i:020d}" for i in range(per_file)])})
        pq.write_table(table, snapshot / f"part-{part}.parquet")
    schema = StructType([StructField("k", LongType()), StructField("v", LongType()), StructField("s", StringType())])
    plan = SnapshotPlan(schema.json(), tuple(sorted(str(f) for f in snapshot.glob("*.parquet"))))
    wanted = [int(k) for k in rng.integers(0, args.rows, 100)]
    print(f"snapshot: {args.rows:,} rows in 8 files; server on port {port}", flush=True)

    def run(keep: bool) -> float:
        """One run: a new session; its first keyed read of the cached snapshot, in seconds."""
        session = SparkSession.builder.remote(server_status(home).connect_url).create()  # type: ignore[union-attr]
        try:
            cache = StateCache(registry=home / "spark" / "state_cache.json" if keep else None)
            reader = StateReader(lambda: session, None, None, cache, None)  # type: ignore[arg-type]
            started = time.perf_counter()
            rows = cache.put("t", str(snapshot), reader.snapshot_rows(plan), plan, reader.snapshot_rows)
            rows.where(F.col("k").isin(wanted)).count()
            seconds = time.perf_counter() - started
            cache.clear()
            return seconds
        finally:
            session.stop()

    def reset() -> None:
        session = SparkSession.builder.remote(server_status(home).connect_url).create()  # type: ignore[union-attr]
        session.catalog.clearCache()
        session.stop()
        (home / "spark" / "state_cache.json").unlink(missing_ok=True)

    try:
        started = time.perf_counter()
        start(ServerConfig(home, port, "local[2]", {"spark.driver.memory": "3g"}))
        print(f"server started in {time.perf_counter() - started:.1f}s", flush=True)
        run(False)  # untimed: the JVM's first reads of these files
        reset()
        released, kept = [], []
        for rep in range(args.reps):
            released.append(run(False))
            reset()
            run(True)  # the run that leaves the snapshot cached
            kept.append(run(True))
            reset()
            log(f"pair {rep + 1}: released {released[-1]:.2f}s, kept {kept[-1]:.2f}s")
        ratios = [k / r for k, r in zip(kept, released, strict=True)]
        print(
            f"\nfirst read of a run, median of {args.reps}: released {statistics.median(released):.2f}s, "
            f"kept {statistics.median(kept):.2f}s; kept/released {statistics.median(ratios):.2f}x "
            f"(per pair: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        return {"args": vars(args), "released_s": released, "kept_s": kept, "ratio": statistics.median(ratios)}
    finally:
        stop(home)


if __name__ == "__main__":
    main()
