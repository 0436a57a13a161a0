"""View-maintenance benchmark (issue 3): Epochal's epochs against Spark recompute, Spark Declarative
Pipelines and Spark Structured Streaming, on the same data and the same changes, in one run.

    python benchmarks/bench_views.py                      # 10M rows, changes of 0.1% and 1%, 3 repeats
    python benchmarks/bench_views.py --rows 200000        # smoke run
    python benchmarks/bench_views.py --only agg,ss --mode full --repeats 2

Data: a keyed fact table t(id BIGINT PRIMARY KEY, k BIGINT, v BIGINT, note STRING) of --rows rows,
k spread over --groups groups (default 100,000), and a dimension d(k BIGINT PRIMARY KEY, name STRING,
region STRING) with one row per group, so every t row joins exactly one d row. Both are generated
with DuckDB (seeded, deterministic) as JSON Lines for Epochal's keyed `log` tables and as Parquet for
the baselines. A change epoch touches a fraction of t's rows: 80% updates (one in ten moves its row
to another group), 10% deletes, 10% inserts of new ids. Changes accumulate: each is applied to the
state the previous one left.

1. agg / join   Epochal change epoch (start_epoch, run_source, run_view, commit, in-process, one
                warm SparkSession) against a full recompute of the same view by Spark batch over
                the same state (Parquet in, Parquet out), interleaved pair by pair; beside them,
                Spark running the view over the change's new rows alone, the floor under any
                design that computes each epoch with Spark.
2. sdp          The same views as Spark Declarative Pipelines materialized views over catalog
                tables t and d (spark-pipelines' own launcher: a local Spark Connect server and the
                pipelines client in one JVM + Python pair). After the initial run, t is pointed at
                the same changed state and each view is refreshed alone; its refresh time (run
                start to run completed, from the pipeline's own events) against the Epochal epoch.
3. ss           The aggregation as a Structured Streaming query (RocksDB state store, update
                mode, foreachBatch writing batch <id> to its own Parquet directory with overwrite:
                an idempotent, exactly-once file output) over the same JSON Lines files, one
                micro-batch per epoch: events per second against Epochal's agg epochs.

4. sweep        (--sweep 1000000,5000000,20000000, issue 17) part 1 again at each state size, each
                with its own data, the same change (--change-rows: a fixed number of rows, not a
                fraction): epoch and recompute against the state's size, epoch@largest/epoch@smallest,
                the crossover (the size above which an epoch beats a recompute), and which of the
                epoch's Spark jobs grow with the state. Every epoch records its Spark jobs (step,
                seconds, input records, from Spark's status store) and its driver time, the part of
                the epoch with no Spark job running.

    python benchmarks/bench_views.py --rows 10000000 --sweep 1000000,5000000,20000000 \
        --change-rows 10000 --repeats 2 --warmup 1 --only agg,join,ss

Results: a table of medians and ratios on stdout and a JSON file (--json). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))  # this checkout, not whatever the editable install points at
sys.path.insert(0, str(BENCH_DIR))

from bench_epoch import code_version, median, stderr_to, table  # noqa: E402

AGG_SQL = "SELECT k, COUNT(*) AS n, SUM(v) AS s, AVG(v) AS a, MIN(v) AS lo, MAX(v) AS hi FROM t GROUP BY k"
JOIN_SQL = "SELECT t.id, t.v, d.name FROM t JOIN d ON t.k = d.k"
VIEWS = {"agg": AGG_SQL, "join": JOIN_SQL}
T_COLUMNS = "id BIGINT PRIMARY KEY, k BIGINT, v BIGINT, note STRING"
D_COLUMNS = "k BIGINT PRIMARY KEY, name STRING, region STRING"
#: lines per initial-load split file: the log connector reads a split file as one string
#: (wholetext), so one 10M-line file would be a single ~500 MB value in a single task
INITIAL_SPLIT_LINES = 250_000
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SPARK_CONF = {"spark.sql.shuffle.partitions": "4"}  # Epochal's own default, used by every Spark here
SDP_DRIVER = BENCH_DIR / "sdp_driver.py"


def log(msg: str) -> None:
    print(msg, flush=True)


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.2f} s"


def fmt_x(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3f}x"


def ratio(a: list[float], b: list[float]) -> float | None:
    """Median of the paired ratios a_i / b_i (a pair shares the machine's momentary load)."""
    pairs = [x / y for x, y in zip(a, b, strict=False) if y]
    return median(pairs) if pairs else None


# ------------------------------------------------------------------------------------- data


class Data:
    """t and d as JSON Lines (Epochal, Structured Streaming) and as Parquet states (Spark, SDP).

    A DuckDB database holds t's current state; each change is drawn from it deterministically,
    written as one new split file, applied, and the new state exported as Parquet."""

    def __init__(self, root: Path, rows: int, groups: int, seed: int):
        import duckdb

        self.root = root
        self.rows, self.groups, self.seed = rows, groups, seed
        self.t_log = root / "log" / "t"
        self.d_log = root / "log" / "d"
        self.states = root / "states"
        for p in (self.t_log, self.d_log, self.states):
            p.mkdir(parents=True)
        self.db = duckdb.connect(str(root / "data.duckdb"))
        self.db.execute("SET preserve_insertion_order = false")
        self.next_id = rows
        self.changes: list[dict[str, Any]] = []  # per change: file, counts, state path

    def initial(self) -> dict[str, Any]:
        n, g, s = self.rows, self.groups, self.seed
        started = time.perf_counter()
        self.db.execute(
            f"""CREATE TABLE t AS SELECT i::BIGINT AS id,
                   (hash(i, {s}) % {g})::BIGINT AS k,
                   (hash(i, {s} + 1) % 1000000)::BIGINT AS v,
                   'n' || (i % 997)::VARCHAR AS note
                FROM range({n}) r(i)"""
        )
        self.db.execute(
            f"""CREATE TABLE d AS SELECT i::BIGINT AS k, 'name-' || i::VARCHAR AS name,
                   'region-' || (i % 17)::VARCHAR AS region FROM range({g}) r(i)"""
        )
        files = []
        for part, lo in enumerate(range(0, n, INITIAL_SPLIT_LINES)):
            path = self.t_log / f"a-{part:04d}.jsonl"
            self.db.execute(
                f"COPY (SELECT * FROM t WHERE id >= {lo} AND id < {lo + INITIAL_SPLIT_LINES} ORDER BY id) "
                f"TO '{path}' (FORMAT json)"
            )
            files.append(path)
        self.db.execute(f"COPY (SELECT * FROM d ORDER BY k) TO '{self.d_log / 'd.jsonl'}' (FORMAT json)")
        self.d_parquet = self.states / "d"
        self.d_parquet.mkdir()
        self.db.execute(f"COPY d TO '{self.d_parquet / 'data.parquet'}' (FORMAT parquet)")
        state = self._export_state(0)
        self.initial_files = files
        return {"files": [str(f) for f in files], "state": str(state), "seconds": time.perf_counter() - started}

    def _export_state(self, number: int) -> Path:
        # a directory (a table LOCATION), one file with row groups Spark splits into tasks
        path = self.states / f"t-{number:03d}"
        path.mkdir()
        self.db.execute(f"COPY t TO '{path / 'data.parquet'}' (FORMAT parquet, ROW_GROUP_SIZE 500000)")
        return path

    def change(self, fraction: float, events: int | None = None) -> dict[str, Any]:
        """Draw the next change of ``fraction`` of t's rows (or of exactly ``events`` rows, then
        ``fraction`` is only its label), write it as a new split, apply it."""
        number = len(self.changes) + 1
        total = events if events is not None else max(1, round(self.rows * fraction))
        deletes = total // 10
        inserts = total // 10
        updates = total - deletes - inserts
        salt = self.seed * 1000 + number
        db = self.db
        # deterministic sample of existing ids: the smallest hashes under this change's salt
        db.execute(
            f"""CREATE OR REPLACE TEMP TABLE picked AS
                SELECT id, row_number() OVER (ORDER BY hash(id, {salt}), id) AS r
                FROM (SELECT id FROM t ORDER BY hash(id, {salt}), id LIMIT {updates + deletes})"""
        )
        db.execute(
            f"""CREATE OR REPLACE TEMP TABLE chg AS
                SELECT t.id,
                       CASE WHEN p.r % 10 = 0 THEN (hash(t.id, {salt} + 2) % {self.groups})::BIGINT ELSE t.k END AS k,
                       (hash(t.id, {salt} + 3) % 1000000)::BIGINT AS v,
                       t.note, NULL::VARCHAR AS _op
                FROM picked p JOIN t USING (id) WHERE p.r <= {updates}
                UNION ALL
                SELECT id, NULL, NULL, NULL, 'delete' FROM picked WHERE r > {updates}
                UNION ALL
                SELECT i::BIGINT, (hash(i, {salt} + 4) % {self.groups})::BIGINT,
                       (hash(i, {salt} + 5) % 1000000)::BIGINT, 'new', NULL
                FROM range({self.next_id}, {self.next_id + inserts}) r(i)"""
        )
        self.next_id += inserts
        path = self.t_log / f"c-{number:04d}.jsonl"
        tmp = self.t_log / f".c-{number:04d}.jsonl.tmp"  # hidden until complete: a planner never sees half
        db.execute(f"COPY (SELECT * FROM chg ORDER BY id) TO '{tmp}' (FORMAT json)")
        tmp.rename(path)
        db.execute("DELETE FROM t WHERE id IN (SELECT id FROM picked)")
        db.execute("INSERT INTO t SELECT id, k, v, note FROM chg WHERE _op IS NULL")
        state = self._export_state(number)
        info = {
            "number": number,
            "fraction": fraction,
            "file": str(path),
            "events": total,
            "updates": updates,
            "deletes": deletes,
            "inserts": inserts,
            "state": str(state),
            "rows_after": db.execute("SELECT count(*) FROM t").fetchone()[0],
        }
        self.changes.append(info)
        return info


# ------------------------------------------------------------------------------------- Epochal


def pipeline_files(view: str, mode: str, data: Data) -> dict[str, str]:
    with_clause = " WITH (refresh = 'full')" if mode == "full" else ""
    # keyed (upserts and deletes), so tables: a PRIMARY KEY needs stored rows
    sources = (
        f"CREATE TABLE t ({T_COLUMNS})\nWITH (connector = 'log', path = '{data.t_log}', format = 'json');\n"
    )
    if view == "join":
        sources += f"CREATE TABLE d ({D_COLUMNS})\nWITH (connector = 'log', path = '{data.d_log}', format = 'json');\n"
    return {
        "01_sources.sql": sources,
        "02_views.sql": f"CREATE MATERIALIZED VIEW {view}{with_clause} AS\n{VIEWS[view]};\n",
    }


class EpochalPipeline:
    """One view (and its sources) in its own EPOCHAL_HOME, driven in-process epoch by epoch."""

    def __init__(self, root: Path, view: str, mode: str, data: Data, spark: Any):
        from epochal.pipeline.loader import load_pipeline
        from epochal.runtime.facade import EpochRuntime
        from epochal.settings import Settings

        self.view, self.mode, self.spark = view, mode, spark
        self.root = root / f"epochal-{view}-{mode}"
        pipeline_dir = self.root / "pipeline"
        pipeline_dir.mkdir(parents=True)
        for name, text in pipeline_files(view, mode, data).items():
            (pipeline_dir / name).write_text(text)
        env = {"EPOCHAL_HOME": str(self.root / "home"), "EPOCHAL_PIPELINE": str(pipeline_dir)}
        if mode == "spark":  # incremental, every step on Spark: the driver path off (issue 17)
            env["EPOCHAL_DRIVER_ROWS"] = "0"
        settings = Settings.from_env(env)
        self.runtime = EpochRuntime(settings, load_pipeline(pipeline_dir), lambda: spark)

    def epoch(self, initial: bool = False) -> dict[str, Any]:
        rt = self.runtime
        times: dict[str, Any] = {}
        scheduler = self.spark.sparkContext._jsc.sc().dagScheduler()

        def last_job() -> int:
            # Job ids count up from 0. One Py4J call: the status tracker's job list costs a round
            # trip per id (0.03-0.05 s with the 1,000 it keeps), which inflated the driver's epochs.
            return scheduler.numTotalJobs() - 1

        jobs_before = last_job()
        bounds: list[tuple[str, int]] = []  # (step, last job id when it ended): each job's step
        started = time.perf_counter()
        record, _ = rt.start_epoch(None, None)
        t = time.perf_counter()
        times["start"] = t - started
        bounds.append(("start", last_job()))
        for source in rt.pipeline.sources:
            rt.run_source(record.epoch, source)
            times[f"source {source}"] = time.perf_counter() - t
            bounds.append((f"source {source}", last_job()))
            t = time.perf_counter()
        times["sources"] = sum(v for k, v in times.items() if k.startswith("source "))
        for view in rt.pipeline.view_order():
            rt.run_view(record.epoch, view)
        times["view"] = time.perf_counter() - t
        bounds.append(("view", last_job()))
        t = time.perf_counter()
        rt.commit(record.epoch)
        times["commit"] = time.perf_counter() - t
        times["epoch"] = time.perf_counter() - started
        jobs_after = last_job()
        bounds.append(("commit", jobs_after))
        times["spark_jobs"] = jobs_after - jobs_before
        times.update(job_times(self.spark, jobs_before, bounds, times["epoch"]))
        assert rt.controller.epoch_log.committed_epoch() == record.epoch
        if hasattr(rt, "compact"):
            # What epoch_job runs after the commit (off the epoch's path, beside the sinks): a
            # snapshot when EPOCHAL_COMPACT_EVERY epochs piled up. After the initial load, one
            # snapshot right away (every=1): the steady state of a table with history.
            t = time.perf_counter()
            rt.compact(record.epoch, every=1 if initial else None)
            times["compaction"] = time.perf_counter() - t
        return times


def job_times(spark: Any, first: int, bounds: list[tuple[str, int]], epoch_s: float) -> dict[str, Any]:
    """Where an epoch's wall time went: its Spark jobs (ids after ``first``, each labelled with the
    step whose end ``bounds`` it falls before, its call site and its duration from Spark's own status
    store) and the rest, time with no Spark job running: the driver's own work (planning, analysis
    over Py4J, Parquet footers, meta-store transactions). Read after the epoch's timing."""
    store = spark.sparkContext._jsc.sc().statusStore()  # AppStatusStore: live even with the UI off
    jobs: list[dict[str, Any]] = []
    deadline = time.monotonic() + 5  # the listener bus is asynchronous: wait for the last job's end
    for job_id in range(first + 1, bounds[-1][1] + 1):
        step = next(name for name, last in bounds if job_id <= last)
        while True:
            try:
                data = store.job(job_id)
            except Exception:  # not yet in the store (or evicted: more than 1000 jobs ago)
                data = None
            if data is not None and data.completionTime().isDefined() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if data is None or not data.completionTime().isDefined() or not data.submissionTime().isDefined():
            jobs.append({"id": job_id, "step": step, "name": "?", "start_ms": None, "s": None})
            continue
        begin, end = data.submissionTime().get().getTime(), data.completionTime().get().getTime()
        name = str(data.name()).replace(f"{REPO}/", "")  # the call site Spark saw (often a JDK frame)
        # rows its stages read (from Parquet or from cached blocks): what tells a full scan of the state
        input_rows, tasks = 0, 0
        try:
            stages = data.stageIds()
            for i in range(stages.size()):
                stage = store.lastStageAttempt(stages.apply(i))
                input_rows += stage.inputRecords()
                tasks += stage.numCompleteTasks()
        except Exception:  # a stage already evicted from the store: leave the counts partial
            pass
        jobs.append({"id": job_id, "step": step, "name": name, "start_ms": begin, "s": (end - begin) / 1000,
                     "input_rows": input_rows, "tasks": tasks})
    # union of the jobs' intervals: two jobs running at once (a broadcast beside its query) count once
    spans = sorted((j["start_ms"], j["start_ms"] + j["s"] * 1000) for j in jobs if j["s"] is not None)
    busy, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in spans:
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                busy += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        busy += cur_hi - cur_lo
    return {"jobs_s": busy / 1000, "driver_s": max(0.0, epoch_s - busy / 1000), "jobs": jobs}


def incremental_refusal(root: Path, data: Data) -> str | None:
    """Why the loader refuses the views without WITH (refresh = 'full'), or None if it takes them."""
    from epochal.errors import EpochalError
    from epochal.pipeline.loader import load_pipeline

    problems = []
    for view in VIEWS:
        probe = root / f"probe-{view}"
        probe.mkdir()
        for name, text in pipeline_files(view, "incremental", data).items():
            (probe / name).write_text(text)
        try:
            load_pipeline(probe)
        except EpochalError as exc:
            problems.append(f"{view}: " + " ".join(str(exc).split()))
        finally:
            shutil.rmtree(probe)
    return "; ".join(problems) or None


def _timed_view(spark: Any, view: str, read_t: Any, d_parquet: str, out: Path) -> float:
    """Seconds to read t (``read_t()``, inside the timing: a Parquet read without a schema infers
    one), run ``view``'s SQL over it and d (Parquet), and write the result as Parquet."""
    started = time.perf_counter()
    read_t().createOrReplaceTempView("t")
    spark.read.parquet(d_parquet).createOrReplaceTempView("d")
    try:
        spark.sql(VIEWS[view]).write.mode("overwrite").parquet(str(out))
    finally:
        spark.catalog.dropTempView("t")
        spark.catalog.dropTempView("d")
    return time.perf_counter() - started


def spark_recompute(spark: Any, view: str, state: str, d_parquet: str, out: Path) -> float:
    """Baseline 1: the view over the state as Parquet, by Spark batch, written as Parquet."""
    return _timed_view(spark, view, lambda: spark.read.parquet(state), d_parquet, out)


def spark_over_change(spark: Any, view: str, change_file: str, d_parquet: str, out: Path) -> float:
    """The floor under any design that computes each epoch with Spark: the view's query over the
    change's new rows alone (read from the same JSON Lines file, with its schema given), written as
    Parquet. A correct epoch does more (it retracts the old rows, applies deletes and reads the
    state the change touches), so no Spark-per-epoch design's epoch/recompute can go below this
    one's change/recompute: if that is above the 1/10 target, state layout cannot reach it."""
    schema = f"{T_COLUMNS.replace(' PRIMARY KEY', '')}, _op STRING"
    return _timed_view(spark, view, lambda: spark.read.schema(schema).json(change_file).where("_op IS NULL"),
                       d_parquet, out)


def verify(spark: Any, pipe: EpochalPipeline, state: str, d_parquet: str) -> str:
    """Epochal's committed view against Spark's batch answer over the final state (AVG rounded)."""
    spark.read.parquet(state).createOrReplaceTempView("t")
    spark.read.parquet(d_parquet).createOrReplaceTempView("d")
    try:
        expected = spark.sql(VIEWS[pipe.view])
        got = pipe.runtime.state(pipe.view)
        if pipe.view == "agg":
            from pyspark.sql import functions as F

            expected = expected.withColumn("a", F.round("a", 6))
            got = got.withColumn("a", F.round("a", 6))
        got = got.select(*expected.columns)
        missing = expected.exceptAll(got).count()
        extra = got.exceptAll(expected).count()
    finally:
        spark.catalog.dropTempView("t")
        spark.catalog.dropTempView("d")
    return "ok" if missing == extra == 0 else f"MISMATCH: {missing} row(s) missing, {extra} extra"


# ------------------------------------------------------------------------------------- part 1


@dataclass
class ViewSeries:
    view: str
    mode: str
    initial: dict[str, float] = field(default_factory=dict)
    #: fraction -> list of per-epoch step times / recompute seconds, paired by index
    epochs: dict[float, list[dict[str, float]]] = field(default_factory=dict)
    recompute: dict[float, list[float]] = field(default_factory=dict)
    #: Spark over the change's rows alone (spark_over_change), paired with the recompute by index
    change_only: dict[float, list[float]] = field(default_factory=dict)
    #: epochs with no change at all, after the change epochs: the fixed cost no change can go below
    empty: list[dict[str, float]] = field(default_factory=list)
    #: --warmup change epochs: "epochs", "recompute", "change_only" lists, not in the medians
    warmup: dict[str, list[Any]] = field(default_factory=dict)
    verified: str = "not checked"


def run_part1(args: Any, root: Path, data: Data, spark: Any, modes: list[str], views: list[str],
              rows: int | None = None) -> dict[str, Any]:
    pipes = {(v, m): EpochalPipeline(root, v, m, data, spark) for v in views for m in modes}
    series = {key: ViewSeries(*key) for key in pipes}
    for key, pipe in pipes.items():
        log(f"  initial load into Epochal {key[0]} ({key[1]}): {rows or args.rows:,} rows of t")
        series[key].initial = pipe.epoch(initial=True)
        init = series[key].initial
        log(f"    {fmt_s(init['epoch'])} (source {fmt_s(init['sources'])}, view {fmt_s(init['view'])}); "
            f"compaction after it {fmt_s(init.get('compaction'))}")
    out = root / "recompute"
    n = 0
    specs = change_specs(args, data.rows)
    # --warmup: untimed change epochs first (the first after the initial load fills the snapshot
    # cache, the SS query's first batch loads its state store), kept apart from the medians
    plan = [(None, spec) for _ in range(args.warmup) for spec in specs[:1]]
    plan += [(rep, spec) for rep in range(args.repeats) for spec in specs]
    for rep, (fraction, events) in plan:
        change = data.change(fraction, events)
        change["warmup"] = rep is None
        log(f"  change {change['number']}: {fraction:.2%} of t = {change['events']:,} events "
            + ("(warm-up, not in the medians)" if rep is None else f"(rep {rep + 1}/{args.repeats})"))
        for view in views:
            for mode in modes:
                s = series[(view, mode)]
                # a warm-up's times go to their own lists, under the same keys
                epochs = s.warmup.setdefault("epochs", []) if rep is None else s.epochs.setdefault(fraction, [])
                recs = s.warmup.setdefault("recompute", []) if rep is None else s.recompute.setdefault(fraction, [])
                alone = (s.warmup.setdefault("change_only", []) if rep is None
                         else s.change_only.setdefault(fraction, []))

                def a(epochs: list = epochs, view: str = view, mode: str = mode) -> None:
                    times = pipes[(view, mode)].epoch()
                    epochs.append(times)
                    log(f"    Epochal {view:4} {mode:11} epoch {fmt_s(times['epoch'])} "
                        f"(source {fmt_s(times['sources'])}, view {fmt_s(times['view'])}, "
                        f"{times['spark_jobs']:.0f} Spark jobs {fmt_s(times['jobs_s'])}, "
                        f"driver without a job {fmt_s(times['driver_s'])}; "
                        f"compaction after it {fmt_s(times.get('compaction'))})")

                def b(recs: list = recs, view: str = view) -> None:
                    secs = spark_recompute(spark, view, change["state"], str(data.d_parquet), out / view)
                    recs.append(secs)
                    log(f"    Spark   {view:4} recompute   {fmt_s(secs)}")

                def c(alone: list = alone, view: str = view) -> None:
                    secs = spark_over_change(spark, view, change["file"], str(data.d_parquet), out / "change")
                    alone.append(secs)
                    log(f"    Spark   {view:4} over the change alone {fmt_s(secs)}")

                for step in ((a, b, c) if n % 2 == 0 else (c, b, a)):  # A B C, C B A: drift cancels out
                    step()
        n += 1
    for key, pipe in pipes.items():
        # No new record anywhere: what an epoch costs before it does any work (barrier, steps,
        # Parquet commits, meta-store transactions), the floor under every ratio above.
        for _ in range(2):
            series[key].empty.append(pipe.epoch())
        times = series[key].empty[-1]
        log(f"  Epochal {key[0]:4} {key[1]:11} empty epoch {fmt_s(times['epoch'])} (source {fmt_s(times['sources'])}, "
            f"view {fmt_s(times['view'])}, {times['spark_jobs']:.0f} Spark jobs)")
    if args.verify:
        final = data.changes[-1]["state"] if data.changes else data.initial_state
        for key, pipe in pipes.items():
            series[key].verified = verify(spark, pipe, final, str(data.d_parquet))
            log(f"  check {key[0]} ({key[1]}) against Spark batch over the final state: {series[key].verified}")
    for pipe in pipes.values():
        pipe.runtime.close()  # unpersist its cached snapshots: the next size runs in the same session
    return {f"{v}/{m}": series[(v, m)] for v, m in series}


def change_specs(args: Any, rows: int) -> list[tuple[float, int | None]]:
    """(fraction, events) of each change per repeat: --change-rows fixes the events (same at every
    state size; its fraction is then only a label), else the --change fractions of ``rows``."""
    if args.change_rows:
        return [(args.change_rows / rows, args.change_rows)]
    return [(f, None) for f in args.change]


def part1_result(series: dict[str, ViewSeries], data: Data) -> dict[str, Any]:
    """Part 1's series as JSON (the views entry of a result, of the main run or of one sweep size)."""
    return {
        key: {
            "view": s.view, "mode": s.mode, "initial": s.initial, "verified": s.verified,
            "empty": s.empty, "warmup": s.warmup, "rows": data.rows,
            "epochs": {str(f): e for f, e in s.epochs.items()},
            "recompute": {str(f): r for f, r in s.recompute.items()},
            "change_only": {str(f): r for f, r in s.change_only.items()},
            "events": {str(f): next(c["events"] for c in data.changes if c["fraction"] == f and not c["warmup"])
                       for f in s.epochs},
        }
        for key, s in series.items()
    }


def run_sweep(args: Any, root: Path, views: list[str], result: dict[str, Any], save: Any) -> None:
    """Part 1 again at each --sweep size (its own data dir, one SparkSession for all sizes, smallest
    first so a size that does not fit leaves the smaller ones measured), into result["sweep"]."""
    from epochal.spark.session import build_spark_session

    modes = result.get("modes", ["incremental"])
    spark = build_spark_session(
        master="local[2]", app_name="bench-views-sweep",
        conf={**SPARK_CONF, "spark.driver.memory": args.driver_memory},
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for rows in sorted(args.sweep):
            if rows == args.rows and result.get("views"):
                log(f"  {rows:,} rows: measured above (the main run)")
                continue
            size_root = root / f"sweep-{rows}"
            size_root.mkdir()
            entry: dict[str, Any] = {"rows": rows, "started": dt.datetime.now().astimezone().isoformat(),
                                     "load_start": os.getloadavg()}
            result["sweep"][str(rows)] = entry
            began = time.perf_counter()
            try:
                data = Data(size_root, rows, args.groups, args.seed)
                info = data.initial()
                data.initial_state = info["state"]
                log(f"  {rows:,} rows of t: data generated with DuckDB in {info['seconds']:.1f} s")
                series = run_part1(args, size_root, data, spark, modes, views, rows=rows)
                entry["views"] = part1_result(series, data)
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


# ------------------------------------------------------------------------------------- part 2: SDP


def sdp_environment() -> tuple[dict[str, str] | None, str]:
    """The environment spark-pipelines needs, or None and why it cannot run here."""
    import pyspark

    env = dict(os.environ)
    python = os.environ.get("BENCH_SDP_PYTHON") or sys.executable
    probe = subprocess.run(
        [python, "-c", "import pyspark.sql.connect, pyspark.pipelines.cli"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, (
            f"{python} cannot import the Spark Connect client that spark-pipelines needs: {last}. "
            "Install pyspark's pipelines extra (grpcio-status, googleapis-common-protos, zstandard), "
            "e.g. into a venv with --system-site-packages, and point BENCH_SDP_PYTHON at its python"
        )
    spark_home = Path(pyspark.__file__).parent
    env.update(
        {
            "SPARK_HOME": str(spark_home),
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env, str(spark_home / "bin" / "spark-class")


def run_sdp(args: Any, root: Path, data: Data, views: list[str]) -> dict[str, Any]:
    env, spark_class = sdp_environment()
    if env is None:
        return {"error": spark_class}
    work = root / "sdp"
    (work / "transformations").mkdir(parents=True)
    (work / "spark-pipeline.yml").write_text(
        "name: bench_views\n"
        f"storage: file://{work / 'storage'}\n"
        "configuration:\n"
        + "".join(f"  {k}: \"{v}\"\n" for k, v in SPARK_CONF.items())
        + "libraries:\n  - glob:\n      include: transformations/**\n"
    )
    for view in views:
        (work / "transformations" / f"{view}.sql").write_text(
            f"CREATE MATERIALIZED VIEW {view}_mv AS\n{VIEWS[view]};\n"
        )
    config = {
        "spec": str(work / "spark-pipeline.yml"),
        "views": [f"{v}_mv" for v in views],
        "initial_state": data.initial_state,
        "d": str(data.d_parquet),
        "changes": [{"fraction": c["fraction"], "state": c["state"]} for c in data.changes],
        "out": str(work / "result.json"),
        "warehouse": str(work / "warehouse"),
    }
    (work / "config.json").write_text(json.dumps(config))
    env["SPARK_DRIVER_MEMORY"] = args.driver_memory
    cmd = [
        spark_class,
        "org.apache.spark.deploy.SparkPipelines",
        str(SDP_DRIVER),
        str(work / "config.json"),
    ]
    log(f"  {' '.join(cmd)}")
    started = time.perf_counter()
    with open(work / "output.log", "w") as out:
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.sdp_timeout)
    wall = time.perf_counter() - started
    text = (work / "output.log").read_text(errors="replace")
    if proc.returncode != 0 or not (work / "result.json").exists():
        errors = [ln for ln in text.splitlines() if "Error" in ln or "Exception" in ln or "error" in ln]
        return {"error": f"spark-pipelines exited {proc.returncode}: " + " | ".join(errors[-5:])[-1500:],
                "log": str(work / "output.log")}
    result = json.loads((work / "result.json").read_text())
    result["process_wall_s"] = wall
    return result


# ------------------------------------------------------------------------------------- part 3: SS


def run_ss(args: Any, root: Path, data: Data) -> dict[str, Any]:
    """Structured Streaming in its own process (own JVM, same Spark conf as Epochal's)."""
    work = root / "ss"
    work.mkdir()
    steps = [{"name": "initial load", "files": [str(f) for f in data.initial_files], "events": data.rows}]
    for c in data.changes:
        steps.append({"name": f"change {c['number']}", "fraction": c["fraction"], "files": [c["file"]],
                      "events": c["events"], "warmup": c.get("warmup", False)})
    config = {"work": str(work), "steps": steps, "driver_memory": args.driver_memory}
    (work / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHAL_")}
    proc = subprocess.run(
        [sys.executable, __file__, "--ss-worker", str(work / "config.json")],
        env=env, capture_output=True, text=True, timeout=args.ss_timeout,
    )
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0 or not (work / "result.json").exists():
        tail = " | ".join(proc.stderr.strip().splitlines()[-6:])
        return {"error": f"Structured Streaming worker exited {proc.returncode}: {tail[-1500:]}"}
    return json.loads((work / "result.json").read_text())


def ss_worker(config_path: str) -> int:
    """One streaming aggregation over the steps' files, one availableNow run (one batch) per step."""
    from pyspark.sql import functions as F

    from epochal.spark.session import build_spark_session

    config = json.loads(Path(config_path).read_text())
    work = Path(config["work"])
    inbox, out, checkpoint = work / "inbox", work / "out", work / "checkpoint"
    inbox.mkdir()
    spark = build_spark_session(
        master="local[2]",
        app_name="bench-views-ss",
        conf={
            **SPARK_CONF,
            "spark.driver.memory": config["driver_memory"],
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = "id BIGINT, k BIGINT, v BIGINT, note STRING, _op STRING"
    # An insert-only stream: upserts arrive as new rows, deletes cannot retract anything and are dropped.
    events = spark.readStream.schema(schema).json(str(inbox)).where("_op IS NULL OR lower(_op) <> 'delete'")
    agg = events.groupBy("k").agg(
        F.count("*").alias("n"), F.sum("v").alias("s"), F.avg("v").alias("a"),
        F.min("v").alias("lo"), F.max("v").alias("hi"),
    )

    def write_batch(batch: Any, batch_id: int) -> None:
        # Idempotent per batch id: a replayed batch (same offsets, same rows) overwrites its own output.
        batch.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    results = []
    for step in config["steps"]:
        for f in step["files"]:
            os.link(f, inbox / Path(f).name)
        started = time.perf_counter()
        query = (
            agg.writeStream.outputMode("update")
            .foreachBatch(write_batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
        rows = sum(p["numInputRows"] for p in progress)
        trigger = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        results.append({**{k: v for k, v in step.items() if k != "files"}, "batches": len(progress),
                        "input_rows": rows, "batch_s": trigger, "query_wall_s": wall,
                        "state_rows": (progress[-1]["stateOperators"][0]["numRowsTotal"] if progress else None)})
        print(f"  [ss] {step['name']}: {rows} rows in {len(progress)} batch(es), {trigger:.2f} s "
              f"(query wall {wall:.2f} s)", file=sys.stderr, flush=True)
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    spark.stop()
    (work / "result.json").write_text(json.dumps({"steps": results, "state_store": provider}))
    return 0


# ------------------------------------------------------------------------------------- report


def render(result: dict[str, Any]) -> str:
    lines = []
    part1 = result.get("views", {})
    sdp = result.get("sdp", {})
    if part1:
        headers = ["view", "mode", "change", "events", "n", "Epochal epoch", "Spark jobs", "job time", "driver",
                   "source", "view step",
                   "Spark recompute", "epoch/recompute", "view/recompute", "Spark over change", "change/recompute",
                   "SDP refresh", "epoch/SDP"]
        rows = []
        for key, s in part1.items():
            view, mode = key.split("/")
            for fraction, epochs in s["epochs"].items():
                rec = s["recompute"][fraction]
                alone = s.get("change_only", {}).get(fraction, [])  # (not in results before 2026-11-22)
                ep = [e["epoch"] for e in epochs]
                vs = [e["view"] for e in epochs]
                sdp_times = [r["run_s"] for r in sdp.get("refresh", []) if r["view"] == f"{view}_mv"
                             and r["fraction"] == float(fraction)]
                rows.append([
                    view, mode, f"{float(fraction):.2%}", f"{s['events'][fraction]:,}", str(len(ep)),
                    fmt_s(median(ep)), jobs_cell(epochs), *time_cells(epochs),
                    fmt_s(median([e["sources"] for e in epochs])), fmt_s(median(vs)),
                    fmt_s(median(rec)), fmt_x(ratio(ep, rec)), fmt_x(ratio(vs, rec)),
                    fmt_s(median(alone)) if alone else "n/a", fmt_x(ratio(alone, rec)) if alone else "n/a",
                    fmt_s(median(sdp_times)) if sdp_times else "n/a",
                    fmt_x(median(ep) / median(sdp_times)) if sdp_times else "n/a",
                ])
        lines.append("== 1-2. change epochs: Epochal against Spark full recompute and SDP refresh (medians; "
                     "epoch/recompute is the median of paired ratios; 'Spark over change' is the view's query "
                     "over the change's new rows alone, the floor of any Spark-per-epoch design)")
        lines.append(table(headers, rows))
        for key, s in part1.items():
            empty = [e["epoch"] for e in s.get("empty", [])]
            recomputes = [r for rec in s["recompute"].values() for r in rec]
            if empty and recomputes:
                lines.append(f"empty epoch {key} (no change: the floor): {fmt_s(median(empty))}, "
                             f"{fmt_x(median(empty) / median(recomputes))} the median recompute")
        for key, s in part1.items():
            init = s["initial"]
            lines.append(f"initial load {key}: epoch {fmt_s(init.get('epoch'))} (source {fmt_s(init.get('sources'))},"
                         f" view {fmt_s(init.get('view'))}; snapshot after it {fmt_s(init.get('compaction'))}); "
                         f"check against Spark batch over the final state: {s['verified']}")
    if sdp:
        if "error" in sdp:
            lines.append(f"SDP: could not run: {sdp['error']}")
        else:
            flows = {}
            for r in sdp.get("refresh", []):
                flows.setdefault(r["view"], []).extend(r["flow_s"].values())
            lines.append(
                f"SDP: initial run of all views {fmt_s(sdp.get('initial_run_s'))}; 'SDP refresh' = one pipeline run "
                f"refreshing one materialized view, StartRun to its last event (flow RUNNING->COMPLETED alone, median: "
                + ", ".join(f"{v} {fmt_s(median(x))}" for v, x in flows.items())
                + f"); spark-pipelines process wall, JVM start included, {fmt_s(sdp.get('process_wall_s'))}"
            )
    ss = result.get("ss")
    if ss:
        lines.append("")
        if "error" in ss:
            lines.append(f"== 3. Structured Streaming: could not run: {ss['error']}")
        else:
            agg_epochs = result.get("ss_epochal", {})
            headers = ["step", "events", "n", "Epochal s", "Epochal ev/s", "SS batch s", "SS ev/s", "Epochal/SS ev/s",
                       "Epochal/SS time"]
            rows = []
            for label, ep_times, ss_times, events in ss_table(ss, agg_epochs):
                e, b = median(ep_times) if ep_times else None, median(ss_times) if ss_times else None
                rows.append([label, f"{events:,}", f"{len(ep_times)}/{len(ss_times)}", fmt_s(e),
                             f"{events / e:,.0f}" if e else "n/a", fmt_s(b), f"{events / b:,.0f}" if b else "n/a",
                             fmt_x(b / e) if e and b else "n/a", fmt_x(e / b) if e and b else "n/a"])
            lines.append(f"== 3. agg as Structured Streaming ({ss.get('state_store')}, update mode, foreachBatch "
                         "idempotent Parquet per batch id) against Epochal's agg epochs, same files; medians")
            lines.append(table(headers, rows))
            lines.append(
                "SS reads the same JSON Lines files as an insert-only stream: an update arrives as one more row of"
                " its key (the old row is never retracted), a delete is dropped, so its aggregate drifts from the"
                " view's true value; Epochal retracts and replaces. Epochal's time is the whole agg epoch"
                " (source step + view step + commit); SS's is the micro-batch's triggerExecution. n = epochs/batches"
                " in the medians (warm-ups left out); the two run one after the other, not interleaved, so"
                " Epochal/SS time is a ratio of medians (target for a change: <= 1.0x)."
            )
            warm = [s_["batch_s"] for s_ in ss["steps"][1:] if s_.get("warmup")]
            if warm:
                lines.append(f"SS warm-up batch(es), not in the medians: {', '.join(fmt_s(x) for x in warm)}")
    sweep = sweep_points(result)
    if sweep:
        lines.append("")
        lines.extend(render_sweep(result, sweep))
    return "\n".join(lines)


def jobs_cell(epochs: list[dict[str, float]]) -> str:
    jobs = [e["spark_jobs"] for e in epochs if "spark_jobs" in e]
    return f"{median(jobs):.0f}" if jobs else "n/a"


def time_cells(epochs: list[dict[str, Any]]) -> list[str]:
    """Median time with a Spark job running, and without (the driver alone); n/a in older results."""
    busy = [e["jobs_s"] for e in epochs if "jobs_s" in e]
    idle = [e["driver_s"] for e in epochs if "driver_s" in e]
    return [fmt_s(median(busy)) if busy else "n/a", fmt_s(median(idle)) if idle else "n/a"]


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
    lines.append("== 4. the same change against the state's size (medians; epoch/recompute is the median of paired "
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


def ss_table(ss: dict[str, Any], agg_epochs: dict[str, Any]) -> list[tuple[str, list[float], list[float], int]]:
    out = []
    steps = ss["steps"]
    out.append(("initial load", [agg_epochs["initial"]] if "initial" in agg_epochs else [],
                [steps[0]["batch_s"]], steps[0]["events"]))
    timed = [s for s in steps[1:] if not s.get("warmup")]
    fractions = sorted({s["fraction"] for s in timed})
    for f in fractions:
        chosen = [s for s in timed if s["fraction"] == f]
        out.append((f"change {f:.1%}", agg_epochs.get("changes", {}).get(str(f), []),
                    [s["batch_s"] for s in chosen], chosen[0]["events"]))
    return out


# ------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000, help="rows of t (default 10,000,000)")
    p.add_argument("--groups", type=int, default=100_000, help="distinct k = rows of d (default 100,000)")
    p.add_argument("--change", default="0.001,0.01", help="fractions of t changed per epoch (default 0.001,0.01)")
    p.add_argument("--change-rows", type=int, default=None,
                   help="a fixed number of changed rows per epoch, the same at every state size (overrides --change)")
    p.add_argument("--repeats", type=int, default=3, help="change epochs per fraction (default 3)")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed change epochs before the timed ones, at every size (default 0)")
    p.add_argument("--sweep", default="",
                   help="comma list of t sizes (e.g. 1000000,5000000,20000000): part 1 (agg, join) again at each, "
                   "its own data, the same change; prints epoch and recompute against the size and the crossover")
    p.add_argument("--only", default="agg,join,sdp,ss", help="comma list of agg, join, sdp, ss")
    p.add_argument("--mode", default="incremental",
                   help="comma list of how Epochal maintains the views: incremental (small epochs on the driver, "
                   "the default), spark (incremental with every step on Spark: EPOCHAL_DRIVER_ROWS=0), full; "
                   "'both' is incremental,full. Incremental falls back to full, labelled, when the loader refuses")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--driver-memory", default="6g", help="spark.driver.memory of every Spark here (default 6g)")
    p.add_argument("--json", help="result file (default benchmarks/results/bench_views-<time>.json)")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the final check of the views")
    p.add_argument("--sdp-timeout", type=int, default=3600)
    p.add_argument("--ss-timeout", type=int, default=3600)
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--verbose", action="store_true", help="let Spark log to the terminal")
    p.add_argument("--report", help="print the tables of a result JSON file and exit")
    p.add_argument("--ss-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.change = [float(x) for x in args.change.split(",") if x.strip()]
    args.sweep = sorted({int(x) for x in args.sweep.split(",") if x.strip()})
    if args.change_rows is not None and args.change_rows < 1:
        p.error("--change-rows: at least 1")
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = args.only - {"agg", "join", "sdp", "ss"}
    if unknown:
        p.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; use agg, join, sdp, ss")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ss_worker:
        return ss_worker(args.ss_worker)
    if args.report:
        result = json.loads(Path(args.report).read_text())
        log(result["header"])
        log(render(result))
        return 0
    path = Path(args.json).resolve() if args.json else (
        BENCH_DIR / "results" / f"bench_views-{dt.datetime.now():%Y%m%d-%H%M%S}-{args.rows}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every part: a long run cut short keeps what it measured (--report)
        path.write_text(json.dumps(result, indent=1, default=str))
    for name in [k for k in os.environ if k.startswith("EPOCHAL_")]:
        del os.environ[name]  # a stray EPOCHAL_META_URL must not point the benchmark at real state
    root = Path(tempfile.mkdtemp(prefix="epochal-views-"))
    os.chdir(root)  # Spark drops derby.log and spark-warehouse in the cwd
    stderr_log = root / "stderr.log"
    load = os.getloadavg()
    began = time.perf_counter()
    code = os.environ.get("BENCH_CODE_VERSION") or code_version()  # set when running an exported tree
    header = (
        f"Epochal view-maintenance benchmark, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; nproc "
        f"{os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; Python "
        f"{platform.python_version()}; code {code}; rows {args.rows:,}, groups {args.groups:,}, "
        + (f"changes of {args.change_rows:,} rows" if args.change_rows else
           f"changes {', '.join(f'{c:.1%}' for c in args.change)}")
        + f" x {args.repeats}" + (f" after {args.warmup} warm-up" if args.warmup else "")
        + f"; only {','.join(sorted(args.only))}"
        + (f"; sweep {', '.join(f'{n:,}' for n in args.sweep)} rows" if args.sweep else "")
    )
    log(header)
    log(f"state under {root}")
    result: dict[str, Any] = {"header": header, "args": {k: (sorted(v) if isinstance(v, set) else v)
                                                         for k, v in vars(args).items()},
                              "load_start": load, "started": dt.datetime.now().astimezone().isoformat()}
    spark = None
    try:
        with stderr_to(stderr_log, not args.verbose):
            import pyspark

            from epochal.spark.session import build_spark_session

            data = Data(root, args.rows, args.groups, args.seed)
            info = data.initial()
            data.initial_state = info["state"]
            log(f"data: {args.rows:,} rows of t in {len(info['files'])} split file(s), {args.groups:,} rows of d, "
                f"generated with DuckDB in {info['seconds']:.1f} s")
            views = [v for v in ("agg", "join") if v in args.only]
            need_epochal = bool(views) or "ss" in args.only
            if "ss" in args.only and "agg" not in views:
                views = ["agg", *views]  # Structured Streaming is compared with Epochal's agg epochs
            modes = ["incremental", "full"] if args.mode == "both" else args.mode.split(",")
            unknown = sorted(set(modes) - {"incremental", "spark", "full"})
            if unknown:
                raise SystemExit(f"--mode {','.join(unknown)}: use incremental, spark or full (comma list)")
            refusal = incremental_refusal(root, data) if "incremental" in modes else None
            result["incremental_refused"] = refusal
            if refusal:
                log(f"NOTE: incremental mode is refused by the loader ({refusal[:300]}); running refresh = 'full'")
                modes = sorted({"full" if m == "incremental" else m for m in modes})
            result["modes"] = modes
            if need_epochal:
                spark = build_spark_session(
                    master="local[2]", app_name="bench-views",
                    conf={**SPARK_CONF, "spark.driver.memory": args.driver_memory},
                )
                spark.sparkContext.setLogLevel("ERROR")
                log(f"1. Epochal ({', '.join(modes)}) against Spark recompute; pyspark {pyspark.__version__}")
                series = run_part1(args, root, data, spark, modes, views)
                spark.stop()
                spark = None
                result["views"] = part1_result(series, data)
                agg_key = next((k for k in result["views"] if k.startswith("agg/")), None)
                if agg_key:
                    agg = result["views"][agg_key]
                    result["ss_epochal"] = {
                        "mode": agg["mode"], "initial": agg["initial"]["epoch"],
                        "changes": {f: [e["epoch"] for e in eps] for f, eps in agg["epochs"].items()},
                    }
            else:
                specs = change_specs(args, data.rows)
                for rep in [None] * args.warmup + list(range(args.repeats)):
                    for fraction, events in specs[:1] if rep is None else specs:
                        data.change(fraction, events)["warmup"] = rep is None
            result["changes"] = data.changes
            save()
            if "sdp" in args.only:
                log("2. Spark Declarative Pipelines (spark-pipelines): materialized views, refresh after each change")
                result["sdp"] = run_sdp(args, root, data, [v for v in ("agg", "join") if v in args.only] or
                                        ["agg", "join"])
                log(f"  {'error: ' + result['sdp']['error'] if 'error' in result['sdp'] else 'done'}")
                save()
            if "ss" in args.only:
                log("3. Structured Streaming (RocksDB state store), same files, one batch per epoch")
                result["ss"] = run_ss(args, root, data)
                log(f"  {'error: ' + result['ss']['error'] if 'error' in result['ss'] else 'done'}")
                save()
            if args.sweep:
                # the main size's data goes first: the largest sweep size needs the disk
                shutil.rmtree(root / "log", ignore_errors=True)
                shutil.rmtree(root / "states", ignore_errors=True)
                log(f"4. sweep of the state's size: {', '.join(f'{n:,}' for n in args.sweep)} rows of t, "
                    f"the same change at each; views {', '.join(v for v in ('agg', 'join') if v in args.only)}")
                result["sweep"] = {}
                run_sweep(args, root, [v for v in ("agg", "join") if v in args.only], result, save)
        result["load_end"] = os.getloadavg()
        result["seconds"] = time.perf_counter() - began
        report = render(result)
        log("")
        log(header)
        log(f"modes: {', '.join(result.get('modes', []))}"
            + (f" (incremental refused: {result['incremental_refused']})" if result.get("incremental_refused") else ""))
        log(report)
        log(f"total benchmark time {result['seconds']:.0f} s; load average at end "
            f"{' '.join(f'{x:.2f}' for x in result['load_end'])}")
        save()
        log(f"result: {path}")
        return 0
    except Exception:
        traceback.print_exc()
        if stderr_log.exists():
            print(f"--- last lines of {stderr_log} ---\n{stderr_log.read_text(errors='replace')[-3000:]}",
                  file=sys.stderr)
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
