"""Compaction into vnode snapshots: readers see the same rows before and after, files stay bounded,
restricted reads open only the keys' vnodes, a crash mid-compaction is swept, and a lagging sink
keeps the change files it still has to deliver. Real Spark, DuckDB and PostgreSQL."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from epochal.checkpoint.controller import CheckpointController
from epochal.checkpoint.records import Collected, StateCompacted
from epochal.connectors.base import SplitRange
from epochal.settings import Settings
from tests.checkpoint.test_controller import mark_delivered
from tests.consistency import assert_sink_exactly_once, assert_view_matches_batch, assert_views_match_batch, multiset
from tests.epochal_harness import make_harness

FILES = {
    "pipeline.sql": """
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW large AS SELECT id, customer, amount FROM orders WHERE amount >= 10;

CREATE MATERIALIZED VIEW spend WITH (refresh = 'full') AS
SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;

CREATE SINK large_out FROM large
WITH (connector = 'duckdb', database = 'out/o.duckdb', table = 'large', type = 'upsert', primary_key = 'id');
""",
}
VIEWS = {
    "large": "SELECT id, customer, amount FROM orders WHERE amount >= 10",
    "spend": "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer",
}
TABLES = ["orders", "large", "spend"]


def records(rng: random.Random, n: int, ids: int = 40) -> list[str]:
    out = []
    for _ in range(n):
        i = rng.randrange(ids)
        if rng.random() < 0.2:
            out.append(json.dumps({"id": i, "_op": "delete"}))
        else:
            out.append(json.dumps({"id": i, "customer": f"c{i % 5}", "amount": float(rng.randrange(20))}))
    return out


def run_epoch(runtime, sinks: bool = True, compact: bool = False) -> int:  # noqa: ANN001
    """One epoch straight through the runtime (the steps epoch_job runs), without Dagster's overhead."""
    record, _ = runtime.start_epoch(None, None)
    e = record.epoch
    for source in runtime.pipeline.sources:
        runtime.run_source(e, source)
    for view in runtime.pipeline.view_order():
        runtime.run_view(e, view)
    runtime.commit(e)
    if sinks:
        for sink in runtime.pipeline.sinks:
            runtime.run_sink(e, sink)
    if compact:
        report = runtime.compact(e)
        assert report.metadata["failures"] == "none", report.metadata
    return e


def spark_rows(runtime, table: str, epoch: int) -> Counter:  # noqa: ANN001
    rows, _ = runtime.read_state(table, epoch, inclusive=True)
    return multiset(rows.collect())


def duckdb_rows(runtime, table: str) -> Counter:  # noqa: ANN001
    from epochal.query.cut import run_query

    _, rows, _ = run_query(runtime, f"SELECT * FROM {table}")
    return multiset(rows)


def test_compaction_never_changes_what_a_reader_sees(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark)
    rng = random.Random(7)
    seen: dict[tuple[str, int], Counter] = {}
    epochs: list[int] = []

    def run(n: int) -> None:
        for _ in range(n):
            h.produce(records(rng, 12))
            epochs.append(run_epoch(runtime))
            for table in TABLES:
                seen[(table, epochs[-1])] = spark_rows(runtime, table, epochs[-1])

    run(2)
    queried = {t: duckdb_rows(runtime, t) for t in TABLES}
    report = runtime.compact(epochs[-1], every=1)
    assert report.metadata["tables_compacted"] == ", ".join(f"{t}@{epochs[-1]}" for t in TABLES)
    assert report.metadata["rows_in_snapshots"] == sum(sum(seen[(t, epochs[-1])].values()) for t in TABLES)
    # The first snapshot keeps every change file: a reader of any older epoch may still need them.
    for e in epochs:
        for table in TABLES:
            assert spark_rows(runtime, table, e) == seen[(table, e)], (table, e)
    assert {t: duckdb_rows(runtime, t) for t in TABLES} == queried
    # The state at the snapshot's epoch is the snapshot alone: read without netting.
    parts = runtime.controller.catalog.state_parts("orders", epochs[-1], inclusive=True)
    assert parts.snapshot is not None and parts.snapshot.epoch == epochs[-1] and parts.changes == []

    run(2)
    queried = {t: duckdb_rows(runtime, t) for t in TABLES}
    report = runtime.compact(epochs[-1], every=1)
    assert report.metadata["failures"] == "none"
    # Two snapshots now: the change files up to the older one are gone, and nothing else changed.
    for e in epochs[1:]:
        for table in TABLES:
            assert spark_rows(runtime, table, e) == seen[(table, e)], (table, e)
    assert {t: duckdb_rows(runtime, t) for t in TABLES} == queried
    for table in TABLES:
        root = Path(runtime.warehouse.table_root(table))
        assert not any((root / f"epoch={e}").exists() for e in epochs[:2])
        assert all((root / f"epoch={e}").exists() for e in epochs[2:])
        with pytest.raises(StateCompacted):
            runtime.read_state(table, epochs[0], inclusive=True)
        with pytest.raises(StateCompacted):
            runtime.controller.catalog.committed_locations(table)
    status = runtime.controller.status()["snapshots"]
    assert {t: status[t]["epoch"] for t in TABLES} == dict.fromkeys(TABLES, epochs[-1])

    # Changes after the snapshot, then every reader path still agrees with the oracles.
    run(1)
    assert_views_match_batch(runtime, VIEWS)
    assert_sink_exactly_once(runtime, "large_out")
    assert {t: duckdb_rows(runtime, t) for t in TABLES} == {t: seen[(t, epochs[-1])] for t in TABLES}


def snapshot_then_change(h, runtime) -> tuple[int, int]:  # noqa: ANN001
    """400 keyed orders, snapshotted; then an epoch that updates id 3 and deletes id 5 on top."""
    h.produce([json.dumps({"id": i, "customer": f"c{i % 7}", "amount": float(i % 30)}) for i in range(400)])
    first = run_epoch(runtime)
    runtime.compact(first, every=1)
    h.produce([json.dumps({"id": 3, "customer": "new", "amount": 99.0}), json.dumps({"id": 5, "_op": "delete"})])
    e = run_epoch(runtime)
    return first, e


@pytest.mark.parametrize(("directory_rows", "directories"), [("131072", 1), ("25", 16)])
def test_a_small_snapshot_shares_directories_and_reads_of_some_vnodes_stay_exact(
    spark,  # noqa: ANN001
    tmp_path: Path,
    directory_rows: str,
    directories: int,
) -> None:
    from epochal.storage.vnode import vnode_column

    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark, env={"EPOCHAL_SNAPSHOT_DIRECTORY_ROWS": directory_rows})
    _, e = snapshot_then_change(h, runtime)
    snapshot = runtime.controller.catalog.snapshots("orders")[-1]
    spans = runtime.warehouse.snapshot_dirs(snapshot.location)
    # 400 rows: one directory of all 256 vnodes, or (25 rows a directory) 16 of 16 vnodes each
    assert len(spans) == directories and spans[0][:2] == (0, 256 // directories - 1)
    state = runtime.read_state("orders", e, inclusive=True)[0]
    whole = state.collect()
    # a key lookup reads a directory that holds other vnodes too: the restriction still applies exactly
    keys = spark.createDataFrame([(3,), (5,), (7,)], "id BIGINT")
    rows, _ = runtime.read_state("orders", e, inclusive=True, restrict=(("id",), keys))
    assert multiset(rows.collect()) == multiset([(3, "new", 99.0), (7, "c0", 7.0)])
    # a vnode range that starts and ends inside directories (a backfill's range) holds its vnodes only
    frame = spark.createDataFrame(whole, state.schema)  # (as read, not as laid out)
    expected = frame.where(vnode_column(state.schema, ("id",)).between(10, 39)).collect()
    ranged, read = runtime.reader.read_vnode_range("orders", e, ("id",), 10, 40)
    assert multiset(ranged.collect()) == multiset(expected) and 0 < len(expected) < len(whole)
    assert read < 100  # the range's share of what it opened (30 of 256 vnodes), and the 3 change rows


def test_restricted_reads_open_only_the_keys_vnodes(spark, tmp_path: Path, monkeypatch) -> None:
    from epochal.storage import state_cache

    # These tables are tiny: once cached they would be filtered in memory whole (see the warm-cache
    # test). Vnode pruning is what a snapshot too large for that gets, so make them count as large.
    monkeypatch.setattr(state_cache, "SMALL_ROWS", 0)
    h = make_harness(tmp_path, FILES)
    # and a directory per vnode, as a large table's snapshot has (a small one shares directories)
    runtime = h.runtime(spark, env={"EPOCHAL_SNAPSHOT_DIRECTORY_ROWS": "1"})
    first, e = snapshot_then_change(h, runtime)
    assert len(runtime.warehouse.snapshot_dirs(runtime.controller.catalog.snapshots("orders")[-1].location)) > 200

    whole, whole_read = runtime.read_state("orders", e, inclusive=True)
    assert whole_read == 400 + 3  # the snapshot plus the last epoch's change (one update, one delete)
    keys = spark.createDataFrame([(3,), (5,), (7,), (None,)], "id INT")  # other type than the table's BIGINT
    rows, read = runtime.read_state("orders", e, inclusive=True, restrict=(("id",), keys))
    assert multiset(rows.collect()) == multiset([(3, "new", 99.0), (7, "c0", 7.0)])
    print(f"rows read: {read} restricted to 4 keys, {whole_read} whole")
    assert read < 20, read  # four vnodes of 256 hold ~6 of 400 rows, plus the 3 change rows
    # Not the distribution key: no pruning, the restriction still applies exactly.
    by_customer = spark.createDataFrame([("c1",)], "customer STRING")
    rows, read = runtime.read_state("orders", e, inclusive=True, restrict=(("customer",), by_customer))
    assert read == whole_read
    assert multiset(rows.collect()) == multiset(r for r in whole.collect() if r["customer"] == "c1")
    # A view without a key hashes all its columns: a restriction by all of them prunes too.
    spend, _ = runtime.read_state("spend", first, inclusive=True)
    row = spend.where("customer = 'c1'").collect()[0]
    spend_keys = spark.createDataFrame([tuple(row)], spend.schema)
    rows, read = runtime.read_state("spend", first, inclusive=True, restrict=(("customer", "n", "total"), spend_keys))
    assert multiset(rows.collect()) == multiset([row])
    assert read < runtime.controller.catalog.snapshots("spend")[-1].rows == 7


def test_files_stay_bounded_and_a_lagging_sink_keeps_its_changes(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_COMPACT_EVERY", "2")
    lean = {"pipeline.sql": FILES["pipeline.sql"].replace(
        "CREATE MATERIALIZED VIEW spend WITH (refresh = 'full') AS\n"
        "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;", "")}
    h = make_harness(tmp_path, lean)
    runtime = h.runtime(spark)
    tables = ["orders", "large"]
    rng = random.Random(11)
    counts: list[int] = []
    epochs: list[int] = []
    lag = range(8, 13)  # the sink does not run in these epochs
    for i in range(22):
        h.produce(records(rng, 6, ids=12))
        epochs.append(run_epoch(runtime, sinks=i not in lag, compact=True))
        counts.append(sum(runtime.warehouse.table_file_count(t) for t in tables))
        if i == lag[-1]:
            # Every epoch the sink has not delivered still has its change files, listed and on disk.
            delivered = runtime.sink("large_out").delivered_epoch()
            assert delivered == epochs[lag[0] - 1]
            pending = runtime.controller.catalog.committed_locations("large", after=delivered)
            assert [e for e, _ in pending] == epochs[lag[0] :]
            assert all(runtime.warehouse.parquet_files(loc) for _, loc in pending)
    print("files per epoch:", counts)
    assert_sink_exactly_once(runtime, "large_out")
    assert_view_matches_batch(runtime, "large", VIEWS["large"])
    # Bounded: at most two snapshots (one file per vnode, so <= 12 keys' files each) and the change
    # files of the epochs after the older snapshot (<= 2 * 2 + 1 epochs, a file or two each).
    bound = len(tables) * (2 * 12 + 5 * 2)
    assert max(counts[:lag[0]]) <= bound and max(counts[lag[-1] + 4 :]) <= bound, counts
    # Recovery keeps everything that is recorded: the state is unchanged.
    before = {t: spark_rows(runtime, t, epochs[-1]) for t in tables}
    runtime.recover("test")
    assert {t: spark_rows(runtime, t, epochs[-1]) for t in tables} == before


@pytest.fixture(params=["duckdb", "postgresql"])
def meta_url(request, tmp_path: Path) -> str:
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'meta.duckdb'}"
    return request.getfixturevalue("postgres_url")


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_crash_mid_compaction_is_swept_by_recovery(spark, tmp_path: Path, monkeypatch, meta_url: str) -> None:
    monkeypatch.setenv("EPOCHAL_META_URL", meta_url)
    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark)
    h.produce(records(random.Random(3), 20))
    e = run_epoch(runtime, compact=False)
    runtime.compact(e, every=1)
    recorded = runtime.controller.catalog.snapshots("orders")[-1].location
    h.produce(records(random.Random(4), 20))
    e = run_epoch(runtime)
    expected = spark_rows(runtime, "orders", e)
    # A compaction that died after writing its files: announced by a process that is gone...
    state, _ = runtime.read_state("orders", e, inclusive=True)
    orphan = runtime.warehouse.new_snapshot_location("orders", e)
    runtime.controller.catalog.begin_snapshot("orders", e, orphan, ("id",), state.schema.json())
    state.write.parquet(orphan)
    pid = dead_pid()
    runtime.controller.backend.transaction(
        lambda cur: cur.execute("UPDATE snapshots SET owner_pid = ? WHERE location = ?", [pid, orphan])
    )
    # ...and one that died before it could even announce it.
    silent = runtime.warehouse.new_snapshot_location("large", e)
    state.write.parquet(silent)
    report = runtime.recover("test: a compaction died")
    assert set(report.discarded_locations) >= {orphan, silent}
    assert not Path(orphan).exists() and not Path(silent).exists()
    assert Path(recorded).exists() and runtime.controller.catalog.snapshots("orders")[-1].location == recorded
    assert spark_rows(runtime, "orders", e) == expected


def compaction_layout(runtime):  # noqa: ANN001, ANN201
    """The Layout ``EpochRuntime.compact`` hands compaction."""
    from epochal.incremental.state_needs import sources_storing_nothing
    from epochal.storage.compaction import Layout

    return Layout(
        list(runtime.pipeline.tables),
        runtime.distribution_key,
        lambda table: [n for n, s in runtime.pipeline.sinks.items() if s.from_table == table],
        frozenset(sources_storing_nothing(runtime.pipeline)),
        runtime.settings.snapshot_directory_rows,
    )


def test_a_reader_keeps_its_files_through_back_to_back_compactions(
    spark, tmp_path: Path, monkeypatch, meta_url: str
) -> None:
    """Two runs' compactions that planned against the same latest snapshot N publish back to back:
    the second retires N and the change files after it, while a third run's step of an epoch in
    flight has chosen them and not scanned them yet (Spark reads lazily). Its scan still succeeds;
    the files go once that epoch committed (/tmp/race/repro.py, made a test)."""
    from epochal.storage import compaction

    monkeypatch.setenv("EPOCHAL_META_URL", meta_url)
    h = make_harness(tmp_path, FILES)
    # (no cached copy: the reader's scan must find the files themselves)
    reader, run_a, run_b = (h.runtime(spark, env={"EPOCHAL_STATE_CACHE": "off"}) for _ in range(3))
    rng = random.Random(5)

    def epoch(runtime) -> int:  # noqa: ANN001
        h.produce(records(rng, 10))
        return run_epoch(runtime, sinks=False)

    first = epoch(run_a)
    run_a.compact(first, tables=["orders"], every=1)  # snapshot N
    old = run_a.controller.catalog.snapshots("orders")[-1]
    # Run A's compaction plans at its committed epoch; run B commits the next one and plans too,
    # against the same latest snapshot N (A has not published yet).
    epoch(run_a)
    plan_a = compaction.plan(run_a.reader, 1, ["orders"])
    epoch(run_b)
    plan_b = compaction.plan(run_b.reader, 1, ["orders"])
    assert [t for t, _ in plan_a] == [t for t, _ in plan_b] == ["orders"] and plan_a[0][1] < plan_b[0][1]

    # The reader: a view step of its in-flight epoch reads orders' state before the epoch.
    record, _ = reader.start_epoch(None, None)
    e = record.epoch
    h.produce(records(rng, 10))
    for source in reader.pipeline.sources:
        reader.run_source(e, source)
    parts = reader.controller.catalog.state_parts("orders", e, inclusive=False)
    assert parts.snapshot == old and parts.changes
    expected = multiset(reader.read_state("orders", e, inclusive=False)[0].collect())
    state, _ = reader.read_state("orders", e, inclusive=False)  # lazy: scanned at the step's write

    for runtime, (table, at) in ((run_a, plan_a[0]), (run_b, plan_b[0])):
        done = compaction.compact_table(runtime.reader, compaction_layout(runtime), table, at)
        assert done.outcome == "compacted", done
    assert old not in run_a.controller.catalog.snapshots("orders")  # N is retired: no new reader lists it
    assert Path(old.location).exists() and all(Path(loc).exists() for _, loc in parts.changes)
    # A later compaction pass deletes nothing the reader's epoch may hold, grace time or not.
    report = compaction.compact_tables(run_b.reader, compaction_layout(run_b), every=10**6, grace_s=0)
    assert report.deleted_locations == 0 and not report.failed
    assert Path(old.location).exists() and all(Path(loc).exists() for _, loc in parts.changes)

    assert multiset(state.collect()) == expected

    for view in reader.pipeline.view_order():
        reader.run_view(e, view)
    reader.commit(e)
    report = compaction.compact_tables(run_a.reader, compaction_layout(run_a), every=10**6, grace_s=0)
    assert report.deleted_locations > 0 and not report.failed
    assert not Path(old.location).exists()
    # (the change files up to the newer kept snapshot went with N; the reader's epoch's own stay)
    kept = run_a.controller.catalog.snapshots("orders")[0].epoch
    dropped = [loc for at, loc in parts.changes if at <= kept]
    assert dropped and not any(Path(loc).exists() for loc in dropped)


def test_recovery_keeps_retired_files_until_they_are_reaped(spark, tmp_path: Path) -> None:
    from epochal.storage import compaction

    h = make_harness(tmp_path, FILES)
    runtime = h.runtime(spark, env={"EPOCHAL_RETENTION_GRACE_S": "3600"})
    rng = random.Random(6)
    for _ in range(3):  # the third snapshot retires the first, and the change files up to the second
        h.produce(records(rng, 10))
        e = run_epoch(runtime, sinks=False)
        runtime.compact(e, tables=["orders"], every=1)
    retired = runtime.controller.backend.transaction(
        lambda cur: [r[0] for r in cur.execute("SELECT location FROM retired_files").fetchall()]
    )
    assert len(retired) >= 2 and all(Path(loc).exists() for loc in retired)
    expected = spark_rows(runtime, "orders", e)

    report = runtime.recover("test: retired files are not garbage")
    assert not set(retired) & set(report.discarded_locations)
    assert all(Path(loc).exists() for loc in retired)
    assert spark_rows(runtime, "orders", e) == expected
    # Reaped, they go (their rows first: a sweep after that deletes what a crash left).
    report = compaction.compact_tables(runtime.reader, compaction_layout(runtime), every=10**6, grace_s=0)
    assert report.deleted_locations == len(retired)
    assert not any(Path(loc).exists() for loc in retired)


# ---------------------------------------------------------------------- controller only (no Spark)


def plan_one(source: str, starts: dict[str, int]) -> list[SplitRange]:
    return [SplitRange("0", starts.get("0", 0), starts.get("0", 0) + 1)]


def committed_src(tmp_path: Path, meta_url: str, epochs: int, sinks: list[str] | None = None):  # noqa: ANN201
    """A controller of one source ``src`` with ``epochs`` committed epochs (returned with it)."""
    ctl = CheckpointController(
        Settings.from_env({"EPOCHAL_HOME": str(tmp_path), "EPOCHAL_META_URL": meta_url, "EPOCHAL_TIME_TRAVEL_S": "0"}),
        ["src"],
        [],
        sinks=sinks or [],
    )
    ctl.recover("bootstrap", discard=lambda locs: None)
    committed = []
    for _ in range(epochs):
        e = ctl.epoch_log.inject(plan_one).epoch
        ctl.epoch_log.collect(e, Collected("src", f"/w/src/{e}"))
        committed.append(e)
    return ctl, committed


def test_snapshot_publication_races_and_retention(tmp_path: Path, meta_url: str) -> None:
    ctl, epochs = committed_src(tmp_path, meta_url, 6, sinks=["out"])
    with pytest.raises(Exception, match="only committed epochs"):
        in_flight = ctl.epoch_log.inject(plan_one).epoch
        ctl.catalog.begin_snapshot("src", in_flight, "/w/src/snap-x", (), "{}")

    def snapshot(epoch: int, name: str) -> bool:
        ctl.catalog.begin_snapshot("src", epoch, f"/w/src/{name}", ("id",), "{}")
        return ctl.catalog.publish_snapshot(f"/w/src/{name}", 10, 1, sinks=["out"]).recorded

    # Two compactions of one epoch: the first to publish wins; an older one loses to a newer one.
    ctl.catalog.begin_snapshot("src", epochs[2], "/w/src/b", ("id",), "{}")
    assert snapshot(epochs[2], "a")
    assert not ctl.catalog.publish_snapshot("/w/src/b", 10, 1).recorded
    assert not snapshot(epochs[1], "old")
    assert [s.location for s in ctl.catalog.snapshots("src")] == ["/w/src/a"]
    parts = ctl.catalog.state_parts("src", epochs[4], inclusive=True)
    assert parts.snapshot.location == "/w/src/a" and [e for e, _ in parts.changes] == epochs[3:5]
    assert [e for e, _ in ctl.catalog.state_parts("src", epochs[1], inclusive=True).changes] == epochs[:2]

    # A second snapshot releases the change files up to the first, once the sink has them.
    mark_delivered(ctl, "out", epochs[0])
    ctl.catalog.begin_snapshot("src", epochs[4], "/w/src/c", ("id",), "{}")
    result = ctl.catalog.publish_snapshot("/w/src/c", 10, 1, sinks=["out"])
    assert result.recorded and result.retired == [f"/w/src/{epochs[0]}"] and result.changes_dropped_upto == epochs[0]
    for e in epochs[3:5]:
        mark_delivered(ctl, "out", e)
    mark_delivered(ctl, "out", epochs[1])
    mark_delivered(ctl, "out", epochs[2])
    ctl.catalog.begin_snapshot("src", epochs[5], "/w/src/d", ("id",), "{}")
    result = ctl.catalog.publish_snapshot("/w/src/d", 10, 1, sinks=["out"])
    # Keeps the newest two snapshots (c, d) and the changes after c.
    assert sorted(result.retired) == sorted(["/w/src/a", *(f"/w/src/{e}" for e in epochs[1:5])])
    assert ctl.catalog.committed_locations("src", after=epochs[4]) == [(epochs[5], f"/w/src/{epochs[5]}")]
    with pytest.raises(StateCompacted):
        ctl.catalog.committed_locations("src", after=epochs[2])
    with pytest.raises(StateCompacted):
        ctl.catalog.state_parts("src", epochs[3], inclusive=True)
    assert ctl.catalog.state_parts("src", epochs[5], inclusive=True).snapshot.location == "/w/src/d"
    assert ctl.status()["snapshots"]["src"]["epoch"] == epochs[5]


def test_retired_files_wait_for_their_readers(tmp_path: Path, meta_url: str) -> None:
    """What retention lets go of is deleted only once no reader can hold it: not while an epoch
    injected before the retirement is in flight, nor while a compaction of the table that started
    before it writes, nor within the grace time; an epoch or a compaction that came after holds
    nothing back."""
    ctl, epochs = committed_src(tmp_path, meta_url, 3)
    catalog = ctl.catalog
    for epoch, name in ((epochs[0], "a"), (epochs[1], "b")):
        catalog.begin_snapshot("src", epoch, f"/w/src/{name}", ("id",), "{}")
        assert catalog.publish_snapshot(f"/w/src/{name}", 10, 1).recorded
    # b released the change files up to a: no reader is left that could hold them, so they go at once.
    assert catalog.reap_retired(0) == [f"/w/src/{epochs[0]}"]
    reader = ctl.epoch_log.inject(plan_one).epoch  # a step of it may have chosen snapshot a
    catalog.begin_snapshot("src", epochs[2], "/w/src/w", ("id",), "{}")  # a compaction reading a's files
    catalog.begin_snapshot("src", epochs[2], "/w/src/c", ("id",), "{}")
    result = catalog.publish_snapshot("/w/src/c", 10, 1)
    expected = sorted(["/w/src/a", f"/w/src/{epochs[1]}"])
    assert result.recorded and sorted(result.retired) == expected
    # Nothing lists them any more, but they are kept: recorded as retired, and for recovery's sweep.
    assert [s.location for s in catalog.snapshots("src")] == ["/w/src/b", "/w/src/c"]
    rows = ctl.backend.transaction(
        lambda cur: cur.execute("SELECT location, retired_at, retired_epoch FROM retired_files").fetchall()
    )
    assert sorted(r[0] for r in rows) == expected and {r[2] for r in rows} == {reader}
    retired_at = rows[0][1]
    later = retired_at + 3600

    assert catalog.reap_retired(0, now=later) == []  # the reader's epoch, and compaction w
    catalog.abandon_snapshot("/w/src/w")
    assert catalog.reap_retired(0, now=later) == []  # the reader's epoch is still in flight
    ctl.epoch_log.collect(reader, Collected("src", f"/w/src/{reader}"))
    # A compaction that chose its files before the retirement, announced after it.
    catalog.begin_snapshot("src", epochs[2], "/w/src/w2", ("id",), "{}", started_at=retired_at - 1)
    assert catalog.reap_retired(0, now=later) == []
    catalog.abandon_snapshot("/w/src/w2")
    # Neither an epoch injected after the retirement nor a compaction started after it holds anything.
    ctl.epoch_log.inject(plan_one)
    catalog.begin_snapshot("src", reader, "/w/src/x", ("id",), "{}")
    assert catalog.reap_retired(60, now=retired_at + 30) == []  # within the grace time
    assert catalog.reap_retired(60, now=retired_at + 61) == expected
    assert catalog.reap_retired(0, now=later) == []  # the rows went with the first reap


def test_compaction_op_reports_in_epoch_job(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EPOCHAL_COMPACT_EVERY", "2")
    h = make_harness(tmp_path, FILES)
    instance = dg.DagsterInstance.ephemeral()
    for i in range(2):
        h.produce(records(random.Random(i), 5))
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    meta = instance.fetch_materializations(dg.AssetKey("epoch_compaction"), limit=5).records
    assert len(meta) == 2
    latest = meta[0].asset_materialization.metadata
    assert latest["tables_compacted"].value.count("@") == len(TABLES)
    assert latest["failures"].value == "none"
    status = h.cli("status")
    assert status.returncode == 0 and "snapshot @" in status.stdout, status.stderr
    compact = h.cli("compact", "--table", "orders")
    assert compact.returncode == 0, compact.stderr


def test_warm_snapshot_cache_serves_wide_reads_and_never_changes_them(spark, tmp_path: Path, monkeypatch) -> None:
    """A read that touches most of a snapshot scans Spark's cached copy (filled once), a read of a
    few keys of a large snapshot still opens only their vnodes, a small cached one answers it from
    memory without the Spark job that looks the vnodes up, a newer snapshot evicts the older, and
    every answer is the one the same read gives with EPOCHAL_STATE_CACHE=off."""
    from epochal.storage import state_cache

    monkeypatch.setattr(state_cache, "SMALL_ROWS", 0)  # orders counts as large until said otherwise
    h = make_harness(tmp_path, FILES)
    # (and laid out as a large snapshot is: a directory per vnode)
    runtime = h.runtime(spark, env={"EPOCHAL_SNAPSHOT_DIRECTORY_ROWS": "1"})
    uncached = h.runtime(spark, env={"EPOCHAL_STATE_CACHE": "off", "EPOCHAL_SNAPSHOT_DIRECTORY_ROWS": "1"})
    assert runtime.state_cache.enabled and not uncached.state_cache.enabled
    _, e = snapshot_then_change(h, runtime)

    def read(rt, keys=None):  # noqa: ANN001, ANN202
        restrict = None if keys is None else (("id",), spark.createDataFrame([(k,) for k in keys], "id BIGINT"))
        rows, n = rt.read_state("orders", e, inclusive=True, restrict=restrict)
        return multiset(rows.collect()), n

    spread = list(range(0, 400, 2))  # 200 keys: most of the vnodes that hold rows
    expected, direct = read(uncached, spread)
    assert read(runtime, spread) == (expected, 400 + 3)  # from the cache: the whole snapshot is scanned
    hits = runtime.state_cache.hits  # the full-refresh view `spend` already read orders whole
    assert read(runtime, spread)[0] == expected and runtime.state_cache.hits == hits + 1
    assert direct < 400 + 3
    assert read(runtime)[0] == read(uncached)[0] and runtime.state_cache.hits == hits + 2
    few, few_read = read(runtime, [3, 5, 7])
    assert few == read(uncached, [3, 5, 7])[0] == multiset([(3, "new", 99.0), (7, "c0", 7.0)])
    assert runtime.state_cache.hits == hits + 2 and few_read < 20  # a few vnodes: read directly, not from memory
    cached = runtime.state_cache.get("orders", runtime.controller.catalog.snapshots("orders")[-1].location)
    assert cached is not None and cached.is_cached

    # Small and cached: finding the keys' vnodes would be a Spark job costing more than the scan.
    monkeypatch.setattr(state_cache, "SMALL_ROWS", 1_000)
    keys = spark.createDataFrame([(3,), (5,), (7,)], "id BIGINT")
    looked_up: list[str] = []
    vnode_dirs = runtime.warehouse.vnode_dirs
    monkeypatch.setattr(runtime.warehouse, "vnode_dirs", lambda loc: looked_up.append(loc) or vnode_dirs(loc))
    hits = runtime.state_cache.hits
    rows, rows_read = runtime.read_state("orders", e, inclusive=True, restrict=(("id",), keys))
    assert looked_up == []  # no vnode was chosen, so no Spark job ran to choose them
    assert runtime.state_cache.hits == hits + 1 and rows_read == 400 + 3  # the whole cached copy, filtered
    assert multiset(rows.collect()) == few
    monkeypatch.setattr(state_cache, "SMALL_ROWS", 0)

    # Compaction publishes a newer snapshot: the next wide read caches it and releases the old one.
    runtime.compact(e, every=1)
    newest = runtime.controller.catalog.snapshots("orders")[-1]
    assert newest.epoch == e
    assert read(runtime, spread)[0] == expected
    assert not cached.is_cached
    assert runtime.state_cache.get("orders", newest.location) is not None
    runtime.close()
    assert runtime.state_cache.get("orders", newest.location) is None
    assert uncached.state_cache.hits == 0


def test_a_view_with_map_columns_is_compacted(spark, tmp_path: Path, monkeypatch) -> None:
    """A snapshot is laid out by a hash of every column when no reader restricts the table by a
    key, and Spark refuses to hash a MAP: such a view failed every compaction (found by a SQL
    probe), so each read replayed its whole history. MAPs stay out of that hash."""
    monkeypatch.setenv("EPOCHAL_COMPACT_EVERY", "1")
    files = {
        "pipeline.sql": FILES["pipeline.sql"].split("CREATE MATERIALIZED VIEW")[0]
        + "CREATE MATERIALIZED VIEW tagged AS SELECT id, map('customer', customer) AS attrs, "
        "named_struct('by', map('amount', amount)) AS nested, amount FROM orders;\n"
    }
    h = make_harness(tmp_path, files)
    runtime = h.runtime(spark)
    latest: dict[int, tuple[str, float]] = {}
    rng = random.Random(3)
    for _ in range(3):
        batch = records(rng, 12)
        for line in map(json.loads, batch):
            if line.get("_op") == "delete":
                latest.pop(line["id"], None)
            else:
                latest[line["id"]] = (line["customer"], line["amount"])
        h.produce(batch)
        run_epoch(runtime, sinks=False, compact=True)  # (asserts the compaction had no failure)
    assert runtime.controller.catalog.snapshots("tagged"), "the view was compacted"
    rows = runtime.state("tagged").collect()
    assert sorted((r.id, r.attrs["customer"], r.nested.by["amount"]) for r in rows) == sorted(
        (i, c, a) for i, (c, a) in latest.items()
    )
