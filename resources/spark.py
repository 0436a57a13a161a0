"""The Spark resource: dagster-pyspark's lazy session, plus Epochal's modes and a clean stop.

Modes, chosen by settings (EPOCHAL_SPARK_MASTER / EPOCHAL_SPARK_REMOTE) or resource config:
* ``local[*]`` (default): a JVM in the run's process. With the in-process executor one run = one JVM.
* a cluster master URL (``spark://host:7077``, ``yarn``, ``k8s://...``): the driver runs in the run's
  process, executors on the cluster.
* a Spark Connect remote (``sc://host:15002``): no local JVM at all; the server does the work.
"""


from typing import Any

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from epochal.settings import Settings
from epochal.spark_session import build_spark_session


class EpochalSparkResource(LazyPySparkResource):
    master: str = Field(default="local[*]", description="Spark master URL, ignored when `remote` is set.")
    remote: str = Field(default="", description="Spark Connect URL (sc://host:port); empty for a JVM session.")
    app_name: str = Field(default="epochal")
    stop_on_teardown: bool = Field(
        default=True, description="Stop the session when the run ends (off when a caller shares its own session)."
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> "EpochalSparkResource":
        return cls(
            spark_config=dict(settings.spark_conf),
            master=settings.spark_master,
            remote=settings.spark_remote,
        )

    def _init_session(self) -> None:
        # Same lazy contract as dagster-pyspark (no JVM until a step asks for Spark), but through
        # our builder: it checks Java first and knows Spark Connect.
        if self._spark_session is None:
            self._spark_session = build_spark_session(
                master=self.master,
                app_name=self.app_name,
                conf={k: str(v) for k, v in self.spark_config.items()},
                remote=self.remote or None,
            )

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session: Any = self._spark_session
        if session is not None and self.stop_on_teardown:
            session.stop()
            self._spark_session = None
