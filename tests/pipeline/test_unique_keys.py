"""Which keys of a view are provably unique (an upsert sink's key must contain one), without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.errors import PipelineError
from epochal.pipeline.keys import unique_keys
from epochal.pipeline.loader import load_pipeline

SCHEMA = {
    "orders": ["id", "customer", "amount", "ts"],
    "bid": ["auction", "bidder", "price", "date_time"],
    "auction": ["id", "seller", "category"],
}
PRIMARY_KEYS = {"orders": [("id",)], "auction": [("id",)]}


def keys(query: str) -> set[tuple[str, ...]]:
    proven = unique_keys(query, SCHEMA, lambda t: [frozenset(k) for k in PRIMARY_KEYS.get(t, [])])
    return {tuple(sorted(k)) for k in proven}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # a source's key survives filters and projections, renamed with its column
        ("SELECT id, customer, amount FROM orders WHERE amount >= 10", {("id",)}),
        ("SELECT id AS order_id, amount FROM orders", {("order_id",)}),
        ("SELECT * FROM orders", {("id",)}),
        ("SELECT id + 1 AS x FROM orders", set()),  # an expression of the key proves nothing
        ("SELECT customer, amount FROM orders", set()),
        # grouping, by name, alias, ordinal or expression
        ("SELECT customer, count(*) AS n FROM orders GROUP BY customer", {("customer",)}),
        ("SELECT customer AS c, count(*) AS n FROM orders GROUP BY 1", {("c",)}),
        ("SELECT upper(customer) AS c, count(*) FROM orders GROUP BY upper(customer)", {("c",)}),
        ("SELECT auction, bidder, max(price) AS p FROM bid GROUP BY auction, bidder", {("auction", "bidder")}),
        ("SELECT count(*) AS n FROM bid GROUP BY auction", set()),  # the group is not in the output
        ("SELECT customer, count(*) FROM orders GROUP BY customer HAVING count(*) > 1", {("customer",)}),
        ("SELECT customer, ts, count(*) FROM orders WHERE ts = '2020-01-01' GROUP BY customer, ts", {("customer",)}),
        ("SELECT count(*), max(amount) FROM orders", {()}),  # one row
        ("SELECT DISTINCT customer, amount FROM orders", {("amount", "customer")}),
        # CTEs and subqueries
        (
            "WITH t AS (SELECT customer, sum(amount) AS s FROM orders GROUP BY customer) "
            "SELECT customer, s FROM t WHERE s > 10",
            {("customer",)},
        ),
        # top-N per group: (group, rank) is a key; rank = 1 leaves the group
        (
            "SELECT customer, id, amount FROM (SELECT customer, id, amount, row_number() OVER "
            "(PARTITION BY customer ORDER BY amount DESC, id) AS rn FROM orders) WHERE rn = 1",
            {("customer",), ("id",)},
        ),
        (
            "SELECT auction, bidder, price FROM (SELECT auction, bidder, price, row_number() OVER "
            "(PARTITION BY auction ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 3",
            set(),
        ),
        # joins: a side keeps its keys when it meets at most one row of the other
        ("SELECT b.auction, b.price, a.seller FROM bid b JOIN auction a ON b.auction = a.id", set()),
        ("SELECT o.id, o.amount, a.seller FROM orders o JOIN auction a ON o.customer = a.id", {("id",)}),
        ("SELECT o.id, a.seller FROM orders o LEFT JOIN auction a ON o.customer = a.id", {("id",)}),
        ("SELECT o.id, a.id AS aid FROM orders o JOIN auction a ON o.id = a.id", {("aid",), ("id",)}),
        ("SELECT o.id, a.seller FROM orders o JOIN bid a ON o.id = a.auction", set()),  # many bids per order
        # set operations
        ("SELECT customer FROM orders UNION SELECT seller FROM auction", {("customer",)}),
        ("SELECT id FROM orders UNION ALL SELECT id FROM auction", set()),
    ],
)
def test_proven_keys(query: str, expected: set[tuple[str, ...]]) -> None:
    assert keys(query) == expected


def _load(tmp_path: Path, sql: str):  # noqa: ANN202
    (tmp_path / "p.sql").write_text(sql)
    return load_pipeline(tmp_path)


ORDERS = """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE)
WITH (connector = 'log', path = 'data/orders', format = 'json');
"""


def test_an_upsert_sink_on_a_key_the_view_may_repeat_is_refused_with_the_keys_it_has(tmp_path: Path) -> None:
    sql = ORDERS + """
CREATE MATERIALIZED VIEW spend AS SELECT customer, amount > 10 AS big, count(*) AS n FROM orders GROUP BY 1, 2;
CREATE SINK s FROM spend WITH (connector = 'duckdb', database = 'o.duckdb', table = 't', type = 'upsert',
                                primary_key = 'customer');
"""
    with pytest.raises(PipelineError) as raised:
        _load(tmp_path, sql)
    (issue,) = raised.value.issues
    assert issue.line == 5  # the primary_key option's line
    assert "primary_key (customer) is not a unique key of spend" in issue.message
    assert "The keys Epochal can prove for spend are (big, customer)" in issue.message
    assert "type = 'append-only'" in issue.message


def test_an_upsert_sink_on_a_proven_key_loads(tmp_path: Path) -> None:
    sql = ORDERS + """
CREATE MATERIALIZED VIEW large AS SELECT id, customer, amount FROM orders WHERE amount >= 10;
CREATE MATERIALIZED VIEW spend AS SELECT customer, sum(amount) AS total FROM large GROUP BY customer;
CREATE SINK by_id FROM large WITH (connector = 'duckdb', database = 'o.duckdb', table = 'a', type = 'upsert',
                                   primary_key = 'id');
CREATE SINK by_customer FROM spend WITH (connector = 'duckdb', database = 'o.duckdb', table = 'b',
                                         type = 'upsert', primary_key = 'customer, total');
"""
    assert set(_load(tmp_path, sql).sinks) == {"by_id", "by_customer"}


def test_an_error_in_an_unrelated_view_reports_only_that_error(tmp_path: Path) -> None:
    # A typo in another view used to add a false "Epochal can prove no key" for this sink.
    sql = ORDERS + """
CREATE MATERIALIZED VIEW customer_totals AS SELECT customer, sum(amount) AS total FROM orders GROUP BY customer;
CREATE MATERIALIZED VIEW typo AS SELECT id, amout FROM orders;
CREATE SINK s FROM customer_totals WITH (connector = 'duckdb', database = 'o.duckdb', table = 't',
                                         type = 'upsert', primary_key = 'customer');
"""
    with pytest.raises(PipelineError) as raised:
        _load(tmp_path, sql)
    (issue,) = raised.value.issues
    assert "unknown column 'amout'" in issue.message


def test_an_upsert_sink_on_a_failed_view_waits_on_it_instead_of_a_false_key_error(tmp_path: Path) -> None:
    sql = ORDERS + """
CREATE MATERIALIZED VIEW customer_totals AS SELECT customer, sum(amout) AS total FROM orders GROUP BY customer;
CREATE MATERIALIZED VIEW big AS SELECT customer, total FROM customer_totals WHERE total > 10;
CREATE SINK s FROM big WITH (connector = 'duckdb', database = 'o.duckdb', table = 't',
                             type = 'upsert', primary_key = 'customer');
"""
    with pytest.raises(PipelineError) as raised:
        _load(tmp_path, sql)
    messages = [issue.message for issue in raised.value.issues]
    assert len(messages) == 2 and "unknown column 'amout'" in messages[0]
    assert messages[1].startswith("sink s: waits on view big, which did not load")
    assert not any("not a unique key" in m for m in messages)
