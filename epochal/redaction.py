"""Keeping secrets out of what Epochal shows: status, errors, logs, reprs.

A leaf module (standard library only) so every layer can use it. It never raises: a URL it
cannot parse is still redacted as far as its shape allows, because an error path that leaks
the password it failed on is worse than no redaction at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"

# What makes a Spark conf key or URL parameter a secret: Spark's own `spark.redaction.regex`
# (secret|password|token|access.key) widened to the names cloud connectors use
# (fs.s3a.secret.key, fs.azure.account.key.<account>, ...oauth2.client.secret, sslpassword).
_SECRET_NAME = re.compile(
    r"secret|passw|pwd|token|credential|apikey|private[._-]?key|(?:^|[._-])key(?:$|[._-])",
    re.IGNORECASE,
)

# A parameter is `name=value` after `?`, `&` or `;` (libpq's query string, Spark Connect's `;token=`).
_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;?#]*)=(?P<value>[^&;#]*)")


def is_secret_name(name: str) -> bool:
    """Whether a Spark conf key or URL parameter name holds a secret (``fs.s3a.secret.key``, ``password``)."""
    return bool(_SECRET_NAME.search(name))


def redact_url(url: str) -> str:
    """``url`` with its password and secret parameters masked; user, host, path and the rest kept.

    ``postgresql://alice:pw@db/meta?sslmode=require&password=pw`` becomes
    ``postgresql://alice:***@db/meta?sslmode=require&password=***``; ``sc://host:15002/;token=t``
    becomes ``sc://host:15002/;token=***``. URLs without secrets come back unchanged.
    """
    text = url
    scheme_end = text.find("://")
    if scheme_end >= 0:
        start = scheme_end + 3
        # The userinfo ends at the authority's last '@' (a password may hold an unencoded '@' or
        # '/'), and the authority ends at the query, so an '@' in a parameter is not mistaken for it.
        query = min((i for i in (text.find("?", start), text.find(";", start)) if i >= 0), default=len(text))
        at = text.rfind("@", start, query)
        if at >= 0:
            user, colon, _password = text[start:at].partition(":")
            if colon:
                text = f"{text[:start]}{user}:{MASK}{text[at:]}"
    return _PARAM.sub(
        lambda m: f"{m['lead']}{m['name']}={MASK}" if is_secret_name(m["name"]) else m.group(0), text
    )


def redact_conf(conf: Mapping[str, object]) -> dict[str, object]:
    """A copy of a Spark conf whose secret keys' values are masked."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in conf.items()}


def split_secret_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` split into the keys that may be shown and the ones that hold secrets."""
    public = {k: v for k, v in conf.items() if not is_secret_name(k)}
    secret = {k: v for k, v in conf.items() if is_secret_name(k)}
    return public, secret
