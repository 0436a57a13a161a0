"""A local Spark Connect server that Epochal starts, supervises and stops (`EPOCHAL_SPARK_MODE=server`,
the default).

A run in local mode starts its own JVM, which costs ~20 s before the first step; with a warm server a
run only attaches to it over gRPC. The server's files live in ``$EPOCHAL_HOME/spark/``:

* ``server.json``: the state (pid, port, when it started, the conf it started with);
* ``server.log``: its output (the previous one kept as ``server.log.prev``, to see why it died);
* ``spark.conf``: its Spark conf, passed as a properties file so that secret keys of
  ``EPOCHAL_SPARK_CONF`` never show in ``ps`` (the file is readable by its owner only);
* ``token``: the server's Spark Connect token, new at each start (owner-only, like ``spark.conf``);
* ``lock``: held while starting or stopping, so concurrent runs start one server, not two.

The server is a separate process group (it outlives the run or command that started it) that
listens on 127.0.0.1 only, and answers only clients that present its token: a Connect server runs
any code its clients send, as the user who started it. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from epochal.spark import idle as spark_idle
from epochal.spark.server_files import (
    SparkServerError,
    locked,
    new_token,
    read_state,
    read_token,
    write_state,
)
from epochal.spark.session import DEFAULT_CONF, check_java

log = logging.getLogger("epochal.spark.server")

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
HOST = "127.0.0.1"
#: the JVM needs ~10-20 s on a small machine; a loaded one, much more
START_TIMEOUT_S = 180.0
#: how long a restart waits for a dead server's port to be released
PORT_RELEASE_S = 15.0
STOP_TIMEOUT_S = 30.0
#: the port a server started with port 0 (EPOCHAL_SPARK_PORT's default) takes when it is free
PREFERRED_PORT = 15052


#: The server JVM's flags, unless EPOCHAL_SPARK_CONF sets spark.driver.extraJavaOptions (which then
#: replaces them). A server of small epochs spends its CPU compiling, not computing: on the demo,
#: 14 epochs after its start, C2 compiled 3.5 s of each epoch's 11 s of server CPU and G1's
#: concurrent marking and collections took 2 s more, while the tasks took 2.8 s (each epoch's new
#: generated classes keep C2 busy). C1 alone compiles those in a tenth of the time, with a code
#: cache as large as tiered compilation's (C1's own default of 48 MB filled and its sweeper spent
#: 5.6 s an epoch), and the parallel collector has no concurrent phase: 5.8 s of server CPU an
#: epoch against 11.2 s (docs/performance.md). Hot loops over large data run slower under C1 alone;
#: a server for large backfills can set its own flags there.
SERVER_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


@dataclass(frozen=True)
class ServerConfig:
    """What a managed server is started with: the settings' home, port, master and Spark conf.

    ``port`` 0 lets the server pick one when it starts (``PREFERRED_PORT`` if free, else any free
    port): two homes on one machine then get a server each, and runs find theirs in server.json."""

    home: Path
    port: int
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    #: stop the server after this long unused (epochal/spark/idle.py); 0: keep it until stopped
    idle_stop_s: float = 0.0

    @classmethod
    def from_settings(cls, settings) -> ServerConfig:  # noqa: ANN001 - Settings; imported lazily
        return cls(
            Path(settings.home), settings.spark_port, settings.spark_master, dict(settings.spark_conf),
            float(settings.spark_idle_stop_s),
        )

    @property
    def directory(self) -> Path:
        return server_directory(self.home)

    def spark_conf(self) -> dict[str, str]:
        """The server's Spark conf: Epochal's defaults, then the user's, then what only we decide."""
        return {
            **DEFAULT_CONF,
            # at INFO the server logs every gRPC call (~1 MB for a few runs of the demo): a server
            # that lives for weeks would fill its disk. EPOCHAL_SPARK_CONF can set it back.
            "spark.log.level": "WARN",
            "spark.driver.extraJavaOptions": SERVER_JAVA_OPTIONS,
            **self.conf,
            "spark.master": self.master,
            "spark.app.name": "epochal-server",
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            # Spark would move to the next port when this one is taken: runs would then not find it
            "spark.connect.grpc.port.maxRetries": "0",
            # marks the process as the server of this home, so a reused pid is never mistaken for it
            "spark.epochal.home": str(self.home),
        }

    def fingerprint(self) -> str:
        """A digest of the conf (not the conf: it may hold secrets), to notice a changed conf."""
        conf = self.spark_conf()
        conf.pop("spark.connect.grpc.binding.port")  # the port is checked on its own (0 means any)
        text = json.dumps(conf, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ServerStatus:
    """A managed server as found now; ``problem`` says why it is not healthy."""

    pid: int
    port: int
    started_at: float
    log: str
    healthy: bool
    problem: str | None = None
    rss_bytes: int | None = None
    conf_fingerprint: str = ""
    #: it stops itself after this long unused (0: never), and how long it has been unused now
    idle_stop_s: float = 0.0
    idle_s: float | None = None
    #: the Spark Connect token clients present ("" for a server started before tokens): never shown
    token: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        """Where the server listens, to show: without its token."""
        return f"sc://{HOST}:{self.port}"

    @property
    def connect_url(self) -> str:
        """The URL a client attaches with: it carries the token, so never print or log it.

        ``localhost``, not 127.0.0.1: pyspark sends a token over TLS to any other host, and gRPC's
        local credentials (plain TCP, checked to be loopback) only to ``localhost``."""
        return f"sc://localhost:{self.port}/;token={self.token}" if self.token else self.url

    @property
    def uptime_s(self) -> float:
        return max(0.0, time.time() - self.started_at)

    def to_json(self) -> dict[str, object]:
        shown = {k: v for k, v in asdict(self).items() if k != "token"}
        return {**shown, "url": self.url, "uptime_s": round(self.uptime_s, 1)}


def server_directory(home: Path) -> Path:
    return Path(home) / "spark"


def spark_home() -> Path:
    """``$SPARK_HOME`` if set, else the pyspark install: its jars include the Connect server."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkServerError("pyspark is not installed: `pip install -e .` (or set SPARK_HOME to a Spark 4 install)")
    return Path(spec.origin).parent


# ---------------------------------------------------------------------------------------- queries


def status(home: Path) -> ServerStatus | None:
    """The managed server of ``home`` as it is now, or None if Epochal never started one (or stopped it)."""
    state = read_state(server_directory(home))
    if state is None:
        return None
    pid, port = int(state["pid"]), int(state["port"])
    problem = None
    if not _is_our_server(pid, Path(home)):
        problem = f"the server (pid {pid}) is not running; see {state['log']}"
    elif not _listening(port):
        problem = f"the server (pid {pid}) runs but does not answer on {HOST}:{port}; see {state['log']}"
    return ServerStatus(
        pid=pid,
        port=port,
        started_at=float(state["started_at"]),
        log=str(state["log"]),
        healthy=problem is None,
        problem=problem,
        rss_bytes=_rss_bytes(pid) if problem is None or "does not answer" in problem else None,
        conf_fingerprint=str(state.get("conf_fingerprint", "")),
        idle_stop_s=float(state.get("idle_stop_s", 0.0)),
        idle_s=spark_idle.idle_seconds(server_directory(home)),
        token=read_token(server_directory(home)),
    )


# ---------------------------------------------------------------------------------------- actions


def ensure(config: ServerConfig) -> ServerStatus:
    """A healthy managed server for ``config``: the running one, or a new one if there is none or it
    died. This process then keeps the server's lease renewed while it lives (idle.py)."""
    with locked(config.directory):
        current = _ensurelocked(config)
        # under the lock: an idle watchdog checks the lease again under it before stopping the server
        spark_idle.keep_alive(config.directory)
        return current


def start(config: ServerConfig) -> tuple[ServerStatus, bool]:
    """Start the server unless a healthy one runs; returns it and whether it was started now."""
    with locked(config.directory):
        before = status(config.home)
        current = _ensurelocked(config)
        spark_idle.touch(config.directory)  # a start by hand counts as a use
        return current, before is None or not before.healthy


def is_running(home: Path, pid: int) -> bool:
    """Whether ``pid`` is still the managed server of ``home`` and alive."""
    state = read_state(server_directory(home))
    return state is not None and int(state["pid"]) == pid and _is_our_server(pid, Path(home))


def stop_if(home: Path, pid: int, still_wanted: Callable[[], bool]) -> bool:
    """Stop the server ``pid`` of ``home`` if it is still the server and ``still_wanted()`` holds,
    both checked under the lock; returns whether it was stopped."""
    directory = server_directory(home)
    with locked(directory):
        if not is_running(home, pid) or not still_wanted():
            return False
        _terminate(pid, STOP_TIMEOUT_S)
        (directory / "server.json").unlink(missing_ok=True)
        return True


def stop(home: Path, timeout_s: float = STOP_TIMEOUT_S) -> ServerStatus | None:
    """Stop the managed server of ``home`` (SIGTERM, then SIGKILL after ``timeout_s``); returns what
    was stopped, or None when there was nothing to stop."""
    directory = server_directory(home)
    with locked(directory):
        current = status(home)
        if current is None:
            return None
        if _is_our_server(current.pid, Path(home)):
            _terminate(current.pid, timeout_s)
        (directory / "server.json").unlink(missing_ok=True)
        return current


def _ensurelocked(config: ServerConfig) -> ServerStatus:
    current = status(config.home)
    if current is not None and current.healthy:
        if config.port and current.port != config.port:
            raise SparkServerError(
                f"Epochal's Spark server for {config.home} listens on port {current.port}, not "
                f"EPOCHAL_SPARK_PORT={config.port}: run `epochal spark stop` to restart it on the new port"
            )
        if current.conf_fingerprint and current.conf_fingerprint != config.fingerprint():
            log.warning(
                "Epochal's Spark server (pid %d) was started with another Spark conf or master; runs use it "
                "as it is: `epochal spark stop` to restart it with the current settings",
                current.pid,
            )
        return current
    if current is not None:
        # Known but not healthy: a JVM that died (out of memory, killed) or hangs. A hung one still
        # holds the port, so it goes first.
        log.warning("restarting Epochal's Spark server: %s", current.problem)
        if _is_our_server(current.pid, config.home):
            _terminate(current.pid, STOP_TIMEOUT_S)
        if config.port and config.port == current.port:
            _wait_until_bindable(current.port, PORT_RELEASE_S)
    return _launch(config)


def _launch(config: ServerConfig) -> ServerStatus:
    check_java()
    if config.port == 0:
        config = replace(config, port=_pick_port())
    _require_free_port(config.port)
    directory = config.directory
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "server.log"
    if log_path.exists():
        log_path.replace(directory / "server.log.prev")
    conf_path = directory / "spark.conf"
    # created owner-only before anything is written: the conf may hold secret keys
    fd = os.open(conf_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for key, value in config.spark_conf().items():
            out.write(f"{key} {_escape_property(value)}\n")
    token = new_token(directory)
    home = spark_home()
    command = [
        str(home / "bin" / "spark-submit"),
        "--class", SERVER_CLASS,
        "--properties-file", str(conf_path),
    ]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        # the server's Python workers (a sink's writer tasks) run Epochal's code: this interpreter has it
        "PYSPARK_PYTHON": sys.executable,
        # the token in the environment (readable by its owner only, in /proc), not the command line
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
    }
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            command,
            cwd=directory,  # Spark's own scratch files (spark-warehouse, derby.log) stay here
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the run or command that started it, and its Ctrl-C
        )
    started_at = time.time()
    write_state(directory, {
        "pid": process.pid,
        "port": config.port,
        "started_at": started_at,
        "log": str(log_path),
        "conf_fingerprint": config.fingerprint(),
        "python": sys.executable,
    })
    deadline = started_at + START_TIMEOUT_S
    while True:
        code = process.poll()
        if code is not None:
            (directory / "server.json").unlink(missing_ok=True)
            raise SparkServerError(
                f"the Spark Connect server exited with code {code} while starting; its log ({log_path}) "
                f"ends with:\n{_tail(log_path)}"
            )
        if _listening(config.port):
            break
        if time.time() > deadline:
            _terminate(process.pid, STOP_TIMEOUT_S)
            (directory / "server.json").unlink(missing_ok=True)
            raise SparkServerError(
                f"the Spark Connect server did not listen on {HOST}:{config.port} within {START_TIMEOUT_S:.0f}s "
                f"and was stopped; its log ({log_path}) ends with:\n{_tail(log_path)}"
            )
        time.sleep(0.25)
    log.info("started Epochal's Spark server, pid %d, on %s:%d in %.1fs", process.pid, HOST, config.port,
             time.time() - started_at)
    if config.idle_stop_s > 0:
        _start_watchdog(config, process.pid)
    found = status(config.home)
    if found is None or not found.healthy:  # it listened a moment ago: only a death in between
        raise SparkServerError(
            f"the Spark Connect server stopped right after starting; its log ({log_path}) ends with:\n"
            f"{_tail(log_path)}"
        )
    return found


# ---------------------------------------------------------------------------------------- helpers


def _start_watchdog(config: ServerConfig, pid: int) -> None:
    """The process that stops the server ``pid`` once unused for ``config.idle_stop_s`` (idle.py);
    its own session, like the server's, so it outlives the run that started both."""
    directory = config.directory
    spark_idle.touch(directory)  # a new server starts in use
    # this epochal importable from the watchdog's cwd, installed or not (a checkout run from its root)
    package_parent = str(Path(spark_idle.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    with open(directory / "watchdog.log", "ab") as out:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "epochal.spark.watchdog", str(config.home), str(pid), str(config.idle_stop_s)],
            cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state = read_state(directory) or {}
    write_state(directory, {**state, "watchdog_pid": watchdog.pid, "idle_stop_s": config.idle_stop_s})


def _escape_property(value: str) -> str:
    # java.util.Properties reads backslashes as escapes
    return value.replace("\\", "\\\\")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_our_server(pid: int, home: Path) -> bool:
    """``pid`` runs, and is the Connect server Epochal started for ``home`` (a pid can be reused)."""
    cmdline = _cmdline(pid)
    if SERVER_CLASS not in cmdline:
        return False
    if _zombie(pid):
        return False
    conf = str(server_directory(home) / "spark.conf")
    return conf in cmdline


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((HOST, port)) == 0


def _pick_port() -> int:
    """PREFERRED_PORT when it is free, else a free port the kernel chooses. Another process may take
    it before the JVM binds it; the server then exits and the error shows its log."""
    if _bindable(PREFERRED_PORT):
        return PREFERRED_PORT
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _wait_until_bindable(port: int, timeout_s: float) -> None:
    """A killed JVM's main thread is a zombie before its other threads have exited, and its
    listening socket is closed only with the last of them (seconds for a large heap): wait for the
    port rather than report it taken. Returns at the timeout either way (``_require_free_port``
    then names the owner)."""
    deadline = time.time() + timeout_s
    while not _bindable(port) and time.time() < deadline:
        time.sleep(0.1)


def _require_free_port(port: int) -> None:
    if not 0 < port < 65536:
        raise SparkServerError(f"EPOCHAL_SPARK_PORT={port} is not a TCP port: use 1-65535, or 0 to pick one")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise SparkServerError(f"cannot use port {port} for the Spark server: {exc.strerror}") from None
            raise SparkServerError(
                f"port {port} is taken by another process{_owner(port)}, so Epochal cannot start its Spark "
                f"server there: set EPOCHAL_SPARK_PORT to a free port (or to 0, to pick one), or stop that process"
            ) from None


def _owner(port: int) -> str:
    """`` (pid N: cmd)`` for the process listening on ``port``, when /proc shows it (same user)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(parts[9])
    if not inodes:
        return ""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmdline = _cmdline(int(entry.name))
                    if SERVER_CLASS in cmdline and "--properties-file" in cmdline:
                        conf = Path(cmdline[cmdline.index("--properties-file") + 1])
                        return f" (pid {entry.name}: Epochal's Spark server of EPOCHAL_HOME={conf.parent.parent})"
                    command = " ".join(" ".join(cmdline).split())  # one line, whatever its arguments hold
                    return f" (pid {entry.name}: {command[:120]})"
    return ""


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM (Spark stops its session and workers), SIGKILL if it does not go within ``timeout_s``."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            _reap(pid)
            if _zombie(pid) or not _cmdline(pid):
                return
            time.sleep(0.2)
    raise SparkServerError(f"the Spark server (pid {pid}) did not stop, even on SIGKILL: look at it with `ps {pid}`")


def _reap(pid: int) -> None:
    # A server this process started is its child: collect its exit, or it stays a zombie
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


def describe(current: ServerStatus | None) -> str:
    """The lines `epochal spark status` prints."""
    if current is None:
        return "no Spark server: `epochal spark start` starts one (EPOCHAL_SPARK_MODE=server starts it on first use)"
    memory = f"{current.rss_bytes / 2**20:.0f} MiB" if current.rss_bytes else "-"
    state = "healthy" if current.healthy else f"NOT HEALTHY: {current.problem}"
    return "\n".join([
        f"state   : {state}",
        f"url     : {current.url}",
        f"pid     : {current.pid}",
        f"uptime  : {current.uptime_s:.0f}s",
        f"memory  : {memory} (RSS of the JVM)",
        f"idle    : {_idle_line(current)}",
        f"log     : {current.log}",
    ])


def _idle_line(current: ServerStatus) -> str:
    unused = f"unused for {current.idle_s:.0f}s" if current.idle_s is not None else "not used yet"
    if not current.idle_stop_s:
        return f"{unused}; kept until `epochal spark stop` (EPOCHAL_SPARK_IDLE_STOP_S=0 when it started)"
    return f"{unused}; stops itself after {current.idle_stop_s:.0f}s unused"


__all__ = ["ServerConfig", "ServerStatus", "SparkServerError", "describe", "ensure", "is_running", "spark_home",
           "start", "status", "stop", "stop_if"]
