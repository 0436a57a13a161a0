"""Splitting a .sql file into statements, each with the line it starts on.

A ``;`` ends a statement unless it is inside a '...' or "..." string, a `...` identifier, a
``--`` line comment or a ``/* */`` block comment. Comments stay in the statement text (a view's
query is kept exactly as written); only the leading ones are skipped, so a statement's line is
the line of its first keyword.
"""

from __future__ import annotations

from dataclasses import dataclass

_QUOTES = "'\"`"


@dataclass(frozen=True)
class Statement:
    #: the statement from its first keyword up to (not including) the ``;``, trailing blanks removed
    text: str
    #: 1-based line of the first keyword
    line: int


@dataclass(frozen=True)
class Problem:
    """Something wrong at a line of a file (the caller knows which file)."""

    line: int
    message: str


def skip_string(text: str, i: int) -> int:
    """Index just past the quoted string/identifier starting at ``text[i]``, or -1 if unterminated.

    Backslash escapes the next character (Spark); a doubled quote ('it''s') needs no special case
    because it reads as two adjacent strings."""
    quote = text[i]
    i += 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "`":
            i += 2
            continue
        if ch == quote:
            return i + 1
        i += 1
    return -1


def skip_block_comment(text: str, i: int) -> int:
    """Index just past the ``/* */`` comment starting at ``text[i]``, or -1 if unterminated.

    Nesting is honoured, as Spark and PostgreSQL do."""
    depth = 0
    while i < len(text):
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return -1


def skip_line_comment(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def split_statements(text: str) -> tuple[list[Statement], list[Problem]]:
    """The non-empty statements of ``text`` in order, and problems (unterminated strings/comments).

    The last statement may omit its ``;``."""
    statements: list[Statement] = []
    problems: list[Problem] = []
    start = -1  # index of the current statement's first significant character, -1 before it
    i = 0
    n = len(text)

    def line_at(index: int) -> int:
        return text.count("\n", 0, index) + 1

    def finish(end: int) -> None:
        nonlocal start
        if start >= 0:
            statements.append(Statement(text[start:end].rstrip(), line_at(start)))
        start = -1

    while i < n:
        ch = text[i]
        if text.startswith("--", i):
            i = skip_line_comment(text, i)
        elif text.startswith("/*", i):
            end = skip_block_comment(text, i)
            if end < 0:
                problems.append(
                    Problem(line_at(i), "unterminated /* comment: close it with */")
                )
                start = -1  # the statement it swallowed cannot be trusted
                break
            i = end
        elif ch in _QUOTES:
            if start < 0:
                start = i
            end = skip_string(text, i)
            if end < 0:
                kind = "identifier" if ch == "`" else "string"
                problems.append(
                    Problem(line_at(i), f"unterminated {kind} starting here: close it with {ch}")
                )
                start = -1
                break
            i = end
        elif ch == ";":
            finish(i)
            i += 1
        else:
            if start < 0 and not ch.isspace():
                start = i
            i += 1
    else:
        finish(n)
    return statements, problems
