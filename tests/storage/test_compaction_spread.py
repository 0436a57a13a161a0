"""The pass after each epoch spreads tables' compactions over epochs (epochal/storage/compaction.py,
``plan``): pure logic over the catalog's counts, with a stand-in catalog. That compaction itself never
changes what a reader sees is tested on real Spark in test_compaction.py."""

from __future__ import annotations

from types import SimpleNamespace

from epochal.storage.compaction import per_pass, plan


class Counts:
    """Committed change epochs since each table's snapshot, as the meta store counts them."""

    def __init__(self, pending: dict[str, int]):
        self.pending = pending
        self.epoch = 100

    def change_epochs_since_snapshot(self, table: str) -> tuple[int | None, int, int | None]:
        return self.epoch - self.pending[table], self.pending[table], self.epoch


def reader(counts: Counts) -> SimpleNamespace:
    return SimpleNamespace(catalog=counts)


def test_a_spread_pass_takes_the_most_behind_and_every_table_twice_its_interval_behind() -> None:
    tables = [f"t{i}" for i in range(12)]
    counts = Counts(dict.fromkeys(tables, 16))
    assert per_pass(12, 16) == 2
    assert [t for t, _ in plan(reader(counts), 16, tables)] == tables, "not spread: every due table"
    assert [t for t, _ in plan(reader(counts), 16, tables, spread=True)] == ["t0", "t1"]
    counts.pending.update(t3=20, t7=33, t9=40, t10=3)
    assert sorted(t for t, _ in plan(reader(counts), 16, tables, spread=True)) == ["t7", "t9"]
    counts.pending.update(t5=32)
    assert sorted(t for t, _ in plan(reader(counts), 16, tables, spread=True)) == ["t5", "t7", "t9"]
    assert all(epoch == 100 for _, epoch in plan(reader(counts), 16, tables, spread=True)), "at the committed epoch"


def test_tables_that_fall_due_together_are_spread_and_none_falls_behind() -> None:
    """Start (every table due in the same epoch), then 200 epochs: each pass compacts at most its
    share once the first round is done, and no table ever goes past twice its interval."""
    for n, every in ((13, 16), (40, 16), (5, 4), (3, 16)):
        tables = [f"t{i}" for i in range(n)]
        counts = Counts(dict.fromkeys(tables, 0))
        sizes, worst = [], 0
        for _ in range(200):
            for t in tables:
                counts.pending[t] += 1
            worst = max(worst, *counts.pending.values())
            done = [t for t, _ in plan(reader(counts), every, tables, spread=True)]
            for t in done:
                counts.pending[t] = 0
            sizes.append(len(done))
        assert worst <= 2 * every, (n, every, worst)
        assert max(sizes[3 * every :]) <= per_pass(n, every), (n, every, sizes)
        assert sum(sizes[3 * every :]) >= (200 - 3 * every) * n // every - n, "every table keeps being compacted"


def test_small_intervals_take_every_due_table() -> None:
    """EPOCHAL_COMPACT_EVERY of 1 or 2: a pass does every due table, as before the spread."""
    tables = [f"t{i}" for i in range(9)]
    counts = Counts(dict.fromkeys(tables, 2))
    assert len(plan(reader(counts), 2, tables, spread=True)) == 9
    assert len(plan(reader(counts), 1, tables, spread=True)) == 9
