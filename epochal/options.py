"""Checking WITH (...) options: unknown keys are typos until proven otherwise."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping


def unknown_option_problems(kind: str, options: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """One sentence per unknown key, suggesting the closest known key when there is one."""
    known = sorted(known)
    problems = []
    for key in options:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known options: {', '.join(known)}"
        problems.append(f"unknown {kind} option '{key}': {hint}")
    return problems


MAX_BIGINT = 2**63 - 1


def whole_number_option(
    options: Mapping[str, str],
    key: str,
    default: int | None,
    minimum: int,
    problems: list[str],
    maximum: int = MAX_BIGINT,
) -> int | None:
    """``options[key]`` as an int in [minimum, maximum]; on a bad value, a problem is appended and
    ``default`` returned."""
    raw = options.get(key)
    if raw is None:
        return default
    text = raw.strip()
    # digits only: int() would also take "1_000", "+5" and "٣", which nobody means in a WITH clause
    if not re.fullmatch(r"[0-9]+", text) or not minimum <= int(text) <= maximum:
        problems.append(f"option '{key}' must be a whole number from {minimum} to {maximum}, got '{raw}'")
        return default
    return int(text)
