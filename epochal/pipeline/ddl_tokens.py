"""The tokens of one CREATE statement (:mod:`epochal.pipeline.ddl` parses them): words, quoted
identifiers, strings, numbers and punctuation, comments skipped."""

from __future__ import annotations

import re
from dataclasses import dataclass

from epochal.pipeline.statements import skip_block_comment, skip_line_comment, skip_string

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
