"""The column types a CREATE TABLE or CREATE SOURCE declares: their spellings, Spark's names for
them, the ones refused and why, and the grammar that reads one (nested ARRAY and STRUCT types and
DECIMAL's precision and scale included)."""

from __future__ import annotations

from epochal.pipeline.ddl_tokens import Token, TokenReader

#: Accepted type spellings -> Spark's canonical DDL name. DECIMAL is handled apart (precision, scale).
TYPE_NAMES = {
    "BIGINT": "BIGINT",
    "LONG": "BIGINT",
    "INT": "INT",
    "INTEGER": "INT",
    "SMALLINT": "SMALLINT",
    "SHORT": "SMALLINT",
    "TINYINT": "TINYINT",
    "BYTE": "TINYINT",
    "DOUBLE": "DOUBLE",
    "FLOAT": "FLOAT",
    "REAL": "FLOAT",
    "BOOLEAN": "BOOLEAN",
    "BOOL": "BOOLEAN",
    "STRING": "STRING",
    "VARCHAR": "STRING",
    "TEXT": "STRING",
    "DATE": "DATE",
    "TIMESTAMP": "TIMESTAMP",
}
DECIMAL_NAMES = ("DECIMAL", "DEC", "NUMERIC")
NESTED_TYPES = ("ARRAY", "MAP", "STRUCT")
#: Types Spark has that a table cannot hold, with why and what to declare instead.
_REFUSED_TYPES = {
    # (Spark 4's TIME is a preview behind spark.sql.timeType.enabled, off by default: a query over
    # it fails [UNSUPPORTED_TIME_TYPE]; the driver path, the sinks and the oracle do not map it yet)
    "TIME": "Spark's TIME type is a preview, off by default (spark.sql.timeType.enabled), so Spark refuses "
    "any query over it; declare it STRING ('HH:MM:SS', compared in order as text) or INT seconds since midnight",
    "VARIANT": "a table's changes are netted by comparing whole rows, and Spark cannot compare or group a "
    "VARIANT; declare it STRING (JSON text) and parse_json it where it is read",
}
SUPPORTED_TYPES = (
    "BIGINT, INT, SMALLINT, TINYINT, DOUBLE, FLOAT, BOOLEAN, STRING, DATE, TIMESTAMP, DECIMAL(p,s), "
    "ARRAY<t>, STRUCT<name: t, ...>"
)
#: Spark's bounds and defaults for DECIMAL
MAX_DECIMAL_PRECISION = 38
DEFAULT_DECIMAL = (10, 0)


class ColumnTypeGrammar(TokenReader):
    """Reads a column's type at the current token, as Spark DDL; problems are collected."""

    def column_type(self, column: str) -> str:
        token = self.peek()
        if token.kind != "word":
            raise self.fail(f"a type for column {column} ({SUPPORTED_TYPES})")
        self.advance()
        word = token.value.upper()
        if word in NESTED_TYPES and self.accept_punct("<"):
            return self.nested_type(word, column)
        params: list[int] = []
        if self.accept_punct("("):
            while True:
                number = self.peek()
                if number.kind != "number" or not number.value.isdigit():
                    raise self.fail(f"an integer type parameter for column {column}")
                params.append(int(self.advance().value))
                if self.accept_punct(")"):
                    break
                self.expect_punct(",", "',' or ')' in the type parameters")
        if word == "DOUBLE":
            self.accept_word("PRECISION")  # PostgreSQL/RisingWave spelling
        if word in DECIMAL_NAMES:
            return self.decimal(token, column, params)
        canonical = TYPE_NAMES.get(word)
        if canonical is None:
            reason = _REFUSED_TYPES.get(word)
            if reason is not None:
                self.problem(token, f"{word} column {column} is not supported: {reason}")
                return word
            self.problem(
                token,
                f"type '{token.value}' of column {column} is not supported: use one of {SUPPORTED_TYPES}",
            )
            return word
        if params and word != "VARCHAR":  # VARCHAR(n) is accepted and read as STRING
            self.problem(token, f"type {word} of column {column} takes no parameters: write {canonical}")
        return canonical

    def nested_type(self, word: str, column: str) -> str:
        """The rest of ARRAY<t> or STRUCT<name: t, ...> (the '<' read), as Spark DDL; MAP<k, v> is
        read to name it in its refusal.

        A struct's field names are backquoted as written: a JSON record's keys match them by
        their exact spelling, and Spark keeps them in the value's type."""
        if word == "ARRAY":
            element = self.column_type(f"{column}[]")
            self.expect_punct(">", f"'>' after the element type of ARRAY in column {column}")
            return f"ARRAY<{element}>"
        if word == "MAP":
            start = self.peek()
            key = self.column_type(f"{column} (map key)")
            self.expect_punct(",", f"',' between the key and value types of MAP in column {column}")
            value = self.column_type(f"{column} (map value)")
            self.expect_punct(">", f"'>' after the value type of MAP in column {column}")
            # Netting a change compares whole rows (a keyed table's upsert, a view's diff), and
            # Spark can neither compare nor group maps
            self.problem(
                start,
                f"MAP column {column} is not supported: Spark cannot compare or group maps, which a change "
                f"needs; declare it STRING (a JSON object arrives as its text) and read it in a view with "
                f"from_json({column}, 'MAP<{key}, {value}>')['key']",
            )
            return f"MAP<{key}, {value}>"
        fields: list[str] = []
        if self.accept_punct(">"):
            return "STRUCT<>"
        while True:
            name = self.peek()
            if name.kind not in ("word", "ident"):
                raise self.fail(f"a field name in the STRUCT of column {column}, e.g. STRUCT<os: STRING>")
            self.advance()
            self.accept_punct(":")
            field_type = self.column_type(f"{column}.{name.value}")
            escaped = name.value.replace("`", "``")
            fields.append(f"`{escaped}`: {field_type}")
            if self.accept_punct(">"):
                return f"STRUCT<{', '.join(fields)}>"
            self.expect_punct(",", f"',' or '>' after field {name.value} in the STRUCT of column {column}")

    def decimal(self, token: Token, column: str, params: list[int]) -> str:
        if len(params) > 2:
            self.problem(token, f"DECIMAL of column {column} takes at most (precision, scale)")
            return "DECIMAL"
        precision, scale = (params + list(DEFAULT_DECIMAL[len(params) :]))[:2]
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
            self.problem(
                token,
                f"DECIMAL({precision},{scale}) of column {column} is invalid: precision must be 1 to "
                f"{MAX_DECIMAL_PRECISION} and scale 0 to the precision",
            )
        return f"DECIMAL({precision},{scale})"
