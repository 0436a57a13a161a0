"""Test harness: a small pipeline in a temp EPOCHAL_HOME, run through the real Dagster job.

In-process runs share the test session's SparkSession; subprocess runs are real
`dagster job execute` processes with their own JVM (used where a process must die).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from epochal.runtime.one_epoch import run_epoch  # noqa: F401 (tests drive epochs with it from here)

REPO = Path(__file__).resolve().parents[1]

SMALL_PIPELINE = {
    "sources.sql": """
-- Nexmark bids: 400 events an epoch over 2 splits.
CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
                   date_time TIMESTAMP, extra STRING)
WITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid', 'nexmark.split.num' = '2',
      'max.events.per.epoch' = '400');

CREATE SOURCE orders (id BIGINT, customer STRING, amount DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');
""",
    "views.sql": """
CREATE MATERIALIZED VIEW big_bids AS
SELECT auction, bidder, price * 0.908 AS price_eur, date_time FROM bid WHERE price > 1000;

CREATE MATERIALIZED VIEW big_orders AS
SELECT id, customer, amount FROM orders WHERE amount >= 10
UNION ALL
SELECT id, customer, amount FROM orders WHERE customer = 'vip';
""",
    "sinks.sql": """
CREATE SINK big_bids_out FROM big_bids
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'big_bids', type = 'append-only');

-- big_orders may hold an order twice (both branches), so no key of it is unique: append-only.
CREATE SINK orders_out FROM big_orders
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'big_orders', type = 'append-only');
""",
}

VIEW_QUERIES = {
    "big_bids": "SELECT auction, bidder, price * 0.908 AS price_eur, date_time FROM bid WHERE price > 1000",
    "big_orders": "SELECT id, customer, amount FROM orders WHERE amount >= 10 "
    "UNION ALL SELECT id, customer, amount FROM orders WHERE customer = 'vip'",
}


@dataclass
class Harness:
    home: Path
    pipeline_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {"EPOCHAL_HOME": str(self.home), "EPOCHAL_PIPELINE": str(self.pipeline_dir)}

    def settings(self):  # noqa: ANN201
        from epochal.settings import Settings

        return Settings.from_env({**os.environ, **self.env})

    def definitions(self) -> dg.Definitions:
        from platform_defs.definitions import build_definitions

        return build_definitions(self.settings())

    def run_in_process(
        self, instance: dg.DagsterInstance, partition: str | None = None, take_waiting: bool = False
    ) -> dg.ExecuteInProcessResult:
        """One epoch_job run in this process, on the shared SparkSession (never stopped by the run).
        ``take_waiting``: run it as the barrier sensor does, taking every epoch waiting for a run."""
        from resources.checkpoint import CheckpointControllerResource
        from resources.spark import EpochalSparkResource
        from tests.dagster_internals import execute_with_own_executor

        spark = EpochalSparkResource(spark_config={}, master="local[2]", stop_on_teardown=False)
        checkpoint = CheckpointControllerResource(spark=spark, home=str(self.home), pipeline_dir=str(self.pipeline_dir))
        job = self.definitions().get_job_def("epoch_job")
        tags = {"dagster/partition": partition} if partition else {}
        if take_waiting:
            tags["epochal/take"] = "waiting"
        return execute_with_own_executor(job, {"spark": spark, "checkpoint": checkpoint}, instance, tags)

    def run_subprocess(self, *extra_args: str, fault: str | None = None, timeout: int = 300,
                       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``dagster job execute`` of epoch_job; ``env`` adds settings for this run only."""
        env = {**os.environ, **self.env, **(env or {})}
        env.pop("EPOCHAL_FAULT", None)
        if fault:
            env["EPOCHAL_FAULT"] = fault
        env.pop("DAGSTER_HOME", None)  # the temporary instance, as a first-time user has
        return subprocess.run(
            [sys.executable, "-m", "dagster", "job", "execute", "-m", "platform_defs", "-j", "epoch_job", *extra_args],
            # A killed run leaves its temporary Dagster home in the cwd: keep that out of the repo.
            cwd=self.home.parent, env=env, capture_output=True, text=True, timeout=timeout,
        )

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "epochal.cli", *args], cwd=REPO, env={**os.environ, **self.env},
            capture_output=True, text=True, input=stdin, timeout=120,
        )

    def runtime(self, spark, env: dict[str, str] | None = None):  # noqa: ANN001, ANN201
        """A runtime on the shared session; ``env`` adds settings for this runtime only."""
        from epochal.pipeline.loader import load_pipeline
        from epochal.runtime.facade import EpochRuntime
        from epochal.settings import Settings

        settings = Settings.from_env({**os.environ, **self.env, **(env or {})})
        return EpochRuntime(settings, load_pipeline(settings.pipeline_dir), lambda: spark)

    def produce(self, lines: list[str], split: str | None = None) -> None:
        from epochal.connectors.log import append_records

        append_records(self.home / "data" / "orders", lines, split)


def make_harness(root: Path, files: dict[str, str] | None = None) -> Harness:
    pipeline_dir = root / "pipeline"
    pipeline_dir.mkdir(parents=True)
    for name, text in (files or SMALL_PIPELINE).items():
        (pipeline_dir / name).write_text(text)
    return Harness(home=root / "home", pipeline_dir=pipeline_dir)


def crash_points(every: list[str], suite: list[str]) -> list[str]:
    """The fault points a crash test kills runs at: ``suite`` by default, ``every`` point with
    ``TESTS_CRASH_MATRIX=all``.

    Each point costs a `dagster job execute` with a JVM of its own (29-63 s a test on the machine of
    stops 46-47, 67-119 s on session 46's slower one), so the suite kills at one point per recovery path and the
    whole matrix runs on demand (docs/development.md), as the deeper Hypothesis search does. (Not an
    EPOCHAL_ name: the runs inherit the environment, and the settings refuse an EPOCHAL_ name they
    do not know.)"""
    unknown = sorted(set(suite) - set(every))
    if unknown:
        raise ValueError(f"suite crash points {unknown} are not among {every}")
    mode = os.environ.get("TESTS_CRASH_MATRIX", "suite")
    if mode not in ("suite", "all"):
        raise ValueError(f"TESTS_CRASH_MATRIX={mode!r}: use 'all' (every fault point) or 'suite' (the default)")
    return list(every) if mode == "all" else [p for p in every if p in suite]
