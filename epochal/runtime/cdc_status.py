"""Where each change-data-capture source stands upstream, for `epochal status` and the source's
asset metadata: the slot's confirmed LSN, the server's current LSN, the WAL the slot retains
(bytes) and the lag in seconds (how old the newest committed changes are while WAL is retained
past them). For mysql-cdc: the server's binlog position, the committed epoch's end and the binlog
bytes between. Only CDC connectors answer (``HoldsUpstreamLog.positions``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from epochal.connectors.base import HoldsUpstreamLog
from epochal.epoch import epoch_age_s
from epochal.errors import EpochalError
from epochal.pipeline.ddl import SHARED_CONNECTORS


def cdc_positions(connector: object, committed_epoch: Callable[[], int | None]) -> dict[str, object] | None:
    """``connector``'s upstream positions with the lag, None for a connector that holds no WAL.
    ``committed_epoch`` is asked only for a CDC connector (a meta-store read every other source's
    step would pay for nothing)."""
    if not isinstance(connector, HoldsUpstreamLog):
        return None
    try:
        found = dict(connector.positions())
    except EpochalError as error:  # the server is down: say so, status still prints
        return {"error": str(error)}
    behind = int(found.get("slot_retained_wal_bytes", found.get("binlog_bytes_behind", 0)) or 0) > 0
    committed = committed_epoch() if behind else None
    lag = epoch_age_s(committed, time.time()) if committed is not None else 0.0
    return {**found, "lag_seconds": lag}


def cdc_status(runtime: Any) -> dict[str, dict[str, object]]:
    """Per CDC source of ``runtime``'s pipeline (an EpochRuntime, not imported: it imports the
    source step, which imports this), its ``cdc_positions``."""
    out = {}
    for name, source in runtime.pipeline.sources.items():
        if source.connector not in SHARED_CONNECTORS:
            continue
        found = cdc_positions(runtime.connector(name), runtime.controller.committed_epoch)
        if found is not None:
            out[name] = found
    return out


def cdc_lines(cdc: dict[str, dict[str, object]]) -> list[str]:
    if not cdc:
        return []
    lines = ["cdc sources     : slot confirmed LSN, server LSN, WAL retained, lag"]
    for name, p in cdc.items():
        if "error" in p:
            lines.append(f"  {name:<28} {p['error']}")
            continue
        if "server_binlog_position" in p:  # mysql-cdc: the committed epoch's end in the binlog
            lines.append(
                f"  {name:<28} {p.get('committed_binlog_position', '-')}  {p['server_binlog_position']}  "
                f"{p.get('binlog_bytes_behind', 0)} binlog bytes behind  {p.get('lag_seconds', 0):.0f}s"
            )
            continue
        # the snapshot's chunks while they are applied over the table's first epochs
        snapshot = p.get("snapshot_chunks")
        backfill = f"  snapshot {snapshot} chunks" if snapshot and p.get("snapshot_done_pct", 100.0) < 100.0 else ""
        lines.append(
            f"  {name:<28} {p.get('slot_confirmed_lsn', '-')}  {p.get('server_lsn', '-')}  "
            f"{p.get('slot_retained_wal_bytes', 0)} bytes  {p.get('lag_seconds', 0):.0f}s{backfill}"
        )
    return lines
