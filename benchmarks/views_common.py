"""What the view-maintenance benchmarks share (bench_views, bench_views_sweep, bench_views_streaming,
bench_driver_lookup): the data, the Epochal pipeline driven epoch by epoch in-process, the Spark
baselines, the paired series of part 1 and its table, and the command line they have in common.

Data: a keyed fact table t(id BIGINT PRIMARY KEY, k BIGINT, v BIGINT, note STRING) of --rows rows,
k spread over --groups groups (default 100,000), and a dimension d(k BIGINT PRIMARY KEY, name STRING,
region STRING) with one row per group, so every t row joins exactly one d row. Both are generated
with DuckDB (seeded, deterministic) as JSON Lines for Epochal's keyed `log` tables and as Parquet for
the baselines. A change epoch touches a fraction of t's rows (or --change-rows rows): 80% updates (one
in ten moves its row to another group), 10% deletes, 10% inserts of new ids. Changes accumulate: each
is applied to the state the previous one left.

The views: ``agg`` (a grouped aggregation of t) and ``join`` (t joined with d).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import REPO, fmt_s, fmt_x, log, median, table

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


def ratio(a: list[float], b: list[float]) -> float | None:
    """Median of the paired ratios a_i / b_i, None when there is no pair."""
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
        cpu_before = harness.driver_cpu_reading(self.spark)
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
        # issue 58, goal 5: the driver's CPU per epoch should not grow with the epoch's rows
        times["driver_python_cpu"], times["driver_jvm_cpu"] = harness.driver_cpu_since(self.spark, cpu_before)
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
        log(f"    {fmt_s(init['epoch'])} (source {fmt_s(init['sources'])}, view {fmt_s(init['view'])}, driver CPU "
            f"Python {fmt_s(init['driver_python_cpu'])} JVM {fmt_s(init['driver_jvm_cpu'])}); "
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
                        f"driver without a job {fmt_s(times['driver_s'])}, driver CPU Python "
                        f"{fmt_s(times['driver_python_cpu'])} JVM {fmt_s(times['driver_jvm_cpu'])}; "
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


def jobs_cell(epochs: list[dict[str, float]]) -> str:
    jobs = [e["spark_jobs"] for e in epochs if "spark_jobs" in e]
    return f"{median(jobs):.0f}" if jobs else "n/a"


def time_cells(epochs: list[dict[str, Any]]) -> list[str]:
    """Median time with a Spark job running, and without (the driver alone); n/a in older results."""
    busy = [e["jobs_s"] for e in epochs if "jobs_s" in e]
    idle = [e["driver_s"] for e in epochs if "driver_s" in e]
    return [fmt_s(median(busy)) if busy else "n/a", fmt_s(median(idle)) if idle else "n/a"]




def render_part1(result: dict[str, Any]) -> str:
    """Part 1's table: each view's change epochs against a Spark recompute of the same change."""
    part1 = result.get("views", {})
    if not part1:
        return ""
    headers = ["view", "mode", "change", "events", "n", "Epochal epoch", "Spark jobs", "job time", "driver",
               "source", "view step", "Spark recompute", "epoch/recompute", "view/recompute", "Spark over change",
               "change/recompute"]
    rows = []
    for key, s in part1.items():
        view, mode = key.split("/")
        for fraction, epochs in s["epochs"].items():
            rec = s["recompute"][fraction]
            alone = s.get("change_only", {}).get(fraction, [])  # (not in results before 2026-11-22)
            ep = [e["epoch"] for e in epochs]
            vs = [e["view"] for e in epochs]
            rows.append([
                view, mode, f"{float(fraction):.2%}", f"{s['events'][fraction]:,}", str(len(ep)),
                fmt_s(median(ep)), jobs_cell(epochs), *time_cells(epochs),
                fmt_s(median([e["sources"] for e in epochs])), fmt_s(median(vs)),
                fmt_s(median(rec)), fmt_x(ratio(ep, rec)), fmt_x(ratio(vs, rec)),
                fmt_s(median(alone)) if alone else "n/a", fmt_x(ratio(alone, rec)) if alone else "n/a",
            ])
    lines = ["== change epochs: Epochal against a Spark full recompute (medians; epoch/recompute is the median of "
             "paired ratios; 'Spark over change' is the view's query over the change's new rows alone, the floor "
             "of any Spark-per-epoch design; job time = time with a Spark job running, driver = the rest)",
             table(headers, rows)]
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
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- the command line


def parser(doc: str, rows: int = 10_000_000, change_rows: int | None = None) -> argparse.ArgumentParser:
    """The options every view benchmark takes; a script adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=rows, help=f"rows of t (default {rows:,})")
    p.add_argument("--groups", type=int, default=100_000, help="distinct k = rows of d (default 100,000)")
    p.add_argument("--change", default="0.001,0.01", help="fractions of t changed per epoch (default 0.001,0.01)")
    p.add_argument("--change-rows", type=int, default=change_rows,
                   help="a fixed number of changed rows per epoch, the same at every state size (overrides --change)")
    p.add_argument("--repeats", type=int, default=3, help="change epochs per change size (default 3)")
    p.add_argument("--warmup", type=int, default=0, help="untimed change epochs before the timed ones (default 0)")
    p.add_argument("--mode", default="incremental",
                   help="comma list of how Epochal maintains the views: incremental (small epochs on the driver, "
                   "the default), spark (incremental with every step on Spark: EPOCHAL_DRIVER_ROWS=0), full; "
                   "'both' is incremental,full. Incremental falls back to full, labelled, when the loader refuses")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--driver-memory", default="6g", help="spark.driver.memory of every Spark here (default 6g)")
    p.add_argument("--json", help="result file (default benchmarks/results/<script>-<time>.json)")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the final check of the views")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--verbose", action="store_true", help="let Spark log to the terminal")
    p.add_argument("--report", help="print the tables of a result JSON file and exit")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    args.change = [float(x) for x in args.change.split(",") if x.strip()]
    if args.change_rows is not None and args.change_rows < 1:
        p.error("--change-rows: at least 1")
    args.modes = ["incremental", "full"] if args.mode == "both" else args.mode.split(",")
    unknown = sorted(set(args.modes) - {"incremental", "spark", "full"})
    if unknown:
        p.error(f"--mode {','.join(unknown)}: use incremental, spark or full (comma list)")
    return args


def describe(args: argparse.Namespace) -> str:
    sizes = getattr(args, "sizes", None)
    rows = f"sizes {', '.join(f'{n:,}' for n in sizes)}" if sizes else f"rows {args.rows:,}"
    return (f"{rows}, groups {args.groups:,}, "
            + (f"changes of {args.change_rows:,} rows" if args.change_rows else
               f"changes {', '.join(f'{c:.1%}' for c in args.change)}")
            + f" x {args.repeats}" + (f" after {args.warmup} warm-up" if args.warmup else ""))


def spark_session(args: argparse.Namespace, app: str) -> Any:
    """The in-process Spark every part runs on: local[2], Epochal's shuffle partitions."""
    from epochal.spark.session import build_spark_session

    spark = build_spark_session(master="local[2]", app_name=app,
                                conf={**SPARK_CONF, "spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def new_data(args: argparse.Namespace, root: Path, rows: int) -> Data:
    data = Data(root, rows, args.groups, args.seed)
    info = data.initial()
    data.initial_state = info["state"]
    log(f"data: {rows:,} rows of t in {len(info['files'])} split file(s), {args.groups:,} rows of d, "
        f"generated with DuckDB in {info['seconds']:.1f} s")
    return data


def modes_for(args: argparse.Namespace, root: Path, data: Data, result: dict[str, Any]) -> list[str]:
    """--mode, with incremental replaced by full (and said so) if the loader refuses the views."""
    modes = list(args.modes)
    refusal = incremental_refusal(root, data) if "incremental" in modes else None
    result["incremental_refused"] = refusal
    if refusal:
        log(f"NOTE: incremental mode is refused by the loader ({refusal[:300]}); running refresh = 'full'")
        modes = sorted({"full" if m == "incremental" else m for m in modes})
    result["modes"] = modes
    return modes


def run(name: str, title: str, args: argparse.Namespace,
        measure: Callable[[Path, dict[str, Any], Callable[[], None]], None],
        render: Callable[[dict[str, Any]], str]) -> int:
    """A view benchmark's run: --report, or the header, ``measure(root, result, save)`` in a temp dir
    with Spark's stderr in a file, the report and the result file (saved after every part by
    ``save``: a long run cut short keeps what it measured)."""
    if args.report:
        result = json.loads(Path(args.report).read_text())
        log(result["header"])
        print(render(result))
        return 0
    path = harness.result_path(name, args.json)
    header = f"{harness.header(title)}; {describe(args)}"
    log(header)
    result: dict[str, Any] = {"header": header, "args": vars(args),
                              "started": dt.datetime.now().astimezone().isoformat()}

    def save() -> None:
        harness.save(path, result)

    began = time.perf_counter()
    with harness.workdir(name, args.keep) as root:
        log(f"state under {root}")
        stderr_log = root / "stderr.log"
        try:
            with harness.stderr_to(stderr_log, not args.verbose):
                measure(root, result, save)
        except Exception:
            traceback.print_exc()
            if stderr_log.exists():
                print(f"--- last lines of {stderr_log} ---\n{stderr_log.read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
            save()
            return 1
    result["seconds"] = time.perf_counter() - began
    log("")
    log(header)
    if result.get("modes"):
        log(f"modes: {', '.join(result['modes'])}"
            + (f" (incremental refused: {result['incremental_refused']})" if result.get("incremental_refused") else ""))
    print(render(result))
    log(f"total benchmark time {result['seconds']:.0f} s; load average at end {harness.load_now()}")
    save()
    log(f"result: {path}")
    return 0
