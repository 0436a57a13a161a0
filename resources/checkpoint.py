"""The checkpoint controller as a Dagster resource.

It owns the Dagster side of epochs: the ``epochs`` dynamic partitions mirror the meta store (the
source of truth), and older keys retire past a window so partitions never grow without bound.
"""


import logging
import threading

from dagster import ConfigurableResource, DagsterInstance, InitResourceContext
from pydantic import Field, PrivateAttr

from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.model import Pipeline
from epochal.runtime.facade import EpochRuntime
from epochal.settings import Settings
from resources.spark import EpochalSparkResource

EPOCHS_PARTITIONS = "epochs"

log = logging.getLogger("epochal.dagster")


class CheckpointControllerResource(ConfigurableResource):
    home: str = Field(default="", description="Overrides EPOCHAL_HOME.")
    pipeline_dir: str = Field(default="", description="Overrides EPOCHAL_PIPELINE.")
    spark: EpochalSparkResource

    _runtime: "EpochRuntime | None" = PrivateAttr(default=None)
    #: a run's steps run on threads (platform_defs.executor): the runtime is made once per run
    _runtime_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def settings(self) -> Settings:
        import os

        env = dict(os.environ)
        if self.home:
            env["EPOCHAL_HOME"] = self.home
        if self.pipeline_dir:
            env["EPOCHAL_PIPELINE"] = self.pipeline_dir
        return Settings.from_env(env)

    def pipeline(self) -> Pipeline:
        return load_pipeline(self.settings().pipeline_dir)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._runtime = None

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        # Cached snapshots live in the Spark session, which may outlive the run (Spark Connect):
        # a run releases what it cached, so a long-lived server's memory and disk stay bounded.
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    @property
    def runtime(self) -> EpochRuntime:
        with self._runtime_lock:
            if self._runtime is None:
                settings = self.settings()
                self._runtime = EpochRuntime(
                    settings, load_pipeline(settings.pipeline_dir), lambda: self.spark.spark_session
                )
            return self._runtime

    # ------------------------------------------------------------------ partitions mirror

    def ensure_partition(self, instance: DagsterInstance, epoch: int) -> None:
        key = str(epoch)
        if not instance.has_dynamic_partition(EPOCHS_PARTITIONS, key):
            instance.add_dynamic_partitions(EPOCHS_PARTITIONS, [key])

    def retire_partitions(self, instance: DagsterInstance) -> list[str]:
        """Drop partition keys older than the newest ``EPOCHAL_PARTITION_WINDOW`` epochs.

        Only the Dagster key goes: the epoch's data and meta-store records stay, so `epochal
        query` and sinks see exactly what they saw before. In-flight epochs are never retired."""
        window = self.runtime.settings.partition_window
        keys = instance.get_dynamic_partitions(EPOCHS_PARTITIONS)
        if len(keys) <= window:
            return []
        in_flight = {str(r.epoch) for r in self.runtime.controller.in_flight()}
        numeric = sorted((k for k in keys if k.isdigit()), key=int)
        retire = [k for k in numeric[: len(keys) - window] if k not in in_flight]
        for key in retire:
            instance.delete_dynamic_partition(EPOCHS_PARTITIONS, key)
        if retire:
            log.info("retired %d epoch partition key(s), oldest kept: %s", len(retire), numeric[len(retire)])
        return retire
