"""Files where they land: RisingWave's ``posix_fs`` source.

``posix_fs.root`` is a directory; each regular file in it whose name matches ``match_pattern`` (a
shell glob such as ``*.parquet``) is a split. A split's offset is its size in bytes: a new file is
planned at injection as ``[0, size)`` and read whole in that one epoch; once read, its range is empty
for good. So a file is never read twice, nor differently: the read checks that the file still has
the size it was planned with, and a file that changed in between becomes a dead letter naming the
change instead of rows that differ from what the plan saw. Changes to a file after its epoch are not
read: land new data as a new file (write it under a name that does not match, then rename it in).

What the files hold is the FORMAT ... ENCODE ... clause:

* ``FORMAT PLAIN ENCODE PARQUET``: columns by name; a missing column is NULL.
* ``FORMAT PLAIN ENCODE CSV (without_header = 'false', delimiter = ',')``: one record per line; with
  a header (the default) columns are found by the header's names, without one by position. An empty
  field is NULL; a line with the wrong number of fields or a value that does not convert to its
  column's type is a dead letter.
* ``FORMAT PLAIN ENCODE JSON`` and ``FORMAT UPSERT ENCODE JSON``: one JSON object per line, read as
  the log connector reads them (a keyed table's ``_op`` marks deletes).
* ``FORMAT DEBEZIUM ENCODE JSON``: one Debezium change event per line, with or without the
  ``{"schema": ..., "payload": ...}`` wrapper: ``op`` c, r and u upsert ``after``; d deletes the key
  in ``before``. Needs a table with a PRIMARY KEY (the loader says so).
"""

from __future__ import annotations

import csv
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epochal.connectors.base import DEAD_LETTER_SCHEMA, SourceBatch, SplitRange
from epochal.connectors.json_lines import CORRUPT, misfit_reason, parse_json, parsed_once, shorten
from epochal.connectors.log import LogConfig, LogSource, record_lines, valid_split_name
from epochal.errors import EpochalError
from epochal.options import (
    ENCODE_KEY,
    ENCODE_OPTION_PREFIX,
    FORMAT_KEY,
    clause_text,
    format_encode,
    unknown_option_problems,
    with_options,
)
from epochal.storage.upsert import DELETE, OFFSET_COLUMN, OP_COLUMN, SPLIT_COLUMN, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from epochal.pipeline.model import Column, SourceDef

POSIX_FS_OPTIONS = ("connector", "posix_fs.root", "match_pattern")
#: (FORMAT, ENCODE) -> the ENCODE clause's options and their defaults
CLAUSES: dict[tuple[str, str], dict[str, str]] = {
    ("plain", "parquet"): {},
    ("plain", "csv"): {"without_header": "false", "delimiter": ","},
    ("plain", "json"): {},
    ("upsert", "json"): {},
    ("debezium", "json"): {},
}
#: Debezium's ``op`` values: create, read (a snapshot row), update upsert ``after``; delete deletes
DEBEZIUM_UPSERT_OPS = ("c", "r", "u")
DEBEZIUM_DELETE_OP = "d"


@dataclass(frozen=True)
class PosixFsConfig:
    root: Path
    pattern: str
    format: str
    encode: str
    #: the ENCODE clause's options with their defaults filled in
    encode_options: Mapping[str, str]

    @property
    def header(self) -> bool:
        return self.encode_options.get("without_header", "false").lower() == "false"


def parse_posix_fs_options(options: Mapping[str, str], home: Path) -> tuple[PosixFsConfig | None, list[str]]:
    """The config for ``options`` (FORMAT/ENCODE included) and the problems with them."""
    problems = unknown_option_problems("posix_fs", with_options(options), POSIX_FS_OPTIONS)
    raw_root = (options.get("posix_fs.root") or "").strip()
    if not raw_root:
        problems.append("posix_fs source needs option posix_fs.root = '...', the directory the files land in")
    pattern = (options.get("match_pattern") or "*").strip() or "*"
    if "/" in pattern:
        problems.append(
            f"option 'match_pattern' = '{pattern}' names a subdirectory: it matches file names in "
            f"posix_fs.root, e.g. '*.parquet'; point posix_fs.root at the subdirectory instead"
        )
    fmt, encode, clause = format_encode(options)
    known = CLAUSES.get((fmt or "", encode or ""))
    if fmt is None:
        problems.append(
            "posix_fs source needs a FORMAT ... ENCODE ... clause after WITH (...), e.g. FORMAT PLAIN ENCODE "
            "PARQUET, FORMAT PLAIN ENCODE CSV, FORMAT PLAIN ENCODE JSON or FORMAT DEBEZIUM ENCODE JSON"
        )
    elif known is None:
        supported = ", ".join(clause_text(f, e) for f, e in CLAUSES)
        problems.append(f"the posix_fs connector does not read {clause_text(fmt, encode)}: use one of {supported}")
    encode_options: dict[str, str] = {}
    if known is not None:
        for key in clause:
            if key not in known:
                takes = ", ".join(known) or "no options"
                problems.append(f"ENCODE {encode.upper() if encode else ''} takes {takes}, not '{key}': remove it")
        encode_options = {**known, **{k: v for k, v in clause.items() if k in known}}
        if "delimiter" in encode_options and len(encode_options["delimiter"]) != 1:
            problems.append(
                f"ENCODE CSV delimiter = '{encode_options['delimiter']}' must be one character, e.g. ',' or ';'"
            )
        header = encode_options.get("without_header")
        if header is not None and header.lower() not in ("true", "false"):
            problems.append(f"ENCODE CSV without_header = '{header}' must be 'true' or 'false'")
    if problems or fmt is None or encode is None:
        return None, problems
    root = Path(raw_root).expanduser()
    if not root.is_absolute():
        root = home / root
    return PosixFsConfig(root, pattern, fmt, encode, encode_options), []


class PosixFsConnectorSpec:
    name = "posix_fs"
    #: what the offsets point to: the directory, which files, and how their bytes become records
    identity_options = (
        "posix_fs.root",
        "match_pattern",
        FORMAT_KEY,
        ENCODE_KEY,
        ENCODE_OPTION_PREFIX + "without_header",
        ENCODE_OPTION_PREFIX + "delimiter",
    )
    #: JSON keys, CSV headers and Parquet columns are looked up as the DDL spells a column
    fields_by_spelling = True

    def identity_value(self, option: str, value: str | None, home: Path | None = None) -> str | None:
        if option == "posix_fs.root" and value is not None and value.strip():
            path = os.path.expanduser(value.strip())
            if home is not None and not os.path.isabs(path):
                path = os.path.join(os.path.abspath(home), path)
            return os.path.normpath(path)
        if option == "match_pattern":
            return (value or "*").strip() or "*"
        if option in (FORMAT_KEY, ENCODE_KEY) and value is not None:
            return value.strip().lower()
        if option == ENCODE_OPTION_PREFIX + "without_header":
            return (value or "false").strip().lower()
        if option == ENCODE_OPTION_PREFIX + "delimiter":
            return value or ","
        return value

    def validate(self, columns: "tuple[Column, ...]", options: Mapping[str, str]) -> list[str]:
        _, problems = parse_posix_fs_options(options, Path("."))
        return problems

    def create(self, source: "SourceDef", home: Path) -> "PosixFsSource":
        config, problems = parse_posix_fs_options(source.options, home)
        if problems or config is None:
            raise EpochalError(f"source {source.name}: " + "; ".join(problems))
        return PosixFsSource(config, source.columns, source.primary_key)


# --- planning (no Spark) --------------------------------------------------------------------------


class PosixFsSource:
    def __init__(self, config: PosixFsConfig, columns: "tuple[Column, ...]", primary_key: tuple[str, ...] = ()):
        self.config = config
        self.columns = columns
        self.primary_key = primary_key

    def files(self) -> dict[str, int]:
        """Each matching file's name and size now, by name. Hidden files are editors' and copy
        tools' temporaries; a name Spark would read as a glob is refused (renaming it fixes it)."""
        root = self.config.root
        if not root.is_dir():
            return {}  # nothing has landed yet
        found = {}
        for entry in os.scandir(root):
            if entry.name.startswith(".") or not fnmatch.fnmatchcase(entry.name, self.config.pattern):
                continue
            if not entry.is_file():
                continue
            if not valid_split_name(entry.name):
                raise EpochalError(
                    f"file {entry.path} matches match_pattern but its name is not one Epochal reads: rename it to "
                    f"use only letters, digits, '_', '-' and '.'"
                )
            found[entry.name] = entry.stat().st_size
        return dict(sorted(found.items()))

    def plan(self, start: Mapping[str, int]) -> list[SplitRange]:
        """A file not read yet is read whole, ``[0, size)``; a file read before stays at its offset
        (an empty range): it is never read again, whatever happened to it since. An empty file waits
        until it has bytes."""
        return [SplitRange(name, start.get(name, 0), start.get(name, 0) or size) for name, size in self.files().items()]

    # --- reading (Spark) --------------------------------------------------------------------------

    def read(self, spark: "SparkSession", ranges: list[SplitRange]) -> SourceBatch:
        planned = [r for r in ranges if r.count > 0]
        intact, changed = [], []
        for r in planned:
            if r.start != 0:
                raise EpochalError(
                    f"posix_fs split '{r.split}' was planned from byte {r.start}: a file is read whole, from byte 0; "
                    f"reset the source's offsets"
                )
            path = self.config.root / r.split
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                changed.append((r, "it was deleted or renamed after it was planned"))
                continue
            if size != r.end:
                changed.append(
                    (r, f"it had {r.end} bytes when it was planned and has {size} now: it changed after it was planned")
                )
            else:
                intact.append(r)
        if self.config.encode == "parquet":
            batch = self._parquet(spark, intact)
        else:
            lines = self._lines(spark, intact)
            if self.config.encode == "csv":
                batch = self._csv(lines)
            elif self.config.format == "debezium":
                batch = debezium_records(lines, self.columns, self.primary_key)
            else:
                batch = LogSource(LogConfig(self.config.root), self.columns, self.primary_key).parse_lines(lines)
        if not changed:
            return batch
        fix = "land new data as a new file (write it under another name, then rename it in)"
        stale = spark.createDataFrame(
            [(r.split, 0, str(self.config.root / r.split), f"{why}; it was not read: {fix}") for r, why in changed],
            DEAD_LETTER_SCHEMA,
        )
        dead = stale if batch.rejected is None else batch.dead_letters.unionByName(stale)  # type: ignore[union-attr]
        return SourceBatch(rows=batch.rows, rejected=dead, explain=lambda rejected: rejected)

    def _lines(self, spark: "SparkSession", ranges: list[SplitRange]) -> "DataFrame":
        """The files' lines (``split``, ``offset``: 0-based line number, ``raw``), read on the driver:
        a landed file is read once, whole. A line's trailing CR is dropped; bytes that are not UTF-8
        become U+FFFD, so a bad line is a dead letter, not a failed read."""
        import pyarrow as pa

        splits: list[str] = []
        offsets: list[int] = []
        raws: list[str] = []
        for r in ranges:
            data = (self.config.root / r.split).read_bytes()[: r.end]
            lines = record_lines(data.decode("utf-8", errors="replace"))
            splits += [r.split] * len(lines)
            offsets += range(len(lines))
            raws += lines
        columns = {"split": pa.array(splits, pa.string()), "offset": pa.array(offsets, pa.int64()), "raw": raws}
        ddl = "split STRING, offset BIGINT, raw STRING"
        if self.config.encode == "csv":
            # split here, where the lines are: Python's csv module knows CSV's quoting, and a UDF
            # would start Python workers for what the driver already holds
            delimiter = self.config.encode_options.get("delimiter", ",")
            columns["_fields"] = pa.array([_csv_fields(line, delimiter) for line in raws], pa.list_(pa.string()))
            ddl += ", _fields ARRAY<STRING>"
        table = pa.table(columns)
        if not table.num_rows:
            return spark.createDataFrame([], ddl)
        return spark.createDataFrame(table)

    def _keyed(self, rows: "DataFrame") -> "DataFrame":
        """A keyed table's PLAIN rows: each one an upsert of its key, in file order."""
        from pyspark.sql import functions as F

        if not self.primary_key:
            return rows.drop("split", "offset")
        return rows.select(
            *[F.col(c.name) for c in self.columns],
            F.lit(UPSERT).alias(OP_COLUMN),
            F.col("split").alias(SPLIT_COLUMN),
            F.col("offset").cast("bigint").alias(OFFSET_COLUMN),
        )

    def _parquet(self, spark: "SparkSession", ranges: list[SplitRange]) -> SourceBatch:
        """Each file read by Spark with its own schema (from its footer), its columns found by name
        (case-insensitive; a missing one is NULL) and cast to the declared types. A value that does
        not convert (a STRING '12a' for a BIGINT column) makes its row a dead letter, where reading
        with the declared schema would fail the epoch, and every epoch after it."""
        from functools import reduce

        from pyspark.sql import functions as F

        from epochal.sql import quote

        columns = self.columns
        names = [f"_v{i}" for i in range(len(columns))]
        texts = [f"_t{i}" for i in range(len(columns))]
        if not ranges:
            ddl = ", ".join(f"{quote(c.name)} {c.type}" for c in columns)
            empty = spark.createDataFrame([], f"{ddl}, split STRING, offset BIGINT")
            return SourceBatch(rows=self._keyed(empty))
        frames = []
        for r in ranges:
            # one read per file, so each row knows its file; the ids keep the file's row order
            frame = spark.read.parquet(str(self.config.root / r.split))
            found = {field.name.lower(): field for field in frame.schema.fields}
            values, shown = [], []
            for c in columns:
                field = found.get(c.key.lower())
                if field is None:
                    values.append(F.lit(None).cast(c.type))
                    shown.append(F.lit(None).cast("string"))
                    continue
                value = F.col(quote(field.name))
                same = field.dataType.simpleString().lower() == c.type.lower().replace(" ", "")
                values.append(value if same else value.try_cast(c.type))
                shown.append(F.to_json(F.struct(value.alias("v"))) if not same else F.lit(None).cast("string"))
            frames.append(
                frame.select(
                    *[v.alias(n) for v, n in zip(values, names, strict=True)],
                    *[t.alias(n) for t, n in zip(shown, texts, strict=True)],
                    F.lit(r.split).alias("split"),
                    F.monotonically_increasing_id().alias("offset"),
                )
            )
        read = reduce(lambda a, b: a.unionByName(b), frames)
        # a value that was there (its JSON is not {}: to_json leaves NULL fields out) but did not cast
        misfit = [
            F.col(t).isNotNull() & (F.col(t) != "{}") & F.col(n).isNull() for t, n in zip(texts, names, strict=True)
        ]
        bad = reduce(lambda a, b: a | b, misfit, F.lit(False))
        rows = read.where(~bad).select(
            *[F.col(n).alias(c.name) for n, c in zip(names, columns, strict=True)], "split", "offset"
        )

        def explain(rejected: "DataFrame") -> "DataFrame":
            reasons = [
                F.when(
                    m,
                    F.concat(
                        F.lit(f"field '{c.key}': expected {c.type}, got "), shorten(F.get_json_object(F.col(t), "$.v"))
                    ),
                )
                for m, c, t in zip(misfit, columns, texts, strict=True)
            ]
            raw = F.to_json(
                F.struct(
                    *[F.get_json_object(F.col(t), "$.v").alias(c.key) for t, c in zip(texts, columns, strict=True)]
                )
            )
            return rejected.select("split", "offset", raw.alias("raw"), F.concat_ws("; ", *reasons).alias("reason"))

        return SourceBatch(rows=self._keyed(rows), rejected=read.where(bad), explain=explain)

    def _csv(self, lines: "DataFrame") -> SourceBatch:
        """CSV lines split by Python's csv module (quotes, escaped quotes, the delimiter), then each
        column's text cast by Spark to its type; an empty field is NULL."""
        from pyspark.sql import functions as F

        header = self.config.header
        columns = self.columns
        lines = lines.where(~F.col("raw").rlike(r"^\s*$"))
        # the header of each file: its first line's fields (line 0); columns are found by name
        if header:
            heads = lines.where(F.col("offset") == 0).select(
                F.col("split").alias("_hsplit"), F.col("_fields").alias("_head")
            )
            lines = lines.where(F.col("offset") > 0).join(heads, F.col("split") == F.col("_hsplit"), "left")
            positions = [
                F.array_position(F.transform("_head", lambda h: F.lower(F.trim(h))), c.key.lower()) - 1 for c in columns
            ]
            width = F.size("_head")
        else:
            positions = [F.lit(i) for i in range(len(columns))]
            width = F.lit(len(columns))
        texts = [F.when(p >= 0, F.get(F.col("_fields"), p)) for p in positions]
        texts = [F.when(t != "", t) for t in texts]
        typed = [t.try_cast(c.type) for t, c in zip(texts, columns, strict=True)]
        shape_ok = F.col("_fields").isNotNull() & (F.size("_fields") == width)
        fits = [t.isNull() | v.isNotNull() for t, v in zip(texts, typed, strict=True)]
        good = shape_ok
        for fit in fits:
            good = good & fit
        parsed = lines.select(
            "split",
            "offset",
            "raw",
            *[v.alias(f"_v{i}") for i, v in enumerate(typed)],
            good.alias("_good"),
            shape_ok.alias("_shape"),
            F.size("_fields").alias("_n"),
            width.alias("_width"),
            *[t.alias(f"_t{i}") for i, t in enumerate(texts)],
        )
        rows = parsed.where("_good").select(
            *[F.col(f"_v{i}").alias(c.name) for i, c in enumerate(columns)], "split", "offset"
        )

        def explain(rejected: "DataFrame") -> "DataFrame":
            misfits = [
                F.when(
                    F.col(f"_t{i}").isNotNull() & F.col(f"_v{i}").isNull(),
                    F.concat(F.lit(f"field '{c.key}': expected {c.type}, got '"), shorten(F.col(f"_t{i}")), F.lit("'")),
                )
                for i, c in enumerate(columns)
            ]
            reason = (
                F.when(F.col("_n").isNull() | (F.col("_n") < 0), F.lit("malformed CSV (an unbalanced quote)"))
                .when(
                    ~F.col("_shape"),
                    F.concat(
                        F.lit("expected "),
                        F.col("_width").cast("string"),
                        F.lit(" fields, got "),
                        F.col("_n").cast("string"),
                    ),
                )
                .otherwise(F.concat_ws("; ", *misfits))
            )
            return rejected.select("split", "offset", "raw", reason.alias("reason"))

        return SourceBatch(rows=self._keyed(rows), rejected=parsed.where(~F.col("_good")), explain=explain)


def _csv_fields(line: str, delimiter: str) -> list[str] | None:
    """The fields of one CSV line, or None when it is not CSV (an unbalanced quote)."""
    if not line.strip():
        return []
    try:
        rows = list(csv.reader([line], delimiter=delimiter, strict=True))
    except csv.Error:
        return None
    return rows[0] if rows else []


def debezium_records(lines: "DataFrame", columns: "tuple[Column, ...]", primary_key: tuple[str, ...]) -> SourceBatch:
    """Debezium change events, one per line, as a keyed table's records (the declared columns, then
    ``_op``, ``_split``, ``_offset``): c, r and u upsert ``after``; d deletes the key of ``before``.
    The ``payload`` wrapper of Debezium's JSON converter with schemas is taken off when present."""
    from functools import reduce

    from pyspark.sql import functions as F

    if not primary_key:
        raise EpochalError("FORMAT DEBEZIUM needs a table with a PRIMARY KEY: declare one")
    by_name = {c.name: c for c in columns}
    keys = tuple(by_name[k] for k in primary_key)
    raw = F.col("raw")
    lines = lines.where(~raw.rlike(r"^\s*$"))
    body = F.coalesce(F.get_json_object(raw, "$.payload"), raw)
    op_text = F.get_json_object(body, "$.op")
    op = F.when(op_text.isin(*DEBEZIUM_UPSERT_OPS), F.lit(UPSERT)).when(op_text == DEBEZIUM_DELETE_OP, F.lit(DELETE))
    image = F.when(op == UPSERT, F.get_json_object(body, "$.after")).when(
        op == DELETE, F.get_json_object(body, "$.before")
    )
    staged = lines.select(
        "split", "offset", "raw", op_text.alias("_op_text"), op.alias("_op_norm"), image.alias("_image")
    )
    image_col = F.col("_image")
    parsed = parsed_once(staged, {"_parsed": parse_json(image_col, columns), "_head": parse_json(image_col, keys)})
    op_col = F.col("_op_norm")
    is_delete = op_col == DELETE
    head_fits = F.col("_head").isNotNull() & F.col("_head").getField(CORRUPT).isNull()
    row_fits = F.col("_parsed").isNotNull() & F.col("_parsed").getField(CORRUPT).isNull()
    missing = [F.col("_head").getField(k.key).isNull() for k in keys]
    key_missing = reduce(lambda a, b: a | b, missing)
    good = op_col.isNotNull() & image_col.isNotNull() & head_fits & ~key_missing & (is_delete | row_fits)
    values = [
        F.col("_head").getField(c.key).alias(c.name)
        if c in keys
        else F.when(~is_delete, F.col("_parsed").getField(c.key)).alias(c.name)
        for c in columns
    ]
    rows = parsed.where(good).select(
        *values,
        op_col.alias(OP_COLUMN),
        F.col("split").alias(SPLIT_COLUMN),
        F.col("offset").cast("bigint").alias(OFFSET_COLUMN),
    )

    def explain(rejected: "DataFrame") -> "DataFrame":
        op_shown = F.col("_op_text")
        side = F.when(is_delete, F.lit('"before"')).otherwise(F.lit('"after"'))
        reason = (
            F.when(F.json_object_keys(raw).isNull(), misfit_reason(raw, ()))
            .when(op_shown.isNull(), F.lit('no Debezium "op" field: a change event has op c, r, u or d'))
            .when(op_col.isNull(), F.concat(F.lit('Debezium op "'), shorten(op_shown), F.lit('" is not c, r, u or d')))
            .when(image_col.isNull(), F.concat(F.lit("op "), op_shown, F.lit(" has no "), side, F.lit(" object")))
            .when(
                head_fits & key_missing,
                F.concat_ws(
                    "; ",
                    *[
                        F.when(m, F.lit(f"primary key column '{k.name}' is missing or null"))
                        for k, m in zip(keys, missing, strict=True)
                    ],
                ),
            )
            .otherwise(F.when(is_delete, misfit_reason(image_col, keys)).otherwise(misfit_reason(image_col, columns)))
        )
        return rejected.select("split", "offset", "raw", reason.alias("reason"))

    return SourceBatch(rows=rows, rejected=parsed.where(~good), explain=explain)
