"""Option values written as ``${NAME}``: read from the environment Epochal runs in when used, so a
password stays out of the pipeline's files, the UI and status (which show the reference only).

A leaf module (the standard library and ``epochal.errors``): sinks and source connectors share it.
"""

from __future__ import annotations

import os
import re

from epochal.errors import EpochalError

ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
#: Epochal's and Dagster's own settings: an option may not read them (they are not its secrets)
RESERVED_ENV_PREFIXES = ("EPOCHAL_", "DAGSTER_")


def referenced_name(value: str) -> str | None:
    """The NAME of a ``${NAME}`` value, None for any other value."""
    match = ENV_REFERENCE.match(value.strip())
    return match[1] if match else None


def is_reserved(name: str) -> bool:
    return name.upper().startswith(RESERVED_ENV_PREFIXES)


def read_env(name: str, what: str) -> str:
    """The value of environment variable ``name``, which ``what`` (e.g. "option password") names."""
    if name not in os.environ:
        raise EpochalError(
            f"{what} = '${{{name}}}' names environment variable {name}, which is not set: export {name}=... "
            "in the environment Epochal runs in"
        )
    return os.environ[name]


def resolved(value: str, what: str) -> str:
    """``value`` read from the environment when it is a ``${NAME}``, else as written."""
    name = referenced_name(value)
    return value if name is None else read_env(name, what)


def password_problems(password: str, example: str, without: str = "") -> list[str]:
    """What is wrong with a connector's ``password`` option: written out (it would be shown with
    the statement's text), or naming one of Epochal's or Dagster's settings. ``example`` names a
    variable to suggest; ``without`` says when the option may be left out."""
    password = password.strip()
    name = referenced_name(password)
    if password and name is None:
        return [
            "option 'password' is written out: write it as password = '${NAME}' and export NAME=... in the "
            "environment Epochal runs in, so that it stays out of the pipeline's files, the UI and status"
            + (f" ({without})" if without else "")
        ]
    if name is not None and is_reserved(name):
        return [
            f"option 'password' = '${{{name}}}' reads one of Epochal's or Dagster's own settings: "
            f"export the password under a name of its own, e.g. {example}"
        ]
    return []
