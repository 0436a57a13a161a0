"""A local Dagster webserver (``dagster dev`` or ``dg dev``) in a subprocess, for the UI tests.

It runs in its own process group with a temporary DAGSTER_HOME and EPOCHAL_HOME, on a free port, and
the whole group (webserver, daemon, code server and any run it launched) is killed on exit, failure
or not.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCATION = "platform_defs"  # workspace.yaml's module and [tool.dg.project] code_location_name


def venv_script(name: str) -> str:
    """A console script installed next to this interpreter (``dg``, ``epochal``), as a user's shell finds it."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: install the project with `pip install -e '.[dev]'`")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a first-time user: fresh Epochal and Dagster homes, no telemetry."""
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # The UI's first-visit "join the community" dialog would cover the page; Dagster skips it once
    # this file exists (dagster._core.nux).
    (dagster_home / ".nux").mkdir()
    (dagster_home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    env = {**os.environ, "EPOCHAL_HOME": str(tmp_path / "epochal_home"), "DAGSTER_HOME": str(dagster_home)}
    for name in ("EPOCHAL_PIPELINE", "EPOCHAL_FAULT"):  # the bundled demo, no injected faults
        env.pop(name, None)
    return env


def epochal_status(env: dict[str, str]) -> dict[str, Any]:
    """``epochal status --json`` in ``env``: what the meta store says was committed."""
    proc = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "status", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"epochal status failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


@dataclass
class DagsterDev:
    url: str
    process: subprocess.Popen
    log: Path

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.load(response)
        if payload.get("errors"):
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def jobs(self) -> dict[str, list[str]]:
        """Job names per loaded code location (empty while the location is still loading)."""
        data = self.graphql(
            "{ repositoriesOrError { ... on RepositoryConnection { nodes { location { name } jobs { name } } } } }"
        )
        nodes = data["repositoriesOrError"].get("nodes", [])
        return {n["location"]["name"]: [j["name"] for j in n["jobs"]] for n in nodes}

    def load_error(self) -> str | None:
        """The code location's load error (its Python traceback), once loading has failed."""
        data = self.graphql(
            "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError {"
            " __typename ... on PythonError { message stack errorChain { error { message } } } } } } } }"
        )
        for entry in data["workspaceOrError"].get("locationEntries", []):
            error = entry["locationOrLoadError"] or {}
            if entry["name"] == LOCATION and error.get("__typename") == "PythonError":
                causes = [link["error"]["message"] for link in error["errorChain"]]
                return "\n".join([error["message"] + "".join(error["stack"]), *causes])
        return None

    def run_status(self, run_id: str) -> str:
        data = self.graphql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", {"id": run_id})
        return data["runOrError"]["status"]

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the group (dagster dev shuts its children down), then SIGKILL whatever is left."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        break
    # The leader is gone; children (a run worker, a code server) may still be in the group.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def dagster_dev(command: Sequence[str], env: dict[str, str], log: Path, timeout: float = 300) -> Iterator[DagsterDev]:
    """Start ``command`` (which must take ``--port``) from the repo root; yield once epoch_job is loaded."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = DagsterDev(url, process, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if "epoch_job" in server.jobs().get(LOCATION, []):
                    break
                if error := server.load_error():
                    raise RuntimeError(f"{command[0]} could not load {LOCATION}:\n{error}")
            except OSError:
                pass  # not listening yet (refused, reset, timed out)
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}:\n{server.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command[0]} did not serve epoch_job within {timeout}s:\n{server.tail()}")
            time.sleep(1)
        yield server
    finally:
        _kill_group(process)

