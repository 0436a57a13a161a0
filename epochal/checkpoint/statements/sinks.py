"""Whether a sink still delivers the stream its target was filled with.

A sink's progress (``sink_starts``, ``sink_batches``) says which epochs of one table reached one
target. Edit the sink's target (another DuckDB table, PostgreSQL database, Delta location...), the
table it reads, its type or its primary key while keeping its name, and that progress would be
taken as the new target's: the new target would receive only the epochs after, silently missing
everything before, or an upsert target keyed one way would be written by another key.

So each sink's declaration (:class:`SinkDeclaration`: what it reads and where it writes, as the
connector's ``SinkSpec.identity`` names it) is recorded at its first delivery step and checked at
every later one (``check_sink``, inside the transaction that decides where the sink starts):

* the same, or options written another way that mean the same target (a default spelled out, a
  path with ``./``): delivered as always;
* changed before the sink delivered anything: the new one is recorded (nothing reached the old);
* changed after: the sink step fails before writing, naming every change and the fixes (a new
  sink name, which starts with a snapshot of the table; or the old declaration back). The epochs
  go on committing; the sink lags, as when its target is down.

Options that only tune delivery (writers, batching, a password, ``snapshot``) are not part of it.
A process that read its SQL files before a newer declaration was recorded refuses to deliver
(:class:`StaleSinkDeclaration`): it would write to a target the pipeline no longer names.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint.statements.views import recorded_after, stale_files_message
from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.meta.backend import Cursor


class SinkTargetChanged(EpochalError):
    """A sink that delivered to one target is now declared with another, under the same name."""


class StaleSinkDeclaration(EpochalError):
    """This process read its SQL files before another one recorded a newer sink declaration."""


@dataclass(frozen=True)
class SinkDeclaration:
    from_table: str
    connector: str
    sink_type: str
    primary_key: tuple[str, ...]
    #: the options that say which target the rows go to, each with its default applied
    target: tuple[tuple[str, str | None], ...]

    @classmethod
    def of(
        cls,
        from_table: str,
        connector: str,
        options: Mapping[str, str],
        primary_key: tuple[str, ...],
        identity: tuple[str, ...],
        defaults: Mapping[str, str],
        paths: tuple[str, ...] = (),
    ) -> SinkDeclaration:
        target = []
        for option in identity:
            value = options.get(option, defaults.get(option))
            if value is not None:
                value = value.strip()
                value = os.path.normpath(value) if option in paths and value else value
            target.append((option, value))
        return cls(
            from_table.lower(),
            connector.strip().lower(),
            options.get("type", "append-only").strip().lower(),
            tuple(c.lower() for c in primary_key),
            tuple(target),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "from": self.from_table,
                "connector": self.connector,
                "type": self.sink_type,
                "primary_key": list(self.primary_key),
                "target": [list(t) for t in self.target],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> SinkDeclaration:
        data = json.loads(text)
        return cls(
            data["from"],
            data["connector"],
            data["type"],
            tuple(data["primary_key"]),
            tuple((k, v) for k, v in data["target"]),
        )


@dataclass(frozen=True)
class SinkRecipe:
    """What builds a sink's target without its statement: kept so that a sink removed from the
    pipeline with batches not finished (a prepared transaction holding locks downstream, staged
    files) can still be finished. Literal secrets are not kept (a ``${NAME}`` reference is)."""

    connector: str
    options: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]
    #: options whose literal secret value was left out
    withheld: tuple[str, ...] = ()

    @classmethod
    def of(cls, connector: str, options: Mapping[str, str], columns: Sequence[str]) -> SinkRecipe:
        from epochal.redaction import is_secret_name
        from epochal.sinks.spec import sink_spec

        spec = sink_spec(connector)
        # (the connector's own list: a name test would take ``primary_key`` for a secret)
        secret = spec.secret if spec is not None else tuple(k for k in options if is_secret_name(k))
        kept, withheld = [], []
        for key, value in sorted(options.items()):
            if key in secret and not _REFERENCE.fullmatch(value.strip()):
                withheld.append(key)
            else:
                kept.append((key, value))
        return cls(connector, tuple(kept), tuple(columns), tuple(withheld))

    def to_json(self) -> str:
        return json.dumps(
            {
                "connector": self.connector,
                "options": dict(self.options),
                "columns": list(self.columns),
                "withheld": list(self.withheld),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> SinkRecipe:
        data = json.loads(text)
        return cls(
            data["connector"],
            tuple(sorted(data["options"].items())),
            tuple(data["columns"]),
            tuple(data.get("withheld", ())),
        )


#: an option value that only names an environment variable (read when the sink runs)
_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def changes(old: SinkDeclaration, new: SinkDeclaration) -> list[str]:
    """What ``new`` changes of ``old``, one phrase each (empty: the same stream and target)."""
    found = []
    if old.from_table != new.from_table:
        found.append(f"it read {old.from_table} and now reads {new.from_table}")
    if old.connector != new.connector:
        found.append(f"its connector was '{old.connector}' and is now '{new.connector}'")
    else:
        was = dict(old.target)
        for option, value in new.target:
            if was.get(option) != value:
                found.append(f"its {option} was {_shown(was.get(option))} and is now {_shown(value)}")
    if old.sink_type != new.sink_type:
        found.append(f"its type was '{old.sink_type}' and is now '{new.sink_type}'")
    if old.primary_key != new.primary_key:
        found.append(
            f"its primary_key was {_shown(', '.join(old.primary_key) or None)} and is now "
            f"{_shown(', '.join(new.primary_key) or None)}"
        )
    return found


def _shown(value: str | None) -> str:
    return "not given" if value is None else f"'{value}'"


def check_sink(cur: Cursor, sink: str, declaration: str, loaded_at: float | None, started: bool) -> None:
    """Record ``sink``'s declaration (JSON of :class:`SinkDeclaration`) or check it against the
    recorded one (module docstring). ``started``: the sink has delivered or begun to deliver (its
    start is decided, or it has batches), so a target holds some of the old stream."""
    row = cur.execute(
        "SELECT declaration, recorded_at, refused FROM sink_declarations WHERE sink = ?", [sink]
    ).fetchone()
    if row is not None and row[0] == declaration:
        if row[2] is not None:
            cur.execute("UPDATE sink_declarations SET refused = NULL WHERE sink = ?", [sink])
        return
    if row is not None and recorded_after(row[1], loaded_at):
        raise StaleSinkDeclaration(
            stale_files_message(
                f"sink {sink}: its declaration",
                "this one would deliver to a target the pipeline no longer names; nothing was delivered",
            )
        )
    if row is not None and started:
        found = changes(SinkDeclaration.from_json(row[0]), SinkDeclaration.from_json(declaration))
        if found:
            raise SinkTargetChanged(
                f"sink {sink}: {'; '.join(found)}. Its progress (the epochs it delivered) belongs to the "
                "old declaration: the new target would get only the epochs after, never the rows before, so "
                "nothing was delivered. To deliver to the new target, give the sink a new name (a new sink "
                "first delivers the table's rows as one snapshot batch, then every epoch; remove the old "
                "name, whose target keeps what it received); to go on as before, put the old declaration back"
            )
    cur.execute("DELETE FROM sink_declarations WHERE sink = ?", [sink])
    cur.execute(
        "INSERT INTO sink_declarations (sink, declaration, recorded_at) VALUES (?, ?, ?)",
        [sink, declaration, time.time()],
    )


def record_recipe(cur: Cursor, sink: str, recipe: str) -> None:
    """Keep ``sink``'s recipe (JSON of :class:`SinkRecipe`) beside its declaration."""
    cur.execute(
        "UPDATE sink_declarations SET recipe = ? WHERE sink = ? AND recipe IS DISTINCT FROM ?", [recipe, sink, recipe]
    )


def recipe(cur: Cursor, sink: str) -> SinkRecipe | None:
    row = cur.execute("SELECT recipe FROM sink_declarations WHERE sink = ?", [sink]).fetchone()
    return SinkRecipe.from_json(row[0]) if row and row[0] else None


def note_refusal(cur: Cursor, sink: str, reason: str) -> None:
    """Keep why ``sink``'s delivery was refused, for `epochal status`, until a step delivers again."""
    cur.execute("UPDATE sink_declarations SET refused = ? WHERE sink = ?", [reason, sink])


def refusal(cur: Cursor, sink: str) -> str | None:
    row = cur.execute("SELECT refused FROM sink_declarations WHERE sink = ?", [sink]).fetchone()
    return row[0] if row else None
