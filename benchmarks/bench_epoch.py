"""Epoch overhead benchmark: what Dagster + the meta store cost on top of the Spark work itself.

    python benchmarks/bench_epoch.py            # 5 timed repetitions (1-2), 3 (executor comparison)
    python benchmarks/bench_epoch.py --quick    # 2 and 1

The machine this runs on is small, shared and noisy, so no absolute number here means much alone:
every figure is compared with a baseline measured in the same run, interleaved A B A B, repeated,
and summarized by medians (the ratio is the median of the per-pair ratios A_i/B_i, since a pair
shares the machine's momentary load).

1. empty epoch    epoch_job in-process (one shared SparkSession, ephemeral Dagster instance) vs the
                  same Spark work done directly: connector read -> Parquet -> view SQL -> Parquet ->
                  DuckDB insert, with no Dagster and no meta store.
1b. meta store    24 controller transactions on a copy of part 1's DuckDB meta store, as the backend
                  does them vs on one connection kept open.
1c. PostgreSQL    the same 24 on a fresh PostgreSQL database (--postgres): connections kept, as the
                  backend does, vs connecting for each transaction.
2. 100k-row epoch the same with ~100k Nexmark bids per epoch.
3. executor       `dagster job execute` as a subprocess, in-process executor (the default) vs the
                  same graph with the multiprocess executor; wall time and JVMs started.

All state goes under a fresh temp dir that is removed at the end (``--keep`` keeps it). See
benchmarks/README.md for what every number means and the figures measured so far.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]
# This checkout first, here and in every subprocess (PYTHONPATH): the editable install is not a
# reliable way to find it. Installed before platform_defs/resources/assets had an __init__.py it
# maps them as namespace packages (`-m platform_defs` then finds no `defs` outside the repo), and a
# `pip install -e` from another checkout points `epochal` at that checkout instead.
sys.path.insert(0, str(REPO))
MULTIPROCESS_DEFS = REPO / "benchmarks" / "multiprocess_defs.py"

VIEW_SQL = "SELECT auction, bidder, price * 0.908 AS price_eur, date_time FROM bid WHERE price > 1000"
BID_COLUMNS = (
    "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP, extra STRING"
)
# Bids are 46 of every 50 Nexmark events: 108,700 events hold 100,004 bids.
EVENTS_FOR_100K_BIDS = 108_700
SPLITS = 2


def pipeline_sql(source_options: str) -> dict[str, str]:
    return {
        "01_sources.sql": f"CREATE SOURCE bid ({BID_COLUMNS})\nWITH (connector = 'nexmark', "
        f"'nexmark.table.type' = 'Bid', 'nexmark.split.num' = '{SPLITS}', {source_options});\n",
        "02_views.sql": f"CREATE MATERIALIZED VIEW big_bids AS\n{VIEW_SQL};\n",
        "03_sinks.sql": "CREATE SINK big_bids_out FROM big_bids\nWITH (connector = 'duckdb', "
        "database = 'out/sink.duckdb', table = 'big_bids', type = 'append-only');\n",
    }


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------- stats


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_s(x: float) -> str:
    return f"{x:8.3f} s" if x == x else "      n/a"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(out)


@dataclass
class Comparison:
    """Paired samples of A (Epochal) and B (baseline), taken A B A B."""

    title: str
    a_name: str
    b_name: str
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    cut: str = ""  # set when the time budget stopped the repetitions early

    @property
    def paired_ratio(self) -> float:
        return median([x / y for x, y in zip(self.a, self.b, strict=True)])

    def render(self) -> str:
        rows = []
        for name, xs in ((self.a_name, self.a), (self.b_name, self.b)):
            rows.append([name, str(len(xs)), fmt_s(median(xs)), fmt_s(min(xs)), fmt_s(max(xs))])
        ratios = [x / y for x, y in zip(self.a, self.b, strict=True)]
        body = table(["", "n", "median", "min", "max"], rows)
        return (
            f"{body}\n"
            f"ratio A/B: median of paired ratios {self.paired_ratio:.2f}x "
            f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)}); ratio of medians "
            f"{median(self.a) / median(self.b):.2f}x; difference of medians {median(self.a) - median(self.b):+.3f} s"
            + (f"\n[{self.cut}]" if self.cut else "")
        )


class Budget:
    """A wall-clock budget, split over the selected parts by weight; slack carries over to later parts.

    Another repetition starts only if the last A+B pair would still fit before the part's deadline;
    the minimum repetitions always run, so a very slow machine overruns rather than reports nothing."""

    WEIGHTS = {"1": 0.25, "2": 0.4, "3": 0.35}

    def __init__(self, seconds: float, parts: str):
        self.began = time.perf_counter()
        self.seconds = seconds
        selected = [p for p in "123" if p in parts]
        total = sum(self.WEIGHTS[p] for p in selected) or 1.0
        self.ends, acc = {}, 0.0
        for p in selected:
            acc += self.WEIGHTS[p] / total
            self.ends[p] = acc
        self.deadline = self.began + seconds

    def start_part(self, part: str) -> None:
        self.deadline = self.began + self.seconds * self.ends.get(part, 1.0)

    def allows_another(self, c: Comparison) -> bool:
        last = (c.a[-1] + c.b[-1]) if c.a else 0.0
        return time.perf_counter() + last <= self.deadline


# ------------------------------------------------------------------------------------- profiler


class Profiler:
    """Inclusive wall time and call counts of chosen functions, per run (monkeypatched wrappers).

    A wrapper costs about a microsecond; an epoch makes a few hundred wrapped calls."""

    def __init__(self) -> None:
        self.time: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.current = "outside the ops"  # the top-level label being run, for "label @ op" counts

    def reset(self) -> None:
        self.time = defaultdict(float)
        self.count = defaultdict(int)

    def wrap(self, owner: Any, attr: str, label: str | Callable[[tuple], str]) -> None:
        original = getattr(owner, attr)
        profiler = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = label(args) if callable(label) else label
            outer = profiler.current
            if not name.startswith(" "):
                profiler.current = name.split(":")[0].split(" (")[0]
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                profiler.current = outer
                profiler.time[name] += elapsed
                profiler.count[name] += 1
                if name.startswith(" "):
                    key = f"{name.strip()} @ {outer}"
                    profiler.time[key] += elapsed
                    profiler.count[key] += 1

        setattr(owner, attr, wrapper)

    def snapshot(self) -> dict[str, tuple[int, float]]:
        return {k: (self.count[k], self.time[k]) for k in self.time}


PROFILER = Profiler()

# label -> (indent, description); the order is the order printed
LABELS = {
    "runtime init (load pipeline, meta schema txn)": (0, ""),
    "op barrier: recover/inject (start_epoch)": (0, ""),
    "op source: run_source": (0, ""),
    "op view: run_view": (0, ""),
    "op commit: commit": (0, ""),
    "op sink: run_sink": (0, ""),
    "dagster: dynamic partitions (ensure/retire)": (0, ""),
    "dagster: event log writes (handle_new_event)": (0, ""),
    "  SparkSession getOrCreate (lazy: first Spark op)": (1, ""),
    "  `java -version` check inside getOrCreate": (1, ""),
    "  Spark: Parquet writes + footer counts (Warehouse.write)": (1, ""),
    "  Spark: Parquet read/schema (Warehouse.read)": (1, ""),
    "  meta-store transactions (meta.duckdb)": (1, ""),
    "  sink DuckDB transactions (sink file)": (1, ""),
}
TOP_LEVEL = [k for k, (indent, _) in LABELS.items() if indent == 0]


def install_probes() -> None:
    from dagster import DagsterInstance

    import epochal.spark.session as spark_session
    import resources.spark as spark_resource
    from epochal.meta.backend import DuckDBBackend
    from epochal.runtime.epoch_taking import EpochTaking
    from epochal.runtime.facade import EpochRuntime
    from epochal.storage.warehouse import Warehouse
    from resources.checkpoint import CheckpointControllerResource

    p = PROFILER
    p.wrap(spark_session, "check_java", "  `java -version` check inside getOrCreate")
    # resources.spark imported build_spark_session by name: patch the name it calls.
    p.wrap(spark_resource, "build_spark_session", "  SparkSession getOrCreate (lazy: first Spark op)")
    p.wrap(EpochRuntime, "__init__", "runtime init (load pipeline, meta schema txn)")
    # The class that runs it: epoch_job's take_epochs calls it there, not through the runtime.
    p.wrap(EpochTaking, "start_epoch", "op barrier: recover/inject (start_epoch)")
    p.wrap(EpochRuntime, "run_source", "op source: run_source")
    p.wrap(EpochRuntime, "run_view", "op view: run_view")
    p.wrap(EpochRuntime, "commit", "op commit: commit")
    p.wrap(EpochRuntime, "run_sink", "op sink: run_sink")
    p.wrap(Warehouse, "write", "  Spark: Parquet writes + footer counts (Warehouse.write)")
    p.wrap(Warehouse, "read", "  Spark: Parquet read/schema (Warehouse.read)")
    p.wrap(
        DuckDBBackend,
        "transaction",
        lambda args: (
            "  meta-store transactions (meta.duckdb)"
            if args[0].path.name == "meta.duckdb"
            else "  sink DuckDB transactions (sink file)"
        ),
    )
    p.wrap(CheckpointControllerResource, "ensure_partition", "dagster: dynamic partitions (ensure/retire)")
    p.wrap(CheckpointControllerResource, "retire_partitions", "dagster: dynamic partitions (ensure/retire)")
    p.wrap(DagsterInstance, "handle_new_event", "dagster: event log writes (handle_new_event)")


def spark_job_ids(spark: Any) -> set[int]:
    return set(spark.sparkContext.statusTracker().getJobIdsForGroup())


# ------------------------------------------------------------------------------------ pipelines


class BenchPipeline:
    """A pipeline in its own EPOCHAL_HOME, runnable through epoch_job and directly."""

    def __init__(self, root: Path, name: str, source_options: str):
        self.root = root / name
        self.name = name
        self.pipeline_dir = self.root / "pipeline"
        self.home = self.root / "home"
        self.pipeline_dir.mkdir(parents=True)
        for file, text in pipeline_sql(source_options).items():
            (self.pipeline_dir / file).write_text(text)
        self.direct_root = self.root / "direct"
        self.direct_offsets: dict[str, int] = {}
        self.direct_epoch = 0
        self._job = None
        self._connector = None

    @property
    def env(self) -> dict[str, str]:
        return {"EPOCHAL_HOME": str(self.home), "EPOCHAL_PIPELINE": str(self.pipeline_dir)}

    def settings(self):  # noqa: ANN201
        from epochal.settings import Settings

        return Settings.from_env({**self.env, "EPOCHAL_SPARK_MASTER": "local[2]"})

    def load(self) -> float:
        """Builds the Dagster definitions once (a code location loads them once); returns seconds."""
        from epochal.connectors.registry import connector_spec
        from platform_defs.definitions import build_definitions

        started = time.perf_counter()
        settings = self.settings()
        self._job = build_definitions(settings).get_job_def("epoch_job")
        seconds = time.perf_counter() - started
        from epochal.pipeline.loader import load_pipeline

        source = load_pipeline(settings.pipeline_dir).sources["bid"]
        self._connector = connector_spec(source.connector).create(source, self.home)
        return seconds

    # ---------------------------------------------------------------- A: epoch_job in-process

    def run_job(self, instance: Any) -> float:
        from resources.checkpoint import CheckpointControllerResource
        from resources.spark import EpochalSparkResource

        started = time.perf_counter()
        spark = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False)
        checkpoint = CheckpointControllerResource(spark=spark, home=str(self.home), pipeline_dir=str(self.pipeline_dir))
        result = self._job.execute_in_process(  # type: ignore[union-attr]
            instance=instance, resources={"spark": spark, "checkpoint": checkpoint}
        )
        seconds = time.perf_counter() - started
        assert result.success
        return seconds

    # ---------------------------------------------------------------- B: the same Spark work, directly

    def run_direct(self, spark: Any) -> tuple[float, dict[str, float]]:
        import duckdb

        self.direct_epoch += 1
        e = self.direct_epoch
        phases: dict[str, float] = {}
        started = time.perf_counter()
        ranges = self._connector.plan(self.direct_offsets)  # type: ignore[union-attr]
        self.direct_offsets = {r.split: r.end for r in ranges}
        source_loc = str(self.direct_root / "bid" / f"epoch={e}")
        view_loc = str(self.direct_root / "big_bids" / f"epoch={e}")
        self._connector.read(spark, ranges).rows.write.parquet(source_loc)  # type: ignore[union-attr]
        t1 = time.perf_counter()
        phases["source: read + write Parquet"] = t1 - started
        spark.read.parquet(source_loc).createOrReplaceTempView("bid")
        spark.sql(VIEW_SQL).write.parquet(view_loc)
        spark.catalog.dropTempView("bid")
        t2 = time.perf_counter()
        phases["view: SQL + write Parquet"] = t2 - t1
        files = sorted(glob.glob(f"{view_loc}/*.parquet"))
        con = duckdb.connect(str(self.direct_root / "sink.duckdb"))
        try:
            if files:
                listing = "[" + ", ".join(f"'{f}'" for f in files) + "]"
                con.execute("BEGIN TRANSACTION")
                con.execute(f"CREATE TABLE IF NOT EXISTS big_bids AS SELECT * FROM read_parquet({listing}) LIMIT 0")
                con.execute(f"INSERT INTO big_bids SELECT * FROM read_parquet({listing})")
                con.execute("COMMIT")
        finally:
            con.close()
        phases["sink: DuckDB insert"] = time.perf_counter() - t2
        return time.perf_counter() - started, phases


# ------------------------------------------------------------------------- parts 1 and 2


@dataclass
class InProcessResult:
    comparison: Comparison
    profiles: list[dict[str, tuple[int, float]]]
    direct_phases: list[dict[str, float]]
    spark_jobs_a: list[int]
    spark_jobs_b: list[int]
    rows_per_epoch: int
    definitions_s: float


def bench_in_process(pipe: BenchPipeline, spark: Any, reps: int, title: str, budget: Budget) -> InProcessResult:
    import dagster as dg

    from epochal.pipeline.loader import load_pipeline
    from epochal.runtime.facade import EpochRuntime

    definitions_s = pipe.load()
    instance = dg.DagsterInstance.ephemeral()
    comparison = Comparison(title, "A  epoch_job, in-process", "B  same Spark work, direct")
    profiles, phases, jobs_a, jobs_b = [], [], [], []
    for i in range(reps + 1):
        warmup = i == 0
        if i > 2 and not budget.allows_another(comparison):
            comparison.cut = f"cut from {reps} to {i - 1} timed reps by --budget"
            log(f"  [{pipe.name}] {comparison.cut}")
            break
        PROFILER.reset()
        before = spark_job_ids(spark)
        a = pipe.run_job(instance)
        after = spark_job_ids(spark)
        profile = PROFILER.snapshot()
        b, direct = pipe.run_direct(spark)
        jobs_b_run = len(spark_job_ids(spark) - after)
        tag = "warm-up, not counted" if warmup else f"{i}/{reps}"
        log(f"  [{pipe.name}] {tag}: A {a:.3f} s, B {b:.3f} s")
        if warmup:
            continue
        comparison.a.append(a)
        comparison.b.append(b)
        profile["(total)"] = (1, a)
        profiles.append(profile)
        phases.append(direct)
        jobs_a.append(len(after - before))
        jobs_b.append(jobs_b_run)
    settings = pipe.settings()
    runtime = EpochRuntime(settings, load_pipeline(settings.pipeline_dir), lambda: spark)
    rows = runtime.controller.epoch_log.collected(runtime.controller.epoch_log.committed_epoch())["bid"].rows_out or 0
    return InProcessResult(comparison, profiles, phases, jobs_a, jobs_b, rows, definitions_s)


def render_in_process(r: InProcessResult) -> str:
    """The comparison, then a breakdown of the median A run: one real run, so its rows add up
    (medians of the rows over all runs, in the last column, need not)."""
    c = r.comparison
    m = sorted(range(len(c.a)), key=lambda i: c.a[i])[(len(c.a) - 1) // 2]
    run, a_run = r.profiles[m], c.a[m]

    def secs(label: str, profile: dict[str, tuple[int, float]] = run) -> float:
        return profile.get(label, (0, 0.0))[1]

    lines = [f"== {c.title}  (bid rows per epoch: {r.rows_per_epoch:,})", c.render(), ""]
    rows = []
    for label in LABELS:
        rows.append(
            [
                label,
                f"{run.get(label, (0, 0.0))[0]:g}",
                fmt_s(secs(label)),
                f"{100 * secs(label) / a_run:5.1f} %",
                fmt_s(median([secs(label, p) for p in r.profiles])),
            ]
        )
    ops = sum(secs(k) for k in LABELS if k.startswith("op "))
    nested = sum(secs(k) for k, (indent, _) in LABELS.items() if indent == 1 and "java -version" not in k)
    rest = a_run - sum(secs(k) for k, (indent, _) in LABELS.items() if indent == 0)
    rows.append(
        [
            "  rest of the ops (Spark planning/reads, footers, ...)",
            "",
            fmt_s(ops - nested),
            f"{100 * (ops - nested) / a_run:5.1f} %",
            "",
        ]
    )
    rows.append(
        ["rest: Dagster run/step machinery, plan, logging", "", fmt_s(rest), f"{100 * rest / a_run:5.1f} %", ""]
    )
    lines.append(
        f"where A's time goes, in the median A run ({a_run:.3f} s, pair {m + 1}); indented rows are part of "
        "the op rows above them:"
    )
    lines.append(table(["", "calls", "seconds", "of A", "all runs: median"], rows))
    meta = "meta-store transactions (meta.duckdb)"
    by_op = [(k.split(" @ ", 1)[1], n, t) for k, (n, t) in run.items() if k.startswith(f"{meta} @ ")]
    lines.append(
        "meta-store transactions by caller (calls, seconds): " + ", ".join(f"{op} {n} ({t:.3f})" for op, n, t in by_op)
    )
    lines.append("")
    phases = r.direct_phases[m]
    lines.append(f"B by phase, same pair ({c.b[m]:.3f} s):")
    lines.append(
        table(
            ["", "seconds", "all runs: median"],
            [[k, fmt_s(v), fmt_s(median([p[k] for p in r.direct_phases]))] for k, v in phases.items()],
        )
    )
    lines.append(
        f"Spark jobs per epoch: A {median(r.spark_jobs_a):g}, B {median(r.spark_jobs_b):g}.  "
        f"build_definitions (once per process, not timed): {r.definitions_s:.3f} s"
    )
    return "\n".join(lines)


# ------------------------------------------------------------- meta-store transaction cost


def bench_meta_store(pipe: BenchPipeline, root: Path, reps: int) -> Comparison:
    """A fixed mix of 24 meta-store transactions (reads and writes; an epoch took 24 before 49e96c5
    and 18 since), on a copy of a real meta store: A as the DuckDB backend does them (attach the file
    to the process's host DuckDB, one transaction, checkpoint, detach; until b82d11b a new database
    per transaction), B on one connection kept open for all 24 (what a backend that keeps its
    connection for a run or a step would do, locking every other process out meanwhile)."""
    import duckdb

    from epochal.checkpoint.controller import CheckpointController
    from epochal.meta.backend import DuckDBBackend, _DuckCursor

    class KeptOpenBackend(DuckDBBackend):
        con: Any = None

        def transaction(self, fn: Callable[[Any], Any]) -> Any:
            if self.con is None:
                self.con = duckdb.connect(str(self.path))
            self.con.execute("BEGIN TRANSACTION")
            try:
                result = fn(_DuckCursor(self.con))
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            self.con.execute("COMMIT")
            return result

        def close(self) -> None:
            if self.con is not None:
                self.con.close()
                self.con = None

    copy = root / "meta-bench"
    copy.mkdir()
    for f in pipe.home.glob("meta.duckdb*"):
        shutil.copy(f, copy / f.name)
    settings = pipe.settings()
    tables = BENCH_TABLES
    per_txn = DuckDBBackend(copy / "meta.duckdb")
    kept = KeptOpenBackend(copy / "meta.duckdb")
    epoch = CheckpointController(settings, backend=per_txn, **tables).committed_epoch()

    def one_epoch_of_transactions(backend: DuckDBBackend) -> float:
        seconds = transaction_mix(settings, tables, epoch, backend)
        if isinstance(backend, KeptOpenBackend):
            started = time.perf_counter()
            backend.close()  # closed before A runs again: an open handle would let A share the database
            seconds += time.perf_counter() - started
        return seconds

    comparison = Comparison("meta store", "A  attach + detach per transaction", "B  one connection kept open")
    for i in range(reps + 1):
        a = one_epoch_of_transactions(per_txn)
        b = one_epoch_of_transactions(kept)
        if i:
            comparison.a.append(a)
            comparison.b.append(b)
    return comparison


#: The tables of the benchmark pipeline, as the controller knows them.
BENCH_TABLES = dict(sources=["bid"], views=["big_bids"], sinks=["big_bids_out"])


def transaction_mix(settings: Any, tables: dict[str, list[str]], epoch: int, backend: Any) -> float:
    """Seconds for 24 meta-store transactions, reads and writes mixed as in an epoch."""
    from epochal.checkpoint.controller import CheckpointController

    started = time.perf_counter()
    controller = CheckpointController(settings, backend=backend, **tables)  # schema check: 1 txn
    for _ in range(4):  # 1 + 4 * 6 - 1 = 24 transactions
        controller.epoch_log.epoch(epoch)
        controller.epoch_log.offsets(epoch, "bid")
        controller.epoch_log.collected(epoch)
        backend.transaction(
            lambda cur: cur.execute("UPDATE epochs SET heartbeat_at = ? WHERE epoch = ?", [time.time(), epoch])
        )
        controller.epoch_log.committed_epoch()
    controller.epoch_log.in_flight()
    controller.epoch_log.in_flight()
    controller.epoch_log.in_flight()
    return time.perf_counter() - started


def bench_postgres_meta_store(admin_url: str, root: Path, reps: int) -> Comparison:
    """The same 24 transactions on a PostgreSQL meta store (a fresh database, one committed epoch):
    A as the backend does them (connections kept between transactions), B connecting for each one
    (what it did before it kept them)."""
    import uuid

    import psycopg

    from epochal.checkpoint.controller import CheckpointController
    from epochal.checkpoint.records import Collected
    from epochal.connectors.base import SplitRange
    from epochal.meta.backend import PostgresBackend
    from epochal.settings import Settings

    class ConnectPerTransaction(PostgresBackend):
        def _checkout(self) -> tuple[Any, bool]:
            return self._connect(), False  # never one from the pool A keeps

        def _checkin(self, conn: Any) -> None:
            conn.close()

    name = f"epochal_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))  # keeps the user, host and ?options
    try:
        settings = Settings.from_env({"EPOCHAL_HOME": str(root / "pg-home"), "EPOCHAL_META_URL": url})
        controller = CheckpointController(settings, **BENCH_TABLES)
        controller.recover(controller.epoch_log.recovery_reason() or "bootstrap", discard=lambda locations: None)
        epoch = controller.epoch_log.inject(lambda source, starts: [SplitRange("0", 0, 10)]).epoch
        for table in ("bid", "big_bids"):
            controller.epoch_log.collect(epoch, Collected(table, f"/loc/{table}/{epoch}"))
        kept, per_txn = PostgresBackend(url), ConnectPerTransaction(url)
        comparison = Comparison("postgres meta store", "A  connections kept", "B  connect per transaction")
        for i in range(reps + 1):
            a = transaction_mix(settings, BENCH_TABLES, epoch, kept)
            b = transaction_mix(settings, BENCH_TABLES, epoch, per_txn)
            if i:
                comparison.a.append(a)
                comparison.b.append(b)
        return comparison
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def render_postgres_meta_store(c: Comparison, admin_url: str) -> str:
    from epochal.meta.backend import _redact

    return "\n".join(
        [
            f"== 1c. the same 24 transactions on a PostgreSQL meta store ({_redact(admin_url)})",
            c.render(),
            f"per transaction: A {1000 * median(c.a) / 24:.1f} ms, B {1000 * median(c.b) / 24:.1f} ms",
        ]
    )


def render_meta_store(c: Comparison) -> str:
    return "\n".join(
        [
            "== 1b. meta-store transaction cost: 24 transactions on a copy of part 1's meta store",
            c.render(),
            f"per transaction: A {1000 * median(c.a) / 24:.1f} ms, B {1000 * median(c.b) / 24:.1f} ms",
        ]
    )


# ------------------------------------------------------------------------------------ part 3


def _children(parents: dict[int, int] | None = None) -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree[ppid].append(int(entry))
        if parents is not None:
            parents[int(entry)] = ppid
    return tree


def _descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    tree, out, todo = _children(parents), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class CliRun:
    wall: float
    spark_jvms: int  # java ... org.apache.spark.deploy.SparkSubmit among the run's descendants
    helper_jvms: int  # other java processes seen (spark-class launcher, `java -version`); polling may miss some
    jvm_log_lines: int  # "Setting default log level to" lines: Spark prints one per SparkContext
    step_processes: int  # distinct pids that emitted step events
    processes_seen: int  # distinct descendant processes seen by polling (misses some short-lived ones)
    startup: float  # process start -> RUN_START: interpreter, imports, definitions, instance
    steps: dict[str, float]  # step -> STEP_START..STEP_SUCCESS
    step_spawn: float  # multiprocess: sum over steps of STEP_WORKER_STARTING -> STEP_START


def run_cli(kind: str, env: dict[str, str], cwd: Path, dagster_home: Path, n: int) -> CliRun:
    from dagster import DagsterEventType, DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    if kind == "in_process":
        target = ["-m", "platform_defs", "-j", "epoch_job"]
    else:
        target = ["-f", str(MULTIPROCESS_DEFS), "-j", "epoch_job_multiprocess"]
    out_path, err_path = cwd / f"cli-{kind}-{n}.out", cwd / f"cli-{kind}-{n}.err"
    seen: dict[int, str] = {}
    parents: dict[int, int] = {}
    with open(out_path, "w") as out, open(err_path, "w") as err:
        started_wall = time.time()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "job", "execute", *target], cwd=cwd, env=env, stdout=out, stderr=err
        )
        while proc.poll() is None:
            for pid in _descendants(proc.pid, parents):
                # re-read: spark-class is a bash script that execs the JVM under the same pid
                seen[pid] = _cmdline(pid) or seen.get(pid, "")
            time.sleep(0.2)
        wall = time.perf_counter() - started
    text = err_path.read_text(errors="replace") + out_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"dagster job execute ({kind}) failed with {proc.returncode}:\n{text[-4000:]}")
    javas = {pid: cmd for pid, cmd in seen.items() if cmd.split(" ", 1)[0].rsplit("/", 1)[-1] == "java"}
    # The driver JVM runs SparkSubmit. Not JVMs of their own: the short launcher JVM spark-class runs
    # first (org.apache.spark.launcher.Main, with SparkSubmit as its argument), and the JVM's own
    # children (Hadoop forks `chmod`), which show the JVM's command line until they exec.
    drivers = {
        pid
        for pid, cmd in javas.items()
        if "org.apache.spark.deploy.SparkSubmit" in cmd and "org.apache.spark.launcher.Main" not in cmd
    }
    spark_jvms = sum(parents.get(pid) not in drivers for pid in drivers)
    (cwd / f"cli-{kind}-{n}.processes").write_text(
        "\n".join(f"{pid} (parent {parents.get(pid)}) {cmd}" for pid, cmd in sorted(seen.items()))
    )

    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        run = instance.get_runs(limit=1)[0]
        records = instance.all_logs(run.run_id)
    finally:
        instance.dispose()
    first: dict[tuple[str | None, str], float] = {}
    step_pids: set[int] = set()
    for rec in records:
        ev = rec.dagster_event
        if ev is None:
            continue
        first.setdefault((ev.step_key, ev.event_type_value), rec.timestamp)
        if ev.step_key and ev.event_type_value != DagsterEventType.STEP_WORKER_STARTING.value and ev.pid:
            step_pids.add(ev.pid)
    run_start = first.get((None, DagsterEventType.RUN_START.value), started_wall)
    steps, spawn = {}, 0.0
    for (step, etype), ts in first.items():
        if step and etype == DagsterEventType.STEP_START.value:
            end = first.get((step, DagsterEventType.STEP_SUCCESS.value))
            if end is not None:
                steps[step] = end - ts
            worker = first.get((step, DagsterEventType.STEP_WORKER_STARTING.value))
            if worker is not None:
                spawn += ts - worker
    return CliRun(
        wall=wall,
        spark_jvms=spark_jvms,
        helper_jvms=len(javas) - spark_jvms,
        jvm_log_lines=text.count("Setting default log level to"),
        step_processes=len(step_pids),
        processes_seen=len(seen),
        startup=run_start - started_wall,
        steps=steps,
        step_spawn=spawn,
    )


def bench_executors(
    root: Path, pipe: BenchPipeline, reps: int, budget: Budget
) -> tuple[Comparison, list[CliRun], list[CliRun]]:
    import dagster as dg

    dagster_home = root / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPOCHAL_", "DAGSTER_"))}
    env.update(pipe.env)
    env.update(
        {
            "EPOCHAL_SPARK_MASTER": "local[2]",
            "DAGSTER_HOME": str(dagster_home),
            # the real packages, not the editable install's namespace stand-ins (see REPO above)
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
    )
    # Bootstrap the home (its first run recovers from "bootstrap") outside the measurement.
    pipe.load()
    pipe.run_job(dg.DagsterInstance.ephemeral())
    comparison = Comparison("", "A  in_process executor", "B  multiprocess executor")
    a_runs, b_runs = [], []
    for i in range(reps):
        if i >= 1 and not budget.allows_another(comparison):
            log(f"  [executor] stopping after {i} of {reps} rep(s): the time budget is spent (--budget)")
            comparison.cut = f"cut from {reps} to {i} rep(s) by --budget"
            break
        a = run_cli("in_process", env, root, dagster_home, i)
        log(f"  [executor] {i + 1}/{reps}: A in_process {a.wall:.1f} s, {a.spark_jvms} Spark JVM(s)")
        b = run_cli("multiprocess", env, root, dagster_home, i)
        log(f"  [executor] {i + 1}/{reps}: B multiprocess {b.wall:.1f} s, {b.spark_jvms} Spark JVM(s)")
        comparison.a.append(a.wall)
        comparison.b.append(b.wall)
        a_runs.append(a)
        b_runs.append(b)
    return comparison, a_runs, b_runs


def render_executors(c: Comparison, a_runs: list[CliRun], b_runs: list[CliRun], data: str) -> str:
    def med(runs: list[CliRun], f: Callable[[CliRun], float]) -> float:
        return median([f(r) for r in runs])

    rows = []
    for name, runs in ((c.a_name, a_runs), (c.b_name, b_runs)):
        rows.append(
            [
                name,
                str(len(runs)),
                fmt_s(med(runs, lambda r: r.wall)),
                f"{med(runs, lambda r: r.spark_jvms):g}",
                f"{med(runs, lambda r: r.jvm_log_lines):g}",
                f"{med(runs, lambda r: r.step_processes):g}",
                f"{med(runs, lambda r: r.processes_seen):g}",
                fmt_s(med(runs, lambda r: r.startup)),
                fmt_s(med(runs, lambda r: r.step_spawn)),
                fmt_s(med(runs, lambda r: sum(r.steps.values()))),
            ]
        )
    headers = [
        "",
        "n",
        "wall",
        "Spark JVMs",
        "JVM log lines",
        "step procs",
        "procs seen",
        "to RUN_START",
        "step spawn",
        "sum of steps",
    ]
    names = {s for r in a_runs + b_runs for s in r.steps}

    def rank(step: str) -> tuple[int, str]:
        order = ("barrier", "source__", "view__", "commit", "sink__")
        return next(i for i, prefix in enumerate(order) if step.startswith(prefix)), step

    step_rows = [
        [step] + [fmt_s(median([r.steps.get(step, float("nan")) for r in runs])) for runs in (a_runs, b_runs)]
        for step in sorted(names, key=rank)
    ]
    pairs = [b / a for a, b in zip(c.a, c.b, strict=True)]
    return "\n".join(
        [
            f"== 3. executor: one epoch ({data}) as `dagster job execute`, A B A B" + (f"  [{c.cut}]" if c.cut else ""),
            table(headers, rows),
            f"ratio B/A (multiprocess over in-process): median of paired ratios {median(pairs):.2f}x "
            f"(pairs: {', '.join(f'{x:.2f}' for x in pairs)}); difference of medians "
            f"{median(c.b) - median(c.a):+.1f} s",
            "",
            "step durations inside the run (STEP_START -> STEP_SUCCESS, median; a step's first Spark call",
            "starts its process's JVM, so that time is inside the step):",
            table(["step", "in_process", "multiprocess"], step_rows),
        ]
    )


@contextlib.contextmanager
def stderr_to(path: Path, enabled: bool) -> Iterator[None]:
    """Dagster's console logger, Spark's JVM and progress bars write to fd 2: keep it off the report."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as fh:
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def empty_source_options(root: Path) -> tuple[str, str]:
    """``max.events.per.epoch = '0'`` if the loader takes it, else an exhausted source (event.num 0)."""
    from epochal.errors import EpochalError
    from epochal.pipeline.loader import load_pipeline

    probe = root / "probe"
    probe.mkdir()
    (probe / "s.sql").write_text(pipeline_sql("'max.events.per.epoch' = '0'")["01_sources.sql"])
    try:
        load_pipeline(probe)
        return "'max.events.per.epoch' = '0'", "max.events.per.epoch = 0"
    except EpochalError as exc:
        first = str(exc).strip().splitlines()[-1].strip()
        return "'nexmark.event.num' = '0'", f"nexmark.event.num = 0 (max.events.per.epoch = 0 is rejected: {first})"
    finally:
        shutil.rmtree(probe)


def code_version() -> str:
    """The commit measured, and whether the working tree had changes to the code under test."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "epochal", "platform_defs", "resources", "assets"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def check_imports() -> None:
    import importlib.util

    # find_spec, not import: importing platform_defs builds Definitions from the environment.
    for name in ("epochal", "platform_defs", "resources", "assets"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if not str(origin or "").startswith(str(REPO)):
            raise SystemExit(f"{name} would import from {origin}, not from {REPO}: fix sys.path")


def main(argv: list[str] | None = None) -> int:
    check_imports()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions for 1-2, 1 for 3")
    parser.add_argument("--reps", type=int, help="timed repetitions for 1-2 (default 5, --quick 2)")
    parser.add_argument("--exec-reps", type=int, help="repetitions for 3 (default 3, --quick 1)")
    parser.add_argument("--only", default="123", help="which parts to run, e.g. 12 or 3 (default 123)")
    parser.add_argument("--exec-data", choices=["empty", "100k"], default="empty", help="epoch size for part 3")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds the whole run may take before repetitions are cut "
        "(default 570, --quick 170); minimum repetitions always run",
    )
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL URL whose user may create databases, for part 1c (a fresh database, dropped "
        "after); 'none' skips 1c",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, warehouse, meta store)")
    parser.add_argument("--verbose", action="store_true", help="let Dagster/Spark log to the terminal")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 5)
    exec_reps = args.exec_reps or (1 if args.quick else 3)
    budget = Budget(args.budget or (170 if args.quick else 570), args.only)

    for name in [k for k in os.environ if k.startswith("EPOCHAL_")]:
        del os.environ[name]  # a stray EPOCHAL_META_URL must not point the benchmark at real state
    root = Path(tempfile.mkdtemp(prefix="epochal-bench-"))
    os.chdir(root)  # Spark and Dagster drop files in the cwd (derby.log, spark-warehouse, .tmp_dagster_home_*)
    stderr_log = root / "stderr.log"
    began = time.perf_counter()
    load = os.getloadavg()
    header = (
        f"Epochal epoch benchmark, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; nproc {os.cpu_count()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; Python {platform.python_version()}; "
        f"code {code_version()} ({REPO}); "
        f"mode {'--quick' if args.quick else 'default'} ({reps} timed reps + 1 warm-up for 1-2, {exec_reps} for 3)"
    )
    log(header)
    log(f"state under {root}")
    reports: list[str] = []
    spark = None
    try:
        with stderr_to(stderr_log, not args.verbose):
            import pyspark

            from resources.spark import EpochalSparkResource

            install_probes()
            t = time.perf_counter()
            spark_resource = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False)
            spark = spark_resource.spark_session
            log(f"JVM + SparkSession start (not timed): {time.perf_counter() - t:.1f} s; pyspark {pyspark.__version__}")
            empty_opts, empty_note = empty_source_options(root)
            pipes = {
                "empty": BenchPipeline(root, "empty", empty_opts),
                "100k": BenchPipeline(root, "100k", f"'max.events.per.epoch' = '{EVENTS_FOR_100K_BIDS}'"),
            }
            if "1" in args.only:
                log(f"1. empty epoch ({empty_note})")
                budget.start_part("1")
                r = bench_in_process(pipes["empty"], spark, reps, "1. empty epoch", budget)
                reports.append(render_in_process(r) + f"\n(empty source: {empty_note})")
                log("1b. meta-store transactions: attach per transaction vs kept open")
                reports.append(render_meta_store(bench_meta_store(pipes["empty"], root, reps)))
                if args.postgres != "none":
                    import psycopg

                    from epochal.meta.backend import _redact

                    log("1c. the same on a PostgreSQL meta store: connections kept vs connect per transaction")
                    try:
                        c = bench_postgres_meta_store(args.postgres, root, reps)
                        reports.append(render_postgres_meta_store(c, args.postgres))
                    except psycopg.OperationalError as exc:
                        first = str(exc).strip().splitlines()[0]
                        reports.append(f"== 1c. skipped: no PostgreSQL server at {_redact(args.postgres)} ({first}); "
                                       "pass --postgres URL, or --postgres none")
            if "2" in args.only:
                log(f"2. 100k-row epoch (max.events.per.epoch = {EVENTS_FOR_100K_BIDS})")
                budget.start_part("2")
                r = bench_in_process(pipes["100k"], spark, reps, "2. 100k-row epoch", budget)
                reports.append(render_in_process(r))
            if "3" in args.only:
                data = args.exec_data
                log(f"3. executor comparison ({data} epoch), {exec_reps} rep(s)")
                opts = empty_opts if data == "empty" else f"'max.events.per.epoch' = '{EVENTS_FOR_100K_BIDS}'"
                exec_pipe = BenchPipeline(root, f"executor-{data}", opts)
                budget.start_part("3")
                c, a_runs, b_runs = bench_executors(root, exec_pipe, exec_reps, budget)
                label = "empty" if data == "empty" else f"{EVENTS_FOR_100K_BIDS:,} events, ~100k bids"
                reports.append(render_executors(c, a_runs, b_runs, label))
        log("")
        log(header)
        for report in reports:
            log("")
            log(report)
        log("")
        log(
            f"total benchmark time {time.perf_counter() - began:.0f} s; load average at end "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        return 0
    except Exception:
        traceback.print_exc()
        if stderr_log.exists():
            tail = stderr_log.read_text(errors="replace")[-3000:]
            print(f"--- last lines of {stderr_log} ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            with stderr_to(stderr_log, not args.verbose):
                spark.stop()
        os.chdir(REPO)
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
