"""A committed epoch never names files that a power loss can take: every change file and directory an
epoch collects, and every file of a snapshot compaction publishes, is fsynced (with the directory
entries that name it) before the meta store records it. Real epochs on Spark or the driver, real files;
os.fsync is watched, not replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epochal.runtime.one_epoch import run_epoch
from epochal.storage.durability import sync_tree
from tests.epochal_harness import make_harness

PIPELINE = {
    "p.sql": """
CREATE SOURCE orders (id BIGINT, customer STRING, amount DOUBLE, ts TIMESTAMP)
WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE MATERIALIZED VIEW totals AS SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;
""",
}


class FsyncWatch:
    """Which paths were fsynced, in order, beside the meta-store records made meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def record(self, what: str) -> None:
        self.events.append(("record", what))

    def synced_before(self, index: int) -> set[str]:
        return {path for kind, path in self.events[:index] if kind == "fsync"}


def _entries(location: str) -> set[str]:
    """The files and directories of ``location``, and ``location`` itself."""
    found = {location}
    for directory, dirs, files in os.walk(location):
        found |= {os.path.join(directory, n) for n in (*dirs, *files)}
    return found


def test_collected_changes_and_published_snapshots_are_on_the_disk_first(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    h = make_harness(tmp_path, PIPELINE)
    runtime = h.runtime(spark)
    runtime.recover("bootstrap")
    watch = FsyncWatch(monkeypatch)
    collect, publish = runtime.controller.collect, runtime.controller.publish_snapshot

    def collecting(epoch, collected, release=False):  # noqa: ANN001, ANN202
        watch.record(f"collect {collected.location}")
        return collect(epoch, collected, release=release)

    def publishing(location, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        watch.record(f"publish {location}")
        return publish(location, *args, **kwargs)

    monkeypatch.setattr(runtime.controller, "collect", collecting)
    monkeypatch.setattr(runtime.controller, "publish_snapshot", publishing)
    try:
        for epoch in range(2):
            h.produce([f'{{"id": {i}, "customer": "c{i % 3}", "amount": {i}.5, "ts": "2026-01-01T10:00:00"}}'
                       for i in range(10 * epoch, 10 * epoch + 10)])
            last = run_epoch(runtime)
        runtime.compact(last, every=1)  # a snapshot of each table
    finally:
        runtime.close()

    checked = 0
    warehouse = str(h.home / "warehouse")
    for index, (kind, what) in enumerate(watch.events):
        if kind != "record" or what.endswith(" None"):
            continue
        location = what.split(" ", 1)[1]
        assert location.startswith(warehouse), location
        synced = watch.synced_before(index)
        missing = _entries(location) - synced
        assert not missing, f"{what}: not on the disk before it was recorded: {sorted(missing)[:5]}"
        # and the directory entries that name it, up to the warehouse
        parents = {str(p) for p in Path(location).parents if str(p).startswith(warehouse)}
        assert parents <= synced, sorted(parents - synced)
        checked += 1
    kinds = {what.split(" ")[0] for kind, what in watch.events if kind == "record" and not what.endswith(" None")}
    assert checked >= 4 and kinds == {"collect", "publish"}, watch.events


def test_sync_tree_syncs_files_directories_and_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = FsyncWatch(monkeypatch)
    (tmp_path / "t" / "epoch=1" / "a" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "epoch=1" / "a" / "part-0.parquet").write_bytes(b"x")
    (tmp_path / "t" / "epoch=1" / "a" / "sub" / "part-1.parquet").write_bytes(b"y")
    assert sync_tree(str(tmp_path / "t" / "epoch=1" / "a"), str(tmp_path)) == 2
    synced = watch.synced_before(len(watch.events))
    assert _entries(str(tmp_path / "t" / "epoch=1" / "a")) | {
        str(tmp_path / "t" / "epoch=1"), str(tmp_path / "t"), str(tmp_path)
    } == synced
    assert sync_tree(str(tmp_path / "missing"), str(tmp_path)) == 0
