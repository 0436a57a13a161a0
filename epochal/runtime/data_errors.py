"""A view whose SQL fails on the values of a record (a division by zero, a cast of malformed text, an
overflow): the record, not the query, is what fails, so every epoch that reads it fails the same way.

Spark (ANSI mode, its default) raises these with SQLSTATE class 22, the SQL standard's "data
exception", or P0001 for ``raise_error``/``assert_true``. They are told apart from other failures here
so that the step can say what the user must do (the epoch is not committed and no record is lost,
but the pipeline stands until the view tolerates the record) and so that a view being rebuilt,
whose old statement is what fails, stops maintaining its old rows instead of stopping the pipeline
(``RebuildSteps``). RisingWave evaluates such expressions to NULL and logs the error; Epochal keeps
Spark's semantics, which the batch oracle shares, and asks for the tolerant function by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.checkpoint.statements import rebuilds
from epochal.errors import EpochalError

if TYPE_CHECKING:
    from epochal.pipeline.model import Pipeline, ViewDef

#: SQLSTATEs of errors a record's values cause: class 22 ("data exception") and P0001 (raised by the
#: query itself: ``raise_error``, ``assert_true``)
_DATA_STATE_CLASSES = ("22", "P0")


@dataclass(frozen=True)
class DataFailure:
    """What Spark said of a record that fails an expression."""

    condition: str  # e.g. DIVIDE_BY_ZERO
    message: str  # Spark's first line, which names the tolerant function (try_divide, try_cast, ...)
    fragment: str | None  # the failing expression as written, where Spark reports it


def data_failure(error: BaseException) -> DataFailure | None:
    """The data exception ``error`` is, or wraps; None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = _call(current, "getSqlState")
        if isinstance(state, str) and state.startswith(_DATA_STATE_CLASSES):
            condition = _call(current, "getCondition") or _call(current, "getErrorClass") or state
            text = (_call(current, "getMessage") or str(current)).strip()
            return DataFailure(str(condition), text.splitlines()[0] if text else str(condition), _fragment(current))
        current = current.__cause__ or current.__context__
    return None


class ViewDataError(EpochalError):
    """A view cannot compute an epoch (or its backfill cannot go on) because a record's values make
    its SQL fail. ``epoch`` None: the backfill's failure, which does not stop live epochs."""

    def __init__(self, view: str, epoch: int | None, failure: DataFailure, query: str | None = None):
        self.view, self.epoch, self.failure = view, epoch, failure
        # An internal stage runs the planner's SQL: its fragment would name nothing the user wrote.
        shown = failure.fragment if failure.fragment and _mentions(query, failure.fragment) else None
        where = f" in `{shown}`" if shown else ""
        fix = f"edit {view} in the pipeline's SQL as the message says (the try_ function it names"
        if failure.condition == "ARITHMETIC_OVERFLOW":
            fix += "; for an aggregate, try_sum(x) or a wider type such as sum(CAST(x AS DECIMAL(38, 0)))"
        fix += ", or a WHERE or CASE that leaves such records out)"
        if epoch is None:
            head = f"view {view} cannot be backfilled: a record's values make its SQL fail{where}"
            then = (
                "Live epochs go on without it (a view joins them when its backfill is done), but its "
                f"backfill fails the same way each time until {view} tolerates the record. Fix: {fix}; "
                "its backfill then starts over with the new statement."
            )
        else:
            head = f"view {view} cannot compute epoch {epoch}: a record's values make its SQL fail{where}"
            then = (
                "Nothing of the epoch is committed and no record is lost, but every later epoch reads "
                f"the same record and fails the same way until {view} tolerates it. Fix: {fix}. The "
                "edited view is rebuilt from its sources while its old rows stay as they were before "
                "this epoch, and epochs go on at once."
            )
        super().__init__(f"{head}: {failure.message}\n{then}")


def _mentions(query: str | None, fragment: str) -> bool:
    if not query:
        return False
    squeeze = str.maketrans("", "", " \t\n")
    return fragment.translate(squeeze).lower() in query.translate(squeeze).lower()


def _call(owner: object, method: str) -> object:
    try:
        found = getattr(owner, method, None)
        return found() if callable(found) else None
    except Exception:  # a Java-side accessor of a half-built exception
        return None


def _fragment(error: BaseException) -> str | None:
    contexts = _call(error, "getQueryContext")
    for context in contexts or ():  # type: ignore[union-attr]
        fragment = _call(context, "fragment")
        if isinstance(fragment, str) and fragment.strip():
            return fragment.strip()
    return None


def user_view(pipeline: Pipeline, view: ViewDef) -> ViewDef:
    """The view a user wrote that ``view`` computes: itself, or the view an internal stage was
    split off, or the view a rebuild's shadow is the new statement of (errors name that one)."""
    name = view.internal_of or view.name
    return pipeline.views.get(rebuilds.rebuilt_view(name) or name, view)
