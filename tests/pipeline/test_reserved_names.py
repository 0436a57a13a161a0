"""Columns named by SQL keywords (`select`, `from`, `order`, `group`, `user`, `end`, `where`): ordinary
in JSON records, they must survive every SQL text Epochal writes for them (a partial aggregate's
stage, a keyed recompute's key expressions, a join's, a top-N's). Each view runs three epochs with
upserts and deletes against the batch oracle, and an upsert sink keyed by one such column equals
its view."""

from __future__ import annotations

import json
import random
from pathlib import Path

from epochal.connectors.log import append_records
from epochal.sql import quote
from tests.consistency import Oracle, multiset, sink_rows
from tests.epochal_harness import make_harness, run_epoch

SOURCES = """
CREATE TABLE lines (line_id BIGINT, `user` BIGINT, `order` STRING, amount DOUBLE, `group` INT, `select` STRING,
                    PRIMARY KEY (line_id))
WITH (connector = 'log', path = 'data/lines', format = 'json');
CREATE SOURCE users (`user` BIGINT, `end` STRING, `from` STRING)
WITH (connector = 'log', path = 'data/users', format = 'json');
"""
VIEWS = {
    "per_user": "SELECT `user`, count(*) AS `limit`, sum(amount) AS `values` FROM lines GROUP BY `user`",
    "by_order": "SELECT `order`, `select`, max(`group`) AS `window` FROM lines GROUP BY `order`, `select`",
    "joined": "SELECT u.`end`, l.`order`, l.amount FROM lines l JOIN users u ON l.`user` = u.`user`",
    "ranked": "SELECT * FROM (SELECT `user`, line_id, row_number() OVER (PARTITION BY `user` "
    "ORDER BY amount DESC, line_id) AS `rank` FROM lines) WHERE `rank` <= 2",
    "filtered": "SELECT line_id, `from` FROM lines l JOIN users u USING (`user`) WHERE `from` IN ('x', 'y')",
    "distinct_from": "SELECT DISTINCT `from` AS `where` FROM users",
}
SINKS = """
CREATE SINK per_user_out FROM per_user
WITH (connector = 'duckdb', database = 'out/s.duckdb', table = 'per_user', type = 'upsert', primary_key = 'user');
"""


def test_columns_named_by_keywords_are_quoted_in_every_plan(spark, tmp_path: Path) -> None:
    assert quote("from", when_needed=True) == "`from`" and quote("amount", when_needed=True) == "amount"
    views = "".join(f"CREATE MATERIALIZED VIEW {name} AS {query};\n" for name, query in VIEWS.items())
    h = make_harness(tmp_path, {"sources.sql": SOURCES, "views.sql": views, "sinks.sql": SINKS})
    runtime = h.runtime(spark)
    rnd = random.Random(3)
    data = h.home / "data"
    for epoch in range(3):
        lines = []
        for _ in range(12):
            line_id = rnd.randint(1, 20)
            if rnd.random() < 0.2:
                lines.append(json.dumps({"line_id": line_id, "_op": "delete"}))
                continue
            lines.append(
                json.dumps(
                    {
                        "line_id": line_id,
                        "user": rnd.randint(1, 5),
                        "order": rnd.choice(["a", "b"]),
                        "amount": round(rnd.uniform(0, 40), 1),
                        "group": rnd.randint(1, 9),
                        "select": rnd.choice(["s", "t"]),
                    }
                )
            )
        append_records(data / "lines", lines)
        users = [json.dumps({"user": i, "end": f"U {i}", "from": rnd.choice("xyz")}) for i in (epoch + 1, epoch + 2)]
        append_records(data / "users", users)
        run_epoch(runtime)
        oracle = Oracle(runtime)
        for name, query in VIEWS.items():
            oracle.assert_view(name, query)
    assert sink_rows(runtime, "per_user_out") == multiset(runtime.state("per_user").collect())
