"""What the incremental planner decides for a view: its leaves, key, rule and internal stages
(:class:`Plan`), and a partial aggregate's state (:class:`PartialAggregate`). Plain data: the
planner builds it (planner.py), the executors run it (keyed.py, partial.py)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

#: Temp views the rewritten query reads instead of its leaves (one per leaf, per run).
LEAF_PREFIX = "__epochal_leaf_"
#: How many of its least (MIN) or greatest (MAX) values a partial aggregate keeps per group when
#: the view says nothing (``WITH (min_max_cache = n)``). A group's input is reread only when a
#: change deletes all of them and inserts nothing better: with k values kept and deletes spread
#: over a group's rows, that is k deletes of the group's extremes between two refills.
DEFAULT_MIN_MAX_CACHE = 16
#: Hidden column of a partial aggregate's table holding a MIN/MAX column's kept values.
MIN_MAX_CACHE_PREFIX = "_epochal_kept_"


class Unmaintainable(Exception):
    """The planner cannot maintain this query incrementally."""

    def __init__(self, construct: str, why: str, rewrite: str = "", node: exp.Expression | None = None):
        self.construct = construct
        self.why = why
        self.rewrite = rewrite
        self.node = node
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"{self.construct} cannot be maintained incrementally: {self.why}"
        if self.rewrite:
            text += f"; {self.rewrite}"
        return text + ", or add WITH (refresh = 'full') to recompute the view every epoch (cost grows with the table)"


@dataclass(frozen=True)
class Leaf:
    """A linear relation of the query's upstream tables, restricted to the affected keys."""

    #: temp view the rewritten query reads in the leaf's place
    name: str
    #: SELECT over upstream tables that produces the leaf's rows
    sql: str
    upstreams: tuple[str, ...]
    #: one SQL expression over the leaf's output columns per key class
    key: tuple[str, ...]
    #: the upstream table, when the leaf is the whole table and every key expression is one of its
    #: columns: then the restriction is applied where the state is read (vnode pruning)
    table: str | None = None


#: The rule of a grouped aggregate whose output is its own partial state (see :class:`PartialAggregate`).
PARTIAL_RULE = "partial aggregate"


@dataclass(frozen=True)
class PartialColumn:
    """One aggregate column of a partial-aggregate table, and how an epoch's change updates it."""

    name: str
    #: 'count' and exact 'sum' add the change's weighted values; 'min' and 'max' update their kept
    #: values (:attr:`cache`); a 'sum' over floating point (decided by type at run time) adds
    #: inserts and recomputes a group from its input when a value is retracted (rounding)
    kind: str
    #: column of :attr:`PartialAggregate.rows_sql` holding the argument; '' for COUNT(*)
    argument: str = ""
    #: column of rows_sql holding the FILTER (WHERE ...) condition; '' when there is none
    condition: str = ""
    #: sum, min, max: the count column of the same argument and filter (the values the aggregate
    #: takes): a sum is NULL when it is 0, and a MIN/MAX whose kept values are all of them is exact
    nonnull: str = ""
    #: min, max: the hidden column holding the group's least (MIN) or greatest (MAX) values, best
    #: first, at most :attr:`PartialAggregate.min_max_cache` of them: always the best values of the
    #: group (a prefix of them in order), all of them when there are that few. Deletes remove from
    #: it, inserts better than its last value enter it; only when it empties while the group still
    #: has values is the group reread from its input (RisingWave's MinMax state cache).
    cache: str = ""


@dataclass(frozen=True)
class PartialAggregate:
    """A GROUP BY whose output columns are the group keys plus COUNT/SUM/MIN/MAX: it is its own
    state. An epoch adds the change, aggregated by group, to the stored rows of the groups it
    touches; the input is read only for groups whose kept MIN/MAX values all went. This is
    RisingWave's HashAgg with its intermediate state table (and its MIN/MAX cache), and DBSP's
    linear aggregate."""

    #: SELECT over the leaf: the group columns, then the arguments (_epochal_a*) and FILTER conditions (_epochal_f*)
    rows_sql: str
    #: group columns of the table, in order (its distribution key)
    groups: tuple[str, ...]
    #: the column of COUNT(*) without a filter: a group with 0 rows has no row
    rows: str
    columns: tuple[PartialColumn, ...]
    #: per expression of the leaf's key, the group column holding the same value
    key_groups: tuple[str, ...]
    #: values kept per group and MIN/MAX column (see :attr:`PartialColumn.cache`)
    min_max_cache: int = DEFAULT_MIN_MAX_CACHE

    @property
    def hidden(self) -> tuple[str, ...]:
        """Columns the table stores beyond its query's: the kept MIN/MAX values."""
        return tuple(c.cache for c in self.columns if c.cache)


@dataclass(frozen=True)
class Plan:
    """How one view (or internal stage) is maintained."""

    #: 'linear' (the query over the delta) or 'keyed' (recompute at the affected keys)
    kind: str
    #: keyed: the view's query with each leaf replaced by its temp view
    query: str = ""
    leaves: tuple[Leaf, ...] = ()
    #: keyed: what each key class is, for people ("a.id = b.auction")
    key_classes: tuple[str, ...] = ()
    #: operators, outermost first, each with the state it reads
    operators: tuple[str, ...] = ()
    #: keyed: 'recompute' (the query at the affected keys, before and after) or 'delta join'
    #: (inner joins only: each input's change joined with the others' state) or PARTIAL_RULE
    rule: str = "recompute"
    #: PARTIAL_RULE: what the table keeps per group and how a change updates it
    aggregate: PartialAggregate | None = None
    #: linear: the rewritten query may type a column differently from the query as written (AVG
    #: as SUM / COUNT over a partial aggregate): its output is cast to the written query's types
    typed_like_query: bool = False
    #: keyed recompute: per key class, the position of the output column that is that key as a
    #: leaf gives it (a GROUP BY key the view selects), so the view's own rows at the affected keys
    #: can be read; () when some class has no such column
    output_keys: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.kind == "linear":
            lines = ["linear: the change is the query applied to the inputs' change; no state"]
            if self.query:  # rewritten to read the stages that keep the state
                lines += [f"- {op}" for op in self.operators] + [f"- runs: {self.query}"]
            return "\n".join(lines)
        lines = []
        if self.key_classes:
            lines.append("keyed by " + ", ".join(f"({k})" for k in self.key_classes))
            if self.rule == "delta join":
                lines.append("delta rule: each input's change joined with the other inputs' state at its keys")
            if self.aggregate is not None:
                aggregate = self.aggregate
                lines.append(
                    "partial aggregate: the table keeps per group "
                    + ", ".join(f"{c.name} ({c.kind})" for c in aggregate.columns)
                    + "; a change is added to the groups it touches"
                )
                if aggregate.hidden:
                    lines.append(
                        f"- MIN/MAX: the {aggregate.min_max_cache} least/greatest values per group are kept"
                        f" ({', '.join(aggregate.hidden)}); a group is reread from its input only when a"
                        " change deletes all of them"
                    )
                if any(c.kind == "sum" for c in aggregate.columns):
                    lines.append("- a SUM over floating point that loses a value is recomputed from its input")
        elif self.rule == "delta join":
            lines.append("no key: delta rule, each input's change joined with the other inputs' whole state")
        else:
            lines.append("one partition: the whole input is recomputed when it changes")
        lines += [f"- {op}" for op in self.operators]
        lines += [
            f"- state read: {leaf.table or 'subquery over ' + ', '.join(leaf.upstreams)}"
            + (f" at {', '.join(leaf.key)} in the affected keys" if leaf.key else " (all of it)")
            for leaf in self.leaves
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class Stage:
    """An internal view the planner split off a view, planned like any view."""

    name: str
    query: str
    columns: tuple[str, ...]
    upstreams: tuple[str, ...]


@dataclass(frozen=True)
class PlannedView:
    plan: Plan
    #: internal stages this view reads, upstream-most first; each is planned separately
    stages: tuple[Stage, ...] = ()
