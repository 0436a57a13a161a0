"""The sink ledger: one row per sink and epoch, as in the seed's sink coordinator. PENDING is
persisted before the target is written, COMMITTED once the target holds the epoch; recovery drops
PENDING rows of epochs after the committed one."""

from __future__ import annotations

import enum
import time

from epochal.checkpoint.records import InvariantViolation
from epochal.meta.backend import Backend, Cursor


class SinkEpochState(enum.Enum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class SinkLedger:
    def __init__(self, backend: Backend):
        self.backend = backend

    def sink_state(self, sink: str) -> dict[int, str]:
        rows = self.backend.transaction(
            lambda cur: cur.execute("SELECT epoch, state FROM sink_epochs WHERE sink = ?", [sink]).fetchall()
        )
        return dict(rows)

    def mark_sink(self, sink: str, epoch: int, state: str | SinkEpochState, rows: int | None = None) -> None:
        try:
            value = SinkEpochState(state).value
        except ValueError:
            raise InvariantViolation(
                f"sink state {state!r} is not one of {[s.value for s in SinkEpochState]}"
            ) from None
        self.backend.transaction(
            lambda cur: (
                cur.execute("DELETE FROM sink_epochs WHERE sink = ? AND epoch = ?", [sink, epoch]),
                cur.execute("INSERT INTO sink_epochs VALUES (?, ?, ?, ?, ?)", [sink, epoch, value, rows, time.time()]),
            )
        )

    @staticmethod
    def drop_pending_after(cur: Cursor, committed: int | None) -> None:
        """Recovery: PENDING deliveries of epochs that are no longer committed never happened."""
        cur.execute("DELETE FROM sink_epochs WHERE state = 'PENDING' AND epoch > ?", [committed or 0])

    @staticmethod
    def delivered(cur: Cursor) -> dict[str, int]:
        return dict(
            cur.execute("SELECT sink, max(epoch) FROM sink_epochs WHERE state = 'COMMITTED' GROUP BY sink").fetchall()
        )
