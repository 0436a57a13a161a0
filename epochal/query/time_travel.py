"""Time travel: which committed epoch a read asks for, and the net change of a table between two.

Every committed epoch inside the window (``EPOCHAL_TIME_TRAVEL_S`` before the newest one) stays
readable: compaction keeps the snapshot at or before the window's start and the change files after
it (``SnapshotCatalog.publish_snapshot``). A read names its epoch by number, or by a timestamp,
which is the newest epoch committed at or before it (an epoch's id is the time its barrier was
injected, epochal/epoch.py); the SQL form is RisingWave's ``FOR SYSTEM_TIME AS OF``.

The change between two of them is ``epochal/query/changes.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from epochal.epoch import SEQUENCE_MASK, epoch_datetime, epoch_from_ms
from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.runtime.facade import EpochRuntime

#: an epoch (int, or its digits), an ISO timestamp (naive is UTC) or a datetime
AsOf = int | str | datetime


def _shown(epoch: int) -> str:
    return f"{epoch} ({epoch_datetime(epoch):%Y-%m-%d %H:%M:%S} UTC)"


def _stored_tables(runtime: "EpochRuntime") -> list[str]:
    """Tables whose past is read from the warehouse (a SOURCE that stores nothing is read from its
    connector at any epoch's offsets)."""
    from epochal.incremental.state_needs import sources_storing_nothing

    nothing = sources_storing_nothing(runtime.pipeline)
    return [t for t in runtime.pipeline.tables if t not in nothing]


def _timestamp(value: str | datetime) -> datetime | None:
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def retained(runtime: "EpochRuntime") -> tuple[int, int]:
    """(oldest, newest) committed epoch a read can ask for; an error before the first commit."""
    oldest, newest = runtime.controller.retained_epochs(_stored_tables(runtime))
    if oldest is None or newest is None:
        raise EpochalError("no epoch is committed yet: run an epoch first (epoch_job), then read its past")
    return oldest, newest


def resolve_as_of(runtime: "EpochRuntime", as_of: AsOf) -> int:
    """The committed epoch ``as_of`` names, inside the time-travel window; anything else is refused,
    naming the oldest epoch retained."""
    controller = runtime.controller
    oldest, newest = retained(runtime)
    window = (
        f"the oldest epoch retained is {_shown(oldest)}, the newest {_shown(newest)} "
        f"(EPOCHAL_TIME_TRAVEL_S={controller.settings.time_travel_s} s of epochs stay readable)"
    )
    if isinstance(as_of, int) or (isinstance(as_of, str) and as_of.strip().isdigit()):
        epoch = int(as_of)
        if epoch < oldest:
            raise EpochalError(f"epoch {epoch} is older than the time-travel window: {window}")
        if epoch > newest:
            raise EpochalError(f"epoch {epoch} is not committed yet: {window}")
        if not controller.is_committed(epoch):
            raise EpochalError(f"epoch {epoch} was never committed (aborted, or not an epoch id): {window}")
        return epoch
    moment = _timestamp(as_of)
    if moment is None:
        raise EpochalError(
            f"AS OF {as_of!r} is neither an epoch nor an ISO timestamp: give e.g. {newest} or "
            f"'{epoch_datetime(newest):%Y-%m-%dT%H:%M:%S}Z'"
        )
    # Every epoch allocated in that millisecond or before it.
    epoch = controller.committed_at_or_before(epoch_from_ms(int(moment.timestamp() * 1000)) | SEQUENCE_MASK)
    if epoch is None or epoch < oldest:
        raise EpochalError(f"{moment.isoformat()} is before the time-travel window: {window}")
    return epoch


def system_time(
    sql: str, resolve: Callable[[AsOf], int], tables: Iterable[str]
) -> tuple[str, dict[str, tuple[str, int]]]:
    """``sql`` with each ``table FOR SYSTEM_TIME AS OF x`` (RisingWave's form) read from a view of
    ``table`` at epoch ``resolve(x)``, and those views: name -> (table, epoch). ``x``: an epoch, a
    timestamp, or an expression (``now() - INTERVAL '1 hour'``, ``PROCTIME()``) that DuckDB
    evaluates. Parsed by sqlglot's DuckDB dialect; a query it cannot parse, or one without the
    clause, comes back as it was. Tables without the clause stay at the query's cut."""
    import sqlglot
    from sqlglot import exp

    try:
        trees = sqlglot.parse(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return sql, {}
    known = {t.lower(): t for t in tables}
    views: dict[str, tuple[str, int]] = {}
    for tree in trees:
        for table in list(tree.find_all(exp.Table)) if tree else ():
            version = table.args.get("version")
            if version is None:
                continue
            if str(version.args.get("kind", "")).upper() != "AS OF":
                raise EpochalError(f"{version.sql('duckdb')}: only FOR SYSTEM_TIME AS OF <epoch | 'timestamp'> is read")
            name = known.get(table.name.lower())
            if name is None:
                raise EpochalError(
                    f"FOR SYSTEM_TIME AS OF reads a table, source or view of the pipeline, not {table.name} "
                    f"({', '.join(known.values())})"
                )
            epoch = resolve(_moment(version.expression))
            view = f"__{name}__as_of_{epoch}"
            views[view] = (name, epoch)
            alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
            table.replace(exp.Table(this=exp.to_identifier(view, quoted=True), alias=alias))
    if not views:
        return sql, {}
    return ";\n".join(t.sql("duckdb") for t in trees if t), views


def _moment(value: "sqlglot.exp.Expression") -> AsOf:  # noqa: F821 - sqlglot is imported lazily
    """An AS OF value: a literal as written, anything else evaluated by DuckDB."""
    import duckdb
    from sqlglot import exp

    if isinstance(value, exp.Literal):
        return value.this if value.is_string else int(value.this)
    # PROCTIME() is RisingWave's processing time: DuckDB's now().
    value = value.transform(
        lambda n: exp.CurrentTimestamp() if isinstance(n, exp.Anonymous) and n.name.lower() == "proctime" else n
    )
    try:
        result = duckdb.sql(f"SELECT ({value.sql('duckdb')})::TIMESTAMPTZ").fetchall()[0][0]
    except duckdb.Error as exc:
        raise EpochalError(f"AS OF {value.sql('duckdb')} is not a timestamp: {str(exc).splitlines()[0]}") from None
    return result if isinstance(result, datetime) else str(result)
