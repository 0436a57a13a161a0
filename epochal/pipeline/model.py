"""The parsed pipeline: tables and sources, materialized views and sinks, each with where it was defined."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from epochal.incremental.plan import Plan


#: Internal stage views the planner splits off a view are named ``{view}{STAGE_SEPARATOR}{n}``.
STAGE_SEPARATOR = "__stage"
#: a changed view's new statement backfills as ``view`` + this (:mod:`epochal.checkpoint.statements.rebuilds`)
REBUILD_SEPARATOR = "__rebuild"
#: while it does, the old statement's internal stages live on as ``view`` + this + ``__stage{n}``
#: (reserved too: it contains REBUILD_SEPARATOR)
OLD_VERSION_SEPARATOR = "__rebuild_old"


def old_version_name(view: str, table: str) -> str:
    """The name ``table`` (``view`` or one of its stages) has in the old version of a rebuilt view."""
    if table != view and not table.startswith(f"{view}{STAGE_SEPARATOR}"):
        raise ValueError(f"{table} is neither {view} nor one of its stages")
    return f"{view}{OLD_VERSION_SEPARATOR}{table[len(view):]}"


@dataclass(frozen=True)
class Location:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Column:
    name: str
    #: Spark SQL DDL type, upper case: BIGINT, INT, DOUBLE, STRING, TIMESTAMP, BOOLEAN, DATE, DECIMAL(p,s)...
    type: str
    #: the name as the DDL spelled it, when that differs from ``name`` (lower case: SQL names are
    #: case-insensitive): a record's field is looked up by this spelling (JSON keys are not)
    spelled: str = ""

    @property
    def key(self) -> str:
        """The field name a record carries this column under."""
        return self.spelled or self.name


@dataclass(frozen=True)
class SourceDef:
    """An input: a CREATE TABLE or a CREATE SOURCE (``kind``), read through its connector."""

    name: str
    columns: tuple[Column, ...]
    connector: str
    #: option keys lower-cased, values as written (quotes removed)
    options: Mapping[str, str]
    location: Location
    #: as declared. As in RisingWave a table stores its rows, and a source stores nothing unless a
    #: view reads it as state (epochal/incremental/state_needs.py); only a table may have a PRIMARY KEY
    kind: Literal["table", "source"] = "source"
    primary_key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("table", "source"):
            raise ValueError(f"{self.name}: kind must be 'table' or 'source', not {self.kind!r}")
        if self.primary_key and self.kind != "table":
            raise ValueError(f"source {self.name}: a PRIMARY KEY needs kind 'table' (upserts replace stored rows)")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True)
class ViewDef:
    name: str
    #: the SELECT (Spark SQL) exactly as written after AS
    query: str
    #: names of the sources/views the query reads, in first-mention order
    upstreams: tuple[str, ...]
    #: output column names, in order
    columns: tuple[str, ...]
    options: Mapping[str, str]
    location: Location
    #: 'incremental' (from the change of its inputs) or 'full' (recompute every epoch and diff)
    refresh: str = "incremental"
    #: how an incremental view is maintained (:mod:`epochal.incremental.planner`); None for full
    plan: Plan | None = None
    #: for an internal stage the planner split off a view: that view's name
    internal_of: str | None = None


@dataclass(frozen=True)
class SinkDef:
    name: str
    from_table: str
    connector: str
    options: Mapping[str, str]
    location: Location


#: a check's severity (CREATE CHECK ... WITH (severity = ...), epochal/pipeline/checks.py)
Severity = Literal["error", "warn"]


@dataclass(frozen=True)
class CheckDef:
    """A CREATE CHECK, or a built-in check (docs/checks.md)."""

    name: str
    #: the table, source or view whose committed state the query reads
    table: str
    severity: Severity
    #: Spark SQL returning the offending rows (no rows: the check passes)
    query: str
    location: Location
    #: built in (a view's provable row count) rather than declared
    builtin: bool = False
    #: other tables the query reads (a built-in check's input); a declared check reads only ``table``
    also_reads: tuple[str, ...] = ()
    #: a built-in row-count check's proven relation of ``table``'s rows to its input's (the one of
    #: ``also_reads``): "equal", "at_most", or "at_most_some" (and some when the input has rows)
    row_count: str = ""

    @property
    def holds_sinks(self) -> bool:
        return self.severity == "error"


@dataclass(frozen=True)
class Pipeline:
    directory: Path
    sources: Mapping[str, SourceDef] = field(default_factory=dict)
    views: Mapping[str, ViewDef] = field(default_factory=dict)
    sinks: Mapping[str, SinkDef] = field(default_factory=dict)
    #: CREATE CHECKs (epochal/pipeline/checks.py), by name
    checks: Mapping[str, CheckDef] = field(default_factory=dict)
    #: when the files were read: a table retired after that is stale in this pipeline, not re-added
    loaded_at: float = field(default_factory=time.time, compare=False)

    @property
    def tables(self) -> list[str]:
        """Sources then views, views in dependency order: the state tables the controller aligns."""
        return [*self.sources, *self.view_order()]

    def view_order(self) -> list[str]:
        """Views topologically sorted (upstreams first); ties keep definition order."""
        done: set[str] = set(self.sources)
        order: list[str] = []
        pending = list(self.views)
        while pending:
            progressed = False
            for name in list(pending):
                if all(u in done for u in self.views[name].upstreams):
                    order.append(name)
                    done.add(name)
                    pending.remove(name)
                    progressed = True
            if not progressed:  # the loader rejects cycles; this guards direct construction
                raise ValueError(f"cycle among views: {pending}")
        return order

    def append_only(self, table: str) -> bool:
        """Whether ``table``'s changes should only ever insert: a source without a PRIMARY KEY (its
        connector appends), or a linear view over such tables (a linear query maps inserts to
        inserts). A planning hint, not a guarantee: a view whose statement changes emits the
        difference at its switch, deletes included, so what relies on this must stay correct,
        only slower, when a delete comes anyway."""
        if table in self.sources:
            return not self.sources[table].primary_key
        view = self.views.get(table)
        if view is None or view.refresh == "full" or view.plan is None or view.plan.kind != "linear":
            return False
        return all(self.append_only(u) for u in view.upstreams)

    def checks_holding(self, sink: str) -> list[CheckDef]:
        """The ``error`` checks on the sink's table or on any table it reads, transitively: a
        failure of one at an epoch holds that epoch back from the sink."""
        seen: set[str] = set()
        pending = [self.sinks[sink].from_table]
        while pending:
            table = pending.pop()
            if table not in seen:
                seen.add(table)
                pending.extend(self.upstreams(table))
        return [c for c in self.checks.values() if c.holds_sinks and c.table in seen]

    def upstreams(self, table: str) -> tuple[str, ...]:
        if table in self.views:
            return self.views[table].upstreams
        return ()
