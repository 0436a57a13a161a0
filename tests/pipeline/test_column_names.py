"""Column names as records carry them: `user-id`, `price.eur`, `Order Type`, `qty(n)`. The loader
refused every name that was not letters, digits and underscores, so such a field could not be read
at all; Spark and RisingWave take any quoted name. Table names stay plain (they are directories,
Spark tables and Dagster asset keys). A dot in a name is not a struct path and a space is not two
tokens anywhere Epochal writes SQL or builds a plan: every kind of view, a keyed TABLE keyed by such
a column, compaction, a backfill of views added mid-stream (one recomputed in full), dead letters,
and sinks into DuckDB, PostgreSQL, Delta Lake and Iceberg keyed by one, each against the batch
oracle over the records re-read from the log (which looks fields up by their spelling, not the
lower-cased name)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from deltalake import DeltaTable

from epochal.backfill.runner import BackfillRunner
from epochal.connectors.log import append_records
from epochal.errors import PipelineError
from epochal.pipeline.loader import load_pipeline
from epochal.query.cut import run_query
from epochal.storage.warehouse import dead_letter_table
from tests.consistency import Oracle, iceberg_table, multiset, sink_rows
from tests.epochal_harness import make_harness, run_epoch
from tests.sinks.test_postgres_sink import database, sql_rows  # noqa: F401 - the fixture

SOURCES = """
CREATE TABLE lines (`line-id` BIGINT, `user-id` BIGINT, `Order Type` STRING, `price.eur` DOUBLE, `qty(n)` INT,
                    PRIMARY KEY (`line-id`))
WITH (connector = 'log', path = 'data/lines', format = 'json');
CREATE SOURCE users (`user-id` BIGINT, `Display Name` STRING, `e-mail` STRING)
WITH (connector = 'log', path = 'data/users', format = 'json');
"""
VIEWS = {
    "per_user": "SELECT `user-id`, count(*) AS `line count`, sum(`price.eur`) AS `total.eur`, "
    "max(`qty(n)`) AS `max-qty` FROM lines GROUP BY `user-id`",
    "by_type": "SELECT `Order Type`, min(`price.eur`) AS lo, avg(`qty(n)`) AS `avg qty` FROM lines "
    "GROUP BY `Order Type`",
    "joined": "SELECT u.`Display Name`, l.`Order Type`, l.`price.eur` FROM lines l JOIN users u "
    "ON l.`user-id` = u.`user-id`",
    "ranked": "SELECT * FROM (SELECT `user-id`, `line-id`, row_number() OVER (PARTITION BY `user-id` "
    "ORDER BY `price.eur` DESC, `line-id`) AS `rank-in-user` FROM lines) WHERE `rank-in-user` <= 2",
    "filtered": "SELECT `line-id`, `e-mail` FROM lines l JOIN users u USING (`user-id`) WHERE `e-mail` LIKE 'x%'",
    "distinct_mail": "SELECT DISTINCT `e-mail` AS `the mail` FROM users",
    "linear": "SELECT `line-id`, `price.eur` * 2 AS `double price` FROM lines WHERE `qty(n)` > 2",
}
#: added after two epochs: backfilled from the snapshot and the change log, then maintained
LATE_VIEWS = {
    "late_types": "SELECT `Order Type`, count(DISTINCT `user-id`) AS `users.n`, max(`price.eur`) AS `top price` "
    "FROM lines GROUP BY `Order Type`",
    "late_mails": "SELECT `e-mail`, count(*) AS `n-users` FROM users GROUP BY `e-mail`",
}
SINKS = """
CREATE SINK per_user_duckdb FROM per_user
WITH (connector = 'duckdb', database = 'out/s.duckdb', table = 'per_user', type = 'upsert', primary_key = 'user-id');
CREATE SINK per_user_pg FROM per_user
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'per user',
      type = 'upsert', primary_key = 'user-id');
CREATE SINK linear_pg FROM linear
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'linear',
      writers = '2', type = 'upsert', primary_key = 'line-id');
CREATE SINK per_user_delta FROM per_user
WITH (connector = 'deltalake', location = 'lake/per_user', type = 'upsert', primary_key = 'user-id');
CREATE SINK linear_delta FROM linear
WITH (connector = 'deltalake', location = 'lake/linear', type = 'upsert', primary_key = 'line-id');
CREATE SINK per_user_iceberg FROM per_user
WITH (connector = 'iceberg', namespace = 'app', table = 'per_user', type = 'upsert', primary_key = 'user-id');
"""


def _views_sql(views: dict[str, str], full: frozenset[str] = frozenset()) -> str:
    return "".join(
        f"CREATE MATERIALIZED VIEW {name}{' WITH (refresh = ' + repr('full') + ')' if name in full else ''} "
        f"AS {query};\n"
        for name, query in views.items()
    )


def _records(rnd: random.Random, epoch: int) -> tuple[list[str], list[str]]:
    lines = []
    for _ in range(12):
        line_id = rnd.randint(1, 20)
        if rnd.random() < 0.2:
            lines.append(json.dumps({"line-id": line_id, "_op": "delete"}))
            continue
        lines.append(
            json.dumps(
                {
                    "line-id": line_id,
                    "user-id": rnd.randint(1, 5),
                    "Order Type": rnd.choice(["a", "b"]),
                    "price.eur": round(rnd.uniform(0, 40), 1),
                    "qty(n)": rnd.randint(1, 9),
                }
            )
        )
    users = [
        json.dumps({"user-id": i, "Display Name": f"U {i}", "e-mail": rnd.choice(["x@a", "y@b"])})
        for i in (epoch + 1, epoch + 2)
    ]
    return lines, users


def test_columns_named_as_records_name_them_run_through_views_backfills_and_every_sink(
    spark, tmp_path: Path, database: str  # noqa: F811 - the fixture
) -> None:
    h = make_harness(
        tmp_path,
        {"sources.sql": SOURCES, "views.sql": _views_sql(VIEWS), "sinks.sql": SINKS.replace("{db}", database)},
    )
    rnd = random.Random(3)
    data = h.home / "data"
    views = dict(VIEWS)
    for epoch in range(5):
        if epoch == 2:
            (h.pipeline_dir / "late.sql").write_text(_views_sql(LATE_VIEWS, full=frozenset({"late_mails"})))
            views.update(LATE_VIEWS)
        lines, users = _records(rnd, epoch)
        if epoch == 1:
            # dead letters: a key and a field that do not fit their types; the reason names the field
            lines += [json.dumps({"line-id": "x1"}), json.dumps({"line-id": 99, "user-id": 1, "qty(n)": "many"})]
        append_records(data / "lines", lines)
        append_records(data / "users", users)
        runtime = h.runtime(spark)
        run_epoch(runtime)
        if epoch == 2:
            reports = BackfillRunner(h.runtime(spark)).advance(budget_s=600)
            assert set(LATE_VIEWS) <= {r.view for r in reports}
            runtime = h.runtime(spark)
            assert {runtime.controller.status()["backfills"][v]["phase"] for v in LATE_VIEWS} == {"done"}
        oracle = Oracle(runtime)
        for name, query in views.items():
            oracle.assert_view(name, query)
        runtime.compact(runtime.controller.epoch_log.committed_epoch(), every=1)

    # `epochal query` (DuckDB over the committed cut) reads the dead letters and the odd names
    _, dead, _ = run_query(runtime, f"SELECT reason FROM {dead_letter_table('lines')}")
    assert len(dead) == 2 and any("field 'qty(n)'" in reason for (reason,) in dead), dead
    columns, rows, _ = run_query(runtime, 'SELECT "user-id", "total.eur" FROM per_user ORDER BY 1')
    assert columns == ["user-id", "total.eur"]
    assert rows == sorted((r["user-id"], r["total.eur"]) for r in runtime.state("per_user").collect())

    per_user = multiset(runtime.state("per_user").collect())
    linear = multiset(runtime.state("linear").collect())
    assert sink_rows(runtime, "per_user_duckdb") == per_user
    pg = 'SELECT "user-id", "line count", "total.eur", "max-qty" FROM "per user"'
    assert multiset(sql_rows(database, pg)) == per_user
    assert multiset(sql_rows(database, 'SELECT "line-id", "double price" FROM linear')) == linear

    def lake(rows: list[dict]) -> object:
        return multiset(tuple(r.values()) for r in rows)

    assert lake(DeltaTable(str(h.home / "lake" / "per_user")).to_pyarrow_table().to_pylist()) == per_user
    assert lake(DeltaTable(str(h.home / "lake" / "linear")).to_pyarrow_table().to_pylist()) == linear
    assert lake(iceberg_table(h.home, "app.per_user").scan().to_arrow().to_pylist()) == per_user


@pytest.mark.parametrize(
    ("declaration", "refused"),
    [
        ("CREATE SOURCE `my-source` (a BIGINT) WITH (connector = 'log', path = 'x')", "source name 'my-source'"),
        ("CREATE SOURCE s (`  ` BIGINT) WITH (connector = 'log', path = 'x')", "column name '  '"),
        ("CREATE SOURCE s (`a\tb` BIGINT) WITH (connector = 'log', path = 'x')", "no control character"),
        ("CREATE SOURCE s (`a-b` BIGINT, `A-B` INT) WITH (connector = 'log', path = 'x')", "declared twice"),
    ],
)
def test_a_table_name_stays_plain_and_a_column_name_needs_a_visible_character(
    tmp_path: Path, declaration: str, refused: str
) -> None:
    (tmp_path / "p.sql").write_text(declaration + ";\n")
    with pytest.raises(PipelineError, match=refused.replace("(", r"\(")):
        load_pipeline(tmp_path)
