"""The controller's statement methods: what a step must know of its table's statement (retired,
rebuilt, backfilling, stored), the rebuild of a changed view, a source's offsets read again, and the
tables and sinks that left the pipeline. Each is one meta-store transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint import queries as q
from epochal.checkpoint.backfills import rows as backfill_rows
from epochal.checkpoint.statements import edits, rebuilds, retirement
from epochal.checkpoint.statements import sources as source_declarations
from epochal.checkpoint.statements import views as definitions

if TYPE_CHECKING:
    from epochal.checkpoint.backfills.state import Backfill
    from epochal.checkpoint.statements.sinks import SinkRecipe
    from epochal.connectors.base import SplitRange
    from epochal.meta.backend import Backend, Cursor


@dataclass(frozen=True)
class ViewStepFacts:
    """What every view step asks before it runs, read in one transaction."""

    rebuild: rebuilds.Rebuild | None
    backfill: Backfill | None
    retired: bool
    #: (fingerprint, recorded at) of the statement the view's state comes from
    stored: tuple[str, float | None] | None


@dataclass(frozen=True)
class SourceStepFacts:
    """What every source step asks before it runs, read in one transaction."""

    retired: bool
    #: (declaration, recorded at) the source's stored rows were decoded by
    declaration: tuple[str, float | None] | None


@dataclass(frozen=True)
class OldStatementBlockers:
    """What an old statement maintained during its view's rebuild needs: the tables with state, and
    those backfilling, being rebuilt or retired (their changes are of another version)."""

    stored: set[str]
    blocked: set[str]


class StatementMethods:
    backend: Backend

    # ------------------------------------------------------------------ what a step asks first

    def view_step_facts(self, view: str) -> ViewStepFacts:
        """The view's rebuild, backfill, retirement and stored statement."""
        return self.backend.transaction(
            lambda cur: ViewStepFacts(
                rebuilds.read(cur, view),
                backfill_rows.read(cur, view),
                backfill_rows.is_retired(cur, view),
                definitions.stored_statement(cur, view),
            )
        )

    def source_step_facts(self, source: str) -> SourceStepFacts:
        """Whether the source was retired, and the declaration its stored rows were decoded by."""
        return self.backend.transaction(
            lambda cur: SourceStepFacts(backfill_rows.is_retired(cur, source), source_declarations.stored(cur, source))
        )

    def stored_statement(self, view: str) -> tuple[str, float | None] | None:
        """(fingerprint, recorded at) of the statement the view's state comes from, or None."""
        return self.backend.transaction(lambda cur: definitions.stored_statement(cur, view))

    def backfills_joined_before(self, tables: Iterable[str], epoch: int) -> list[str]:
        """Of ``tables``, those that joined by backfill while ``epoch`` was in flight."""
        return self.backend.transaction(lambda cur: backfill_rows.joined_before(cur, tables, epoch))

    # ------------------------------------------------------------------ a source read again

    def source_offsets(self, epoch: int, source: str) -> list[SplitRange]:
        """The offset ranges ``epoch`` fixed for ``source``'s splits."""
        return self.backend.transaction(lambda cur: q.offsets(cur, epoch, source))

    def source_history(self, source: str, epoch: int, inclusive: bool) -> list[SplitRange] | None:
        """Every range ``source``'s splits took up to ``epoch``, or None when its offsets are gone."""
        return self.backend.transaction(lambda cur: q.source_history(cur, source, epoch, inclusive))

    # ------------------------------------------------------------------ rebuilds of changed views

    def rebuild(self, view: str) -> rebuilds.Rebuild | None:
        """The rebuild of ``view``'s changed statement, or None."""
        return self.backend.transaction(lambda cur: rebuilds.read(cur, view))

    def active_rebuilds(self) -> dict[str, rebuilds.Rebuild]:
        """Every rebuild not finished, by view."""
        return self.backend.transaction(rebuilds.active)

    def hold_rebuild(self, view: str, reason: str | None) -> None:
        """Why the switch to ``view``'s new statement waits (None: it may switch)."""
        self.backend.transaction(lambda cur: rebuilds.hold(cur, view, reason))

    def rebuild_switch_gap(self, view: str, epoch: int, inputs: Iterable[str]) -> list[int] | None:
        """The epochs the new statement must write before it can switch at ``epoch``, or None."""
        return self.backend.transaction(lambda cur: rebuilds.switch_gap(cur, view, epoch, inputs))

    def decide_old_rows(self, view: str, wanted: rebuilds.OldRows) -> rebuilds.OldRows:
        """Whether the old rows are maintained or frozen until the switch; the first decision stands."""
        return self.backend.transaction(lambda cur: rebuilds.decide_old_rows(cur, view, wanted))

    def kept_statement(self, fingerprint: str) -> dict | None:
        """The statement kept under ``fingerprint`` (query, options, refresh), or None."""
        return self.backend.transaction(lambda cur: definitions.statement(cur, fingerprint))

    def old_statement_blockers(self) -> OldStatementBlockers:
        """What decides whether an old statement can still be maintained (``OldStatementBlockers``)."""

        def read(cur: Cursor) -> OldStatementBlockers:
            stored = {r[0] for r in cur.execute("SELECT table_name FROM table_epochs").fetchall()}
            blocked = backfill_rows.outside_alignment(cur) | set(rebuilds.active(cur)) | set(backfill_rows.retired(cur))
            return OldStatementBlockers(stored, blocked)

        return self.backend.transaction(read)

    def switch_rebuild(self, view: str, epoch: int, snapshot: str, rows: int, files: int) -> None:
        """The new statement's rows are ``view``'s snapshot at ``epoch``: it serves them from there."""
        self.backend.transaction(lambda cur: rebuilds.switch(cur, view, epoch, snapshot, rows, files))

    # ------------------------------------------------------------------ tables that left

    def retire_removed(self, tables: set[str], sinks: Iterable[str], loaded_at: float) -> tuple[list[str], list[str]]:
        """Retire what the SQL files no longer name (``retirement.retire_removed``); returns what left
        and the locations of its files."""
        return self.backend.transaction(lambda cur: retirement.retire_removed(cur, tables, sinks, loaded_at))

    def unfinished_removed_sinks(
        self, sinks: Iterable[str], loaded_at: float
    ) -> list[tuple[str, int, SinkRecipe | None]]:
        """Sinks the SQL files no longer name with batches not finished: (sink, batches, its recipe)."""
        return self.backend.transaction(lambda cur: retirement.unfinished_removed_sinks(cur, sinks, loaded_at))

    def dropped_files(self) -> tuple[list[str], list[tuple[str, int]]]:
        """Change files and backfill roots of views whose statement changed, listed to delete."""
        return self.backend.transaction(backfill_rows.dropped_files)

    def clear_dropped(self, locations: list[str], roots: list[tuple[str, int]]) -> None:
        """Forget dropped files once deleted."""
        self.backend.transaction(lambda cur: backfill_rows.clear_dropped(cur, locations, roots))

    def waiting_for_an_edit(self, fingerprints: Mapping[str, str]) -> str | None:
        """Why injecting another epoch would only fail again (``edits.waiting_for_an_edit``), or None."""
        return self.backend.transaction(lambda cur: edits.waiting_for_an_edit(cur, fingerprints))
