"""What `epochal status` prints: the controller's status (plus the CLI's own keys) as a short
readable summary, and the epochs' wall-clock times for ``--json``."""

from __future__ import annotations

from datetime import UTC, datetime


def splits_shown(backfill: dict) -> str:
    """``  splits 3/4 read`` for a backfill reading SOURCE inputs from their splits, else nothing."""
    if not backfill.get("splits_total"):
        return ""
    return f"  splits {backfill['splits_done']}/{backfill['splits_total']} read"


def _sink_start(start: dict | None) -> str:
    """How a sink started, when it did not start with the first epoch."""
    if not start:
        return ""
    if not start["snapshot"]:
        return f"; started after epoch {start['skipped_upto']} (snapshot = 'false')" if start["skipped_upto"] else ""
    if start["snapshot_epoch"] is None:
        return ""
    if not start["snapshot_delivered"]:
        return f"; snapshot @ {start['snapshot_epoch']} not delivered yet"
    return (
        f"; snapshot @ {start['snapshot_epoch']} ({start['snapshot_rows']} rows) "
        f"delivered {when(start['snapshot_delivered_at'])}"
    )


def when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _epoch_counts(counts: dict[str, int]) -> str:
    """``3 committed, 1 aborted``: the states that have epochs, in the order an epoch passes them."""
    order = ("COMMITTED", "COLLECTED", "INJECTED", "ABORTED")
    shown = [f"{counts[state]} {state.lower()}" for state in order if counts.get(state)]
    shown += [f"{n} {state.lower()}" for state, n in counts.items() if state not in order and n]
    return ", ".join(shown) or "none yet"


def _dead_letters(dead: dict[str, dict]) -> list[str]:
    """One line per source: its dead letters over committed epochs, and how to read them."""
    from epochal.storage.warehouse import dead_letter_table

    lines = ["dead letters    : records a source could not read, over committed epochs"]
    for source, d in dead.items():
        if not d["records"]:
            lines.append(f"  {source:<28} none")
            continue
        lines.append(
            f"  {source:<28} {d['records']} in {d['epochs']} epoch(s), last in {d['last_epoch']}: "
            f'epochal query "SELECT * FROM {dead_letter_table(source)}"'
        )
    return lines


def with_epoch_times(status: dict) -> dict:
    """``status`` with each epoch's wall-clock time beside it for --json (ISO 8601, UTC):
    ``committed_epoch_time``, ``delivered_epoch_time`` per sink, ``epoch_time`` per epoch in flight."""
    from epochal.epoch import epoch_datetime

    def iso(epoch: int | None) -> str | None:
        return None if epoch is None else epoch_datetime(epoch).isoformat(timespec="milliseconds")

    status["committed_epoch_time"] = iso(status["committed_epoch"])
    for lag in status["sinks"].values():
        lag["delivered_epoch_time"] = iso(lag["delivered_epoch"])
    for e in status["in_flight"]:
        e["epoch_time"] = iso(e["epoch"])
    return status


def status_lines(status: dict) -> list[str]:
    """What `epochal status` prints: a short readable summary of ``status`` (controller.status(),
    plus the CLI's own keys)."""
    from epochal.epoch import shown_epoch

    out: list[str] = []

    out.append(f"committed epoch : {shown_epoch(status['committed_epoch'])}")
    out.append(
        f"injection       : {'PAUSED' if status['paused'] else 'running'}"
        + ("  (pause on next start)" if status["pause_on_next_start"] else "")
    )
    if status["recovery_requested"]:
        out.append(f"recovery pending: {status['recovery_requested']}")
    out.append(f"in flight       : {len(status['in_flight'])}")
    for e in status["in_flight"]:
        out.append(
            f"  {shown_epoch(e['epoch'])} {e['kind']:<10} {e['state']:<9} collected: {', '.join(e['collected']) or '-'}"
            + (f"  FAILED: {e['failure']}" if e["failure"] else "")
        )
    out.append("tables          : committed epoch, newest snapshot")
    for table, epoch in status["tables"].items():
        snap = status["snapshots"].get(table)
        shown = "no snapshot"
        if table in status["sources_storing_nothing"]:
            shown = "stores nothing (no view reads it as state): read from its connector"
        elif snap is not None:
            shown = f"snapshot @ {snap['epoch']} ({snap['rows']} rows, {snap['files']} files)"
        out.append(f"  {table:<28} {epoch}  {shown}")
    from epochal.runtime.cdc_status import cdc_lines

    out += cdc_lines(status.get("cdc", {}))
    if status["sinks"]:
        out.append("sinks           : delivered epoch, lag")
        for sink, lag in status["sinks"].items():
            behind = "up to date"
            if lag["lag_epochs"]:
                behind = f"{lag['lag_epochs']} epoch(s), {lag['lag_seconds']:.0f}s behind"
            error = f"; last failure: {lag['last_error']}" if lag["last_error"] and lag["lag_epochs"] else ""
            delivered = shown_epoch(lag["delivered_epoch"])
            out.append(f"  {sink:<28} {delivered}  {behind}{_sink_start(lag.get('start'))}{error}")
            if lag.get("held_by_check"):
                held = lag["held_by_check"]
                out.append(f"  {'':<28} held by check {held['check']} (failed at epoch {held['epoch']})")
    if status["backfills"]:
        out.append("backfills       : phase, vnodes, rows, epochs behind (epochal backfill for more)")
        for view, b in status["backfills"].items():
            out.append(
                f"  {view:<28} {b['phase']:<9} {b['vnodes_done']}/{b['vnodes_total']}  {b['rows']} rows  "
                f"{b['epochs_behind'] if b['epochs_behind'] is not None else '-'} behind{splits_shown(b)}"
            )
            rebuild = b.get("rebuild")
            if rebuild:
                how = {"maintained": ", maintained", "frozen": ", frozen"}.get(rebuild.get("old_rows", ""), "")
                out.append(
                    f"  {'':<28} rebuilding: serving the {rebuild['serving']}{how} "
                    f"(changed after epoch {rebuild['frozen_epoch']})"
                )
                if rebuild.get("held"):
                    out.append(f"  {'':<28} switch held: {rebuild['held']}")
            if b.get("error"):
                out.append(f"  {'':<28} last failure: {b['error']}")
    last = status["last_recovery"]
    if last:
        outcome = f"FAILED: {last['error']}" if last["error"] else f"aborted {last['aborted_epochs'] or 'nothing'}"
        out.append(f"last recovery   : #{last['id']} {when(last['started_at'])} ({last['reason']}): {outcome}")
    else:
        out.append("last recovery   : none")
    if status.get("dead_letters"):
        out.extend(_dead_letters(status["dead_letters"]))
    out.append(f"epochs          : {_epoch_counts(status['epoch_counts'])}")
    out.append(f"meta store      : {status['meta_store']}")
    return out
