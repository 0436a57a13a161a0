"""The incremental planner on its own (no Spark): which key each query is maintained by, which
leaves read which state, where it splits into stages, and what it refuses and suggests instead."""

from __future__ import annotations

import pytest
import sqlglot

from epochal.incremental.planner import LEAF_PREFIX, PARTIAL_RULE, Unmaintainable, plan_query
from epochal.pipeline.query import qualify_query

SCHEMA = {
    "bid": ["auction", "bidder", "price", "ts"],
    "auction": ["id", "seller", "category", "ts"],
    "person": ["id", "name", "state"],
}


def plan(query: str, schema: dict | None = None, internal: bool = False, min_max_cache: int = 16):
    schema = dict(schema or SCHEMA)
    tree = qualify_query(sqlglot.parse_one(query, read="spark"), schema)
    return plan_query("v", tree, schema, internal, min_max_cache)


@pytest.mark.parametrize(
    ("query", "classes", "leaf_keys"),
    [
        (
            "SELECT auction, count(*) AS n, count(price) AS c FROM bid GROUP BY auction",
            ("bid.auction",),
            [("auction",)],
        ),
        ("SELECT DISTINCT bidder FROM bid", ("bid.bidder",), [("bidder",)]),
        (
            "SELECT a.id, b.price FROM auction a LEFT JOIN bid b ON a.id = b.auction",
            ("a.id = b.auction",),
            [("id",), ("auction",)],
        ),
        (
            "SELECT x.bidder, y.bidder AS other FROM bid x JOIN bid y ON x.auction = y.auction AND x.bidder < y.bidder",
            ("x.auction = y.auction",),
            [("auction",), ("auction",)],
        ),
        (
            "SELECT auction, price FROM (SELECT auction, price, row_number() OVER (PARTITION BY auction "
            "ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 3",
            ("_0.auction",),
            [("auction",)],
        ),
        (
            "SELECT * FROM auction a WHERE NOT EXISTS (SELECT 1 FROM bid b WHERE b.auction = a.id)",
            ("a.id = b.auction",),
            [("id",), ("auction",)],
        ),
        (
            "SELECT w.start AS ws, count(*) AS n FROM (SELECT window(ts, '10 seconds', '5 seconds') AS w FROM bid) "
            "GROUP BY w.start",
            ("_0.w.start",),
            [("w.start",)],
        ),
        (
            "SELECT auction, bidder, count(*) AS n FROM bid GROUP BY auction, bidder",
            ("bid.auction", "bid.bidder"),
            [("auction", "bidder")],
        ),
    ],
)
def test_each_operator_is_keyed_by_what_it_partitions_by(query: str, classes: tuple, leaf_keys: list) -> None:
    planned = plan(query)
    assert planned.plan.kind == "keyed"
    assert planned.plan.key_classes == classes
    assert [leaf.key for leaf in planned.plan.leaves] == leaf_keys
    assert not planned.stages
    # the rewritten query reads the leaves, never an upstream table directly
    tables = {t.name for t in sqlglot.parse_one(planned.plan.query, read="spark").find_all(sqlglot.exp.Table)}
    assert tables == {leaf.name for leaf in planned.plan.leaves}
    assert all(name.startswith(LEAF_PREFIX) for name in tables)
    for leaf in planned.plan.leaves:
        assert leaf.name in planned.plan.query


def test_whole_table_leaves_are_read_restricted_at_storage() -> None:
    planned = plan("SELECT a.id, count(*) AS n FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.id")
    assert [(leaf.table, leaf.key) for leaf in planned.plan.leaves] == [("auction", ("id",)), ("bid", ("auction",))]
    derived = plan("SELECT k, count(*) AS n FROM (SELECT auction + 1 AS k FROM bid) GROUP BY k")
    assert derived.plan.leaves[0].table is None  # a computed key: restricted after the leaf is evaluated


def test_a_join_grouped_by_another_key_is_split_into_a_stage() -> None:
    planned = plan("SELECT a.category, count(*) AS n FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.category")
    (stage,) = planned.stages
    assert stage.name == "v__stage1"
    assert stage.columns == ("a__category",)
    assert stage.upstreams == ("auction", "bid")
    assert planned.plan.key_classes == ("_s1.a__category",)
    assert planned.plan.leaves[0].table == "v__stage1"
    staged = plan(stage.query, {**SCHEMA})
    assert staged.plan.key_classes == ("a.id = b.auction",)


def test_joins_on_two_keys_split_at_the_longest_prefix_one_key_partitions() -> None:
    planned = plan(
        "SELECT b.price, p.name FROM bid b JOIN auction a ON a.id = b.auction JOIN person p ON p.id = a.seller"
    )
    (stage,) = planned.stages
    assert set(stage.columns) == {"b__price", "a__seller"}
    assert planned.plan.key_classes == ("_s1.a__seller = p.id",)


def test_a_subquery_grouped_by_another_key_becomes_a_stage() -> None:
    planned = plan(
        "SELECT q.category, avg(q.top) AS a FROM (SELECT a.category, max(b.price) AS top FROM auction a "
        "JOIN bid b ON a.id = b.auction GROUP BY a.id, a.category) q GROUP BY q.category"
    )
    # the subquery is stage 1; the AVG over it keeps its partial state (SUM, COUNT) in stage 2
    assert [s.name for s in planned.stages] == ["v__stage1", "v__stage2"]
    assert planned.plan.kind == "linear" and "v__stage2" in planned.plan.query
    staged = plan(planned.stages[1].query, {**SCHEMA, "v__stage1": planned.stages[0].columns})
    assert staged.plan.key_classes == ("q.category",)
    assert staged.plan.rule == PARTIAL_RULE


def test_a_grouped_aggregate_keeps_its_partial_state_in_a_stage() -> None:
    planned = plan(
        "SELECT auction, count(*) AS n, sum(price) AS s, avg(price) AS a, max(price) AS hi, "
        "count(*) FILTER (WHERE price > 10) AS big FROM bid WHERE bidder > 0 GROUP BY auction HAVING count(*) > 1"
    )
    (stage,) = planned.stages
    assert stage.columns == ("auction", "p_rows", "p1_count", "p2_sum", "p3_max", "p4_count")
    # the view is a projection of the stage: AVG is SUM / COUNT of the same argument, HAVING a WHERE
    assert planned.plan.kind == "linear" and planned.plan.typed_like_query
    assert "(_p.p2_sum / _p.p1_count) AS a" in planned.plan.query
    assert planned.plan.query.endswith("FROM v__stage1 AS _p WHERE _p.p_rows > 1")
    assert "project the partial aggregate v__stage1" in planned.plan.describe()  # the UI's description
    staged = plan(stage.query, {**SCHEMA}, internal=True, min_max_cache=5)
    aggregate = staged.plan.aggregate
    assert staged.plan.rule == PARTIAL_RULE and aggregate is not None
    assert aggregate.groups == aggregate.key_groups == ("auction",)
    assert aggregate.rows == "p_rows"
    kinds = {c.name: (c.kind, bool(c.argument), bool(c.condition), c.nonnull, c.cache) for c in aggregate.columns}
    assert kinds == {
        "p_rows": ("count", False, False, "", ""),
        "p1_count": ("count", True, False, "", ""),
        "p2_sum": ("sum", True, False, "p1_count", ""),
        # MAX shares its argument's count with SUM, and keeps its 5 greatest values hidden
        "p3_max": ("max", True, False, "p1_count", "_epochal_kept_p3_max"),
        "p4_count": ("count", False, True, "", ""),
    }
    assert aggregate.hidden == ("_epochal_kept_p3_max",) and aggregate.min_max_cache == 5
    assert "the 5 least/greatest values per group are kept" in staged.plan.describe()
    # WHERE filters the rows the aggregate takes; FILTER is a column of them
    assert "WHERE bid.bidder > 0" in aggregate.rows_sql
    assert "COALESCE(bid.price > 10, FALSE)" in aggregate.rows_sql
    assert "partial aggregate" in staged.plan.describe()


def test_a_grouped_aggregate_already_in_partial_form_needs_no_stage() -> None:
    planned = plan(
        "SELECT auction, bidder, count(*) AS n, count(price) AS c, sum(price) AS s FROM bid GROUP BY auction, bidder"
    )
    assert not planned.stages
    assert planned.plan.rule == PARTIAL_RULE
    assert planned.plan.aggregate is not None and planned.plan.aggregate.groups == ("auction", "bidder")
    assert planned.plan.aggregate.hidden == ()


def test_a_min_or_max_keeps_its_values_in_a_stage_never_in_a_view_people_read() -> None:
    # in partial form but for the kept values of MIN: a view people read has no hidden columns,
    # so the state goes to a stage (which adds the count MIN's kept values are judged by)
    planned = plan("SELECT auction, bidder, count(*) AS n, min(price) AS lo FROM bid GROUP BY auction, bidder")
    (stage,) = planned.stages
    assert stage.columns == ("auction", "bidder", "p_rows", "p1_count", "p2_min")
    assert planned.plan.kind == "linear" and "_p.p2_min AS lo" in planned.plan.query
    staged = plan(stage.query, internal=True)
    assert staged.plan.rule == PARTIAL_RULE and not staged.stages
    assert staged.plan.aggregate.hidden == ("_epochal_kept_p2_min",)
    assert staged.plan.aggregate.min_max_cache == 16  # DEFAULT_MIN_MAX_CACHE
    # a stage whose MIN has no count of its argument beside it is split once more
    assert plan("SELECT auction, count(*) AS n, min(price) AS lo FROM bid GROUP BY auction", internal=True).stages


@pytest.mark.parametrize(
    "query",
    [
        "SELECT auction, count(DISTINCT bidder) AS n FROM bid GROUP BY auction",  # not invertible by parts
        "SELECT auction, count(*) AS n FROM bid WHERE auction IN (SELECT id FROM auction) GROUP BY auction",
        "SELECT auction, count(*) AS n, first(price) AS p FROM bid GROUP BY auction",
    ],
)
def test_other_grouped_aggregates_recompute_the_touched_groups(query: str) -> None:
    planned = plan(query)
    assert not planned.stages
    assert planned.plan.rule == "recompute" and planned.plan.aggregate is None


def test_ctes_are_planned_as_the_subqueries_they_stand_for() -> None:
    planned = plan(
        "WITH m AS (SELECT auction, max(price) AS mp FROM bid GROUP BY auction) "
        "SELECT b.auction, b.bidder FROM bid b JOIN m ON m.auction = b.auction AND b.price = m.mp"
    )
    assert planned.plan.key_classes == ("b.auction = m.auction",)
    assert not planned.stages


@pytest.mark.parametrize(
    "query",
    [
        "SELECT auction, price * 2 AS p FROM bid WHERE price > 10",
        "SELECT auction FROM bid UNION ALL SELECT id AS auction FROM auction",
    ],
)
def test_queries_without_state_are_linear(query: str) -> None:
    assert plan(query).plan.kind == "linear"


def test_aggregates_over_all_rows_are_one_partition() -> None:
    planned = plan("SELECT count(*) AS n FROM bid")
    assert planned.plan.kind == "keyed" and planned.plan.key_classes == ()
    assert "one partition" in planned.plan.describe()
    # one group that is always there: COUNT(*) alone keeps a row per input row to count
    assert planned.plan.rule == PARTIAL_RULE and planned.plan.aggregate.groups == ()
    assert "AS _epochal_a_row" in planned.plan.aggregate.rows_sql
    # a COUNT(DISTINCT) over all rows recomputes the whole input when it changes
    assert plan("SELECT count(DISTINCT bidder) AS n FROM bid").plan.rule == "recompute"


@pytest.mark.parametrize(
    ("query", "construct", "rewrite"),
    [
        ("SELECT b.auction FROM bid b CROSS JOIN auction a", "CROSS JOIN", "ON an equality"),
        ("SELECT * FROM auction WHERE id NOT IN (SELECT auction FROM bid)", "NOT IN", "NOT EXISTS"),
        ("SELECT * FROM auction a WHERE EXISTS (SELECT 1 FROM bid b WHERE b.price > 5)", "EXISTS", "correlate"),
        ("SELECT auction, (SELECT max(price) FROM bid) AS top FROM bid", "subquery inside an expression", "FROM"),
    ],
)
def test_unmaintainable_queries_name_the_construct_and_a_rewrite(query: str, construct: str, rewrite: str) -> None:
    with pytest.raises(Unmaintainable) as refused:
        plan(query)
    assert construct in refused.value.construct
    assert rewrite in refused.value.message
    assert refused.value.message.endswith("(cost grows with the table)")


def test_the_plan_says_which_operator_reads_which_state() -> None:
    text = plan(
        "SELECT a.id, count(*) AS n FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.id"
    ).plan.describe()
    assert text.splitlines()[0] == "keyed by (a.id = b.auction)"
    assert "GROUP BY a.id with count" in text
    assert "state read: auction at id in the affected keys" in text
    assert "state read: bid at auction in the affected keys" in text
