"""A materialized view's WITH (...) options: which it takes, and what each says."""

from __future__ import annotations

from epochal.options import unknown_option_problems
from epochal.pipeline.ddl import Options

#: WITH (...) keys a materialized view accepts.
VIEW_OPTIONS: frozenset[str] = frozenset({"refresh", "min_max_cache", "backfill_rate_limit"})
#: Bounds of WITH (min_max_cache = n): values kept per group and MIN/MAX column.
MIN_MAX_CACHE_RANGE = (1, 10_000)
#: How a view is maintained: from its inputs' changes, or by recomputing and diffing every epoch.
REFRESH_MODES = ("incremental", "full")


def refresh_mode(options: Options) -> str:
    return options.values.get("refresh", "incremental").strip().lower()


def min_max_cache(options: dict[str, str]) -> int | None:
    """WITH (min_max_cache = n), the default when absent; None when it is not a valid number."""
    from epochal.incremental.plan import DEFAULT_MIN_MAX_CACHE

    text = options.get("min_max_cache")
    if text is None:
        return DEFAULT_MIN_MAX_CACHE
    low, high = MIN_MAX_CACHE_RANGE
    value = text.strip()
    return int(value) if value.isdigit() and low <= int(value) <= high else None


def view_option_problems(options: Options) -> list[str]:
    messages = unknown_option_problems("materialized view", options.values, VIEW_OPTIONS)
    # With no known option the generic hint ends in an empty list; say what to do instead.
    empty_hint = ": known options: "
    return [
        m[: -len(empty_hint)] + ": materialized views take no options yet; remove it" if m.endswith(empty_hint) else m
        for m in messages
    ]
