"""Warming a new Spark server before runs come: a few epochs of the demo pipeline in a scratch home.

A fresh server's JVM spends its first minutes compiling Spark itself, not the pipeline: measured on
the demo (docs/performance.md), its first epoch cost 38 s of JVM CPU, of which 22 s in the JIT
compiler threads, the third 14 s, the tenth 7.8 s, and the JIT settled after about 15 epochs. The
first runs on a new server pay that, so a server started to serve a barrier every few seconds falls
behind for its first two minutes. `epochal spark start` (unless ``--warm-up 0``) runs
EPOCHAL_SPARK_WARMUP_EPOCHS epochs of Epochal's own query shapes (the built-in demo's sources, views
and sinks) against the server first, in a temporary home of its own (its own meta store, warehouse
and sinks), removed afterwards; it runs without the state cache, so nothing of it stays cached on
the server. A server started on first use by a run is not warmed: that run would wait for it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from epochal.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class WarmUpReport:
    epochs: int = 0
    seconds: float = 0.0
    #: wall seconds of each epoch, in order: the first against the last shows what was compiled
    epoch_s: list[float] = field(default_factory=list)
    #: the server JVM's CPU seconds of each epoch, when its process can be read (Linux /proc)
    server_cpu_s: list[float] = field(default_factory=list)

    def describe(self) -> str:
        if not self.epoch_s:
            return "not warmed up"
        text = (
            f"warmed up with {self.epochs} epoch{'' if self.epochs == 1 else 's'} of the demo pipeline in "
            f"{self.seconds:.0f}s "
            f"(an epoch {self.epoch_s[0]:.1f}s at first, {self.epoch_s[-1]:.1f}s at the end"
        )
        if self.server_cpu_s:
            text += f"; server CPU {self.server_cpu_s[0]:.1f}s, then {self.server_cpu_s[-1]:.1f}s"
        return text + ")"


#: Opens the demo pipeline's runtime in a scratch home (its settings) on a Spark session (its
#: factory) and yields a callable that runs one epoch through it; closes the runtime on exit
#: (``epochal.runtime.one_epoch.demo_epochs``: the runtime is a layer above Spark's management).
EpochRunner = Callable[["Settings", Callable[[], "SparkSession"]], AbstractContextManager[Callable[[], object]]]


def warm_up(
    url: str,
    epochs: int,
    run_epochs: EpochRunner,
    server_pid: int | None = None,
    progress: Callable[[str], None] = log.info,
    conf: Mapping[str, str] | None = None,
) -> WarmUpReport:
    """Run ``epochs`` epochs of the demo pipeline (``run_epochs``) against the Spark Connect server
    at ``url`` in a scratch home, then remove the home. ``conf``: the runs' Spark conf
    (EPOCHAL_SPARK_CONF), so the warm-up compiles the code paths their sessions take."""
    from epochal.settings import Settings
    from epochal.spark.session import build_spark_session

    report = WarmUpReport()
    if epochs <= 0:
        return report
    root = Path(tempfile.mkdtemp(prefix="epochal-warmup-"))
    started = time.time()
    try:
        # Only what places the scratch home: the user's pipeline, meta store and sinks stay untouched.
        # No state cache: nothing of the warm-up may stay cached on the server after it.
        settings = Settings.from_env(
            {"EPOCHAL_HOME": str(root), "EPOCHAL_SPARK_REMOTE": url, "EPOCHAL_STATE_CACHE": "off"}
        )

        def spark():  # noqa: ANN202
            return build_spark_session(settings.spark_master, "epochal-warmup", dict(conf or {}), url)

        with run_epochs(settings, spark) as run_epoch:
            for n in range(epochs):
                cpu_before = _cpu_seconds(server_pid)
                began = time.time()
                run_epoch()
                report.epoch_s.append(time.time() - began)
                cpu_after = _cpu_seconds(server_pid)
                if cpu_before is not None and cpu_after is not None:
                    report.server_cpu_s.append(cpu_after - cpu_before)
                report.epochs = n + 1
                progress(f"warm-up epoch {n + 1}/{epochs}: {report.epoch_s[-1]:.1f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.seconds = time.time() - started
    return report


def _cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU of process ``pid`` (Linux), or None where /proc cannot tell."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
