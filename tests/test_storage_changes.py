"""Netting weighted changes into rows, and into the unit changes tables store. Real Spark."""

from __future__ import annotations

from epochal.storage.changes import net_rows, unit_changes
from tests.consistency import frame, multiset

DDL = "k BIGINT, name STRING, x DOUBLE"


def test_unit_changes_expand_net_weights(spark) -> None:
    weighted = frame(
        spark, [(1, "a", 1.0, 3), (1, "a", 1.0, -1), (2, "b", None, -2), (3, None, 0.0, 1), (3, None, 0.0, -1)],
        f"{DDL}, _weight BIGINT",
    )
    units = multiset(unit_changes(weighted).collect())
    assert units == multiset([(1, "a", 1.0, 1), (1, "a", 1.0, 1), (2, "b", None, -1), (2, "b", None, -1)])
    assert multiset(net_rows(weighted).collect()) == multiset([(1, "a", 1.0), (1, "a", 1.0)])
