"""Columns a pipeline may not declare or select: the names Epochal uses for its own columns
(:data:`epochal.sql.INTERNAL_COLUMNS`), which would be overwritten or read in Epochal's place,
corrupting results without an error. The loader refuses them, naming the use and the rename."""

from __future__ import annotations

from epochal.pipeline.ddl import ParsedSource
from epochal.sql import internal_name_use, quote


def internal_source_columns(parsed: ParsedSource) -> list[str]:
    """A declared column whose name Epochal uses for its own columns (epochal.sql.INTERNAL_COLUMNS):
    it would be overwritten or read in Epochal's place, corrupting results without an error."""
    problems = []
    keyed = bool(parsed.primary_key) and parsed.kind == "table"
    for column in parsed.columns:
        use = internal_name_use(column.name, keyed=keyed)
        if use is not None:
            problems.append(
                f"column '{column.name}' is reserved: Epochal uses it for {use}; leave it out of the "
                "declaration (fields a record has but the declaration lacks are ignored) or rename the field in "
                "the records"
            )
    return problems


def internal_view_columns(name: str, columns: tuple[str, ...]) -> list[str]:
    """A view's output column named as one of Epochal's own (see :func:`internal_source_columns`)."""
    problems = []
    for column in columns:
        use = internal_name_use(column)
        if use is not None:
            rename = f"{column.strip('_') or 'column'}_user"
            problems.append(
                f"view {name}: column '{column}' is reserved: Epochal uses it for {use}; rename it in the "
                f"view's SELECT, e.g. SELECT {quote(column, when_needed=True)} AS {rename}"
            )
    return problems
