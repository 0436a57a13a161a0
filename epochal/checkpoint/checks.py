"""The durable record of data checks (docs/checks.md): one ``check_results`` row per check and
committed epoch, and the hold each sink's last delivery found (``check_holds``).

A sink decides what it may deliver from these rows only, never from what a process remembers, so
a run killed anywhere holds and releases exactly as one that was not. A result is written once
(the first evaluation wins; evaluating again changes nothing) and changes only when released.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epochal.meta.backend import Backend, Cursor

#: offending rows kept per result, for status and the Dagster UI
SAMPLE_ROWS = 5


@dataclass(frozen=True)
class CheckResult:
    check: str
    epoch: int
    table: str
    severity: str
    passed: bool
    failed_rows: int
    #: up to SAMPLE_ROWS offending rows, each a dict of column -> value (as JSON text allows)
    sample: list[dict[str, Any]]
    evaluated_at: float
    released_by: str | None = None
    released_at: float | None = None

    @property
    def holds(self) -> bool:
        """Whether this result holds its epoch back from the sinks downstream."""
        return self.severity == "error" and not self.passed and self.released_at is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "epoch": self.epoch,
            "table": self.table,
            "severity": self.severity,
            "passed": self.passed,
            "failed_rows": self.failed_rows,
            "sample": self.sample,
            "released_by": self.released_by,
            "released_at": self.released_at,
        }


_COLUMNS = (
    "check_name, epoch, table_name, severity, passed, failed_rows, sample, evaluated_at, released_by, released_at"
)


def _result(row: Sequence[Any]) -> CheckResult:
    return CheckResult(
        check=row[0],
        epoch=int(row[1]),
        table=row[2],
        severity=row[3],
        passed=bool(row[4]),
        failed_rows=int(row[5]),
        sample=json.loads(row[6]) if row[6] else [],
        evaluated_at=float(row[7]),
        released_by=row[8],
        released_at=row[9],
    )


class CheckRecords:
    def __init__(self, backend: Backend):
        self.backend = backend

    def record(self, result: CheckResult) -> CheckResult:
        """Keep ``result`` unless the check was evaluated at that epoch already; the kept one."""

        def write(cur: Cursor) -> CheckResult:
            kept = _get(cur, result.check, result.epoch)
            if kept is not None:
                return kept
            # (ON CONFLICT: a run evaluating the same epoch beside this one wrote first; its row is kept)
            cur.execute(
                f"INSERT INTO check_results ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (check_name, epoch) DO NOTHING",
                [
                    result.check,
                    result.epoch,
                    result.table,
                    result.severity,
                    result.passed,
                    result.failed_rows,
                    json.dumps(result.sample, default=str),
                    result.evaluated_at,
                    None,
                    None,
                ],
            )
            kept = _get(cur, result.check, result.epoch)
            return result if kept is None else kept

        return self.backend.transaction(write)

    def get(self, check: str, epoch: int) -> CheckResult | None:
        return self.backend.transaction(lambda cur: _get(cur, check, epoch))

    def results(self, check: str | None = None, after: int | None = None) -> list[CheckResult]:
        """Results, oldest epoch first: of one check or all, after an epoch or all."""
        where, params = ["1 = 1"], []
        if check is not None:
            where.append("check_name = ?")
            params.append(check)
        if after is not None:
            where.append("epoch > ?")
            params.append(after)
        sql = f"SELECT {_COLUMNS} FROM check_results WHERE {' AND '.join(where)} ORDER BY epoch, check_name"
        return self.backend.transaction(lambda cur: [_result(r) for r in cur.execute(sql, params).fetchall()])

    def release(self, check: str, by: str) -> list[int]:
        """Treat every failing epoch of ``check`` not released yet as passed; the epochs released."""

        def write(cur: Cursor) -> list[int]:
            epochs = [
                int(r[0])
                for r in cur.execute(
                    "SELECT epoch FROM check_results WHERE check_name = ? AND NOT passed AND released_at IS NULL "
                    "ORDER BY epoch",
                    [check],
                ).fetchall()
            ]
            cur.execute(
                "UPDATE check_results SET released_by = ?, released_at = ? "
                "WHERE check_name = ? AND NOT passed AND released_at IS NULL",
                [by, time.time(), check],
            )
            return epochs

        return self.backend.transaction(write)

    def note_hold(self, sink: str, hold: CheckResult | None) -> None:
        """What holds ``sink`` now (None: nothing), for `epochal status`."""

        def write(cur: Cursor) -> None:
            now = cur.execute("SELECT check_name, epoch FROM check_holds WHERE sink = ?", [sink]).fetchone()
            wanted = None if hold is None else (hold.check, hold.epoch)
            if (None if now is None else (now[0], int(now[1]))) == wanted:
                return  # every sink step asks: most find what the last one wrote, and write nothing
            cur.execute("DELETE FROM check_holds WHERE sink = ?", [sink])
            if hold is not None:
                cur.execute(
                    "INSERT INTO check_holds (sink, check_name, epoch, held_at) VALUES (?, ?, ?, ?)",
                    [sink, hold.check, hold.epoch, time.time()],
                )

        self.backend.transaction(write)


def _get(cur: Cursor, check: str, epoch: int) -> CheckResult | None:
    row = cur.execute(
        f"SELECT {_COLUMNS} FROM check_results WHERE check_name = ? AND epoch = ?", [check, epoch]
    ).fetchone()
    return None if row is None else _result(row)


def holds(cur: Cursor) -> dict[str, dict[str, Any]]:
    """sink -> {check, epoch}: the hold each sink's last delivery step found."""
    return {
        sink: {"check": check, "epoch": int(epoch)}
        for sink, check, epoch in cur.execute("SELECT sink, check_name, epoch FROM check_holds").fetchall()
    }
