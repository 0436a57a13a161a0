"""Loading a pipeline directory (*.sql files) into a :class:`Pipeline`, or every problem in it.

Nothing runs before the whole pipeline is known to be valid: every problem found in every file
is collected, located to file and line, and raised together as one :class:`PipelineError`.
No Spark here (loading must be fast and JVM-free): queries are checked with sqlglot.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.errors import PipelineError, PipelineIssue, require
from epochal.options import FORMAT_KEY
from epochal.pipeline.checks import ParsedCheck, is_check, load_checks, parse_check
from epochal.pipeline.cycles import view_cycles
from epochal.pipeline.ddl import Options, ParsedSink, ParsedSource, ParsedView, parse_statement
from epochal.pipeline.model import (
    REBUILD_SEPARATOR,
    STAGE_SEPARATOR,
    Location,
    Pipeline,
    SinkDef,
    SourceDef,
    ViewDef,
)
from epochal.pipeline.reserved_columns import internal_source_columns, internal_view_columns
from epochal.pipeline.shared_sources import resolve_shared_sources
from epochal.pipeline.statements import split_statements
from epochal.pipeline.view_options import (  # noqa: F401 (VIEW_OPTIONS, REFRESH_MODES: read as loader.*)
    MIN_MAX_CACHE_RANGE,
    REFRESH_MODES,
    VIEW_OPTIONS,
    min_max_cache,
    refresh_mode,
    view_option_problems,
)
from epochal.sinks.spec import primary_key_columns, validate_sink

if TYPE_CHECKING:
    from epochal.connectors.base import ConnectorSpec
    from epochal.pipeline.query_checks import QueryAnalysis

PIPELINE_ENV = "EPOCHAL_PIPELINE"
#: Table PRIMARY KEYs (upsert tables, see epochal/storage/upsert.py); False refuses them all.
SOURCE_PRIMARY_KEY_SUPPORTED = True
#: Connectors whose records can update and delete by key; the others only append.
SOURCE_PRIMARY_KEY_CONNECTORS = frozenset({"log", "posix_fs", "postgres-cdc", "mysql-cdc"})

#: FORMATs whose records upsert and delete rows by the table's PRIMARY KEY
KEYED_FORMATS = ("upsert", "debezium")

ConnectorLookup = Callable[[str], "ConnectorSpec | None"]
_OPTION_IN_MESSAGE = re.compile(r"option '([^']+)'")


@dataclass
class _Definition:
    kind: str  # "source" (a CREATE TABLE or CREATE SOURCE: an input), "view" or "sink"
    parsed: ParsedSource | ParsedView | ParsedSink
    location: Location

    @property
    def declared(self) -> str:
        """What the statement declared, as messages name it: table, source, materialized view or sink."""
        if isinstance(self.parsed, ParsedSource):
            return self.parsed.kind
        return {"view": "materialized view"}.get(self.kind, self.kind)


class _Issues:
    def __init__(self) -> None:
        self.items: list[PipelineIssue] = []

    def add(self, file: str, line: int, message: str) -> None:
        self.items.append(PipelineIssue(file, line, message))

    def options(self, where: Location, options: Options, messages: list[str], prefix: str) -> None:
        """Option problems, each on the line of the option it names when it names one."""
        for message in messages:
            match = _OPTION_IN_MESSAGE.search(message)
            line = options.lines.get(match.group(1), where.line) if match else where.line
            self.add(where.file, line, f"{prefix}: {message}")


def load_pipeline(directory: Path | str, connector_spec: ConnectorLookup | None = None) -> Pipeline:
    """The pipeline defined by the ``*.sql`` files in ``directory`` (sorted by name, not recursive).

    ``connector_spec`` maps a source connector name to its spec (None if unknown); it defaults to
    the connector registry. Raises :class:`PipelineError` listing every problem found."""
    directory = Path(directory)
    files = _sql_files(directory)
    if connector_spec is None:
        from epochal.connectors.registry import connector_spec as registry_lookup

        connector_spec = registry_lookup

    issues = _Issues()
    definitions: list[_Definition] = []
    parsed_checks: list[tuple[str, ParsedCheck]] = []
    for path in files:
        file = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            issues.add(file, 1, f"cannot read the file ({error}); save it as UTF-8 text")
            continue
        statements, split_problems = split_statements(text)
        for problem in split_problems:
            issues.add(file, problem.line, problem.message)
        for statement in statements:
            check, problems = parse_check(statement) if is_check(statement) else (None, [])
            if check is not None or problems:  # (checks have a namespace of their own: pipeline/checks.py)
                parsed_checks += [(file, check)] if check is not None else []
                issues.items += [PipelineIssue(file, p.line, p.message) for p in problems]
                continue
            parsed, problems = parse_statement(statement)
            for problem in problems:
                issues.add(file, problem.line, problem.message)
            if parsed is not None:
                kind = {ParsedSource: "source", ParsedView: "view", ParsedSink: "sink"}[type(parsed)]
                definitions.append(_Definition(kind, parsed, Location(file, parsed.line)))
    if not definitions and not issues.items:
        raise PipelineError([PipelineIssue(str(directory), 0, _no_statements_message(directory))])

    named = resolve_shared_sources(_unique(definitions, issues), issues.add, connector_spec)
    sources = _sources(named, issues, connector_spec)
    failed: set[str] = set()
    views = _views(named, sources, issues, failed)
    sinks = _sinks(named, sources, views, issues, failed)
    checks = load_checks(parsed_checks, sources, views, failed, issues.add)
    if issues.items:
        order = {str(path): index for index, path in enumerate(files)}
        issues.items.sort(key=lambda issue: (order.get(issue.file, -1), issue.line))
        raise PipelineError(issues.items)
    from epochal.pipeline.builtin_checks import builtin_checks

    pipeline = Pipeline(directory=directory, sources=sources, views=views, sinks=sinks)
    return replace(pipeline, checks={**builtin_checks(pipeline), **checks})


def _sql_files(directory: Path) -> list[Path]:
    hint = f"set {PIPELINE_ENV} to the directory holding the pipeline's *.sql files"
    if not directory.exists():
        raise PipelineError([PipelineIssue(str(directory), 0, f"pipeline directory does not exist: {hint}")])
    if not directory.is_dir():
        raise PipelineError([PipelineIssue(str(directory), 0, f"pipeline path is not a directory: {hint}")])
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() == ".sql" and p.is_file())
    if not files:
        raise PipelineError([PipelineIssue(str(directory), 0, f"pipeline directory has no *.sql files: {hint}")])
    return files


def _no_statements_message(directory: Path) -> str:
    return (
        f"the *.sql files in {directory} define nothing: add CREATE TABLE or CREATE SOURCE, CREATE "
        f"MATERIALIZED VIEW and CREATE SINK statements, or set {PIPELINE_ENV} to another pipeline directory"
    )


#: what names of Epochal's own tables contain: a planner's stage, a changed view's shadow
RESERVED_NAME_PARTS = (STAGE_SEPARATOR, REBUILD_SEPARATOR)


def _unique(definitions: list[_Definition], issues: _Issues) -> dict[str, _Definition]:
    """First definition of each name; later ones are errors (names are shared by all kinds)."""
    named: dict[str, _Definition] = {}
    for definition in definitions:
        name = definition.parsed.name
        reserved = next((r for r in RESERVED_NAME_PARTS if r in name.lower()), None)
        if reserved is not None:
            issues.add(
                definition.location.file,
                definition.location.line,
                f"'{name}' contains '{reserved}', which Epochal reserves for the tables it makes of a view "
                "(the planner's stages, a changed view's new statement): rename it",
            )
            continue
        first = named.get(name)
        if first is None:
            named[name] = definition
            continue
        issues.add(
            definition.location.file,
            definition.location.line,
            f"'{name}' is already defined as a {first.declared} at {first.location}: "
            "tables, sources, views and sinks share one namespace, so rename or remove one of them",
        )
    return named


def _connector_names(lookup: ConnectorLookup) -> list[str]:
    """The registered connectors that ``lookup`` resolves (a test's fake lookup lists only its own)."""
    from epochal.connectors.registry import SOURCE_CONNECTORS

    return sorted(name for name in SOURCE_CONNECTORS if lookup(name) is not None)


def _sources(named: dict[str, _Definition], issues: _Issues, lookup: ConnectorLookup) -> dict[str, SourceDef]:
    sources: dict[str, SourceDef] = {}
    for definition in named.values():
        if definition.kind != "source":
            continue
        parsed = definition.parsed
        require(isinstance(parsed, ParsedSource), "a source definition holds a parsed source")
        where = definition.location
        prefix = f"{parsed.kind} {parsed.name}"
        connector = parsed.options.values.get("connector", "").lower()
        if parsed.primary_key and parsed.kind != "table":
            # RisingWave's rule: upserts and deletes by key replace stored rows, and a table is what
            # stores its rows (a source stores nothing unless a view reads it as state).
            issues.add(
                where.file,
                parsed.primary_key_line,
                f"{prefix}: a SOURCE cannot have a PRIMARY KEY: upserts and deletes by key need the rows "
                f"stored, which is what a TABLE does; declare it as CREATE TABLE {parsed.name} (..., "
                f"PRIMARY KEY ({', '.join(parsed.primary_key)})) WITH (...)",
            )
        elif parsed.primary_key and not SOURCE_PRIMARY_KEY_SUPPORTED:
            issues.add(
                where.file,
                parsed.primary_key_line,
                f"{prefix}: PRIMARY KEY on a table is not supported yet (inputs are append-only for now): remove it",
            )
        elif parsed.primary_key:
            for message in _source_key_problems(parsed, connector, lookup):
                issues.add(where.file, parsed.primary_key_line, f"{prefix}: {message}")
        fmt = parsed.options.values.get(FORMAT_KEY, "").lower()
        if fmt in KEYED_FORMATS and not parsed.primary_key:
            issues.add(
                where.file,
                parsed.options.lines.get(FORMAT_KEY, where.line),
                f"{prefix}: FORMAT {fmt.upper()} upserts and deletes rows by key: declare it as CREATE TABLE "
                f"{parsed.name} (..., PRIMARY KEY (column, ...)) WITH (...), or use FORMAT PLAIN",
            )
        for message in internal_source_columns(parsed):
            issues.add(where.file, where.line, f"{prefix}: {message}")
        spec = lookup(connector) if connector else None
        if spec is None:
            supported = ", ".join(_connector_names(lookup)) or "none registered"
            line = parsed.options.lines.get("connector", where.line)
            if connector:
                message = f"unknown connector '{connector}': use connector = one of {supported}"
            elif parsed.kind == "table":
                # RisingWave's table without a connector is filled by INSERT statements
                message = (
                    "a table without WITH (connector = ...) is filled by INSERT, and Epochal has no INSERT "
                    f"path yet: add WITH (connector = '...', ...) to read its rows (one of {supported})"
                )
            else:
                message = f"no connector option: use connector = one of {supported}"
            issues.add(where.file, line, f"{prefix}: {message}")
        else:
            # the same options the connector's create() will get, 'connector' included
            problems = spec.validate(parsed.columns, parsed.options.values)
            issues.options(where, parsed.options, problems, prefix)
        sources[parsed.name] = SourceDef(
            name=parsed.name,
            columns=parsed.columns,
            connector=connector,
            options=dict(parsed.options.values),
            location=where,
            kind="table" if parsed.kind == "table" else "source",
            # a keyed SOURCE is refused above; dropping its key keeps the definition consistent
            primary_key=parsed.primary_key if parsed.kind == "table" else (),
        )
    return sources


def _source_key_problems(parsed: ParsedSource, connector: str, lookup: ConnectorLookup) -> list[str]:
    """What is wrong with a table's PRIMARY KEY. A key column that is not declared is reported by
    the parser already (with the declared columns), so it is not repeated here."""
    problems = []
    if connector and lookup(connector) is not None and connector not in SOURCE_PRIMARY_KEY_CONNECTORS:
        # an unknown connector has its own error; a key means nothing without one
        takers = ", ".join(sorted(SOURCE_PRIMARY_KEY_CONNECTORS))
        problems.append(f"the {connector} connector is append-only: remove PRIMARY KEY (only {takers} tables take one)")
    for key in sorted({k for k in parsed.primary_key if parsed.primary_key.count(k) > 1}):
        problems.append(f"PRIMARY KEY names column '{key}' twice: list it once")
    return problems


def _views(
    named: dict[str, _Definition], sources: dict[str, SourceDef], issues: _Issues, failed: set[str]
) -> dict[str, ViewDef]:
    """The views, planned; ``failed`` gets the name of every view that did not load (its own error is
    reported, or that of a view it reads), so that nothing downstream reasons from a broken view."""
    # sqlglot is imported here so that importing the loader stays cheap
    from epochal.pipeline.query_checks import analyze_query, resolve_columns

    parsed_views = {name: d for name, d in named.items() if d.kind == "view" and isinstance(d.parsed, ParsedView)}
    analyses: dict[str, QueryAnalysis] = {}
    for name, definition in parsed_views.items():
        parsed = definition.parsed
        require(isinstance(parsed, ParsedView), "a view definition holds a parsed view")
        where = definition.location
        reported = len(issues.items)
        messages = view_option_problems(parsed.options)
        refresh = refresh_mode(parsed.options)
        if refresh not in REFRESH_MODES:
            messages.append(f"refresh = '{refresh}' is not a refresh mode: use refresh = 'incremental' or 'full'")
        if min_max_cache(parsed.options.values) is None:
            from epochal.incremental.plan import DEFAULT_MIN_MAX_CACHE

            low, high = MIN_MAX_CACHE_RANGE
            messages.append(
                f"min_max_cache = '{parsed.options.values['min_max_cache']}' is not a number of values to keep "
                f"per group: use a whole number from {low} to {high} (default {DEFAULT_MIN_MAX_CACHE})"
            )
        rate = parsed.options.values.get("backfill_rate_limit")
        if rate is not None:
            try:
                if float(rate) < 0:
                    raise ValueError
            except ValueError:
                messages.append(
                    f"backfill_rate_limit = '{rate}' is not a rate: give rows per second, a number >= 0 (0 pauses)"
                )
        issues.options(where, parsed.options, messages, f"view {name}")
        analysis = analyze_query(name, parsed.query_text, parsed.query_line, full_refresh=refresh == "full")
        analyses[name] = analysis
        for problem in analysis.problems:
            issues.add(where.file, problem.line, problem.message)
        for ref in analysis.tables:
            message = _unknown_table(ref.name, f"view {name}", named)
            if message:
                issues.add(where.file, ref.line, message)
        if len(issues.items) > reported:
            failed.add(name)

    upstreams = {name: [ref.name for ref in a.tables] for name, a in analyses.items()}
    for cycle in view_cycles(list(parsed_views), upstreams):
        failed.update(cycle)
        first = parsed_views[cycle[0]].location
        issues.add(
            first.file,
            first.line,
            f"views form a cycle: {' -> '.join(cycle)} (each reads the next): a view cannot read "
            "itself, directly or through other views; break the cycle",
        )

    # Columns resolve in dependency order; a view whose upstream is unknown, broken or in a
    # cycle is skipped, as its root cause is already reported.
    schema: dict[str, tuple[str, ...]] = {name: s.column_names for name, s in sources.items()}
    columns: dict[str, tuple[str, ...]] = {}
    pending = [name for name, a in analyses.items() if a.tree is not None]
    while ready := [name for name in pending if all(u in schema for u in upstreams[name])]:
        for name in ready:
            pending.remove(name)
            definition = parsed_views[name]
            parsed = definition.parsed
            tree = analyses[name].tree
            require(isinstance(parsed, ParsedView) and tree is not None, "a view was parsed and analysed")
            resolution = resolve_columns(name, tree, parsed.query_text, parsed.query_line, schema)
            for problem in resolution.problems:
                issues.add(definition.location.file, problem.line, problem.message)
            if resolution.columns == ():
                # (sqlglot reads `SELECT FROM t` as a query of no columns, which the planner cannot take)
                issues.add(
                    definition.location.file,
                    parsed.query_line,
                    f"view {name}: the query selects no column: list the columns it returns, e.g. SELECT id FROM ...",
                )
            elif resolution.columns is not None:
                schema[name] = columns[name] = resolution.columns
                for message in internal_view_columns(name, resolution.columns):
                    issues.add(definition.location.file, definition.location.line, message)
                    failed.add(name)
    failed.update(name for name in parsed_views if name not in columns)  # unresolved: it or an upstream failed

    views: dict[str, ViewDef] = {}
    for name, definition in parsed_views.items():
        parsed = definition.parsed
        require(isinstance(parsed, ParsedView), "a view definition holds a parsed view")
        view = ViewDef(
            name=name,
            query=(analyses[name].canonical or parsed.query_text).strip(),
            upstreams=tuple(upstreams[name]),
            columns=columns.get(name, ()),
            options=dict(parsed.options.values),
            location=definition.location,
            refresh=refresh_mode(parsed.options),
        )
        tree = analyses[name].tree
        if view.refresh == "incremental" and tree is not None and name in columns:
            reported = len(issues.items)
            planned = _planned_views(view, tree, parsed, schema, issues)
            views.update(planned)
            if len(issues.items) > reported:
                failed.add(name)
        else:
            views[name] = view
    # A view that reads a failed view fails with it (its columns may resolve, its plan cannot run).
    while spread := {n for n in parsed_views if n not in failed and failed.intersection(upstreams[n])}:
        failed.update(spread)
    return views


def _planned_views(
    view: ViewDef, tree: Any, parsed: ParsedView, schema: dict[str, tuple[str, ...]], issues: _Issues
) -> dict[str, ViewDef]:
    """``view`` with its incremental plan, preceded by the internal stages the planner split off."""
    import sqlglot

    from epochal.incremental.plan import DEFAULT_MIN_MAX_CACHE, Unmaintainable
    from epochal.incremental.planner import plan_query
    from epochal.pipeline.query_checks import DIALECT, problem_at, qualify_query

    cache = min_max_cache(view.options) or DEFAULT_MIN_MAX_CACHE  # a bad value is reported already
    try:
        planned = plan_query(view.name, qualify_query(tree, schema), schema, view.internal_of is not None, cache)
    except Unmaintainable as refusal:
        problem = problem_at(view.name, parsed.query_text, parsed.query_line, refusal.node, refusal.message)
        issues.add(view.location.file, problem.line, problem.message)
        return {view.name: view}
    except sqlglot.errors.UnsupportedError as unsupported:
        # The plan's SQL is generated, and sqlglot could not write part of the query for Spark
        # (the dialect raises rather than write SQL that means something else).
        message = (
            f"view {view.name}: part of the query cannot be planned, because it cannot be written back as Spark "
            f"SQL ({str(unsupported).strip()}): write that part another way, or add WITH (refresh = 'full') to run "
            "the query as written every epoch"
        )
        issues.add(view.location.file, parsed.query_line, message)
        return {view.name: view}
    result: dict[str, ViewDef] = {}
    for stage in planned.stages:
        schema[stage.name] = stage.columns
        stage_view = ViewDef(
            name=stage.name,
            query=stage.query,
            upstreams=stage.upstreams,
            columns=stage.columns,
            # what the stage keeps follows the view's own options
            options={k: v for k, v in view.options.items() if k == "min_max_cache"},
            location=view.location,
            internal_of=view.name,
        )
        # A stage is a view of its own: planned (and possibly split) the same way.
        result.update(_planned_views(stage_view, sqlglot.parse_one(stage.query, read=DIALECT), parsed, schema, issues))
    if planned.plan.query:  # what the planned query reads: leaves, or the stages of a linear rest
        upstreams = tuple(dict.fromkeys(u for leaf in planned.plan.leaves for u in leaf.upstreams))
        if not planned.plan.leaves:
            read = sqlglot.parse_one(planned.plan.query, read=DIALECT).find_all(sqlglot.exp.Table)
            upstreams = tuple(dict.fromkeys(t.name.lower() for t in read))
        elif not upstreams:  # only VALUES: a view is refused by its analysis, a stage here
            if view.internal_of is not None:
                message = (
                    "part of the query joins only VALUES, whose rows never change, so it cannot be a stage of its "
                    "own: join the VALUES in a subquery in FROM (one constant input), or add WITH (refresh = 'full')"
                )
                problem = problem_at(view.internal_of, parsed.query_text, parsed.query_line, None, message)
                issues.add(view.location.file, problem.line, problem.message)
            return {view.name: view}
    else:
        upstreams = view.upstreams
    result[view.name] = replace(view, upstreams=upstreams, plan=planned.plan)
    return result


def _unknown_table(name: str, reader: str, named: dict[str, _Definition]) -> str | None:
    """Why ``name`` cannot be read by ``reader``, or None when it is a table, source or view."""
    definition = named.get(name)
    if definition is not None and definition.kind in ("source", "view"):
        return None
    if definition is not None:
        return f"{reader}: '{name}' is a sink, which cannot be read: read a table, a source or a materialized view"
    readable = sorted(n for n, d in named.items() if d.kind in ("source", "view"))
    close = difflib.get_close_matches(name, readable, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"defined: {', '.join(readable) or 'none'}"
    return f"{reader}: unknown table '{name}' (not a table, source or materialized view): {hint}"


#: How alike a missing name and a defined one must be to be offered as a typo (difflib's ratio).
SINK_TYPO_CUTOFF = 0.8


def _sink_reads_nothing(sink: str, table: str, named: dict[str, _Definition]) -> str:
    """A sink reads a name nothing defines: most often its view was removed, sometimes a typo. A loose
    "did you mean" (an unrelated table) would point the sink at other data, so only a close one is offered."""
    readable = sorted(n for n, d in named.items() if d.kind in ("source", "view"))
    close = difflib.get_close_matches(table, readable, n=1, cutoff=SINK_TYPO_CUTOFF)
    typo = f"did you mean '{close[0]}'? " if close else ""
    return (
        f"sink {sink}: reads '{table}', which is not defined (no table, source or materialized view has that "
        f"name): {typo}if you removed that view, remove this sink too (its CREATE SINK statement), or point its "
        f"FROM at another table (defined: {', '.join(readable) or 'none'})"
    )


def _sinks(
    named: dict[str, _Definition],
    sources: dict[str, SourceDef],
    views: dict[str, ViewDef],
    issues: _Issues,
    failed: set[str],
) -> dict[str, SinkDef]:
    sinks: dict[str, SinkDef] = {}
    # A view that failed to load proves nothing, and its columns would mislead the proof of the others.
    keys = _ProvenKeys(sources, {name: view for name, view in views.items() if name not in failed})
    for definition in named.values():
        if definition.kind != "sink":
            continue
        parsed = definition.parsed
        require(isinstance(parsed, ParsedSink), "a sink definition holds a parsed sink")
        where = definition.location
        prefix = f"sink {parsed.name}"
        message = _unknown_table(parsed.from_table, prefix, named)
        if message and parsed.from_table not in named:
            message = _sink_reads_nothing(parsed.name, parsed.from_table, named)
        if message:
            issues.add(where.file, parsed.from_line, message)
        if parsed.from_table in sources:
            upstream_columns: tuple[str, ...] = sources[parsed.from_table].column_names
        elif parsed.from_table in views and views[parsed.from_table].columns:
            upstream_columns = views[parsed.from_table].columns
        else:
            # Upstream columns unknown (its own error is reported): check everything else by
            # treating the declared key columns as present.
            upstream_columns = primary_key_columns(parsed.options.values)
        connector = parsed.options.values.get("connector", "").lower()
        if not connector:
            issues.add(
                where.file,
                where.line,
                f"{prefix}: no connector option: add connector = '...' (e.g. connector = 'duckdb')",
            )
        else:
            problems = validate_sink(connector, parsed.options.values, upstream_columns, parsed.name)
            upsert = parsed.options.values.get("type") == "upsert"
            if not problems and upsert and parsed.from_table in keys.tables:
                problems += _sink_key_problems(parsed.from_table, primary_key_columns(parsed.options.values), keys)
            elif not problems and upsert and parsed.from_table in failed:
                problems.append(
                    f"waits on view {parsed.from_table}, which did not load (the error is reported on it or on a "
                    f"view it reads): fix that, and the sink's primary_key is checked against {parsed.from_table} then"
                )
            issues.options(where, parsed.options, problems, prefix)
        sinks[parsed.name] = SinkDef(
            name=parsed.name,
            from_table=parsed.from_table,
            connector=connector,
            options=dict(parsed.options.values),
            location=where,
        )
    return sinks


class _ProvenKeys:
    """The unique keys each table provably has (``epochal/pipeline/keys.py``), computed on demand."""

    def __init__(self, sources: dict[str, SourceDef], views: dict[str, ViewDef]):
        self.sources, self.views = sources, views
        self.tables = {*sources, *views}
        self._known: dict[str, list[frozenset[str]]] = {}

    def __call__(self, table: str) -> list[frozenset[str]]:
        from epochal.pipeline.keys import unique_keys

        if table not in self._known:
            self._known[table] = []  # a cycle (reported elsewhere) proves nothing
            if table in self.sources:
                key = self.sources[table].primary_key
                self._known[table] = [frozenset(c.lower() for c in key)] if key else []
            elif table in self.views:
                # The query as written reads the views it names, not the stages a split put between.
                schema = {
                    **{name: list(source.column_names) for name, source in self.sources.items()},
                    **{name: list(view.columns) for name, view in self.views.items()},
                }
                self._known[table] = unique_keys(self.views[table].query, schema, self)
        return self._known[table]


def _sink_key_problems(table: str, sink_key: tuple[str, ...], keys: _ProvenKeys) -> list[str]:
    from epochal.pipeline.keys import covered

    proven = keys(table)
    if covered(sink_key, proven):
        return []
    shown = " or ".join(f"({', '.join(sorted(k))})" if k else "() (it has one row)" for k in proven)
    can = f"the keys Epochal can prove for {table} are {shown}" if proven else f"Epochal can prove no key of {table}"
    return [
        f"primary_key ({', '.join(sink_key)}) is not a unique key of {table}: two of its rows could share it, "
        f"and an upsert sink would keep whichever came last (and a delete by key could remove a row the other "
        f"still justifies). {can[0].upper()}{can[1:]}: key the sink by one of them, make {table} unique by "
        f"your key (GROUP BY {', '.join(sink_key)}, SELECT DISTINCT, or a PRIMARY KEY on its table), or use "
        "type = 'append-only'"
    ]
