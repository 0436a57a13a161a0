"""Checking a materialized view's query (Spark SQL) with sqlglot, without Spark.

Two passes, because the second needs the output columns of the views a query reads:

* :func:`analyze_query` parses the query and finds what it reads, the constructs views may not
  use yet (:mod:`epochal.pipeline.stateless`) and output columns without a name;
* :func:`resolve_columns` qualifies it against the columns of the tables it reads and returns
  its output columns, or the columns it references that do not exist.

Problems carry file lines: sqlglot counts lines from 1 at the AS keyword (``query_line``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope
from sqlglot.schema import MappingSchema

from epochal.pipeline.dialect import DIALECT
from epochal.pipeline.stateless import AGGREGATE_FUNCTIONS, canonical_order, is_window_call, refused_constructs
from epochal.pipeline.statements import Problem
from epochal.pipeline.time_windows import name_implicit_windows

#: Type given to a view's columns in the schema: qualification needs names only.
VIEW_COLUMN_TYPE = "UNKNOWN"


@dataclass(frozen=True)
class TableRef:
    name: str
    line: int


@dataclass
class QueryAnalysis:
    #: None when the query does not parse
    tree: exp.Expression | None
    #: tables read, in first-mention order, without duplicates and without CTE names
    tables: list[TableRef] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: the query has operators that keep state (planned once its columns are known)
    stateful: bool = False
    #: the query as it runs, when it differs from the text (order-free aggregates given a
    #: canonical answer: :func:`epochal.pipeline.stateless.canonical_order`)
    canonical: str | None = None


class _Lines:
    """Maps sqlglot nodes and keywords to file lines."""

    def __init__(self, query_text: str, query_line: int):
        self.text = query_text
        self.base = query_line
        self._tokens: list | None = None

    def file_line(self, sqlglot_line: int | None) -> int:
        return self.base + (sqlglot_line or 1) - 1

    def of(self, node: exp.Expression, anchor: str = "", occurrence: int = 0) -> int:
        """Line of ``anchor`` (its ``occurrence``-th match) if given and found, else of the node's
        first identifier, else of the query's start."""
        if anchor:
            line = self.keyword(anchor, occurrence)
            if line is not None:
                return self.file_line(line)
        lines = [n.meta["line"] for n in node.walk() if n.meta.get("line") is not None]
        if not lines:
            # sqlglot before 26.2x records no positions: find the first identifier's text instead
            names = [n.name.upper() for n in node.walk() if isinstance(n, exp.Identifier)]
            found = self.keyword(names[0]) if names else None
            lines = [found] if found is not None else []
        return self.file_line(min(lines) if lines else None)

    def keyword(self, anchor: str, occurrence: int = 0) -> int | None:
        if self._tokens is None:
            try:
                self._tokens = list(sqlglot.tokenize(self.text, read=DIALECT))
            except TokenError:
                self._tokens = []
        tokens = self._tokens
        for i, token in enumerate(tokens):
            words = token.text.upper().split()
            if not words or words[0] != anchor:
                continue
            if anchor == "UNION" and i + 1 < len(tokens) and tokens[i + 1].text.upper() == "ALL":
                continue  # looking for the UNION without ALL
            if occurrence == 0:
                return token.line
            occurrence -= 1
        return None


_CLASS_REPR = re.compile(r"<class '(?:\w+\.)*(\w+)'>")


def _describe_parse_error(error: ParseError) -> tuple[int | None, str]:
    details = error.errors[0] if error.errors else {}
    description = str(details.get("description") or error).split(" but got <Token", 1)[0]
    description = _CLASS_REPR.sub(r"\1", description)  # <class 'sqlglot...Where'> -> Where
    highlight = str(details.get("highlight") or "").strip()
    near = f" near '{highlight}'" if highlight else ""
    return details.get("line"), f"{description}{near}"


def analyze_query(view: str, query_text: str, query_line: int, full_refresh: bool = False) -> QueryAnalysis:
    """Parse ``query_text`` (Spark SQL) and check what can be checked without other tables' columns.

    ``full_refresh`` views are recomputed every epoch, so constructs that need state are fine for
    them; non-deterministic ones never are (a replayed epoch must give the same rows)."""
    lines = _Lines(query_text, query_line)
    try:
        statements = sqlglot.parse(query_text, read=DIALECT)
    except ParseError as error:
        line, description = _describe_parse_error(error)
        message = f"view {view}: syntax error in the query: {description}; fix the Spark SQL"
        return QueryAnalysis(None, problems=[Problem(lines.file_line(line), message)])
    except SqlglotError as error:  # TokenError, or anything else sqlglot cannot read
        message = f"view {view}: syntax error in the query: {error}; fix the Spark SQL"
        return QueryAnalysis(None, problems=[Problem(query_line, message)])
    statements = [s for s in statements if s is not None]
    tree = _unwrap(statements[0]) if len(statements) == 1 else None
    if not isinstance(tree, (exp.Select, exp.SetOperation)):
        message = f"view {view}: AS must be followed by a single SELECT query"
        return QueryAnalysis(None, problems=[Problem(query_line, message)])

    analysis = QueryAnalysis(tree)
    if canonical_order(tree):  # (before the checks: a sorted collect_list is deterministic)
        analysis.canonical = tree.sql(dialect=DIALECT)
    analysis.tables = _tables(view, tree, lines, analysis.problems)
    if not analysis.tables and not analysis.problems:
        # with nothing to read, a view has no changes to follow epoch by epoch
        values = tree.find(exp.Values)
        if values is not None:
            message = (
                f"view {view}: the query reads only VALUES, whose rows never change: a view follows the "
                "changes of the sources and views it reads; join the VALUES with one, or make the rows a source"
            )
            analysis.problems.append(Problem(lines.of(values, "VALUES"), message))
        else:
            message = f"view {view}: the query reads no source or view: add FROM a source or view"
            analysis.problems.append(Problem(query_line, message))
    recursive = next((w for w in tree.find_all(exp.With) if w.args.get("recursive")), None)
    if recursive is not None and not full_refresh:
        message = (
            f"view {view}: WITH RECURSIVE cannot be maintained incrementally: its rows come from running "
            "its query over its own output until nothing new comes, which no key partitions; join a fixed "
            "number of times instead, or add WITH (refresh = 'full') to recompute the view every epoch "
            "(cost grows with the table)"
        )
        analysis.problems.append(Problem(lines.of(recursive, "RECURSIVE"), message))
    for finding in refused_constructs(tree):
        if finding.needs_state:
            # full views recompute; for incremental ones the planner decides, once columns are known
            analysis.stateful = True
            continue
        analysis.problems.append(
            Problem(
                lines.of(finding.node, finding.anchor, finding.occurrence),
                f"view {view}: {finding.message}",
            )
        )
    for position, projection in enumerate(tree.selects, start=1):
        if _output_names(projection) is None:
            shown = projection.sql(dialect=DIALECT)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            # (a generator of several columns, e.g. inline() of structs or posexplode(),
            # takes one name per column; Spark names them, but the loader must know them first)
            several = isinstance(projection, _MULTI_COLUMN_GENERATORS) or (
                isinstance(projection, exp.Anonymous) and projection.name.lower() in ("json_tuple", "inline_outer")
            )
            fix = "add AS (name1, name2, ...), one name per column it gives" if several else "add AS column_name"
            analysis.problems.append(
                Problem(lines.of(projection), f"view {view}: column {position} ({shown}) has no name: {fix}")
            )
    return analysis


def _unwrap(node: exp.Expression) -> exp.Expression:
    # "AS (SELECT ...)" is a parenthesized query, fine as a view body
    while isinstance(node, (exp.Subquery, exp.Paren)) and not node.alias:
        node = node.this
    return node


#: generators that give several columns
_MULTI_COLUMN_GENERATORS = (exp.Inline, exp.Posexplode, exp.PosexplodeOuter, exp.Stack)


def _output_names(projection: exp.Expression) -> list[str] | None:
    """The columns ``projection`` gives, by name; None when it has none."""
    if isinstance(projection, exp.Alias):
        return [projection.alias]
    if isinstance(projection, exp.Aliases):
        # a generator's several columns: stack(2, ...) AS (k, v)
        return [alias.name for alias in projection.expressions] or None
    if isinstance(projection, exp.Column):
        return [projection.name]  # a.* has name "*", expanded later
    if isinstance(projection, exp.Star):
        return ["*"]
    return None


def _tables(view: str, tree: exp.Expression, lines: _Lines, problems: list[Problem]) -> list[TableRef]:
    ctes = cte_references(tree)
    found: list[tuple[int, int, TableRef]] = []
    for index, table in enumerate(tree.find_all(exp.Table)):
        if table.find_ancestor(exp.Hint) is not None:
            continue  # a join hint (/*+ BROADCAST(c) */) names a relation of the query, not a table
        if not isinstance(table.this, exp.Identifier):
            shown = table.this.sql(dialect=DIALECT, normalize_functions=False)
            message = f"view {view}: reading {shown} is not supported: a view reads sources and views, by name"
            problems.append(Problem(lines.of(table), message))
            continue
        if id(table) in ctes:
            continue
        name = _table_name(table)
        start = table.this.meta.get("start")
        found.append((start if start is not None else 1 << 62, index, TableRef(name, lines.of(table))))
    refs: list[TableRef] = []
    seen: set[str] = set()
    for _, _, ref in sorted(found, key=lambda item: item[:2]):  # text order, not tree order
        if ref.name not in seen:
            seen.add(ref.name)
            refs.append(ref)
    return refs


def cte_bindings(tree: exp.Expression) -> dict[int, exp.CTE]:
    """The CTE each table reference of ``tree`` reads, by the reference's ``id`` (a reference not
    in it reads a table of that name).

    A CTE is seen by its query and by the CTEs after it, not by its own body nor by those before
    it, as in Spark: ``WITH orders AS (SELECT * FROM orders WHERE ...)`` reads the table
    ``orders`` inside. A nested WITH hides an outer CTE of its name. In ``WITH RECURSIVE`` every
    CTE of the clause sees every one, itself too."""
    found: dict[int, exp.CTE] = {}
    # outermost first: an inner WITH's binding of a name replaces an outer one's within its scope
    for with_ in sorted(tree.find_all(exp.With), key=lambda node: node.depth):
        owner = with_.parent
        if owner is None:
            continue
        definitions = with_.expressions
        recursive = bool(with_.args.get("recursive"))
        by_name: dict[str, list[tuple[int, exp.CTE]]] = {}
        for position, cte in enumerate(definitions):
            by_name.setdefault(cte.alias_or_name.lower(), []).append((position, cte))
        # the query that owns the WITH, without the WITH's own bodies (position: after them all),
        # then each body, which sees the CTEs before it
        scopes = [(len(definitions), owner.walk(prune=lambda node, own=with_: node is own))]
        scopes += [(len(definitions) if recursive else i, d.this.walk()) for i, d in enumerate(definitions)]
        for visible, scope in scopes:
            for node in scope:
                if not isinstance(node, exp.Table) or node.args.get("db"):
                    continue
                seen = [cte for position, cte in by_name.get(node.name.lower(), ()) if position < visible]
                if seen:
                    found[id(node)] = seen[-1]
    return found


def cte_references(tree: exp.Expression) -> set[int]:
    """The ``id`` of every table reference in ``tree`` that reads a CTE (see :func:`cte_bindings`)."""
    return set(cte_bindings(tree))


def _table_name(table: exp.Table) -> str:
    """db.name for a qualified reference, so that it is reported as unknown rather than read as name."""
    return ".".join(part.name.lower() for part in table.parts)


@dataclass
class Resolution:
    #: output column names, None when they could not be determined
    columns: tuple[str, ...] | None
    problems: list[Problem] = field(default_factory=list)


def problem_at(view: str, query_text: str, query_line: int, node: exp.Expression | None, message: str) -> Problem:
    """A problem of ``view`` located at ``node`` (a node of the parsed query or a copy of it)."""
    lines = _Lines(query_text, query_line)
    return Problem(lines.of(node) if node is not None else query_line, f"view {view}: {message}")


def inline_ctes(tree: exp.Expression) -> exp.Expression:
    """``WITH x AS (q) ... FROM x`` as ``... FROM (q) AS x``: every reference a subquery of its own.

    The incremental planner plans subqueries; a CTE read twice becomes two subqueries, which is
    what a CTE means (it is not materialized). Which CTE a reference reads is
    :func:`cte_bindings`'s scoping. ``WITH RECURSIVE`` is left as written (its CTEs read
    themselves: only a full-refresh view runs one, as written)."""
    tree = tree.copy()
    bindings = cte_bindings(tree)
    ctes: list[exp.CTE] = []
    for table in tree.find_all(exp.Table):
        cte = bindings.get(id(table))
        if cte is not None and not cte.parent.args.get("recursive"):
            if cte not in ctes:
                ctes.append(cte)
            # (a mark, not an id: it survives the copies of a body that expanding makes)
            table.meta[_CTE_MARK] = ctes.index(cte)
    for with_ in list(tree.find_all(exp.With)):
        if not with_.args.get("recursive"):
            with_.pop()

    def expanded(node: exp.Expression) -> exp.Expression:
        for table in list(node.find_all(exp.Table)):
            index = table.meta.get(_CTE_MARK)
            if index is None:
                continue
            cte = ctes[index]
            # WITH m(k, v) AS (...) names the CTE's columns: the subquery's alias does then
            columns = [c.copy() for c in cte.args["alias"].columns]
            alias = exp.TableAlias(this=exp.to_identifier(table.alias or table.name), columns=columns)
            subquery = exp.Subquery(this=expanded(cte.this.copy()), alias=alias)
            if table is node:
                return subquery
            table.replace(subquery)
        return node

    return expanded(tree)


#: the meta key :func:`inline_ctes` marks a reference to a CTE with
_CTE_MARK = "epochal_cte"


def qualify_query(tree: exp.Expression, schema: Mapping[str, Sequence[str]]) -> exp.Expression:
    """``tree`` with CTEs inlined, stars expanded, every column qualified by its table alias and
    the column a GROUP BY window(...) makes read as the call (:mod:`epochal.pipeline.time_windows`)."""
    mapping = {table: {column: VIEW_COLUMN_TYPE for column in columns} for table, columns in schema.items()}
    tree = _struct_fields_as_written(inline_ctes(tree))
    qualified = qualify(
        name_implicit_windows(inline_named_windows(name_values_columns(tree)), schema),
        schema=MappingSchema(mapping, dialect=DIALECT),
        dialect=DIALECT,
        validate_qualify_columns=False,
        allow_partial_qualification=True,
        quote_identifiers=False,
        identify=False,
    )
    return _bare_grouping_columns(_expand_group_by_all(qualified))


def _struct_fields_as_written(tree: exp.Expression) -> exp.Expression:
    """``tree`` with the field names of ``named_struct('userId', id)`` / ``struct(id AS userId)``
    marked case-sensitive where they have capitals (a copy, when any does).

    Qualification lowercases unquoted identifiers, which is right for Spark's case-insensitive
    column names but not for a struct's field names: they are data, kept in the value's type,
    ``to_json``'s keys and a sink's schema (``{"userid": 1}`` where Spark writes ``{"userId": 1}``)."""
    if not any(_capitalized_fields(tree)):
        return tree
    tree = tree.copy()
    for name in _capitalized_fields(tree):
        name.meta["case_sensitive"] = True  # (Spark's normalization lowercases quoted names too)
    return tree


def _capitalized_fields(tree: exp.Expression) -> Iterator[exp.Identifier]:
    for struct in tree.find_all(exp.Struct):
        for item in struct.expressions:
            name = item.this if isinstance(item, exp.PropertyEQ) else item.args.get("alias")
            if isinstance(name, exp.Identifier) and name.name != name.name.lower():
                yield name


def name_values_columns(tree: exp.Expression) -> exp.Expression:
    """A copy of ``tree`` in which every VALUES without column names has Spark's: col1, col2...

    sqlglot would name them _col_0, _col_1..., so a query reading ``col1`` would not resolve, and
    ``SELECT *`` over the VALUES would name the view's columns otherwise than Spark."""
    tree = tree.copy()
    for values in tree.find_all(exp.Values):
        alias = values.args.get("alias")
        rows = values.expressions
        if (alias is not None and alias.columns) or not rows:
            continue
        width = len(rows[0].expressions) if isinstance(rows[0], exp.Tuple) else 1
        columns = [exp.to_identifier(f"col{i}") for i in range(1, width + 1)]
        if alias is None:
            values.set("alias", exp.TableAlias(columns=columns))
        else:
            alias.set("columns", columns)
    return tree


def inline_named_windows(tree: exp.Expression) -> exp.Expression:
    """``OVER w`` with ``WINDOW w AS (PARTITION BY ...)`` written out in each OVER, and the WINDOW
    clause dropped (a copy; ``tree`` itself when it names no window): the planner reads a window's
    partitioning from its OVER."""
    if not any(select.args.get("windows") for select in tree.find_all(exp.Select)):
        return tree
    tree = tree.copy()
    for select in list(tree.find_all(exp.Select)):
        named = {w.name.lower(): w for w in select.args.get("windows") or [] if isinstance(w.this, exp.Identifier)}
        for window in select.find_all(exp.Window):
            alias = window.args.get("alias")
            definition = named.get(alias.name.lower()) if isinstance(alias, exp.Identifier) else None
            if definition is None or window.find_ancestor(exp.Select) is not select:
                continue  # (a window of a nested query, or a definition itself)
            for part in ("partition_by", "order", "spec"):
                value = definition.args.get(part)
                if value and not window.args.get(part):
                    window.set(part, [e.copy() for e in value] if isinstance(value, list) else value.copy())
            window.set("alias", None)
        select.set("windows", None)
    return tree


def _expand_group_by_all(tree: exp.Expression) -> exp.Expression:
    """``GROUP BY ALL`` as Spark reads it: by every output column without an aggregate (none: an
    aggregate over all rows). The planner then sees what the query groups by."""
    for select in tree.find_all(exp.Select):
        group = select.args.get("group")
        if group is None or not group.args.get("all") or group.expressions:
            continue
        keys = [e.unalias().copy() for e in select.expressions if not _has_aggregate(e)]
        select.set("group", exp.Group(expressions=keys) if keys else None)
    return tree


def _bare_grouping_columns(tree: exp.Expression) -> exp.Expression:
    """``t.c AS c`` written back as ``t.c`` in a SELECT whose HAVING or ORDER BY calls grouping()
    or grouping_id() on columns.

    Spark resolves those calls' arguments against the SELECT's output, and accepts one only when it
    is a grouping column projected as it is: qualification's ``AS c`` hides it
    (GROUPING_COLUMN_MISMATCH or UNRESOLVED_COLUMN), although the output name stays ``c``."""
    for select in tree.find_all(exp.Select):
        clauses = [select.args.get(part) for part in ("having", "order")]
        calls = [
            call
            for clause in clauses
            if clause is not None
            for call in clause.find_all(exp.Grouping, exp.GroupingId)
            if call.expressions and call.parent_select is select
        ]
        if not calls:
            continue
        for projection in select.expressions:
            column = projection.this if isinstance(projection, exp.Alias) else None
            if isinstance(column, exp.Column) and column.name.lower() == projection.alias.lower():
                projection.replace(column.copy())
    return tree


def _has_aggregate(node: exp.Expression) -> bool:
    for function in node.find_all(exp.Func):
        if is_window_call(function):
            continue  # sum(x) OVER (...) is a window function, not an aggregate
        name = function.name.lower() if isinstance(function, exp.Anonymous) else function.sql_name().lower()
        if isinstance(function, exp.AggFunc) or name in AGGREGATE_FUNCTIONS:
            return True
    return False


def resolve_columns(
    view: str,
    tree: exp.Expression,
    query_text: str,
    query_line: int,
    schema: Mapping[str, Sequence[str]],
) -> Resolution:
    """Qualify ``tree`` against ``schema`` (table -> column names); every table it reads must be in it."""
    lines = _Lines(query_text, query_line)
    mapping = {table: {column: VIEW_COLUMN_TYPE for column in columns} for table, columns in schema.items()}
    try:
        qualified = qualify(
            name_implicit_windows(name_values_columns(tree), schema),  # (a copy)
            schema=MappingSchema(mapping, dialect=DIALECT),
            dialect=DIALECT,
            validate_qualify_columns=False,  # we report every unknown column, not just the first
            allow_partial_qualification=True,
            quote_identifiers=False,
            identify=False,
        )
    except SqlglotError as error:  # OptimizeError mostly; columns cannot be known then
        message = f"view {view}: cannot resolve the query's columns: {error}"
        return Resolution(None, [Problem(query_line, message)])

    problems: list[Problem] = []
    reported: set[tuple[str, str]] = set()
    for scope in traverse_scope(qualified):
        if not isinstance(scope.expression, exp.Select):
            continue
        for column in scope.columns:
            message = _unknown_column(view, column, scope, schema)
            key = (column.table, column.name)
            if message and key not in reported:
                reported.add(key)
                problems.append(Problem(lines.of(column), message))

    for union in qualified.find_all(exp.SetOperation):
        left, right = union.left.named_selects, union.right.named_selects
        if "*" not in left + right and len(left) != len(right):
            kind = type(union).__name__.upper()
            problems.append(
                Problem(
                    lines.of(union.right),
                    f"view {view}: the {kind} branches have different numbers of columns "
                    f"({len(left)} and {len(right)}): make every SELECT list the same number of columns",
                )
            )

    names = [name.lower() for name in qualified.named_selects]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(
            Problem(
                query_line,
                f"view {view}: column '{name}' appears more than once in the output: rename all but "
                "one with AS",
            )
        )
    if problems or "*" in names:
        return Resolution(None, problems)
    return Resolution(tuple(names), problems)


def _unknown_column(
    view: str, column: exp.Column, scope: Scope, schema: Mapping[str, Sequence[str]]
) -> str | None:
    """Why ``column`` does not resolve, or None when it does (or when its table is already reported)."""
    if column.name == "*":
        return None
    sources = scope.sources
    if scope.pivots:
        return None  # PIVOT is refused on its own; its output columns are not worth resolving
    for source in sources.values():
        if isinstance(source, exp.Table) and _table_name(source) not in schema:
            return None  # an unknown or broken upstream, reported on its own
    if column.table and column.table not in sources:
        outer = scope.parent
        while outer is not None:  # a correlated subquery reads the enclosing query's tables
            if column.table in outer.sources:
                return None
            outer = outer.parent
        known = ", ".join(sorted(sources)) or "none"
        return (
            f"view {view}: unknown table or alias '{column.table}' in {column.sql(dialect=DIALECT)}: "
            f"the query's FROM names {known}"
        )
    candidates: dict[str, list[str]] = {}
    for alias, source in sources.items():
        if column.table and alias != column.table:
            continue
        if isinstance(source, exp.Table):
            candidates[_table_name(source)] = list(schema[_table_name(source)])
        elif isinstance(source, Scope):
            produced = source.expression
            if isinstance(produced, exp.Lateral) and isinstance(produced.this, exp.Subquery):
                # LATERAL (SELECT ...) t: its columns are the subquery's (a LATERAL VIEW's are its alias's)
                produced = produced.this
            candidates[alias] = list(produced.named_selects)
    if any(column.name in names or "*" in names for names in candidates.values()):
        return None
    message = f"view {view}: unknown column '{column.name}'"
    if candidates:
        described = "; ".join(
            f"{_describe_source(table)} has {', '.join(names)}" for table, names in candidates.items()
        )
        message += f": {described}"
        close = difflib.get_close_matches(column.name, [n for ns in candidates.values() for n in ns], n=1)
        if close:
            message += f"; did you mean '{close[0]}'?"
    return message


def _describe_source(alias: str) -> str:
    # qualify names unaliased subqueries _0, _1...: not a name the user wrote
    return "the subquery in FROM" if re.fullmatch(r"_\d+", alias) else alias
