"""What checking a target's own row rules before PENDING costs (``SinkTarget.check_rows``), against
the batch's commit, for the DuckDB and Delta Lake sinks.

    python benchmarks/bench_sink_rules.py                  # 1M rows, 3 timed batches per case
    python benchmarks/bench_sink_rules.py --rows 200000 --reps 5

Each case delivers ``--reps`` append-only batches of ``--rows`` rows (plus one warm-up) into a fresh
table: the writer's pre-commit (``target.write`` on the driver, one writer), then ``check_rows``, then
``commit``, each timed. Cases: a DuckDB table Epochal created (no rules of its user's: the check is a
catalog query), one with a CHECK and a NOT NULL (the check runs the commit's load and rolls it back),
a Delta table without rules (the check opens the table to find none) and one with a CHECK
constraint (DuckDB evaluates it over the staged files). It prints the medians and the check's
share of the commit and of the whole batch (write, check, commit), measured in the same batches.
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
from harness import log


def batches(rows: int, epoch: int, size: int = 100_000):
    import pyarrow as pa

    for start in range(0, rows, size):
        ids = pa.array(range(epoch * rows + start, epoch * rows + min(rows, start + size)), pa.int64())
        yield pa.RecordBatch.from_arrays(
            [ids, pa.array([f"name-{i % 1000}" for i in range(len(ids))]), pa.array([1.5] * len(ids)),
             pa.array([1] * len(ids), pa.int64())],
            names=["k", "name", "amount", "_weight"],
        )  # fmt: skip


def run_case(target, rows: int, reps: int) -> tuple[float, float, float]:
    """Medians of (write, check, commit) seconds over ``reps`` batches after a warm-up."""
    from epochal.sinks.base import BatchId, WriterTask

    times = []
    for epoch in range(1, reps + 2):
        batch = BatchId(target.name, epoch, epoch, 1, f"b{epoch}")
        start = time.perf_counter()
        metadata = [dict(target.write(WriterTask(batch, 0, 1, (0, 255)), batches(rows, epoch)))]
        written = time.perf_counter()
        target.check_rows(batch, metadata)
        checked = time.perf_counter()
        target.commit(batch, metadata)
        times.append((written - start, checked - written, time.perf_counter() - checked))
    timed = times[1:]
    return tuple(statistics.median(t[i] for t in timed) for i in range(3))  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_sink_rules-<time>.json)")
    args = parser.parse_args()
    log(harness.header("A target's row rules checked before PENDING"))

    import duckdb
    import pyarrow as pa
    from deltalake import DeltaTable

    from epochal.sinks.delta_sink import DeltaTarget
    from epochal.sinks.duckdb_sink import DuckDBTarget

    schema = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    results = {}
    with harness.workdir("bench_sink_rules") as root:
        for case in ("duckdb", "duckdb+rules", "delta", "delta+check"):
            home = root / case
            home.mkdir()
            if case.startswith("duckdb"):
                target = DuckDBTarget("bench", {"database": "out.duckdb", "table": "t"}, schema.names, home)
                if case.endswith("rules"):
                    with duckdb.connect(str(home / "out.duckdb")) as con:
                        con.execute("CREATE TABLE t (k BIGINT CHECK (k >= 0), name VARCHAR NOT NULL, amount DOUBLE)")
            else:
                target = DeltaTarget("bench", {"location": "table"}, schema.names, home, None)
            target.prepare_target(schema)
            if case == "delta+check":
                DeltaTable(target.location).alter.add_constraint({"amount_not_negative": "amount >= 0"})
            results[case] = run_case(target, args.rows, args.reps)
            write_s, check_s, commit_s = results[case]
            total = write_s + check_s + commit_s
            print(f"{case:13s} write {write_s:6.2f}s  check {check_s * 1000:7.1f} ms  commit {commit_s:6.2f}s  "
                  f"check / commit {check_s / commit_s:6.2f}x  check / batch {check_s / total:5.1%}", flush=True)
    print(f"\n{args.rows:,} rows per batch, medians of {args.reps} batches after a warm-up")
    result = {"args": vars(args), "write_check_commit_s": results}
    log(f"result: {harness.save(harness.result_path('bench_sink_rules', args.json), result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
