"""``CREATE CHECK name ON table [WITH (severity = 'error' | 'warn')] AS <query>``: a data check
declared beside the SQL (docs/checks.md). Its query returns the offending rows of one table; it is
evaluated at every committed epoch (:mod:`epochal.checkpoint.checks`), and a failing ``error``
check holds that epoch back from the sinks downstream of the table.

Parsed here (the DDL around the query) and validated at load: the table exists, the query is one
Spark SQL SELECT that reads only that table and whose columns resolve, the severity is known, the
name is unique among checks.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from epochal.pipeline.ddl_tokens import Token, tokenize
from epochal.pipeline.model import CheckDef, Location, Severity, SourceDef, ViewDef
from epochal.pipeline.statements import Problem, Statement

SEVERITIES: tuple[Severity, ...] = ("error", "warn")
CHECK_FORM = "CREATE CHECK name ON table_or_view [WITH (severity = 'error' | 'warn')] AS SELECT ..."
#: the only WITH option a check takes
CHECK_OPTIONS = ("severity",)
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class ParsedCheck:
    name: str
    line: int
    table: str
    table_line: int
    options: dict[str, str]
    option_lines: dict[str, int]
    query_text: str
    query_line: int


def is_check(statement: Statement) -> bool:
    tokens = tokenize(statement.text)
    return len(tokens) > 2 and tokens[0].is_word("CREATE") and tokens[1].is_word("CHECK")


def parse_check(statement: Statement) -> tuple[ParsedCheck | None, list[Problem]]:
    """The parsed CREATE CHECK, or None and the syntax problem (with the form to write)."""
    tokens = tokenize(statement.text)
    text = statement.text
    i = 2  # after CREATE CHECK

    def line(token: Token) -> int:
        return statement.line + text.count("\n", 0, token.start)

    def fail(expected: str) -> tuple[None, list[Problem]]:
        token = tokens[min(i, len(tokens) - 1)]
        message = f"syntax error in CREATE CHECK: expected {expected}, found {token.describe()}"
        message += f"; the form is: {CHECK_FORM}"
        return None, [Problem(line(token), message)]

    problems: list[Problem] = []

    def name(what: str) -> tuple[str, Token] | None:
        nonlocal i
        token = tokens[i]
        if token.kind not in ("word", "ident"):
            return None
        i += 1
        value = token.value.lower()
        if not _NAME_RE.match(value):
            problems.append(
                Problem(line(token), f"{what} '{token.value}' must be letters, digits and underscores, not "
                        "starting with a digit (it becomes a Dagster asset check name)")
            )
        return value, token

    check = name("check name")
    if check is None:
        return fail("the check's name")
    if not tokens[i].is_word("ON"):
        return fail("ON and the table the check reads")
    i += 1
    table = name("table name")
    if table is None:
        return fail("the table or view the check reads, after ON")
    options: dict[str, str] = {}
    option_lines: dict[str, int] = {}
    if tokens[i].is_word("WITH"):
        i += 1
        if not (tokens[i].kind == "punct" and tokens[i].value == "("):
            return fail("'(' after WITH, e.g. WITH (severity = 'warn')")
        i += 1
        while True:
            key = tokens[i]
            if key.kind not in ("word", "ident", "string"):
                return fail("an option, e.g. severity = 'warn'")
            equals = tokens[i + 1] if i + 1 < len(tokens) else tokens[-1]
            value = tokens[i + 2] if i + 2 < len(tokens) else tokens[-1]
            if not (equals.kind == "punct" and equals.value == "="):
                i += 1
                return fail(f"'=' after option {key.value}")
            if value.kind not in ("string", "word", "ident"):
                i += 2
                return fail(f"a value for option {key.value}, e.g. {key.value} = 'warn'")
            options[key.value.lower()] = value.value
            option_lines[key.value.lower()] = line(key)
            i += 3
            if tokens[i].kind == "punct" and tokens[i].value == ")":
                i += 1
                break
            if not (tokens[i].kind == "punct" and tokens[i].value == ","):
                return fail("',' or ')' after an option")
            i += 1
    if not tokens[i].is_word("AS"):
        return fail("AS and the query returning the offending rows")
    as_token = tokens[i]
    query_text = text[as_token.end :]
    if not query_text.strip():
        i += 1
        return fail("a SELECT query after AS")
    parsed = ParsedCheck(
        name=check[0],
        line=statement.line,
        table=table[0],
        table_line=line(table[1]),
        options=options,
        option_lines=option_lines,
        query_text=query_text,
        query_line=line(as_token),
    )
    return parsed, problems


def load_checks(
    parsed: Sequence[tuple[str, ParsedCheck]],
    sources: Mapping[str, SourceDef],
    views: Mapping[str, ViewDef],
    failed: set[str],
    add: Callable[[str, int, str], None],
) -> dict[str, CheckDef]:
    """The checks, each validated against the tables' columns; problems go to ``add(file, line,
    message)``. A check on a view that did not load is skipped (the view's error is reported)."""
    from epochal.pipeline.query_checks import analyze_query, resolve_columns

    columns: dict[str, Sequence[str]] = {name: source.column_names for name, source in sources.items()}
    columns.update({name: view.columns for name, view in views.items() if view.internal_of is None})

    checks: dict[str, CheckDef] = {}
    first: dict[str, Location] = {}
    for file, check in parsed:
        where = Location(file, check.line)
        subject = f"check {check.name}"
        if check.name in first:
            add(file, check.line, f"{subject}: a check of that name is already defined at {first[check.name]}: "
                "check names are unique; rename one")
            continue
        first[check.name] = where
        refused = False
        for key, line in check.option_lines.items():
            if key not in CHECK_OPTIONS:
                add(file, line, f"{subject}: unknown option '{key}': a check takes only severity = 'error' | 'warn'")
                refused = True
        severity = check.options.get("severity", "error").lower()
        if severity not in SEVERITIES:
            add(file, check.option_lines.get("severity", check.line),
                f"{subject}: severity = '{check.options['severity']}' is not a severity: use 'error' (holds the "
                "sinks downstream) or 'warn' (only reports)")
            refused = True
        if check.table in failed:
            continue
        if check.table not in columns:
            close = difflib.get_close_matches(check.table, list(columns), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"defined: {', '.join(sorted(columns)) or 'none'}"
            add(file, check.table_line, f"{subject}: ON '{check.table}' is not a table, source or materialized view: "
                f"{hint}")
            continue
        analysis = analyze_query(check.name, check.query_text, check.query_line, full_refresh=True)
        messages = [_as_check(p, check.name) for p in analysis.problems]
        if analysis.tree is not None and not messages:
            others = sorted({t.name for t in analysis.tables} - {check.table})
            if others:
                messages.append(Problem(check.query_line, (
                    f"check {check.name}: the query reads {', '.join(others)}, but a check reads only its own table "
                    f"({check.table}): it is evaluated over that table's committed state at each epoch. Check the "
                    "other table with a check of its own, or make a view that joins them and check the view")))
            else:
                resolved = resolve_columns(
                    check.name, analysis.tree, check.query_text, check.query_line, {check.table: columns[check.table]}
                )
                messages += [_as_check(p, check.name) for p in resolved.problems]
        for problem in messages:
            add(file, problem.line, problem.message)
        if messages or refused:
            continue
        checks[check.name] = CheckDef(
            name=check.name,
            table=check.table,
            severity=severity,  # type: ignore[arg-type] (checked against SEVERITIES above)
            query=check.query_text.strip(),
            location=where,
        )
    return checks


def _as_check(problem: Problem, name: str) -> Problem:
    """A query problem worded for a check (the query analysis words them for a view)."""
    message = problem.message.replace(f"view {name}:", f"check {name}:", 1)
    return Problem(problem.line, message.replace("in the output", "in the check's rows"))
