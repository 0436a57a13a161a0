"""Unique keys a view's query provably has: sets of output columns no two of its rows share.

An upsert sink applies an epoch's change by key. That is deterministic only when the key is unique
in the view: two rows with one key would leave the sink holding whichever came last, and a delete
by key could remove a row another one still justifies. So a sink's ``primary_key`` must contain a
key proven here, and the loader refuses it otherwise (naming the keys it can prove).

The proof follows the query's operators on the qualified tree (CTEs inlined, stars expanded):

* a source's PRIMARY KEY is a key; a view's proven keys are keys of the views that read it;
* ``GROUP BY`` makes the grouping columns a key (when they are all in the output); an aggregate
  without ``GROUP BY`` has one row, so the empty set is a key; ``DISTINCT`` and ``UNION`` make all
  output columns a key;
* ``row_number() OVER (PARTITION BY p ...) AS rn`` makes (p, rn) a key;
* a filter ``col = constant`` drops ``col`` from a key (``WHERE rn = 1`` leaves p);
* projections and filters keep their input's keys when every key column is projected as itself;
* an equi-join keeps one side's keys when the other side's join columns contain one of its keys
  (each row meets at most one partner), for inner joins and for the preserved side of outer joins.

Anything else proves nothing (``UNION ALL``, keys computed by expressions): no key is better than
a wrong one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from epochal.pipeline.query_checks import DIALECT, qualify_query

Key = frozenset[str]
#: The proven keys of a table the query reads (a source's PRIMARY KEY, a view's proven keys).
TableKeys = Callable[[str], list[Key]]


def unique_keys(query: str, schema: Mapping[str, Sequence[str]], table_keys: TableKeys) -> list[Key]:
    """The minimal keys (lowercase output column names) ``query`` provably has; [] when none."""
    try:
        tree = qualify_query(sqlglot.parse_one(query, read=DIALECT), schema)
    except SqlglotError:
        return []
    return _minimal(_query_keys(tree, table_keys))


def covered(sink_key: Sequence[str], keys: list[Key]) -> bool:
    """Whether a sink keyed by ``sink_key`` holds at most one row of the view per key."""
    wanted = {c.lower() for c in sink_key}
    return any(key <= wanted for key in keys)


def _minimal(keys: list[Key]) -> list[Key]:
    unique = set(keys)
    return sorted((k for k in unique if not any(o < k for o in unique)), key=lambda k: (len(k), sorted(k)))


def _query_keys(node: exp.Expression, table_keys: TableKeys) -> list[Key]:
    if isinstance(node, exp.Subquery):
        return _query_keys(node.this, table_keys)
    if isinstance(node, exp.Union):
        if node.args.get("distinct"):
            return [frozenset(n.lower() for n in node.named_selects)]
        return []
    if isinstance(node, (exp.Intersect, exp.Except)):
        # Set semantics (distinct) unless ALL: every output column together; else the left side's keys.
        if node.args.get("distinct"):
            return [frozenset(n.lower() for n in node.named_selects)]
        return _query_keys(node.left, table_keys)
    if isinstance(node, exp.Select):
        return _select_keys(node, table_keys)
    return []


def _source_keys(source: exp.Expression, table_keys: TableKeys) -> list[Key]:
    """Keys of one FROM/JOIN item, in its own column names."""
    if isinstance(source, exp.Table):
        return [frozenset(c.lower() for c in k) for k in table_keys(source.name.lower())]
    if isinstance(source, exp.Subquery):
        return _query_keys(source.this, table_keys)
    return []


def _alias(source: exp.Expression) -> str:
    return (source.alias_or_name or "").lower()


def _select_keys(select: exp.Select, table_keys: TableKeys) -> list[Key]:
    outputs = _outputs(select)  # output name -> the (alias, column) it projects, or None
    names = [n.lower() for n in select.named_selects]
    keys: list[Key] = []
    if select.args.get("distinct") and not select.args["distinct"].args.get("on"):
        keys.append(frozenset(names))
    group = select.args.get("group")
    fixed_inputs = _fixed(select, ("where",))
    if group is not None:
        grouped = _grouped_outputs(select, group)
        if grouped is not None:
            # A grouping column the WHERE fixes to one value does not tell groups apart.
            keys.append(frozenset(n for n in grouped if outputs.get(n) not in fixed_inputs))
        return _after_filter(keys, select)
    if any(isinstance(p.unalias(), exp.AggFunc) or p.find(exp.AggFunc) for p in select.expressions) and not any(
        p.find(exp.Window) for p in select.expressions
    ):
        return [frozenset()]  # an aggregate over all rows: one row
    # Keys of the input, as (alias, column) sets.
    input_keys = _from_keys(select, table_keys)
    # Window row numbers: (partition, rn) is a key of the rows they number.
    for projection in select.expressions:
        window = projection.unalias()
        if isinstance(window, exp.Window) and isinstance(window.this, exp.RowNumber):
            parts = [_column_ref(e) for e in window.args.get("partition_by") or []]
            if all(parts):
                input_keys.append(frozenset([*parts, ("", projection.alias_or_name.lower())]))
    for key in input_keys:
        mapped = set()
        for ref in key - fixed_inputs:
            name = next((n for n, source in outputs.items() if source == ref), None)
            if name is None and ref[0] == "":
                name = ref[1] if ref[1] in names else None
            if name is None:
                break
            mapped.add(name)
        else:
            keys.append(frozenset(mapped))
    return _after_filter(keys, select)


def _fixed(select: exp.Select, clauses: tuple[str, ...]) -> set[tuple[str, str]]:
    """Columns a ``col = constant`` conjunct of ``clauses`` fixes, as (table alias, column)."""
    fixed: set[tuple[str, str]] = set()
    for clause in clauses:
        condition = select.args.get(clause)
        if condition is None:
            continue
        for conjunct in _conjuncts(condition.this):
            if isinstance(conjunct, exp.EQ):
                for column, other in ((conjunct.left, conjunct.right), (conjunct.right, conjunct.left)):
                    ref = _column_ref(column)
                    if ref is not None and isinstance(other, exp.Literal):
                        fixed.add(ref)
    return fixed


def _after_filter(keys: list[Key], select: exp.Select) -> list[Key]:
    """``HAVING``/``QUALIFY col = constant`` fixes an output column: a key without it is still a key."""
    fixed = {name for _, name in _fixed(select, ("having", "qualify"))}
    return [frozenset(k - fixed) for k in keys] if fixed else keys


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    if isinstance(condition, exp.And):
        return _conjuncts(condition.left) + _conjuncts(condition.right)
    if isinstance(condition, exp.Paren):
        return _conjuncts(condition.this)
    return [condition]


def _column_ref(node: exp.Expression) -> tuple[str, str] | None:
    return (node.table.lower(), node.name.lower()) if isinstance(node, exp.Column) else None


def _outputs(select: exp.Select) -> dict[str, tuple[str, str] | None]:
    return {p.alias_or_name.lower(): _column_ref(p.unalias()) for p in select.expressions}


def _grouped_outputs(select: exp.Select, group: exp.Group) -> Key | None:
    """The output names of every grouping expression, or None when one is not in the output."""
    projections = select.expressions
    names: set[str] = set()
    for expression in group.expressions:
        if isinstance(expression, exp.Literal) and expression.is_int:  # GROUP BY 1
            index = int(expression.name) - 1
            if not 0 <= index < len(projections):
                return None
            names.add(projections[index].alias_or_name.lower())
            continue
        match = next((p for p in projections if p.unalias() == expression), None)
        if match is None and isinstance(expression, exp.Column) and not expression.table:
            match = next((p for p in projections if p.alias_or_name.lower() == expression.name.lower()), None)
        if match is None:
            return None
        names.add(match.alias_or_name.lower())
    return frozenset(names)


def _from_keys(select: exp.Select, table_keys: TableKeys) -> list[frozenset[tuple[str, str]]]:
    """Keys of the FROM clause with its joins, as sets of (table alias, column)."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        return []
    first = from_.this
    keys = [frozenset((_alias(first), c) for c in k) for k in _source_keys(first, table_keys)]
    for join in select.args.get("joins") or []:
        other = join.this
        other_alias = _alias(other)
        other_keys = [frozenset((other_alias, c) for c in k) for k in _source_keys(other, table_keys)]
        pairs = _equalities(join.args.get("on"))
        if pairs is None:
            return []
        left_cols = {a for a, b in pairs if a[0] != other_alias} | {b for a, b in pairs if b[0] != other_alias}
        right_cols = {a for a, b in pairs if a[0] == other_alias} | {b for a, b in pairs if b[0] == other_alias}
        side = (join.args.get("side") or "").upper()
        kept: list[frozenset[tuple[str, str]]] = []
        # Each left row meets at most one right row when the right's join columns hold a right key.
        if side in ("", "LEFT") and any(k <= right_cols for k in other_keys):
            kept += keys
        if side in ("", "RIGHT") and any(k <= left_cols for k in keys):
            kept += other_keys
        keys = kept
    return keys


def _equalities(on: exp.Expression | None) -> list[tuple[tuple[str, str], tuple[str, str]]] | None:
    if on is None:
        return None
    pairs = []
    for conjunct in _conjuncts(on):
        if isinstance(conjunct, exp.EQ):
            left, right = _column_ref(conjunct.left), _column_ref(conjunct.right)
            if left and right:
                pairs.append((left, right))
    return pairs
