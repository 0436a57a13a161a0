"""The chaos run's pipeline and its oracle (chaos.py): the SQL files, the records the producers
append, and the checks of the committed state against what was produced.

The oracle shares no code with what it checks: plain Python resolves the produced records (per key
the last record in its split wins, a delete removes it), and DuckDB runs each view's SQL, written out
here rather than read from the pipeline (so a loader bug cannot change both sides alike), as a batch
query over those rows.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from harness import log

PIPELINE = {
    "01_sources.sql": """
CREATE SOURCE events (id BIGINT, account BIGINT, kind STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/events', format = 'json', 'max.events.per.epoch' = '{events_per_epoch}');

CREATE TABLE accounts (id BIGINT PRIMARY KEY, region STRING, tier BIGINT)
WITH (connector = 'log', path = 'data/accounts', format = 'json', 'max.events.per.epoch' = '{accounts_per_epoch}');
""",
    "02_views.sql": """
-- linear
CREATE MATERIALIZED VIEW big_events AS
SELECT id, account, kind, amount * 2 AS doubled FROM events WHERE amount >= 40;

-- a GROUP BY aggregate over the keyed table: updates move accounts between regions, deletes empty them
CREATE MATERIALIZED VIEW region_stats AS
SELECT region, count(*) AS accounts, sum(tier) AS tiers, min(tier) AS min_tier, max(tier) AS max_tier
FROM accounts GROUP BY region;

-- a join of the two sources
CREATE MATERIALIZED VIEW enriched AS
SELECT e.id, e.account, a.region, a.tier, e.amount FROM events e JOIN accounts a ON e.account = a.id;

-- top-N per group
CREATE MATERIALIZED VIEW top_events AS
SELECT account, id, amount FROM (
    SELECT account, id, amount, ROW_NUMBER() OVER (PARTITION BY account ORDER BY amount DESC, id) AS rn
    FROM events)
WHERE rn <= 3;
""",
    "03_sinks.sql": """
CREATE SINK big_events_out FROM big_events
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'big_events', type = 'append-only');

CREATE SINK region_stats_out FROM region_stats
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'region_stats', type = 'upsert',
      primary_key = 'region');
""",
}

# The pipeline's changes mid-chaos (a share of the chaos phase, the file, its new text or None to delete it).
ADDED_VIEW_SQL = """
CREATE MATERIALIZED VIEW account_totals AS
SELECT account, count(*) AS n, sum(amount) AS total, max(amount) AS biggest FROM events GROUP BY account;

CREATE SINK account_totals_out FROM account_totals
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'account_totals', type = 'upsert',
      primary_key = 'account');
"""
CHANGED_REGION_STATS = (
    "SELECT region, count(*) AS accounts, sum(tier) AS tiers, min(tier) AS min_tier, max(tier) AS max_tier\n"
    "FROM accounts WHERE tier >= 2 GROUP BY region;"
)
DROPPED_VIEW = "top_events"

# The oracle: each view's SQL, run by DuckDB as a batch query over the oracle's source rows. Written
# out here rather than read from the pipeline, so a loader bug cannot change both sides alike.
ORACLE_VIEWS = {
    "big_events": "SELECT id, account, kind, amount * 2 AS doubled FROM events WHERE amount >= 40",
    "region_stats": "SELECT region, count(*) AS accounts, sum(tier) AS tiers, min(tier) AS min_tier, "
    "max(tier) AS max_tier FROM accounts GROUP BY region",
    "enriched": "SELECT e.id, e.account, a.region, a.tier, e.amount FROM events e JOIN accounts a ON e.account = a.id",
    "top_events": "SELECT account, id, amount FROM (SELECT account, id, amount, ROW_NUMBER() OVER "
    "(PARTITION BY account ORDER BY amount DESC, id) AS rn FROM events) WHERE rn <= 3",
}
VIEW_COLUMNS = {
    "big_events": ("id", "account", "kind", "doubled"),
    "region_stats": ("region", "accounts", "tiers", "min_tier", "max_tier"),
    "enriched": ("id", "account", "region", "tier", "amount"),
    "top_events": ("account", "id", "amount"),
}
SOURCE_COLUMNS = {"events": ("id", "account", "kind", "amount"), "accounts": ("id", "region", "tier")}
SINKS = {
    "big_events_out": ("big_events", "big_events", None),
    "region_stats_out": ("region_stats", "region_stats", ("region",)),
}
# What the oracle checks once the pipeline changed (--changes): the added view and sink, the
# changed view's new SQL, and no dropped view.
CHANGED_ORACLE_VIEWS = {
    **{v: q for v, q in ORACLE_VIEWS.items() if v != DROPPED_VIEW},
    "region_stats": "SELECT region, count(*) AS accounts, sum(tier) AS tiers, min(tier) AS min_tier, "
    "max(tier) AS max_tier FROM accounts WHERE tier >= 2 GROUP BY region",
    "account_totals": "SELECT account, count(*) AS n, sum(amount) AS total, max(amount) AS biggest FROM events "
    "GROUP BY account",
}
VIEW_COLUMNS["account_totals"] = ("account", "n", "total", "biggest")
CHANGED_SINKS = {**SINKS, "account_totals_out": ("account_totals", "account_totals", ("account",))}
SPLITS = ("0", "1")
REGIONS = ("north", "south", "east", "west", "centre")
KINDS = ("buy", "sell", "refund")
ACCOUNT_KEYS = 60  # keyed records reuse few keys, so most are updates and deletes of live rows
EVENT_ACCOUNTS = 70  # events also name accounts that never exist (the join drops them)


# ------------------------------------------------------------------------------------------------
# what was produced (the oracle's input)


@dataclass
class Line:
    text: str
    #: the record as the oracle understands it; None for a malformed record (a dead letter)
    record: dict[str, Any] | None


@dataclass
class Produced:
    """Every line appended to one source, per split, in file order (offset = index)."""

    lines: dict[str, list[Line]] = field(default_factory=lambda: {s: [] for s in SPLITS})

    def count(self) -> int:
        return sum(len(v) for v in self.lines.values())

    def malformed(self) -> set[tuple[str, int]]:
        return {(s, i) for s, lines in self.lines.items() for i, line in enumerate(lines) if line.record is None}


def event_line(rng: random.Random, event_id: int) -> Line:
    if rng.random() < 0.01:
        bad = rng.choice(
            [
                f'{{"id": {event_id}, "account": "acct-{event_id}", "kind": "buy", "amount": 5}}',  # wrong type
                f'{{"id": {event_id}, "account": 3, "kind": "buy", "amount": ',  # malformed JSON
                "[1, 2, 3]",  # not an object
            ]
        )
        return Line(bad, None)
    record = {
        "id": event_id,
        "account": rng.randrange(EVENT_ACCOUNTS),
        "kind": rng.choice(KINDS),
        "amount": rng.randint(1, 100),
    }
    return Line(json.dumps(record), record)


def account_line(rng: random.Random, split: str) -> Line:
    # Every record of one key goes to one split (the README's rule): key % 2 is the split.
    key = rng.randrange(ACCOUNT_KEYS // 2) * 2 + int(split)
    roll = rng.random()
    if roll < 0.01:
        return Line(json.dumps({"id": key, "_op": "merge"}), None)  # unknown _op
    if roll < 0.02:
        return Line(json.dumps({"region": "north", "tier": 1}), None)  # no key
    if roll < 0.22:
        record = {"id": key, "_op": "delete"}
    else:
        record = {"id": key, "region": rng.choice(REGIONS), "tier": rng.randint(1, 5)}
        if rng.random() < 0.3:
            record["_op"] = rng.choice(["insert", "update", "upsert", "UPDATE"])
    return Line(json.dumps(record), record)


def resolve_accounts(produced: Produced) -> dict[int, tuple[Any, ...]]:
    """The keyed table's rows: per key, the last record wins (keys never span splits, so line
    order within the split is the order); a delete removes the row."""
    rows: dict[int, tuple[Any, ...]] = {}
    for split in SPLITS:
        for line in produced.lines[split]:
            rec = line.record
            if rec is None:
                continue
            if str(rec.get("_op", "upsert")).lower() == "delete":
                rows.pop(rec["id"], None)
            else:
                rows[rec["id"]] = (rec["id"], rec["region"], rec["tier"])
    return rows


def event_rows(produced: Produced) -> list[tuple[Any, ...]]:
    return [
        (r["id"], r["account"], r["kind"], r["amount"])
        for split in SPLITS
        for line in produced.lines[split]
        if (r := line.record) is not None
    ]


def _normal(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def multiset(rows: Iterable[Iterable[Any]]) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in rows)


def describe_difference(expected: Counter, actual: Counter, limit: int = 8) -> str:
    missing = expected - actual
    extra = actual - expected
    parts = [f"expected {sum(expected.values())} rows, found {sum(actual.values())}"]
    if missing:
        parts.append(f"missing {sum(missing.values())}: {list(missing.items())[:limit]}")
    if extra:
        parts.append(f"unexpected {sum(extra.values())}: {list(extra.items())[:limit]}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------
# the checks


def check(produced: dict[str, Produced], home: Path, changed: bool, runtime: Any) -> list[str]:
    """The three checks of the committed state against what was ``produced`` (``changed``: the
    pipeline was edited during the run); returns what differs (empty: all passed)."""
    import duckdb

    oracle_views = CHANGED_ORACLE_VIEWS if changed else ORACLE_VIEWS
    sinks = CHANGED_SINKS if changed else SINKS

    from epochal.query.cut import committed_connection

    problems: list[str] = []
    con, epoch = committed_connection(runtime)
    log(f"checking at committed epoch {epoch}")
    events = event_rows(produced["events"])
    accounts = resolve_accounts(produced["accounts"])

    # 1. sources: every produced record exactly once, keys resolved; malformed ones as dead letters
    expected_sources = {"events": multiset(events), "accounts": multiset(accounts.values())}
    for source, expected in expected_sources.items():
        cols = ", ".join(SOURCE_COLUMNS[source])
        actual = multiset(con.execute(f"SELECT {cols} FROM {source}").fetchall())
        ok = actual == expected
        print(
            f"  check 1 source {source:<13} {'ok' if ok else 'DIFFERS'}: {sum(actual.values())} rows "
            f"(oracle {sum(expected.values())})"
        )
        if not ok:
            problems.append(f"source {source}: {describe_difference(expected, actual)}")
        dead = Counter(
            (split, offset)
            for split, offset in con.execute(f'SELECT split, "offset" FROM {source}__dead_letters').fetchall()
        )
        wanted = Counter(produced[source].malformed())
        ok = dead == wanted
        print(
            f"  check 1 dead letters {source:<7} {'ok' if ok else 'DIFFERS'}: {sum(dead.values())} "
            f"(oracle {sum(wanted.values())})"
        )
        if not ok:
            problems.append(f"{source}__dead_letters: {describe_difference(wanted, dead)}")

    # 2. views against their SQL as a DuckDB batch over the oracle's rows
    oracle = duckdb.connect()
    oracle.execute("CREATE TABLE events (id BIGINT, account BIGINT, kind VARCHAR, amount BIGINT)")
    oracle.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", events)
    oracle.execute("CREATE TABLE accounts (id BIGINT, region VARCHAR, tier BIGINT)")
    if accounts:
        oracle.executemany("INSERT INTO accounts VALUES (?, ?, ?)", list(accounts.values()))
    view_rows: dict[str, Counter] = {}
    for view, sql in oracle_views.items():
        expected = multiset(oracle.execute(sql).fetchall())
        cols = ", ".join(VIEW_COLUMNS[view])
        actual = view_rows[view] = multiset(con.execute(f"SELECT {cols} FROM {view}").fetchall())
        ok = actual == expected
        print(
            f"  check 2 view {view:<17} {'ok' if ok else 'DIFFERS'}: {sum(actual.values())} rows "
            f"(oracle {sum(expected.values())})"
        )
        if not ok:
            problems.append(f"view {view}: {describe_difference(expected, actual)}")

    # 3. sinks hold exactly their view, and have delivered the committed epoch
    database = home / "out" / "sink.duckdb"
    sink_con = duckdb.connect(str(database), read_only=True)
    try:
        for sink, (view, table, key) in sinks.items():
            cols = ", ".join(VIEW_COLUMNS[view])
            actual = multiset(sink_con.execute(f"SELECT {cols} FROM {table}").fetchall())
            expected = view_rows[view]
            delivered = sink_con.execute("SELECT epoch FROM _epochal_sink_progress WHERE sink = ?", [sink]).fetchone()
            ok = actual == expected and delivered is not None and delivered[0] == epoch
            keyed = f", keyed by ({', '.join(key)})" if key else ""
            print(
                f"  check 3 sink {sink:<17} {'ok' if ok else 'DIFFERS'}: {sum(actual.values())} rows{keyed}, "
                f"delivered epoch {delivered[0] if delivered else None}"
            )
            if actual != expected:
                problems.append(f"sink {sink}: {describe_difference(expected, actual)}")
            if delivered is None or delivered[0] != epoch:
                problems.append(f"sink {sink} delivered epoch {delivered}, the committed epoch is {epoch}")
    finally:
        sink_con.close()

    if changed:  # the dropped view: out of the store and off the disk
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        directory = Path(runtime.warehouse.table_root(DROPPED_VIEW))
        gone = DROPPED_VIEW not in tables and not directory.exists()
        print(f"  check 2 dropped view {DROPPED_VIEW:<9} {'gone' if gone else 'STILL THERE'}")
        if not gone:
            problems.append(
                f"dropped view {DROPPED_VIEW}: queryable {DROPPED_VIEW in tables}, files {directory.exists()}"
            )
    return problems
