"""Starting Spark: local, a cluster master, or a Spark Connect remote, with a Java check first.

Local and cluster modes start a JVM through py4j; when Java is missing or too old py4j fails with a
stack trace that never mentions Java, so we check ourselves and say what to install.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.errors import JavaMissingError
from epochal.settings import BACKFILL_POOL as BACKFILL_POOL  # the pool is a setting's default

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.spark.slots import SessionSlot

log = logging.getLogger("epochal.spark")

MIN_JAVA = 17

# Small-data defaults: Spark's 200 shuffle partitions make every tiny epoch pay for 200 tasks.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.driver.memory": "2g",
    # A snapshot is up to 256 vnode directories, and Spark lists more than 32 input paths with a
    # Spark job of its own (0.4-0.5 s per read, measured): Epochal passes the files it already
    # listed, so the driver only stats them.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    # Spark keeps 100 compiled whole-stage classes by default. An epoch of the demo compiles ~150
    # distinct ones, so the cache thrashed and ~140 identical classes were compiled again every
    # epoch (2.6-2.9 s of Janino a demo epoch on one core); with room for them an epoch compiles
    # ~12, the ones whose code embeds a literal that changes. A static conf: set when Spark starts.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # PySpark 4 records the Python call site of every DataFrame, Column and function call for
    # error messages: four or five Py4J round trips and a stack walk around each of the hundreds
    # of calls that build an epoch's plans. The call sites would all be Epochal's own code, not
    # the user's SQL. Off: 10,900 -> 6,800 Py4J calls and 0.91x the time of a demo epoch
    # (benchmarks/bench_dataframe_debugging.py).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Backfills run in a pool of their own that gets only the slots live work leaves
    # (fairscheduler.xml): a backfill at full speed took both cores and made each live epoch wait
    # for its tasks (1.6-2x the epoch's time). Inside the default pool jobs stay FIFO.
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
}
_POOL_PROPERTY = "spark.scheduler.pool"
#: Of those, the ones only a starting Spark takes: a Spark Connect client leaves them to the server
#: (the managed server starts with them), which refuses them from a session with a warning.
STATIC_DEFAULTS = frozenset({"spark.sql.codegen.cache.maxEntries"})


@functools.lru_cache(maxsize=8)
def java_major_version(java: str) -> int | None:
    """Major version of the ``java`` binary, or None if it cannot be run.

    Cached per binary: every run builds a session, and `java -version` costs 60-200 ms."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major  # "1.8" means 8


def check_java() -> None:
    """Raise JavaMissingError with the fix unless Java 17+ is reachable the way pyspark finds it."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    where = f"JAVA_HOME={java_home}" if java_home else "PATH"
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            f"Spark needs Java {MIN_JAVA}+ but no java was found on {where}: install a JDK "
            f"(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME to one"
        )
    major = java_major_version(java)
    if major is None or major < MIN_JAVA:
        found = f"Java {major}" if major else "a java that does not report its version"
        raise JavaMissingError(
            f"Spark needs Java {MIN_JAVA}+ but {where} has {found} ({java}): install JDK "
            f"{MIN_JAVA} or newer and point JAVA_HOME at it"
        )


def build_spark_session(
    master: str | None = "local[*]",
    app_name: str = "epochal",
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> "SparkSession":
    """A SparkSession for ``master`` (local[*], spark://..., yarn) or a Spark Connect ``remote``
    (sc://host:port). ``conf`` is passed through and wins over our defaults."""
    from pyspark.sql import SparkSession

    merged = {**DEFAULT_CONF, **(conf or {})}
    builder = SparkSession.builder.appName(app_name)
    if remote:
        # Spark Connect: the server owns the JVM, so no local Java is needed; static confs such as
        # driver memory belong to the server and are rejected by the client.
        builder = builder.remote(remote)
        merged = {
            k: v
            for k, v in merged.items()
            if k.startswith("spark.sql.") and not (k in STATIC_DEFAULTS and DEFAULT_CONF.get(k) == v)
        }
    else:
        check_java()
        builder = builder.master(master or "local[*]")
        # Python tasks (a sink's writers) run Epochal's code: on local executors, with the driver's
        # interpreter and packages, not whichever `python3` is first on PATH. On a cluster, set
        # spark.pyspark.python to an interpreter that has Epochal installed.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in merged.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_slotted_session(
    directory: Path, slots: int, app_name: str, conf: Mapping[str, str] | None, remote: str
) -> tuple["SparkSession", "SessionSlot | None"]:
    """A Spark Connect session on ``remote`` in a free one of ``slots`` session slots under
    ``directory`` (a session that outlives this process, warm from earlier ones: slots.py),
    with the slot it holds; a session of its own, and no slot, when every slot is taken or the URL
    names its session."""
    from epochal.spark import slots as connect_slots

    slot = None if connect_slots.names_a_session(remote) else connect_slots.take(directory, remote, slots)
    if slot is None:
        return build_spark_session(None, app_name, conf, remote), None
    try:
        try:
            session = _attach(slot, app_name, conf)
        except Exception as exc:
            if not connect_slots.is_closed_session_error(exc):
                raise
            log.info("Spark Connect session slot %d: the server closed its session; starting a new one", slot.index)
            slot.renew()
            session = _attach(slot, app_name, conf)
        if getattr(session, "session_id", None) != slot.session_id:
            # this process already had a session, which the builder returned: keep it, as before
            slot.release()
            return session, None
        session.release_session_on_close = False  # stop() must leave the session to the next holder
        for key in connect_slots.TRANSIENT_CONFS:  # as this run's conf has them, whatever a holder left
            if conf and key in conf:
                session.conf.set(key, conf[key])
            else:
                session.conf.unset(key)
        return session, slot
    except BaseException:
        slot.release()
        raise


def _attach(slot: "SessionSlot", app_name: str, conf: Mapping[str, str] | None) -> "SparkSession":
    try:
        return build_spark_session(None, app_name, conf, slot.remote)
    except Exception:
        _drop_default_session(slot.session_id)
        raise


def _drop_default_session(session_id: str) -> None:
    """Forget a Connect session the builder failed to set up (it became the process's default)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    broken = ConnectSession._get_default_session()
    if broken is not None and getattr(broken, "session_id", None) == session_id:
        broken.release_session_on_close = False
        broken.stop()


@contextmanager
def scheduler_pool(spark: "SparkSession", pool: str | None) -> Iterator[None]:
    """Spark jobs started inside go to FAIR pool ``pool`` (None: the default pool).

    In-process Spark: a property of this thread (PySpark pins a JVM thread to each Python thread),
    so other threads on the same session keep their pool. Spark Connect has no thread properties
    (SPARK-48040 was not merged) but copies every ``spark.*`` SQL conf of the session into the
    local properties of the jobs it runs: the pool is then the session's while inside. A Spark
    whose scheduler is FIFO ignores pools."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):

        def set_pool(value: str | None) -> None:
            if value is None:
                spark.conf.unset(_POOL_PROPERTY)
            else:
                spark.conf.set(_POOL_PROPERTY, value)

        previous = spark.conf.get(_POOL_PROPERTY, None)
        set_pool(pool)
        try:
            yield
        finally:
            set_pool(previous)
        return
    context = spark.sparkContext
    previous = context.getLocalProperty(_POOL_PROPERTY)
    context.setLocalProperty(_POOL_PROPERTY, pool)  # type: ignore[arg-type]  # None removes it
    try:
        yield
    finally:
        context.setLocalProperty(_POOL_PROPERTY, previous)  # type: ignore[arg-type]
