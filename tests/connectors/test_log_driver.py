"""The driver path of a log source (epochal/connectors/log_driver.py): the rows Spark reads, or None.

Every test compares with ``LogSource.read`` on the shared SparkSession: an accepted read must give
Spark's rows (names, types, values, as multisets) and Spark must have no dead letter for it; a
declined line is read by Spark too, to document what Spark makes of it (a dead letter, or a row the
driver could not be sure to reproduce)."""

from __future__ import annotations

import json
import math
import random
import struct
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from epochal.connectors.base import SplitRange
from epochal.connectors.log import LogConfig, LogSource, append_records
from epochal.connectors.log_driver import Declined, read_on_driver, read_or_decline
from epochal.pipeline.model import Column

#: Spark's type (simpleString) -> the Arrow types the driver may give for it
ARROW_TYPES = {
    "bigint": {"int64"},
    "int": {"int32"},
    "smallint": {"int16"},
    "tinyint": {"int8"},
    "double": {"double"},
    "string": {"string", "large_string"},
    "boolean": {"bool"},
    "timestamp": {"timestamp[us, tz=UTC]"},
    "date": {"date32[day]"},
}
TYPED = (
    Column("b", "BIGINT"),
    Column("i", "INT"),
    Column("sm", "SMALLINT"),
    Column("t", "TINYINT"),
    Column("d", "DOUBLE"),
    Column("s", "STRING"),
    Column("flag", "BOOLEAN"),
    Column("camel", "BIGINT", spelled="Camel"),  # the record's key is the DDL's spelling
)


def source(directory: Path, columns: tuple[Column, ...] = TYPED, key: tuple[str, ...] = ()) -> LogSource:
    return LogSource(LogConfig(directory), columns, key)


def comparable(value: object) -> object:
    # repr tells -0.0 from 0.0, and a Decimal's scale (Decimal("1.5") == Decimal("1.50"))
    return repr(value) if isinstance(value, float | Decimal) else value


def arrow_types(spark_type: str) -> set[str]:
    if spark_type.startswith("decimal("):
        return {"decimal128(" + spark_type.removeprefix("decimal(").replace(",", ", ")}
    return ARROW_TYPES[spark_type]


def as_numbers(df):
    """``df`` with its TIMESTAMP columns as microseconds from 1970 UTC and its DATE columns as days:
    collect() would give naive datetimes in the Python process's time zone, and fail past year 9999."""
    from pyspark.sql import functions as F

    kinds = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    as_number = {"timestamp": F.unix_micros, "date": F.unix_date}
    return df.select(*[as_number[kinds[c]](c).alias(c) if kinds[c] in as_number else c for c in df.columns])


def assert_same_as_spark(spark, src: LogSource, ranges: list[SplitRange]) -> int:
    """The driver's table is Spark's rows; returns how many."""
    table = read_or_decline(src, ranges)
    batch = src.read(spark, ranges)
    assert batch.rejected.count() == 0  # the driver accepted: there must be no dead letter to lose
    df = batch.rows
    assert table.column_names == df.columns
    for field, arrow_type in zip(df.schema.fields, table.schema.types, strict=True):
        assert str(arrow_type) in arrow_types(field.dataType.simpleString()), field
    numbers = {"timestamp[us, tz=UTC]": pa.int64(), "date32[day]": pa.int32()}  # as as_numbers gives Spark's
    table = pa.table([c.cast(numbers.get(str(c.type), c.type)) for c in table.columns], names=table.column_names)
    spark_rows = Counter(tuple(map(comparable, row)) for row in as_numbers(df).collect())
    driver_rows = Counter(tuple(map(comparable, row.values())) for row in table.to_pylist())
    assert driver_rows == spark_rows
    return table.num_rows


def test_records_of_every_accepted_type(spark, tmp_path):
    lines = [
        '{"b": 9223372036854775807, "i": 2147483647, "sm": 32767, "t": 127, "d": 1, "s": "a", "flag": true, '
        '"Camel": 1}',
        '{"b": -9223372036854775808, "i": -2147483648, "sm": -32768, "t": -128, "d": -0, "s": "", "flag": false}',
        '{"Camel": -0, "flag": null, "s": null, "d": null, "t": null, "sm": null, "i": null, "b": null}',  # key order
        "{}",
        '  {"b": 0, "d": -0.0}  ',
        '{"d": 1.7976931348623157e308, "s": "h\\u00e9llo w\\u00f6rld \\u2713 \\ud83d\\ude00 caf\u00e9 '
        '\u65e5\u672c \U0001f600"}',
        '{"d": 4.9e-324, "s": "\\"\\\\\\/\\b\\f\\n\\r\\t"}',
        '{"d": 1e-400, "s": "nul \\u0000 inside"}',  # underflow: 0.0 in both
        '{"d": 123456789012345678901234567890, "s": "x"}',
        '{"d": 9007199254740993, "s": "2^53 + 1 rounds to even"}',
        '{"d": 0.1, "b": 5}',
        '{"d": 2.5E-3, "b": 6}',
        '{"d": 1' + "0" * 300 + ', "b": 7}',  # 1e300 written as an integer
        '{"d": 0.30000000000000004441, "b": 8}',
        # extra keys are ignored whatever they hold, _op too in a source without a key
        '{"b": 9, "extra": {"nested": [1, 2.5, "x", null, {"deep": "\\ud800"}]}, "_op": 5, "Other": 1e400}',
        '{"b": 10, "big": ' + "7" * 400 + "}",
    ]
    append_records(tmp_path, lines)
    assert assert_same_as_spark(spark, source(tmp_path), [SplitRange("0", 0, len(lines))]) == len(lines)


def test_random_values_read_alike(spark, tmp_path):
    rng = random.Random(20240611)
    alphabet = 'aZ09 "\\/\b\f\n\r\t\x00\x1f\x7f\u00e9\u2028\u2029\ufffd\U0001f600\U00010000\uffff'

    def double() -> float:
        while not math.isfinite(value := struct.unpack("<d", rng.randbytes(8))[0]):
            pass
        return value

    lines = []
    for n in range(2000):
        record = {
            "b": rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000)]),
            "i": rng.randint(-(2**31), 2**31 - 1),
            "sm": rng.randint(-(2**15), 2**15 - 1),
            "t": rng.randint(-128, 127),
            "s": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))),
            "flag": rng.random() < 0.5,
        }
        for name in rng.sample(sorted(record), rng.randint(0, 2)):
            if rng.random() < 0.5:
                record[name] = None  # an explicit null
            else:
                del record[name]  # a missing key
        text = json.dumps(record, ensure_ascii=n % 2 == 0)
        d = double()
        # shortest repr, or more digits than a double holds (both parsers round correctly), or an integer
        written = rng.choice([repr(d), f"{d:.25e}", str(rng.randint(-(10**25), 10**25))])
        lines.append(text[:-1] + f', "d": {written}}}')
    append_records(tmp_path, lines)
    assert assert_same_as_spark(spark, source(tmp_path), [SplitRange("0", 0, len(lines))]) == len(lines)


TIMES = (
    Column("id", "BIGINT"),
    Column("ts", "TIMESTAMP"),
    Column("day", "DATE"),
    Column("amount", "DECIMAL(10,2)"),
    Column("big", "DECIMAL(38,0)"),
    Column("tiny", "DECIMAL(5,5)"),
    Column("d", "DOUBLE"),
)


def test_timestamps_dates_and_decimals(spark, tmp_path):
    lines = [
        '{"id": 1, "ts": "2026-01-01T10:01:00", "day": "2026-01-01", "amount": 1, "big": 0, "tiny": 0}',
        '{"id": 2, "ts": "2026-01-01T10:01:00Z", "day": "2024-02-29", "amount": -1.5, "tiny": 0.12345}',
        '{"id": 3, "ts": "2026-01-01T10:01:00.1", "day": "2000-02-29", "amount": 1.50, "tiny": -0.99999}',
        '{"id": 4, "ts": "2026-01-01T10:01:00.123456", "day": "0001-01-01", "amount": 1.500, "big": -0}',
        # digits past the microsecond are dropped, also before 1970 (-1 microsecond, not -2)
        '{"id": 5, "ts": "2026-01-01T10:01:00.1234567", "day": "9999-12-31", "amount": 99999999.99}',
        '{"id": 6, "ts": "1969-12-31T23:59:59.999999999Z", "day": "1582-10-10", "amount": -99999999.99}',
        '{"id": 7, "ts": "2026-01-01T10:01:00+02:00", "day": "1969-12-31", "amount": 1e2, "d": 0.1}',
        '{"id": 8, "ts": "2026-01-01T10:01:00-05:30", "amount": 1.5E1, "d": -0.0}',
        '{"id": 9, "ts": "2026-01-01T10:01:00+0200", "amount": 15e-1, "d": 1e-400}',
        '{"id": 10, "ts": "2026-01-01T10:01:00-0530", "amount": 1e-2, "d": 9007199254740993.0}',
        '{"id": 11, "ts": "2026-01-01T10:01:00+05", "amount": -0.0, "d": 1.7976931348623157e308}',
        '{"id": 12, "ts": "2026-01-01T10:01:00.5+18:00", "amount": -0.00, "d": 4.9e-324}',
        '{"id": 13, "ts": "2026-01-01T10:01:00.000001-18:00", "amount": 0e5, "d": 2.5E-3}',
        '{"id": 14, "ts": "2026-01-01T10:01:00+00:00", "amount": 0e-5, "d": 0.30000000000000004441}',
        '{"id": 15, "ts": "2026-01-01T10:01:00-00:00", "big": 99999999999999999999999999999999999999}',
        '{"id": 16, "ts": "2026-01-01 10:01:00", "big": -99999999999999999999999999999999999999}',
        '{"id": 17, "ts": "2026-01-01 23:59:59.999999999+01:00", "big": 1e37, "tiny": 0.99999}',
        '{"id": 18, "ts": "2026-01-01", "big": 12345678901234567890123456789012345678.000}',
        '{"id": 19, "ts": "2024-02-29T00:00:00Z", "tiny": 1e-5}',
        '{"id": 20, "ts": "0001-01-01T00:00:00Z"}',
        '{"id": 21, "ts": "9999-12-31T23:59:59.999999Z"}',
        '{"id": 22, "ts": "0001-01-01T01:59:59+01:59"}',  # 00:00:59 UTC: just in year 1
        '{"id": 23, "ts": "1582-10-10T00:00:00Z"}',  # proleptic Gregorian in both
        '{"id": 24, "ts": 0}',  # integers are seconds from 1970
        '{"id": 25, "ts": 1767261660}',
        '{"id": 26, "ts": -62135596800}',
        '{"id": 27, "ts": 253402300799}',
        '{"id": 28, "ts": "\\u0032026-01-01T10:01:00\\u005a"}',  # escapes: the same string to both parsers
        '{"id": 29, "ts": null, "day": null, "amount": null, "big": null, "tiny": null, "d": null}',
    ]
    append_records(tmp_path, lines)
    src = source(tmp_path, TIMES)
    assert assert_same_as_spark(spark, src, [SplitRange("0", 0, len(lines))]) == len(lines)
    table = read_or_decline(src, [SplitRange("0", 6, 7)])  # id 7
    utc = datetime(2026, 1, 1, 8, 1, tzinfo=UTC)
    assert table.to_pylist()[0] | {"d": None} == {
        "id": 7,
        "ts": utc,
        "day": date(1969, 12, 31),
        "amount": Decimal("100.00"),
        "big": None,
        "tiny": None,
        "d": None,
    }


def test_timestamps_in_a_keyed_source(spark, tmp_path):
    columns = (Column("at", "TIMESTAMP"), Column("day", "DATE"), Column("v", "DECIMAL(4,1)"))
    lines = [
        '{"at": "2026-01-01T10:00:00Z", "day": "2026-01-01", "v": 1.5}',
        '{"at": "2026-01-01T12:00:00+02:00", "day": "2026-01-01", "v": 2}',  # the same key as the first
        '{"at": "2026-01-01T10:00:00.5Z", "day": "2026-01-02", "_op": "delete", "v": 1.55}',  # ignored: a delete
        '{"at": 1767261600, "day": "2026-01-03", "_op": "delete", "v": "x"}',
    ]
    append_records(tmp_path, lines)
    src = source(tmp_path, columns, ("at", "day"))
    assert assert_same_as_spark(spark, src, [SplitRange("0", 0, 4)]) == 4


def random_instant(rng: random.Random) -> tuple[str, int]:
    """A TIMESTAMP string of a random accepted form, and its microseconds from 1970 UTC."""
    first, last = datetime(1, 1, 2), datetime(9999, 12, 30)  # a day's margin for the offset
    local = first + timedelta(microseconds=rng.randrange((last - first) // timedelta(microseconds=1)))
    if rng.random() < 0.1:
        local = local.replace(hour=0, minute=0, second=0, microsecond=0)
        return f"{local.year:04d}-{local:%m-%d}", (local - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    text = f"{local.year:04d}-{local:%m-%d}{rng.choice('T ')}{local:%H:%M:%S}"
    digits = rng.randint(0, 9)
    if digits:  # past 6, digits Spark drops
        text += "." + (f"{local.microsecond:06d}" + "".join(rng.choice("0123456789") for _ in range(3)))[:digits]
    local = local.replace(microsecond=int(f"{local.microsecond:06d}"[:digits].ljust(6, "0")))
    minutes = rng.choice([0, 0, rng.randint(-18 * 60, 18 * 60), rng.choice([-18 * 60, 18 * 60])])
    hours, rest = divmod(abs(minutes), 60)
    sign = "-" if minutes < 0 else "+"
    form = rng.choice(["none", "Z", "+HH:MM", "+HHMM", "+HH"] if rest == 0 else ["+HH:MM", "+HHMM"])
    text += {
        "none": "",
        "Z": "Z",
        "+HH:MM": f"{sign}{hours:02d}:{rest:02d}",
        "+HHMM": f"{sign}{hours:02d}{rest:02d}",
    }.get(form, f"{sign}{hours:02d}")
    if form in ("none", "Z"):
        minutes = 0
    utc = local - timedelta(minutes=minutes)
    return text, (utc - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def test_random_timestamps_dates_and_decimals_read_alike(spark, tmp_path):
    rng = random.Random(20261206)
    lines, micros = [], []
    for _ in range(2000):
        text, expected = random_instant(rng)
        micros.append(expected)
        day = date.fromordinal(rng.randint(1, date.max.toordinal()))
        # DECIMAL(10,2): any value it holds, as 123.45, 123.4500, 12345e-2, 1.2345E2 or an integer
        unscaled = rng.choice(
            [rng.randint(-(10**10) + 1, 10**10 - 1), rng.randint(-999, 999), 100 * rng.randint(-99, 99)]
        )
        exact = Decimal(unscaled).scaleb(-2)
        forms = [f"{exact}", f"{exact}" + "0" * rng.randint(1, 3), f"{unscaled}e-2", f"{exact:E}"]
        amount = rng.choice(forms + ([str(unscaled // 100)] if unscaled % 100 == 0 else []))
        big = rng.randint(-(10**38) + 1, 10**38 - 1)
        record = {"id": len(lines), "ts": text, "day": f"{day.year:04d}-{day:%m-%d}"}
        lines.append(json.dumps(record)[:-1] + f', "amount": {amount}, "big": {big}, "d": {rng.random() * 1e6!r}}}')
    append_records(tmp_path, lines)
    src = source(tmp_path, TIMES)
    assert assert_same_as_spark(spark, src, [SplitRange("0", 0, len(lines))]) == len(lines)
    table = read_or_decline(src, [SplitRange("0", 0, len(lines))])  # and each is the instant written
    assert table.column("ts").cast(pa.int64()).to_pylist() == micros


def test_splits_and_ranges_starting_mid_file(spark, tmp_path):
    columns = (Column("id", "BIGINT"), Column("s", "STRING"))
    for split, count in (("a", 30), ("b-eu", 5), ("c.2", 12)):
        append_records(tmp_path, [json.dumps({"id": i, "s": f"{split}/{i}"}) for i in range(count)], split)
    src = source(tmp_path, columns)
    assert src.plan({}) == [SplitRange("a", 0, 30), SplitRange("b-eu", 0, 5), SplitRange("c.2", 0, 12)]
    ranges = [SplitRange("a", 17, 29), SplitRange("b-eu", 5, 5), SplitRange("c.2", 3, 4)]
    assert assert_same_as_spark(spark, src, ranges) == 13
    assert assert_same_as_spark(spark, src, [SplitRange("a", 0, 0)]) == 0  # nothing to read: an empty table


def test_crlf_blank_lines_and_bytes_that_are_not_utf8(spark, tmp_path):
    (tmp_path / "0.jsonl").write_bytes(
        b'{"id": 1, "s": "crlf"}\r\n'
        b"\r\n"
        b"   \n"
        b"\t\x0b\x0c \r\n"  # Java's \s: blank for Spark too
        b'{"id": 2, "s": "a\xffb"}\n'  # not UTF-8: U+FFFD on both paths
        b'\t{"id": 3}\r\r\n'
        b"\n"
    )
    src = source(tmp_path, (Column("id", "BIGINT"), Column("s", "STRING")))
    assert src.plan({}) == [SplitRange("0", 0, 7)]
    assert assert_same_as_spark(spark, src, [SplitRange("0", 0, 7)]) == 3
    assert assert_same_as_spark(spark, src, [SplitRange("0", 1, 4)]) == 0  # only blank lines


def test_keyed_records_upsert_and_delete(spark, tmp_path):
    columns = (Column("id", "BIGINT"), Column("part", "STRING"), Column("v", "DOUBLE"), Column("n", "INT"))
    key = ("id", "part")
    append_records(
        tmp_path,
        [
            '{"id": 1, "part": "x", "v": 1.5, "n": 1}',
            '{"id": 1, "part": "x", "v": 2.5, "_op": "update"}',  # the same key again
            '{"_op": "INSERT", "id": 2, "part": "y", "v": 3}',
            '{"id": 3, "part": "x", "_op": null, "n": null}',
            '{"id": 4, "part": "z", "_op": "Upsert", "n": 7}',
            '{"id": 1, "part": "x", "_op": "delete"}',
            '{"id": 2, "part": "y", "_op": "DELETE", "v": "not a number", "n": 1.5}',  # ignored: still a delete
            '{"id": 5, "part": "q", "_op": "DeLeTe", "v": 1e400, "n": "\\ud800", "extra": [1]}',
            '{"id": 4, "part": "z", "_op": "delete", "v": 1}',
        ],
    )
    append_records(tmp_path, ['{"id": 1, "part": "x", "_op": "upsert", "v": -0.0}', '{"id": 9, "part": ""}'], "other")
    src = source(tmp_path, columns, key)
    ranges = [SplitRange("0", 0, 9), SplitRange("other", 0, 2)]
    assert assert_same_as_spark(spark, src, ranges) == 11
    assert assert_same_as_spark(spark, src, [SplitRange("0", 5, 8)]) == 3  # deletes alone, from mid-file
    table = read_or_decline(src, [SplitRange("0", 6, 7)])
    delete = {"id": 2, "part": "y", "v": None, "n": None, "_op": "delete", "_split": "0", "_offset": 6}
    assert table.to_pylist() == [delete]


COLUMNS = (Column("id", "BIGINT"), Column("s", "STRING"), Column("d", "DOUBLE"), Column("t", "TINYINT"))
COLUMNS += (Column("n", "INT"), Column("flag", "BOOLEAN"))
DEAD = "a dead letter"
SKIPPED = "skipped as a blank line"
KEYED = ("id",)

# (case, line, primary key, why the driver declines (a regex), what Spark makes of the line: DEAD,
# SKIPPED, or {column: value} of its row)
DECLINED = [
    ("malformed", '{"id": 1', (), "not valid JSON", DEAD),
    ("trailing comma", '{"id": 1,}', (), "not valid JSON", DEAD),
    ("array", '[{"id": 1}]', (), "an array, not a JSON object", DEAD),
    ("null line", "null", (), "null, not a JSON object", DEAD),
    ("number line", "1", (), "an integer, not a JSON object", DEAD),
    ("a line of U+2028 alone", "\u2028", (), "not JSON", SKIPPED),  # Java's $ matches before it
    ("byte order mark", '\ufeff{"id": 1}', (), "not JSON", DEAD),
    ("string into BIGINT", '{"id": "1"}', (), "'id': a string into BIGINT", DEAD),
    ("1.0 into BIGINT", '{"id": 1.0}', (), "'id': a number with a fraction or exponent into BIGINT", DEAD),
    ("1.5 into BIGINT", '{"id": 1.5}', (), "'id': a number with a fraction", DEAD),
    ("1e2 into BIGINT", '{"id": 1e2}', (), "'id': a number with a fraction or exponent", DEAD),
    ("true into BIGINT", '{"id": true}', (), "'id': a boolean into BIGINT", DEAD),
    ("BIGINT out of range", '{"id": 9223372036854775808}', (), "out of BIGINT's range", DEAD),
    ("INT out of range", '{"n": -2147483649}', (), "out of INT's range", DEAD),
    ("TINYINT 256", '{"t": 256}', (), "out of TINYINT's range", DEAD),
    ("TINYINT 200 wraps in Spark", '{"t": 200}', (), "out of TINYINT's range", {"t": -56}),
    ("string into DOUBLE", '{"d": "1.5"}', (), "'d': a string into DOUBLE", DEAD),
    ("'NaN' string into DOUBLE", '{"d": "NaN"}', (), "'d': a string into DOUBLE", {"d": math.nan}),
    ("NaN literal", '{"d": NaN}', (), "holds NaN", {"d": math.nan}),
    ("NaN in an extra key", '{"id": 1, "x": NaN}', (), "holds NaN", {"id": 1}),
    ("1e400 into DOUBLE", '{"d": 1e400}', (), "past DOUBLE's range", {"d": math.inf}),
    ("huge integer into DOUBLE", '{"d": ' + "9" * 400 + "}", (), "past DOUBLE's range", {"d": math.inf}),
    ("number into STRING", '{"s": 1.50}', (), "'s': a number with a fraction or exponent into STRING", {"s": "1.5"}),
    ("object into STRING", '{"s": {"a": [1, 2]}}', (), "'s': an object into STRING", {"s": '{"a":[1,2]}'}),
    ("lone surrogate into STRING", '{"s": "a\\ud800"}', (), "lone surrogate", {"s": "a?"}),
    ("number into BOOLEAN", '{"flag": 1}', (), "'flag': an integer into BOOLEAN", DEAD),
    ("string into BOOLEAN", '{"flag": "true"}', (), "'flag': a string into BOOLEAN", DEAD),
    ("duplicate key", '{"id": 1, "id": 2}', (), "duplicate key", {"id": 2}),
    ("case-variant key", '{"ID": 1}', (), "key 'ID'", {"id": None}),
    ("the corrupt-record field", '{"id": 1, "__epochal_corrupt_record": "x"}', (), "reserved", {"id": 1}),
    ("single quotes", "{'id': 1}", (), "not valid JSON", {"id": 1}),
    ("text after the object", '{"id": 1} x', (), "more than one JSON value", {"id": 1}),
    ("a 1001-digit integer", '{"id": 1, "x": ' + "1" * 1001 + "}", (), "Jackson's limits", DEAD),
    ("nested 1001 deep", '{"id": 1, "x": ' + "[" * 1000 + "]" * 1000 + "}", (), "Jackson's limits", DEAD),
    ("a 50001-character key", '{"id": 1, "' + "k" * 50001 + '": 1}', (), "characters, over", DEAD),
    ("unknown _op", '{"id": 1, "_op": "merge"}', KEYED, '_op "merge": not an operation', DEAD),
    ("_op a number", '{"id": 1, "_op": 5}', KEYED, "_op 5: not an operation", DEAD),
    ("_op true", '{"id": 1, "_op": true}', KEYED, "_op true: not an operation", DEAD),
    ("_op an array", '{"id": 1, "_op": ["delete"]}', KEYED, "not an operation", DEAD),
    ("_op in other case", '{"id": 1, "_OP": "delete"}', KEYED, "key '_OP'", {"_op": "upsert"}),
    ("null key", '{"id": null, "s": "x"}', KEYED, "'id' is missing or null", DEAD),
    ("missing key", '{"_op": "delete"}', KEYED, "'id' is missing or null", DEAD),
    ("delete with a key of the wrong type", '{"id": "1", "_op": "delete"}', KEYED, "'id': a string into", DEAD),
    ("upsert with a field of the wrong type", '{"id": 1, "n": 1.5}', KEYED, "'n': a number with a fraction", DEAD),
]


@pytest.mark.parametrize(("case", "line", "key", "reason", "spark_makes"), DECLINED, ids=[c[0] for c in DECLINED])
def test_declines_what_it_cannot_be_sure_of(spark, tmp_path, case, line, key, reason, spark_makes):
    assert_declined(spark, tmp_path, COLUMNS, line, key, reason, spark_makes)


TIME_COLUMNS = (Column("id", "BIGINT"), Column("ts", "TIMESTAMP"), Column("day", "DATE"))
TIME_COLUMNS += (Column("amount", "DECIMAL(10,2)"), Column("d", "DOUBLE"))
# a line with a TIMESTAMP string, a DATE string, a DECIMAL value
T, D, A = '{"ts": "%s"}', '{"day": "%s"}', '{"amount": %s}'
NOT_A_TIMESTAMP = "not a timestamp form"
NOT_A_DATE = "not a date as YYYY-MM-DD"
INEXACT = "does not fit DECIMAL\\(10,2\\) exactly"
# as DECLINED, TIMESTAMP values as microseconds from 1970 UTC, DATE values as days
TIME_DECLINED = [
    ("ts: space before Z", T % "2026-01-01T10:01:00 Z", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: UTC after a space", T % "2026-01-01T10:01:00 UTC", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: a region", T % "2026-01-01T10:01:00Europe/Paris", (), NOT_A_TIMESTAMP, {"ts": 1767258060000000}),
    ("ts: a region in brackets", T % "2026-01-01T10:01:00[Europe/Paris]", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: offset with seconds", T % "2026-01-01T10:01:00+02:00:30", (), NOT_A_TIMESTAMP, {"ts": 1767254430000000}),
    ("ts: offset of one digit", T % "2026-01-01T10:01:00+2:00", (), NOT_A_TIMESTAMP, {"ts": 1767254460000000}),
    ("ts: offset past 18 hours", T % "2026-01-01T10:01:00+18:01", (), "offset past 18 hours", DEAD),
    ("ts: offset 19 hours", T % "2026-01-01T10:01:00-19", (), "offset past 18 hours", DEAD),
    ("ts: offset minute 60", T % "2026-01-01T10:01:00+02:60", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: lower-case z", T % "2026-01-01T10:01:00z", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: lower-case t", T % "2026-01-01t10:01:00", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: no seconds", T % "2026-01-01T10:01", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: hour alone", T % "2026-01-01T10", (), NOT_A_TIMESTAMP, {"ts": 1767261600000000}),
    ("ts: one-digit month", T % "2026-1-1T10:01:00", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: one-digit hour", T % "2026-01-01T1:01:00", (), NOT_A_TIMESTAMP, {"ts": 1767229260000000}),
    ("ts: leading space", T % " 2026-01-01T10:01:00", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: trailing space", T % "2026-01-01T10:01:00 ", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: a dot without digits", T % "2026-01-01T10:01:00.", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: 10 fractional digits", T % "2026-01-01T10:01:00.1234567890", (), NOT_A_TIMESTAMP, {"ts": 1767261660123456}),
    ("ts: date with Z", T % "2026-01-01Z", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: basic form", T % "20260101T100100", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: a sign before the year", T % "+2026-01-01T10:01:00", (), NOT_A_TIMESTAMP, {"ts": 1767261660000000}),
    ("ts: fullwidth digits", T % "\uff12\uff10\uff12\uff16-01-01T10:01:00", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: empty", T % "", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: hour 24", T % "2026-01-01T24:00:00", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: second 60", T % "2026-01-01T23:59:60", (), NOT_A_TIMESTAMP, DEAD),
    ("ts: month 13", T % "2026-13-01T00:00:00", (), "not a date Python holds", DEAD),
    ("ts: Feb 29 of 2026", T % "2026-02-29T00:00:00", (), "not a date Python holds", DEAD),
    ("ts: year 0", T % "0000-01-01T00:00:00", (), "not a date Python holds", {"ts": -62167219200000000}),
    ("ts: year 10000", T % "10000-01-01T00:00:00", (), NOT_A_TIMESTAMP, {"ts": 253402300800000000}),
    ("ts: before year 1 in UTC", T % "0001-01-01T00:00:00+14:00", (), "past the years", {"ts": -62135647200000000}),
    ("ts: after 9999 in UTC", T % "9999-12-31T23:59:59-14:00", (), "past the years", {"ts": 253402351199000000}),
    ("ts: seconds after 9999", '{"ts": 253402300800}', (), "past the years 1-9999", {"ts": 253402300800000000}),
    ("ts: seconds wrap in Spark", '{"ts": 9223372036854775807}', (), "past the years 1-9999", {"ts": -1000000}),
    ("ts: a fraction of a second", '{"ts": 1767261660.5}', (), "'ts': a number with a fraction", DEAD),
    ("ts: an exponent", '{"ts": 1e3}', (), "'ts': a number with a fraction or exponent", DEAD),
    ("ts: a boolean", '{"ts": true}', (), "'ts': a boolean into TIMESTAMP", DEAD),
    ("ts: an object", '{"ts": {}}', (), "'ts': an object into TIMESTAMP", DEAD),
    ("day: one-digit month and day", D % "2026-1-1", (), NOT_A_DATE, {"day": 20454}),
    ("day: a timestamp", D % "2026-01-01T10:00:00", (), NOT_A_DATE, {"day": 20454}),
    ("day: a timestamp with a space", D % "2026-01-01 10:00:00", (), NOT_A_DATE, {"day": 20454}),
    ("day: trailing space", D % "2026-01-01 ", (), NOT_A_DATE, {"day": 20454}),
    ("day: year and month", D % "2026-01", (), NOT_A_DATE, {"day": 20454}),
    ("day: year alone", D % "2026", (), NOT_A_DATE, {"day": 20454}),
    ("day: 8 digits are days from 1970", D % "20260101", (), NOT_A_DATE, {"day": 20260101}),
    ("day: -1 is a day before 1970", D % "-1", (), NOT_A_DATE, {"day": -1}),
    ("day: year 0", D % "0000-01-01", (), "not a date Python holds", {"day": -719528}),
    ("day: year 10000", D % "10000-01-01", (), NOT_A_DATE, {"day": 2932897}),
    ("day: Feb 29 of 2026", D % "2026-02-29", (), "not a date Python holds", DEAD),
    ("day: Feb 29 of 1900", D % "1900-02-29", (), "not a date Python holds", DEAD),
    ("day: April 31", D % "2026-04-31", (), "not a date Python holds", DEAD),
    ("day: month 0", D % "2026-00-01", (), "not a date Python holds", DEAD),
    ("day: slashes", D % "2026/01/01", (), NOT_A_DATE, DEAD),
    ("day: empty", D % "", (), NOT_A_DATE, DEAD),
    ("day: a number", '{"day": 20260101}', (), "'day': an integer into DATE", DEAD),
    ("amount: rounds half up", A % "1.505", (), INEXACT, {"amount": Decimal("1.51")}),
    ("amount: negative rounds half up", A % "-1.505", (), INEXACT, {"amount": Decimal("-1.51")}),
    ("amount: 1.005", A % "1.005", (), INEXACT, {"amount": Decimal("1.01")}),
    ("amount: rounds down", A % "1.504", (), INEXACT, {"amount": Decimal("1.50")}),
    ("amount: rounds to zero", A % "1e-3", (), INEXACT, {"amount": Decimal("0.00")}),
    ("amount: rounds past the precision", A % "99999999.995", (), INEXACT, DEAD),
    ("amount: too many integer digits", A % "100000000", (), INEXACT, DEAD),
    ("amount: an exponent too large", A % "1e8", (), INEXACT, DEAD),
    ("amount: a huge exponent", A % "1e999999999", (), INEXACT, DEAD),
    ("amount: a tiny exponent", A % "1e-999999999", (), INEXACT, DEAD),
    ("amount: past Python's Decimal", A % "1e99999999999999999999", (), "past Python's Decimal", DEAD),
    ("extra key past Python's Decimal", '{"id": 1, "x": 1e99999999999999999999}', (), "Decimal", {"id": 1}),
    ("amount: the largest double", A % "1.7976931348623157e308", (), INEXACT, DEAD),
    ("amount: a string", A % '"1.5"', (), "'amount': a string into DECIMAL", {"amount": Decimal("1.50")}),
    ("amount: a string with a comma", A % '"1,234.5"', (), "a string into", {"amount": Decimal("1234.50")}),
    ("amount: a boolean", A % "true", (), "'amount': a boolean into DECIMAL", DEAD),
    ("d: past Python's Decimal", '{"d": 0e99999999999999999999}', (), "past Python's Decimal", {"d": 0.0}),
    (
        "ts key: no seconds",
        '{"id": 1, "ts": "2026-01-01T10:01"}',
        ("id", "ts"),
        NOT_A_TIMESTAMP,
        {"ts": 1767261660000000},
    ),
]


@pytest.mark.parametrize(
    ("case", "line", "key", "reason", "spark_makes"), TIME_DECLINED, ids=[c[0] for c in TIME_DECLINED]
)
def test_declines_timestamps_dates_and_decimals_it_cannot_be_sure_of(
    spark, tmp_path, case, line, key, reason, spark_makes
):
    assert_declined(spark, tmp_path, TIME_COLUMNS, line, key, reason, spark_makes)


def assert_declined(spark, tmp_path, columns, line, key, reason, spark_makes) -> None:
    good = '{"id": 0, "ts": "2026-01-01T00:00:00Z"}' if key == ("id", "ts") else '{"id": 0, "s": "fine"}'
    # written as is: append_records would skip the U+2028 line (Python's str.strip takes it for space)
    (tmp_path / "0.jsonl").write_bytes(f"{good}\n{line}\n".encode())
    src = source(tmp_path, columns, key)
    with pytest.raises(Declined, match=reason):
        read_or_decline(src, [SplitRange("0", 0, 2)])
    assert read_on_driver(src, [SplitRange("0", 0, 2)]) is None
    assert read_on_driver(src, [SplitRange("0", 0, 1)]) is not None  # the good line alone is read

    # what Spark makes of the line alone (rows and dead letters are exclusive: one job tells)
    batch = src.read(spark, [SplitRange("0", 1, 2)])
    if spark_makes == DEAD:
        assert batch.rejected.count() == 1
        return
    if spark_makes == SKIPPED:
        assert batch.rows.count() == 0 and batch.rejected.count() == 0
        return
    [row] = as_numbers(batch.rows).collect()  # a row: reading it right needs Spark's own conversions
    for column, expected in spark_makes.items():
        got = row[column]
        assert got == expected or (isinstance(got, float) and math.isnan(got) and math.isnan(expected)), column


@pytest.mark.parametrize("column_type", ["FLOAT", "TIMESTAMP_NTZ", "DECIMAL", "ARRAY<BIGINT>"])
def test_declines_column_types_spark_converts_its_own_way(tmp_path, column_type):
    append_records(tmp_path, ['{"id": 1}'])
    src = source(tmp_path, (Column("id", "BIGINT"), Column("x", column_type)))
    with pytest.raises(Declined, match="column 'x'"):
        read_or_decline(src, [SplitRange("0", 0, 1)])


def test_declines_a_read_over_the_budget(spark, tmp_path):
    append_records(tmp_path, [json.dumps({"id": i}) for i in range(100)])
    src = source(tmp_path, (Column("id", "BIGINT"),))
    ranges = [SplitRange("0", 0, 100)]
    size = sum(piece.end - piece.start for _, piece in src.line_pieces(ranges))
    assert read_on_driver(src, ranges, budget=size - 1) is None
    assert read_on_driver(src, ranges, budget=size) is not None
    assert src.read(spark, ranges).rows.count() == 100  # Spark reads it all the same
