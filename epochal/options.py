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


# --- FORMAT ... ENCODE ... (RisingWave's clause after WITH) ------------------------------------------

#: keys under which the loader keeps a source's FORMAT/ENCODE clause among its options. ``@`` cannot
#: start an option written in WITH (the parser refuses it), so the clause never clashes with one.
FORMAT_KEY = "@format"
ENCODE_KEY = "@encode"
#: prefix of the clause's own options: ENCODE CSV (delimiter = ';') is ``@encode.delimiter``
ENCODE_OPTION_PREFIX = "@encode."


def format_encode(options: Mapping[str, str]) -> tuple[str | None, str | None, dict[str, str]]:
    """The FORMAT and ENCODE of ``options`` (lower-cased, None when there was no clause) and the
    ENCODE clause's options by their own names."""
    fmt = options.get(FORMAT_KEY)
    encode = options.get(ENCODE_KEY)
    clause = {k[len(ENCODE_OPTION_PREFIX) :]: v for k, v in options.items() if k.startswith(ENCODE_OPTION_PREFIX)}
    return (fmt.lower() if fmt else None, encode.lower() if encode else None, clause)


def with_options(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` without the FORMAT/ENCODE clause: what was written in WITH (...)."""
    return {k: v for k, v in options.items() if not k.startswith("@")}


def clause_text(fmt: str | None, encode: str | None) -> str:
    """The clause as a user writes it, for messages: 'FORMAT PLAIN ENCODE JSON'."""
    return f"FORMAT {(fmt or '?').upper()} ENCODE {(encode or '?').upper()}"


def option_label(key: str) -> str:
    """How a message names option ``key``: the clause's keys as the user wrote them."""
    if key == FORMAT_KEY:
        return "FORMAT"
    if key == ENCODE_KEY:
        return "ENCODE"
    if key.startswith(ENCODE_OPTION_PREFIX):
        return f"ENCODE option {key[len(ENCODE_OPTION_PREFIX) :]}"
    return key


def clause_sql(options: Mapping[str, str]) -> str:
    """The FORMAT/ENCODE clause of ``options`` as DDL (with a leading space), or '' without one."""
    fmt, encode, clause = format_encode(options)
    if fmt is None:
        return ""
    inner = ", ".join(f"{k} = '{v}'" for k, v in clause.items())
    return f" {clause_text(fmt, encode)}" + (f" ({inner})" if inner else "")
