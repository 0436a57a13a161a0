"""Parsing the CREATE statements a pipeline is made of (RisingWave's DDL syntax).

Only the DDL around the query is parsed here; a materialized view's query is kept as text and
checked by :mod:`epochal.pipeline.query_checks` (Spark SQL, via sqlglot). Problems come back with the
line they are on, relative to the file: a syntax error stops parsing its statement, other
problems (a bad type, a duplicate column) are all collected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epochal.options import ENCODE_KEY, ENCODE_OPTION_PREFIX, FORMAT_KEY
from epochal.pipeline.ddl_tokens import Token, _SyntaxError
from epochal.pipeline.ddl_types import NESTED_TYPES, ColumnTypeGrammar
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


class _Parser(ColumnTypeGrammar):
    def __init__(self, statement: Statement):
        super().__init__(statement)
        self.kind = ""  # "table" / "source" / "view" / "sink" once known, for the form in error messages

    def statement_form(self) -> tuple[str, str]:
        what = {
            "table": "CREATE TABLE",
            "source": "CREATE SOURCE",
            "view": "CREATE MATERIALIZED VIEW",
            "sink": "CREATE SINK",
        }
        return what[self.kind], FORMS[self.kind]

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
            f"'{shown} ...' is not supported: a pipeline contains only {SUPPORTED_STATEMENTS} statements{hint}",
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
                        f"PRIMARY KEY column '{key}' is not a column (columns: {', '.join(c.name for c in columns)})",
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
