"""The posix_fs connector: Parquet, CSV and JSON files where they land, Debezium and upsert JSON, and
the FORMAT ... ENCODE ... clause. Each file format runs end to end through a pipeline; the expected
rows are computed from the files with pyarrow and the csv and json modules, not by the connector."""

from __future__ import annotations

import csv
import json
import os
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochal.connectors.base import SplitRange
from epochal.connectors.posix_fs import PosixFsConnectorSpec
from epochal.connectors.registry import connector_spec
from epochal.errors import PipelineError
from epochal.pipeline.loader import load_pipeline
from epochal.query.cut import run_query
from epochal.storage.warehouse import dead_letter_table
from tests.consistency import multiset
from tests.epochal_harness import make_harness, run_epoch

FILES_PIPELINE = {
    "sources.sql": """
CREATE SOURCE events (id BIGINT, kind STRING, amount DOUBLE)
WITH (connector = 'posix_fs', posix_fs.root = 'landing/events', match_pattern = '*.parquet')
FORMAT PLAIN ENCODE PARQUET;

CREATE SOURCE clicks (user_id BIGINT, page STRING, ms INT)
WITH (connector = 'posix_fs', posix_fs.root = 'landing/clicks', match_pattern = '*.csv')
FORMAT PLAIN ENCODE CSV (without_header = 'false', delimiter = ',');

CREATE SOURCE logs (level STRING, n BIGINT)
WITH (connector = 'posix_fs', posix_fs.root = 'landing/logs', match_pattern = '*.json')
FORMAT PLAIN ENCODE JSON;
""",
    "views.sql": """
CREATE MATERIALIZED VIEW event_totals AS SELECT kind, COUNT(*) AS n, SUM(amount) AS total FROM events GROUP BY kind;
CREATE MATERIALIZED VIEW page_hits AS SELECT page, COUNT(*) AS n, SUM(ms) AS ms FROM clicks GROUP BY page;
CREATE MATERIALIZED VIEW level_counts AS SELECT level, SUM(n) AS n FROM logs GROUP BY level;
""",
}


def _parquet(path: Path, rows: list[tuple]) -> None:
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "kind": [r[1] for r in rows],
            "amount": pa.array([r[2] for r in rows], pa.float64()),
        }
    )
    pq.write_table(table, path)


def _expected_events(root: Path) -> Counter:
    totals: dict[str, list] = {}
    for path in sorted(root.glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            n, total = totals.get(row["kind"], [0, 0.0])
            totals[row["kind"]] = [n + 1, total + row["amount"]]
    return multiset((kind, n, total) for kind, (n, total) in totals.items())


def _expected_clicks(root: Path) -> Counter:
    hits: dict[str, list] = {}
    for path in sorted(root.glob("*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    ms = int(row["ms"])
                    int(row["user_id"])
                except (TypeError, ValueError):
                    continue  # a dead letter
                n, total = hits.get(row["page"], [0, 0])
                hits[row["page"]] = [n + 1, total + ms]
    return multiset((page, n, ms) for page, (n, ms) in hits.items())


def _expected_levels(root: Path) -> Counter:
    levels: Counter = Counter()
    for path in sorted(root.glob("*.json")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a dead letter
            levels[record["level"]] += record["n"]
    return multiset(levels.items())


def _state(runtime, view: str) -> Counter:  # noqa: ANN001
    return multiset(runtime.state(view).collect())


def test_parquet_csv_and_json_files_end_to_end(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, FILES_PIPELINE)
    events, clicks, logs = (h.home / "landing" / name for name in ("events", "clicks", "logs"))
    for d in (events, clicks, logs):
        d.mkdir(parents=True)

    # epoch 1: one file each, a malformed CSV row and a malformed JSON line among them
    _parquet(events / "a.parquet", [(1, "buy", 2.5), (2, "view", 0.0), (3, "buy", 4.0)])
    (clicks / "a.csv").write_text('user_id,page,ms\n1,/home,120\n2,"/a,b",30\n3,/home,oops\n4,/x\n')
    (logs / "a.json").write_text('{"level": "info", "n": 2}\n{"level": "warn", "n": 1}\n{"level": \n')
    (logs / "ignored.txt").write_text('{"level": "info", "n": 100}\n')  # does not match the pattern
    runtime = h.runtime(spark)
    record, _ = runtime.start_epoch(None, None)
    reports = {name: runtime.run_source(record.epoch, name) for name in runtime.pipeline.sources}
    for name in runtime.pipeline.view_order():
        runtime.run_view(record.epoch, name)
    runtime.commit(record.epoch)
    # the driver path (on by default for small epochs) declines these sources by name, to Spark
    for report in reports.values():
        assert report.metadata["engine"] == "spark", report.metadata
        assert report.metadata["driver_declined"] == "the driver path reads log sources only, not posix_fs"

    # epoch 2: new files; one written under another name and renamed in, as a landing job does
    _parquet(events / "b.parquet.tmp", [(4, "view", 1.5), (5, "refund", -2.0)])
    os.rename(events / "b.parquet.tmp", events / "b.parquet")
    # a header in another order: columns go by the header's names
    (clicks / "b.csv").write_text("page,ms,user_id\n/home,5,9\n")
    (logs / "b.json").write_text('{"n": 7, "level": "info"}\n')
    runtime = h.runtime(spark)
    run_epoch(runtime)
    assert _state(runtime, "event_totals") == _expected_events(events)
    assert _state(runtime, "page_hits") == _expected_clicks(clicks)
    assert _state(runtime, "level_counts") == _expected_levels(logs)
    assert _state(runtime, "page_hits")[("/home", 2, 125)] == 1  # b.csv's columns by name

    # a file read in an earlier epoch is never read again, even when it grows
    before = _state(runtime, "level_counts")
    with open(logs / "a.json", "a") as f:
        f.write('{"level": "info", "n": 1000}\n')
    runtime = h.runtime(spark)
    run_epoch(runtime)
    assert _state(runtime, "level_counts") == before

    _, dead, _ = run_query(runtime, f"SELECT split, \"offset\", reason FROM {dead_letter_table('clicks')} ORDER BY 2")
    assert dead == [
        ("a.csv", 3, "field 'ms': expected INT, got 'oops'"),
        ("a.csv", 4, "expected 3 fields, got 2"),
    ], dead
    _, dead, _ = run_query(runtime, f"SELECT split, \"offset\", reason FROM {dead_letter_table('logs')}")
    assert dead == [("a.json", 2, "malformed JSON")], dead


KEYED_PIPELINE = {
    "sources.sql": """
CREATE TABLE accounts (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id))
WITH (connector = 'posix_fs', posix_fs.root = 'landing/accounts', match_pattern = '*.json')
FORMAT DEBEZIUM ENCODE JSON;

CREATE TABLE prices (sku STRING, price DOUBLE, PRIMARY KEY (sku))
WITH (connector = 'posix_fs', posix_fs.root = 'landing/prices', match_pattern = '*.jsonl')
FORMAT UPSERT ENCODE JSON;
""",
    "views.sql": "CREATE MATERIALIZED VIEW rich AS SELECT owner, balance FROM accounts WHERE balance > 10;\n",
}


def _event(op: str, before: dict | None, after: dict | None, wrapped: bool) -> str:
    payload = {"op": op, "before": before, "after": after, "source": {"table": "accounts"}, "ts_ms": 1}
    return json.dumps({"schema": {"type": "struct"}, "payload": payload} if wrapped else payload)


def _replay_debezium(root: Path) -> Counter:
    """The accounts table as Debezium's events leave it, file by file in name order."""
    rows: dict[int, tuple] = {}
    for path in sorted(root.glob("*.json")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            event = event.get("payload", event)
            if event.get("op") in ("c", "r", "u"):
                rows[event["after"]["id"]] = (event["after"]["id"], event["after"]["owner"], event["after"]["balance"])
            elif event.get("op") == "d" and event.get("before"):
                rows.pop(event["before"]["id"], None)
    return multiset(rows.values())


def test_debezium_and_upsert_json_files(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, KEYED_PIPELINE)
    accounts, prices = h.home / "landing" / "accounts", h.home / "landing" / "prices"
    accounts.mkdir(parents=True)
    prices.mkdir(parents=True)

    def acct(i: int, owner: str, balance: int) -> dict:
        return {"id": i, "owner": owner, "balance": balance}

    # epoch 1, without the payload wrapper: a snapshot (r), creates, an update and a delete
    (accounts / "0001.json").write_text(
        "\n".join(
            [
                _event("r", None, acct(1, "ann", 5), False),
                _event("r", None, acct(2, "bob", 50), False),
                _event("c", None, acct(3, "cy", 70), False),
                _event("u", acct(2, "bob", 50), acct(2, "bob", 8), False),
                _event("d", acct(3, "cy", 70), None, False),
                _event("x", None, acct(9, "bad", 1), False),  # not an op: a dead letter
            ]
        )
        + "\n"
    )
    (prices / "0001.jsonl").write_text('{"sku": "a", "price": 1.5}\n{"sku": "b", "price": 2}\n')
    runtime = h.runtime(spark)
    run_epoch(runtime)
    assert _state(runtime, "accounts") == multiset([(1, "ann", 5), (2, "bob", 8)])

    # epoch 2, with the wrapper (Debezium's JSON converter with schemas)
    (accounts / "0002.json").write_text(
        "\n".join(
            [
                _event("u", acct(1, "ann", 5), acct(1, "ann", 500), True),
                _event("c", None, acct(4, "dee", 40), True),
                _event("d", acct(2, "bob", 8), None, True),
                _event("d", None, None, True),  # a delete without before: a dead letter
            ]
        )
        + "\n"
    )
    (prices / "0002.jsonl").write_text('{"sku": "a", "price": 1.75}\n{"sku": "b", "_op": "delete"}\n')
    runtime = h.runtime(spark)
    run_epoch(runtime)
    assert _state(runtime, "accounts") == _replay_debezium(accounts) == multiset([(1, "ann", 500), (4, "dee", 40)])
    assert _state(runtime, "rich") == multiset([("ann", 500), ("dee", 40)])
    assert _state(runtime, "prices") == multiset([("a", 1.75)])

    _, dead, _ = run_query(runtime, f"SELECT split, \"offset\", reason FROM {dead_letter_table('accounts')} ORDER BY 1")
    assert dead == [
        ("0001.json", 5, 'Debezium op "x" is not c, r, u or d'),
        ("0002.json", 3, 'op d has no "before" object'),
    ], dead


def _source(tmp_path: Path, clause: str, pattern: str = "*.csv") -> tuple:
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "s.sql").write_text(
        f"CREATE SOURCE s (a BIGINT, b STRING) WITH (connector = 'posix_fs', posix_fs.root = '{tmp_path / 'in'}', "
        f"match_pattern = '{pattern}') {clause};\n"
    )
    source = load_pipeline(tmp_path / "p").sources["s"]
    return source, PosixFsConnectorSpec().create(source, tmp_path)


def test_a_file_is_planned_whole_once_and_a_changed_file_is_a_dead_letter(spark, tmp_path: Path) -> None:
    _, connector = _source(tmp_path, "FORMAT PLAIN ENCODE CSV (without_header = 'true')")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.csv").write_text("1,x\n2,y\n")
    (tmp_path / "in" / "empty.csv").write_text("")
    (tmp_path / "in" / "note.txt").write_text("9,z\n")
    assert connector.plan({}) == [SplitRange("1.csv", 0, 8), SplitRange("empty.csv", 0, 0)]
    assert connector.plan({"1.csv": 8}) == [SplitRange("1.csv", 8, 8), SplitRange("empty.csv", 0, 0)]

    ranges = connector.plan({})
    (tmp_path / "in" / "1.csv").write_text("1,x\n2,y\n3,w\n")  # rewritten between plan and read
    batch = connector.read(spark, ranges)
    assert batch.rows.count() == 0
    ((split, reason),) = [(r.split, r.reason) for r in batch.dead_letters.collect()]
    assert split == "1.csv" and "had 8 bytes when it was planned and has 12 now" in reason, reason

    # without a header, columns go by position
    batch = connector.read(spark, connector.plan({}))
    assert sorted(tuple(r) for r in batch.rows.collect()) == [(1, "x"), (2, "y"), (3, "w")]


def test_format_encode_clause_is_parsed_and_checked(tmp_path: Path) -> None:
    source, _ = _source(tmp_path, "FORMAT PLAIN ENCODE CSV (delimiter = ';')")
    assert source.options["@format"] == "plain" and source.options["@encode.delimiter"] == ";"

    def problems(files: dict[str, str]) -> str:
        root = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        for name, text in files.items():
            (root / name).write_text(textwrap.dedent(text))
        with pytest.raises(PipelineError) as info:
            load_pipeline(root)
        return str(info.value)

    message = problems(
        {
            "a.sql": """
            CREATE SOURCE a (x BIGINT) WITH (connector = 'posix_fs', posix_fs.root = '/tmp/a')
              FORMAT PLAIN ENCODE AVRO;
            CREATE SOURCE b (x BIGINT) WITH (connector = 'posix_fs', posix_fs.root = '/tmp/b')
              FORMAT DEBEZIUM ENCODE JSON;
            CREATE TABLE c (x BIGINT, PRIMARY KEY (x)) WITH (connector = 'log', path = '/tmp/c')
              FORMAT DEBEZIUM ENCODE JSON;
            CREATE SOURCE d (x BIGINT) WITH (connector = 'posix_fs', posix_fs.root = '/tmp/d')
              FORMAT PLAIN ENCODE CSV (delimiter = ';;', header = 'yes');
            CREATE SOURCE e (x BIGINT) WITH (connector = 'posix_fs', posix_fs.root = '/tmp/e');
            """
        }
    )
    assert "source a: the posix_fs connector does not read FORMAT PLAIN ENCODE AVRO" in message
    assert "source b: FORMAT DEBEZIUM upserts and deletes rows by key: declare it as CREATE TABLE b" in message
    assert "table c: the log connector does not read FORMAT DEBEZIUM ENCODE JSON" in message
    assert "ENCODE CSV delimiter = ';;' must be one character" in message
    assert "ENCODE CSV takes without_header, delimiter, not 'header'" in message
    assert "source e: posix_fs source needs a FORMAT ... ENCODE ... clause" in message

    # the source's asset shows the clause as written, not as options
    from assets.epoch_assets import build_epoch_assets

    assets = build_epoch_assets(load_pipeline(tmp_path / "p"))
    (description,) = [spec.description for a in assets for spec in a.specs if "Source `s`" in (spec.description or "")]
    assert "match_pattern = '*.csv') FORMAT PLAIN ENCODE CSV (delimiter = ';')" in description, description

    # the log connector reads FORMAT PLAIN ENCODE JSON as before, and UPSERT on a keyed table
    root = tmp_path / "ok"
    root.mkdir()
    (root / "a.sql").write_text(
        "CREATE SOURCE a (x BIGINT) WITH (connector = 'log', path = '/tmp/a') FORMAT PLAIN ENCODE JSON;\n"
        "CREATE TABLE b (x BIGINT, PRIMARY KEY (x)) WITH (connector = 'log', path = '/tmp/b')\n"
        "FORMAT UPSERT ENCODE JSON;\n"
    )
    assert set(load_pipeline(root).sources) == {"a", "b"}


def test_a_changed_format_or_encoding_is_refused_on_a_running_source(tmp_path: Path) -> None:
    from epochal.checkpoint.statements.sources import Declaration, refusals

    def declared(connector: str, clause: str, key: str = "") -> Declaration:
        root = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        where = "posix_fs.root = '/tmp/in'" if connector == "posix_fs" else "path = '/tmp/in'"
        keyed = ("TABLE", "(a BIGINT, b STRING, PRIMARY KEY (a))")
        kind, columns = keyed if key else ("SOURCE", "(a BIGINT, b STRING)")
        ddl = f"CREATE {kind} s {columns} WITH (connector = '{connector}', {where}) {clause};\n"
        (root / "s.sql").write_text(ddl)
        source = next(iter(load_pipeline(root).sources.values()))
        spec = connector_spec(connector)
        return Declaration.of(source, spec.identity_options, spec.fields_by_spelling)

    csv_source = declared("posix_fs", "FORMAT PLAIN ENCODE CSV")
    assert refusals(csv_source, declared("posix_fs", "FORMAT PLAIN ENCODE JSON")) == [
        "its ENCODE was 'csv' and is now 'json'"
    ]
    assert refusals(csv_source, declared("posix_fs", "FORMAT PLAIN ENCODE CSV (delimiter = ';')")) == [
        "its ENCODE option delimiter was not given and is now ';'"
    ]
    # defaults written out change nothing; a log reads PLAIN and UPSERT JSON alike
    assert refusals(csv_source, declared("posix_fs", "FORMAT PLAIN ENCODE CSV (without_header = 'false')")) == []
    assert refusals(declared("log", "", key="a"), declared("log", "FORMAT UPSERT ENCODE JSON", key="a")) == []


def test_a_parquet_value_that_does_not_convert_is_a_dead_letter_not_a_failed_epoch(spark, tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "in").mkdir()
    (tmp_path / "p" / "s.sql").write_text(
        f"CREATE SOURCE s (id BIGINT, kind STRING, amount DOUBLE) WITH (connector = 'posix_fs', "
        f"posix_fs.root = '{tmp_path / 'in'}', match_pattern = '*.parquet') FORMAT PLAIN ENCODE PARQUET;\n"
    )
    source = load_pipeline(tmp_path / "p").sources["s"]
    connector = PosixFsConnectorSpec().create(source, tmp_path)
    # INT for BIGINT widens; amount written as text: "1.5" converts, "oops" does not; KIND by name
    table = pa.table({"id": pa.array([1, 2], pa.int32()), "KIND": ["a", "b"], "amount": ["1.5", "oops"]})
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    batch = connector.read(spark, connector.plan({}))
    assert [tuple(r) for r in batch.rows.collect()] == [(1, "a", 1.5)]
    ((split, raw, reason),) = [(r.split, r.raw, r.reason) for r in batch.dead_letters.collect()]
    # raw: the values that were converted, as the file held them
    assert (split, raw) == ("x.parquet", '{"id":"2","amount":"oops"}')
    assert reason == "field 'amount': expected DOUBLE, got oops"
