"""How tables are laid out in snapshots, and the compaction step that writes them: which columns a
table's vnodes hash (the key it is most often read by) and which tables an epoch's compaction
snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from epochal.runtime.report import StepReport
from epochal.sql import unquote

if TYPE_CHECKING:
    from epochal.pipeline.model import Pipeline, ViewDef
    from epochal.runtime.context import StepContext


def distribution_key(pipeline: Pipeline, old_versions: Mapping[str, ViewDef], table: str) -> tuple[str, ...]:
    """The columns whose hash places ``table``'s rows in snapshot vnodes. A read restricted by
    exactly these columns opens only the restriction keys' vnodes (``read_state``), so they are
    the columns the table is most often read by: a source's PRIMARY KEY (every epoch of a keyed
    source looks up its previous rows by it), else the key the first incremental view that
    reads the whole table restricts it by, else () meaning every column. ``old_versions``: the
    old statements of views being rebuilt (``EpochRuntime.old_versions``)."""
    source = pipeline.sources.get(table)
    if source is not None and source.primary_key:
        return tuple(source.primary_key)
    # A changed view, and its old stages, hold the old statement's rows until the switch.
    views = {**pipeline.views, **old_versions}
    own = views[table].plan if table in views else None
    if own is not None and own.aggregate is not None:
        return own.aggregate.groups  # every epoch reads its own rows at the groups it touches
    # (the new statements first: a table both read is laid out for the version that stays)
    for view in [*(pipeline.views[n] for n in pipeline.view_order()), *old_versions.values()]:
        plan = view.plan
        for leaf in plan.leaves if plan is not None else ():
            if leaf.table == table and leaf.key:
                return tuple(unquote(k) for k in leaf.key)
    return ()


def compact(
    ctx: StepContext,
    mirrors: bool,
    epoch: int | None = None,
    tables: list[str] | None = None,
    every: int | None = None,
) -> StepReport:
    """Snapshot the tables that need it (``epochal/storage/compaction.py``); never raises for a
    table's failure, which is logged and reported in the metadata: the epoch is committed.
    ``mirrors``: large snapshots get a DuckDB mirror (only the driver path reads them)."""
    from epochal.incremental.state_needs import sources_storing_nothing
    from epochal.storage.compaction import Layout, compact_tables

    pipeline, settings = ctx.pipeline, ctx.settings
    # A backfilling view's state is not at the committed epoch yet: it is snapshotted once it joins.
    outside = ctx.controller.outside_alignment()
    # The stages of an old statement maintained until its view switches are read every epoch
    # too: without snapshots a long rebuild would make each epoch read more change files.
    old_stages = [t for t in ctx.old_versions if t not in pipeline.tables]
    layout = Layout(
        [*(t for t in pipeline.tables if t not in outside), *old_stages],
        ctx.distribution_key,
        lambda table: [name for name, sink in pipeline.sinks.items() if sink.from_table == table],
        frozenset(sources_storing_nothing(pipeline)),
        settings.snapshot_directory_rows,
        mirrors=mirrors,
    )
    report = compact_tables(
        ctx.reader,
        layout,
        every=settings.compact_every if every is None else every,
        tables=tables,
        prune=ctx.controller.prune_history,
        grace_s=settings.retention_grace_s,
        # the pass after each epoch spreads the tables over epochs; `epochal compact` does them all
        spread=every is None and tables is None,
    )
    # Named as the shell's asset, like "epoch_commit": the report becomes its materialization.
    at = epoch if epoch is not None else (report.committed_epoch or 0)
    return StepReport("epoch_compaction", at, report.metadata)
