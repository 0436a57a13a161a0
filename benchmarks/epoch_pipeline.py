"""The pipeline the epoch benchmarks share (bench_epoch, bench_executor): the demo's shape, a Nexmark
`bid` source (2 splits), the view `big_bids` (SELECT auction, bidder, price * 0.908 AS price_eur,
date_time FROM bid WHERE price > 1000) and an append-only DuckDB sink, in its own EPOCHAL_HOME,
runnable through `epoch_job` in-process (A) and as the same Spark work done directly (B); and the
time budget that keeps their runs near a target length.
"""

from __future__ import annotations

import glob
import shutil
import time
from pathlib import Path
from typing import Any

from harness import Comparison

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



class Budget:
    """A wall-clock budget, split over a run's parts by weight; slack carries over to later parts.

    Another repetition starts only if the last A+B pair would still fit before the part's deadline;
    the minimum repetitions always run, so a very slow machine overruns rather than reports nothing."""

    def __init__(self, seconds: float, weights: dict[str, float]):
        self.began = time.perf_counter()
        self.seconds = seconds
        total = sum(weights.values()) or 1.0
        self.ends, acc = {}, 0.0
        for part, weight in weights.items():
            acc += weight / total
            self.ends[part] = acc
        self.deadline = self.began + seconds

    def start_part(self, part: str) -> None:
        self.deadline = self.began + self.seconds * self.ends.get(part, 1.0)

    def allows_another(self, c: Comparison) -> bool:
        last = (c.a[-1] + c.b[-1]) if c.a else 0.0
        return time.perf_counter() + last <= self.deadline


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
