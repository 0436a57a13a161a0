"""Time travel and the change between two epochs, as a user reads them: every table as of every
epoch in the window equals a batch over the records the sources held at that epoch (re-read from
the log's file, computed by DuckDB, not through Epochal); `changes` applied to the earlier cut gives
the later one; an epoch outside the window is refused, naming the oldest retained; the SQL form,
timestamps and both commands. Real Spark (compaction writes snapshots), DuckDB."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from epochal.cli.main import main
from epochal.connectors.log import split_path
from epochal.epoch import epoch_datetime, epoch_physical_ms
from epochal.errors import EpochalError
from epochal.query import api
from epochal.query.changes import table_changes
from epochal.query.cut import run_query
from epochal.query.time_travel import retained
from tests.consistency import multiset
from tests.epochal_harness import make_harness
from tests.storage.test_compaction import FILES, TABLES, VIEWS, records, run_epoch

WINDOW = {"EPOCHAL_TIME_TRAVEL_S": "3600"}


def oracle(h, lines: int) -> dict[str, Counter]:  # noqa: ANN001
    """Every table over the first ``lines`` records of the orders log: the keyed TABLE folded by
    hand (the last record of an id wins, ``_op = 'delete'`` removes it), the views by DuckDB."""
    text = split_path(h.home / "data" / "orders", "0").read_text().splitlines()[:lines]
    latest: dict[int, dict] = {}
    for record in map(json.loads, text):
        if record.get("_op") == "delete":
            latest.pop(record["id"], None)
        else:
            latest[record["id"]] = record
    con = duckdb.connect()
    con.execute("CREATE TABLE orders (id BIGINT, customer VARCHAR, amount DOUBLE)")
    rows = [(r["id"], r["customer"], r["amount"]) for r in latest.values()]
    con.executemany("INSERT INTO orders VALUES (?, ?, ?)", rows)
    out = {"orders": multiset(con.execute("SELECT * FROM orders").fetchall())}
    for view, sql in VIEWS.items():
        out[view] = multiset(con.execute(sql).fetchall())
    return out


def cut(runtime, table: str, as_of) -> Counter:  # noqa: ANN001
    _, rows, _ = run_query(runtime, f"SELECT * FROM {table}", as_of)
    return multiset(rows)


def apply(before: Counter, change) -> Counter:  # noqa: ANN001
    after = Counter(before)
    for op, *row in change.rows:
        after[tuple(multiset([row]))[0]] += 1 if op == "insert" else -1
    return +after


def test_every_epoch_in_the_window_reads_as_a_batch_over_its_records_and_changes_lead_from_cut_to_cut(
    spark, tmp_path: Path
) -> None:
    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark, WINDOW)
    rng = random.Random(61)
    epochs: list[int] = []
    produced: dict[int, int] = {}
    total = 0
    for i in range(4):
        batch = records(rng, 12, ids=15)  # few ids: updates and deletes of earlier rows
        h.produce(batch)
        total += len(batch)
        epochs.append(run_epoch(runtime))
        produced[epochs[-1]] = total
        if i >= 1:
            # A snapshot of every table at each later epoch: without the window, retention would
            # keep the newest two and the change files after the older: the first two epochs gone.
            report = runtime.compact(epochs[-1], every=1)
            assert report.metadata["failures"] == "none", report.metadata

    assert retained(runtime) == (epochs[0], epochs[-1])
    cuts = {e: {t: cut(runtime, t, e) for t in TABLES} for e in epochs}
    for e in epochs:
        assert cuts[e] == oracle(h, produced[e]), e
    assert any(cuts[a]["orders"] != cuts[b]["orders"] for a, b in zip(epochs, epochs[1:], strict=False))

    for a, b in [*zip(epochs, epochs[1:], strict=False), (epochs[0], epochs[-1])]:
        for table in TABLES:
            change = table_changes(runtime, table, a, b)
            assert change.columns[0] == "op" and (change.start, change.end) == (a, b)
            assert apply(cuts[a][table], change) == cuts[b][table], (table, a, b)
            # netted: no row is both deleted and inserted, nor one inserted and deleted in between
            inserted = {tuple(r[1:]) for r in change.rows if r[0] == "insert"}
            assert not inserted & {tuple(r[1:]) for r in change.rows if r[0] == "delete"}, (table, a, b)


def test_an_epoch_outside_the_window_is_refused_naming_the_oldest_and_no_more_is_kept(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark, {"EPOCHAL_TIME_TRAVEL_S": "2"})
    rng = random.Random(3)
    epochs: list[int] = []
    for i in range(4):
        if i == 2:
            time.sleep(2.2)  # the first two fall out of the 2 s window
        h.produce(records(rng, 10, ids=15))
        epochs.append(run_epoch(runtime))
        if i >= 2:  # two snapshots: retention drops what is before the window
            assert runtime.compact(epochs[-1], every=1).metadata["failures"] == "none"
    newest = epochs[-1]
    oldest = min(e for e in epochs if epoch_physical_ms(e) >= epoch_physical_ms(newest) - 2000)
    assert oldest in epochs[2:]
    assert retained(runtime) == (oldest, newest)
    with pytest.raises(EpochalError, match=f"older than the time-travel window: the oldest epoch retained is {oldest}"):
        run_query(runtime, "SELECT * FROM orders", epochs[1])
    with pytest.raises(EpochalError, match=f"the oldest epoch retained is {oldest}"):
        table_changes(runtime, "large", epochs[0], newest)
    # No more than the window: the change files before it went to retention.
    dropped = runtime.controller.catalog.backend.transaction(
        lambda cur: cur.execute("SELECT min(changes_dropped_upto) FROM table_retention").fetchone()[0]
    )
    assert dropped is not None and dropped >= epochs[1]
    assert cut(runtime, "orders", oldest) == cut(runtime, "orders", oldest)  # readable


def test_sql_timestamps_and_both_commands(spark, tmp_path: Path, monkeypatch, capsys) -> None:
    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark, WINDOW)
    rng = random.Random(5)
    epochs = []
    for _ in range(3):
        h.produce(records(rng, 10, ids=15))
        epochs.append(run_epoch(runtime))
    first, last = epochs[0], epochs[-1]
    expected = cut(runtime, "large", first)
    assert expected != cut(runtime, "large", last)

    # FOR SYSTEM_TIME AS OF, as RisingWave writes it: an epoch, a timestamp, an expression
    for clause in (str(first), f"'{epoch_datetime(first).isoformat()}'", f"TIMESTAMPTZ '{epoch_datetime(first)}'"):
        _, rows, _ = run_query(runtime, f"SELECT * FROM large FOR SYSTEM_TIME AS OF {clause} AS l")
        assert multiset(rows) == expected, clause
    # per table, as in RisingWave: the others stay at the query's cut (here the committed epoch)
    gone = f"SELECT * FROM large FOR SYSTEM_TIME AS OF {first} EXCEPT ALL SELECT * FROM large"
    _, rows, epoch = run_query(runtime, gone)
    assert rows and (epoch, multiset(rows)) == (last, expected - cut(runtime, "large", last))
    # a timestamp between two epochs is the last committed at or before it
    between = epoch_datetime(epochs[1]) - timedelta(microseconds=500)
    assert run_query(runtime, "SELECT 1", between.isoformat())[2] == first
    with pytest.raises(EpochalError, match="was never committed"):
        run_query(runtime, "SELECT 1", first + 1)
    with pytest.raises(EpochalError, match="older than the time-travel window"):
        run_query(runtime, f"SELECT * FROM large JOIN orders FOR SYSTEM_TIME AS OF {first - 1} USING (id)")

    for key, value in {**h.env, **WINDOW}.items():
        monkeypatch.setenv(key, value)
    assert main(["query", "--as-of", str(first), "--format", "json", "SELECT * FROM large"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert multiset([r.values() for r in out]) == expected
    assert main(["changes", "large", "--from", str(first), "--to", str(last), "--format", "json"]) == 0
    change = json.loads(capsys.readouterr().out)
    assert change and {r["op"] for r in change} <= {"insert", "delete"}
    assert change == table_changes(runtime, "large", first, last).records()
    assert main(["changes", "large", "--from", str(first)]) == 0  # a table, up to the committed epoch
    shown = capsys.readouterr()
    assert shown.out.split()[0] == "op" and f"of large from epoch {first} to {last}" in shown.err
    assert main(["query", "--as-of", str(first - 1), "SELECT 1"]) == 1
    assert f"the oldest epoch retained is {first}" in capsys.readouterr().err
    # the Python API, with the settings of the environment
    answer = api.query("SELECT * FROM large", as_of=epoch_datetime(first))
    assert (answer.epoch, multiset(answer.rows)) == (first, expected)
    assert api.changes("large", first).records() == change and api.retained_epochs() == (first, last)
