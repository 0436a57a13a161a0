"""Who is alive: an owner (epoch claim, sink claim, backfill runner, snapshot being written) is judged
dead by its pid only where that pid means the same process: this boot, this PID namespace, and the
same start time. Two containers with one hostname never see each other's live runs as dead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.checkpoint.records import Machine, Owner, judged_dead, process_start, this_machine
from epochal.checkpoint.sinks.claims import SinkClaims
from tests.checkpoint.test_controller import controller, start

HERE = Machine("box", "boot-a", "4026531836")
ALIVE = {100: "5000", 200: "7000"}  # pid -> its start time, on HERE


def judge(host: str | None, pid: int | None) -> bool:
    return judged_dead(host, pid, HERE, lambda p: p in ALIVE, ALIVE.get)


@pytest.mark.parametrize(
    ("host", "pid", "dead", "why"),
    [
        ("box/boot-a/4026531836/5000", 100, False, "alive, the same process"),
        ("box/boot-a/4026531836/5000", 300, True, "this boot and namespace, the pid is gone"),
        ("box/boot-a/4026531836/4999", 100, True, "the pid now names a later process (reused)"),
        ("box/boot-b/4026531836/5000", 300, False, "another boot (a container on another machine): the lease decides"),
        ("box/boot-a/4026532176/5000", 300, False, "another PID namespace on this kernel: the lease decides"),
        ("box/boot-a/4026532176/1", 100, False, "another namespace, even if its pid is alive here"),
        ("other/boot-a/4026531836/5000", 300, True, "the hostname does not matter, the boot and namespace do"),
        ("box", 300, True, "an owner written before boot ids: judged as before, by hostname and pid"),
        ("box", 100, False, "old format, alive"),
        ("other", 300, False, "old format, another hostname"),
        (None, 300, False, "no owner"),
        ("box/boot-a/4026531836/5000", None, False, "no pid"),
    ],
)
def test_an_owner_is_judged_by_its_pid_only_on_this_boot_and_namespace(
    host: str | None, pid: int | None, dead: bool, why: str
) -> None:
    assert judge(host, pid) is dead, why


def test_this_process_as_an_owner() -> None:
    here = this_machine()
    assert Owner.token() == f"{here.hostname}/{here.boot_id}/{here.pid_ns}/{process_start(os.getpid())}"
    assert not Owner.dead(Owner.token(), os.getpid())
    assert Owner.hostname(Owner.token()) == here.hostname
    assert Owner.tag("n").endswith(f":{os.getpid()}:n")


_HOLD = """
import os, sys, time
from epochal.checkpoint.records import Owner
from epochal.checkpoint.sinks.claims import SinkClaims
from epochal.meta.backend import open_backend

owner = Owner.tag("child")
assert SinkClaims(open_backend(sys.argv[1]), timeout_s=float(sys.argv[2])).take("s", owner)
print(os.getpid(), owner, flush=True)
time.sleep(120)
"""


def _hold_claim(
    meta_url: str, timeout_s: float, pid_namespace_at: int | None = None
) -> tuple[subprocess.Popen, str]:
    """A process that takes sink s's delivery claim and lives on; with ``pid_namespace_at``, in a PID
    namespace of its own (same hostname, same kernel: a second container), where its pid is that one."""
    python = [sys.executable, "-c", _HOLD, meta_url, str(timeout_s)]
    if pid_namespace_at is None:
        command = python
    else:
        # sh forks python after setting the namespace's last pid: python gets pid_namespace_at there
        script = f'echo {pid_namespace_at - 1} > /proc/sys/kernel/ns_last_pid && "$@"; exit $?'
        namespace = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
        command = [*namespace, "sh", "-c", script, "sh", *python]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert child.stdout is not None
    line = child.stdout.readline().split()
    assert len(line) == 2, f"the claim holder did not start: {line}"
    pid, owner = int(line[0]), line[1]
    if pid_namespace_at is not None:
        assert pid == pid_namespace_at, "its pid in its own namespace"
    return child, owner


def _stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()


def test_a_claim_from_another_pid_namespace_is_not_taken_while_its_lease_lasts(
    tmp_path: Path, meta_url: str
) -> None:
    """A run in another container with our hostname, on our kernel, holds a sink's claim. Its pid
    names no process here: the claim is still respected (its lease decides), never taken over as
    dead. A run of our own namespace that is killed loses its claim at once."""
    if shutil.which("unshare") is None or subprocess.run(
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "true"], capture_output=True
    ).returncode:
        pytest.skip("unprivileged PID namespaces are not available here")
    start(controller(tmp_path, meta_url))  # the meta store's tables
    claims = SinkClaims(controller(tmp_path, meta_url).backend, timeout_s=3.0)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that names no process here

    other, owner = _hold_claim(meta_url, 3.0, pid_namespace_at=gone.pid)
    try:
        assert not Owner.pid_alive(gone.pid) and owner.startswith(f"{Owner.hostname(Owner.token())}/")
        assert not claims.take("s", Owner.tag("here")), "a live run of another namespace keeps its claim"
    finally:
        _stop(other)
    assert not claims.take("s", Owner.tag("here")), "even once it died: only its lease tells"
    time.sleep(3.2)
    assert claims.take("s", Owner.tag("here")), "taken over after the lease's timeout"

    claims.release("s", Owner.tag("here"))
    ours, _ = _hold_claim(meta_url, 600.0)  # a run of this namespace
    patient = SinkClaims(claims.backend, timeout_s=600.0)
    try:
        assert not patient.take("s", Owner.tag("here")), "alive: its claim holds"
    finally:
        _stop(ours)
    assert patient.take("s", Owner.tag("here")), "killed: taken over at once, not after 600 s"
