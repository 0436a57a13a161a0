"""sql_over: a query's table names read the frames a step built, with no temp view left behind and
nothing resolved later against a name that has since changed (what Spark Connect would do)."""

from __future__ import annotations

from epochal.incremental.binding import _template, sql_over


def test_references_become_placeholders_and_the_rest_of_the_text_is_kept() -> None:
    query = (
        "WITH recent AS (SELECT * FROM Orders WHERE ts > '{not a placeholder}') "
        "SELECT o.id, orders.qty FROM `orders` o JOIN recent ON recent.id = o.id, orders "
        "JOIN db.customers c ON c.id = o.cust JOIN customers ON true"
    )
    template, used = _template(query, ("customers", "orders", "recent"))
    assert used == (0, 1)
    # a CTE and a table in a database are not bound; a reference without an alias keeps its name
    # as its alias, so orders.qty still resolves; literal braces are doubled for str.format
    assert template == (
        "WITH recent AS (SELECT * FROM {__epochal_bound_1__} AS Orders WHERE ts > '{{not a placeholder}}') "
        "SELECT o.id, orders.qty FROM {__epochal_bound_1__} o JOIN recent ON recent.id = o.id, "
        "{__epochal_bound_1__} AS orders "
        "JOIN db.customers c ON c.id = o.cust JOIN {__epochal_bound_0__} AS customers ON true"
    )


def test_marker_one_is_not_read_as_part_of_marker_ten() -> None:
    names = tuple(f"t{i:02d}" for i in range(11))
    template, used = _template("SELECT * FROM t01 JOIN t10 ON true", names)
    assert used == (1, 10)
    assert "{__epochal_bound_1__} AS t01" in template and "{__epochal_bound_10__} AS t10" in template


def test_frames_stay_bound_to_the_query_that_read_them(spark) -> None:
    inserts = spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, item STRING")
    deletes = spark.createDataFrame([(3, "c")], "id BIGINT, item STRING")
    spark.range(5).createOrReplaceTempView("orders")  # a caller's own view under the same name
    try:
        query = "SELECT o.id, orders.item, '{x}' AS braces FROM orders o JOIN orders ON orders.id = o.id"
        plus = sql_over(spark, query, {"ORDERS": inserts})
        minus = sql_over(spark, query, {"orders": deletes})
        # each result reads its own frame, even after the name was bound to another one
        assert sorted(map(tuple, plus.collect())) == [(1, "a", "{x}"), (2, "b", "{x}")]
        assert [tuple(r) for r in minus.collect()] == [(3, "c", "{x}")]
        assert spark.table("orders").count() == 5
        # a query that reads none of the frames runs as written (its braces are not doubled)
        assert sql_over(spark, "SELECT '{y}' AS v", {"orders": inserts}).first().v == "{y}"
    finally:
        spark.catalog.dropTempView("orders")
    assert not [t for t in spark.catalog.listTables() if t.isTemporary and t.name.startswith("_pyspark")]
