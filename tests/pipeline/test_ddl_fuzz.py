"""Random and adversarial pipeline files through the loader (statement splitting, the DDL parser,
the query checks, the sink checks), without Spark: every problem comes back as a PipelineError
naming a file and line, never as a traceback; a file that loads has every name resolved."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.errors import PipelineError
from epochal.pipeline.ddl import parse_statement
from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.statements import Statement, split_statements

#: TESTS_FUZZ_EXAMPLES=5000 searches deeper (minutes); the default keeps the file to seconds
FUZZ = settings(
    max_examples=int(os.environ.get("TESTS_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NASTY = "\n\r\u2028\u2029\x85\x00\"'`\\;(),.*=-/\ufeff\u00e9\U0001f600"
noise = st.text(alphabet=st.one_of(st.sampled_from(NASTY), st.characters(exclude_categories=("Cs",))), max_size=30)
#: noise without quotes: it reaches the parser's later checks instead of an unterminated string
unquoted = noise.map(lambda s: "".join(ch for ch in s if ch not in "'\"`;"))
plain = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
#: names a user might write: plain, SQL keywords, Epochal's own columns, over PostgreSQL's 63 bytes,
#: quoted with anything inside, and (rarely) an unbalanced quote
names = st.one_of(
    plain,
    st.sampled_from(["id", "note", "select", "`from`", "`order`", "_weight", "_n", "_NET", "_epochal_k0", "_op",
                     "_offset", "_delta_x", "_id", "n" * 64, "`" + "é" * 32 + "`", "`a b`", "`a``b`", "`é\u2028`",
                     "`x", "'x", "x`"]),
    noise.map(lambda s: "`" + s.replace("`", "``") + "`"),
    plain,
)  # fmt: skip
types = st.sampled_from(
    ["BIGINT", "INT", "STRING", "DOUBLE", "TIMESTAMP", "BOOLEAN", "DECIMAL(38, 2)", "ARRAY<INT>", "STRUCT<a: INT>",
     "MAP<STRING, INT>", "DECIMAL(99, 2)", "VARIANT", "NOPE", "BIGINT NOT NULL"]
)  # fmt: skip
values = st.one_of(plain, unquoted, st.sampled_from(["log", "postgres", "duckdb", "upsert", "${HOME}", "t" * 64, "id"]))
extra_options = st.lists(st.tuples(st.sampled_from(["table", "type", "primary_key", "schema", "format", "refresh",
                                                    "connector", "writers", "min_max_cache"]), values),
                         max_size=3)  # fmt: skip
BASE = (
    "CREATE SOURCE s (id BIGINT, note STRING, amount DOUBLE) WITH (connector = 'log', path = 'data/s');\n"
    "CREATE MATERIALIZED VIEW base AS SELECT id, note FROM s;\n"
)


def with_clause(pairs: list[tuple[str, str]]) -> str:
    return "WITH (" + ", ".join(f"{k} = '{v}'" for k, v in pairs) + ")" if pairs else ""


sources = st.builds(
    lambda kind, name, cols, key, pairs: f"CREATE {kind} {name} ({', '.join(f'{c} {t}' for c, t in cols)}{key}) "
    + with_clause([("connector", "log"), ("path", "data/x"), *pairs]),
    st.sampled_from(["SOURCE", "TABLE"]),
    names,
    st.lists(st.tuples(names, types), min_size=1, max_size=4),
    st.one_of(st.just(""), names.map(lambda k: f", PRIMARY KEY ({k})")),
    extra_options,
)
expressions = st.one_of(
    st.sampled_from(["id", "note", "amount", "*", "count(*)", "sum(amount)", "max(note)", "1/0", "NULL", "'\u2028'"]),
    st.tuples(st.sampled_from(["id", "note", "count(*)", "sum(id)", "upper(note)"]), names).map(" AS ".join),
    unquoted,
)
views = st.builds(
    lambda name, exprs, table, tail: f"CREATE MATERIALIZED VIEW {name} AS SELECT {', '.join(exprs)} "
    f"FROM {table} {tail}",
    names,
    st.lists(expressions, min_size=1, max_size=3),
    st.sampled_from(["s", "base", "nope"]),
    st.one_of(st.sampled_from(["", "GROUP BY id", "GROUP BY id, note", "WHERE id > 0", "ORDER BY id LIMIT 3",
                               "JOIN base USING (id)"]), unquoted),  # fmt: skip
)
sinks = st.builds(
    lambda name, connector, table, target, pairs: f"CREATE SINK {name} FROM {table} "
    + with_clause([("connector", connector), ("host", "h"), ("user", "u"), ("database", "d"), ("table", target),
                   *pairs]),  # fmt: skip
    names,
    st.sampled_from(["postgres", "duckdb", "nope"]),
    st.sampled_from(["s", "base", "nope", "wide"]),
    st.one_of(plain, st.sampled_from(["t" * 63, "t" * 64, "é" * 32, "${T}"])),
    extra_options,
)
#: a view whose column is over PostgreSQL's limit, for a sink to read
WIDE = f"CREATE MATERIALIZED VIEW wide AS SELECT id AS {'c' * 64}, note FROM s;\n"
statements = st.one_of(sources, views, sinks, sources, views, sinks, noise)
files = st.tuples(st.booleans(), st.lists(statements, max_size=3)).map(
    lambda t: BASE + (WIDE if t[0] else "") + "".join(p + ";\n" for p in t[1])
)


@FUZZ
@given(files)
def test_the_loader_refuses_by_file_and_line_or_loads(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "p.sql").write_text(text, encoding="utf-8")
        try:
            pipeline = load_pipeline(directory)
        except PipelineError as error:
            assert error.issues and all(issue.message for issue in error.issues)
            return
    for view in pipeline.views.values():
        assert all(u in pipeline.tables for u in view.upstreams)


@FUZZ
@given(st.one_of(statements, noise, st.text(max_size=200)))
def test_one_statement_parses_or_names_its_problem(text: str) -> None:
    statements_found, problems = split_statements(text)
    assert all(p.line >= 1 and p.message for p in problems)
    for statement in statements_found:
        parsed, found = parse_statement(statement)
        assert parsed is not None or found, f"nothing parsed and no problem named: {statement.text!r}"
    parse_statement(Statement(text, 1))  # unsplit, with its semicolons


def test_a_view_of_no_column_is_refused_not_a_traceback(tmp_path: Path) -> None:
    """Found by the fuzz test above: sqlglot reads `SELECT FROM s` as a query of no column, and
    the planner's schema raised sqlglot's SchemaError out of the loader."""
    (tmp_path / "p.sql").write_text(BASE + "CREATE MATERIALIZED VIEW a AS SELECT FROM s;\n")
    try:
        load_pipeline(tmp_path)
    except PipelineError as error:
        assert [(i.line, i.message) for i in error.issues] == [
            (3, "view a: the query selects no column: list the columns it returns, e.g. SELECT id FROM ...")
        ]
    else:
        raise AssertionError("a view of no column loaded")
