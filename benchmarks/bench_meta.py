"""Meta-store benchmark: does injecting an epoch cost more as the pipeline's history grows?

    python benchmarks/bench_meta.py                 # 100,000 epochs of history, DuckDB and PostgreSQL
    python benchmarks/bench_meta.py --epochs 20000 --backends duckdb

For each backend, a fresh store gets one source with 4 splits and 3 tables. Injection is timed
(``EpochLog.inject``, one transaction to read the split starts and one to record; each injected
epoch is then collected and committed) on the empty store, then again after ``--epochs`` committed
epochs of history were bulk-inserted (epochs, their offsets and collect records, as the controller
writes them). Beside it, in the same run, the query injection used before the split frontier (the
newest offsets of every split, from the whole ``epoch_offsets`` history) is timed on the same store:
the baseline whose growth the frontier removes. Last, ``prune_history`` is timed once retention has
released the history, and injection again after it.

The machine is shared and noisy: every figure is a median of ``--repeats`` interleaved samples, and
the ratios compare figures of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import harness
from harness import log

from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import Collected
from epochal.connectors.base import SplitRange
from epochal.settings import Settings

TABLES = ["src", "v1", "v2"]
SPLITS = ("0", "1", "2", "3")
OLD_INJECTION_QUERY = (
    "SELECT o.source, o.split, o.end_offset FROM epoch_offsets o "
    "JOIN (SELECT o2.source, o2.split, max(o2.epoch) AS epoch FROM epoch_offsets o2 "
    "      JOIN epochs e ON e.epoch = o2.epoch WHERE e.state <> 'ABORTED' GROUP BY o2.source, o2.split) m "
    "ON m.source = o.source AND m.split = o.split AND m.epoch = o.epoch"
)


def plan(source: str, starts: dict[str, int]) -> list[SplitRange]:
    return [SplitRange(s, starts.get(s, 0), starts.get(s, 0) + 100) for s in SPLITS]


def postgres_url() -> str | None:
    import uuid

    import psycopg

    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as con:
            name = f"epochal_bench_{uuid.uuid4().hex[:8]}"
            con.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL not reachable at {admin}: {exc}; skipped")
        return None
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def add_history(ctl: CheckpointController, epochs: int) -> None:
    """``epochs`` committed epochs before the first real one, as the controller records them."""

    def insert(cur) -> None:  # noqa: ANN001
        first = cur.execute("SELECT min(epoch) FROM epochs").fetchone()[0]
        base = first - epochs - 1
        cur.execute(
            "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at, committed_at) "
            "SELECT ? + g.i, ? + g.i - 1, 'checkpoint', 'COMMITTED', 0, 0 FROM generate_series(1, ?) AS g(i)",
            [base, base, epochs],
        )
        for split in SPLITS:
            cur.execute(
                "INSERT INTO epoch_offsets SELECT ? + g.i, 'src', ?, (g.i - 1) * 100, g.i * 100 "
                "FROM generate_series(1, ?) AS g(i)",
                [base, split, epochs],
            )
        for table in TABLES:
            cur.execute(
                "INSERT INTO collected (epoch, asset, location, rows_in, rows_out, collected_at) "
                "SELECT ? + g.i, ?, NULL, 0, 0, 0 FROM generate_series(1, ?) AS g(i)",
                [base, table, epochs],
            )

    ctl.backend.transaction(insert)
    if ctl.backend.url.startswith("postgres"):
        # A bulk insert leaves PostgreSQL's statistics stale (autovacuum analyses later), and plans
        # made on them would be timed instead of the queries: a pipeline's tables grow gradually.
        import psycopg

        with psycopg.connect(ctl.backend.url, autocommit=True) as con:
            con.execute("ANALYZE")


def time_injection(ctl: CheckpointController, repeats: int) -> tuple[float, float]:
    """(median seconds of an inject, median seconds of the old injection query), interleaved."""
    inject, old = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        epoch = ctl.epoch_log.inject(plan).epoch
        inject.append(time.perf_counter() - started)
        for table in TABLES:
            ctl.epoch_log.collect(epoch, Collected(table, None, 0, 0))
        started = time.perf_counter()
        ctl.backend.transaction(lambda cur: cur.execute(OLD_INJECTION_QUERY).fetchall())
        old.append(time.perf_counter() - started)
    return statistics.median(inject), statistics.median(old)


def run(name: str, url: str, home: Path, epochs: int, repeats: int) -> dict[str, Any]:
    settings = Settings.from_env(
        {"EPOCHAL_HOME": str(home), "EPOCHAL_META_URL": url, "EPOCHAL_PARTITION_WINDOW": "100"}
    )
    ctl = CheckpointController(settings, ["src"], TABLES[1:], sinks=[])
    ctl.recover("bootstrap", discard=lambda locations: None)
    fresh_inject, fresh_old = time_injection(ctl, repeats)
    started = time.perf_counter()
    add_history(ctl, epochs)
    loaded = time.perf_counter() - started
    big_inject, big_old = time_injection(ctl, repeats)
    committed = ctl.epoch_log.committed_epoch()
    ctl.backend.transaction(
        lambda cur: [cur.execute("INSERT INTO table_retention VALUES (?, ?)", [t, committed]) for t in TABLES]
    )
    started = time.perf_counter()
    pruned = ctl.prune_history()
    prune_s = time.perf_counter() - started
    after_inject, after_old = time_injection(ctl, repeats)
    print(f"\n== {name} ({epochs:,} epochs of history inserted in {loaded:.1f}s)")
    print(f"{'':38} {'empty store':>12} {'+history':>12} {'ratio':>7} {'pruned':>10}")
    print(
        f"{'inject (split frontier), ms':38} {fresh_inject * 1e3:12.2f} {big_inject * 1e3:12.2f} "
        f"{big_inject / fresh_inject:6.2f}x {after_inject * 1e3:10.2f}"
    )
    print(
        f"{'old injection query (history scan), ms':38} {fresh_old * 1e3:12.2f} {big_old * 1e3:12.2f} "
        f"{big_old / fresh_old:6.2f}x {after_old * 1e3:10.2f}"
    )
    print(f"prune_history: {pruned:,} epochs' rows in {prune_s:.2f}s")
    return {"history_insert_s": loaded, "inject_s": [fresh_inject, big_inject, after_inject],
            "old_query_s": [fresh_old, big_old, after_old], "pruned": pruned, "prune_s": prune_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backends", default="duckdb,postgresql")
    parser.add_argument("--json", help="result file (default benchmarks/results/bench_meta-<time>.json)")
    args = parser.parse_args()
    log(harness.header("Injection against the meta store's history"))
    result: dict[str, Any] = {"args": vars(args)}
    for backend in args.backends.split(","):
        with harness.workdir("bench_meta") as tmp:
            if backend == "duckdb":
                result[backend] = run("DuckDB meta store", f"duckdb:///{tmp / 'meta.duckdb'}", tmp, args.epochs,
                                      args.repeats)
            elif backend == "postgresql":
                url = postgres_url()
                if url is None:
                    continue
                try:
                    result[backend] = run("PostgreSQL meta store", url, tmp, args.epochs, args.repeats)
                finally:
                    drop_postgres(url)
            else:
                raise SystemExit(f"unknown backend {backend!r}: use duckdb and/or postgresql")
    log(f"result: {harness.save(harness.result_path('bench_meta', args.json), result)}")


if __name__ == "__main__":
    main()
