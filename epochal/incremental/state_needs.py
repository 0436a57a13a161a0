"""Which inputs a view's epochs read as state, and so which SOURCEs must keep their rows.

In RisingWave a SOURCE stores nothing: views read its connector. Epochal's epoch still writes a
SOURCE's records once per epoch as a change file, which every view reading it shares (one read of
the connector however many views read it), but keeps the rows only while something needs them:

* a view's epoch that reads only its inputs' change (a linear view; a partial aggregate over an
  input that only appends, which never has to rebuild a group from its input) needs nothing
  after the epoch commits;
* a view that reads an input's state (a join, a top-N, a recompute, ``refresh = 'full'``) needs
  the input's rows at every epoch: then the SOURCE stores them, as a TABLE does.

A SOURCE no view reads as state keeps its change files only until its sinks delivered them and
no backfill reads them; its rows at an epoch, when something asks (``epochal query``, a new sink's
snapshot, a view added later that reads it as state), are read back from its connector at the
offsets the epochs fixed (:mod:`epochal.runtime.source_history`). Getting this wrong costs speed, never
correctness: a state read of a SOURCE whose files are gone goes to its connector.
"""

from __future__ import annotations

from epochal.incremental.plan import PARTIAL_RULE
from epochal.pipeline.model import Pipeline, ViewDef


def inputs_read_as_state(view: ViewDef, append_only: set[str]) -> set[str]:
    """The inputs of ``view`` whose rows (not only their change) an epoch of it may read.
    ``append_only``: inputs that never delete a row."""
    if view.refresh == "full":
        return set(view.upstreams)
    plan = view.plan
    if plan is None or plan.kind == "linear":
        return set()
    if plan.rule == PARTIAL_RULE:
        # A group is rebuilt from its input only when a kept MIN/MAX value or a float in a sum is
        # deleted: an input that only appends never deletes one.
        return {u for u in view.upstreams if u not in append_only}
    return set(view.upstreams)


def sources_kept_as_state(pipeline: Pipeline) -> set[str]:
    """The SOURCEs (``CREATE SOURCE``) some view reads as state: they keep their rows like tables."""
    sources = {name for name, s in pipeline.sources.items() if s.kind == "source"}
    read = set()
    for view in pipeline.views.values():
        read |= inputs_read_as_state(view, sources)
    return sources & read


def sources_storing_nothing(pipeline: Pipeline) -> set[str]:
    """The SOURCEs whose rows are read back from their connector instead of kept."""
    sources = {name for name, s in pipeline.sources.items() if s.kind == "source"}
    return sources - sources_kept_as_state(pipeline)
