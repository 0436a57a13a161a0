"""The threaded executor's order for a run of several epochs (pure logic, no Dagster run): the
oldest epoch's steps first, and a step only after the same step of every older epoch has ended."""

from __future__ import annotations

from dataclasses import dataclass

from platform_defs.executor import EpochOrder, epoch_first


@dataclass(frozen=True)
class Step:
    key: str


def keys(steps: list) -> list[str]:
    return [s.key for s in steps]


def test_oldest_epoch_first_and_the_barrier_before_all() -> None:
    ready = [Step("view__a[e131072]"), Step("barrier"), Step("view__b[e65536]")]
    assert keys(sorted(ready, key=epoch_first)) == ["barrier", "view__b[e65536]", "view__a[e131072]"]
    # epochs above 2**53 still order (floats would tie there)
    big = 11705184542588928
    assert epoch_first(Step(f"x[e{big}]")) < epoch_first(Step(f"x[e{big + 1}]"))


def test_a_step_waits_for_the_same_step_of_older_epochs_only() -> None:
    order = EpochOrder()
    order.take([Step("source__s[e1]"), Step("source__s[e2]"), Step("source__s[e3]"), Step("source__t[e2]")])
    # one of s (the oldest) and t's (no older t taken) may start; s[e2], s[e3] wait for s[e1]
    assert keys(order.startable(4)) == ["source__s[e1]", "source__t[e2]"]
    assert order.held == ["source__s[e2]", "source__s[e3]"]
    assert order.startable(4) == []
    order.ended("source__s[e1]")
    assert keys(order.startable(4)) == ["source__s[e2]"]
    order.ended("source__s[e2]")
    order.take([Step("view__v[e1]")])
    # the limit takes the oldest epoch first
    assert keys(order.startable(1)) == ["view__v[e1]"]
    assert keys(order.startable(1)) == ["source__s[e3]"]


def test_a_skipped_older_step_releases_the_newer() -> None:
    order = EpochOrder()
    order.take([Step("commit[e1]"), Step("commit[e2]")])
    assert keys(order.startable(2)) == ["commit[e1]"]
    order.ended("commit[e1]")  # failed or skipped ends it as well
    assert keys(order.startable(2)) == ["commit[e2]"]
