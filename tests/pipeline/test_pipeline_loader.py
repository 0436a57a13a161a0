"""Loading pipeline directories: the demo pipeline, and every error class with its file and line.

Pure Python (sqlglot, no Spark)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from epochal.errors import PipelineError, PipelineIssue
from epochal.incremental.plan import PARTIAL_RULE
from epochal.options import unknown_option_problems
from epochal.pipeline import loader
from epochal.pipeline.ddl import parse_statement
from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.model import Column, Pipeline
from epochal.pipeline.stateless import NEEDS_STATE, NOT_REPEATABLE, REFUSED
from epochal.pipeline.statements import Statement, split_statements
from epochal.sinks.spec import SINK_CONNECTORS

DEMO = Path(loader.__file__).resolve().parent.parent / "demo_pipeline"
FULL_REFRESH_HINT = "or add WITH (refresh = 'full') to recompute the view every epoch (cost grows with the table)"


class FakeSpec:
    """Stands in for the connector registry: checks option keys, and 'log' needs a path."""

    KNOWN = {
        "nexmark": ("connector", "nexmark.table.type", "nexmark.split.num", "max.events.per.epoch"),
        "log": ("connector", "path", "format"),
    }

    def __init__(self, name: str):
        self.name = name

    def validate(self, columns: tuple[Column, ...], options: Mapping[str, str]) -> list[str]:
        problems = unknown_option_problems(f"{self.name} source", options, self.KNOWN[self.name])
        if self.name == "log" and "path" not in options:
            problems.append("log source needs path = '...'")
        return problems

    def create(self, source, home):  # pragma: no cover - never called at load time
        raise NotImplementedError


def fake_lookup(name: str) -> FakeSpec | None:
    return FakeSpec(name) if name in FakeSpec.KNOWN else None


BID_SOURCE = """\
CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
                   date_time TIMESTAMP, extra STRING)
WITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid', 'nexmark.split.num' = '4');
"""


def write(directory: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def load(directory: Path, files: Mapping[str, str]) -> Pipeline:
    return load_pipeline(write(directory, files), connector_spec=fake_lookup)


def issues(directory: Path, files: Mapping[str, str]) -> list[PipelineIssue]:
    with pytest.raises(PipelineError) as raised:
        load(directory, files)
    return raised.value.issues


def only_issue(directory: Path, files: Mapping[str, str]) -> PipelineIssue:
    found = issues(directory, files)
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


def at(issue: PipelineIssue) -> tuple[str, int]:
    return Path(issue.file).name, issue.line


# -- the demo pipeline ---------------------------------------------------------------------


def test_demo_pipeline_loads() -> None:
    pipeline = load_pipeline(DEMO, connector_spec=fake_lookup)

    assert list(pipeline.sources) == ["bid", "auction"]
    bid, auction = pipeline.sources["bid"], pipeline.sources["auction"]
    assert [(c.name, c.type) for c in bid.columns] == [
        ("auction", "BIGINT"), ("bidder", "BIGINT"), ("price", "BIGINT"), ("channel", "STRING"),
        ("url", "STRING"), ("date_time", "TIMESTAMP"), ("extra", "STRING"),
    ]  # fmt: skip
    assert auction.column_names == (
        "id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires",
        "seller", "category", "extra",
    )  # fmt: skip
    assert bid.connector == auction.connector == "nexmark"
    assert bid.options["nexmark.split.num"] == "4"
    assert bid.options["max.events.per.epoch"] == "10000"
    assert auction.options["nexmark.split.num"] == "1"
    assert auction.options["max.events.per.epoch"] == "2000"
    assert auction.options["nexmark.table.type"] == "Auction"
    assert (Path(bid.location.file).name, bid.location.line) == ("01_sources.sql", 4)

    big_bids = pipeline.views["big_bids"]
    assert big_bids.upstreams == ("bid",)
    assert big_bids.columns == ("auction", "bidder", "price_eur", "date_time")
    assert big_bids.query.startswith("SELECT auction, bidder, price * 0.908 AS price_eur")
    banded = pipeline.views["big_bids_banded"]
    assert banded.upstreams == ("big_bids",)
    assert banded.columns == ("auction", "bidder", "price_eur", "band", "date_time")

    sink = pipeline.sinks["big_bids_out"]
    assert (sink.from_table, sink.connector) == ("big_bids", "duckdb")
    assert sink.options["database"] == "out/sink.duckdb"
    assert sink.options["table"] == "big_bids"
    assert sink.options["type"] == "append-only"

    stateful = [
        "auction_stats",
        "top_bids",
        "category_volume__stage1",
        "category_volume__stage2",
        "category_volume",
        "bids_per_window__stage1",
        "bids_per_window",
    ]
    assert pipeline.view_order() == ["big_bids", "big_bids_banded", *stateful]
    assert pipeline.tables == ["bid", "auction", "big_bids", "big_bids_banded", *stateful]
    # category_volume: a join stage, a partial-aggregate stage, and the view projecting it;
    # bids_per_window: a partial-aggregate stage (its MAX keeps values) and the view projecting it
    kinds = ["linear", "linear", "keyed", "keyed", "keyed", "keyed", "linear", "keyed", "linear"]
    assert [pipeline.views[v].plan.kind for v in pipeline.view_order()] == kinds
    assert pipeline.views["auction_stats"].plan.key_classes == ("a.id = b.auction",)
    assert pipeline.views["category_volume__stage1"].internal_of == "category_volume"
    assert pipeline.views["category_volume__stage2"].plan.rule == PARTIAL_RULE
    assert pipeline.views["bids_per_window__stage1"].plan.rule == PARTIAL_RULE
    assert pipeline.views["bids_per_window__stage1"].plan.aggregate.hidden == ("_epochal_kept_p2_max",)


def test_demo_pipeline_passes_the_real_connector_registry() -> None:
    pipeline = load_pipeline(DEMO)  # the default lookup is epochal.connectors.registry
    assert set(pipeline.sources) == {"bid", "auction"}


def test_real_connector_problems_are_reported(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE bid (auction BIGINT, price STRING)
            WITH (connector = 'nexmark', 'nexmark.table.type' = 'Bid');
            CREATE SOURCE q (a INT) WITH (connector = 'kafka');
            """
        },
    )
    with pytest.raises(PipelineError) as raised:
        load_pipeline(tmp_path)
    found = raised.value.issues
    assert [at(i) for i in found] == [("s.sql", 1), ("s.sql", 3)]
    assert found[0].message.startswith("source bid: column 'price' of the nexmark Bid table is BIGINT")
    assert found[1].message == (
        "source q: unknown connector 'kafka': use connector = one of log, mysql-cdc, nexmark, posix_fs, postgres-cdc"
    )


# -- statement splitting --------------------------------------------------------------------


def test_split_ignores_semicolons_in_strings_and_comments() -> None:
    text = textwrap.dedent(
        """\
        -- leading comment; with a semicolon
        /* block; comment /* nested; */ still comment; */
        CREATE SOURCE s (a STRING) WITH (connector = 'log', path = 'a;b', format = "x;y");
        CREATE SOURCE t (a STRING) WITH (connector = 'log', path = 'it''s; \\'quoted\\';');

        CREATE MATERIALIZED VIEW v AS
        SELECT a -- trailing; comment
        FROM s"""
    )
    statements, problems = split_statements(text)
    assert problems == []
    assert [s.line for s in statements] == [3, 4, 6]
    assert statements[0].text.startswith("CREATE SOURCE s")
    assert statements[0].text.endswith('format = "x;y")')
    assert statements[2].text.endswith("FROM s")  # last statement without ';'


def test_comments_and_quoted_semicolons_load(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "p.sql": """\
            /* orders; from a log */ CREATE SOURCE Orders (id BIGINT, note STRING)
            WITH (connector = 'log', path = 'data/o;rders', format = 'json');  -- a;b
            ;;
            -- a view; with a comment
            CREATE MATERIALIZED VIEW notes AS
            SELECT id, concat(note, ';', '--not a comment') AS note /* ; */ FROM orders;
            """
        },
    )
    assert pipeline.sources["orders"].options["path"] == "data/o;rders"
    assert pipeline.sources["orders"].location.line == 1
    notes = pipeline.views["notes"]
    assert notes.location.line == 5
    assert notes.columns == ("id", "note")
    assert "'--not a comment'" in notes.query


def test_unterminated_string_is_reported_where_it_starts(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {"a.sql": BID_SOURCE + "\nCREATE MATERIALIZED VIEW v AS\nSELECT 'oops FROM bid;\n"},
    )
    assert at(issue) == ("a.sql", 6)
    assert "unterminated string" in issue.message


# -- DDL ---------------------------------------------------------------------------------------


def test_types_are_normalized_and_options_parsed(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE IF NOT EXISTS Events (
                A integer, b VARCHAR(20), c Text, d REAL, e DOUBLE PRECISION, f numeric(5, 2),
                g DECIMAL, h bool, i SMALLINT, j TINYINT, k DATE, l TIMESTAMP, m LONG, n float
            ) WITH (Connector = 'LOG', PATH = 'data/events', 'Format' = json);
            create source `Bids` (x BIGINT)
            with (connector = 'nexmark', nexmark.table.type = 'Bid', 'NEXMARK.SPLIT.NUM' = 4);
            """
        },
    )
    events = pipeline.sources["events"]
    assert [(c.name, c.type) for c in events.columns] == [
        ("a", "INT"), ("b", "STRING"), ("c", "STRING"), ("d", "FLOAT"), ("e", "DOUBLE"),
        ("f", "DECIMAL(5,2)"), ("g", "DECIMAL(10,0)"), ("h", "BOOLEAN"), ("i", "SMALLINT"),
        ("j", "TINYINT"), ("k", "DATE"), ("l", "TIMESTAMP"), ("m", "BIGINT"), ("n", "FLOAT"),
    ]  # fmt: skip
    assert events.connector == "log"
    assert dict(events.options) == {"connector": "LOG", "path": "data/events", "format": "json"}
    bids = pipeline.sources["bids"]
    assert dict(bids.options) == {
        "connector": "nexmark", "nexmark.table.type": "Bid", "nexmark.split.num": "4",
    }  # fmt: skip


def test_bad_types_are_reported_on_their_line(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE s (
                a BIGINT,
                b TIMESTAMPTZ,
                c DECIMAL(40, 2),
                a STRING
            ) WITH (connector = 'log', path = 'x');
            """
        },
    )
    assert [(at(i), i.message.split(":")[0]) for i in found] == [
        (("s.sql", 3), "source s"),
        (("s.sql", 4), "source s"),
        (("s.sql", 5), "source s"),
    ]
    assert "type 'TIMESTAMPTZ' of column b is not supported: use one of BIGINT" in found[0].message
    assert "precision must be 1 to 38" in found[1].message
    assert "column 'a' is declared twice" in found[2].message


@pytest.mark.parametrize(
    ("ddl", "line", "expected"),
    [
        ("CREATE SOURCE s (a BIGINT\nWITH (connector = 'log');", 2, "expected ',' or ')' after a column, found 'WITH'"),
        ("CREATE SOURCE s WITH (connector = 'log');", 1, "the column list of source s"),
        ("CREATE SOURCE s (a BIGINT);", 1, "expected WITH (connector = '...', ...)"),
        ("CREATE SOURCE s (a BIGINT) WITH (connector 'log');", 1, "expected '=' after option connector"),
        ("CREATE SINK k FROM v;", 1, "expected WITH (connector"),
        ("CREATE MATERIALIZED VIEW v AS ;", 1, "expected a SELECT query after AS"),
        ("CREATE MATERIALIZED VIEW v\n\nSELECT 1;", 3, "expected AS, found 'SELECT'"),
    ],
)
def test_ddl_syntax_errors_name_the_form(tmp_path: Path, ddl: str, line: int, expected: str) -> None:
    issue = only_issue(tmp_path, {"x.sql": "\n" + ddl})
    assert at(issue) == ("x.sql", line + 1)
    assert issue.message.startswith("syntax error in CREATE ")
    assert expected in issue.message
    assert "the form is: CREATE " in issue.message


@pytest.mark.parametrize(
    ("ddl", "hint"),
    [
        ("CREATE VIEW v AS SELECT 1 AS x", "use CREATE MATERIALIZED VIEW"),
        ("DROP TABLE t", ""),
        ("INSERT INTO t VALUES (1)", "Epochal has no INSERT path yet: a table reads its rows WITH (connector"),
        ("CREATE SINK k AS SELECT auction FROM bid", "CREATE SINK k FROM that_view"),
    ],
)
def test_unsupported_statements(tmp_path: Path, ddl: str, hint: str) -> None:
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + "\n" + ddl + ";"})
    assert at(issue) == ("a.sql", 5)
    if ddl.startswith("CREATE SINK"):
        assert "CREATE SINK ... AS SELECT is not supported" in issue.message
    else:
        assert "CREATE TABLE, CREATE SOURCE, CREATE MATERIALIZED VIEW and CREATE SINK" in issue.message
    assert hint in issue.message


def test_names_are_case_insensitive_and_unique_across_kinds(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "1.sql": BID_SOURCE,
            "2.sql": """\
            CREATE MATERIALIZED VIEW BID AS SELECT auction FROM bid;
            CREATE MATERIALIZED VIEW v AS SELECT auction FROM bid;
            CREATE SINK V FROM bid WITH (connector = 'duckdb', database = 'd', table = 't');
            """,
        },
    )
    assert [at(i) for i in found] == [("2.sql", 1), ("2.sql", 3)]
    assert "'bid' is already defined as a source at " in found[0].message
    assert found[0].message.split(" at ")[1].startswith(str(tmp_path / "1.sql") + ":1")
    assert "'v' is already defined as a materialized view at " in found[1].message
    assert "rename or remove one" in found[1].message


def test_table_primary_key_is_kept_on_log_tables(tmp_path: Path, monkeypatch) -> None:
    files = {
        "s.sql": """\
        CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING)
        WITH (connector = 'log', path = 'data/orders');
        CREATE TABLE lines (order_id BIGINT, line INT,
            PRIMARY KEY (order_id, line))
        WITH (connector = 'log', path = 'data/lines');
        """
    }
    pipeline = load(tmp_path, files)
    assert pipeline.sources["orders"].primary_key == ("id",)
    assert pipeline.sources["lines"].primary_key == ("order_id", "line")

    monkeypatch.setattr(loader, "SOURCE_PRIMARY_KEY_SUPPORTED", False)  # the switch still refuses them all
    found = issues(tmp_path, files)
    assert [at(i) for i in found] == [("s.sql", 1), ("s.sql", 4)]
    assert all("PRIMARY KEY on a table is not supported yet" in i.message for i in found)


def test_table_primary_key_problems_point_at_the_key(tmp_path: Path) -> None:
    keyed_bid = BID_SOURCE.replace("CREATE SOURCE", "CREATE TABLE")
    keyed_bid = keyed_bid.replace("auction BIGINT,", "auction BIGINT PRIMARY KEY,")
    found = issues(
        tmp_path,
        {
            "s.sql": keyed_bid
            + """\
            CREATE TABLE orders (id BIGINT, _offset BIGINT,
                PRIMARY KEY (id, id))
            WITH (connector = 'log', path = 'data/orders');
            CREATE TABLE lines (order_id BIGINT, PRIMARY KEY (line))
            WITH (connector = 'log', path = 'data/lines');
            """,
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("s.sql", 1),
            "table bid: the nexmark connector is append-only: remove PRIMARY KEY "
            "(only log, mysql-cdc, posix_fs, postgres-cdc tables take one)",
        ),
        (
            ("s.sql", 4),
            "table orders: column '_offset' is reserved: Epochal uses it for each record's position (its "
            "offset); leave it out of the declaration (fields a record has but the declaration lacks are "
            "ignored) or rename the field in the records",
        ),
        (("s.sql", 5), "table orders: PRIMARY KEY names column 'id' twice: list it once"),
        (("s.sql", 7), "table lines: PRIMARY KEY column 'line' is not a column (columns: order_id)"),
    ]


def test_internal_column_names_are_refused_at_load(tmp_path: Path) -> None:
    """A user column named as one of Epochal's own (a source's _weight would be overwritten with 1,
    a view's _n would repeat or drop rows) is refused, naming the column, table and the rename."""
    found = issues(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE orders (id BIGINT, _Weight BIGINT)
            WITH (connector = 'log', path = 'data/orders');
            CREATE SOURCE plain (id BIGINT, _id BIGINT, _op STRING, _offset BIGINT)
            WITH (connector = 'log', path = 'data/plain');
            CREATE MATERIALIZED VIEW counted AS SELECT id, count(*) AS _n FROM plain GROUP BY id;
            CREATE MATERIALIZED VIEW kept AS SELECT id, _id AS _epochal_k0 FROM plain;
            """,
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("s.sql", 1),
            "source orders: column '_weight' is reserved: Epochal uses it for each change row's weight (+1 "
            "insert, -1 delete); leave it out of the declaration (fields a record has but the declaration "
            "lacks are ignored) or rename the field in the records",
        ),
        (
            ("s.sql", 5),
            "view counted: column '_n' is reserved: Epochal uses it for a row's count when changes are "
            "netted; rename it in the view's SELECT, e.g. SELECT _n AS n_user",
        ),
        (
            ("s.sql", 6),
            "view kept: column '_epochal_k0' is reserved: Epochal uses it for the columns Epochal derives "
            "from a column's name (prefix _epochal); rename it in the view's SELECT, e.g. SELECT _epochal_k0 "
            "AS epochal_k0_user",
        ),
    ]


def test_primary_key_must_name_declared_columns() -> None:
    parsed, problems = parse_statement(
        Statement("CREATE TABLE s (a INT, PRIMARY KEY (b)) WITH (connector = 'log')", 7)
    )
    assert parsed is not None and parsed.primary_key == ("b",)
    assert [(p.line, p.message) for p in problems] == [
        (7, "table s: PRIMARY KEY column 'b' is not a column (columns: a)")
    ]


# -- CREATE TABLE and CREATE SOURCE ------------------------------------------------------------


def test_create_table_with_a_key_is_a_stored_input(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "t.sql": """\
            CREATE TABLE IF NOT EXISTS orders (id BIGINT, customer STRING, PRIMARY KEY (id))
            WITH (connector = 'log', path = 'data/orders');
            CREATE TABLE events (id BIGINT, kind STRING) WITH (connector = 'log', path = 'data/events');
            """
        },
    )
    orders, events = pipeline.sources["orders"], pipeline.sources["events"]
    assert (orders.kind, orders.primary_key) == ("table", ("id",))
    assert (events.kind, events.primary_key) == ("table", ())
    assert orders.connector == "log" and orders.options == {"connector": "log", "path": "data/orders"}
    assert pipeline.tables == ["orders", "events"]


def test_a_source_keeps_its_kind(tmp_path: Path) -> None:
    # what it stores follows from its readers (tests/storage/test_source_storage.py)
    bid = load(tmp_path, {"s.sql": BID_SOURCE}).sources["bid"]
    assert (bid.kind, bid.primary_key) == ("source", ())


@pytest.mark.parametrize(
    ("ddl", "line", "key"),
    [
        ("CREATE SOURCE orders (id BIGINT PRIMARY KEY, c STRING)\nWITH (connector = 'log', path = 'o');", 1, "id"),
        (
            "CREATE SOURCE orders (a BIGINT, b BIGINT,\n  PRIMARY KEY (a, b))\nWITH (connector = 'log', path = 'o');",
            2,
            "a, b",
        ),
    ],
)
def test_a_keyed_source_is_refused_with_the_fix(tmp_path: Path, ddl: str, line: int, key: str) -> None:
    issue = only_issue(tmp_path, {"s.sql": "\n" + ddl})
    assert str(issue) == (
        f"{tmp_path / 's.sql'}:{line + 1}: source orders: a SOURCE cannot have a PRIMARY KEY: upserts and deletes "
        "by key need the rows stored, which is what a TABLE does; declare it as "
        f"CREATE TABLE orders (..., PRIMARY KEY ({key})) WITH (...)"
    )


def test_a_keyed_source_on_an_append_only_connector_gets_one_message(tmp_path: Path) -> None:
    # the key's other checks are for tables: the fix (make it a table) comes first
    keyed_bid = BID_SOURCE.replace("auction BIGINT,", "auction BIGINT PRIMARY KEY,")
    issue = only_issue(tmp_path, {"s.sql": keyed_bid})
    assert issue.message.startswith("source bid: a SOURCE cannot have a PRIMARY KEY")


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE t (a INT);",
        "CREATE TABLE t (a INT, PRIMARY KEY (a));",
        "CREATE TABLE t (a INT) WITH (path = 'p');",
    ],
)
def test_a_table_without_a_connector_is_refused(tmp_path: Path, ddl: str) -> None:
    found = issues(
        tmp_path, {"t.sql": "\n" + ddl + "\nCREATE MATERIALIZED VIEW v AS SELECT a FROM t;"}
    )
    # one problem: the view reading t resolves its columns, so nothing cascades
    assert [(at(i), i.message) for i in found] == [
        (
            ("t.sql", 2),
            "table t: a table without WITH (connector = ...) is filled by INSERT, and Epochal has no INSERT "
            "path yet: add WITH (connector = '...', ...) to read its rows (one of log, nexmark)",
        )
    ]


def test_a_source_without_with_is_still_a_syntax_error(tmp_path: Path) -> None:
    issue = only_issue(tmp_path, {"s.sql": "CREATE SOURCE s (a INT);"})
    assert issue.message.startswith("syntax error in CREATE SOURCE: expected WITH (connector = '...', ...)")


def test_tables_sources_views_and_sinks_mix(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "1.sql": BID_SOURCE,
            "2.sql": """\
            CREATE TABLE auction (id BIGINT PRIMARY KEY, seller BIGINT)
            WITH (connector = 'log', path = 'data/auction');
            """,
            "3.sql": """\
            CREATE MATERIALIZED VIEW bids AS
            SELECT a.seller, b.price FROM bid b JOIN auction a ON b.auction = a.id;
            CREATE SINK out FROM auction
            WITH (connector = 'duckdb', database = 'd.db', table = 'a', type = 'upsert', primary_key = 'id');
            """,
        },
    )
    assert {name: s.kind for name, s in pipeline.sources.items()} == {"bid": "source", "auction": "table"}
    assert pipeline.views["bids"].upstreams == ("bid", "auction")
    assert pipeline.sinks["out"].from_table == "auction"
    assert pipeline.tables[:2] == ["bid", "auction"]


def test_a_table_and_a_source_share_the_namespace(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {"1.sql": BID_SOURCE, "2.sql": "CREATE TABLE bid (a INT) WITH (connector = 'log', path = 'p');"},
    )
    assert at(issue) == ("2.sql", 1)
    assert issue.message.startswith("'bid' is already defined as a source at ")
    assert "tables, sources, views and sinks share one namespace" in issue.message


def test_a_table_syntax_error_names_the_table_form(tmp_path: Path) -> None:
    issue = only_issue(tmp_path, {"t.sql": "CREATE TABLE t WITH (connector = 'log');"})
    assert issue.message == (
        "syntax error in CREATE TABLE: expected the column list of table t, e.g. t (id BIGINT, ts TIMESTAMP), "
        "found 'WITH'; the form is: CREATE TABLE name (column TYPE, ..., [PRIMARY KEY (column, ...)]) "
        "WITH (connector = '...', key = 'value', ...)"
    )


# -- connectors and sinks ---------------------------------------------------------------------


def test_unknown_or_missing_connector_lists_the_supported_ones(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE a (x INT) WITH (path = 'p');
            CREATE SOURCE b (x INT) WITH (
                path = 'p',
                connector = 'kafka');
            """
        },
    )
    assert [at(i) for i in found] == [("s.sql", 1), ("s.sql", 4)]
    assert found[0].message == "source a: no connector option: use connector = one of log, nexmark"
    assert found[1].message == "source b: unknown connector 'kafka': use connector = one of log, nexmark"


def test_connector_option_problems_point_at_the_option(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "s.sql": """\
            CREATE SOURCE bid (auction BIGINT)
            WITH (
                connector = 'nexmark',
                'nexmark.table.type' = 'Bid',
                'max.event.per.epoch' = '10'
            );
            CREATE SOURCE orders (id BIGINT) WITH (connector = 'log', format = 'json');
            """
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("s.sql", 5),
            "source bid: unknown nexmark source option 'max.event.per.epoch': did you mean 'max.events.per.epoch'?",
        ),
        (("s.sql", 7), "source orders: log source needs path = '...'"),
    ]


def test_sink_problems_come_from_validate_sink_with_upstream_columns(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE,
            "b.sql": """\
            CREATE MATERIALIZED VIEW cheap AS SELECT auction, price FROM bid WHERE price < 10;
            CREATE SINK s1 FROM cheap WITH (connector = 'duckdb', database = 'd', table = 't',
                type = 'upsert', primary_key = 'bidder');
            CREATE SINK s2 FROM bid WITH (connector = 'duckdb', database = 'd',
                tabel = 't');
            CREATE SINK s3 FROM bid WITH (connector = 'kafka');
            CREATE SINK s4 FROM cheap WITH (database = 'd', table = 't');
            """,
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("b.sql", 2),
            "sink s1: primary_key column 'bidder' is not a column of the upstream table (columns: auction, price)",
        ),
        (("b.sql", 4), "sink s2: duckdb sink needs option table = '...'"),
        (("b.sql", 5), "sink s2: unknown duckdb sink option 'tabel': did you mean 'table'?"),
        (
            ("b.sql", 6),
            f"sink s3: unknown sink connector 'kafka': supported sink connectors are: {', '.join(SINK_CONNECTORS)}",
        ),
        (("b.sql", 7), "sink s4: no connector option: add connector = '...' (e.g. connector = 'duckdb')"),
    ]


def test_a_sink_primary_key_names_columns_as_sql_does() -> None:
    """Names are resolved ignoring case and spelled as the upstream table has them (the targets
    match exact names: a key 'K' over column k failed every Delta delivery with a KeyError); a
    name holding a comma or spaces is quoted as in Spark SQL."""
    from epochal.sinks.spec import primary_key_columns

    columns = ["k", "Region", "order id", "a,b"]
    assert primary_key_columns({"primary_key": " K , region "}, columns) == ("k", "Region")
    assert primary_key_columns({"primary_key": "`a,b`, order id"}, columns) == ("a,b", "order id")
    assert primary_key_columns({"primary_key": '"a,b",`x``y`'}) == ("a,b", "x`y")
    assert primary_key_columns({"primary_key": "` padded `"}) == (" padded ",)
    assert primary_key_columns({"primary_key": ""}) == primary_key_columns({}) == ()


def test_sink_from_unknown_table_suggests_the_closest(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {"a.sql": BID_SOURCE + "CREATE SINK s\nFROM bids\nWITH (connector = 'duckdb', database = 'd', table = 't');"},
    )
    assert at(issue) == ("a.sql", 5)
    assert issue.message == (
        "sink s: reads 'bids', which is not defined (no table, source or materialized view has that name): "
        "did you mean 'bid'? if you removed that view, remove this sink too (its CREATE SINK statement), or "
        "point its FROM at another table (defined: bid)"
    )


def test_sink_whose_view_was_removed_is_told_to_go_too_not_pointed_at_an_unrelated_table(tmp_path: Path) -> None:
    # The view customer_totals was dropped; its sink stayed. difflib's default cutoff offered 'customers'.
    sink = "CREATE SINK s\nFROM customer_totals\nWITH (connector = 'duckdb', database = 'd', table = 't');"
    customers = "CREATE MATERIALIZED VIEW customers AS SELECT auction FROM bid;\n"
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + customers + sink})
    assert "did you mean" not in issue.message
    assert "if you removed that view, remove this sink too" in issue.message
    assert "point its FROM at another table (defined: bid, customers)" in issue.message


# -- views ---------------------------------------------------------------------------------------


def test_views_resolve_across_files_in_any_order(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "a_views.sql": """\
            CREATE MATERIALIZED VIEW both_ AS
            SELECT auction, eur FROM pricey
            UNION ALL SELECT auction, price * 0.9 AS eur FROM bid
            UNION ALL SELECT auction, eur FROM pricey;
            CREATE MATERIALIZED VIEW pricey AS
            SELECT * FROM (SELECT auction, CAST(price * 0.908 AS DOUBLE) AS eur FROM bid) AS p
            WHERE eur > 10;
            """,
            "b_sources.sql": BID_SOURCE,
            "notes.txt": "not SQL; ignored",
        },
    )
    assert pipeline.views["both_"].upstreams == ("pricey", "bid")
    assert pipeline.views["both_"].columns == ("auction", "eur")
    assert pipeline.views["pricey"].columns == ("auction", "eur")
    assert pipeline.view_order() == ["pricey", "both_"]


def test_stateless_constructs_are_allowed(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """
            CREATE MATERIALIZED VIEW ok AS
            WITH recent AS (SELECT * FROM bid WHERE date_time > TIMESTAMP '2024-01-01 00:00:00')
            SELECT
                upper(channel) AS channel,
                CASE WHEN price > 100 THEN 'high' ELSE 'low' END AS band,
                CAST(price AS DOUBLE) / 100 AS dollars,
                coalesce(url, '') AS url,
                unix_timestamp(date_time) AS epoch_seconds,
                r.auction
            FROM recent AS r
            WHERE price BETWEEN 1 AND 1000 AND channel IN ('web', 'app');
            """
        },
    )
    assert pipeline.views["ok"].upstreams == ("bid",)
    assert pipeline.views["ok"].columns == (
        "channel", "band", "dollars", "url", "epoch_seconds", "auction",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("SELECT auction FROM bid\nGROUP BY auction", "keyed"),
        ("SELECT\nmax(price) AS m FROM bid", "keyed"),
        ("SELECT b.auction FROM bid b\nJOIN bid c ON b.auction = c.auction", "keyed"),
        ("SELECT b.auction FROM bid b\nLEFT JOIN bid c USING (auction)", "keyed"),
        ("SELECT b.auction FROM bid b, bid c WHERE b.auction = c.auction", "keyed"),
        ("SELECT\nDISTINCT auction FROM bid", "keyed"),
        ("SELECT auction FROM bid\nUNION SELECT bidder FROM bid", "keyed"),
        ("SELECT auction FROM bid\nINTERSECT SELECT bidder FROM bid", "keyed"),
        ("SELECT auction FROM bid\nEXCEPT SELECT bidder FROM bid", "keyed"),
        ("SELECT auction,\nrow_number() OVER (ORDER BY price) AS r FROM bid", "keyed"),
        ("SELECT auction,\nsum(price) OVER (PARTITION BY auction) AS r FROM bid", "keyed"),
        ("SELECT auction FROM bid WHERE\nauction IN (SELECT auction FROM bid WHERE price > 5)", "keyed"),
        (
            "SELECT auction FROM bid b WHERE\nEXISTS (SELECT 1 FROM bid c WHERE c.price > 5 AND c.bidder = b.bidder)",
            "keyed",
        ),
        ("SELECT auction FROM bid\nORDER BY auction LIMIT 10", "keyed"),
        ("SELECT auction FROM (SELECT auction FROM bid\nGROUP BY auction) AS g", "keyed"),
        ("SELECT auction FROM bid\nGROUP BY auction HAVING auction > 1", "keyed"),
        ("SELECT auction,\nevery(price > 1) AS e FROM bid GROUP BY auction", "keyed"),
        ("SELECT auction FROM bid\nORDER BY price", "linear"),
        ("SELECT auction FROM bid\nSORT BY auction", "linear"),
    ],
)
def test_constructs_with_state_are_planned(tmp_path: Path, query: str, kind: str) -> None:
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\n" + query + ";"})
    plan = pipeline.views["v"].plan
    assert plan is not None
    # a view that projects an internal stage keeps its state there (a partial aggregate's stage)
    stages = [v.plan for v in pipeline.views.values() if v.internal_of == "v" and v.plan is not None]
    planned = "keyed" if plan.kind == "keyed" or any(s.kind == "keyed" for s in stages) else plan.kind
    assert planned == kind, plan


@pytest.mark.parametrize(
    ("query", "construct", "rewrite"),
    [
        ("SELECT b.auction FROM bid b\nLEFT JOIN bid c ON b.price > c.price", "JOIN", "add an equality"),
        ("SELECT auction,\n(SELECT 1) AS one FROM bid", "a subquery inside an expression", "join with it in FROM"),
        ("SELECT auction FROM bid WHERE\nprice > ALL (SELECT 1)", "ANY/SOME/ALL (subquery)", "NOT EXISTS"),
        ("SELECT auction FROM bid WHERE\nauction NOT IN (SELECT bidder FROM bid)", "NOT IN (subquery)", "NOT EXISTS"),
        (
            "SELECT auction FROM bid b WHERE\nEXISTS (SELECT 1 FROM bid c WHERE c.price > 5)",
            "EXISTS (subquery)",
            "correlate",
        ),
        (
            "SELECT auction FROM bid WHERE price > 1 OR\nauction IN (SELECT bidder FROM bid)",
            "IN/EXISTS (subquery)",
            "JOIN",
        ),
        (
            # (it was planned without its PIVOT, which Spark's analysis then refused as a planner bug)
            "SELECT * FROM (SELECT auction, bidder, price FROM bid)\nPIVOT (sum(price) FOR bidder IN (1 AS one))",
            "PIVOT",
            "CASE WHEN",
        ),
        (
            # (it was accepted, and the runtime then failed on a cycle among views)
            "WITH\nRECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
            "SELECT b.auction, r.n FROM bid b JOIN r ON b.auction % 3 = r.n",
            "WITH RECURSIVE",
            "join a fixed number of times",
        ),
    ],
)
def test_queries_the_planner_cannot_maintain_are_refused(
    tmp_path: Path, query: str, construct: str, rewrite: str
) -> None:
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\n" + query + ";"})
    assert at(issue) == ("a.sql", 6), issue
    assert issue.message.startswith(f"view v: {construct} cannot be maintained incrementally"), issue.message
    assert rewrite in issue.message
    assert issue.message.endswith(FULL_REFRESH_HINT)


def test_spark_windowed_aggregation_loads_as_spark_writes_it(tmp_path: Path) -> None:
    """GROUP BY window(...) first (sqlglot read WINDOW as the start of a WINDOW clause) and the
    window's struct read as window.start/window.end or window, by the names Spark gives them."""
    pipeline = load(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW tumble AS\nSELECT window.start, window.end, count(*) AS cnt FROM bid\n"
            "GROUP BY window(date_time, '10 seconds');\n"
            "CREATE MATERIALIZED VIEW hop AS SELECT auction, window, count(*) AS cnt FROM bid\n"
            "GROUP BY window(date_time, '10 seconds', '2 seconds'), auction HAVING cnt > 1;\n"
        },
    )
    assert pipeline.views["tumble"].columns == ("start", "end", "cnt")
    assert pipeline.views["hop"].columns == ("auction", "window", "cnt")
    assert pipeline.views["tumble"].query.startswith("SELECT window.start")  # kept as written


def test_window_columns_are_checked_like_any_column(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW v AS SELECT window.start AS ws, count(*) AS n FROM bid\n"
            "GROUP BY window(date_tme, '10 seconds');\n"
            "CREATE MATERIALIZED VIEW w AS SELECT\nwindow.start AS ws FROM bid;\n"
        },
    )
    assert [(at(i), i.message.split(":")[0]) for i in found] == [(("a.sql", 5), "view v"), (("a.sql", 7), "view w")]
    assert "unknown column 'date_tme'" in found[0].message and "did you mean 'date_time'?" in found[0].message
    # without GROUP BY window(...) there is no window column, in Spark either
    assert "unknown table or alias 'window'" in found[1].message


def test_an_in_list_is_a_filter_not_a_subquery(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW v AS SELECT a.auction, b.bidder FROM bid a JOIN bid b\n"
            "ON a.auction = b.auction WHERE a.channel IN ('apple', 'google') AND b.price NOT IN (1, 2);"
        },
    )
    assert pipeline.views["v"].plan.rule == "delta join"


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("SELECT auction,\nrand() AS r FROM bid", "rand() is non-deterministic"),
        ("SELECT auction,\nnow() AS t FROM bid", "now() is non-deterministic"),
        ("SELECT auction,\ncurrent_timestamp AS t FROM bid", "current_timestamp() is non-deterministic"),
        ("SELECT auction,\nuuid() AS u FROM bid", "uuid() is non-deterministic"),
        ("SELECT auction,\ncurrent_date() AS d FROM bid", "current_date() is non-deterministic"),
        ("SELECT auction,\nunix_timestamp() AS t FROM bid", "unix_timestamp() is non-deterministic"),
        ("SELECT auction FROM bid\nTABLESAMPLE (10 PERCENT)", "TABLESAMPLE is non-deterministic"),
        (
            "SELECT auction, count(*) AS n FROM bid\nGROUP BY auction HAVING max(rand()) > 0",
            "rand() is non-deterministic",
        ),
    ],
)
def test_non_deterministic_functions_are_refused(tmp_path: Path, query: str, construct: str) -> None:
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\n" + query + ";"})
    assert at(issue) == ("a.sql", 6), issue
    assert issue.message.startswith(f"view v: {construct}")
    assert issue.message.endswith(
        "remove it, or compute the value before it reaches Epochal (in the producer of the source)"
    )


@pytest.mark.parametrize(
    ("query", "function"),
    [
        ("SELECT auction,\nfirst(bidder) AS b FROM bid GROUP BY auction", "first"),
        ("SELECT auction,\nlast(bidder) IGNORE NULLS AS b FROM bid GROUP BY auction", "last"),
        ("SELECT auction,\nany_value(bidder) AS b FROM bid GROUP BY auction", "any_value"),
        ("SELECT auction,\nfirst_value(bidder) AS b FROM bid GROUP BY auction", "first_value"),
    ],
)
def test_order_dependent_aggregates_are_refused_with_a_deterministic_rewrite(
    tmp_path: Path, query: str, function: str
) -> None:
    # Found by a user-style probe: the touched groups' recompute and a batch over every row picked
    # different rows, so the view matched no batch run (Spark itself calls these non-deterministic).
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\n" + query + ";"})
    assert at(issue) == ("a.sql", 6), issue
    assert issue.message.startswith(f"view v: aggregate function {function}() is non-deterministic"), issue
    assert "max_by(x, <a column that orders the rows>)" in issue.message


def test_first_value_over_an_ordered_window_stays_allowed(tmp_path: Path) -> None:
    query = "SELECT auction, first_value(bidder) OVER (PARTITION BY auction ORDER BY price, bidder) AS b FROM bid"
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v AS {query};"})
    assert pipeline.views["v"].upstreams == ("bid",)


COLLECT = "aggregate function collect_list()/array_agg()"


@pytest.mark.parametrize(
    ("query", "refused"),
    [
        # (issue 60 item 16: given a canonical order instead, below)
        ("SELECT auction,\ncollect_list(bidder) AS b FROM bid GROUP BY auction", None),
        ("SELECT auction,\nconcat_ws(',', collect_list(channel)) AS b FROM bid GROUP BY auction", None),
        ("SELECT auction,\nstring_agg(channel, ',') AS b FROM bid GROUP BY auction", "aggregate function string_agg()"),
        (
            "SELECT auction,\nfirst_value(bidder) OVER (PARTITION BY auction) AS b FROM bid",
            "window function first_value() OVER (...) without ORDER BY",
        ),
        (
            "SELECT auction,\ncollect_list(bidder) OVER w AS b FROM bid WINDOW w AS (PARTITION BY auction)",
            "window function collect_list()/array_agg() OVER",
        ),
        ("SELECT auction, array_sort(collect_list(bidder)) AS b, size(collect_list(url)) AS n FROM bid GROUP BY 1",
         None),
        ("SELECT auction, listagg(channel, ',') WITHIN GROUP (ORDER BY channel) AS b FROM bid GROUP BY auction", None),
        ("SELECT auction, sort_array(array_distinct(collect_list(bidder))) AS b FROM bid GROUP BY auction", None),
        (
            "SELECT auction, collect_list(bidder) OVER w AS b FROM bid "
            "WINDOW w AS (PARTITION BY auction ORDER BY date_time, bidder)",
            None,
        ),
    ],
)
def test_collecting_values_in_arrival_order_is_refused_with_a_sorted_rewrite(
    tmp_path: Path, query: str, refused: str | None
) -> None:
    # Found by a user-style probe: collect_list(), array_agg(), string_agg() and concat_ws() of a
    # collect_list() gave the touched groups' values in another order than a batch did.
    issue = _refused_or_loads(tmp_path, query, refused)
    if issue is not None:
        assert "is non-deterministic" in issue.message
        fixes = ("array_sort(collect_list(x))", "OVER (PARTITION BY k ORDER BY ts, id)")
        assert any(fix in issue.message for fix in fixes), issue


@pytest.mark.parametrize(
    ("written", "runs"),
    [
        ("collect_list(bidder)", "ARRAY_SORT(COLLECT_LIST(bidder))"),
        ("array_agg(bidder) FILTER (WHERE price > 1)", "ARRAY_SORT(COLLECT_LIST(bidder) FILTER(WHERE price > 1))"),
        ("collect_set(channel)", "ARRAY_SORT(COLLECT_SET(channel))"),
        ("concat_ws(',', collect_list(channel))", "CONCAT_WS(',', ARRAY_SORT(COLLECT_LIST(channel)))"),
        ("max_by(channel, price)", "MAX_BY(channel, IF(price IS NULL, NULL, STRUCT(price, channel)))"),
        ("min_by(channel, price, 2)", "MIN_BY(channel, IF(price IS NULL, NULL, STRUCT(price, channel)), 2)"),
        # already canonical: left as written
        ("size(collect_list(url))", "size(collect_list(url))"),
        ("array_sort(collect_set(url))", "array_sort(collect_set(url))"),
    ],
)
def test_unordered_aggregates_run_with_a_canonical_order(tmp_path: Path, written: str, runs: str) -> None:
    """Issue 60 item 16: any order is a correct answer of an unordered aggregate, so the collected
    values are sorted and max_by/min_by break ties by the value: a replayed epoch, a recompute of
    the touched groups and a batch agree (docs/incremental-views.md)."""
    query = f"SELECT auction, {written} AS b FROM bid GROUP BY auction"
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v AS {query};"})
    assert pipeline.views["v"].query == f"SELECT auction, {runs} AS b FROM bid GROUP BY auction"
    assert pipeline.views["v"].columns == ("auction", "b")


def _refused_or_loads(tmp_path: Path, query: str, refused: str | None) -> PipelineIssue | None:
    """View v of ``query`` over bid: refused at its line with a message starting ``refused``, or,
    for None, loaded; returns the refusal."""
    files = {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\n" + query + ";"}
    if refused is None:
        assert load(tmp_path, files).views["v"].upstreams == ("bid",)
        return None
    issue = only_issue(tmp_path, files)
    assert at(issue) == ("a.sql", 6), issue
    assert issue.message.startswith(f"view v: {refused}"), issue
    return issue


@pytest.mark.parametrize(
    ("query", "word"),
    [
        ("SELECT auction, price FROM bid\nLIMIT 3", "LIMIT"),
        ("SELECT auction FROM bid UNION ALL SELECT bidder AS auction FROM bid\nLIMIT 3", "LIMIT"),
        ("SELECT auction, price FROM bid\nOFFSET 2", "OFFSET"),
        ("SELECT auction, price FROM bid ORDER BY price LIMIT 3 OFFSET 1", None),
        # the order of a subquery is not the LIMIT's: Spark may drop it
        ("SELECT auction, price FROM (SELECT auction, price FROM bid ORDER BY price)\nLIMIT 3", "LIMIT"),
    ],
)
def test_a_limit_without_order_by_in_its_select_is_refused_as_non_deterministic(
    tmp_path: Path, query: str, word: str | None
) -> None:
    # Found by a user-style probe: which rows LIMIT keeps is up to the order they arrive in, so the
    # view kept other rows than a batch over the same sources did.
    issue = _refused_or_loads(tmp_path, query, word and f"{word} without ORDER BY is non-deterministic")
    if issue is not None:
        assert "ORDER BY price DESC, id LIMIT 10" in issue.message


@pytest.mark.parametrize(
    "query",
    [
        "SELECT auction, count(*) AS n, max(price) AS m FROM bid GROUP BY auction HAVING count(*) > 1",
        "SELECT a.auction, b.bidder FROM bid a LEFT JOIN bid b ON a.auction = b.auction",
        "SELECT auction FROM (SELECT auction, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price) AS rn "
        "FROM bid) WHERE rn <= 3",
        "SELECT DISTINCT channel FROM bid WHERE auction IN (SELECT auction FROM bid WHERE price > 10)",
        "SELECT b.auction, v.label FROM bid b JOIN (VALUES ('a', 'A')) AS v(channel, label) ON b.channel = v.channel",
    ],
)
def test_full_refresh_views_accept_stateful_queries(tmp_path: Path, query: str) -> None:
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v WITH (refresh = 'full') AS {query};"})
    assert pipeline.views["v"].refresh == "full"
    assert pipeline.views["v"].upstreams == ("bid",)


@pytest.mark.parametrize(
    ("query", "columns"),
    [
        ("SELECT b.auction, v.label FROM bid b JOIN (VALUES ('a', 'A')) AS v(channel, label) "
         "ON b.channel = v.channel", ("auction", "label")),
        ("SELECT b.auction, col2 FROM bid b JOIN VALUES ('a', 'A'), ('b', 'B') ON b.channel = col1",
         ("auction", "col2")),
        ("SELECT auction FROM bid WHERE channel IN (SELECT * FROM VALUES ('a'), ('b'))", ("auction",)),
        ("WITH m(k, w) AS (VALUES ('a', 1)) SELECT b.auction, m.w FROM bid b JOIN m ON b.channel = m.k",
         ("auction", "w")),
        # grouped, but over VALUES only: constant all the same, not a stage no epoch would run
        ("SELECT b.auction, m.n FROM bid b JOIN (SELECT k, count(*) AS n FROM VALUES ('a'), ('a') AS t(k) "
         "GROUP BY k) m ON b.channel = m.k", ("auction", "n")),
    ],
)
def test_values_is_a_constant_input_of_an_incremental_view(tmp_path: Path, query: str, columns: tuple) -> None:
    """An inline lookup table reads no source: its leaf has no upstream (its change is always
    empty), and the view's upstreams are the tables it reads. Columns are named as Spark names
    them (col1, col2... for VALUES without names)."""
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v AS {query};"})
    view = pipeline.views["v"]
    assert view.columns == columns and view.upstreams == ("bid",)
    assert view.plan.kind == "keyed" and [leaf.upstreams for leaf in view.plan.leaves] == [("bid",), ()]


def test_a_stage_joining_only_values_is_refused_with_its_rewrite(tmp_path: Path) -> None:
    """Keyed by different columns, the join splits into a stage of its first two inputs, both
    VALUES: a table no epoch would change. Joined in a subquery, they are one constant input."""
    query = (
        "SELECT a.x, b.auction, count(*) AS n FROM VALUES (1, 'a') AS a(x, y) JOIN VALUES ('a', 2) AS c(y, z) "
        "ON a.y = c.y JOIN bid b ON b.auction = c.z GROUP BY a.x, b.auction"
    )
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v AS {query};"})
    assert at(issue) == ("a.sql", 4)
    assert issue.message.startswith("view v: part of the query joins only VALUES, whose rows never change")
    assert "join the VALUES in a subquery in FROM" in issue.message
    rewritten = (
        "SELECT ac.x, b.auction, count(*) AS n FROM (SELECT a.x, c.z FROM VALUES (1, 'a') AS a(x, y) "
        "JOIN VALUES ('a', 2) AS c(y, z) ON a.y = c.y) ac JOIN bid b ON b.auction = ac.z GROUP BY ac.x, b.auction"
    )
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + f"CREATE MATERIALIZED VIEW v AS {rewritten};"})
    assert pipeline.views["v"].plan is not None


def test_full_refresh_still_refuses_non_deterministic_functions(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW v WITH (refresh = 'full') AS\nSELECT auction, rand() AS r FROM bid;"
        },
    )
    assert "rand() is non-deterministic" in issue.message


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT 1 AS one", "view v: the query reads no source or view: add FROM a source or view"),
        ("SELECT * FROM range(10)", "view v: reading range(10) is not supported"),
        ("SELECT * FROM VALUES (1, 2) AS t(a, b)", "view v: the query reads only VALUES, whose rows never change"),
        ("DELETE FROM bid", "view v: AS must be followed by a single SELECT query"),
    ],
)
def test_views_must_select_from_sources_or_views(tmp_path: Path, query: str, expected: str) -> None:
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS " + query + ";"})
    assert at(issue) == ("a.sql", 4)
    assert issue.message.startswith(expected)


def test_refusal_message_shape() -> None:
    assert REFUSED["GROUP BY"] == NEEDS_STATE
    assert REFUSED["non-deterministic function"] == NOT_REPEATABLE


def test_every_non_deterministic_function_in_a_view_is_reported(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT DISTINCT auction, rand() AS r,
            uuid() AS u
            FROM bid
            WHERE price > randn();
            """
        },
    )
    assert [(i.line, i.message.split(" is non")[0]) for i in found] == [
        (5, "view v: rand()"),
        (6, "view v: uuid()"),
        (8, "view v: randn()"),
    ]


def test_unknown_table_in_a_query_suggests_the_closest(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT auction
            FROM bids;
            CREATE MATERIALIZED VIEW w AS SELECT auction FROM nothing_like_it;
            CREATE SINK k FROM v WITH (connector = 'duckdb', database = 'd', table = 't');
            CREATE MATERIALIZED VIEW x AS SELECT auction FROM k;
            """
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("a.sql", 6),
            "view v: unknown table 'bids' (not a table, source or materialized view): did you mean 'bid'?",
        ),
        (
            ("a.sql", 7),
            "view w: unknown table 'nothing_like_it' (not a table, source or materialized view): defined: bid, v, w, x",
        ),
        (
            ("a.sql", 9),
            "view x: 'k' is a sink, which cannot be read: read a table, a source or a materialized view",
        ),
    ]


def test_unknown_columns_are_all_reported_on_their_lines(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT auction,
                   pricee * 2 AS doubled
            FROM bid
            WHERE chanel = 'web';
            CREATE MATERIALIZED VIEW w AS
            SELECT auction, doubled, b.bidder FROM v AS b;
            CREATE MATERIALIZED VIEW y AS SELECT auction, x.price FROM bid;
            """
        },
    )
    assert [(at(i), i.message) for i in found] == [
        (
            ("a.sql", 6),
            "view v: unknown column 'pricee': bid has auction, bidder, price, channel, url, "
            "date_time, extra; did you mean 'price'?",
        ),
        (
            ("a.sql", 8),
            "view v: unknown column 'chanel': bid has auction, bidder, price, channel, url, "
            "date_time, extra; did you mean 'channel'?",
        ),
        (
            ("a.sql", 11),
            "view y: unknown table or alias 'x' in x.price: the query's FROM names bid",
        ),
    ]


def test_columns_of_views_are_checked_against_the_view_they_read(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS SELECT auction, price * 2 AS price2 FROM bid;
            CREATE MATERIALIZED VIEW w AS
            SELECT auction,
                   price
            FROM v;
            """
        },
    )
    assert at(issue) == ("a.sql", 7)
    assert issue.message == ("view w: unknown column 'price': v has auction, price2; did you mean 'price2'?")


def test_query_syntax_error_points_at_the_query_line(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT auction
            FROM bid
            WHERE (price > 1;
            """
        },
    )
    assert at(issue) == ("a.sql", 7)
    assert issue.message.startswith("view v: syntax error in the query: Expecting )")
    assert issue.message.endswith("fix the Spark SQL")


def test_unnamed_expressions_need_an_alias(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT auction,
                   price * 0.908
            FROM bid;
            """
        },
    )
    assert at(issue) == ("a.sql", 6)
    assert issue.message == "view v: column 2 (price * 0.908) has no name: add AS column_name"


def test_a_generator_of_several_unnamed_columns_is_told_to_name_each(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS\nSELECT inline(array(struct(price, bidder)))\nFROM bid;"},
    )
    assert issue.message.endswith("has no name: add AS (name1, name2, ...), one name per column it gives")


def test_union_all_branches_need_the_same_column_count(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW v AS
            SELECT auction, price FROM bid
            UNION ALL
            SELECT auction FROM bid;
            """
        },
    )
    assert at(issue) == ("a.sql", 7)
    assert "view v: the UNION branches have different numbers of columns (2 and 1)" in issue.message


def test_duplicate_output_columns_are_refused(tmp_path: Path) -> None:
    issue = only_issue(
        tmp_path,
        {"a.sql": BID_SOURCE + "CREATE MATERIALIZED VIEW v AS SELECT auction, bidder AS auction FROM bid;"},
    )
    assert at(issue) == ("a.sql", 4)
    assert "view v: column 'auction' appears more than once in the output" in issue.message


def test_a_generator_named_by_several_aliases_gives_each_column(tmp_path: Path) -> None:
    """stack(...) AS (k, v) names two columns, as Spark gives them: not a column without a name."""
    view = (
        "CREATE MATERIALIZED VIEW v AS "
        "SELECT auction, stack(2, 'bidder', bidder, 'price', price) AS (k, v) FROM bid;"
    )
    pipeline = load(tmp_path, {"a.sql": BID_SOURCE + view})
    assert pipeline.views["v"].columns == ("auction", "k", "v")
    twice = "CREATE MATERIALIZED VIEW w AS SELECT auction AS k, stack(1, bidder, price) AS (k, v) FROM bid;"
    issue = only_issue(tmp_path, {"a.sql": BID_SOURCE + twice})
    assert "view w: column 'k' appears more than once in the output" in issue.message


def test_view_options_are_checked(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW v\nWITH (refrsh = 'full') AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW w\nWITH (refresh = 'sometimes') AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW x\nWITH (min_max_cache = 'lots') AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW y\nWITH (min_max_cache = 0) AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW z\nWITH (min_max_cach = 4) AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW r\nWITH (backfill_rate_limit = 'fast') AS SELECT auction FROM bid;\n"
            + "CREATE MATERIALIZED VIEW s\nWITH (backfill_rate_limit = '-5') AS SELECT auction FROM bid;"
        },
    )
    messages = [i.message for i in found]
    for bad in ("fast", "-5"):
        assert any(f"backfill_rate_limit = '{bad}' is not a rate" in m for m in messages), messages
    assert any("unknown materialized view option 'refrsh': did you mean 'refresh'?" in m for m in messages)
    assert any("refresh = 'sometimes' is not a refresh mode" in m for m in messages)
    for bad in ("lots", "0"):
        assert any(
            f"min_max_cache = '{bad}' is not a number of values to keep per group: use a whole number from 1 to "
            "10000 (default 16)" in m
            for m in messages
        ), messages
    assert any("did you mean 'min_max_cache'?" in m for m in messages)
    assert loader.VIEW_OPTIONS == frozenset({"refresh", "min_max_cache", "backfill_rate_limit"})


def test_a_view_sets_how_many_min_max_values_its_stage_keeps(tmp_path: Path) -> None:
    pipeline = load(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "CREATE MATERIALIZED VIEW hi WITH (min_max_cache = 200) AS "
            "SELECT auction, max(price) AS top FROM bid GROUP BY auction;\n"
            + "CREATE MATERIALIZED VIEW lo AS SELECT auction, min(price) AS low FROM bid GROUP BY auction;"
        },
    )
    assert pipeline.views["hi__stage1"].plan.aggregate.min_max_cache == 200
    assert pipeline.views["hi__stage1"].plan.aggregate.hidden == ("_epochal_kept_p2_max",)
    assert pipeline.views["lo__stage1"].plan.aggregate.min_max_cache == 16


def test_cycles_among_views_are_named(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + """\
            CREATE MATERIALIZED VIEW a AS SELECT auction FROM b;
            CREATE MATERIALIZED VIEW b AS SELECT auction FROM c UNION ALL SELECT auction FROM bid;
            CREATE MATERIALIZED VIEW c AS SELECT auction FROM a;
            CREATE MATERIALIZED VIEW d AS SELECT auction FROM d;
            CREATE MATERIALIZED VIEW e AS SELECT auction FROM a;
            """
        },
    )
    assert [(at(i), i.message.split(" (each")[0]) for i in found] == [
        (("a.sql", 4), "views form a cycle: a -> b -> c -> a"),
        (("a.sql", 7), "views form a cycle: d -> d"),
    ]


# -- the directory -------------------------------------------------------------------------------


def test_missing_or_empty_directory_names_the_environment_variable(tmp_path: Path) -> None:
    for directory, reason in [
        (tmp_path / "nope", "does not exist"),
        (tmp_path, "has no *.sql files"),
    ]:
        with pytest.raises(PipelineError) as raised:
            load_pipeline(directory, connector_spec=fake_lookup)
        (issue,) = raised.value.issues
        assert reason in issue.message
        assert "EPOCHAL_PIPELINE" in issue.message

    write(tmp_path, {"a.sql": "-- nothing yet;\n"})
    with pytest.raises(PipelineError, match="define nothing.*EPOCHAL_PIPELINE"):
        load_pipeline(tmp_path, connector_spec=fake_lookup)


def test_errors_in_several_files_are_all_reported_in_file_order(tmp_path: Path) -> None:
    found = issues(
        tmp_path,
        {
            "02_views.sql": """\
            CREATE MATERIALIZED VIEW v AS SELECT auction, count(*) AS n FROM bid GROUP BY auction;
            CREATE MATERIALIZED VIEW w AS SELECT nope FROM bid;
            """,
            "01_sources.sql": BID_SOURCE + "CREATE SOURCE s (a BLOB) WITH (connector = 'kafka');\n",
            "03_sinks.sql": "CREATE SINK k FROM vv WITH (connector = 'duckdb', database = 'd', table = 't');",
        },
    )
    assert [at(i) for i in found] == [
        ("01_sources.sql", 4),
        ("01_sources.sql", 4),
        ("02_views.sql", 2),
        ("03_sinks.sql", 1),
    ]
    assert [i.message.split(":")[0] for i in found] == [
        "source s", "source s", "view w", "sink k",
    ]  # fmt: skip


def test_names_epochal_makes_for_a_view_are_reserved(tmp_path: Path) -> None:
    """A planner's stage and a changed view's new statement live under derived names: a user's
    table with such a name would be taken for one of them."""
    found = issues(
        tmp_path,
        {
            "1.sql": BID_SOURCE,
            "2.sql": """\
            CREATE MATERIALIZED VIEW counts__rebuild AS SELECT auction FROM bid;
            CREATE MATERIALIZED VIEW counts__STAGE1 AS SELECT auction FROM bid;
            """,
        },
    )
    assert [at(i) for i in found] == [("2.sql", 1), ("2.sql", 2)]
    assert "'counts__rebuild' contains '__rebuild', which Epochal reserves" in found[0].message
    assert "rename it" in found[0].message and "'__stage'" in found[1].message


def test_a_query_sqlglot_cannot_write_back_for_spark_is_refused_at_its_line(tmp_path: Path) -> None:
    """A stateful view runs the SQL generated from its plan; where sqlglot cannot write part of the
    query for Spark, the view is refused by name rather than run as SQL that means something else."""
    found = issues(
        tmp_path,
        {
            "a.sql": BID_SOURCE
            + "\nCREATE MATERIALIZED VIEW locked AS\n"
            + "SELECT bidder, count(*) AS n FROM bid GROUP BY bidder FOR UPDATE;\n"
        },
    )
    (issue,) = found
    assert issue.line == 5  # the view's statement
    assert "view locked" in issue.message and "FOR UPDATE" in issue.message
    assert "refresh = 'full'" in issue.message


def test_every_column_name_the_engine_adds_is_reserved() -> None:
    """The engine's own column names, where they are defined, are all in the one reserved list."""
    from epochal.incremental import partial
    from epochal.incremental.plan import MIN_MAX_CACHE_PREFIX
    from epochal.sql import internal_name_use
    from epochal.storage import upsert, vnode, warehouse

    for name in (warehouse.WEIGHT, vnode.VNODE, vnode.VNODE_RUN, "_n", "_net", "_i", MIN_MAX_CACHE_PREFIX + "x"):
        assert internal_name_use(name) is not None, name
    for prefix in (partial._OLD, partial._DELTA, partial._GONE, partial._IN, partial._OUT, partial._REDO):
        assert internal_name_use(prefix + "total") is not None, prefix
    from epochal.connectors.json_lines import CORRUPT as _CORRUPT

    assert internal_name_use(_CORRUPT) is not None
    for name in upsert.RECORD_COLUMNS:
        assert internal_name_use(name, keyed=True) is not None, name
    assert internal_name_use("_id") is None and internal_name_use("weight") is None
