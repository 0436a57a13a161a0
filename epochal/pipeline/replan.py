"""Planning one view statement again, outside a pipeline's files: the old statement of a view
being rebuilt is kept in the meta store and maintained until the switch (:mod:`epochal.runtime.rebuild_step`).
The planning is the loader's own, statement by statement."""

from __future__ import annotations

from epochal.errors import PipelineError, PipelineIssue
from epochal.pipeline.ddl import Options, ParsedView
from epochal.pipeline.loader import _Issues, _planned_views
from epochal.pipeline.model import Location, Pipeline, ViewDef


def plan_statement(
    name: str, query: str, options: dict[str, str], refresh: str, pipeline: Pipeline, location: Location
) -> dict[str, ViewDef]:
    """View ``name`` as ``query`` defines it over ``pipeline``'s tables, planned as
    :func:`load_pipeline` plans a statement: the view, after the internal stages the planner split
    off. A statement kept from an earlier version of the pipeline is planned again this way (the
    old rows of a rebuilt view are maintained with it). Raises :class:`PipelineError` with its problems."""
    from epochal.pipeline.query_checks import analyze_query, resolve_columns

    issues = _Issues()
    analysis = analyze_query(name, query, 1, full_refresh=refresh == "full")
    for problem in analysis.problems:
        issues.add(location.file, location.line, problem.message)
    schema: dict[str, tuple[str, ...]] = {n: s.column_names for n, s in pipeline.sources.items()}
    schema.update({n: v.columns for n, v in pipeline.views.items() if n != name})
    missing = sorted({ref.name for ref in analysis.tables} - set(schema))
    if missing:
        issues.add(location.file, location.line, f"view {name} reads {', '.join(missing)}, not in the pipeline")
    tree = analysis.tree
    if tree is None or issues.items:
        raise PipelineError(issues.items or [PipelineIssue(location.file, location.line, f"view {name} has no query")])
    resolution = resolve_columns(name, tree, query, 1, schema)
    for problem in resolution.problems:
        issues.add(location.file, location.line, problem.message)
    if resolution.columns is None or issues.items:
        raise PipelineError(issues.items)
    view = ViewDef(
        name=name,
        query=query.strip(),
        upstreams=tuple(dict.fromkeys(ref.name for ref in analysis.tables)),
        columns=resolution.columns,
        options=dict(options),
        location=location,
        refresh=refresh,
    )
    if refresh != "incremental":
        return {name: view}
    schema[name] = resolution.columns
    parsed = ParsedView(name, location.line, Options(dict(options)), query, 1)
    planned = _planned_views(view, tree, parsed, schema, issues)
    if issues.items:
        raise PipelineError(issues.items)
    return planned
