"""Independent checks of a pipeline's committed state.

The oracle shares no code with what it checks. Its source rows come from the facts fixed at
injection, not from Epochal's state: the committed epochs' offset ranges (one meta-store query), and
the records in them read again from the source itself. A log source's lines are read here in plain
Python, by split file and line number, and parsed with ``json``; the connector's documented rules
decide which are records (``LineRules``) and, for a source with a PRIMARY KEY, upserts and deletes
are resolved in a dict in (epoch, split, line) order. A Nexmark source is read through the
connector's generator (a pure function of the event number; writing a second generator would only
duplicate it), over the same committed ranges. Nothing Epochal stored (change files, netting,
snapshots, upsert resolution, the planner's stages) is read, except the state being checked.

Views are their SQL, as written, run as a Spark batch query over those rows; views they read are
computed the same way, from the sources up. Sources are compared with the same rows, sinks with the
view they deliver. All comparisons are multisets.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import duckdb

from epochal.connectors.base import SplitRange
from epochal.runtime.facade import EpochRuntime

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

    from epochal.pipeline.model import SourceDef


def _normal(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, Decimal):
        return Decimal(value).normalize()
    # arrays, structs and maps compare by their values (a list or dict is no Counter key)
    if isinstance(value, (list, tuple)):
        return tuple(_normal(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((_normal(k), _normal(v)) for k, v in value.items()))
    return value


def multiset(rows: Iterable[Iterable[Any]]) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in rows)


# ---------------------------------------------------------------------------------------------------
# Committed offsets: facts the meta store fixed at injection.


@dataclass(frozen=True)
class EpochRange:
    """Lines (events) ``[start, end)`` of ``split`` that committed ``epoch`` read."""

    epoch: int
    split: str
    start: int
    end: int


def committed_offsets(runtime: EpochRuntime, source: str) -> list[EpochRange]:
    """Every committed epoch's ranges of ``source`` in (epoch, split) order, straight from the meta
    store; asserts they tile each split from 0 without gap or overlap. With scan.startup.mode =
    'latest' the splits of the source's first committed epoch start where that epoch fixed them."""
    from epochal.checkpoint.records import EpochState

    rows = runtime.controller.backend.transaction(
        lambda cur: cur.execute(
            "SELECT o.epoch, o.split, o.start_offset, o.end_offset FROM epoch_offsets o "
            "JOIN epochs e ON e.epoch = o.epoch WHERE e.state = ? AND o.source = ? ORDER BY o.epoch, o.split",
            [EpochState.COMMITTED.value, source],
        ).fetchall()
    )
    ranges = [EpochRange(int(e), str(s), int(a), int(b)) for e, s, a, b in rows]
    options = runtime.pipeline.sources[source].options
    latest = options.get("scan.startup.mode", "earliest").strip().lower() == "latest"
    first_epoch = ranges[0].epoch if ranges else None
    reached: dict[str, int] = {}
    for r in ranges:
        start = r.start if latest and r.epoch == first_epoch else 0
        assert r.start == reached.get(r.split, start), f"{source} split {r.split}: gap or overlap at {r.start}"
        reached[r.split] = r.end
    return ranges


def committed_ranges(runtime: EpochRuntime, source: str) -> list[SplitRange]:
    """Each split's committed lines as one range, from where the split starts (see ``committed_offsets``)."""
    spans: dict[str, tuple[int, int]] = {}
    for r in committed_offsets(runtime, source):
        spans[r.split] = (spans.get(r.split, (r.start, 0))[0], r.end)
    return [SplitRange(split, start, end) for split, (start, end) in spans.items()]


# ---------------------------------------------------------------------------------------------------
# Log records, by the connector's documented rules (README "Sources", epochal/connectors/log.py's
# docstring): a line is a record when it is a JSON object whose declared fields are absent, null or
# of the declared type; any other non-blank line is a dead letter. A keyed source's record needs its
# key, non-null; "_op" absent, null, insert, upsert or update (any case) upserts, delete deletes, and
# a delete needs only its key. The value rules below are Spark's JSON reading as the connector
# documents it, restricted to what the oracle can state exactly: a value outside them (a float
# into a STRING column) stops the check with an error rather than be guessed. Spark is laxer than
# these rules in places (text after the object, single quotes, a timestamp like 2026-1-1): such a
# line is a dead letter here, so a test that wrote one would fail on the difference.


class OracleCannotDecide(Exception):
    """A value whose reading the oracle does not model; extend ``LineRules`` rather than guess."""


class _Misfit(Exception):
    """The value does not fit its declared type: the line is a dead letter."""


_BLANK = re.compile(r"[ \t\n\x0b\f\r]*")  # Java's \s, which the connector's blank-line test uses
_INTEGERS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "INTEGER": 32, "BIGINT": 64}
_DOUBLE_WORDS = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "+Infinity": math.inf,
    "+INF": math.inf,
    "-Infinity": -math.inf,
    "-INF": -math.inf,
}
#: ISO 8601 in its extended form, from a date alone to microseconds (more digits are truncated),
#: 'T' or a space between date and time, with 'Z' or an offset or neither (the session's zone).
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}(?::\d{2}(?::\d{2}(?:\.(\d+))?)?)?)?"  # date, hour, minute, second, fraction
    r"(?:Z|[+-]\d{2}(?::?\d{2})?)?"  # zone
)
_OPS = {"insert": "upsert", "upsert": "upsert", "update": "upsert", "delete": "delete"}
_OP_KEY = "_op"


@dataclass(frozen=True)
class LineRules:
    """What one source's lines mean."""

    columns: tuple[tuple[str, str], ...]  # (name, declared type)
    key: tuple[str, ...]
    #: the zone of a timestamp written without one (Spark's session time zone)
    zone: dt.tzinfo
    #: per column, the field a record holds it under (``Column.key``: the DDL's spelling, not the
    #: lower-cased name, since JSON keys are case-sensitive); empty: the names themselves
    fields: tuple[str, ...] = ()

    def record(self, line: str) -> tuple[str, tuple] | None:
        """(op, row) for a record, None for a dead letter or a blank line."""
        line = line.removesuffix("\r")
        if _BLANK.fullmatch(line):
            return None
        try:
            body = json.loads(line)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        op = "upsert"
        if self.key:
            raw = body.get(_OP_KEY)
            if raw is not None:
                text = raw if isinstance(raw, str) else json.dumps(raw)
                if text.lower() not in _OPS:
                    return None
                op = _OPS[text.lower()]
        try:
            values = {}
            for i, (name, type_) in enumerate(self.columns):
                if op == "delete" and name not in self.key:
                    values[name] = None  # a delete's other fields are ignored
                else:
                    values[name] = self.value(body.get(self.fields[i] if self.fields else name), type_)
        except _Misfit:
            return None
        if any(values[k] is None for k in self.key):
            return None
        return op, tuple(values[name] for name, _ in self.columns)

    def value(self, value: Any, type_: str) -> Any:  # noqa: PLR0911, C901
        if value is None:
            return None
        if type_ in _INTEGERS:
            bits = _INTEGERS[type_]
            if type(value) is not int or not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                raise _Misfit
            return value
        if type_ == "DOUBLE":
            if type(value) is float:
                return value
            if type(value) is int:
                try:
                    return float(value)
                except OverflowError:  # beyond a double, as 1e400 is
                    return math.copysign(math.inf, value)
            if isinstance(value, str) and value in _DOUBLE_WORDS:
                return _DOUBLE_WORDS[value]
            raise _Misfit
        if type_ == "BOOLEAN":
            if type(value) is not bool:
                raise _Misfit
            return value
        if type_ == "STRING":
            if isinstance(value, str):
                return value
            if type(value) in (int, bool):
                return json.dumps(value)
            if isinstance(value, (dict, list)) and not _holds_float(value):
                # Spark keeps an object's or array's JSON text, compact, keys in their order
                return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            raise OracleCannotDecide(f"a STRING column holding the JSON value {value!r}: Spark keeps its JSON text")
        if type_ == "TIMESTAMP":
            return self.timestamp(value)
        if type_ == "DATE":
            if isinstance(value, str) and _DATE.fullmatch(value):
                try:
                    return dt.date.fromisoformat(value)
                except ValueError:
                    raise _Misfit from None
            raise OracleCannotDecide(f"a DATE written as {value!r}: only yyyy-MM-dd is decided here")
        if type_.startswith("DECIMAL("):
            return self.decimal(value, type_)
        if type_.startswith(("ARRAY<", "STRUCT<")):
            return self.nested(value, _spark_type(type_))
        raise OracleCannotDecide(f"columns of type {type_}: add a rule to tests/consistency.py LineRules.value")

    @staticmethod
    def decimal(value: Any, type_: str) -> Decimal:
        precision, scale = (int(p) for p in type_[len("DECIMAL(") : -1].split(","))
        if type(value) not in (int, float):
            raise OracleCannotDecide(f"a {type_} written as {value!r}: only JSON numbers are decided here")
        exact = Decimal(str(value)).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
        if exact.adjusted() + 1 > precision - scale:
            raise _Misfit
        return exact

    def nested(self, value: Any, data_type: Any) -> Any:
        """An ARRAY's or STRUCT's value as Spark's JSON reader gives it (missing fields are NULL)."""
        from pyspark.sql import types as T

        if value is None:
            return None
        if isinstance(data_type, T.ArrayType):
            if not isinstance(value, list):
                raise _Misfit
            return [self.nested(v, data_type.elementType) for v in value]
        if isinstance(data_type, T.StructType):
            if not isinstance(value, dict):
                raise _Misfit
            return {f.name: self.nested(value.get(f.name), f.dataType) for f in data_type.fields}
        return self.value(value, data_type.simpleString().upper().replace(" ", ""))

    def timestamp(self, value: Any) -> dt.datetime:
        if type(value) is int:  # seconds since the Unix epoch
            try:
                return dt.datetime.fromtimestamp(value, dt.UTC)
            except (OverflowError, OSError, ValueError):
                raise _Misfit from None
        if not isinstance(value, str):
            raise _Misfit
        text = value.strip()
        match = _TIMESTAMP.fullmatch(text)
        if match is None:
            raise _Misfit
        if match.group(1) and len(match.group(1)) > 6:
            text = text.replace("." + match.group(1), "." + match.group(1)[:6], 1)
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise _Misfit from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=self.zone)
        return parsed.astimezone(dt.UTC)


def log_directory(source: "SourceDef", home: Path) -> Path:
    """Where the source's split files are: its ``path``, relative to EPOCHAL_HOME."""
    directory = Path(source.options["path"]).expanduser()
    return directory if directory.is_absolute() else home / directory


def log_source_rows(source: "SourceDef", home: Path, ranges: list[EpochRange], zone: dt.tzinfo) -> list[tuple]:
    """The committed rows of a log source: its records in ``ranges`` (in (epoch, split) order), every
    one appended or, with a PRIMARY KEY, the last upsert of each key unless a delete followed it."""
    rules = LineRules(
        tuple((c.name, _declared(c.type)) for c in source.columns),
        source.primary_key,
        zone,
        tuple(c.key for c in source.columns),
    )
    directory = log_directory(source, home)
    lines: dict[str, list[str]] = {}
    appended: list[tuple] = []
    keyed: dict[tuple, tuple] = {}
    key_at = [source.column_names.index(k) for k in source.primary_key]
    for r in ranges:
        if r.split not in lines:
            # the connector splits each file's text on "\n"; offsets are indexes into that list
            text = (directory / f"{r.split}.jsonl").read_bytes().decode("utf-8", errors="replace")
            lines[r.split] = text.split("\n")
        file_lines = lines[r.split]
        assert r.end <= len(file_lines), f"{source.name} split {r.split}: committed up to line {r.end}, file is shorter"
        for line in file_lines[r.start : r.end]:
            record = rules.record(line)
            if record is None:
                continue
            op, row = record
            if not source.primary_key:
                appended.append(row)
            elif op == "delete":
                keyed.pop(tuple(row[i] for i in key_at), None)
            else:
                keyed[tuple(row[i] for i in key_at)] = row
    return list(keyed.values()) if source.primary_key else appended


# ---------------------------------------------------------------------------------------------------
# The oracle.

_ARROW_TYPES = {
    "TINYINT": "int8",
    "SMALLINT": "int16",
    "INT": "int32",
    "INTEGER": "int32",
    "BIGINT": "int64",
    "DOUBLE": "float64",
    "BOOLEAN": "bool_",
    "STRING": "string",
}


def _declared(type_: str) -> str:
    """A column's type as the rules read it: upper case, but a struct's field names as declared."""
    type_ = type_.strip()
    return type_ if "<" in type_ else type_.upper()


def _holds_float(value: Any) -> bool:
    """Whether JSON ``value`` has a float, whose text Python may write otherwise than it was written."""
    if isinstance(value, dict):
        return any(_holds_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_float(v) for v in value)
    return isinstance(value, float)


def _arrow_type(type_: str) -> Any:
    import pyarrow as pa

    if type_ == "TIMESTAMP":
        return pa.timestamp("us", tz="UTC")
    if type_ == "DATE":
        return pa.date32()
    if type_.startswith(("DECIMAL(", "ARRAY<", "STRUCT<")):
        from pyspark.sql.pandas.types import to_arrow_type

        return to_arrow_type(_spark_type(type_))
    return getattr(pa, _ARROW_TYPES[type_])()


def _spark_type(type_: str) -> Any:
    """A declared type as Spark's DataType (parsed by the running Spark)."""
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(type_)


def _mentions(name: str, query: str) -> bool:
    return re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", query, re.IGNORECASE) is not None


class Oracle:
    """What a pipeline's committed tables should hold, computed without Epochal's state machinery.

    Read once: the committed epochs are those at construction."""

    def __init__(self, runtime: EpochRuntime):
        self.runtime = runtime
        self.spark = runtime.spark
        self.pipeline = runtime.pipeline
        self._rows: dict[str, list[tuple]] = {}
        self._frames: dict[str, DataFrame] = {}

    def source_rows(self, source: str) -> list[tuple]:
        """A log source's committed rows (Python values; timestamps in UTC)."""
        if source not in self._rows:
            definition = self.pipeline.sources[source]
            if definition.connector != "log":
                raise OracleCannotDecide(f"source {source}: only log sources are read in plain Python")
            zone = ZoneInfo(self.spark.conf.get("spark.sql.session.timeZone"))
            ranges = committed_offsets(self.runtime, source)
            self._rows[source] = log_source_rows(definition, self.runtime.settings.home, ranges, zone)
        return self._rows[source]

    def source_frame(self, source: str) -> "DataFrame":
        """The source's committed rows as a Spark DataFrame of its declared columns and types."""
        if source in self._frames:
            return self._frames[source]
        from pyspark.sql.types import StructType

        definition = self.pipeline.sources[source]
        schema = StructType.fromDDL(", ".join(f"`{c.name}` {c.type}" for c in definition.columns))
        if definition.connector == "nexmark":
            from epochal.connectors.registry import connector_spec

            reader = connector_spec("nexmark").create(definition, self.runtime.settings.home)
            frame = reader.read(self.spark, committed_ranges(self.runtime, source)).rows
        else:
            import pyarrow as pa

            rows = self.source_rows(source)
            columns = list(zip(*rows, strict=True)) if rows else [() for _ in definition.columns]
            arrays = [
                pa.array(list(values), _arrow_type(_declared(c.type)))
                for values, c in zip(columns, definition.columns, strict=True)
            ]
            frame = self.spark.createDataFrame(pa.table(arrays, names=list(definition.column_names)), schema)
        self._frames[source] = frame.select(*[f"`{c}`" for c in definition.column_names])
        return self._frames[source]

    def _reads(self, query: str) -> list[tuple[str, str]]:
        """(kind, name) of the sources and user views ``query`` reads, transitively, in an order where
        each view comes after what it reads. Names are found as words of the SQL as written (never
        through the planner's stages); a word that only looks like a table costs an extra read."""
        views = {n: v.query for n, v in self.pipeline.views.items() if v.internal_of is None}
        needed: dict[str, None] = {}
        visiting: list[str] = []

        def visit(text: str, owner: str | None) -> None:
            for name in views:
                if name != owner and name not in needed and _mentions(name, text):
                    if name in visiting:
                        raise OracleCannotDecide(f"views {visiting} mention each other: name their reads apart")
                    visiting.append(name)
                    visit(views[name], name)
                    visiting.pop()
                    needed[name] = None

        visit(query, None)
        texts = [query, *(views[v] for v in needed)]
        sources = [s for s in self.pipeline.sources if any(_mentions(s, t) for t in texts)]
        return [("source", s) for s in sources] + [("view", v) for v in needed]

    @contextmanager
    def tables(self, query: str) -> Iterator[None]:
        """The tables ``query`` reads registered as Spark temp views for the block."""
        registered: list[str] = []
        try:
            for kind, name in self._reads(query):
                if kind == "source":
                    frame = self.source_frame(name)
                else:
                    definition = self.pipeline.views[name]
                    frame = self.spark.sql(definition.query).toDF(*definition.columns)
                frame.createOrReplaceTempView(name)
                registered.append(name)
            yield
        finally:
            for name in registered:
                self.spark.catalog.dropTempView(name)

    def batch(self, query: str) -> list["Row"]:
        with self.tables(query):
            return self.spark.sql(query).collect()

    def assert_view(self, view: str, query: str) -> int:
        """The view's committed state equals ``query`` run as a batch; returns its row count."""
        state = multiset(self.runtime.state(view).collect())
        expected = multiset(self.batch(query))
        if state != expected:
            missing = sorted((expected - state).elements(), key=repr)[:10]
            extra = sorted((state - expected).elements(), key=repr)[:10]
            raise AssertionError(
                f"view {view} differs from the batch query: {sum(state.values())} rows vs {sum(expected.values())}; "
                f"missing {missing}, unexpected {extra}"
            )
        return sum(state.values())


def batch_view(runtime: EpochRuntime, query: str) -> list["Row"]:
    """``query`` run as an ordinary Spark batch query over the committed source rows."""
    return Oracle(runtime).batch(query)


def assert_view_matches_batch(runtime: EpochRuntime, view: str, query: str) -> int:
    return Oracle(runtime).assert_view(view, query)


def assert_views_match_batch(runtime: EpochRuntime, views: Mapping[str, str]) -> dict[str, int]:
    """Every view of ``views`` (name -> query) against one oracle: the sources are read once."""
    oracle = Oracle(runtime)
    return {view: oracle.assert_view(view, query) for view, query in views.items()}


def assert_source_exact(runtime: EpochRuntime, source: str) -> int:
    """The committed source equals a fresh read of all committed offsets: nothing lost, nothing doubled."""
    columns = list(runtime.pipeline.sources[source].column_names)
    expected = Oracle(runtime).source_frame(source).collect()
    state = multiset(runtime.state(source).select(*columns).collect())
    assert state == multiset(expected), f"{source} differs from its committed offsets"
    return sum(state.values())


def sink_rows(runtime: EpochRuntime, sink: str) -> Counter:
    s = runtime.sink(sink)
    con = duckdb.connect(str(s.database), read_only=True)
    try:
        cols = ", ".join(f'"{c}"' for c in s.columns)
        return multiset(con.execute(f'SELECT {cols} FROM "{s.table}"').fetchall())
    finally:
        con.close()


def assert_sink_exactly_once(runtime: EpochRuntime, sink: str) -> int:
    """The sink's target holds the view's committed rows exactly once (upsert: once per distinct row)."""
    definition = runtime.pipeline.sinks[sink]
    view_rows = multiset(runtime.state(definition.from_table).collect())
    target = sink_rows(runtime, sink)
    if definition.options.get("type") == "upsert":
        view_rows = Counter(dict.fromkeys(view_rows, 1))
    assert target == view_rows, f"sink {sink}: {sum(target.values())} rows, view has {sum(view_rows.values())}"
    committed = runtime.controller.epoch_log.committed_epoch()
    assert runtime.controller.sink_coordinator.delivered_epoch(sink) == committed
    recorded = runtime.sink(sink).delivered_epoch()  # the target's own record, when it keeps one
    assert recorded in (None, committed), f"sink {sink}: the target says it holds epoch {recorded}, not {committed}"
    return sum(target.values())


def frame(spark: Any, rows: list[tuple], ddl: str) -> Any:
    """A DataFrame of ``rows`` built from literals: unlike createDataFrame(list), which scans a
    Python RDD, it needs no Python worker processes, and the property tests build many."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    fields = StructType.fromDDL(ddl).fields
    if not rows:
        return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in fields])
    structs = [
        F.struct(*[F.lit(value).cast(f.dataType).alias(f.name) for value, f in zip(row, fields, strict=True)])
        for row in rows
    ]
    return spark.range(1).select(F.inline(F.array(*structs)))


def iceberg_table(home: Path, name: str) -> Any:
    """Iceberg table ``name`` (``namespace.table``) of an Epochal home's default catalog, opened as
    another tool would: a fresh pyiceberg SqlCatalog on the catalog file and warehouse."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "epochal",
        uri=f"sqlite:///{(home / 'iceberg-catalog.db').resolve()}",
        warehouse=str((home / "iceberg-warehouse").resolve()),
    )
    return catalog.load_table(name)
