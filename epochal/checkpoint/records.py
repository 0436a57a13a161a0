"""The checkpoint controller's vocabulary: epoch states and their one transition rule, the records
the meta store holds, and the errors a step can meet. Plain data; no meta-store access here."""

from __future__ import annotations

import enum
import os
import socket
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


class Owner:
    """Who is working on an epoch, so a crashed run can be told from a slow one."""

    host = socket.gethostname()

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
