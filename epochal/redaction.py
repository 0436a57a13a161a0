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
    r"secret|passw|pwd|token|credential|apikey|private[._-]?key|(?:^|[._-])key(?:$|[._-])"
    # an Azure SAS (fs.azure.sas.<container>.<account>...: the value is the signed query), a URL's
    # signature parameter (`sig=` of a SAS URL)
    r"|(?:^|[._-])sas(?:$|[._-])|(?:^|[._-])sig(?:nature)?(?:$|[._-])",
    re.IGNORECASE,
)

# A parameter is `name=value` after `?`, `&` or `;` (libpq's query string, Spark Connect's `;token=`).
_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;?#\s]*)=(?P<value>[^&;#\s]*)")
# A libpq conninfo pair, `password=secret` or `password = 'a b'`, at the start or after a blank.
_CONNINFO = re.compile(r"(?:^|(?<=\s))(?P<name>[A-Za-z_][\w.-]*)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'?|[^\s'][^\s]*)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# What follows the userinfo's '@': one or more host[:port] (libpq takes a comma-separated list),
# then the end, a path, the query or a blank. A password may hold '@', ':', '/', '?', ';', so its
# '@' is the LAST one so followed.
_HOST_AFTER = re.compile(r"@[A-Za-z0-9._~%\[\]:,-]*(?=$|[/?#;\s\"'<>()])")


def is_secret_name(name: str) -> bool:
    """Whether a Spark conf key or URL parameter name holds a secret (``fs.s3a.secret.key``, ``password``)."""
    return bool(_SECRET_NAME.search(name))


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds secrets: userinfo passwords, secret URL parameters, conninfo passwords;
    sorted and merged."""
    spans = []
    for scheme in _SCHEME.finditer(text):
        start = scheme.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        colon = text.find(":", start, line_end)
        # no password unless the user (before the first ':') is still inside the authority
        if colon < 0 or any(c in text[start:colon] for c in "/?#; \t"):
            continue
        hosts = list(_HOST_AFTER.finditer(text, colon + 1, line_end))
        if hosts:
            spans.append((colon + 1, hosts[-1].start()))
    for pattern in (_PARAM, _CONNINFO):
        spans += [m.span("value") for m in pattern.finditer(text) if is_secret_name(m["name"])]
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((begin, end))
    return merged


def redact_url(url: str) -> str:
    """``url`` (or any text holding URLs or conninfo) with its passwords and secret parameters
    masked; user, host, path and the rest kept.

    ``postgresql://alice:pw@db/meta?sslmode=require&password=pw`` becomes
    ``postgresql://alice:***@db/meta?sslmode=require&password=***``; ``sc://host:15002/;token=t``
    becomes ``sc://host:15002/;token=***``; ``host=db password=pw`` becomes ``host=db password=***``.
    The password of a userinfo is everything between the first ':' after ``//`` and the last '@'
    before the host, whatever it holds (``pa;ss``, ``p@w/1?``). Text without secrets comes back unchanged.
    """
    pieces, done = [], 0
    for begin, end in _secret_spans(url):
        pieces += [url[done:begin], MASK]
        done = end
    return "".join(pieces) + url[done:]


def scrub(text: str, secret_source: str) -> str:
    """``text`` redacted, and without any secret that ``secret_source`` (a URL or conninfo) holds.

    For a driver's message about ``secret_source``: it may quote the password bare (psycopg's
    ``invalid percent-encoded token: "pa%ss"``), where no URL shape is left to redact by.
    """
    from urllib.parse import unquote

    secrets = {secret_source[begin:end] for begin, end in _secret_spans(secret_source)}
    forms = {form for secret in secrets for form in (secret, secret.strip("'"), unquote(secret)) if form}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, MASK)
    return redact_url(text)


def is_secret_conf(key: str, value: object) -> bool:
    """Whether a Spark conf entry holds a secret: by its key's name, or by its value, which may be a
    URL with credentials under an innocent key (``javax.jdo.option.ConnectionURL`` =
    ``jdbc:postgresql://db/hive?user=u&password=pw``, a catalog's ``uri`` = ``postgresql://u:pw@db/c``)."""
    if is_secret_name(key):
        return True
    text = str(value)
    if redact_url(text) != text:
        return True
    # JDBC URLs that are not URL-shaped (jdbc:oracle:thin:user/pw@host:1521/db)
    return text.lower().startswith("jdbc:") and ("@" in text or "pass" in text.lower())


def redact_conf(conf: Mapping[str, object]) -> dict[str, object]:
    """A copy of a Spark conf whose secrets are masked: the whole value of a secret key, the
    password of a URL value (the rest of it stays readable)."""
    shown: dict[str, object] = {}
    for key, value in conf.items():
        if not is_secret_conf(key, value):
            shown[key] = value
        elif is_secret_name(key) or redact_url(str(value)) == str(value):
            shown[key] = MASK
        else:
            shown[key] = redact_url(str(value))
    return shown


def split_secret_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` split into the entries that may be shown and the ones that hold secrets."""
    public = {k: v for k, v in conf.items() if not is_secret_conf(k, v)}
    secret = {k: v for k, v in conf.items() if is_secret_conf(k, v)}
    return public, secret
