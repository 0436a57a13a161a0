"""What every benchmark here shares: this checkout on sys.path, a scrubbed environment, temp dirs,
timing, medians and paired ratios, progress logging, and the JSON result file.

Import it before anything from the repo (``import harness`` works from a script in this directory:
Python puts the script's directory on sys.path; isort puts it, a third-party name to ruff, before the
first-party ``epochal`` imports by itself):

    import harness
    from harness import log, median

Importing it:
* puts the repo root first on ``sys.path`` and on ``PYTHONPATH`` (for subprocesses and Spark's Python
  workers), and checks that ``epochal``, ``platform_defs``, ``resources`` and ``assets`` resolve to
  this checkout: the editable install is not a reliable way to find it (a ``pip install -e`` from
  another checkout points ``epochal`` there; one made before these had an ``__init__.py`` maps them
  as namespace packages);
* drops every ``EPOCHAL_*`` variable of the calling shell (``DROPPED`` names them), so a stray
  ``EPOCHAL_META_URL`` or ``EPOCHAL_HOME`` cannot point a benchmark at real state. A benchmark sets
  the settings it measures itself, in the environments it builds.

The machine the figures come from is 2 shared cores: compare with a baseline measured in the same
run, interleaved, and report medians and the median of paired ratios (a pair shares the load of its
moment), never seconds across runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
PACKAGES = ("epochal", "platform_defs", "resources", "assets")

for _path in (str(BENCH_DIR), str(REPO)):  # the repo ends up first, this directory second
    while _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO))]
)
for _name in PACKAGES:  # find_spec, not import: importing platform_defs builds Definitions
    _spec = importlib.util.find_spec(_name)
    _origin = str((_spec.origin or _spec.submodule_search_locations[0]) if _spec else None)
    if not _origin.startswith(str(REPO) + os.sep):
        raise SystemExit(f"{_name} would import from {_origin}, not from {REPO}: fix sys.path")

DROPPED = sorted(k for k in os.environ if k.startswith("EPOCHAL_"))
for _name in DROPPED:
    del os.environ[_name]

_STARTED = time.perf_counter()


def log(message: str) -> None:
    """A progress line on stdout, with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - _STARTED:6.0f} s] {message}", flush=True)


# ---------------------------------------------------------------------------------------- statistics


def median(xs: list[float]) -> float:
    """The median, NaN for no values (a part that did not run)."""
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median of the paired ratios a_i / b_i: each pair shares the machine's load of its moment."""
    return median([x / y for x, y in zip(a, b, strict=False) if y])


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))] if xs else float("nan")


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.2f} s"


def fmt_x(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3f}x"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(out)


@dataclass
class Comparison:
    """Paired samples of A (Epochal) and B (the baseline), taken A B A B in the same run."""

    title: str
    a_name: str
    b_name: str
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    cut: str = ""  # why the repetitions stopped early, if they did

    @property
    def ratio(self) -> float:
        return paired_ratio(self.a, self.b)

    def render(self) -> str:
        rows = [[name, str(len(xs)), fmt_s(median(xs)), fmt_s(min(xs, default=None)), fmt_s(max(xs, default=None))]
                for name, xs in ((self.a_name, self.a), (self.b_name, self.b))]
        pairs = ", ".join(f"{x / y:.2f}" for x, y in zip(self.a, self.b, strict=False) if y)
        return (
            f"{table(['', 'n', 'median', 'min', 'max'], rows)}\n"
            f"ratio A/B: median of paired ratios {self.ratio:.2f}x (pairs: {pairs}); ratio of medians "
            f"{median(self.a) / median(self.b):.2f}x; difference of medians {median(self.a) - median(self.b):+.3f} s"
            + (f"\n[{self.cut}]" if self.cut else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {"a_name": self.a_name, "b_name": self.b_name, "a": self.a, "b": self.b, "ratio": self.ratio,
                "cut": self.cut}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of ``fn()``, wall time."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


# ------------------------------------------------------------------------------------ the machine


def code_version() -> str:
    """The commit measured, with "+ uncommitted changes" when the code under test differed from it."""
    if os.environ.get("BENCH_CODE_VERSION"):  # set when running an exported tree
        return os.environ["BENCH_CODE_VERSION"]
    try:
        git = ["git", "-C", str(REPO)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run([*git, "status", "--porcelain", "--", *PACKAGES], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    head_s = head.stdout.strip()
    return f"{head_s}{' + uncommitted changes' if dirty.stdout.strip() else ''}" if head_s else "unknown"


def header(title: str) -> str:
    """What a run's figures depend on: when, the machine's cores and load, Python, the code."""
    load = os.getloadavg()
    dropped = f"; dropped from the environment: {', '.join(DROPPED)}" if DROPPED else ""
    return (f"{title}, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; nproc {os.cpu_count()}, load average "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; Python {platform.python_version()}; "
            f"code {code_version()}{dropped}")


def load_now() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def workdir(prefix: str, keep: bool | Callable[[], bool] = False) -> Iterator[Path]:
    """A fresh temp dir, the process's cwd while it lasts (Spark and Dagster drop files in the cwd:
    derby.log, spark-warehouse, .tmp_dagster_home_*), removed at the end unless ``keep`` (or what
    ``keep()`` says then)."""
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    before = os.getcwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(before)
        if keep() if callable(keep) else keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def stderr_to(path: Path, enabled: bool = True) -> Iterator[None]:
    """File descriptor 2 (Spark's JVM, Dagster's console logger, progress bars) into ``path``."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as fh:
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


# ------------------------------------------------------------------------------------ result files


def result_path(name: str, given: str | None = None) -> Path:
    """``given``, or benchmarks/results/<name>-<YYYYmmdd-HHMMSS>.json (the commit is inside)."""
    path = Path(given).resolve() if given else RESULTS / f"{name}-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save(path: Path, result: Any) -> Path:
    """Write ``result`` as JSON, with the code, date and load it came from when it is a dict."""
    if isinstance(result, dict):
        result = {"code": code_version(), "saved": dt.datetime.now().astimezone().isoformat(),
                  "load_at_save": os.getloadavg(), **result}
    path.write_text(json.dumps(result, indent=1, default=str))
    return path



def python_cpu() -> float:
    """CPU seconds this process has used so far (user + system): on a benchmark's driver, Epochal's
    own code, Py4J and pyarrow."""
    used = os.times()
    return used.user + used.system


def jvm_thread_cpu(spark: Any) -> dict[int, tuple[str, float]]:
    """Each live thread of the Spark driver JVM: its name and the CPU seconds it has used."""
    threads = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getThreadMXBean()
    ids = threads.getAllThreadIds()
    return {
        int(thread_id): (str(info.getThreadName()), max(threads.getThreadCpuTime(thread_id), 0) / 1e9)
        for thread_id, info in zip(ids, threads.getThreadInfo(ids), strict=True)
        if info is not None
    }


def jvm_driver_cpu(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> float:
    """CPU seconds the driver JVM's threads used between two ``jvm_thread_cpu`` readings, other than
    executor task threads: planning, scheduling, broadcasts and collects. In local mode the
    executors run in the driver JVM, so their task threads are left out by name ("Executor task
    launch worker" while running, "Executor task idle worker" between tasks); GC and JIT threads
    are not Java threads and are not counted. A thread that ended in between is lost (Spark's
    driver threads are pooled, so few are)."""
    return sum(
        cpu - before.get(thread_id, ("", 0.0))[1]
        for thread_id, (name, cpu) in after.items()
        if not name.startswith("Executor task ")
    )


def driver_cpu_reading(spark: Any) -> tuple[float, dict[int, tuple[str, float]]]:
    """A reading of the driver's CPU (this process's, the driver JVM's threads) for ``driver_cpu_since``."""
    return python_cpu(), jvm_thread_cpu(spark)


def driver_cpu_since(spark: Any, reading: tuple[float, dict[int, tuple[str, float]]]) -> tuple[float, float]:
    """The driver's CPU seconds since ``reading``: this process's, and the driver JVM's outside
    executor tasks (``jvm_driver_cpu``). Python's is read first, so the JVM's reading costs it nothing."""
    python = python_cpu() - reading[0]
    return python, jvm_driver_cpu(reading[1], jvm_thread_cpu(spark))
