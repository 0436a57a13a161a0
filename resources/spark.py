"""The Spark resource: a lazy session (dagster-pyspark's ``LazyPySparkResource`` contract), Epochal's
modes and a clean stop.

Modes, chosen by settings (EPOCHAL_SPARK_MODE / EPOCHAL_SPARK_MASTER / EPOCHAL_SPARK_REMOTE) or
resource config:
* ``EPOCHAL_SPARK_MODE=server`` (default): Spark Connect to the local server Epochal manages
  (epochal/spark/server.py), started when a step first needs Spark if it is not running.
* ``EPOCHAL_SPARK_MODE=local`` with ``local[*]``: a JVM in the run's process; one run = one JVM.
* a cluster master URL (``spark://host:7077``, ``yarn``, ``k8s://...``): the driver runs in the run's
  process, executors on the cluster.
* a Spark Connect remote (``sc://host:15002``): no local JVM at all; the server does the work.
"""


import os
import threading
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr

from epochal.errors import ConfigError
from epochal.redaction import redact_url, split_secret_conf
from epochal.settings import Settings, parse_spark_conf
from epochal.spark.session import build_slotted_session, build_spark_session

#: Steps on threads (EPOCHAL_STEP_THREADS) may ask for the session at once: one of them builds it
#: (else two would take two session slots). Module-level: Dagster copies resources.
_BUILDING = threading.Lock()


def _resolved(value: str) -> str:
    # Inside a run Dagster hands the resource the variable's value; a resource built by hand
    # still holds the EnvVar (its text is the variable's name), so read the environment then.
    return (value.get_value() or "") if isinstance(value, EnvVar) else value


def _secret_conf(raw: str) -> dict[str, str]:
    return split_secret_conf(parse_spark_conf(raw))[1]


class EpochalSparkResource(ConfigurableResource):
    """Resource config is what Dagster stores with every run and the UI shows, so it never holds a
    secret: Spark conf keys that look secret (``fs.s3a.secret.key``, ``...password``, ``...token``)
    stay out of ``spark_config`` and are read from ``EPOCHAL_SPARK_CONF`` through Dagster's
    ``EnvVar`` when the session starts; a Spark Connect URL with a ``;token=`` is read the same way.

    The same lazy contract as dagster-pyspark's ``LazyPySparkResource`` (``spark_config``,
    ``spark_session``, ``spark_context``; no session until a step asks), without subclassing it:
    that module imports pyspark, so loading the definitions did too (0.2-0.3 s, in every process that
    loads them: a code server, `dg check defs`, each run); now pyspark loads when a step needs it."""

    spark_config: dict[str, Any] = Field(default_factory=dict, description="Spark conf (no secrets).")
    master: str = Field(default="local[*]", description="Spark master URL, ignored when `remote` is set.")
    remote: str = Field(default="", description="Spark Connect URL (sc://host:port); empty for a JVM session.")
    app_name: str = Field(default="epochal")
    stop_on_teardown: bool = Field(
        default=True, description="Stop the session when the run ends (off when a caller shares its own session)."
    )
    server_home: str = Field(
        default="",
        description="EPOCHAL_HOME whose managed Spark Connect server runs attach to (EPOCHAL_SPARK_MODE=server); "
        "empty: no managed server. `remote` wins.",
    )
    server_port: int = Field(default=0, description="Port of the managed server (EPOCHAL_SPARK_PORT); 0 picks one.")
    server_idle_stop_s: int = Field(
        default=1800, description="The managed server stops itself after this long unused (EPOCHAL_SPARK_IDLE_STOP_S)."
    )
    session_slots: int = Field(
        default=0,
        description="Spark Connect sessions kept for runs to take, warm from earlier runs "
        "(EPOCHAL_SPARK_SESSION_SLOTS, epochal/spark/slots.py); 0: a new session per run.",
    )
    session_slots_dir: str = Field(default="", description="Where the session slots' ids and locks live.")
    secret_conf: str = Field(
        default="",
        description="EPOCHAL_SPARK_CONF, as an environment variable resolved when the run starts: its secret "
        "keys (only those) join `spark_config` in the session, never in config Dagster stores or shows.",
    )

    _spark_session: Any = PrivateAttr(default=None)
    _slot: Any = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: Settings) -> "EpochalSparkResource":
        public, secret = split_secret_conf(settings.spark_conf)
        conf_env, remote_env = Settings.env_name("spark_conf"), Settings.env_name("spark_remote")
        remote: str = settings.spark_remote
        if redact_url(remote) != remote:
            _same_in_environment(remote_env, remote, os.environ.get(remote_env, "").strip())
            remote = EnvVar(remote_env)
        if secret:
            _same_in_environment(conf_env, secret, _secret_conf(os.environ.get(conf_env, "")))
        return cls(
            spark_config=public,
            secret_conf=EnvVar(conf_env) if secret else "",
            master=settings.spark_master,
            remote=remote,
            server_home=str(settings.home) if settings.spark_mode == "server" else "",
            server_port=settings.spark_port,
            server_idle_stop_s=settings.spark_idle_stop_s,
            session_slots=settings.spark_session_slots,
            session_slots_dir=str(settings.home / "spark" / "sessions"),
        )

    def session_conf(self) -> dict[str, str]:
        """The conf the session starts with: ``spark_config`` plus the secrets read from the environment."""
        conf = {k: str(v) for k, v in self.spark_config.items()}
        if self.secret_conf:
            conf.update(_secret_conf(_resolved(self.secret_conf)))
        return conf

    def _init_session(self) -> None:
        # Same lazy contract as dagster-pyspark (no JVM until a step asks for Spark), but through
        # our builder: it checks Java first and knows Spark Connect.
        if self._spark_session is not None:
            return
        with _BUILDING:
            if self._spark_session is None:
                self._build_session()

    def _build_session(self) -> None:
        conf = self.session_conf()
        remote = _resolved(self.remote) or None
        if remote is None and self.server_home:
            from epochal.spark.server import ServerConfig, ensure

            server = ServerConfig(
                Path(self.server_home), self.server_port, self.master, conf, float(self.server_idle_stop_s)
            )
            remote = ensure(server).connect_url
        if remote and self.session_slots and self.session_slots_dir:
            self._spark_session, self._slot = build_slotted_session(
                Path(self.session_slots_dir), self.session_slots, self.app_name, conf, remote
            )
            return
        self._spark_session = build_spark_session(
            master=self.master, app_name=self.app_name, conf=conf, remote=remote
        )

    @property
    def spark_session(self) -> Any:
        self._init_session()
        return self._spark_session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session: Any = self._spark_session
        if session is not None and self.stop_on_teardown:
            try:
                session.stop()  # a slot's session stays on the server (release_session_on_close is off)
            finally:
                self._spark_session = None
                if self._slot is not None:
                    self._slot.release()
                    self._slot = None


def _same_in_environment(name: str, wanted: object, found: object) -> None:
    # Runs read secrets from the environment, never from config: settings built from another
    # mapping would silently run with different (or no) credentials.
    if wanted != found:
        raise ConfigError(
            f"{name} holds secrets, which Dagster runs read from the environment, but the environment's "
            f"{name} differs from the settings given: set {name} in the environment of the code location"
        )
