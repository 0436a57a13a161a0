"""The user's controls over a backfill (`epochal backfill VIEW --rate-limit N | --cancel |
--restart | --rebuild`), as a mixin of :class:`epochal.checkpoint.backfills.log.BackfillLog`:
each one transaction on the rows of :mod:`epochal.checkpoint.backfills.rows`.
"""

from __future__ import annotations

import time

from epochal.checkpoint.backfills.rows import all_backfills, drop_state, forget, read, retire, transition, view_files
from epochal.checkpoint.backfills.state import Backfill, BackfillPhase
from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError
from epochal.meta.backend import Backend, Cursor


class BackfillControl:
    backend: Backend

    def set_rate_limit(self, view: str, rows_per_second: float | None) -> Backfill:
        if rows_per_second is not None and rows_per_second < 0:
            raise EpochalError(f"backfill rate limit {rows_per_second} is negative: give rows per second, 0 pauses")

        def update(cur: Cursor) -> Backfill:
            b = self._require(cur, view)
            cur.execute(
                "UPDATE backfills SET rate_limit = ?, updated_at = ? WHERE view_name = ?",
                [rows_per_second, time.time(), view],
            )
            return read(cur, view) or b

        return self.backend.transaction(update)

    def rate_limit(self, view: str) -> float | None:
        return self.backend.transaction(
            lambda cur: (
                cur.execute("SELECT rate_limit FROM backfills WHERE view_name = ?", [view]).fetchone() or [None]
            )[0]
        )

    def cancel(self, view: str) -> tuple[Backfill, list[str]]:
        """Stop the backfill and forget its partial state; returns the locations to delete. The view
        stays out of the flow until it is removed from the pipeline or restarted."""

        def stop(cur: Cursor) -> tuple[Backfill, list[str]]:
            b = self._require(cur, view)
            if not b.phase.active:
                raise EpochalError(f"the backfill of {view} is {b.phase.shown}: there is nothing to cancel")
            garbage = view_files(cur, view)
            drop_state(cur, view)
            cur.execute("DELETE FROM backfill_chunks WHERE view_name = ?", [view])
            transition(cur, view, b.phase, BackfillPhase.CANCELLED, owner=None)
            return b, garbage

        return self.backend.transaction(stop)

    def restart(self, view: str) -> list[str]:
        """Forget a cancelled (or stuck) backfill: the next injection starts it again from a new snapshot."""

        def drop(cur: Cursor) -> list[str]:
            b = self._require(cur, view)
            if b.phase is BackfillPhase.JOINED:
                raise EpochalError(f"{view} has joined the pipeline: there is no backfill to restart")
            garbage = view_files(cur, view)
            drop_state(cur, view)
            return garbage + forget(cur, [view])

        return self.backend.transaction(drop)

    def rebuild(self, view: str, readers: list[str]) -> list[str]:
        """Drop a joined view's state so the next injection backfills it from its current statement.
        Refused while something reads it: a sink or view downstream holds rows of the old version."""
        if readers:
            raise EpochalError(
                f"cannot rebuild {view} in place: {', '.join(readers)} read it and hold rows of its old version. "
                f"Give the new statement a new name instead, and move {', '.join(readers)} to it"
            )

        def drop(cur: Cursor) -> list[str]:
            garbage = view_files(cur, view)
            drop_state(cur, view)
            garbage += forget(cur, [view])
            cur.execute("DELETE FROM table_definitions WHERE table_name = ?", [view])
            # A rebuild that kept the old rows serving is moot: its new statement is built in place.
            garbage += retire(cur, [rebuilds.shadow_name(view)])
            rebuilds.forget(cur, [view])
            return garbage

        return self.backend.transaction(drop)

    def record_error(self, view: str, error: str | None) -> None:
        self.backend.transaction(
            lambda cur: cur.execute(
                "UPDATE backfills SET error = ?, updated_at = ? WHERE view_name = ?", [error, time.time(), view]
            )
        )

    @staticmethod
    def _require(cur: Cursor, view: str) -> Backfill:
        b = read(cur, view)
        if b is None:
            known = [r.view for r in all_backfills(cur)]
            raise EpochalError(
                f"{view} has no backfill (backfills: {', '.join(known) or 'none'}): a view backfills when it is "
                "added to a pipeline that has committed epochs"
            )
        return b
