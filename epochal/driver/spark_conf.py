"""The Spark settings the driver path computes like: Epochal's own (``spark_session.DEFAULT_CONF``).

The driver reproduces Spark's results under the session Epochal configures: time zone UTC (a
record's time without an offset, a TIMESTAMP literal), ANSI arithmetic (overflow and division by
zero raise, which DuckDB's error() mirrors), case-insensitive names, the default time parser. A
user's ``EPOCHAL_SPARK_CONF`` that changes one of these would make the two paths disagree, so it
turns the driver path off (logged once), and every step runs on Spark.
"""

from __future__ import annotations

from collections.abc import Mapping

#: setting -> (the values under which the driver computes like Spark, lower-cased; the default)
ASSUMED: dict[str, tuple[frozenset[str], str]] = {
    "spark.sql.session.timezone": (frozenset({"utc", "etc/utc", "z", "+00:00", "gmt"}), "UTC"),
    "spark.sql.ansi.enabled": (frozenset({"true"}), "true"),
    "spark.sql.casesensitive": (frozenset({"false"}), "false"),
    "spark.sql.legacy.timeparserpolicy": (frozenset({"exception", "corrected"}), "EXCEPTION"),
}


def departures(conf: Mapping[str, str]) -> list[str]:
    """The settings in ``conf`` (names in any case, as Spark takes them) under which the driver
    would not compute as Spark does, each as 'name=value'."""
    found = []
    for name, value in conf.items():
        assumed = ASSUMED.get(name.lower())
        if assumed is not None and value.strip().lower() not in assumed[0]:
            found.append(f"{name}={value}")
    return found
