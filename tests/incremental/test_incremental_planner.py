"""The incremental planner on its own (no Spark): which key each query is maintained by, which
leaves read which state, where it splits into stages, and what it refuses and suggests instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlglot

from epochal.errors import PipelineError
from epochal.incremental.plan import LEAF_PREFIX, PARTIAL_RULE, Plan, Unmaintainable
from epochal.incremental.planner import plan_query
from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.model import Pipeline
from epochal.pipeline.query_checks import DIALECT, qualify_query

SCHEMA = {
    "bid": ["auction", "bidder", "price", "ts"],
    "auction": ["id", "seller", "category", "ts"],
    "person": ["id", "name", "state"],
}


def plan(query: str, schema: dict | None = None, internal: bool = False, min_max_cache: int = 16):
    schema = dict(schema or SCHEMA)
    tree = qualify_query(sqlglot.parse_one(query, read=DIALECT), schema)
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
        # a constant grouping key (by ordinal or written out) reads no column: it partitions nothing
        (
            "SELECT 'all' AS segment, auction, sum(price) AS s FROM bid GROUP BY 1, auction",
            ("bid.auction",),
            [("auction",)],
        ),
        # a window function under IGNORE NULLS: the window's partition, not an aggregate of the level
        (
            "SELECT auction, first_value(bidder) IGNORE NULLS OVER (PARTITION BY auction ORDER BY price) AS fb, "
            "lag(bidder) IGNORE NULLS OVER (PARTITION BY auction ORDER BY price) AS pb FROM bid",
            ("bid.auction",),
            [("auction",)],
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
    tables = {t.name for t in sqlglot.parse_one(planned.plan.query, read=DIALECT).find_all(sqlglot.exp.Table)}
    assert tables == {leaf.name for leaf in planned.plan.leaves}
    assert all(name.startswith(LEAF_PREFIX) for name in tables)
    for leaf in planned.plan.leaves:
        assert leaf.name in planned.plan.query


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 'all' AS segment, count(*) AS n FROM bid GROUP BY 1",
        "SELECT 'all' AS segment, count(*) AS n FROM bid GROUP BY 'all'",
        "SELECT 'all' AS segment, 2 AS two, max(price) AS hi FROM bid GROUP BY 1, 2",
    ],
)
def test_constant_grouping_keys_are_one_partition(query: str) -> None:
    """A grouping key that reads no column puts every row in one group: planned like an aggregate
    over all rows (recomputed: a partial aggregate keeps no constant groups), not refused."""
    planned = plan(query)
    assert planned.plan.kind == "keyed"
    assert planned.plan.key_classes == ()
    assert planned.plan.rule == "recompute"


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


@pytest.mark.parametrize(
    "query",
    [
        "SELECT a.id, count(DISTINCT b.bidder) AS n FROM bid b FULL JOIN auction a ON b.auction = a.id GROUP BY a.id",
        "SELECT a.id, max(b.price) AS hi FROM bid b LEFT JOIN auction a ON b.auction = a.id GROUP BY a.id",
        "SELECT b.auction, count(a.id) AS n FROM bid b RIGHT JOIN auction a ON b.auction = a.id GROUP BY b.auction",
        "SELECT DISTINCT a.id FROM bid b LEFT JOIN auction a ON b.auction = a.id",
        "SELECT b.price, rank() OVER (PARTITION BY a.id ORDER BY b.price) AS r FROM bid b "
        "LEFT JOIN auction a ON b.auction = a.id",
    ],
)
def test_grouping_by_a_side_an_outer_join_pads_is_split_into_a_stage(query: str) -> None:
    """Where a key has no match the padded side's columns are NULL, not the key: the NULL group
    gathers the unmatched rows of every key, so the join is a stage and the grouping reads it."""
    planned = plan(query)
    join = planned.stages[0]
    assert plan(join.query).plan.key_classes == ("a.id = b.auction",)
    assert not {"bid", "auction"} & {
        t.name for s in planned.stages[1:] for t in sqlglot.parse_one(s.query).find_all(sqlglot.exp.Table)
    }, "what groups reads the join's stage, not the tables"


def test_grouping_by_the_side_an_outer_join_keeps_needs_no_stage() -> None:
    planned = plan(
        "SELECT b.auction, count(a.id) AS n FROM bid b LEFT JOIN auction a ON b.auction = a.id GROUP BY b.auction"
    )
    assert not planned.stages
    assert planned.plan.key_classes == ("a.id = b.auction",)


def test_set_operation_branches_partitioned_by_different_columns_become_stages() -> None:
    """Groups by auction beside a total over all rows share no key column: each stateful branch
    is a stage (named by the set operation's columns, which a branch may repeat), and the UNION ALL
    over them is linear."""
    planned = plan(
        "SELECT auction AS k, count(*) AS n FROM bid GROUP BY auction UNION ALL SELECT 'all', 'all' FROM bid"
        " UNION ALL SELECT -1, count(*) FROM person"
    )
    assert planned.plan.kind == "linear"
    assert [s.columns for s in planned.stages] == [("k", "n"), ("k", "n")]
    assert "COUNT(*) AS n FROM person" in planned.stages[1].query
    latest = plan("SELECT auction, price FROM bid WHERE auction IN (SELECT max(auction) FROM bid GROUP BY bidder)")
    assert latest.plan.kind == "keyed" and [s.columns for s in latest.stages] == [("_col_0",)]
    keyed = plan("SELECT count(*) AS n FROM bid GROUP BY auction UNION SELECT max(id) FROM person")
    assert keyed.plan.kind == "keyed" and keyed.plan.key_classes == ("n",) and len(keyed.stages) == 2


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


@pytest.mark.parametrize(
    ("query", "output_keys"),
    [
        ("SELECT count(DISTINCT bidder) AS n, auction AS a FROM bid GROUP BY auction", (1,)),
        # the key is not selected, or only transformed: the view's rows cannot be found by it
        ("SELECT count(DISTINCT bidder) AS n FROM bid GROUP BY auction", ()),
        ("SELECT auction + 1 AS a, count(DISTINCT bidder) AS n FROM bid GROUP BY auction", ()),
        # a LEFT JOIN pads the right side with NULL: only the preserved side's column finds a row
        (
            "SELECT a.id, b.auction, count(DISTINCT b.bidder) AS n FROM auction a LEFT JOIN bid b "
            "ON a.id = b.auction GROUP BY a.id, b.auction",
            (0,),
        ),
        # grouped by a padded side: the join is a stage, whose column (NULL included) is the key
        (
            "SELECT b.auction, count(DISTINCT b.bidder) AS n FROM auction a LEFT JOIN bid b "
            "ON a.id = b.auction GROUP BY b.auction",
            (0,),
        ),
        (
            "SELECT a.id, count(DISTINCT b.bidder) AS n FROM auction a FULL JOIN bid b "
            "ON a.id = b.auction GROUP BY a.id",
            (0,),
        ),
    ],
)
def test_a_recompute_finds_its_stored_rows_by_the_key_columns_it_selects(query: str, output_keys: tuple) -> None:
    planned = plan(query)
    assert planned.plan.rule == "recompute" and planned.plan.output_keys == output_keys


def test_an_aggregation_limited_or_ranked_by_another_key_keeps_its_groups_in_a_stage() -> None:
    planned = plan("SELECT auction, count(*) AS n FROM bid GROUP BY auction ORDER BY count(*) DESC, auction LIMIT 2")
    (stage,) = planned.stages
    # the groups, keyed by their grouping (kept as partial state), and every aggregate by a name
    assert stage.query == "SELECT bid.auction AS auction, COUNT(*) AS a1 FROM bid AS bid GROUP BY bid.auction"
    assert plan(stage.query, internal=True).plan.rule == PARTIAL_RULE
    # LIMIT over all the groups: one partition, recomputed from the stage; names kept (ORDER BY
    # count(*) reads the output column, as qualification writes it)
    assert planned.plan.key_classes == () and planned.plan.leaves[0].table == "v__stage1"
    assert planned.plan.query == (
        "SELECT _grouped.auction AS auction, _grouped.a1 AS n FROM __epochal_leaf_0 AS _grouped "
        "ORDER BY n DESC, auction LIMIT 2"
    )
    # an aggregate in a window, WHERE and HAVING below it, an aggregate only HAVING reads
    ranked = plan(
        "SELECT auction, max(price) AS hi, rank() OVER (ORDER BY max(price) DESC) AS rk FROM bid WHERE price > 0 "
        "GROUP BY auction HAVING count(*) > 1"
    )
    assert ranked.stages[0].query == (
        "SELECT bid.auction AS auction, MAX(bid.price) AS a1 FROM bid AS bid WHERE bid.price > 0 "
        "GROUP BY bid.auction HAVING COUNT(*) > 1"
    )
    assert "RANK() OVER (ORDER BY _grouped.a1 DESC) AS rk" in ranked.plan.query
    # a filter on the ranking reads it as a stage, which reads the groups' stage
    filtered = plan(
        "SELECT auction, rk FROM (SELECT auction, rank() OVER (ORDER BY count(*) DESC) AS rk FROM bid "
        "GROUP BY auction) WHERE rk <= 2"
    )
    (ranking,) = filtered.stages
    assert filtered.plan.kind == "linear" and "_grouped" in ranking.query
    # DISTINCT over the groups is keyed by what it deduplicates
    distinct = plan("SELECT DISTINCT count(*) AS n FROM bid GROUP BY auction")
    assert distinct.plan.key_classes == ("_grouped.a1",) and len(distinct.stages) == 1
    # a window partitioned by a grouping key needs no stage: the level has one key
    keyed = plan(
        "SELECT auction, bidder, count(*) AS n, rank() OVER (PARTITION BY auction ORDER BY count(*) DESC) AS rk "
        "FROM bid GROUP BY auction, bidder"
    )
    assert not keyed.stages and keyed.plan.key_classes == ("bid.auction",)


def test_a_column_a_lateral_view_generates_is_a_key_of_the_input_it_reads() -> None:
    planned = plan("SELECT x, count(*) AS n FROM bid LATERAL VIEW explode(array(bidder, price)) t AS x GROUP BY x")
    assert not planned.stages and planned.plan.rule == PARTIAL_RULE
    assert planned.plan.key_classes == ("bid.x",) and planned.plan.leaves[0].key == ("x",)
    assert planned.plan.leaves[0].sql == (
        "SELECT bid.auction AS auction, bid.bidder AS bidder, bid.price AS price, bid.ts AS ts, t.x AS x "
        "FROM bid AS bid LATERAL VIEW EXPLODE(ARRAY(bid.bidder, bid.price)) t AS x"
    )
    # a generated column named like an input column is renamed; OUTER and posexplode's two columns
    renamed = plan(
        "SELECT t.price, count(*) AS n FROM bid LATERAL VIEW OUTER posexplode(array(bidder, price)) t AS pos, price "
        "GROUP BY t.price"
    )
    assert renamed.plan.key_classes == ("bid.t__price",)
    assert "LATERAL VIEW OUTER POSEXPLODE" in renamed.plan.leaves[0].sql
    # a lateral view over one input of a join goes into that input; the join is a stage
    joined = plan(
        "SELECT a.category, x, count(*) AS n FROM bid b JOIN auction a ON a.id = b.auction "
        "LATERAL VIEW explode(array(b.bidder, b.price)) t AS x GROUP BY a.category, x"
    )
    assert joined.plan.key_classes == ("_s1.a__category", "_s1.b__x")
    # not keyed by a generated column: the lateral view stays, the input a whole table
    kept = plan(
        "SELECT bidder, count(x) AS n FROM bid LATERAL VIEW explode(array(bidder, price)) t AS x GROUP BY bidder"
    )
    assert kept.plan.leaves[0].table == "bid" and "LATERAL VIEW" in kept.plan.query


@pytest.mark.parametrize(
    ("query", "construct", "why", "rewrite"),
    [
        (
            "SELECT DISTINCT bidder FROM bid ORDER BY bidder LIMIT 5",
            "DISTINCT, LIMIT",
            "(DISTINCT by bid.bidder; LIMIT over all rows)",
            "compute DISTINCT in a subquery in FROM and apply LIMIT in the query that reads it",
        ),
        (
            "SELECT auction, price, row_number() OVER (PARTITION BY auction ORDER BY price) AS rn FROM bid "
            "ORDER BY price LIMIT 3",
            "ROW_NUMBER() OVER (...), LIMIT",
            "different keys",
            "compute ROW_NUMBER() OVER (...) in a subquery in FROM and apply LIMIT",
        ),
        # grouping sets are not split: the rewrite does it by hand
        (
            "SELECT auction, bidder, count(*) AS n FROM bid GROUP BY auction, ROLLUP(bidder) ORDER BY n DESC LIMIT 2",
            "GROUP BY, LIMIT",
            "(GROUP BY by bid.auction; LIMIT over all rows)",
            "compute GROUP BY in a subquery in FROM and apply LIMIT",
        ),
        (
            "SELECT col, count(*) AS n FROM bid LATERAL VIEW explode(array(bidder)) t GROUP BY col",
            "LATERAL VIEW",
            "its generated columns have no names",
            "t AS x",
        ),
        (
            "SELECT x, count(*) AS n FROM bid b JOIN auction a ON a.id = b.auction "
            "LATERAL VIEW explode(array(b.bidder, a.seller)) t AS x GROUP BY x",
            "LATERAL VIEW",
            "two joined inputs",
            "apply the LATERAL VIEW to that subquery",
        ),
        (
            "SELECT x, count(*) AS n FROM bid b LEFT JOIN auction a ON a.id = b.auction "
            "LATERAL VIEW explode(array(a.seller)) t AS x GROUP BY x",
            "LATERAL VIEW",
            "an outer join pads with NULLs",
            "then join the subquery",
        ),
    ],
)
def test_a_level_no_key_partitions_is_refused_naming_its_operators(
    query: str, construct: str, why: str, rewrite: str
) -> None:
    with pytest.raises(Unmaintainable) as refused:
        plan(query)
    assert refused.value.construct.startswith(construct), refused.value.construct
    assert why in refused.value.why and rewrite in refused.value.rewrite, refused.value.message
    assert "join key" not in refused.value.message  # (one input: there is no join)


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
        ("SELECT b.auction FROM bid b LEFT JOIN auction a ON b.price > a.reserve", "JOIN", "add an equality"),
        ("SELECT * FROM auction WHERE id NOT IN (SELECT auction FROM bid)", "NOT IN", "NOT EXISTS"),
        ("SELECT * FROM auction a WHERE EXISTS (SELECT 1 FROM bid b WHERE b.price > 5)", "EXISTS", "correlate"),
        ("SELECT auction, (SELECT price FROM bid WHERE auction = 1) AS top FROM bid", "subquery inside an expression",
         "FROM"),
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


def test_a_join_on_expressions_is_keyed_by_each_sides_expression() -> None:
    planned = plan("SELECT b.auction, a.id FROM bid b JOIN auction a ON lower(b.channel) = lower(a.extra)")
    assert planned.plan.rule == "delta join"
    assert sorted(leaf.key for leaf in planned.plan.leaves) == [("LOWER(channel)",), ("LOWER(extra)",)]
    # an expression over both inputs partitions neither: an inner join without a key (below)
    keyless = plan("SELECT b.auction FROM bid b JOIN auction a ON b.price + a.reserve = 10").plan
    assert keyless.rule == "delta join" and keyless.key_classes == ()
    # an outer one pads by what matched nowhere: refused, told to join on an equality or use CASE
    with pytest.raises(Unmaintainable, match="joining r equates no .* can be a CASE expression instead"):
        plan("SELECT b.auction, r.label FROM bid b LEFT JOIN (VALUES (0, 10, 'low')) AS r(lo, hi, label) "
             "ON b.price >= r.lo AND b.price < r.hi")


@pytest.mark.parametrize(
    "query",
    [
        "SELECT b.auction, a.id FROM bid b CROSS JOIN auction a",
        "SELECT b.auction, a.id FROM bid b, auction a WHERE b.price > a.reserve",
        "SELECT b.auction, r.label FROM bid b JOIN (VALUES (0, 10, 'low')) AS r(lo, hi, label) "
        "ON b.price >= r.lo AND b.price < r.hi",
        "SELECT b.auction, p.id FROM bid b JOIN auction a ON b.auction = a.id CROSS JOIN person p",
    ],
)
def test_inner_joins_without_a_key_follow_the_delta_rule_over_whole_inputs(query: str) -> None:
    """Issue 60 item 16: comma, CROSS and non-equi inner joins were refused; the delta rule
    maintains any inner join, Δ(A × B) = ΔA × B_old + A_new × ΔB, each term reading the other side whole."""
    planned = plan(query)
    assert (planned.plan.kind, planned.plan.rule, planned.plan.key_classes) == ("keyed", "delta join", ())
    assert all(leaf.key == () for leaf in planned.plan.leaves) and not planned.stages
    assert planned.plan.describe().startswith("no key: delta rule, each input's change joined with the other")
    # grouped: the join is a keyless stage, the grouping keyed by its own key over it
    grouped = plan(f"SELECT auction, count(*) AS n FROM ({query}) AS j GROUP BY auction")
    assert grouped.stages or grouped.plan.key_classes


# ---------------------------------------------------------------------------------------- Spark SQL as users write it

#: The sources of the corpus below: Nexmark's three tables, as any source declares them.
CORPUS_SOURCES = """
CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP,
                   extra STRING)
WITH (connector = 'log', path = 'data/bid', format = 'json');
CREATE SOURCE auction (id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT,
                       date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING)
WITH (connector = 'log', path = 'data/auction', format = 'json');
CREATE SOURCE person (id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING,
                      date_time TIMESTAMP, extra STRING)
WITH (connector = 'log', path = 'data/person', format = 'json');
"""

#: Queries written the way Spark users write them, each with the output columns Spark gives it:
#: Spark's documented windowing forms, IN lists, BETWEEN, CASE, CTEs, qualified and unqualified
#: names, GROUP BY ordinals, expressions, aliases and ALL, HAVING on aliases. Every one loads.
SPARK_FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    # windowed aggregation as Spark's documentation writes it: the window's struct is a column
    "tumble": ("SELECT window.start, window.end, count(*) AS cnt FROM bid GROUP BY window(date_time, '10 seconds')",
               ("start", "end", "cnt")),
    "tumble_key_after": ("SELECT auction, window.start AS ws, count(*) AS cnt FROM bid "
                         "GROUP BY auction, window(date_time, '10 seconds')", ("auction", "ws", "cnt")),
    "tumble_struct": ("SELECT window, count(*) AS cnt FROM bid GROUP BY window(date_time, '10 seconds')",
                      ("window", "cnt")),
    "tumble_call_selected": ("SELECT window(date_time, '10 seconds') AS w, max(price) AS hi FROM bid "
                             "GROUP BY window(date_time, '10 seconds')", ("w", "hi")),
    "hop": ("SELECT window.start AS ws, window.end AS we, auction, count(*) AS cnt FROM bid "
            "GROUP BY window(date_time, '10 seconds', '5 seconds'), auction", ("ws", "we", "auction", "cnt")),
    "hop_start_time": ("SELECT window.start AS ws, sum(price) AS total FROM bid "
                       "GROUP BY window(date_time, '1 minute', '20 seconds', '5 seconds')", ("ws", "total")),
    "window_having": ("SELECT window.start AS ws, count(*) AS cnt FROM bid WHERE price > 100 "
                      "GROUP BY window(date_time, '10 seconds') HAVING count(*) > 5", ("ws", "cnt")),
    "window_in_subquery": ("SELECT w.start AS ws, count(*) AS cnt FROM (SELECT window(date_time, '10 seconds') AS w "
                           "FROM bid) GROUP BY w", ("ws", "cnt")),
    "window_ordinal": ("SELECT window(date_time, '10 seconds') AS w, count(*) AS n FROM bid GROUP BY 1", ("w", "n")),
    "window_over_join": ("SELECT a.category, window.start AS ws, count(*) AS cnt FROM bid b JOIN auction a "
                         "ON b.auction = a.id GROUP BY a.category, window(b.date_time, '10 seconds')",
                         ("category", "ws", "cnt")),
    "window_of_two_inputs": ("SELECT window.start AS ws, count(*) AS n FROM bid b JOIN auction a ON b.auction = a.id "
                             "GROUP BY window(greatest(b.date_time, a.date_time), '10 seconds')", ("ws", "n")),
    "session": ("SELECT bidder, session_window.start AS ss, session_window.end AS se, count(*) AS cnt FROM bid "
                "GROUP BY bidder, session_window(date_time, '30 seconds')", ("bidder", "ss", "se", "cnt")),
    "session_alone": ("SELECT session_window.start AS ss, count(*) AS cnt FROM bid "
                      "GROUP BY session_window(date_time, '30 seconds')", ("ss", "cnt")),
    # Nexmark q5 as Spark users write it: a CTE per auction and hopping window, joined with its
    # per-window maximum
    "hot_items": ("WITH w AS (SELECT auction, window(date_time, '10 seconds', '2 seconds') AS win, count(*) AS num "
                  "FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) "
                  "SELECT w.auction, w.win.start AS starttime, w.num FROM w JOIN (SELECT win, max(num) AS maxn "
                  "FROM w GROUP BY win) m ON w.win = m.win AND w.num >= m.maxn", ("auction", "starttime", "num")),
    # IN lists, BETWEEN, CASE
    "in_list": ("SELECT name, city FROM person WHERE state IN ('or', 'id', 'ca')", ("name", "city")),
    "in_list_join": ("SELECT p.name, p.city, p.state, a.id FROM auction AS a INNER JOIN person AS p ON a.seller = p.id "
                     "WHERE a.category = 10 AND p.state IN ('or', 'id', 'ca')", ("name", "city", "state", "id")),
    "not_in_list_grouped": ("SELECT channel, count(*) AS n FROM bid WHERE channel NOT IN ('apple', 'google') "
                            "GROUP BY channel", ("channel", "n")),
    "in_list_under_or": ("SELECT auction, price FROM bid WHERE auction IN (1007, 1020) OR price > 1000000",
                         ("auction", "price")),
    "between": ("SELECT auction, price FROM bid WHERE price BETWEEN 100 AND 1000", ("auction", "price")),
    "between_in_join": ("SELECT b.auction, b.price FROM bid b JOIN auction a ON a.id = b.auction "
                        "WHERE b.date_time BETWEEN a.date_time AND a.expires", ("auction", "price")),
    "case": ("SELECT auction, CASE WHEN price > 1000 THEN 'high' WHEN price > 100 THEN 'mid' ELSE 'low' END AS band "
             "FROM bid", ("auction", "band")),
    "case_in_aggregate": ("SELECT auction, sum(CASE WHEN price > 1000 THEN 1 ELSE 0 END) AS high_bids, count(*) AS n "
                          "FROM bid GROUP BY auction", ("auction", "high_bids", "n")),
    "group_by_case": ("SELECT CASE WHEN price > 1000 THEN 'high' ELSE 'low' END AS band, count(*) AS n FROM bid "
                      "GROUP BY CASE WHEN price > 1000 THEN 'high' ELSE 'low' END", ("band", "n")),
    # CTEs; qualified, unqualified and quoted names
    "cte": ("WITH big AS (SELECT auction, price FROM bid WHERE price > 1000) SELECT auction, count(*) AS n FROM big "
            "GROUP BY auction", ("auction", "n")),
    "cte_chain": ("WITH b AS (SELECT auction, price FROM bid), m AS (SELECT auction, max(price) AS hi FROM b "
                  "GROUP BY auction) SELECT m.auction, m.hi, a.category FROM m JOIN auction a ON a.id = m.auction",
                  ("auction", "hi", "category")),
    "qualified_by_table": ("SELECT bid.auction, bid.price FROM bid WHERE bid.price > 10", ("auction", "price")),
    "qualified_by_alias": ("SELECT b.auction, count(*) AS n FROM bid AS b GROUP BY b.auction", ("auction", "n")),
    "unqualified_join": ("SELECT item_name, price FROM bid JOIN auction ON auction = id", ("item_name", "price")),
    "backquoted": ("SELECT `auction`, count(*) AS `n` FROM `bid` GROUP BY `auction`", ("auction", "n")),
    # GROUP BY ordinals, expressions, aliases and ALL; HAVING on aliases
    "group_by_ordinal": ("SELECT auction, count(*) AS n FROM bid GROUP BY 1", ("auction", "n")),
    "group_by_ordinals": ("SELECT auction, bidder, sum(price) AS total, count(*) AS n FROM bid GROUP BY 1, 2",
                          ("auction", "bidder", "total", "n")),
    "group_by_expression": ("SELECT date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS n FROM bid "
                            "GROUP BY date_format(date_time, 'yyyy-MM-dd')", ("day", "n")),
    "group_by_alias": ("SELECT date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS n FROM bid GROUP BY day",
                       ("day", "n")),
    "group_by_arithmetic": ("SELECT price DIV 1000 AS bucket, count(*) AS n FROM bid GROUP BY price DIV 1000",
                            ("bucket", "n")),
    "group_by_all": ("SELECT auction, bidder, count(*) AS n FROM bid GROUP BY ALL", ("auction", "bidder", "n")),
    "group_by_all_global": ("SELECT count(*) AS n, max(price) AS hi FROM bid GROUP BY ALL", ("n", "hi")),
    "having_alias": ("SELECT auction, count(*) AS n FROM bid GROUP BY auction HAVING n > 5", ("auction", "n")),
    "having_alias_avg": ("SELECT auction, avg(price) AS ap FROM bid GROUP BY auction HAVING ap > 100 AND count(*) > 1",
                         ("auction", "ap")),
    "rollup": ("SELECT auction, bidder, count(*) AS n FROM bid GROUP BY ROLLUP(auction, bidder)",
               ("auction", "bidder", "n")),
    "with_rollup": ("SELECT auction, bidder, count(*) AS n FROM bid GROUP BY auction, bidder WITH ROLLUP",
                    ("auction", "bidder", "n")),
    "grouping_sets": ("SELECT auction, bidder, count(*) AS n FROM bid GROUP BY GROUPING SETS ((auction), (bidder))",
                      ("auction", "bidder", "n")),
    "rollup_under_a_key": ("SELECT auction, bidder, count(*) AS n FROM bid GROUP BY auction, ROLLUP(bidder)",
                           ("auction", "bidder", "n")),
    # the rest of everyday Spark SQL
    "count_distinct": ("SELECT auction, count(DISTINCT bidder) AS bidders FROM bid GROUP BY auction",
                       ("auction", "bidders")),
    "order_by": ("SELECT auction, count(*) AS n FROM bid GROUP BY auction ORDER BY n DESC", ("auction", "n")),
    "top_n": ("SELECT auction, price FROM (SELECT auction, price, row_number() OVER (PARTITION BY auction "
              "ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 3", ("auction", "price")),
    "qualify": ("SELECT auction, price, bidder FROM bid QUALIFY row_number() OVER (PARTITION BY auction "
                "ORDER BY price DESC) = 1", ("auction", "price", "bidder")),
    "left_join_count": ("SELECT a.id, count(b.auction) AS bids FROM auction a LEFT JOIN bid b ON b.auction = a.id "
                        "GROUP BY a.id", ("id", "bids")),
    "exists": ("SELECT p.id, p.name FROM person p WHERE EXISTS (SELECT 1 FROM auction a WHERE a.seller = p.id)",
               ("id", "name")),
    "in_subquery": ("SELECT id, name FROM person WHERE id IN (SELECT seller FROM auction WHERE category = 10)",
                    ("id", "name")),
    "union": ("SELECT seller AS who FROM auction UNION SELECT bidder AS who FROM bid", ("who",)),
    "top_ten": ("SELECT auction, price FROM bid ORDER BY price DESC LIMIT 10", ("auction", "price")),
    # the top groups and a ranking of groups: the aggregation becomes a stage the rest reads
    "top_groups": ("SELECT auction, count(*) AS n FROM bid GROUP BY auction ORDER BY n DESC, auction LIMIT 3",
                   ("auction", "n")),
    "ranked_groups": ("SELECT auction, max(price) AS hi, dense_rank() OVER (ORDER BY max(price) DESC) AS rk "
                      "FROM bid GROUP BY auction", ("auction", "hi", "rk")),
    # window functions under IGNORE/RESPECT NULLS (were refused as aggregates without GROUP BY)
    "ignore_nulls": ("SELECT auction, first_value(bidder) IGNORE NULLS OVER (PARTITION BY auction ORDER BY date_time) "
                     "AS fb, lag(bidder) RESPECT NULLS OVER (PARTITION BY auction ORDER BY date_time) AS pb FROM bid",
                     ("auction", "fb", "pb")),
    # a constant grouping key: every row in one group, as without GROUP BY
    "one_segment": ("SELECT 'all' AS segment, count(*) AS n FROM bid GROUP BY 1", ("segment", "n")),
    # a generator's several named columns (was refused as a column without a name)
    "stacked": ("SELECT auction, stack(2, 'bidder', bidder, 'price', price) AS (k, v) FROM bid",
                ("auction", "k", "v")),
    # grouped by a column a LATERAL VIEW generates
    "exploded": ("SELECT x, count(*) AS n FROM bid LATERAL VIEW explode(array(channel, url)) t AS x GROUP BY x",
                 ("x", "n")),
}

#: Queries Spark accepts that no key partitions: refused, naming the construct and a rewrite.
REFUSED_FORMS: dict[str, tuple[str, str, str]] = {
    "outer_range_join": ("SELECT b.auction, a.id FROM bid b LEFT JOIN auction a ON b.price > a.reserve", "JOIN",
                         "add an equality"),
    "not_in_subquery": ("SELECT id FROM auction WHERE id NOT IN (SELECT auction FROM bid)", "NOT IN", "NOT EXISTS"),
    # (a subquery of one aggregate is a join now, test_scalar_subqueries_of_one_aggregate_become_joins;
    # a row's value, zero rows or several, is not)
    "scalar_subquery": ("SELECT auction, price FROM bid WHERE price > (SELECT reserve FROM auction WHERE id = 1)",
                        "subquery inside an expression", "ON x = s.m"),
    "correlated_scalar_subquery": ("SELECT a.id, (SELECT b.price FROM bid b WHERE b.auction = a.id AND b.price > 5) "
                                   "AS top FROM auction a", "correlated scalar subquery", "GROUP BY k) AS s ON s.k"),
    "in_subquery_under_or": ("SELECT id FROM person WHERE id IN (SELECT seller FROM auction) OR state = 'or'",
                             "IN/EXISTS (subquery)", "LEFT JOIN (SELECT DISTINCT cust FROM orders) m"),
    "uncorrelated_exists": ("SELECT id FROM person WHERE EXISTS (SELECT 1 FROM auction WHERE category = 10)",
                            "EXISTS", "correlate it"),
    "any_subquery": ("SELECT auction FROM bid WHERE price > ANY (SELECT reserve FROM auction)", "ANY/SOME/ALL",
                     "EXISTS"),
    # (its columns read as unknown before: "unknown column 'n': t has ")
    "lateral_subquery": ("SELECT p.id, t.n FROM person p, LATERAL (SELECT count(*) AS n FROM auction a "
                         "WHERE a.seller = p.id) t", "a LATERAL subquery", "grouped by the columns it correlates on"),
    # (a plain one is the EXISTS it equals: test_a_tuple_in_subquery_of_where_is_the_exists_it_equals)
    "tuple_in_subquery": ("SELECT id FROM person WHERE (id, city) IN (SELECT seller, max(item_name) FROM auction "
                          "GROUP BY seller)",
                          "IN (subquery)", "EXISTS (SELECT 1 FROM t WHERE t.x = a AND t.y = b)"),
    # (named "JOIN" before, which the query does not have)
    "two_semi_joins": ("SELECT p.id FROM person p WHERE EXISTS (SELECT 1 FROM auction a WHERE a.seller = p.id) "
                       "AND p.city IN (SELECT item_name FROM auction)", "IN/EXISTS (subquery)",
                       "apply one in a subquery in FROM"),
    "join_lateral": ("SELECT p.id, t.top FROM person p JOIN LATERAL (SELECT a.id AS top FROM auction a "
                     "WHERE a.seller = p.id ORDER BY a.reserve DESC LIMIT 1) t", "a LATERAL subquery", "LEFT JOIN ("),
}


def load_corpus(tmp_path: Path, views: dict[str, str]) -> Pipeline:
    (tmp_path / "sources.sql").write_text(CORPUS_SOURCES)
    (tmp_path / "views.sql").write_text("\n".join(f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in views.items()))
    return load_pipeline(tmp_path)


def plans_of(pipeline: Pipeline, view: str) -> list[Plan]:
    """The plans of ``view`` and of its internal stages."""
    return [v.plan for n, v in pipeline.views.items() if (n == view or v.internal_of == view) and v.plan is not None]


def test_every_spark_form_loads_with_the_columns_spark_gives_it(tmp_path: Path) -> None:
    pipeline = load_corpus(tmp_path, {name: query for name, (query, _) in SPARK_FORMS.items()})
    for name, (_, columns) in SPARK_FORMS.items():
        assert pipeline.views[name].columns == columns, name
        assert pipeline.views[name].plan is not None, name
        for plan in plans_of(pipeline, name):
            for leaf in plan.leaves:
                # a key restricts an input in a join condition: a value of one row, never a time
                # window (Spark refuses it there, and a hopping window is several values)
                assert not any(re.search(r"(?i)\b(session_)?window\s*\(", key) for key in leaf.key), (name, leaf)
                assert all(re.search(r"(?i)\b(count|sum|max|min|avg)\s*\(", key) is None for key in leaf.key)


def test_spark_forms_are_planned_by_the_keys_they_partition_by(tmp_path: Path) -> None:
    pipeline = load_corpus(tmp_path, {name: query for name, (query, _) in SPARK_FORMS.items()})

    def rules(view: str) -> list[str]:
        return [plan.rule if plan.kind == "keyed" else "linear" for plan in plans_of(pipeline, view)]

    # a grouped window is a column of the input, keyed and kept as partial state like any group
    tumble = pipeline.views["tumble__stage1"].plan
    assert tumble.rule == PARTIAL_RULE and tumble.key_classes == ("bid.window",)
    assert "WINDOW(bid.date_time, '10 seconds') AS `window`" in tumble.leaves[0].sql
    assert pipeline.views["tumble"].plan.query == (
        "SELECT _p.g0.start AS start, _p.g0.`end` AS `end`, _p.p_rows AS cnt FROM tumble__stage1 AS _p"
    )
    hop = pipeline.views["hop__stage1"].plan
    assert hop.key_classes == ("bid.auction", "bid.window") and hop.leaves[0].key == ("auction", "`window`")
    # the hopping CTE joined with its per-window maximum: every input is keyed by its window column
    hot = pipeline.views["hot_items"].plan
    assert hot.key_classes == ("m.win = w.win",) and [leaf.key for leaf in hot.leaves] == [("`window`",), ("`window`",)]
    # a window over a join is a column of the join's input; the join is a stage of its own
    assert rules("window_over_join") == ["delta join", PARTIAL_RULE, "linear"]
    assert rules("window_of_two_inputs") == ["delta join", PARTIAL_RULE, "linear"]
    # a session window's bounds depend on the other rows of its group: keyed by the group's other
    # columns, recomputed (never partial state); alone it is one partition
    assert pipeline.views["session"].plan.key_classes == ("bid.bidder",)
    assert rules("session") == ["recompute"]
    assert pipeline.views["session_alone"].plan.key_classes == ()
    # an IN list is a filter: the join it filters keeps the delta rule
    assert rules("in_list_join") == ["delta join"] and rules("in_list") == ["linear"]
    assert rules("in_list_under_or") == ["linear"] and rules("not_in_list_grouped") == [PARTIAL_RULE]
    # ordinals, aliases and ALL group by what they stand for
    for name in ("group_by_ordinal", "group_by_all"):
        assert rules(name) == [PARTIAL_RULE], name
    assert pipeline.views["group_by_all"].plan.key_classes == ("bid.auction", "bid.bidder")
    assert pipeline.views["group_by_alias"].plan.key_classes == pipeline.views["group_by_expression"].plan.key_classes
    # HAVING on an alias is a filter over the partial state
    assert pipeline.views["having_alias"].plan.query.endswith("WHERE _p.p_rows > 5")
    # grouping sets are partitioned by what every set groups by, else by nothing
    assert pipeline.views["rollup_under_a_key"].plan.key_classes == ("bid.auction",)
    for name in ("rollup", "with_rollup", "grouping_sets"):
        assert pipeline.views[name].plan.key_classes == (), name
    # the top groups read the groups' stage, one partition; the groups are partial state
    assert rules("top_groups") == [PARTIAL_RULE, "recompute"] and rules("ranked_groups")[-1] == "recompute"
    assert pipeline.views["top_groups"].plan.key_classes == ()
    assert pipeline.views["exploded"].plan.key_classes == ("bid.x",) and rules("exploded") == [PARTIAL_RULE]


@pytest.mark.parametrize("name", list(REFUSED_FORMS))
def test_spark_forms_no_key_partitions_are_refused_with_a_rewrite(tmp_path: Path, name: str) -> None:
    query, construct, rewrite = REFUSED_FORMS[name]
    with pytest.raises(PipelineError) as refused:
        load_corpus(tmp_path, {name: query})
    (issue,) = refused.value.issues
    assert issue.message.startswith(f"view {name}: ") and construct in issue.message, issue.message
    assert rewrite in issue.message and "WITH (refresh = 'full')" in issue.message, issue.message


def test_scalar_subqueries_of_one_aggregate_become_joins() -> None:
    """Issue 60 item 16: a scalar subquery was refused, correlated or not."""
    planned = plan("SELECT a.id, (SELECT count(*) FROM bid b WHERE b.auction = a.id) AS n FROM auction a").plan
    assert "SELECT a.id AS id, COALESCE(_scalar1._v, 0) AS n FROM __epochal_leaf_0 AS a LEFT JOIN (SELECT " \
        "b.auction AS _k0, COUNT(*) AS _v FROM __epochal_leaf_1 AS b GROUP BY b.auction) AS _scalar1 " \
        "ON _scalar1._k0 = a.id" in planned.query, planned.query
    planned = plan("SELECT a.id FROM auction a WHERE a.reserve > (SELECT avg(b.price) FROM bid b)").plan
    assert "CROSS JOIN __epochal_leaf_1 AS _scalar1 WHERE a.reserve > _scalar1._v" in planned.query, planned.query
    # a value that is no aggregate (zero rows or several), and a correlation that is no equality, keep theirs
    with pytest.raises(Unmaintainable, match="correlated scalar subquery"):
        plan("SELECT a.id, (SELECT b.price FROM bid b WHERE b.auction = a.id) AS p FROM auction a")
    with pytest.raises(Unmaintainable, match="correlated scalar subquery"):
        plan("SELECT a.id, (SELECT max(b.price) FROM bid b WHERE b.price > a.reserve) AS p FROM auction a")


def test_a_tuple_in_subquery_of_where_is_the_exists_it_equals() -> None:
    """Issue 60 item 16: (a, b) IN (SELECT x, y ...) was refused for returning two columns."""
    planned = plan("SELECT a.id FROM auction a WHERE a.reserve > 1 AND (a.id, a.reserve) IN "
                   "(SELECT DISTINCT b.auction, b.price FROM bid b WHERE b.price > 2)").plan
    assert "WHERE a.reserve > 1 AND EXISTS(SELECT 1 FROM __epochal_leaf_1 AS b WHERE b.price > 2 AND " \
        "b.auction = a.id AND b.price = a.reserve)" in planned.query, planned.query
    # negated (NULL and false differ there): keeps its refusal
    with pytest.raises(Unmaintainable, match="NOT IN"):
        plan("SELECT a.id FROM auction a WHERE (a.id, a.reserve) NOT IN (SELECT b.auction, b.price FROM bid b)")


def test_exists_under_or_becomes_a_left_join_with_its_distinct_keys() -> None:
    """Issue 60 item 16: an EXISTS that is not a top-level conjunct of WHERE was refused."""
    planned = plan(
        "SELECT a.id FROM auction a WHERE a.reserve > 1 OR NOT EXISTS "
        "(SELECT 1 FROM bid b WHERE b.auction = a.id AND b.price > 5)"
    ).plan
    assert planned.key_classes == ("_exists1._k0 = a.id",)
    assert "LEFT JOIN (SELECT DISTINCT b.auction AS _k0 FROM __epochal_leaf_1 AS b WHERE b.price > 5) AS _exists1 " \
        "ON _exists1._k0 = a.id WHERE a.reserve > 1 OR NOT (NOT _exists1._k0 IS NULL)" in planned.query
    # an EXISTS column of an ungrouped select list: the same left join, its match the column
    planned = plan("SELECT a.id, EXISTS (SELECT 1 FROM bid b WHERE b.auction = a.id) AS has_bids FROM auction a").plan
    assert "SELECT a.id AS id, (NOT _exists1._k0 IS NULL) AS has_bids FROM __epochal_leaf_0 AS a LEFT JOIN " \
        "(SELECT DISTINCT b.auction AS _k0 FROM __epochal_leaf_1 AS b) AS _exists1 ON _exists1._k0 = a.id" \
        in planned.query, planned.query
    # a correlation that is no equality, and IN under OR, keep their refusals
    with pytest.raises(Unmaintainable, match="IN/EXISTS"):
        plan("SELECT a.id FROM auction a WHERE a.reserve > 1 OR EXISTS (SELECT 1 FROM bid b WHERE b.price > a.reserve)")
    with pytest.raises(Unmaintainable, match="IN/EXISTS"):
        plan("SELECT a.id FROM auction a WHERE a.reserve > 1 OR a.id IN (SELECT auction FROM bid)")
