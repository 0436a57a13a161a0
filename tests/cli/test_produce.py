"""`epochal produce`: records split as the log reader splits them, and refused before anything is
written when the reader would only make dead letters of them."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from epochal.cli.main import main
from epochal.connectors.base import SplitRange
from epochal.connectors.log import LogConnectorSpec, LogSource
from epochal.connectors.log_driver import read_or_decline
from epochal.pipeline.loader import load_pipeline

PIPELINE = """
CREATE SOURCE notes (id BIGINT, note STRING) WITH (connector = 'log', path = 'data/notes');
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "p.sql").write_text(PIPELINE)
    monkeypatch.setenv("EPOCHAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EPOCHAL_PIPELINE", str(tmp_path / "pipeline"))
    return tmp_path / "home"


def produce(monkeypatch: pytest.MonkeyPatch, data: bytes) -> int:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    return main(["produce", "notes"])


def notes_source(home: Path) -> LogSource:
    pipeline = load_pipeline(Path(str(home).removesuffix("home")) / "pipeline")
    return LogConnectorSpec().create(pipeline.sources["notes"], home)


def test_a_record_with_unicode_line_separators_stays_one_record(monkeypatch, home: Path, spark) -> None:
    """U+2028, U+2029 and U+0085 are legal unescaped in a JSON string (JSON.stringify leaves them);
    str.splitlines() cut the record there and made two dead letters of it."""
    note = "a\u2028b\u2029c\x85d"
    records = [json.dumps({"id": 1, "note": note}, ensure_ascii=False), '{"id": 2, "note": "crlf"}']
    assert produce(monkeypatch, ("\n".join(records[:1]) + "\n" + records[1] + "\r\n").encode()) == 0

    source = notes_source(home)
    assert source.plan({}) == [SplitRange("0", 0, 2)]  # two lines, not four
    on_driver = read_or_decline(source, [SplitRange("0", 0, 2)])
    assert on_driver.to_pylist() == [{"id": 1, "note": note}, {"id": 2, "note": "crlf"}]
    batch = source.read(spark, [SplitRange("0", 0, 2)])
    assert sorted(tuple(r) for r in batch.rows.collect()) == [(1, note), (2, "crlf")]
    assert batch.rejected is None or batch.rejected.count() == 0


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b'{"id": 1}\nnot json\n', "line 2 is not a record: it is not JSON"),
        (b'{"id": 1}\n\n[1, 2]\n', "line 3 is not a record: it is JSON but not an object (got list)"),
        (b'{"id": 1}\n' + b"[" * 100_000 + b"\n", "line 2 is not a record: it nests too deeply"),
        (b'{"id": 1}\n{"note": "caf\xe9"}\n', "not UTF-8 text: line 2 has byte 0xe9"),
    ],
)
def test_bad_records_are_refused_by_line_and_nothing_is_written(
    monkeypatch, capsys, home: Path, data: bytes, named: str
) -> None:
    assert produce(monkeypatch, data) != 0
    error = capsys.readouterr().err
    assert named in error and "Traceback" not in error
    assert not (home / "data" / "notes").exists()  # the good line before it was not written either


def test_a_keyed_record_without_its_key_or_with_an_odd_op_is_refused(monkeypatch, capsys, tmp_path: Path) -> None:
    """A keyed table's reader sends such records to the dead letters; produce says so first."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "p.sql").write_text(
        "CREATE TABLE notes (orderId BIGINT, note STRING, PRIMARY KEY (orderId)) "
        "WITH (connector = 'log', path = 'data/notes');\n"
    )
    monkeypatch.setenv("EPOCHAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EPOCHAL_PIPELINE", str(tmp_path / "pipeline"))
    good = '{"orderId": 1, "note": "x"}\n{"orderId": 1, "_op": "DELETE"}\n{"orderId": 2, "_op": null}\n'
    for bad, named in [
        ('{"orderid": 3}\n', "line 4 is not a record: the key field 'orderId' is missing or null"),
        ('{"orderId": 3, "_op": "remove"}\n', 'line 4 is not a record: _op is "remove", not an operation: use one of'),
        ('{"orderId": 3, "_op": 5}\n', "line 4 is not a record: _op is 5, not an operation"),
    ]:
        assert produce(monkeypatch, (good + bad).encode()) != 0
        assert named in capsys.readouterr().err
    assert not (tmp_path / "home" / "data" / "notes").exists()
    assert produce(monkeypatch, good.encode()) == 0
    assert (tmp_path / "home" / "data" / "notes" / "0.jsonl").read_text() == good
