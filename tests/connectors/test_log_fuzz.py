"""Random and adversarial input to the log format's writer and reader, without Spark: what
`epochal produce` accepts (split, UTF-8 and JSON checks) and the driver's record parser. Nothing
may escape as a traceback: only EpochalError naming the line, or the driver reader's Declined
(the epoch then goes to Spark, whose own reader turns the line into a dead letter)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.connectors.base import SplitRange
from epochal.connectors.log import LogConnectorSpec, LogSource, append_records, check_records, record_lines
from epochal.connectors.log_driver import Declined, read_or_decline
from epochal.errors import EpochalError
from epochal.pipeline.model import Column, Location, SourceDef

#: TESTS_FUZZ_EXAMPLES=5000 searches deeper (minutes); the default keeps the file to seconds
FUZZ = settings(
    max_examples=int(os.environ.get("TESTS_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: characters that other tools take for line breaks, quotes and escapes, NUL, a lone surrogate's
#: escape, and the byte order mark
NASTY = "\n\r\u2028\u2029\x85\x0b\x0c\x00\"'`\\{}[]:,\ufeff\u00e9\U0001f600"
texts = st.text(alphabet=st.one_of(st.sampled_from(NASTY), st.characters()), max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=12
)
records = st.dictionaries(
    st.one_of(st.sampled_from(["id", "note", "_op", "ID", "_weight", "__epochal_corrupt_record"]), texts),
    json_values,
    max_size=5,
)
#: a line as a producer might send it: a record as JSON.stringify writes it, or anything at all
adversarial_lines = st.one_of(
    records.map(lambda r: json.dumps(r, ensure_ascii=False)),
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False)),
    texts,
    st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 3000)),
    st.builds(lambda n: '{"id": ' + "9" * n + "}", st.integers(1, 6000)),
    st.sampled_from(["", " ", "{", '{"id": 1', "null", "NaN", '{"id": NaN}', '{"id": 1}{"id": 2}', '"\\ud800"']),
)
COLUMNS = (Column("id", "BIGINT"), Column("note", "STRING"), Column("ok", "BOOLEAN"))


def log_source(home: Path, keyed: bool) -> LogSource:
    definition = SourceDef(
        name="notes",
        columns=COLUMNS,
        connector="log",
        options={"connector": "log", "path": "notes"},
        location=Location("p.sql", 1),
        kind="table" if keyed else "source",
        primary_key=("id",) if keyed else (),
    )
    return LogConnectorSpec().create(definition, home)


@FUZZ
@given(st.lists(adversarial_lines, max_size=6), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_produce_refuses_by_line_or_writes_each_record_as_one_line(lines, ending, keyed) -> None:
    """What produce accepts is written one record per line, and the reader counts exactly those
    lines; what it refuses it refuses by line number with nothing written."""
    data = "".join(line + ending for line in lines).encode("utf-8", errors="surrogatepass")
    with tempfile.TemporaryDirectory() as home:
        try:
            split = record_lines(data)
            check_records(split, keys=("id",) if keyed else ())
        except EpochalError as exc:
            assert "line" in str(exc) or "UTF-8" in str(exc)
            return
        assert all("\n" not in line for line in split)
        written = append_records(Path(home) / "notes", split)
        assert written == sum(1 for line in split if line.strip())
        if written:
            source = log_source(Path(home), keyed)
            (planned,) = source.plan({})
            assert planned.end == written  # one line per record: nothing split at U+2028 or \r
            try:
                table = read_or_decline(source, [planned])
            except Declined:
                return
            except EpochalError:
                return
            assert table.num_rows <= written


@FUZZ
@given(st.lists(adversarial_lines, min_size=1, max_size=6), st.booleans())
def test_the_driver_reader_parses_or_declines_any_line(lines, keyed) -> None:
    """Lines written past produce (another writer, a half-written line): the driver's parser
    returns rows or declines; it never raises anything else."""
    with tempfile.TemporaryDirectory() as home:
        directory = Path(home) / "notes"
        directory.mkdir()
        (directory / "0.jsonl").write_bytes(
            "".join(line.replace("\n", " ") + "\n" for line in lines).encode("utf-8", errors="surrogatepass")
        )
        source = log_source(Path(home), keyed)
        try:
            table = read_or_decline(source, [SplitRange("0", 0, len(lines))])
        except (Declined, EpochalError):
            return
        assert table.num_rows <= len(lines)
        assert table.column_names[:3] == ["id", "note", "ok"]


@FUZZ
@given(st.binary(max_size=200))
def test_produce_reads_any_bytes_or_names_the_line(data: bytes) -> None:
    try:
        check_records(record_lines(data, "the input"))
    except EpochalError as exc:
        assert "line" in str(exc)


@FUZZ
@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.integers(-(2**63), 2**63 - 1), "note": st.text(st.characters(exclude_categories=("Cs",)))}
        ),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_what_produce_accepts_reads_back_as_the_same_rows(rows, ascii_only) -> None:
    """Any note, U+2028, U+0085, NUL and \\r included, as JSON.stringify (or json.dumps) writes it:
    one record, one row, the same values."""
    data = "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows).encode()
    with tempfile.TemporaryDirectory() as home:
        lines = record_lines(data)
        check_records(lines)
        assert append_records(Path(home) / "notes", lines) == len(rows)
        source = log_source(Path(home), keyed=False)
        assert source.plan({}) == [SplitRange("0", 0, len(rows))]
        table = read_or_decline(source, [SplitRange("0", 0, len(rows))])
        assert table.select(["id", "note"]).to_pylist() == rows
