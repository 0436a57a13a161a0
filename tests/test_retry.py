"""The one retry policy every retry loop of Epochal uses (pure logic: failures are made up here)."""

from __future__ import annotations

import time

import pytest

from epochal.retry import retrying


class Flaky(Exception):
    pass


def failing(times: int, error: type[BaseException] = Flaky):
    calls: list[int] = []

    def call() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            raise error(f"failure {len(calls)}")
        return "done"

    return call, calls


def test_a_retryable_failure_is_retried_until_the_call_succeeds() -> None:
    call, calls = failing(3)
    seen = []
    result = retrying(
        retry_on=lambda exc: isinstance(exc, Flaky),
        base=0.001,
        cap=0.004,
        attempts=5,
        on_retry=lambda exc, attempt, delay: seen.append((str(exc), attempt, delay)),
    )(call)
    assert result == "done" and calls == [1, 2, 3, 4]
    assert [(what, attempt) for what, attempt, _ in seen] == [("failure 1", 1), ("failure 2", 2), ("failure 3", 3)]
    # full jitter: the n-th wait is drawn from [0, min(cap, base * 2**(n-1))]
    assert all(0 <= delay <= min(0.004, 0.001 * 2 ** (attempt - 1)) for _, attempt, delay in seen)


def test_any_other_failure_is_raised_at_once() -> None:
    call, calls = failing(1, ValueError)
    with pytest.raises(ValueError, match="failure 1"):
        retrying(retry_on=lambda exc: isinstance(exc, Flaky), base=0.001, cap=0.01, attempts=5)(call)
    assert calls == [1]


def test_after_the_last_attempt_give_up_names_the_problem_chained_to_the_last_failure() -> None:
    call, calls = failing(10)
    with pytest.raises(RuntimeError, match="gave up after 3 attempts: failure 3") as raised:
        retrying(
            retry_on=lambda exc: isinstance(exc, Flaky),
            base=0.001,
            cap=0.01,
            attempts=3,
            give_up=lambda exc, attempts: RuntimeError(f"gave up after {attempts} attempts: {exc}"),
        )(call)
    assert calls == [1, 2, 3]
    assert isinstance(raised.value.__cause__, Flaky)


def test_past_the_deadline_the_last_failure_is_raised_as_it_is() -> None:
    call, calls = failing(10_000)
    started = time.monotonic()
    with pytest.raises(Flaky):
        retrying(retry_on=lambda exc: isinstance(exc, Flaky), base=0.001, cap=0.01, deadline=started + 0.2)(call)
    assert 0.2 <= time.monotonic() - started < 2
    assert 2 < len(calls) < 10_000


def test_the_iterator_form_tells_each_attempt_its_number() -> None:
    numbers = []
    for attempt in retrying(retry_on=lambda exc: isinstance(exc, Flaky), base=0.001, cap=0.01, attempts=4):
        with attempt:
            numbers.append(attempt.retry_state.attempt_number)
            if len(numbers) < 3:
                raise Flaky("again")
    assert numbers == [1, 2, 3]


def test_an_unbounded_retry_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a deadline or a number of attempts"):
        retrying(retry_on=lambda exc: True, base=0.001, cap=0.01)
