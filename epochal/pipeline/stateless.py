"""Which constructs of a view's query need state, and which no view may use.

Two answers, one detection pass:

* operators that keep state between epochs (GROUP BY, joins, DISTINCT, window functions,
  subqueries, LIMIT...) are allowed in views: ``WITH (refresh = 'full')`` views recompute, and
  incremental views are planned by :mod:`epochal.incremental.planner`, which refuses what it
  cannot maintain with a rewrite to suggest. ``Finding.needs_state`` marks them;
* non-deterministic functions are refused in every view, because replaying an epoch after a
  recovery must give the same rows.

``REFUSED`` is the one list of constructs detected and why each matters.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

NEEDS_STATE = "needs state"
NOT_REPEATABLE = "is non-deterministic, so replaying an epoch would not give the same rows"

#: Construct -> why a view may not use it yet.
REFUSED: dict[str, str] = {
    "GROUP BY": NEEDS_STATE,
    "aggregate": NEEDS_STATE,
    "JOIN": NEEDS_STATE,
    "DISTINCT": NEEDS_STATE,
    "UNION without ALL": NEEDS_STATE,
    "INTERSECT": NEEDS_STATE,
    "EXCEPT": NEEDS_STATE,
    "window function": NEEDS_STATE,
    "subquery": NEEDS_STATE,
    "ORDER BY": NEEDS_STATE,
    "LIMIT": NEEDS_STATE,
    "non-deterministic function": NOT_REPEATABLE,
}

# sqlglot knows many of these as exp.AggFunc subclasses, but not all, and not the same ones in
# every version: names make the check independent of that.
AGGREGATE_FUNCTIONS = frozenset(
    {
        "any", "any_value", "approx_count_distinct", "approx_percentile", "array_agg", "avg",
        "bit_and", "bit_or", "bit_xor", "bitmap_construct_agg", "bitmap_or_agg", "bool_and",
        "bool_or", "collect_list", "collect_set", "corr", "count", "count_if", "count_min_sketch",
        "covar_pop", "covar_samp", "every", "first", "first_value", "grouping", "grouping_id",
        "histogram_numeric", "hll_sketch_agg", "hll_union_agg", "kurtosis", "last", "last_value",
        "listagg", "max", "max_by", "mean", "median", "min", "min_by", "mode", "percentile",
        "percentile_approx", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2",
        "regr_slope", "regr_sxx", "regr_sxy", "regr_syy", "skewness", "some", "std", "stddev",
        "stddev_pop", "stddev_samp", "string_agg", "sum", "try_avg", "try_sum", "var_pop",
        "var_samp", "variance",
    }
)
WINDOW_FUNCTIONS = frozenset(
    {"cume_dist", "dense_rank", "lag", "lead", "nth_value", "ntile", "percent_rank", "rank", "row_number"}
)
NONDETERMINISTIC_FUNCTIONS = frozenset(
    {
        "current_date", "current_time", "current_timestamp", "curdate", "input_file_block_length",
        "input_file_block_start", "input_file_name", "java_method", "localtimestamp",
        "monotonically_increasing_id", "now", "rand", "randn", "random", "randstr", "reflect",
        "shuffle", "spark_partition_id", "try_reflect", "uniform", "unix_timestamp", "uuid",
    }
)
#: Aggregates whose value depends on the order rows arrive in, which Spark itself declares
#: non-deterministic: an epoch's recompute over the touched groups and a batch over all rows pick
#: different rows. As window functions over an ORDER BY they are deterministic and stay allowed.
ORDER_DEPENDENT_AGGREGATES = frozenset({"any_value", "first", "first_value", "last", "last_value"})
ORDER_DEPENDENT_FIX = (
    "pick the row by a value instead: min(x) or max(x), or max_by(x, <a column that orders the rows>) "
    "for the latest"
)

#: Aggregates that collect values in the order rows arrive (sqlglot's names: collect_list and
#: array_agg are array_agg, string_agg and listagg group_concat): the same rows in another order
#: give another array or string, so a touched group's recompute and a batch disagree.
COLLECTING_AGGREGATES = frozenset({"array_agg", "group_concat"})
#: Functions whose value does not depend on the order of an array's elements: a collecting
#: aggregate under one of them is deterministic (array_distinct keeps the order, so its caller decides).
ORDER_FREE_OF_ARRAY = frozenset({"array_sort", "array_size", "cardinality", "array_max", "array_min", "array_contains"})
ORDER_KEEPING_OF_ARRAY = frozenset({"array_distinct"})
UNORDERED_COLLECT_FIX = (
    "sort what it collects, array_sort(collect_list(x)), or give string_agg/listagg an order: "
    "listagg(x, ',') WITHIN GROUP (ORDER BY x)"
)
UNORDERED_WINDOW_FIX = (
    "order the window, ending with columns that identify a row: OVER (PARTITION BY k ORDER BY ts, id)"
)
UNORDERED_LIMIT_FIX = (
    "order the rows it keeps in the same SELECT, ending with columns that identify a row "
    "(ORDER BY price DESC, id LIMIT 10)"
)


@dataclass(frozen=True)
class Finding:
    construct: str
    #: how the message names it, e.g. "aggregate function count()"
    label: str
    node: exp.Expression
    #: keyword whose first occurrence in the query locates the finding when the node cannot
    anchor: str = ""
    #: which occurrence of ``anchor`` (0-based), when it is not the first
    occurrence: int = 0
    #: the rewrite to suggest, when there is a better one than removing the construct
    fix: str = ""

    @property
    def needs_state(self) -> bool:
        return REFUSED[self.construct] == NEEDS_STATE

    @property
    def message(self) -> str:
        fix = self.fix or "remove it, or compute the value before it reaches Epochal (in the producer of the source)"
        return f"{self.label} {REFUSED[self.construct]}: {fix}"


def _key(node: exp.Func) -> str:
    """Name to classify a function by: as written for functions sqlglot does not know, else
    sqlglot's name for it (aggregates sqlglot knows are also recognized by class)."""
    return node.name.lower() if isinstance(node, exp.Anonymous) else node.sql_name().lower()


def spark_name(node: exp.Func) -> str:
    """The function's Spark name for messages (``COLLECT_LIST(x)`` -> ``collect_list``).

    Generated only for refused functions: generating SQL for every node would be wasted work."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql(dialect="spark").split("(", 1)[0].strip().lower()


def refused_constructs(tree: exp.Expression) -> list[Finding]:
    """Every refused construct in ``tree``, one finding per label, in tree order."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for finding in _detect(tree):
        if finding.construct in REFUSED and finding.label not in seen:
            seen.add(finding.label)
            findings.append(finding)
    return findings


def _detect(tree: exp.Expression):
    for node in tree.walk():
        if isinstance(node, exp.Group):
            yield Finding("GROUP BY", "GROUP BY", node, "GROUP")
        elif isinstance(node, exp.Having) and not node.parent.args.get("group"):
            yield Finding("GROUP BY", "HAVING", node, "HAVING")  # with GROUP BY, that one is reported
        elif isinstance(node, exp.Pivot) and not node.args.get("unpivot"):
            yield Finding("aggregate", "PIVOT", node, "PIVOT")
        elif isinstance(node, exp.Join):
            # FROM a, b parses as a join without condition (kind CROSS in recent sqlglot)
            conditioned = any(node.args.get(arg) for arg in ("on", "using", "side", "method"))
            cross = not conditioned and (node.args.get("kind") or "CROSS").upper() == "CROSS"
            label = "a comma join (FROM a, b) or CROSS JOIN" if cross else "JOIN"
            yield Finding("JOIN", label, node)
        elif isinstance(node, exp.Distinct):
            yield Finding("DISTINCT", "DISTINCT", node, "DISTINCT")
        elif isinstance(node, exp.Union) and node.args.get("distinct"):
            yield Finding("UNION without ALL", "UNION without ALL", node, "UNION")
        elif isinstance(node, exp.Intersect):
            yield Finding("INTERSECT", "INTERSECT", node, "INTERSECT")
        elif isinstance(node, exp.Except):
            yield Finding("EXCEPT", "EXCEPT", node, "EXCEPT")
        elif isinstance(node, exp.Window):
            # a named WINDOW clause and an OVER (...) are both exp.Window
            inner = node.this
            what = f"{spark_name(inner)}() " if isinstance(inner, exp.Func) else ""
            yield Finding("window function", f"window function {what}OVER (...)", node, "OVER")
        elif isinstance(node, exp.Qualify):
            yield Finding("window function", "QUALIFY", node, "QUALIFY")
        elif isinstance(node, exp.Distribute):
            pass  # only repartitions the rows of each epoch's batch: harmless, stateless
        elif isinstance(node, (exp.Sort, exp.Cluster)):  # Spark's; subclasses of Order in sqlglot
            word = "SORT BY" if isinstance(node, exp.Sort) else "CLUSTER BY"
            yield Finding("ORDER BY", word, node, word.split()[0])
        elif isinstance(node, exp.Order) and not isinstance(node.parent, (exp.Window, exp.Func)):
            # ORDER BY inside OVER (...) or an aggregate is reported with its window/aggregate
            yield Finding("ORDER BY", "ORDER BY", node, "ORDER")
        elif isinstance(node, (exp.Limit, exp.Offset, exp.Fetch)):
            word = type(node).__name__.upper()
            if node.parent is not None and not node.parent.args.get("order"):
                # which rows it keeps is up to the order they arrive in (an epoch's recompute and a
                # batch over all rows keep others)
                label = f"{word} without ORDER BY"
                yield Finding("non-deterministic function", label, node, word, fix=UNORDERED_LIMIT_FIX)
            yield Finding("LIMIT", word, node, word)
        elif isinstance(node, exp.TableSample):
            yield Finding("non-deterministic function", "TABLESAMPLE", node, "TABLESAMPLE")
        elif isinstance(node, exp.Exists):
            yield _subquery(tree, node, "EXISTS (subquery)")
        elif isinstance(node, exp.In) and node.args.get("query") is not None:
            yield _subquery(tree, node, "IN (subquery)")
        elif isinstance(node, (exp.Any, exp.All)):
            if isinstance(node.this, (exp.Subquery, exp.Query)):
                yield _subquery(tree, node, "ANY/SOME/ALL (subquery)")
            else:  # any(col) is the aggregate
                yield Finding("aggregate", "aggregate function any()", node, "ANY")
        elif isinstance(node, exp.Subquery) and _is_expression_subquery(node):
            yield _subquery(tree, node, "a subquery inside an expression")
        elif isinstance(node, exp.Func):
            yield from _function(node)


def _subquery(tree: exp.Expression, node: exp.Expression, label: str) -> Finding:
    # Located at the subquery's own SELECT: Select nodes in depth-first order are in text order.
    inner = node.find(exp.Select)
    selects = list(tree.find_all(exp.Select, bfs=False))
    occurrence = next((i for i, s in enumerate(selects) if s is inner), 0)
    return Finding("subquery", label, node, "SELECT", occurrence)


def _is_expression_subquery(node: exp.Subquery) -> bool:
    """True for a scalar subquery, False for a derived table in FROM or a UNION branch."""
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    in_from = (exp.From, exp.Join, exp.Lateral, exp.SetOperation, exp.Subquery, exp.CTE)
    if parent is None or isinstance(parent, in_from):
        return False
    # IN/EXISTS/ANY are reported on their own node
    return not isinstance(parent, (exp.In, exp.Exists, exp.Any, exp.All))


#: What may stand between a function and its OVER: ``f(x) IGNORE NULLS OVER (...)``,
#: ``f(x) FILTER (WHERE ...) OVER (...)``.
CALL_WRAPPERS = (exp.Filter, exp.IgnoreNulls, exp.RespectNulls, exp.WithinGroup)


def _call_and_caller(node: exp.Expression) -> tuple[exp.Expression, exp.Expression | None]:
    """``node`` with the wrappers it stands under (``CALL_WRAPPERS``), and what reads that."""
    parent = node.parent
    while isinstance(parent, CALL_WRAPPERS) and parent.this is node:
        node, parent = parent, parent.parent
    return node, parent


def is_window_call(node: exp.Expression) -> bool:
    """``node`` is what a window computes (``sum(x)`` of ``sum(x) OVER (...)``), possibly under
    IGNORE/RESPECT NULLS or FILTER, so not an aggregate of its SELECT."""
    call, caller = _call_and_caller(node)
    return isinstance(caller, exp.Window) and caller.this is call


def _collecting_label(node: exp.Func) -> str:
    # sqlglot reads collect_list and array_agg as one function, string_agg and listagg as another
    return "collect_list()/array_agg()" if _key(node) == "array_agg" else "string_agg()/listagg()"


def _function(node: exp.Func):
    key = _key(node)
    if is_window_call(node):
        # reported as the window function, unless its value is up to the order rows arrive in: a
        # window without ORDER BY gives every row the whole partition, in no order
        order_dependent = key in ORDER_DEPENDENT_AGGREGATES or key == "nth_value"
        _, window = _call_and_caller(node)
        collecting = key in COLLECTING_AGGREGATES and not _collected_in_order(node, window)
        if (order_dependent or collecting) and not _window_ordered(window):
            name = _collecting_label(node) if key in COLLECTING_AGGREGATES else f"{spark_name(node)}()"
            label = f"window function {name} OVER (...) without ORDER BY"
            yield Finding("non-deterministic function", label, node, "OVER", fix=UNORDERED_WINDOW_FIX)
        return
    if key in ORDER_DEPENDENT_AGGREGATES:
        name = spark_name(node)
        label = f"aggregate function {name}()"
        yield Finding("non-deterministic function", label, node, name.upper(), fix=ORDER_DEPENDENT_FIX)
    elif key in COLLECTING_AGGREGATES and not _collected_in_order(node):
        label = f"aggregate function {_collecting_label(node)} without an order"
        yield Finding("non-deterministic function", label, node, spark_name(node).upper(), fix=UNORDERED_COLLECT_FIX)
    elif key in WINDOW_FUNCTIONS:
        name = spark_name(node)
        yield Finding("window function", f"window function {name}()", node, name.upper())
    elif key in AGGREGATE_FUNCTIONS or isinstance(node, exp.AggFunc):
        name = spark_name(node)
        yield Finding("aggregate", f"aggregate function {name}()", node, name.upper())
    elif key in NONDETERMINISTIC_FUNCTIONS:
        if key == "unix_timestamp" and node.expressions:
            return  # unix_timestamp(col) converts its argument: deterministic
        name = spark_name(node)
        if isinstance(node.parent, exp.Func) and spark_name(node.parent) == "unix_timestamp":
            name = "unix_timestamp"  # sqlglot reads unix_timestamp() as unix_timestamp(current_timestamp())
        yield Finding("non-deterministic function", f"{name}()", node, name.upper())


def _window_ordered(window: exp.Window) -> bool:
    """Whether the window orders its rows, itself or through the named window it refers to
    (``OVER w ... WINDOW w AS (PARTITION BY g ORDER BY ts)``)."""
    if window.args.get("order"):
        return True
    name = window.args.get("alias")
    select = window.find_ancestor(exp.Select)
    named = select.args.get("windows") if select is not None and name is not None else None
    # (names match as Spark matches them, without case)
    return any(
        isinstance(w, exp.Window) and w.this is not window.this and w.name.lower() == name.name.lower()
        and _window_ordered(w)
        for w in named or []
    )


def _collected_in_order(node: exp.Func, call: exp.Expression | None = None) -> bool:
    """Whether a collecting aggregate's value is independent of the rows' order: it orders them
    itself (``listagg(x) WITHIN GROUP (ORDER BY x)``), or what reads it (``call``: the aggregate,
    or its window) ignores the order (``array_sort(collect_list(x))``, ``size(...)``)."""
    if isinstance(node.this, exp.Order):
        return True
    parent = (call or node).parent
    while isinstance(parent, (*CALL_WRAPPERS, exp.Paren)):
        parent = parent.parent
    while isinstance(parent, exp.Func) and _key(parent) in ORDER_KEEPING_OF_ARRAY:
        parent = parent.parent
    return isinstance(parent, exp.Func) and _key(parent) in ORDER_FREE_OF_ARRAY


def canonical_order(tree: exp.Expression) -> bool:
    """Give ``tree``'s order-free aggregates a canonical answer, in place; whether it changed.

    Any order is a correct answer of an unordered ``collect_list``/``array_agg``/``collect_set``,
    and any row among ties of ``max_by``/``min_by``; but an epoch's recompute of a group and a
    replay or a batch over all rows read the rows in other orders. So the collected values are
    sorted (``array_sort``, NULLs last; unless what reads them ignores the order already), and the
    ordering of ``max_by(x, y)`` becomes ``(y, x)``: among rows tied on ``y`` the greatest ``x``
    wins (the least for ``min_by``), a row whose ``y`` is NULL still counts for nothing.
    A window's ``collect_list`` without ORDER BY stays refused (its rows' frame has no order)."""
    changed = False
    for node in list(tree.find_all(exp.ArrayAgg, exp.ArrayUniqueAgg)):
        if is_window_call(node) or isinstance(node.this, exp.Order) or _collected_in_order(node):
            continue
        call, _ = _call_and_caller(node)
        sorted_call = exp.Anonymous(this="ARRAY_SORT", expressions=[call.copy()])
        call.replace(sorted_call)
        changed = True
    for node in list(tree.find_all(exp.ArgMax, exp.ArgMin)):
        value, ordering = node.this, node.expression
        if value is None or ordering is None or _canonical_ordering(ordering):
            continue
        tie_broken = exp.If(
            this=exp.Is(this=ordering.copy(), expression=exp.Null()),
            true=exp.Null(),
            false=exp.Struct(expressions=[ordering.copy(), value.copy()]),
        )
        tie_broken.meta[_TIE_BROKEN] = True
        node.set("expression", tie_broken)
        changed = True
    return changed


_TIE_BROKEN = "epochal_tie_broken"


def _canonical_ordering(ordering: exp.Expression) -> bool:
    # (a tree is rewritten once per load; the mark keeps a second pass from nesting it)
    return bool(ordering.meta.get(_TIE_BROKEN))
