"""What `epochal status` shows: one consistent read of the controller's state."""

from __future__ import annotations

import json
from typing import Any

from epochal.checkpoint import checks as check_records
from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import log as backfill_log
from epochal.checkpoint.records import EpochState
from epochal.checkpoint.sinks import status as sink_status
from epochal.meta.backend import Backend, Cursor
from epochal.redaction import redact_url


def read_status(backend: Backend, tables: list[str], sinks: list[str]) -> dict[str, Any]:
    def read(cur: Cursor) -> dict[str, Any]:
        committed = q.committed_epoch(cur)
        table_epochs = dict(cur.execute("SELECT table_name, committed_epoch FROM table_epochs").fetchall())
        in_flight = []
        for rec in q.in_flight(cur):
            done = sorted(
                r[0] for r in cur.execute("SELECT asset FROM collected WHERE epoch = ?", [rec.epoch]).fetchall()
            )
            in_flight.append(
                {
                    "epoch": rec.epoch,
                    "prev": rec.prev,
                    "kind": rec.kind.value,
                    "state": rec.state.value,
                    "collected": done,
                    "injected_at": rec.injected_at,
                    "failure": rec.failure,
                }
            )
        last = cur.execute(
            "SELECT id, reason, started_at, finished_at, committed_epoch, aborted_epochs, attempts, error "
            "FROM recoveries ORDER BY id DESC LIMIT 1"
        ).fetchone()
        counts = dict(cur.execute("SELECT state, count(*) FROM epochs GROUP BY state").fetchall())
        snapshots: dict[str, dict[str, Any]] = {}
        for table, epoch, rows_out, files_out, finished in cur.execute(
            "SELECT table_name, epoch, rows_out, files_out, finished_at FROM snapshots WHERE state = 'READY' "
            "ORDER BY epoch"
        ).fetchall():
            snapshots[table] = {"epoch": epoch, "rows": rows_out, "files": files_out, "at": finished}
        retention = dict(cur.execute("SELECT table_name, changes_dropped_upto FROM table_retention").fetchall())
        # Records a source could not parse, per source, over its committed epochs (epochal query reads them).
        dead_letters = {
            asset: {"records": int(records), "epochs": epochs, "last_epoch": last}
            for asset, records, epochs, last in cur.execute(
                "SELECT c.asset, sum(c.dead_letters), count(*), max(c.epoch) FROM collected c "
                "JOIN epochs e ON e.epoch = c.epoch WHERE e.state = 'COMMITTED' AND c.dead_letters > 0 "
                "GROUP BY c.asset"
            ).fetchall()
        }
        holds = check_records.holds(cur)
        return {
            "committed_epoch": committed,
            "tables": {t: table_epochs.get(t) for t in tables},
            "in_flight": in_flight,
            "paused": bool(q.get_flag(cur, "paused")),
            "pause_on_next_start": bool(q.get_flag(cur, "pause_on_next_start")),
            "recovery_requested": q.get_flag(cur, "recovery_requested"),
            # (held_by_check: the failing check that keeps the sink at its delivered epoch, docs/checks.md)
            "sinks": {s: {**sink_status.lag(cur, s), "held_by_check": holds.get(s)} for s in sinks},
            "backfills": backfill_log.status(cur),
            # newest snapshot per table, and the epoch up to which its change files were deleted
            "snapshots": {
                t: {**snapshots[t], "changes_dropped_upto": retention.get(t)} if t in snapshots else None
                for t in tables
            },
            "epoch_counts": {s.value: counts.get(s.value, 0) for s in EpochState},
            "dead_letters": dead_letters,
            "last_recovery": None
            if last is None
            else {
                "id": last[0],
                "reason": last[1],
                "started_at": last[2],
                "finished_at": last[3],
                "committed_epoch": last[4],
                "aborted_epochs": json.loads(last[5]) if last[5] else [],
                "attempts": last[6],
                "error": last[7],
            },
            "meta_store": redact_url(backend.url),
        }

    return backend.transaction(read)
