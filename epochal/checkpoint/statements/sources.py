"""Whether a source's declaration (TABLE or SOURCE, primary key, columns and their types) is the
one its stored rows, and the views computed from them, were made with.

Every stored file of a source, and every view's state, holds values of the types the source
declared when they were written. A declaration edited in a running pipeline is checked at the
next injection against the one the meta store keeps (``check_declarations``):

* **columns added or removed**: accepted. Readers take the stored rows with the declared columns
  (``epochal.storage.schemas.aligned``): a column declared since holds NULL in rows stored before,
  as ``ALTER TABLE ... ADD COLUMN`` gives; a view added later that reads a SOURCE backfills from
  its connector, where the records are decoded with the new declaration;
* **a column's type, the primary key, TABLE/SOURCE or where the records come from changed** (the
  connector, and the options its ``identity_options`` name: a log's path): refused, naming each
  change and the fixes. Views hold state of the old types, a keyed table's rows are placed by its
  key, and a committed offset read in another log is other records: going on would mix the two in
  one table (Parquet files of both types, which no reader can take together), fail every epoch
  from then on, or skip records without a word.

As with view statements (:mod:`epochal.checkpoint.statements.views`), a process that read its SQL files
before a newer declaration was recorded holds an older one: it injects nothing, and its source
steps refuse to run (``check_step``), since their records would be decoded the old way.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint import queries as q
from epochal.checkpoint.records import InjectionBlocked
from epochal.checkpoint.statements.views import recorded_after, stale_files_message
from epochal.connectors.registry import connector_spec
from epochal.errors import EpochalError
from epochal.options import option_label

if TYPE_CHECKING:
    from pathlib import Path

    from epochal.meta.backend import Cursor
    from epochal.pipeline.model import SourceDef


class DeclarationChanged(EpochalError):
    """A source's declaration changed in a way its stored rows and views cannot follow."""


class StaleDeclarations(InjectionBlocked):
    """This process read its SQL files before another one recorded newer source declarations."""


@dataclass(frozen=True)
class Declaration:
    kind: str
    primary_key: tuple[str, ...]
    #: (name, type) in declared order; names lower case as SQL resolves them, types as Spark DDL
    columns: tuple[tuple[str, str], ...]
    #: the connector and the options that say which records its offsets point to
    #: (``ConnectorSpec.identity_options``), as written; None for an option not given
    origin: tuple[tuple[str, str | None], ...] = ()
    #: (name, the record's field it is read from) per column, for a connector that looks fields up
    #: by the DDL's spelling (``ConnectorSpec.fields_by_spelling``); None: not recorded (another
    #: connector, or a declaration stored before fields were)
    fields: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def of(cls, source: SourceDef, identity_options: tuple[str, ...] = (), by_spelling: bool = False) -> Declaration:
        origin = (("connector", source.connector.lower()),) + tuple(
            (key, source.options.get(key)) for key in identity_options
        )
        return cls(
            source.kind,
            tuple(source.primary_key),
            tuple((c.name, normal_type(c.type)) for c in source.columns),
            origin,
            tuple((c.name, c.key) for c in source.columns) if by_spelling else None,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "primary_key": list(self.primary_key),
                "columns": [list(c) for c in self.columns],
                "origin": [list(o) for o in self.origin],
                **({"fields": [list(f) for f in self.fields]} if self.fields is not None else {}),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Declaration:
        data = json.loads(text)
        return cls(
            data["kind"],
            tuple(data["primary_key"]),
            tuple((n, t) for n, t in data["columns"]),
            tuple((k, v) for k, v in data.get("origin", [])),
            tuple((n, f) for n, f in data["fields"]) if "fields" in data else None,
        )


def normal_type(declared: str) -> str:
    """A DDL type with its spacing normalized (``DECIMAL(10, 2)`` is ``DECIMAL(10,2)``); field names
    in backquotes keep their case, which records match exactly."""
    return re.sub(r"\s+", " ", re.sub(r"\s*([(),<>:])\s*", r"\1", declared.strip()))


def refusals(old: Declaration, new: Declaration, home: Path | None = None) -> list[str]:
    """What ``new`` changes of ``old`` that the stored rows cannot follow, one phrase each;
    ``home`` resolves relative paths of the origin (``ConnectorSpec.identity_value``)."""
    found = []
    if old.kind != new.kind:
        found.append(f"it was declared {old.kind.upper()} and is now {new.kind.upper()}")
    if old.primary_key != new.primary_key:
        was = f"PRIMARY KEY ({', '.join(old.primary_key)})" if old.primary_key else "no primary key"
        now = f"PRIMARY KEY ({', '.join(new.primary_key)})" if new.primary_key else "none"
        found.append(f"its key was {was} and is now {now}")
    was = dict(old.origin)
    acted = _acted_value(dict(new.origin).get("connector"), home)
    for option, value in new.origin:
        if option in was and acted(option, was[option]) != acted(option, value):
            found.append(f"its {option_label(option)} was {_shown(was[option])} and is now {_shown(value)}")
    types = dict(old.columns)
    for column, type_ in new.columns:
        if column in types and types[column] != type_:
            found.append(f"column {column} was {types[column]} and is now {type_}")
    found += [f"column {c} was read from the records' field {was!r} and would now be read from {now!r}"
              for c, was, now in respelled(old, new)]
    return found


def respelled(old: Declaration, new: Declaration) -> list[tuple[str, str, str]]:
    """(column, field it was read from, field it would be read from) for each column whose spelling
    changed where the connector reads fields by spelling: ``customerId`` -> ``CustomerId`` is the
    same column to SQL but another JSON key, which most records lack (NULL from then on, silently)."""
    if old.fields is None or new.fields is None:
        return []
    was = dict(old.fields)
    return [(c, was[c], field) for c, field in new.fields if c in was and was[c] != field]


def _acted_value(connector: str | None, home: Path | None) -> Callable[[str, str | None], str | None]:
    """How ``connector`` reads an identity option as written: a default written out, or a number
    or path spelled another way, is the same stream (``ConnectorSpec.identity_value``)."""
    spec = connector_spec(connector) if connector else None
    if spec is None:
        return lambda option, value: value
    return lambda option, value: spec.identity_value(option, value, home)


def _shown(value: str | None) -> str:
    return "not given" if value is None else f"'{value}'"


def added_and_removed(old: Declaration, new: Declaration) -> tuple[list[str], list[str]]:
    before, after = dict(old.columns), dict(new.columns)
    return [c for c in after if c not in before], [c for c in before if c not in after]


def check_declarations(
    cur: Cursor, declarations: Mapping[str, str], loaded_at: float | None, home: Path | None = None
) -> list[str]:
    """Record each source's declaration (JSON of :class:`Declaration`) or check it against the one
    recorded (module docstring); returns a line per source whose columns changed, for the log.
    Raises :class:`StaleDeclarations` for a process holding older declarations, and
    :class:`DeclarationChanged` naming every change the stored rows cannot follow; nothing is
    recorded then."""
    rows = cur.execute("SELECT source_name, declaration, recorded_at FROM source_declarations").fetchall()
    stored = {r[0]: (r[1], r[2]) for r in rows}
    stale = sorted(
        name
        for name, text in declarations.items()
        if name in stored and stored[name][0] != text and recorded_after(stored[name][1], loaded_at)
    )
    if stale:
        raise StaleDeclarations(stale_message(stale))
    committed = q.committed_epoch(cur) is not None
    refused, changed = [], []
    retyped: list[tuple[str, str]] = []
    respellings: list[tuple[str, str]] = []
    for name, text in sorted(declarations.items()):
        if name not in stored:
            _record(cur, name, text)
            continue
        if stored[name][0] == text:
            continue
        old, new = Declaration.from_json(stored[name][0]), Declaration.from_json(text)
        found = refusals(old, new, home)
        if found and committed:
            refused.append(f"source {name}: {'; '.join(found)}")
            before = dict(old.columns)
            retyped += [(c, t) for c, t in new.columns if c in before and before[c] != t]
            respellings += [(c, was) for c, was, _ in respelled(old, new)]
            continue
        added, removed = added_and_removed(old, new)
        parts = "; ".join(
            part
            for part in (
                f"column(s) {', '.join(added)} added (NULL in the rows stored before)" if added else "",
                f"column(s) {', '.join(removed)} removed" if removed else "",
                "; ".join(found),
            )
            if part
        )
        if parts or [c for c, _ in old.columns] != [c for c, _ in new.columns]:
            changed.append(f"source {name}: {parts or 'its columns in another order'}")
        _record(cur, name, text)  # (else an option written another way, which reads the same records)
    if refused:
        casts = [f"CAST({c} AS {t})" for c, t in retyped]
        convert = (
            f"put the declared type back and convert in the views that read it ({', '.join(casts)}), or "
            if casts
            else ""
        )
        if respellings:
            spelled = ", ".join(f"`{was}`" for _, was in respellings)
            convert += f"spell the column(s) as before ({spelled}: a record's field names are case-sensitive), or "
        raise DeclarationChanged(
            f"{'. '.join(refused)}. The source's stored files and the views computed from it follow the old "
            "declaration, and mixing the two would fail every epoch or read other fields, so nothing was "
            "injected. To go on, "
            f"{convert}declare the new shape under a new name (a new source reads its splits from their start, "
            "and the views moved to it rebuild while their old rows keep serving). Adding and removing "
            "columns is accepted"
        )
    return changed


def stored(cur: Cursor, name: str) -> tuple[str, float | None] | None:
    """The declaration recorded for source ``name`` and when; None when none is."""
    row = cur.execute(
        "SELECT declaration, recorded_at FROM source_declarations WHERE source_name = ?", [name]
    ).fetchone()
    return (row[0], row[1]) if row else None


def check_step(recorded: tuple[str, float | None] | None, name: str, declaration: str, loaded_at: float | None) -> None:
    """Refuse a source step of this process when the recorded declaration is another: its records
    would be decoded and stored in a shape the readers do not expect."""
    if recorded is None or recorded[0] == declaration:
        return
    if recorded_after(recorded[1], loaded_at):
        raise StaleDeclarations(stale_message([name]))
    raise DeclarationChanged(
        f"the declaration of source {name} in this process's SQL files is not the one its stored rows were "
        "written with, and no injection has checked the change yet, so this process cannot read it. The next "
        "injection (epoch_job without a partition, or the barrier sensor) checks and records it; a recovery "
        "takes back an epoch this refused, and re-runs it"
    )


def stale_message(names: list[str]) -> str:
    return stale_files_message(
        f"the declaration of source(s) {', '.join(names)}",
        "this one holds the old declaration and must not read or inject with it",
    )


def _record(cur: Cursor, name: str, text: str) -> None:
    cur.execute("DELETE FROM source_declarations WHERE source_name = ?", [name])
    cur.execute(
        "INSERT INTO source_declarations (source_name, declaration, recorded_at) VALUES (?, ?, ?)",
        [name, text, time.time()],
    )

