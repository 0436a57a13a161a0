"""The nexmark and log source connectors: what a pipeline relies on when it plans and reads epochs."""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from epochal.connectors import log_lines
from epochal.connectors.base import SplitRange
from epochal.connectors.log import LogConnectorSpec, LogSource, append_records
from epochal.connectors.nexmark import (
    DEFAULT_BASE_TIME_MS,
    HOT_CHANNELS,
    TABLE_COLUMNS,
    US_STATES,
    NexmarkConnectorSpec,
    NexmarkSource,
)
from epochal.connectors.registry import SOURCE_CONNECTORS, connector_spec
from epochal.errors import EpochalError
from epochal.pipeline.model import Column, Location, SourceDef

REPO = Path(__file__).resolve().parents[2]
EPOCH = datetime(1970, 1, 1)
BASE_TIME = EPOCH + timedelta(milliseconds=DEFAULT_BASE_TIME_MS)
GAP = timedelta(microseconds=100)  # the default 100_000 ns


def collected(utc: datetime) -> datetime:
    """What collect() returns for the UTC time ``utc``: PySpark hands back naive local times."""
    return datetime.fromtimestamp(calendar.timegm(utc.timetuple())).replace(microsecond=utc.microsecond)


def source_def(connector: str, columns: tuple[Column, ...], options: dict[str, str]) -> SourceDef:
    return SourceDef(
        name="src",
        columns=columns,
        connector=connector,
        options={"connector": connector, **options},
        location=Location("pipeline.sql", 1),
    )


def all_columns(table: str) -> tuple[Column, ...]:
    return tuple(Column(name, ddl) for name, ddl in TABLE_COLUMNS[table])


def nexmark(table: str, columns: tuple[Column, ...] | None = None, **options: str) -> NexmarkSource:
    options = {"nexmark.table.type": table, **{k.replace("_", "."): v for k, v in options.items()}}
    return NexmarkConnectorSpec().create(source_def("nexmark", columns or all_columns(table), options), Path("."))


def collect(df) -> list[tuple]:
    return sorted(tuple(row) for row in df.collect())


# --- nexmark: reading ----------------------------------------------------------------------------


def test_nexmark_same_range_reads_the_same_rows_and_ranges_compose(spark):
    bids = nexmark("Bid")
    whole = collect(bids.read(spark, [SplitRange("0", 0, 1200)]).rows)
    again = collect(bids.read(spark, [SplitRange("0", 0, 1200)]).rows)
    first, rest = (bids.read(spark, [r]).rows for r in (SplitRange("0", 0, 500), SplitRange("0", 500, 1200)))
    assert len(whole) == 1200 * 46 // 50
    assert whole == again
    assert whole == collect(first.unionAll(rest))


@pytest.fixture(scope="module")
def first_5000_events(spark) -> dict[str, list[dict]]:
    """Events 0..4999 of every table, read from two splits (even and odd event numbers)."""
    ranges = [SplitRange("0", 0, 2500), SplitRange("1", 0, 2500)]
    return {
        table: [r.asDict() for r in nexmark(table, nexmark_split_num="2").read(spark, ranges).rows.collect()]
        for table in ("Person", "Auction", "Bid")
    }


def test_nexmark_event_types_come_in_proportion_1_3_46(first_5000_events):
    assert {table: len(rows) for table, rows in first_5000_events.items()} == {
        "Person": 100,
        "Auction": 300,
        "Bid": 4600,
    }


def test_nexmark_splits_partition_event_numbers(spark, first_5000_events):
    two = nexmark("Auction", nexmark_split_num="2", max_events_per_epoch="5000")
    assert two.plan({}) == [SplitRange("0", 0, 2500), SplitRange("1", 0, 2500)]
    # split 0 holds the even event numbers and split 1 the odd ones: together, the same events as one split
    one = nexmark("Auction").read(spark, [SplitRange("0", 0, 5000)]).rows
    assert collect(one) == sorted(tuple(r.values()) for r in first_5000_events["Auction"])


def test_nexmark_fields_are_sane_and_references_point_backwards(first_5000_events):
    people, auctions, bids = (first_5000_events[t] for t in ("Person", "Auction", "Bid"))

    # people: consecutive ids, one per 50 events, at base time + event number * gap
    assert sorted(p["id"] for p in people) == list(range(1000, 1100))
    for p in people:
        assert p["date_time"] == collected(BASE_TIME + (p["id"] - 1000) * 50 * GAP)
        assert re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", p["credit_card"])
        assert re.fullmatch(r"[a-z ]+@[a-z ]+\.com", p["email_address"]) and p["state"] in US_STATES
        assert " " in p["name"] and p["city"] and p["extra"]
    person_time = {p["id"]: p["date_time"] for p in people}

    # auctions: consecutive ids whose time grows with the id; sellers existed when they listed
    auctions = sorted(auctions, key=lambda a: a["id"])
    assert [a["id"] for a in auctions] == list(range(1000, 1300))
    assert all(x["date_time"] < y["date_time"] for x, y in zip(auctions, auctions[1:], strict=False))
    for a in auctions:
        assert 0 < a["initial_bid"] <= a["reserve"]
        assert a["expires"] > a["date_time"] and 10 <= a["category"] <= 14
        assert person_time[a["seller"]] <= a["date_time"]
    auction_time = {a["id"]: a["date_time"] for a in auctions}

    # bids: every auction and bidder exists at or before the bid, so joins never depend on epochs
    assert len({b["date_time"] for b in bids}) == len(bids)
    for b in bids:
        assert b["price"] > 0
        assert auction_time[b["auction"]] <= b["date_time"]
        assert person_time[b["bidder"]] <= b["date_time"]
        assert b["url"].startswith("https://www.nexmark.com/")
    # the skew: half the bids go to the hot auction of the moment, half the channels are hot
    top = sum(n for _, n in Counter(b["auction"] for b in bids).most_common(3))
    assert top > 0.45 * len(bids)
    hot = sum(b["channel"] in HOT_CHANNELS for b in bids)
    assert 0.4 * len(bids) < hot < 0.6 * len(bids)
    urls = defaultdict(set)
    for b in bids:
        urls[b["channel"]].add(b["url"])
    assert all(len(u) == 1 for u in urls.values())  # a channel keeps its url


def test_nexmark_time_options_and_declared_columns(spark):
    people = nexmark(
        "person",
        (Column("DATE_TIME", "TIMESTAMP"), Column("Id", "BIGINT")),
        nexmark_base_time="0",
        nexmark_min_event_gap_in_ns="1000000",  # 1 ms
    )
    df = people.read(spark, [SplitRange("0", 0, 100)]).rows
    assert df.dtypes == [("DATE_TIME", "timestamp"), ("Id", "bigint")]
    assert collect(df) == [(collected(EPOCH), 1000), (collected(EPOCH + timedelta(milliseconds=50)), 1001)]


# --- nexmark: planning and validation -------------------------------------------------------------


def test_nexmark_plan_shares_the_budget_and_stops_at_event_num():
    src = nexmark("Bid", nexmark_split_num="3", max_events_per_epoch="10")
    assert src.plan({}) == [SplitRange("0", 0, 4), SplitRange("1", 0, 3), SplitRange("2", 0, 3)]
    assert src.plan({"0": 4, "1": 3, "2": 3}) == [
        SplitRange("0", 4, 8),
        SplitRange("1", 3, 6),
        SplitRange("2", 3, 6),
    ]

    capped = nexmark("Bid", nexmark_split_num="3", max_events_per_epoch="100", nexmark_event_num="25")
    first = capped.plan({})
    assert first == [SplitRange("0", 0, 9), SplitRange("1", 0, 8), SplitRange("2", 0, 8)]
    owned = sorted(int(r.split) + k * 3 for r in first for k in range(r.start, r.end))
    assert owned == list(range(25))  # exactly event numbers 0..24, each once
    done = capped.plan({r.split: r.end for r in first})
    assert all(r.count == 0 for r in done) and [r.start for r in done] == [9, 8, 8]

    unbounded = nexmark("Bid")
    assert unbounded.plan({"0": 10**12}) == [SplitRange("0", 10**12, 10**12 + 10_000)]
    with pytest.raises(EpochalError, match="nexmark.split.num = 1"):
        unbounded.plan({"0": 5, "1": 5})  # offsets stored under another split count


def test_nexmark_validation_names_the_fix():
    spec = NexmarkConnectorSpec()
    bid = all_columns("Bid")

    def problems(options: dict[str, str], columns: tuple[Column, ...] = bid) -> str:
        return " | ".join(spec.validate(columns, {"connector": "nexmark", **options}))

    assert problems({"nexmark.table.type": "bId"}) == ""
    assert "Person, Auction, Bid" in problems({})
    assert "Person, Auction, Bid" in problems({"nexmark.table.type": "bids"})
    assert "did you mean 'nexmark.split.num'" in problems({"nexmark.table.type": "Bid", "nexmark.split.nums": "2"})
    for key, value in [
        ("nexmark.split.num", "0"),
        ("nexmark.split.num", "two"),
        ("nexmark.event.num", "-5"),
        ("max.events.per.epoch", "1.5"),
        ("nexmark.min.event.gap.in.ns", ""),
        ("nexmark.base.time", "99999999999999999"),
    ]:
        assert f"option '{key}' must be a whole number" in problems({"nexmark.table.type": "Bid", key: value})

    wrong_column = problems({"nexmark.table.type": "Person"}, (Column("price", "BIGINT"),))
    assert "'price'" in wrong_column and "Person" in wrong_column and "email_address" in wrong_column
    wrong_type = problems({"nexmark.table.type": "Person"}, (Column("id", "INT"),))
    assert "'id'" in wrong_type and "BIGINT" in wrong_type

    with pytest.raises(EpochalError, match="nexmark.table.type"):
        spec.create(source_def("nexmark", bid, {}), Path("."))


# --- log -----------------------------------------------------------------------------------------

LOG_COLUMNS = (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "TIMESTAMP"))


def log_source(home: Path, columns: tuple[Column, ...] = LOG_COLUMNS, **options: str) -> LogSource:
    options = {"path": "events", **{k.replace("_", "."): v for k, v in options.items()}}
    return LogConnectorSpec().create(source_def("log", columns, options), home)


def test_log_offsets_are_line_numbers_and_half_lines_wait(spark, tmp_path):
    log = tmp_path / "events"
    log.mkdir()
    (log / "0.jsonl").write_text('{"id": 0}\n{"id": 1}\n\n{"id": 3, "name": "x"}\n{"id": 4, "na')
    src = log_source(tmp_path)

    assert src.plan({}) == [SplitRange("0", 0, 4)]  # the half-written line 4 is not handed out
    ids = collect(src.read(spark, [SplitRange("0", 1, 4)]).rows.select("id"))
    assert ids == [(1,), (3,)]  # line 2 is blank: it has an offset but is no record
    assert collect(src.read(spark, [SplitRange("0", 3, 4)]).rows) == [(3, "x", None)]

    with open(log / "0.jsonl", "a") as f:
        f.write('me": "y"}\n')
    (log / "b.jsonl").write_text('{"id": 100}\n')
    ranges = src.plan({"0": 4})
    assert ranges == [SplitRange("0", 4, 5), SplitRange("b", 0, 1)]  # a new file is a new split
    assert collect(src.read(spark, ranges).rows) == [(4, "y", None), (100, None, None)]


def test_log_bad_lines_become_dead_letters_and_good_lines_come_through(spark, tmp_path):
    lines = [
        '{"id": 1, "name": "ok", "ts": "2024-01-02 03:04:05", "unknown": [1], "_op": "insert"}',
        '{"id": "abc", "name": "bad id"}',
        '{"id": 2',
        "[1, 2]",
        '{"id": 3, "ts": "not a time"}',
        '{"name": "no id"}',
        "   ",
        '{"id": 4, "name": null}',
        '{"id": 1.5, "ts": true}',
    ]
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "0.jsonl").write_text("".join(line + "\n" for line in lines))
    src = log_source(tmp_path)
    ranges = src.plan({})
    assert ranges == [SplitRange("0", 0, 9)]

    batch = src.read(spark, ranges)
    assert batch.dead_letters is not None
    assert batch.dead_letters.schema.simpleString() == "struct<split:string,offset:bigint,raw:string,reason:string>"
    rows = sorted(batch.rows.collect(), key=lambda r: r.id or 0)
    assert [tuple(r) for r in rows] == [
        (None, "no id", None),  # a missing field is NULL, not an error
        (1, "ok", collected(datetime(2024, 1, 2, 3, 4, 5))),  # zone-less times are UTC
        (4, None, None),
    ]
    dead = collect(batch.dead_letters)
    assert dead == [
        ("0", 1, lines[1], """field 'id': expected BIGINT, got "abc\""""),
        ("0", 2, lines[2], "malformed JSON"),
        ("0", 3, lines[3], "not a JSON object: got an array"),
        ("0", 4, lines[4], """field 'ts': expected TIMESTAMP, got "not a time\""""),
        ("0", 8, lines[8], "field 'id': expected BIGINT, got 1.5; field 'ts': expected TIMESTAMP, got true"),
    ]

    # the runtime asks `rejected` whether there is any dead letter before building the reasons
    assert batch.rejected is not None and batch.rejected.count() == len(dead)

    again = src.read(spark, ranges)
    assert sorted(again.rows.collect(), key=lambda r: r.id or 0) == rows
    assert collect(again.dead_letters) == dead


@pytest.mark.parametrize("keyed, parses", [(False, 1), (True, 2)])
def test_log_read_parses_each_line_once_per_parse(spark, tmp_path, keyed, parses, capsys):
    """The optimizer used to copy each parse into every expression that read it: a keyed read's
    plan held 13 from_json calls per line (1.6 s for 100,000 lines, 0.8-1.1 s parsed once). A keyed
    read's second parse (its key and _op alone) runs only for a line whose full parse misfits."""
    assert_log_read_parses_once(spark, tmp_path, keyed, parses, capsys)


def assert_log_read_parses_once(spark, tmp_path, keyed: bool, parses: int, capsys) -> None:
    """A log read's physical plans (rows, and the rejected lines) hold ``parses`` from_json calls:
    one per parse the read needs, whatever the optimizer does. ``spark`` may be a Connect client."""
    columns = (Column("id", "BIGINT"), Column("name", "STRING"))
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "0.jsonl").write_text('{"id": 1, "name": "a"}\n{"id": 2, "_op": "delete"}\n')
    key, kind = (("id",), "table") if keyed else ((), "source")  # a PRIMARY KEY needs a table
    declared = replace(source_def("log", columns, {"path": "events"}), primary_key=key, kind=kind)
    src = LogConnectorSpec().create(declared, tmp_path)
    batch = src.read(spark, src.plan({}))
    for frame in (batch.rows, batch.rejected):
        assert frame is not None
        capsys.readouterr()
        frame.explain()  # the physical plan: what each line goes through
        assert capsys.readouterr().out.count("from_json(") == parses
    assert sorted(tuple(r)[:2] for r in batch.rows.collect()) == [(1, "a"), (2, None)]  # and the rows still come


def test_log_without_files_plans_nothing_and_reads_empty_frames(spark, tmp_path):
    src = log_source(tmp_path, (Column("b", "STRING"), Column("a", "DECIMAL(10,2)")))
    assert src.plan({}) == []
    batch = src.read(spark, [])
    assert batch.rows.dtypes == [("b", "string"), ("a", "decimal(10,2)")]
    assert batch.dead_letters is not None and batch.dead_letters.columns == ["split", "offset", "raw", "reason"]
    assert batch.rows.count() == 0


def test_log_budget_is_shared_across_splits(tmp_path):
    for split, lines in {"a": 1, "b": 10, "c": 10}.items():
        append_records(tmp_path / "events", [json.dumps({"id": i}) for i in range(lines)], split)
    assert log_source(tmp_path, max_events_per_epoch="9").plan({}) == [
        SplitRange("a", 0, 1),
        SplitRange("b", 0, 4),
        SplitRange("c", 0, 4),
    ]
    assert log_source(tmp_path, max_events_per_epoch="20").plan({"b": 2}) == [
        SplitRange("a", 0, 1),
        SplitRange("b", 2, 10),
        SplitRange("c", 0, 10),
    ]
    assert log_source(tmp_path).plan({"a": 1}) == [
        SplitRange("a", 1, 1),
        SplitRange("b", 0, 10),
        SplitRange("c", 0, 10),
    ]


def test_latest_startup_skips_the_history_once_and_reads_later_lines_and_new_splits(tmp_path):
    """scan.startup.mode = 'latest': a source that has read nothing starts at its splits' ends; once it
    has, it goes on from its offsets, and a split that appears later is new, so read from line 0."""
    for split, lines in {"a": 3, "b": 2}.items():
        append_records(tmp_path / "events", [json.dumps({"id": i}) for i in range(lines)], split)
    latest = log_source(tmp_path, scan_startup_mode="LATEST")
    assert latest.plan({}) == [SplitRange("a", 3, 3), SplitRange("b", 2, 2)]
    assert log_source(tmp_path, scan_startup_mode="earliest").plan({}) == log_source(tmp_path).plan({}) == [
        SplitRange("a", 0, 3),
        SplitRange("b", 0, 2),
    ]
    append_records(tmp_path / "events", ['{"id": 9}'], "a")
    append_records(tmp_path / "events", ['{"id": 10}', '{"id": 11}'], "c")
    assert latest.plan({"a": 3, "b": 2}) == [SplitRange("a", 3, 4), SplitRange("b", 2, 2), SplitRange("c", 0, 2)]


def _oracle_lines(path: Path) -> list[str]:
    """The file's complete lines as Python reads them: independent of the connector's index."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return text.split("\n")[:-1]


@pytest.mark.parametrize("through", ["driver", "executors"])
def test_log_reads_a_range_from_its_bytes_alone(spark, tmp_path, monkeypatch, through):
    """An epoch reads only its range's bytes (the file was once read whole: every epoch's cost grew
    with the log, and a split past the heap or 2 GB failed). Small reads go through the driver,
    large ones are cut into pieces read by a Python data source; both give the same rows, with the
    right line numbers, over blank lines, CRLF, bytes that are not UTF-8 and long lines."""
    assert_log_reads_ranges(spark, tmp_path, monkeypatch, through)


def assert_log_reads_ranges(spark, tmp_path, monkeypatch, through: str) -> None:
    """``spark`` may be a Connect client: then the executors' pieces are read by the server's workers."""
    if through == "executors":
        monkeypatch.setattr(log_lines, "SPARK_DRIVER_READ_BYTES", 0)
    monkeypatch.setattr(log_lines, "COUNT_CHUNK", 4096)  # index marks every few KB, not every 8 MB
    monkeypatch.setattr(log_lines, "CHECKPOINT_BYTES", 4096)
    monkeypatch.setattr(log_lines, "PIECE_BYTES", 20_000)
    columns = (Column("id", "BIGINT"), Column("name", "STRING"))
    path = tmp_path / "events" / "0.jsonl"
    path.parent.mkdir()
    with open(path, "wb") as f:
        for i in range(3000):
            if i % 97 == 0:
                f.write(b"\n")  # a blank line: an offset, no record
            elif i % 89 == 0:
                f.write(b'{"id": %d, "name": "caf\xe9"}\n' % i)  # Latin-1, not UTF-8
            elif i % 83 == 0:
                f.write(b'{"id": %d, "name": "%s"}\r\n' % (i, b"w" * 5000))  # long, CRLF
            else:
                f.write(json.dumps({"id": i, "name": f"n{i}"}).encode() + b"\n")
        f.write(b'{"id": 3000')  # half written
    src = log_source(tmp_path, columns)
    assert src.plan({}) == [SplitRange("0", 0, 3000)]

    lines = _oracle_lines(path)
    for start, end in [(0, 3000), (1234, 2345), (2999, 3000), (97, 98), (500, 500)]:
        batch = src.read(spark, [SplitRange("0", start, end)])
        expected = sorted(
            (record["id"], record["name"])
            for record in (json.loads(line) for line in lines[start:end] if line.strip())
        )
        assert sorted(collect(batch.rows)) == expected, (start, end)
    # the pieces the executors read: cut at line starts, covering the range exactly
    f, index = log_lines.open_index(path, None)
    with f:
        pieces = index.pieces(f, "0", 10, 2990)
    assert len(pieces) > 3
    line_starts = [0] + [m.end() for m in re.finditer(b"\n", path.read_bytes())]
    assert [(p.first_line, p.start) for p in pieces][0] == (10, line_starts[10])
    assert all(p.start == line_starts[p.first_line] for p in pieces)
    assert all(p.end == line_starts[p.first_line + p.lines] for p in pieces)
    assert sum(p.lines for p in pieces) == 2980 and pieces[-1].first_line + pieces[-1].lines == 2990


def test_log_read_refuses_a_file_truncated_after_planning(spark, tmp_path):
    append_records(tmp_path / "events", [f'{{"id": {i}}}' for i in range(5)])
    src = log_source(tmp_path)
    ranges = src.plan({})
    (tmp_path / "events" / "0.jsonl").write_text('{"id": 0}\n')
    with pytest.raises(EpochalError, match="truncated, replaced or deleted"):
        src.read(spark, ranges)
    (tmp_path / "events" / "0.jsonl").unlink()
    with pytest.raises(EpochalError, match="has 0 complete line"):
        src.read(spark, ranges)


def test_log_plan_refuses_a_truncated_file(tmp_path):
    append_records(tmp_path / "events", ['{"id": 1}', '{"id": 2}'])
    src = log_source(tmp_path)
    assert src.plan({"0": 2}) == [SplitRange("0", 2, 2)]
    (tmp_path / "events" / "0.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(EpochalError, match="truncated"):
        src.plan({"0": 2})


def test_append_records_writes_whole_lines(tmp_path):
    log = tmp_path / "deep" / "events"
    assert append_records(log, ['{"a": 1}\n', "", "  \n", '{"a": 2}\r\n', "not json"]) == 3
    assert (log / "0.jsonl").read_text() == '{"a": 1}\n{"a": 2}\nnot json\n'
    assert append_records(log, iter(['{"a": 3}']), "eu-1") == 1
    assert (log / "eu-1.jsonl").read_text() == '{"a": 3}\n'
    assert append_records(log, []) == 0

    with pytest.raises(EpochalError, match="line break"):
        append_records(log, ['{"a": 4}', '{"a":\n5}'])
    with pytest.raises(EpochalError, match="split name"):
        append_records(log, ['{"a": 4}'], "../elsewhere")
    assert (log / "0.jsonl").read_text() == '{"a": 1}\n{"a": 2}\nnot json\n'  # rejected batches write nothing

    # a producer that died mid-line: the half line is closed off instead of swallowing the next record
    with open(log / "0.jsonl", "a") as f:
        f.write('{"a": ')
    append_records(log, ['{"a": 6}'])
    assert (log / "0.jsonl").read_text().splitlines()[-2:] == ['{"a": ', '{"a": 6}']


PRODUCER = textwrap.dedent(
    """
    import json, sys
    from epochal.connectors.log import append_records
    producer, directory = sys.argv[1], sys.argv[2]
    for batch in range(150):
        lines = [json.dumps({"p": producer, "n": batch * 3 + i, "pad": "x" * 3000}) for i in range(3)]
        append_records(directory, lines)
    """
)


def test_append_records_from_concurrent_producers_loses_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    producers = [
        subprocess.Popen([sys.executable, "-c", PRODUCER, name, str(tmp_path / "events")], env=env)
        for name in ("a", "b")
    ]
    assert [p.wait(timeout=60) for p in producers] == [0, 0]

    records = [json.loads(line) for line in (tmp_path / "events" / "0.jsonl").read_text().splitlines()]
    for name in ("a", "b"):
        assert [r["n"] for r in records if r["p"] == name] == list(range(450))  # all there, in order
    assert log_source(tmp_path).plan({}) == [SplitRange("0", 0, 900)]


def test_log_validation_names_the_fix(tmp_path):
    spec = LogConnectorSpec()

    def problems(options: dict[str, str], columns: tuple[Column, ...] = LOG_COLUMNS) -> str:
        return " | ".join(spec.validate(columns, {"connector": "log", **options}))

    assert problems({"path": "events"}) == ""
    assert problems({"path": "events", "format": "JSON", "max.events.per.epoch": "5"}) == ""
    assert "did you mean 'path'" in problems({"paht": "events"})
    assert "needs option path" in problems({})
    assert "format = 'json'" in problems({"path": "events", "format": "csv"})
    assert "whole number" in problems({"path": "events", "max.events.per.epoch": "0"})
    assert "reserved" in problems({"path": "events"}, (Column("_op", "STRING"),))
    assert "'earliest'" in problems({"path": "events", "scan.startup.mode": "newest"})
    assert "did you mean 'scan.startup.mode'" in problems({"path": "events", "scan.startup": "latest"})

    assert log_source(tmp_path).config.directory == tmp_path / "events"
    assert log_source(tmp_path, path=str(tmp_path / "abs")).config.directory == tmp_path / "abs"
    with pytest.raises(EpochalError, match="format"):
        log_source(tmp_path, format="avro")


def test_registry_knows_every_connector():
    assert set(SOURCE_CONNECTORS) == {"nexmark", "log", "posix_fs", "postgres-cdc", "mysql-cdc"}
    assert connector_spec("nexmark").name == "nexmark"
    assert connector_spec("Log").name == "log"
    assert connector_spec("kafka") is None


def test_log_fields_go_by_the_spelling_the_ddl_gave(spark, tmp_path):
    """SQL names are case-insensitive, JSON keys are not: a column declared `customerId` is the
    table's `customerid`, read from the record's "customerId" key. It used to read NULL silently,
    and a camelCase PRIMARY KEY sent every record to the dead letters."""
    from epochal.pipeline.loader import load_pipeline

    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    (pipeline / "sources.sql").write_text(
        "CREATE TABLE orders (orderId BIGINT PRIMARY KEY, customerId BIGINT, Channel STRING) "
        "WITH (connector = 'log', path = 'events', format = 'json');\n"
        "CREATE TABLE plain (customerId BIGINT, Channel STRING) "
        "WITH (connector = 'log', path = 'events', format = 'json');\n"
    )
    loaded = load_pipeline(pipeline)
    orders = loaded.sources["orders"]
    assert [(c.name, c.key) for c in orders.columns] == [
        ("orderid", "orderId"), ("customerid", "customerId"), ("channel", "Channel")
    ]
    assert tuple(orders.primary_key) == ("orderid",)
    lines = [
        '{"orderId": 1, "customerId": 7, "Channel": "web"}',
        '{"orderId": 2, "customerId": "seven", "Channel": "app"}',
        '{"orderId": 1, "_op": "delete"}',
    ]
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "0.jsonl").write_text("".join(line + "\n" for line in lines))
    spec = LogConnectorSpec()
    keyed = spec.create(orders, tmp_path)
    ranges = keyed.plan({})
    batch = keyed.read(spark, ranges)
    assert [tuple(r)[:4] for r in batch.rows.orderBy("_offset").collect()] == [
        (1, 7, "web", "upsert"), (1, None, None, "delete")
    ]
    assert [r.reason for r in batch.dead_letters.collect()] == ["""field 'customerId': expected BIGINT, got "seven\""""]
    plain = spec.create(loaded.sources["plain"], tmp_path).read(spark, ranges).rows
    assert sorted(tuple(r) for r in plain.collect() if r.customerid is not None) == [(7, "web")]
    assert plain.columns == ["customerid", "channel"]
