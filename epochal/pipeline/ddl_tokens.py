"""The tokens of one CREATE statement (:mod:`epochal.pipeline.ddl` parses them): words, quoted
identifiers, strings, numbers and punctuation, comments skipped."""

from __future__ import annotations

import re
from dataclasses import dataclass

from epochal.pipeline.statements import Problem, Statement, skip_block_comment, skip_line_comment, skip_string

_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER_RE = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class Token:
    #: "word", "ident" (`quoted` or "quoted"), "string" ('quoted'), "number", "punct" or "end"
    kind: str
    #: unquoted and unescaped for strings and quoted identifiers, as written otherwise
    value: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.value.upper() in words

    def describe(self) -> str:
        return "the end of the statement" if self.kind == "end" else f"'{self.value}'"


class _SyntaxError(Exception):
    def __init__(self, pos: int, message: str):
        super().__init__(message)
        self.pos = pos
        self.message = message


def unescape(body: str) -> str:
    """'it''s' and 'it\\'s' both mean it's; other backslash sequences are kept as written."""
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in "\\'\"":
            out.append(body[i + 1])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def tokenize(text: str) -> list[Token]:
    """Tokens of one statement, comments skipped; always ends with an "end" token.

    Unknown characters become one-character "punct" tokens: the query after AS may contain
    anything, and only the DDL around it is interpreted."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("--", i):
            i = skip_line_comment(text, i)
        elif text.startswith("/*", i):
            end = skip_block_comment(text, i)
            i = n if end < 0 else end  # the splitter has already reported unterminated comments
        elif ch in "'\"`":
            end = skip_string(text, i)
            end = n if end < 0 else end
            body = text[i + 1 : end - 1]
            if ch == "'":
                tokens.append(Token("string", unescape(body.replace("''", "'")), i, end))
            else:
                tokens.append(Token("ident", body.replace(ch * 2, ch), i, end))
            i = end
        elif (m := _WORD_RE.match(text, i)) is not None:
            tokens.append(Token("word", m.group(), i, m.end()))
            i = m.end()
        elif (m := _NUMBER_RE.match(text, i)) is not None:
            tokens.append(Token("number", m.group(), i, m.end()))
            i = m.end()
        else:
            tokens.append(Token("punct", ch, i, i + 1))
            i += 1
    tokens.append(Token("end", "", n, n))
    return tokens


# Names become Spark table names and Dagster asset keys, so keep them plain.
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class TokenReader:
    """One statement's tokens read front to back, with the problems found on the way (each with
    its line in the file). The statement grammars (``ddl``, ``ddl_types``) build on it."""

    def __init__(self, statement: Statement):
        self.statement = statement
        self.tokens = tokenize(statement.text)
        self.i = 0
        self.problems: list[Problem] = []
        #: "source bid" once the name is parsed; prefixes problems so they say what they are about
        self.subject = ""

    def line(self, pos: int) -> int:
        return self.statement.line + self.statement.text.count("\n", 0, pos)

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.peek()
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return token

    def statement_form(self) -> tuple[str, str]:
        """The statement being read and its form, for syntax errors: ("CREATE SINK", "CREATE SINK name ...")."""
        raise NotImplementedError

    def fail(self, expected: str, token: Token | None = None) -> _SyntaxError:
        token = token or self.peek()
        what, form = self.statement_form()
        message = f"syntax error in {what}: expected {expected}, found {token.describe()}"
        return _SyntaxError(token.start, f"{message}; the form is: {form}")

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
