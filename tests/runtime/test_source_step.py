"""A source's step on Spark: what it costs in reads of the log, with its results unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epochal.connectors import log_lines_spark
from epochal.connectors.log import append_records
from epochal.runtime.one_epoch import run_epoch
from epochal.storage.state_reader import StateReader
from tests.epochal_harness import make_harness


def _rows(runtime, table: str) -> list[tuple]:  # noqa: ANN001
    return sorted(tuple(r) for r in runtime.state(table).collect())


def _dead_letters(runtime) -> list[tuple]:  # noqa: ANN001
    from epochal.query.cut import run_query

    return run_query(runtime, 'SELECT "offset", raw, reason FROM t__dead_letters ORDER BY 1')[1]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "append-only"])
def test_a_big_epoch_reads_and_parses_its_lines_once(spark, tmp_path: Path, monkeypatch, keyed: bool) -> None:
    """Issue 58: the step wrote the change and then asked whether a line was rejected, and a keyed
    source asked for the touched keys' vnodes and earlier rows too; each question read and parsed
    every line of the epoch again (a 300,000-line keyed epoch read them five times). Lines are
    counted as Spark reads them; each is read once, and the rows and dead letters stay as they were."""
    key = " PRIMARY KEY" if keyed else ""
    h = make_harness(
        tmp_path,
        {"t.sql": f"CREATE TABLE t (id BIGINT{key}, v STRING) WITH (connector = 'log', path = 'data/t');"},
    )
    runtime = h.runtime(spark, {"EPOCHAL_DRIVER_ROWS": "0"})  # a big epoch: Spark's
    data = h.home / "data" / "t"
    append_records(data, [json.dumps({"id": i, "v": f"a{i}"}) for i in range(6)] + ['{"id": 9, "v": '])
    run_epoch(runtime)
    assert _dead_letters(runtime) == [(6, '{"id": 9, "v": ', "malformed JSON")]

    read = spark.sparkContext.accumulator(0)
    original = log_lines_spark.read_lines

    def counted(session, pieces):  # noqa: ANN001, ANN202
        lines = original(session, pieces)

        def tick(row):  # noqa: ANN001, ANN202
            read.add(1)
            return row

        return session.createDataFrame(lines.rdd.map(tick), lines.schema)

    monkeypatch.setattr(log_lines_spark, "read_lines", counted)
    restricted = []
    read_state = StateReader.read_state

    def spied(self, table, epoch, inclusive, restrict=None, cached=True, keys_at_most=None):  # noqa: ANN001, ANN202
        if table == "t" and not inclusive:  # the source step's read of the rows before its epoch
            restricted.append(restrict is not None)
        return read_state(self, table, epoch, inclusive, restrict, cached, keys_at_most)

    monkeypatch.setattr(StateReader, "read_state", spied)
    # updates of earlier ids (a keyed source looks up their rows) and new ids, no dead letter
    second = [json.dumps({"id": i, "v": f"b{i}"}) for i in range(3, 9)]
    append_records(data, second)
    run_epoch(runtime)
    assert read.value == len(second)
    assert _dead_letters(runtime) == [(6, '{"id": 9, "v": ', "malformed JSON")]
    expected = [(i, f"a{i}") for i in range(3 if keyed else 6)] + [(i, f"b{i}") for i in range(3, 9)]
    assert _rows(runtime, "t") == sorted(expected)
    if not keyed:
        return
    # 6 records over 6 stored rows: the state is read whole, not restricted to the keys
    assert restricted == [False]
    # 2 records over 9 stored rows: only the touched keys' rows are looked up
    third = [json.dumps({"id": 0, "v": "c0"}), json.dumps({"id": 4, "_op": "delete"})]
    append_records(data, third)
    run_epoch(runtime)
    assert read.value == len(second) + len(third)
    assert restricted == [False, True]
    expected = [(0, "c0"), (1, "a1"), (2, "a2"), (3, "b3")] + [(i, f"b{i}") for i in range(5, 9)]
    assert _rows(runtime, "t") == expected
