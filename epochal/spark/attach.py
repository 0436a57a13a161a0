"""How a process gets the Spark session its settings ask for: a JVM of its own (local or a cluster
master), Epochal's managed Connect server (started if it is not running), or a Connect remote."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochal.spark.session import build_spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.settings import Settings


def spark_remote_for(settings: Settings) -> str | None:
    """The Spark Connect URL a session of ``settings`` attaches to, or None for a JVM in this process.

    EPOCHAL_SPARK_REMOTE wins (a cluster's Connect server); in ``server`` mode it is Epochal's own
    local server, started now if it is not running (or died)."""
    if settings.spark_remote:
        return settings.spark_remote
    if settings.spark_mode == "server":
        from epochal.spark.server import ServerConfig, ensure

        return ensure(ServerConfig.from_settings(settings)).connect_url
    return None


def session_for(settings: Settings, app_name: str) -> SparkSession:
    """The session of ``settings``' mode: local or cluster JVM, Epochal's server, or a Connect remote."""
    return build_spark_session(settings.spark_master, app_name, settings.spark_conf, spark_remote_for(settings))
