"""The Spark Connect server Epochal manages (EPOCHAL_SPARK_MODE=server), on real JVMs.

A server start costs 5-20 s, so the slow tests are few and each covers a whole life: start, reuse,
death, restart, stop; and a pipeline whose runs attach to it, checked against the batch oracle.
The error paths (port taken, Java missing, a server that cannot start) need no healthy server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.connectors.log import append_records
from epochal.errors import JavaMissingError
from epochal.spark.server import SERVER_JAVA_OPTIONS, ServerConfig, SparkServerError, ensure, start, status, stop
from tests.consistency import assert_sink_exactly_once, assert_views_match_batch
from tests.epochal_harness import make_harness
from tests.incremental.test_incremental_views import EPOCHS, SOURCES
from tests.spark.test_spark_connect import VIEWS_ON_CONNECT

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cli(home: Path, port: int, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHAL_")}
    # no warm-up epochs unless a test asks (`--warm-up N`): each costs seconds on a cold server
    env |= {"EPOCHAL_HOME": str(home), "EPOCHAL_SPARK_PORT": str(port), "EPOCHAL_SPARK_WARMUP_EPOCHS": "0"}
    return subprocess.run([sys.executable, "-m", "epochal.cli", "spark", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_the_server_jvm_flags_are_a_default_the_users_conf_replaces(tmp_path: Path) -> None:
    default = ServerConfig(tmp_path, 0).spark_conf()
    assert default["spark.driver.extraJavaOptions"] == SERVER_JAVA_OPTIONS
    # two collectors on one command line would stop the JVM from starting: the user's flags replace ours
    own = ServerConfig(tmp_path, 0, conf={"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}).spark_conf()
    assert own["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"


@pytest.mark.slow
def test_start_reuse_death_restart_and_stop(tmp_path: Path) -> None:
    home, port = tmp_path / "home", _free_port()
    config = ServerConfig(home, port, "local[2]", {"spark.driver.memory": "1g"})
    assert status(home) is None
    try:
        # `epochal spark start` in another process: the server must outlive the command that started it.
        # It warms the new server with an epoch of the demo in a scratch home, which it then removes.
        scratch_before = set(Path(tempfile.gettempdir()).glob("epochal-warmup-*"))
        started = _cli(home, port, "start", "--warm-up", "1")
        assert started.returncode == 0, started.stderr
        assert f"started sc://127.0.0.1:{port}" in started.stdout
        assert "warm-up epoch 1/1" in started.stdout and "warmed up with 1 epoch of the demo" in started.stdout, started
        assert set(Path(tempfile.gettempdir()).glob("epochal-warmup-*")) == scratch_before
        assert sorted(p.name for p in home.iterdir()) == ["spark"], "the user's home holds no warm-up epoch"
        first = status(home)
        assert first is not None and first.healthy and _alive(first.pid), first
        assert first.rss_bytes and first.rss_bytes > 50 * 2**20, "RSS of a JVM running Spark"
        # the JVM runs with the server's own flags (C1 alone, the parallel collector)
        jvm_args = Path(f"/proc/{first.pid}/cmdline").read_bytes().decode().split("\0")
        assert {"-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1"} <= set(jvm_args), jvm_args
        shown = _cli(home, port, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        described = json.loads(shown.stdout)
        assert (described["pid"], described["url"], described["healthy"]) == (first.pid, first.url, True)
        assert described["uptime_s"] >= 0
        _only_clients_with_the_token_get_in(home, port, first.token, shown.stdout + started.stdout)

        # a second start (and ensure) reuses the healthy server
        again, was_started = start(config)
        assert not was_started and again.pid == first.pid
        assert ensure(config).pid == first.pid
        assert "already running" in _cli(home, port, "start").stdout

        # the JVM dies (OOM killer, kill -9): status says so, ensure starts a new one on the same port
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.time() + 10
        while _alive(first.pid) and time.time() < deadline:
            time.sleep(0.1)
        dead = status(home)
        assert dead is not None and not dead.healthy and "not running" in (dead.problem or "")
        assert _cli(home, port, "status").returncode == 1, "status exits non-zero when the server is not healthy"
        restarted = ensure(config)
        assert restarted.healthy and restarted.pid != first.pid and restarted.port == port
        assert (home / "spark" / "server.log.prev").exists(), "the dead server's log is kept"
        assert oct((home / "spark" / "spark.conf").stat().st_mode & 0o777) == "0o600", "the conf may hold secrets"
        assert restarted.token and restarted.token != first.token, "a new token for each start"
        _only_clients_with_the_token_get_in(home, port, restarted.token, "")
    finally:
        stopped = _cli(home, port, "stop")
    assert stopped.returncode == 0 and "stopped the Spark server" in stopped.stdout, stopped
    assert status(home) is None and not _alive(restarted.pid)
    assert "no Spark server was running" in _cli(home, port, "stop").stdout


def _only_clients_with_the_token_get_in(home: Path, port: int, token: str, shown: str) -> None:
    """The managed server runs any Python its clients send: a local process without the token (in
    the URL or in SPARK_CONNECT_AUTHENTICATE_TOKEN) is refused; with it, it gets in. The token is
    in an owner-only file, not in what the CLI printed, nor on the JVM's command line."""
    probe = (
        "import sys\n"
        "from pyspark.sql.connect.session import SparkSession\n"
        "try:\n"
        "    print(SparkSession.builder.remote(sys.argv[1]).create().range(3).count())\n"
        "except Exception as exc:\n"
        "    print('refused', type(exc).__name__, str(exc).splitlines()[0][:300])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}

    def attach(url: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe, url], env=env, capture_output=True, text=True, timeout=120)
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]

    for url in (f"sc://127.0.0.1:{port}", f"sc://localhost:{port}", f"sc://localhost:{port}/;token=wrong{token[:4]}"):
        answer = attach(url)
        assert answer.startswith("refused"), (url, answer)
    assert attach(f"sc://localhost:{port}/;token={token}") == "3"
    path = home / "spark" / "token"
    assert path.read_text() == token and oct(path.stat().st_mode & 0o777) == "0o600"
    current = status(home)
    assert current is not None and token not in repr(current) and token not in json.dumps(current.to_json())
    assert token not in shown
    assert token not in Path(f"/proc/{current.pid}/cmdline").read_text()


def test_port_taken_by_another_process_names_it_and_the_fix(tmp_path: Path) -> None:
    port = _free_port()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', {port})); "
         "s.listen(); print('listening', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        with pytest.raises(SparkServerError, match=f"port {port} is taken by another process.*pid {holder.pid}"):
            start(ServerConfig(tmp_path, port))
        run = _cli(tmp_path, port, "start")
        assert run.returncode == 1
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "set EPOCHAL_SPARK_PORT to a free port" in lines[0], run.stderr
        assert status(tmp_path) is None, "nothing was started"
    finally:
        holder.kill()
        holder.wait()


def test_a_warm_up_that_fails_leaves_the_started_server_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warm-up is speed only: its failure is named, and `spark start` still succeeds (pure: the
    start and the warm-up are replaced, the CLI's handling is what is checked)."""
    from epochal import cli
    from epochal.spark import server as spark_server
    from epochal.spark import warmup as spark_warmup
    from epochal.spark.server import ServerStatus

    running = ServerStatus(pid=4242, port=15099, started_at=time.time(), log="server.log", healthy=True)
    monkeypatch.setattr(spark_server, "start", lambda config: (running, True))

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the demo's source failed")

    monkeypatch.setattr(spark_warmup, "warm_up", broken)
    monkeypatch.setenv("EPOCHAL_HOME", str(tmp_path))
    assert cli.main(["spark", "start", "--warm-up", "2"]) == 0
    out = capsys.readouterr()
    assert "started sc://127.0.0.1:15099" in out.out
    assert "not warmed up (RuntimeError: the demo's source failed); it runs and serves runs cold" in out.err
    # A cluster master: its executors could not read the scratch home, so no warm-up is tried.
    monkeypatch.setenv("EPOCHAL_SPARK_MASTER", "spark://cluster:7077")
    assert cli.main(["spark", "start", "--warm-up", "2"]) == 0
    assert "not warmed up: EPOCHAL_SPARK_MASTER=spark://cluster:7077 is not local" in capsys.readouterr().err


def test_java_missing_and_a_server_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(JavaMissingError, match="install a JDK"):
        ensure(ServerConfig(tmp_path, _free_port()))
    monkeypatch.delenv("JAVA_HOME")
    # the JVM refuses a 1 KiB heap at once: the error carries the tail of the server's log
    with pytest.raises(SparkServerError, match=r"(?s)exited with code \d+ while starting.*heap"):
        ensure(ServerConfig(tmp_path, _free_port(), conf={"spark.driver.memory": "1k"}))
    assert status(tmp_path) is None


@contextlib.contextmanager
def _holding(port: int) -> Iterator[bool]:
    """Listen on ``port`` for the block, as another home's server would; yields whether we got it."""
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", port))
        except OSError:
            yield False  # something else holds it already: as good for the tests
            return
        holder.listen()
        yield True


def test_the_default_port_is_picked_when_the_server_starts_and_moves_on_when_taken() -> None:
    from epochal.settings import Settings
    from epochal.spark.server import PREFERRED_PORT, _pick_port

    settings = Settings.from_env({})
    assert (settings.spark_mode, settings.spark_port) == ("server", 0), "the managed server is the default"
    with _holding(PREFERRED_PORT):
        picked = _pick_port()
        assert picked != PREFERRED_PORT and 0 < picked < 65536
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", picked))  # free: a server can listen there
    # a conf that differs only in the picked port is the same conf
    def config(port: int, memory: str) -> ServerConfig:
        return ServerConfig(Path("/h"), port, "local[2]", {"spark.driver.memory": memory})

    assert config(picked, "1g").fingerprint() == config(0, "1g").fingerprint()
    assert config(0, "2g").fingerprint() != config(0, "1g").fingerprint()


def test_an_unused_server_is_stopped_only_once_its_lease_is_older_than_the_limit(tmp_path: Path) -> None:
    from epochal.settings import ConfigError, Settings
    from epochal.spark.idle import RENEW_S, idle_seconds, should_stop, touch

    assert Settings.from_env({}).spark_idle_stop_s == 1800
    assert Settings.from_env({"EPOCHAL_SPARK_IDLE_STOP_S": "0"}).spark_idle_stop_s == 0
    with pytest.raises(ConfigError, match="EPOCHAL_SPARK_IDLE_STOP_S=30 is too short: use 0"):
        Settings.from_env({"EPOCHAL_SPARK_IDLE_STOP_S": "30"})

    assert idle_seconds(tmp_path) is None
    touch(tmp_path)
    assert idle_seconds(tmp_path) < 5
    os.utime(tmp_path / "in_use", (time.time() - 600, time.time() - 600))
    assert 599 < idle_seconds(tmp_path) < 605
    assert should_stop(601, 600) and not should_stop(599, 600)
    assert not should_stop(10**6, 0), "0 keeps the server until it is stopped"
    assert not should_stop(None, 600), "a lease never renewed: the server is starting"
    assert not should_stop(2 * RENEW_S - 1, 1), "never closer than two renewals"


@pytest.mark.slow
def test_runs_in_server_mode_attach_to_one_warm_server_and_match_batch(spark, tmp_path: Path) -> None:
    """Two `dagster job execute` runs in server mode with the default port while another process holds
    15052: the first starts the server on a port it picks, the second finds and reuses it; every view
    equals a classic Spark batch over the committed source rows."""
    from epochal.spark.server import PREFERRED_PORT

    statements = [f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in VIEWS_ON_CONNECT.items()]
    statements.append(
        "CREATE SINK cheap_out FROM cheap WITH (connector = 'duckdb', database = 'out/cheap.duckdb', "
        "table = 'cheap', type = 'upsert', primary_key = 'id', writers = '2');"
    )
    h = make_harness(tmp_path, {"sources.sql": SOURCES, "views.sql": "\n".join(statements)})
    (h.home / "data" / "customers").mkdir(parents=True, exist_ok=True)
    # the tests' conftest makes local the default of their subprocesses; this one runs the real default
    env = {"EPOCHAL_SPARK_MODE": "server", "EPOCHAL_SPARK_CONF": "spark.driver.memory=1g"}
    pids = []
    try:
        with _holding(PREFERRED_PORT):
            for orders, customers in (EPOCHS[0], EPOCHS[1]):
                append_records(h.home / "data" / "orders", orders)
                append_records(h.home / "data" / "customers", customers)
                run = h.run_subprocess(env=env, timeout=600)
                assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
                # Spark-start confs go to the server; a session asking for them gets a warning
                assert "CANNOT_MODIFY_STATIC_CONFIG" not in run.stdout + run.stderr
                server_conf = (h.home / "spark" / "spark.conf").read_text()
                assert "spark.sql.codegen.cache.maxEntries 2000" in server_conf
                # (no Python call-site capture around every DataFrame call the runs make)
                assert "spark.python.sql.dataFrameDebugging.enabled false" in server_conf
                server = status(h.home)
                assert server is not None and server.healthy, "the run left the managed server running"
                pids.append(server.pid)
                runtime = h.runtime(spark)  # classic Spark reads what the server wrote
                assert_views_match_batch(runtime, VIEWS_ON_CONNECT)
                assert_sink_exactly_once(runtime, "cheap_out")
            assert pids[0] == pids[1], "the second run attached to the warm server"
            assert server.port != PREFERRED_PORT, "15052 was taken: the server picked another port"

        # the runs are over: their leases age. The watchdog started with the server watches it...
        from epochal.spark.watchdog import watch

        state = json.loads((h.home / "spark" / "server.json").read_text())
        assert state["idle_stop_s"] == 1800 and _alive(state["watchdog_pid"])
        assert "epochal.spark.watchdog" in Path(f"/proc/{state['watchdog_pid']}/cmdline").read_text()
        assert "stops itself after 1800s unused" in _cli(h.home, server.port, "status").stdout
        # ...and, as it would after 30 unused minutes, stops it: here with the lease set back an hour,
        # watched from this process. The server's own watchdog goes first: it polls every 30 s and would
        # otherwise race this watch for the stop (the loser then reports "gone"; 1 of CI's runs).
        os.kill(state["watchdog_pid"], signal.SIGTERM)
        lease = h.home / "spark" / "in_use"
        os.utime(lease, (time.time() - 3600, time.time() - 3600))
        assert watch(h.home, server.pid, limit_s=600, poll_s=0.2) == "stopped"
        assert status(h.home) is None and not _alive(server.pid)
    finally:
        stop(h.home)


def _client_url(home: Path) -> str:
    """The managed server's URL with its token, as runs attach."""
    current = status(home)
    assert current is not None and current.token, "the server was started with a token"
    return current.connect_url


def _cached_on_server(url: str, plan) -> bool:  # noqa: ANN001
    """Whether a fresh session's read of ``plan``'s files is answered from the server's cache (its
    physical plan scans memory; every file read also names an InMemoryFileIndex, so match the scan)."""
    import contextlib as _contextlib
    import io

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from epochal.storage.state_reader import StateReader

    session = ConnectSession.builder.remote(url).create()
    out = io.StringIO()
    try:
        with _contextlib.redirect_stdout(out):
            StateReader(lambda: session, None, None, None, None).snapshot_rows(plan).explain()  # type: ignore[arg-type]
    finally:
        session.stop()
    return "InMemoryTableScan" in out.getvalue()


@pytest.mark.slow
def test_a_snapshot_cached_by_one_run_serves_the_next_and_is_released_by_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the server, a run leaves its cached snapshot to the next run (whose reads find it warm
    without a call of theirs); the run that caches a newer snapshot of the table releases it from
    its own session, and compaction releases one before deleting it; a snapshot whose files are
    gone cannot be matched, so the server's cache is cleared instead of leaking it."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.connect.session import SparkSession as ConnectSession
    from pyspark.sql.types import LongType, StructField, StructType

    from epochal.storage.state_cache import SnapshotPlan, StateCache
    from epochal.storage.state_reader import StateReader

    # Connect sessions only (the classic builder's remote() would turn this process's later classic
    # sessions into Connect ones), and Connect columns only while this test runs.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    home, port = tmp_path / "home", _free_port()
    schema = StructType([StructField("k", LongType()), StructField("n", LongType())]).json()
    plans = {}
    for name in ("s1", "s2", "s3", "s4"):
        (tmp_path / name).mkdir()
        for part in range(2):
            rows = pa.table({"k": list(range(part, 2000, 2)), "n": [1] * 1000})
            pq.write_table(rows, tmp_path / name / f"{part}.parquet")
        plans[name] = SnapshotPlan(schema, tuple(sorted(str(f) for f in (tmp_path / name).glob("*.parquet"))))
    registry = home / "spark" / "state_cache.json"

    def run(cache_it: str | None, then=None, table: str = "t") -> None:  # noqa: ANN001
        """One run: its own Connect session and cache; it caches snapshot ``cache_it`` of ``table``."""
        session = ConnectSession.builder.remote(_client_url(home)).create()
        try:
            cache = StateCache(registry=registry)
            reader = StateReader(lambda: session, None, None, cache, None)  # type: ignore[arg-type]
            if cache_it is not None:
                plan = plans[cache_it]
                location = str(tmp_path / cache_it)
                rows = cache.put(table, location, reader.snapshot_rows(plan), plan, reader.snapshot_rows)
                assert rows.where("k = 3").count() == 1
            if then is not None:
                then(reader)
            cache.clear()  # the run ends
        finally:
            session.stop()

    def adopted(location: str) -> bool:
        """Whether a new run's cache answers a read of ``location`` of t with what an earlier run left."""
        session = ConnectSession.builder.remote(_client_url(home)).create()
        try:
            cache = StateCache(registry=registry)
            reader = StateReader(lambda: session, None, None, cache, None)  # type: ignore[arg-type]
            rows = cache.get("t", location, reader.snapshot_rows)
            found = rows is not None and rows.where("k = 3").count() == 1 and cache.hits == 1
            cache.clear()  # the run ends: what it adopted stays on the server
            return found
        finally:
            session.stop()

    try:
        start(ServerConfig(home, port, "local[2]", {"spark.driver.memory": "1g"}))
        run("s1")
        assert _cached_on_server(_client_url(home), plans["s1"]), "left to the next run"
        assert json.loads(registry.read_text())["t"]["location"] == str(tmp_path / "s1")
        # The next run knows it is cached (no job to choose vnodes, no caching again) ...
        assert adopted(str(tmp_path / "s1")) and _cached_on_server(_client_url(home), plans["s1"])
        assert not adopted(str(tmp_path / "s2")), "another snapshot of the table is not the cached one"
        # ... unless another server (one started since) cached it: that one's cache went with it.
        kept = json.loads(registry.read_text())
        registry.write_text(json.dumps({"t": {**kept["t"], "server": "local-0"}}))
        assert not adopted(str(tmp_path / "s1"))
        registry.write_text(json.dumps(kept))
        run("s2")
        assert not _cached_on_server(_client_url(home), plans["s1"]), "released by the run that cached a newer snapshot"
        assert _cached_on_server(_client_url(home), plans["s2"])
        # Compaction releases a snapshot (here: the table's directory) before it deletes the files.
        run(None, then=lambda reader: reader.release_snapshots([str(tmp_path)]))
        assert not _cached_on_server(_client_url(home), plans["s2"]) and json.loads(registry.read_text()) == {}
        # s3's files go without a release (a crash between): the next snapshot clears the whole cache.
        run("s3")
        run("s1", table="u")
        shutil.rmtree(tmp_path / "s3")
        run("s4")
        assert not _cached_on_server(_client_url(home), plans["s1"]), "the clear took every cached snapshot, u's too"
        assert _cached_on_server(_client_url(home), plans["s4"]), "cached after the clear"
        assert json.loads(registry.read_text())["t"]["location"] == str(tmp_path / "s4"), "one snapshot per table"
        # A registry that cannot be written costs the cross-run cache, never the read.
        (tmp_path / "not-a-directory").write_text("")
        registry = tmp_path / "not-a-directory" / "state_cache.json"
        run("s1", table="v")
    finally:
        stop(home)


_SLOT_RUN = """
import json, os, sys
from resources.spark import EpochalSparkResource
run = EpochalSparkResource(remote=sys.argv[1], session_slots=2, session_slots_dir=sys.argv[2])
session = run.spark_session
print(json.dumps({"id": session.session_id, "pool": session.conf.get("spark.scheduler.pool", None),
                  "rows": session.range(3).count()}), flush=True)
if sys.argv[3] == "killed-in-a-backfill-pool":
    session.conf.set("spark.scheduler.pool", "epochal_backfill")
    os._exit(9)
run.teardown_after_execution(None)
"""


@pytest.mark.slow
def test_runs_take_a_warm_session_slot_and_a_session_the_server_closed_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's session outlives it in its slot: the next run (another process) attaches to the same
    server-side session (warm: no cold session per run, no new Python workers); the pool of a run
    killed inside a backfill is reset; a session the server has closed is replaced, without failing."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from epochal.spark.slots import with_session_id

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    home, port = tmp_path / "home", _free_port()
    slots = tmp_path / "slots"

    def run(how: str = "ends") -> dict:
        url = _client_url(home)
        done = subprocess.run(
            [sys.executable, "-c", _SLOT_RUN, url, str(slots), how], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == (9 if how != "ends" else 0), done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        start(ServerConfig(home, port, "local[2]", {"spark.driver.memory": "1g"}))
        first = run("killed-in-a-backfill-pool")
        assert first["rows"] == 3 and first["pool"] is None
        second = run()
        assert second["id"] == first["id"], "the session the first run used, still open on the server"
        assert second["pool"] is None, "the killed run's pool is reset when the slot is taken"
        assert run()["id"] == first["id"]
        # The server closes the session (released elsewhere, or idle past its timeout).
        ConnectSession.builder.remote(with_session_id(_client_url(home), first["id"])).create().stop()
        third = run()
        assert third["id"] != first["id"] and third["rows"] == 3
        assert json.loads((slots / "slot-0.json").read_text())["session_id"] == third["id"]
    finally:
        stop(home)
