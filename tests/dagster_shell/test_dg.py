"""`dg`, Dagster's CLI after `dagster job execute` and `dagster dev`, on this repo as a user runs it.

pyproject.toml's [tool.dg] section makes the repo root a dg project whose Definitions are
``platform_defs.defs``; these tests run the README's commands from the repo root with fresh homes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.dagster_dev import LOCATION, REPO, dagster_dev, epochal_status, isolated_env, venv_script

pytestmark = pytest.mark.slow


def run_dg(*args: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv_script("dg"), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_dg_check_defs_loads_the_definitions(tmp_path: Path) -> None:
    proc = run_dg("check", "defs", env=isolated_env(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "All definitions loaded successfully" in proc.stdout + proc.stderr


def test_dg_launch_job_commits_an_epoch(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    proc = run_dg("launch", "--job", "epoch_job", env=env, timeout=900)  # ~70 s on an idle machine
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # INFO by default: Epochal's lines and the summary the run ends with, none of Dagster's DEBUG events
    summary = r"epoch_job: epoch \d+ \(.*\) committed; \d+ record\(s\) read, 6 view\(s\) written"
    assert re.search(summary, output), output[-4000:]
    assert " - DEBUG - " not in output, [line for line in output.splitlines() if " - DEBUG - " in line][:5]
    # The reason to prefer dg: `dagster job execute` warns on every run that it is superseded.
    assert "superseded" not in output.lower(), [line for line in output.splitlines() if "upersed" in line]
    status = epochal_status(env)
    assert status["committed_epoch"] is not None and status["in_flight"] == [], status
    assert set(status["tables"].values()) == {status["committed_epoch"]}, status


def test_dg_dev_serves_the_code_location(tmp_path: Path) -> None:
    with dagster_dev([venv_script("dg"), "dev"], isolated_env(tmp_path), tmp_path / "dg_dev.log") as server:
        jobs = server.jobs()
    # The same location name as `dagster dev -w workspace.yaml`, so runs from either show together.
    assert "epoch_job" in jobs[LOCATION], jobs
