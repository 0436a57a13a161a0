"""JSON lines parsed into a source's records on Spark, and the lines that are none into dead
letters with their reasons: the log connector's lines and posix_fs's JSON files go through it.

Lines come as ``split``, ``offset`` and ``raw`` (blank lines already dropped). Each line is parsed
once with the declared columns (``from_json``, permissive, the corrupt-record field telling misfits
apart); reasons are worked out only for the rejected lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import reduce
from typing import TYPE_CHECKING

from epochal.connectors.base import FITS, SourceBatch
from epochal.pipeline.model import Column
from epochal.sql import quote
from epochal.storage.upsert import DELETE, OFFSET_COLUMN, OP_COLUMN, SPLIT_COLUMN, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame

#: JSON key reserved for the change operation ("_op": "delete"); never a column
OP_KEY = "_op"
#: ``_op`` values (lower-cased) that make a record of a keyed source an upsert; absent is one too
UPSERT_OPS = ("insert", "upsert", "update")
#: the field from_json puts a line that does not fit in
CORRUPT = "__epochal_corrupt_record"
#: how much of a value a reason quotes
SHOWN_VALUE_CHARS = 80


def plain_records(lines: "DataFrame", columns: "tuple[Column, ...]") -> SourceBatch:
    """Records of a source without a key: each line that parses as the declared ``columns`` is a
    row; the others are dead letters."""
    from pyspark.sql import functions as F

    parsed = parsed_once(lines, {"_parsed": parse_json(F.col("raw"), columns)})
    # from_json puts the whole line in the corrupt column for malformed JSON, non-objects and
    # values that do not convert to the declared type; it never returns NULL for a non-blank line
    good = F.col("_parsed").isNotNull() & F.col("_parsed").getField(CORRUPT).isNull()
    values = [F.col("_parsed").getField(c.key).alias(c.name) for c in columns]
    rows = parsed.where(good).select(*values)

    def explain(rejected: "DataFrame") -> "DataFrame":
        return rejected.select("split", "offset", "raw", misfit_reason(F.col("raw"), columns).alias("reason"))

    marked = parsed.select(*values, good.alias(FITS))
    return SourceBatch(rows=rows, rejected=parsed.where(~good), explain=explain, marked=marked)


def keyed_records(lines: "DataFrame", columns: "tuple[Column, ...]", primary_key: Sequence[str]) -> SourceBatch:
    """Records of a source with a primary key: the declared columns, then ``_op`` ('upsert' or
    'delete'), ``_split`` and ``_offset`` (which order the records of one key; see
    ``epochal.storage.upsert``). A delete needs only its key: its other fields are ignored, so they
    cannot make it a dead letter, and come out NULL."""
    from pyspark.sql import functions as F

    by_name = {c.name: c for c in columns}
    keys = tuple(by_name[k] for k in primary_key)
    raw = F.col("raw")
    # One parse of every field and _op for every line. The key and _op alone decide what a
    # record is (a delete is valid when they are), so a line whose full parse does not fit is
    # parsed again for them alone: CASE WHEN evaluates that second parse only for such lines,
    # rare, where every line once paid for two parses. _op is read
    # as STRING, which takes any JSON value (5 comes back as "5"), so an odd _op is reported.
    parsed = parsed_once(lines, {"_parsed": parse_json(raw, (*columns, Column(OP_KEY, "STRING")))})
    row_fits = F.col("_parsed").isNotNull() & F.col("_parsed").getField(CORRUPT).isNull()
    # (behind a barrier of its own, so it too is evaluated once per line, and only when needed)
    parsed = parsed_once(parsed, {"_head": F.when(~row_fits, parse_json(raw, (*keys, Column(OP_KEY, "STRING"))))})
    head = F.col("_head")

    def head_field(key: str) -> "SparkColumn":
        return F.when(row_fits, F.col("_parsed").getField(key)).otherwise(head.getField(key))

    op_text = head_field(OP_KEY)
    lowered = F.lower(op_text)
    parsed = parsed.withColumn(
        "_op_norm",
        F.when(op_text.isNull() | lowered.isin(*UPSERT_OPS), F.lit(UPSERT)).when(
            lowered == DELETE, F.lit(DELETE)
        ),  # NULL: unknown
    )
    op = F.col("_op_norm")
    is_delete = op == DELETE
    head_fits = row_fits | (head.isNotNull() & head.getField(CORRUPT).isNull())
    missing = [head_field(k.key).isNull() for k in keys]
    key_missing = reduce(lambda a, b: a | b, missing)
    good = head_fits & op.isNotNull() & ~key_missing & (is_delete | row_fits)

    values = [
        head_field(c.key).alias(c.name)
        if c in keys
        else F.when(~is_delete, F.col("_parsed").getField(c.key)).alias(c.name)
        for c in columns
    ]
    record = [
        *values,
        op.alias(OP_COLUMN),
        F.col("split").alias(SPLIT_COLUMN),
        F.col("offset").cast("bigint").alias(OFFSET_COLUMN),
    ]
    rows = parsed.where(good).select(*record)

    def explain(rejected: "DataFrame") -> "DataFrame":
        # only the fields a record needs can make it a misfit: the key for a delete, all for an
        # upsert (a delete whose key does not fit is still known as one because from_json keeps
        # the fields that did parse, spark.sql.json.enablePartialResults; without it the reason
        # lists all fields)
        misfit = F.when(is_delete, misfit_reason(raw, keys)).otherwise(misfit_reason(raw, columns))
        unknown_op = F.concat(F.lit(f'unknown {OP_KEY} "'), shorten(op_text), F.lit('": use insert, update or delete'))
        absent = F.concat_ws(
            "; ",
            *[
                F.when(m, F.lit(f"primary key column '{k.name}' is missing or null"))
                for k, m in zip(keys, missing, strict=True)
            ],
        )
        reason = (
            F.when(~head_fits, misfit)  # malformed, not an object, or a key of the wrong type
            .when(op.isNull(), unknown_op)
            .when(key_missing, absent)
            .otherwise(misfit)  # an upsert whose other fields do not fit
        )
        return rejected.select("split", "offset", "raw", reason.alias("reason"))

    marked = parsed.select(*record, good.alias(FITS))
    return SourceBatch(rows=rows, rejected=parsed.where(~good), explain=explain, marked=marked)


def parse_json(raw: "SparkColumn", columns: "Iterable[Column]") -> "SparkColumn":
    """``raw`` parsed as a struct of ``columns`` plus the corrupt-record field."""
    from pyspark.sql import functions as F

    # (JSON keys are case-sensitive: fields go by the DDL's spelling, ``Column.key``)
    fields = [f"{quote(c.key)} {c.type}" for c in columns] + [f"{quote(CORRUPT)} STRING"]
    return F.from_json(raw, ", ".join(fields), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})


def parsed_once(lines: "DataFrame", parses: Mapping[str, "SparkColumn"]) -> "DataFrame":
    """``lines`` with a column per parse, each parse evaluated once per line.

    Added with ``withColumn``, a parse is an alias the optimizer may copy into every expression
    that reads it: the record filter is pushed below the projection and each of its references
    becomes a from_json call of its own, and so does each field read afterwards. A keyed read's
    plan then held 13 from_json calls per line (100,000 lines: 1.6 s to read, 0.8-1.1 s parsed
    once). Generator outputs are never inlined, so producing the parses with ``inline`` of a
    one-element array is a barrier the filter stays above."""
    from pyspark.sql import functions as F

    once = F.struct(*[parse.alias(name) for name, parse in parses.items()])
    return lines.select("*", F.inline(F.array(once)))


def shorten(text: "SparkColumn") -> "SparkColumn":
    """``text`` cut to what a reason shows."""
    from pyspark.sql import functions as F

    return F.when(
        F.length(text) > SHOWN_VALUE_CHARS, F.concat(F.substring(text, 1, SHOWN_VALUE_CHARS), F.lit("..."))
    ).otherwise(text)


def misfit_reason(raw: "SparkColumn", columns: "tuple[Column, ...]") -> "SparkColumn":
    """Why ``raw`` was rejected, as a sentence: malformed JSON, not an object, or which fields do
    not fit their declared type and what they held instead. Only evaluated for rejected lines."""
    from pyspark.sql import functions as F

    variant = F.try_parse_json(raw)
    kind = F.split(F.schema_of_variant(variant), "<").getItem(0)
    got = (
        F.when(kind == "ARRAY", F.lit("an array"))
        .when(kind == "STRING", F.lit("a string"))
        .when(kind == "BOOLEAN", F.lit("a boolean"))
        .when(kind == "VOID", F.lit("null"))
        .otherwise(F.lit("a number"))
    )
    misfits = []
    for c in columns:
        typed = F.from_json(raw, f"{quote(c.key)} {c.type}").getField(c.key)
        # VARIANT keeps the value as written, so the reason can quote it
        value = F.from_json(raw, f"{quote(c.key)} VARIANT").getField(c.key)
        shown = shorten(F.to_json(value))
        misfits.append(
            F.when(
                typed.isNull() & value.isNotNull() & ~F.is_variant_null(value),
                F.concat(F.lit(f"field '{c.key}': expected {c.type}, got "), shown),
            )
        )
    fields = F.concat_ws("; ", *misfits) if misfits else F.lit("")
    return (
        F.when(F.json_object_keys(raw).isNull() & variant.isNull(), F.lit("malformed JSON"))
        .when(F.json_object_keys(raw).isNull(), F.concat(F.lit("not a JSON object: got "), got))
        .when(fields != "", fields)
        .otherwise(F.lit("does not fit the declared schema"))
    )
