"""Parsing the CREATE statements a pipeline is made of (RisingWave's DDL syntax).

Only the DDL around the query is parsed here; a materialized view's query is kept as text and
checked by :mod:`epochal.pipeline.query_checks` (Spark SQL, via sqlglot). Problems come back with the
line they are on, relative to the file: a syntax error stops parsing its statement, other
problems (a bad type, a duplicate column) are all collected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from epochal.options import ENCODE_KEY, ENCODE_OPTION_PREFIX, FORMAT_KEY
from epochal.pipeline.ddl_tokens import Token, _SyntaxError, tokenize
from epochal.pipeline.model import Column
from epochal.pipeline.statements import Problem, Statement

#: connectors whose source is declared without columns and read by tables FROM it (RisingWave's
#: shared CDC source): CREATE TABLE t (...) FROM source TABLE 'schema.table'
SHARED_CONNECTORS = ("postgres-cdc", "mysql-cdc")
SUPPORTED_STATEMENTS = "CREATE TABLE, CREATE SOURCE, CREATE MATERIALIZED VIEW and CREATE SINK"

FORMS = {
    "table": "CREATE TABLE name (column TYPE, ..., [PRIMARY KEY (column, ...)]) "
    "WITH (connector = '...', key = 'value', ...)",
    "source": "CREATE SOURCE name (column TYPE, ...) WITH (connector = '...', key = 'value', ...) "
    "[FORMAT PLAIN ENCODE JSON]",
    "view": "CREATE MATERIALIZED VIEW name AS SELECT ...",
    "sink": "CREATE SINK name FROM table WITH (connector = '...', key = 'value', ...)",
}

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

# Names become Spark table names and Dagster asset keys, so keep them plain.
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Options:
    values: dict[str, str] = field(default_factory=dict)
    #: line of each key, to point option problems at the right line
    lines: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedSource:
    """A CREATE TABLE or a CREATE SOURCE: both declare an input read through a connector."""

    #: "table" or "source", as declared (RisingWave: a table stores its rows, a source need not)
    kind: str
    name: str
    line: int
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    #: line of the PRIMARY KEY clause, 0 when there is none
    primary_key_line: int
    options: Options
    #: ``CREATE TABLE t (...) FROM source TABLE 'schema.table'``: the shared (CDC) source it reads
    #: and the upstream table's name, as written; empty otherwise
    from_source: str = ""
    from_table: str = ""


@dataclass(frozen=True)
class ParsedView:
    name: str
    line: int
    options: Options
    #: the text after AS, unstripped, so sqlglot's line numbers count from ``query_line``
    query_text: str
    #: file line of the AS keyword, where line 1 of ``query_text`` is
    query_line: int


@dataclass(frozen=True)
class ParsedSink:
    name: str
    line: int
    from_table: str
    from_line: int
    options: Options


Parsed = ParsedSource | ParsedView | ParsedSink


class _Parser:
    def __init__(self, statement: Statement):
        self.statement = statement
        self.tokens = tokenize(statement.text)
        self.i = 0
        self.kind = ""  # "table" / "source" / "view" / "sink" once known, for the form in error messages
        self.problems: list[Problem] = []
        #: "source bid" once the name is parsed; prefixes problems so they say what they are about
        self.subject = ""

    # -- helpers -------------------------------------------------------------------------
    def line(self, pos: int) -> int:
        return self.statement.line + self.statement.text.count("\n", 0, pos)

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.peek()
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return token

    def fail(self, expected: str, token: Token | None = None) -> _SyntaxError:
        token = token or self.peek()
        what = {
            "table": "CREATE TABLE",
            "source": "CREATE SOURCE",
            "view": "CREATE MATERIALIZED VIEW",
            "sink": "CREATE SINK",
        }
        message = f"syntax error in {what[self.kind]}: expected {expected}, found {token.describe()}"
        return _SyntaxError(token.start, f"{message}; the form is: {FORMS[self.kind]}")

    def problem(self, token: Token, message: str) -> None:
        prefix = f"{self.subject}: " if self.subject else ""
        self.problems.append(Problem(self.line(token.start), prefix + message))

    def accept_word(self, *words: str) -> bool:
        if self.peek().is_word(*words):
            self.advance()
            return True
        return False

    def expect_word(self, word: str) -> Token:
        if not self.peek().is_word(word):
            raise self.fail(word)
        return self.advance()

    def accept_punct(self, ch: str) -> bool:
        token = self.peek()
        if token.kind == "punct" and token.value == ch:
            self.advance()
            return True
        return False

    def expect_punct(self, ch: str, expected: str | None = None) -> None:
        if not self.accept_punct(ch):
            raise self.fail(expected or f"'{ch}'")

    def expect_end(self) -> None:
        if self.peek().kind != "end":
            raise self.fail("the end of the statement")

    def name(self, what: str, column: bool = False) -> tuple[str, Token]:
        """An identifier, lower-cased (names are case-insensitive). A table's name becomes a
        directory, a Spark table and a Dagster asset key, so it is letters, digits and underscores;
        a ``column`` may be any quoted name (```user-id```, ```Event Type```), as in Spark."""
        token = self.peek()
        if token.kind not in ("word", "ident"):
            raise self.fail(what)
        self.advance()
        value = token.value.lower()
        if column:
            if not value.strip() or _CONTROL_RE.search(value):
                self.problem(token, f"{what} '{token.value}' must hold a visible character and no control character")
            return value, token
        if not _NAME_RE.match(value):
            self.problem(
                token,
                f"{what} '{token.value}' must be letters, digits and underscores, not starting with "
                "a digit (names become Spark table, column and Dagster asset names)",
            )
        return value, token

    def if_not_exists(self) -> None:
        # Accepted for RisingWave compatibility; a pipeline is declarative, so it changes nothing.
        if self.accept_word("IF"):
            self.expect_word("NOT")
            self.expect_word("EXISTS")

    # -- statements ----------------------------------------------------------------------
    def parse(self) -> Parsed | None:
        first = self.peek()
        if not first.is_word("CREATE"):
            return self.unsupported()
        self.advance()
        if self.accept_word("TABLE"):
            self.kind = "table"
            return self.source(first)
        if self.accept_word("SOURCE"):
            self.kind = "source"
            return self.source(first)
        if self.peek().is_word("MATERIALIZED") and self.peek(1).is_word("VIEW"):
            self.i += 2
            self.kind = "view"
            return self.view(first)
        if self.accept_word("SINK"):
            self.kind = "sink"
            return self.sink(first)
        return self.unsupported()

    def unsupported(self) -> None:
        words = []
        for token in self.tokens[:2]:
            if token.kind != "word":
                break
            words.append(token.value.upper())
        shown = " ".join(words) or self.tokens[0].value
        hint = ""
        if words[:2] == ["CREATE", "VIEW"]:
            hint = " (use CREATE MATERIALIZED VIEW)"
        elif words[:1] == ["INSERT"]:
            hint = " (Epochal has no INSERT path yet: a table reads its rows WITH (connector = '...'))"
        self.problem(
            self.tokens[0],
            f"'{shown} ...' is not supported: a pipeline contains only {SUPPORTED_STATEMENTS} "
            f"statements{hint}",
        )

    def source(self, create: Token) -> ParsedSource:
        """CREATE TABLE or CREATE SOURCE (``self.kind``): the same clauses; the loader decides what
        each may have (a PRIMARY KEY needs a table)."""
        kind = self.kind
        self.if_not_exists()
        name, _ = self.name(f"{kind} name")
        self.subject = f"{kind} {name}"
        if self.peek().is_word("WITH"):
            at = self.i
            if kind == "source":
                # RisingWave's shared CDC source: a connection the tables read FROM (the loader resolves it)
                self.advance()
                options = self.options()
                if options.values.get("connector", "").lower() in SHARED_CONNECTORS:
                    self.expect_end()
                    return ParsedSource(kind, name, self.line(create.start), (), (), 0, options)
                self.i = at
            raise self.fail(f"the column list of {kind} {name}, e.g. {name} (id BIGINT, ts TIMESTAMP)")
        self.expect_punct("(", "'(' and the column list")
        columns: list[Column] = []
        column_tokens: dict[str, Token] = {}
        primary_key: list[str] = []
        key_token: Token | None = None
        while True:
            if self.peek().is_word("PRIMARY"):
                token = self.advance()
                self.expect_word("KEY")
                self.expect_punct("(", "'(' and the key columns")
                keys = [self.name("key column", column=True)[0]]
                while self.accept_punct(","):
                    keys.append(self.name("key column", column=True)[0])
                self.expect_punct(")")
                if key_token is not None:
                    self.problem(token, "PRIMARY KEY is declared twice; keep one")
                primary_key, key_token = keys, token
            else:
                column, token = self.name("column name", column=True)
                column_type = self.column_type(column)
                if self.peek().is_word("PRIMARY"):
                    pk = self.advance()
                    self.expect_word("KEY")
                    if key_token is not None:
                        self.problem(pk, "PRIMARY KEY is declared twice; keep one")
                    primary_key, key_token = [column], pk
                if column in column_tokens:
                    self.problem(token, f"column '{column}' is declared twice; rename or remove one")
                else:
                    column_tokens[column] = token
                    spelled = token.value if token.value != column else ""
                    columns.append(Column(column, column_type, spelled))
            if self.accept_punct(")"):
                break
            self.expect_punct(",", "',' or ')' after a column")
        from_source = from_table = ""
        if kind == "table" and self.peek().is_word("FROM"):
            # RisingWave's CDC table: FROM shared_source TABLE 'schema.table'
            self.advance()
            from_source, _ = self.name("source name after FROM")
            self.expect_word("TABLE")
            token = self.peek()
            if token.kind != "string":
                raise self.fail("the upstream table's name as a string after TABLE, e.g. TABLE 'public.orders'")
            from_table = self.advance().value
            self.expect_end()
            options = Options()
        elif kind == "table" and self.peek().kind == "end":
            # RisingWave's table filled by INSERT: parsed, so the loader says why it cannot be one
            options = Options()
        else:
            if self.peek().kind == "end":
                raise self.fail("WITH (connector = '...', ...) after the column list")
            self.expect_word("WITH")
            options = self.options()
            if self.peek().is_word("FORMAT"):
                options = self.format_encode(options)
            self.expect_end()
        if key_token is not None:
            types = {c.name: c.type for c in columns}
            for key in primary_key:
                if key not in column_tokens:
                    self.problem(
                        key_token,
                        f"PRIMARY KEY column '{key}' is not a column "
                        f"(columns: {', '.join(c.name for c in columns)})",
                    )
                elif types[key].startswith(NESTED_TYPES):
                    self.problem(
                        key_token,
                        f"PRIMARY KEY column '{key}' is {types[key].split('<')[0]}: a key is a scalar column "
                        f"(a field of it can be one: declare that field as a column of its own)",
                    )
        return ParsedSource(
            kind=kind,
            name=name,
            line=self.line(create.start),
            columns=tuple(columns),
            primary_key=tuple(primary_key),
            primary_key_line=self.line(key_token.start) if key_token else 0,
            options=options,
            from_source=from_source,
            from_table=from_table,
        )

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

    def options(self) -> Options:
        self.expect_punct("(", "'(' and the options, e.g. WITH (key = 'value')")
        values: dict[str, str] = {}
        lines: dict[str, int] = {}
        if self.accept_punct(")"):
            return Options(values, lines)
        while True:
            key_token = self.peek()
            key = self.option_key()
            if key.startswith("@"):
                self.problem(key_token, f"option '{key}' cannot start with '@': rename it")
            self.expect_punct("=", f"'=' after option {key}")
            value = self.option_value(key)
            if key in values:
                self.problem(key_token, f"option '{key}' is given twice; keep one")
            else:
                values[key] = value
                lines[key] = self.line(key_token.start)
            if self.accept_punct(")"):
                return Options(values, lines)
            self.expect_punct(",", "',' or ')' after an option")

    def format_encode(self, options: Options) -> Options:
        """RisingWave's ``FORMAT <format> ENCODE <encode> [(key = 'value', ...)]`` after WITH (...),
        kept among ``options`` under keys no WITH option can have (epochal.options.FORMAT_KEY); the
        connector says which combinations it reads."""
        values, lines = dict(options.values), dict(options.lines)
        token = self.expect_word("FORMAT")
        fmt = self.peek()
        if fmt.kind != "word":
            raise self.fail("a format after FORMAT, e.g. FORMAT PLAIN ENCODE JSON")
        self.advance()
        self.expect_word("ENCODE")
        encode = self.peek()
        if encode.kind != "word":
            raise self.fail("an encoding after ENCODE, e.g. FORMAT PLAIN ENCODE JSON")
        self.advance()
        values[FORMAT_KEY], lines[FORMAT_KEY] = fmt.value.lower(), self.line(token.start)
        values[ENCODE_KEY], lines[ENCODE_KEY] = encode.value.lower(), self.line(encode.start)
        if self.peek().kind == "punct" and self.peek().value == "(":
            clause = self.options()
            for key, value in clause.values.items():
                values[ENCODE_OPTION_PREFIX + key] = value
                lines[ENCODE_OPTION_PREFIX + key] = clause.lines[key]
        return Options(values, lines)

    def option_key(self) -> str:
        token = self.peek()
        if token.kind in ("string", "ident"):
            self.advance()
            return token.value.lower()
        if token.kind != "word":
            raise self.fail("an option name, e.g. connector or 'nexmark.table.type'")
        parts = [self.advance().value]
        # RisingWave allows bare dotted keys: nexmark.table.type = 'Bid'
        while self.peek().kind == "punct" and self.peek().value == "." and self.peek(1).kind == "word":
            self.advance()
            parts.append(self.advance().value)
        return ".".join(parts).lower()

    def option_value(self, key: str) -> str:
        token = self.peek()
        sign = ""
        if token.kind == "punct" and token.value in "+-" and self.peek(1).kind == "number":
            sign = "-" if token.value == "-" else ""
            self.advance()
            token = self.peek()
        if token.kind not in ("string", "number", "word", "ident"):
            raise self.fail(f"a value for option {key}, e.g. {key} = '...'")
        self.advance()
        return sign + token.value

    def view(self, create: Token) -> ParsedView:
        self.if_not_exists()
        name, _ = self.name("view name")
        self.subject = f"view {name}"
        options = Options()
        if self.accept_word("WITH"):
            options = self.options()
        as_token = self.expect_word("AS")
        query_text = self.statement.text[as_token.end :]
        if not query_text.strip():
            raise self.fail("a SELECT query after AS", self.tokens[-1])
        return ParsedView(
            name=name,
            line=self.line(create.start),
            options=options,
            query_text=query_text,
            query_line=self.line(as_token.start),
        )

    def sink(self, create: Token) -> ParsedSink:
        self.if_not_exists()
        name, _ = self.name("sink name")
        self.subject = f"sink {name}"
        token = self.peek()
        if token.is_word("AS"):
            self.problem(
                token,
                f"CREATE SINK ... AS SELECT is not supported: define the query as CREATE MATERIALIZED "
                f"VIEW and sink it with CREATE SINK {name} FROM that_view WITH (...)",
            )
            raise _Reported()
        if token.is_word("INTO"):
            self.problem(
                token,
                f"CREATE SINK ... INTO a table is not supported: write CREATE SINK {name} FROM table "
                "WITH (connector = '...', ...)",
            )
            raise _Reported()
        self.expect_word("FROM")
        from_table, from_token = self.name("table name")
        if self.peek().kind == "end":
            raise self.fail("WITH (connector = '...', ...) after the table name")
        self.expect_word("WITH")
        options = self.options()
        self.expect_end()
        return ParsedSink(
            name=name,
            line=self.line(create.start),
            from_table=from_table,
            from_line=self.line(from_token.start),
            options=options,
        )


class _Reported(Exception):
    """Parsing stops; the problem is already recorded."""


def parse_statement(statement: Statement) -> tuple[Parsed | None, list[Problem]]:
    """The parsed statement (None after a syntax error or an unsupported statement) and its problems."""
    parser = _Parser(statement)
    try:
        parsed = parser.parse()
    except _SyntaxError as error:
        parser.problems.append(Problem(parser.line(error.pos), error.message))
        return None, parser.problems
    except _Reported:
        return None, parser.problems
    return parsed, parser.problems
