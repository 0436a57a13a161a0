"""A log source's records parsed on the driver (Python's json, no Spark) for a small epoch.

:func:`read_on_driver` returns the rows ``LogSource.read(spark, ranges).rows`` would hold, as an
Arrow table: the declared columns by ``Column.name`` (then ``_op``, ``_split``, ``_offset`` for a
keyed source), the same values, Spark's types. It does so only when it can be sure of that, and
returns None otherwise: the caller then reads with Spark, which is always right and also writes the
dead letters. So the driver path declines a read as soon as one line is anything but a record that
both parsers take the same way (what Spark does is measured in tests/connectors/test_log_driver.py):

* the read is larger than the budget (``log_lines.DRIVER_READ_BYTES``);
* a column has a type other than BIGINT, INT, SMALLINT, TINYINT, DOUBLE, STRING, BOOLEAN, TIMESTAMP,
  DATE, DECIMAL(p,s) (FLOAT and nested types convert by Spark's own rules);
* a non-blank line is not one JSON object as RFC 8259 has it. Spark (Jackson) is laxer: it takes
  'single quotes', NaN and Infinity, and ignores what follows the object (``{"id": 1} x``), so such
  a line may be a row there; Python's json refuses it (NaN and Infinity through ``parse_constant``);
* a line has a key twice (Spark keeps the last value; rare enough not to model) or a key that is a
  column's key (or ``_op``) in other case: Spark matches keys exactly, but a producer that writes
  ``"ID"`` for ``id`` is better read by the path that reports it;
* a line could pass a Jackson limit Spark enforces: an integer of over 1000 digits, nesting deeper
  than 1000, a key over 50,000 characters make a dead letter of a line that Python parses. Lines
  over MAX_LINE_CHARS are declined; longer than _GUARDED_LINE, one with a run of _MAX_NUMBER_CHARS
  number characters or _MAX_BRACKETS brackets is;
* a column's value is not one of the pairs accepted below. Spark turns any JSON value into a STRING
  column (``1.50`` -> "1.5", ``{"a": 1}`` -> '{"a":1}'), a string into a DOUBLE when it is "NaN" or
  "Infinity", and wraps 128..255 into TINYINT (Jackson's getByteValue: 200 -> -56); it makes a dead
  letter of 1.0 into BIGINT, a string or boolean into a number, a number into BOOLEAN, an integer
  out of range; it turns 1e400 into Infinity and a lone surrogate (``"\\ud800"``) into "?". It reads
  TIMESTAMP and DATE strings as CAST does, laxly: "2026-1-1", "...T10:01" (no seconds), " 2026-...",
  "... UTC", "...Europe/Paris", "...+02:00:30", years 0000 and 10000, a date's "2026" and "20260101"
  (days from 1970!) are rows; 24:00:00, 2026-02-29, offsets past 18 hours, a number into DATE and a
  fraction into TIMESTAMP dead letters. It rounds a number into DECIMAL HALF_UP (1.005 -> 1.01 at
  scale 2; a dead letter past the precision) and parses a string into it ("1,234.5" -> 1234.5);
* keyed source: ``_op`` is not absent, null, or an ASCII string that is insert/upsert/update or
  delete in any case (Spark reads it as STRING: 5 becomes "5", an unknown op, a dead letter), or a
  key column is missing, null or does not fit (a dead letter). A delete needs only its key: its
  other fields come out NULL whatever they hold, as in Spark.

Accepted (JSON value -> column type): integer (not true/false) -> BIGINT/INT/SMALLINT/TINYINT within
the type's signed range; integer or finite number -> DOUBLE (``1`` -> 1.0, ``-0`` -> 0.0, ``-0.0``
-> -0.0; both round correctly); string -> STRING (``\\u0000`` included; surrogate pairs combine);
true/false -> BOOLEAN; null or a missing key -> NULL in any column. Extra keys are ignored, as
Spark ignores them, whatever they hold. And, in the years 0001-9999 (of UTC for an instant):

* string -> DATE: ``YYYY-MM-DD``, a day of the calendar (proleptic Gregorian in both);
* string -> TIMESTAMP: ``YYYY-MM-DD``, optionally then ``T`` or a space, ``HH:MM:SS``, ``.`` and 1-9
  digits (Spark drops those past the microsecond), ``Z`` or an offset ``+HH``, ``+HHMM`` or
  ``+HH:MM`` up to 18 hours. A time without an offset is in the session time zone, which the driver
  takes for UTC: Epochal always sets it so (``spark_session.DEFAULT_CONF``; an EPOCHAL_SPARK_CONF
  that sets it otherwise would make the two paths differ);
* integer -> TIMESTAMP: seconds from 1970-01-01T00:00:00Z;
* integer or number -> DECIMAL(p,s) when it fits exactly: no nonzero digit past the scale (``1.500``
  and ``1e2`` are 1.50 and 100.00), at most p-s before the point. json then reads each number with
  a fraction or exponent as a Decimal, its digits as written, as Spark's BigDecimal; a DOUBLE gets
  ``float()`` of it (rounded alike).
"""

from __future__ import annotations

import decimal
import json
import math
import re
from datetime import date
from typing import TYPE_CHECKING, NoReturn

from epochal.connectors.json_lines import CORRUPT, OP_KEY, UPSERT_OPS
from epochal.connectors.log_lines import DRIVER_READ_BYTES, piece_batches
from epochal.storage.upsert import DELETE, OFFSET_COLUMN, OP_COLUMN, SPLIT_COLUMN, UPSERT

if TYPE_CHECKING:
    import pyarrow as pa

    from epochal.connectors.base import SplitRange
    from epochal.connectors.log import LogSource
    from epochal.pipeline.model import Column

#: bits of the integer types; Spark keeps their signed range (TINYINT: see the module docstring)
_INT_BITS = {"BIGINT": 64, "INT": 32, "SMALLINT": 16, "TINYINT": 8}
TYPES = (*_INT_BITS, "DOUBLE", "STRING", "BOOLEAN", "TIMESTAMP", "DATE")  # and DECIMAL(p,s)
_DECIMAL = re.compile(r"DECIMAL\(([0-9]+), *([0-9]+)\)")
#: the DATE and TIMESTAMP strings read on the driver (see the module docstring). [0-9]: Python's \d
#: and int() take other digits too, Spark does not
_DATE = re.compile("([0-9]{4}-[0-9]{2}-[0-9]{2})")
_TIMESTAMP = re.compile(
    _DATE.pattern + r"(?:[T ]([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]{1,9}))?"
    r"(?:Z|([+-])([01][0-9])(?::?([0-5][0-9]))?)?)?"
)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
#: the seconds from 1970 of the instants Python's datetime holds (the rows become Python values next)
_FIRST_SECOND = (date.min.toordinal() - _EPOCH_DAY) * 86_400
_LAST_SECOND = (date.max.toordinal() + 1 - _EPOCH_DAY) * 86_400 - 1
#: longer lines are declined: Jackson refuses keys over 50,000 UTF-16 units, and a code point is at
#: most two, so no key of a shorter line reaches the limit
MAX_LINE_CHARS = 25_000
#: lines at least this long are checked for Jackson's number length and nesting limits (a shorter
#: one cannot reach them)
_GUARDED_LINE = 1_000
#: a run of number characters this long may be a number over Jackson's 1000 digits (half: margin)
_MAX_NUMBER_CHARS = 500
_NUMBER_RUN = re.compile(rf"(?<![-+.0-9eE])[-+.0-9eE]{{{_MAX_NUMBER_CHARS}}}")
#: this many [ and { may nest deeper than Jackson's 1000 levels (half: margin)
_MAX_BRACKETS = 500
#: the characters of a blank line: Spark skips lines matching ^\s*$ (Java's \s) after removing a
#: trailing \r. Spark also skips a line of only U+2028 or U+0085 (Java's $ matches before a final
#: line terminator); json refuses one, so it is declined, not skipped
_SPARK_SPACE = " \t\n\x0b\x0c\r"
#: JSON's whitespace (RFC 8259, and Python's json)
_JSON_SPACE = " \t\n\r"
_SURROGATE = re.compile("[\ud800-\udfff]")
#: what json makes of each kind of JSON value, for the reasons
_JSON_KINDS = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number with a fraction or exponent",
    decimal.Decimal: "a number with a fraction or exponent",
    bool: "a boolean",
    type(None): "null",
}


class Declined(Exception):
    """The driver cannot be sure to read as Spark would; the message says why."""


def read_on_driver(source: LogSource, ranges: list[SplitRange], budget: int = DRIVER_READ_BYTES) -> pa.Table | None:
    """The rows ``source.read(spark, ranges).rows`` would hold, or None when the read should go to
    Spark (see the module docstring). A split truncated or replaced under the ranges raises
    EpochalError, as the Spark path does."""
    try:
        return read_or_decline(source, ranges, budget)
    except Declined:
        return None


def read_or_decline(source: LogSource, ranges: list[SplitRange], budget: int = DRIVER_READ_BYTES) -> pa.Table:
    """As :func:`read_on_driver`, raising :class:`Declined` with the reason instead of returning None."""
    import pyarrow as pa

    for column in source.columns:
        if column.type not in TYPES and not _DECIMAL.fullmatch(column.type):
            raise Declined(f"column '{column.name}' is {column.type}: the driver reads {', '.join(TYPES)}, DECIMAL")
    pieces = source.line_pieces(ranges)
    size = sum(piece.end - piece.start for _, piece in pieces)
    if size > budget:
        raise Declined(f"the read is {size} bytes, over the driver's {budget}")

    keyed = bool(source.primary_key)
    exact = {c.key for c in source.columns} | ({OP_KEY} if keyed else set())
    # a key that differs from these only in case is declined; so is Spark's corrupt-record field
    watched = {form for name in (*exact, CORRUPT) for form in (name.lower(), name.casefold())}
    # a DECIMAL needs a number's digits as written: json then makes Decimals of them, not floats
    exact_numbers = any(_DECIMAL.fullmatch(c.type) for c in source.columns)
    records: list[dict[str, object]] = []
    splits: list[str] = []
    offsets: list[int] = []
    for path, piece in pieces:
        for batch in piece_batches(path, piece):
            numbers = batch.column(1).to_pylist()
            for at, record in _records(batch.column(2).to_pylist(), exact, watched, exact_numbers):
                records.append(record)
                splits.append(piece.split)
                offsets.append(numbers[at])

    names = [c.name for c in source.columns]
    keys = [c.key for c in source.columns]
    if not keyed:
        arrays = [_array([r.get(key) for r in records], c) for c, key in zip(source.columns, keys, strict=True)]
        return pa.Table.from_arrays(arrays, names=names)

    ops = [_op(r.get(OP_KEY), offset) for r, offset in zip(records, offsets, strict=True)]
    arrays = []
    for c, key in zip(source.columns, keys, strict=True):
        if c.name in source.primary_key:
            values = [r.get(key) for r in records]
            if any(v is None for v in values):
                raise Declined(f"primary key column '{c.name}' is missing or null in a record")
        else:  # a delete's other fields are ignored: NULL, and never a reason to decline
            values = [None if op == DELETE else r.get(key) for r, op in zip(records, ops, strict=True)]
        arrays.append(_array(values, c))
    arrays += [pa.array(ops, pa.string()), pa.array(splits, pa.string()), pa.array(offsets, pa.int64())]
    return pa.Table.from_arrays(arrays, names=[*names, OP_COLUMN, SPLIT_COLUMN, OFFSET_COLUMN])


def _records(
    lines: list[str], exact: set[str], watched: set[str], exact_numbers: bool
) -> list[tuple[int, dict[str, object]]]:
    """The records of ``lines`` with their places in it (blank lines have none); Declined for a line
    Spark might take otherwise. The loop is ``JSONDecoder.decode`` unrolled (its scanner called
    directly): 10,000 records of 5 fields take 20-27 ms, what plain ``json.loads`` takes, duplicate
    key check included."""
    parse_float = decimal.Decimal if exact_numbers else float
    scan = json.JSONDecoder(object_pairs_hook=_object, parse_float=parse_float, parse_constant=_not_a_number).scan_once
    records = []
    for at, raw in enumerate(lines):
        start = 0
        if raw[:1] != "{":
            if not raw.strip(_SPARK_SPACE):
                continue  # blank
            start = len(raw) - len(raw.lstrip(_JSON_SPACE))
        size = len(raw)
        if size >= _GUARDED_LINE:
            if size > MAX_LINE_CHARS:
                raise Declined(f"a line has {size} characters, over {MAX_LINE_CHARS}")
            if raw.count("[") + raw.count("{") >= _MAX_BRACKETS or _NUMBER_RUN.search(raw):
                raise Declined("a line may nest or hold numbers past Jackson's limits")
        try:
            record, end = scan(raw, start)
        except StopIteration:
            raise Declined("a line is not JSON") from None
        except (ValueError, RecursionError) as exc:
            raise Declined(f"a line is not valid JSON: {exc}") from None
        except ArithmeticError:  # a Decimal's exponent past decimal.MAX_EMAX
            raise Declined("a line holds a number past Python's Decimal") from None
        if end != size and raw[end:].strip(_JSON_SPACE):
            raise Declined("a line holds more than one JSON value")  # Spark ignores the rest: a row
        if type(record) is not dict:
            raise Declined(f"a line is {_JSON_KINDS[type(record)]}, not a JSON object")
        if not exact.issuperset(record):
            for key in record:
                if key not in exact and (key.lower() in watched or key.casefold() in watched):
                    raise Declined(f"a record has key '{key}', a column's key in other case (or a reserved one)")
        records.append((at, record))
    return records


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    record = dict(pairs)
    if len(record) != len(pairs):
        raise Declined("a record has a duplicate key")
    return record


def _not_a_number(name: str) -> NoReturn:
    raise Declined(f"a record holds {name}, which is not JSON")


def _op(value: object, offset: int) -> str:
    if value is None:
        return UPSERT
    # non-ASCII is declined: whether Java lower-cases it to an op word the same way is not worth a bet
    if type(value) is str and value.isascii():
        lowered = value.lower()
        if lowered in UPSERT_OPS:
            return UPSERT
        if lowered == DELETE:
            return DELETE
    raise Declined(f"line {offset} has {OP_KEY} {_shown(value)}: not an operation (a dead letter)")


def _shown(value: object) -> str:
    return json.dumps(value, default=str)[:40]


def _array(values: list[object], column: Column) -> pa.Array:
    """``values`` as the Arrow array of the column's type; Declined when one does not fit it."""
    import pyarrow as pa

    kinds = {type(v) for v in values}
    kinds.discard(type(None))
    kind = column.type

    def fits(*accepted: type) -> None:
        if not kinds <= set(accepted):
            got = " and ".join(sorted(_JSON_KINDS[k] for k in kinds - set(accepted)))
            raise Declined(f"field '{column.key}': {got} into {kind}")

    if kind in _INT_BITS:
        fits(int)
        present = [v for v in values if v is not None]
        bound = 1 << (_INT_BITS[kind] - 1)
        if present and (min(present) < -bound or max(present) >= bound):
            raise Declined(f"field '{column.key}': an integer out of {kind}'s range")
        return pa.array(values, {64: pa.int64(), 32: pa.int32(), 16: pa.int16(), 8: pa.int8()}[_INT_BITS[kind]])
    if kind == "DOUBLE":
        fits(int, float, decimal.Decimal)
        try:
            doubles = [None if v is None else float(v) for v in values]
        except OverflowError:  # an integer past DOUBLE's range: Spark's Infinity
            raise Declined(f"field '{column.key}': a number past DOUBLE's range") from None
        if not all(map(math.isfinite, (v for v in doubles if v is not None))):
            raise Declined(f"field '{column.key}': a number past DOUBLE's range (Spark: Infinity)")
        return pa.array(doubles, pa.float64())
    if kind == "STRING":
        fits(str)
        if _SURROGATE.search("".join(v for v in values if v is not None)):
            raise Declined(f"field '{column.key}': a lone surrogate escape (Spark: '?')")
        return pa.array(values, pa.string())
    if kind == "TIMESTAMP":
        fits(str, int)
        seconds_of_day: dict[str, int] = {}
        micros = [None if v is None else _instant(v, column.key, seconds_of_day) for v in values]
        return pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    if kind == "DATE":
        fits(str)
        days: dict[str, int] = {}
        for v in values:
            if v is not None and v not in days:
                if not _DATE.fullmatch(v):
                    raise Declined(f"field '{column.key}': {_shown(v)} is not a date as YYYY-MM-DD")
                days[v] = _day(v, column.key)
        return pa.array([None if v is None else days[v] for v in values], pa.int32()).cast(pa.date32())
    if scaled := _DECIMAL.fullmatch(kind):
        fits(int, decimal.Decimal)
        precision, scale = int(scaled[1]), int(scaled[2])
        return pa.array(_decimals(values, precision, scale, column.key), pa.decimal128(precision, scale))
    fits(bool)  # BOOLEAN
    return pa.array(values, pa.bool_())


def _day(text: str, key: str) -> int:
    """Days from 1970-01-01 to the date ``text`` (YYYY-MM-DD), proleptic Gregorian as Spark counts."""
    try:
        return date.fromisoformat(text).toordinal() - _EPOCH_DAY
    except ValueError:  # Spark: a dead letter (2026-02-29) or, for year 0000, a date Python has not
        raise Declined(f"field '{key}': {_shown(text)} is not a date Python holds") from None


def _instant(value: object, key: str, seconds_of_day: dict[str, int]) -> int:
    """``value`` (a string or an integer) in microseconds from 1970 UTC, as Spark reads it into a
    TIMESTAMP with session time zone UTC; Declined for a form or an instant not read here.
    ``seconds_of_day`` caches each date's. 10,000 values take ~15 ms."""
    if type(value) is int:  # seconds from 1970 (Spark multiplies as a long: it wraps past its range)
        if not _FIRST_SECOND <= value <= _LAST_SECOND:
            raise Declined(f"field '{key}': {value} seconds is past the years 1-9999")
        return value * 1_000_000
    form = _TIMESTAMP.fullmatch(value)  # type: ignore[arg-type]
    if form is None:
        raise Declined(f"field '{key}': {_shown(value)} is not a timestamp form read on the driver")
    day, hour, minute, second, fraction, sign, offset_hours, offset_minutes = form.groups()
    seconds = seconds_of_day.get(day)
    if seconds is None:
        seconds = seconds_of_day[day] = _day(day, key) * 86_400
    if hour is not None:
        seconds += int(hour) * 3600 + int(minute) * 60 + int(second)
    if sign is not None:
        offset = int(offset_hours) * 3600 + int(offset_minutes or 0) * 60
        if offset > 18 * 3600:  # past Java's ZoneOffset: a dead letter
            raise Declined(f"field '{key}': {_shown(value)} has an offset past 18 hours")
        seconds += -offset if sign == "+" else offset
    if not _FIRST_SECOND <= seconds <= _LAST_SECOND:
        raise Declined(f"field '{key}': {_shown(value)} is past the years 1-9999 in UTC")
    # digits past the microsecond are dropped, as Spark drops them
    return seconds * 1_000_000 + (int(fraction[:6].ljust(6, "0")) if fraction else 0)


def _decimals(values: list[object], precision: int, scale: int, key: str) -> list[decimal.Decimal | None]:
    """``values`` (integers, Decimals, None) at ``scale``; Declined unless each fits exactly."""
    traps = [decimal.Inexact, decimal.InvalidOperation]
    exact = decimal.Context(prec=precision, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=traps)
    step = decimal.Decimal(f"1e-{scale}")
    try:
        return [None if v is None else exact.quantize(decimal.Decimal(v), step) for v in values]  # type: ignore[arg-type]
    except decimal.DecimalException:
        raise Declined(f"field '{key}': a number that does not fit DECIMAL({precision},{scale}) exactly") from None
