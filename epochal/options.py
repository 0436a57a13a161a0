"""Checking WITH (...) options: unknown keys are typos until proven otherwise."""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping


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
