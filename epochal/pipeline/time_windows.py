"""Spark's time windows in GROUP BY, spelled so that sqlglot and the planner can follow them.

``SELECT window.start, count(*) FROM bid GROUP BY window(date_time, '10 seconds')`` is the
windowed aggregation of Spark's documentation. Two things in it are Spark's own:

* grouping by ``window(...)`` or ``session_window(...)`` makes a column of that name, a struct of
  ``start`` and ``end``, that the SELECT list, HAVING and ORDER BY read (``window.start``). It is
  no table's column, so a resolver that does not know the rule reports ``window`` as an unknown
  table. :func:`name_implicit_windows` writes each such reference as the call it stands for
  (``window(date_time, '10 seconds').start``), which Spark accepts with the same meaning;
* a hopping window (``window(ts, '10 seconds', '2 seconds')``) puts each row in several
  windows, so it is no expression a row can be tested against: a plan cannot restrict an input
  to "the rows of window k" by evaluating it in a join condition (Spark refuses it there). What
  can be restricted is an input that carries the window as a column, one row per window, which
  is what Spark computes below the aggregate anyway. :func:`windows_as_input_columns` moves the
  call into the input it reads, as a column, and groups by that column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from epochal.pipeline.dialect import DIALECT

#: Spark's time-window functions, each the name of the column grouping by it makes.
TIME_WINDOW = "window"
SESSION_WINDOW = "session_window"
WINDOW_FUNCTIONS = (TIME_WINDOW, SESSION_WINDOW)


def window_call(node: exp.Expression, names: Sequence[str] = WINDOW_FUNCTIONS) -> str | None:
    """The name of the time-window function ``node`` calls (lower case), or None."""
    if isinstance(node, exp.Anonymous) and node.name.lower() in names:
        return node.name.lower()
    return None


def has_window_call(node: exp.Expression, names: Sequence[str] = WINDOW_FUNCTIONS) -> bool:
    return any(window_call(sub, names) for sub in node.walk())


def _grouped_windows(select: exp.Select) -> dict[str, exp.Expression]:
    """Implicit column name -> the window call ``select`` groups by (the first of each kind)."""
    group = select.args.get("group")
    found: dict[str, exp.Expression] = {}
    for expression in group.expressions if group is not None else ():
        name = window_call(expression)
        if name is not None:
            found.setdefault(name, expression)
    return found


def _own_clauses(select: exp.Select) -> list[exp.Expression]:
    """The clauses of ``select`` that read its groups: SELECT list, HAVING, ORDER BY, QUALIFY."""
    clauses: list[exp.Expression] = list(select.expressions)
    clauses += [select.args[a] for a in ("having", "order", "qualify") if select.args.get(a) is not None]
    return clauses


def _item_columns(item: exp.Expression, schema: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The columns a FROM item offers, or None when they are not known."""
    if isinstance(item, exp.Table):
        columns = schema.get(item.name.lower())
        return None if columns is None else [c.lower() for c in columns]
    if isinstance(item, exp.Subquery):
        names = [n.lower() for n in item.this.named_selects]
        return None if "*" in names or "" in names else names
    return None


def _items(select: exp.Select) -> list[exp.Expression]:
    source = select.args.get("from_")
    items = [source.this] if source is not None else []
    return items + [join.this for join in select.args.get("joins") or []]


def name_implicit_windows(tree: exp.Expression, schema: Mapping[str, Sequence[str]]) -> exp.Expression:
    """``tree`` (a copy) with every reference to the column a GROUP BY ``window(...)`` or
    ``session_window(...)`` makes written as that call: ``window.start`` becomes
    ``window(ts, '10 seconds').start``, ``window`` becomes ``window(ts, '10 seconds') AS window``.

    A query whose inputs have a column or alias of that name keeps it: the reference is theirs."""
    tree = tree.copy()
    for select in list(tree.find_all(exp.Select)):
        windows = _grouped_windows(select)
        if not windows:
            continue
        items = _items(select)
        for item in items:
            offered = _item_columns(item, schema) or []
            for name in list(windows):
                if name in offered or item.alias_or_name.lower() == name:
                    del windows[name]
        for clause in _own_clauses(select):
            for column in list(clause.find_all(exp.Column)):
                if column.parent_select is not select:
                    continue
                replacement = _implicit_reference(column, windows)
                if replacement is None:
                    continue
                label = column.name if column.table else column.name.lower()
                if isinstance(column.parent, exp.Select):  # an unaliased output column keeps its name
                    replacement = exp.alias_(replacement, label)
                column.replace(replacement)
    return tree


def _implicit_reference(column: exp.Column, windows: Mapping[str, exp.Expression]) -> exp.Expression | None:
    """What ``column`` stands for when it names a grouped window (``window``, ``window.start``)."""
    if column.args.get("db") is not None:
        return None
    table = column.table.lower()
    if not table and column.name.lower() in windows:
        return windows[column.name.lower()].copy()
    if table in windows:
        return exp.Dot(this=windows[table].copy(), expression=column.this.copy())
    return None


def windows_as_input_columns(tree: exp.Expression, schema: Mapping[str, Sequence[str]]) -> exp.Expression:
    """``tree`` (qualified, a copy) with each time window a GROUP BY groups by moved into the one
    input it reads, as a column: ``FROM bid GROUP BY bid.auction, window(bid.ts, '10 seconds',
    '2 seconds')`` becomes ``FROM (SELECT bid.auction AS auction, ..., window(bid.ts, ...) AS window
    FROM bid AS bid) AS bid GROUP BY bid.auction, bid.window``, and the SELECT list, HAVING and
    ORDER BY read ``bid.window`` where they read the call.

    Spark computes the same thing (one row per window a row falls in, below the aggregate); the
    planner then sees an input that carries the window, which it can restrict and key by. A
    window over the columns of two inputs, or of an input whose columns are not known, stays."""
    tree = tree.copy()
    for select in list(tree.find_all(exp.Select)):
        group = select.args.get("group")
        if group is None:
            continue
        calls = [g for g in group.expressions if window_call(g, (TIME_WINDOW,))]
        for call in calls:
            owners = {c.table for c in call.find_all(exp.Column)}
            items = {item.alias_or_name: item for item in _items(select)}
            owner = next(iter(owners)) if len(owners) == 1 else None
            if owner is None or owner not in items:
                continue
            item = items[owner]
            columns = _item_columns(item, schema)
            if columns is None:
                continue
            name = _unique_name(TIME_WINDOW, columns)
            text = call.sql(dialect=DIALECT)
            pushed = call.copy()
            for clause in [*_own_clauses(select), group]:
                for node in list(clause.find_all(exp.Anonymous)):
                    if node.parent_select is select and node.sql(dialect=DIALECT) == text:
                        node.replace(exp.column(name, table=owner))
            inner = exp.select(
                *(exp.alias_(exp.column(column, table=owner), column) for column in columns),
                exp.alias_(pushed, name),
            ).from_(item.copy())
            item.replace(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(owner))))
    return tree


def _unique_name(base: str, taken: Sequence[str]) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name
