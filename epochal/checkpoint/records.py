"""The checkpoint controller's vocabulary: epoch states and their one transition rule, the records
the meta store holds, and the errors a step can meet. Plain data; no meta-store access here."""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from epochal.connectors.base import SplitRange
from epochal.epoch import BarrierKind
from epochal.errors import EpochalError

# What a table's state is made of: records of the storage layer's, kept by the catalog here.
from epochal.storage.parts import PublishResult as PublishResult
from epochal.storage.parts import Snapshot as Snapshot
from epochal.storage.parts import StateCompacted as StateCompacted
from epochal.storage.parts import StateParts as StateParts


class EpochState(enum.Enum):
    INJECTED = "INJECTED"
    COLLECTED = "COLLECTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    @property
    def in_flight(self) -> bool:
        return self in (EpochState.INJECTED, EpochState.COLLECTED)


# The only legal moves (``epoch_log.transition`` checks every state change against this table):
#  INJECTED  -> COLLECTED : every table of the pipeline has collected the epoch.
#  COLLECTED -> COMMITTED : every earlier epoch is committed and a checkpoint at or after this epoch
#                           is collected (barriers commit together with the next checkpoint).
#  INJECTED/COLLECTED -> ABORTED : recovery; everything written for the epoch is discarded.
#  COMMITTED and ABORTED are final: committed data is never rewritten, aborted epochs never revive.
TRANSITIONS: dict[EpochState, frozenset[EpochState]] = {
    EpochState.INJECTED: frozenset({EpochState.COLLECTED, EpochState.ABORTED}),
    EpochState.COLLECTED: frozenset({EpochState.COMMITTED, EpochState.ABORTED}),
    EpochState.COMMITTED: frozenset(),
    EpochState.ABORTED: frozenset(),
}


class InvariantViolation(EpochalError):
    """The meta store is not in a state the controller's rules allow: a bug, or the store was edited.
    Raised, never asserted, so ``python -O`` cannot turn it into silent damage."""


class InjectionBlocked(EpochalError):
    """No epoch can be injected now (paused, or the in-flight limit is reached)."""


class EpochAborted(EpochalError):
    """The epoch was aborted by a recovery; its work must not be collected (the fence a writer whose
    epoch was recovered under it meets on its next collect, publish or lease renewal)."""


class OrderWaitAbandoned(EpochAborted):
    """A step stopped waiting for an earlier epoch because that epoch failed or its run died: the
    recovery it calls for will abort this epoch too. Not a failure of this step (no recovery is
    asked for on its account), so it is an EpochAborted."""


class UnknownEpoch(EpochalError):
    pass


class EpochOrderError(EpochalError):
    """A step needs an earlier epoch that has not been processed yet."""


class CommitAlignmentError(EpochalError):
    """Tables disagree on their committed epoch: reported, never guessed around."""


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    prev: int | None
    kind: BarrierKind
    state: EpochState
    injected_at: float
    committed_at: float | None = None
    failure: str | None = None

    @property
    def is_checkpoint(self) -> bool:
        # The initial barrier after a recovery is committed like a checkpoint (RisingWave too).
        return self.kind is not BarrierKind.BARRIER


@dataclass(frozen=True)
class Collected:
    asset: str
    location: str | None
    rows_in: int | None = None
    rows_out: int | None = None
    dead_letters: int | None = None
    dead_letter_location: str | None = None
    seconds: float | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class CollectResult:
    #: False when the epoch was already committed: committed data is immutable, so the caller's
    #: freshly written copy was not recorded and should be deleted.
    recorded: bool
    committed: list[int] = field(default_factory=list)
    #: not recorded because the table left the pipeline while the caller wrote it: its directory,
    #: deleted when it left, goes again with the caller's files
    retired: bool = False


@dataclass(frozen=True)
class StepStart:
    record: EpochRecord
    offsets: list[SplitRange]
    collected: dict[str, Collected]
    #: whether the step's table (``begin_step(table=...)``) has a snapshot or a change file from an
    #: earlier epoch that was not aborted; None when no table was named
    written_before: bool | None = None


@dataclass(frozen=True)
class CommitStep:
    """One attempt of a run's commit step on its epoch, read in the transaction that tried it."""

    #: the epochs this attempt committed (any run's, oldest first)
    committed: list[int]
    record: EpochRecord
    #: tables that have not collected the epoch yet
    missing: list[str]
    #: the run is done with the epoch (it is committed, or a barrier waiting for its checkpoint),
    #: and its claim was released in the same transaction
    released: bool
    committed_epoch: int | None
    in_flight: list[EpochRecord]


@dataclass(frozen=True)
class RecoveryReport:
    reason: str
    committed_epoch: int | None
    aborted: list[int]
    discarded_locations: list[str]
    attempts: int
    seconds: float
    paused: bool


@dataclass(frozen=True)
class Machine:
    """Where a pid means something: the kernel's boot (``/proc/sys/kernel/random/boot_id``) and the
    PID namespace (``/proc/self/ns/pid``). Two containers with one hostname share neither across
    machines, and on one kernel share the boot but not the namespace."""

    hostname: str
    boot_id: str
    pid_ns: str


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def this_machine() -> Machine:
    try:
        pid_ns = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        pid_ns = ""
    return Machine(socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pid_ns)


def process_start(pid: int) -> str | None:
    """When ``pid`` started (field 22 of ``/proc/<pid>/stat``, clock ticks after boot), or None if
    unknown: with the pid, it names one process, not whoever reuses the number later."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split() if stat else []
    return fields[19] if len(fields) > 19 else None  # fields[0] is field 3 (the state)


def judged_dead(
    host: str | None,
    pid: int | str | None,
    here: Machine,
    alive: Callable[[int], bool],
    started: Callable[[int], str | None],
) -> bool:
    """Whether the owner ``host`` (as ``Owner.token()`` wrote it) with ``pid`` is known to be gone.

    ``hostname/boot_id/pid_ns/start``: judged by its pid only when it ran on this boot in this PID
    namespace; then dead when the pid is not alive or now names a process that started at another
    time. An owner of another boot or namespace (another container, even with our hostname) is
    never judged by pid: its lease's timeout decides. A plain ``hostname`` (written before boot ids):
    judged as then, dead when on our hostname and the pid is not alive."""
    if host is None or pid is None or not str(pid).isdigit():
        return False
    number = int(pid)
    parts = host.split("/")
    if len(parts) != 4:
        return host == here.hostname and not alive(number)
    _hostname, boot_id, pid_ns, start = parts
    if not boot_id or boot_id != here.boot_id or pid_ns != here.pid_ns:
        return False
    if not alive(number):
        return True
    now = started(number)
    return now is not None and now != start


class Owner:
    """Who is working on an epoch, so a crashed run can be told from a slow one."""

    #: this machine's name; an owner also names its boot, PID namespace and start (token())
    host = socket.gethostname()
    _token: tuple[int, str] | None = None

    @classmethod
    def token(cls) -> str:
        """This process as an owner: ``hostname/boot_id/pid_ns/start`` (or the hostname alone where
        /proc cannot tell them). Per pid: a forked child is another owner."""
        pid = os.getpid()
        if cls._token is None or cls._token[0] != pid:
            here, start = this_machine(), process_start(pid)
            token = f"{here.hostname}/{here.boot_id}/{here.pid_ns}/{start}" if here.boot_id and start else here.hostname
            cls._token = (pid, token)
        return cls._token[1]

    @classmethod
    def tag(cls, nonce: str) -> str:
        """A claim's owner string for this process: ``token:pid:nonce`` (sink claims, backfill runners)."""
        return f"{cls.token()}:{os.getpid()}:{nonce}"

    @staticmethod
    def hostname(host: str | None) -> str:
        """The hostname part of an owner ``host``, to show."""
        return (host or "").split("/", 1)[0]

    @classmethod
    def dead(cls, host: str | None, pid: int | str | None) -> bool:
        """Whether the owner ``host`` with ``pid`` is known to be gone (:func:`judged_dead` on this machine)."""
        return judged_dead(host, pid, _HERE, cls.pid_alive, process_start)

    @staticmethod
    def pid_alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie (killed, not yet reaped by its parent) is dead for our purposes.
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return True


_HERE = this_machine()
