"""Retrying a transient failure: exponential backoff with full jitter, bounded by a deadline, a
number of attempts, or both. Every retry loop of Epochal is one of these, on tenacity.

Full jitter (each wait drawn from [0, min(cap, base * 2**(n-1))] after the n-th failure) spreads
processes that failed together, e.g. on one locked meta-store file, instead of retrying in lockstep.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tenacity

#: (the failure, the attempts made so far) -> the error to raise instead of the last failure
GiveUp = Callable[[BaseException, int], BaseException]
#: (the failure, the attempt that failed, the seconds about to be slept) -> None
OnRetry = Callable[[BaseException, int, float], None]


def retrying(
    *,
    retry_on: Callable[[BaseException], bool],
    base: float,
    cap: float,
    deadline: float | None = None,
    attempts: int | None = None,
    give_up: GiveUp | None = None,
    on_retry: OnRetry | None = None,
) -> tenacity.Retrying:
    """A tenacity ``Retrying`` that reruns a call (``retrying(...)(fn, *args)``, or
    ``for attempt in retrying(...): with attempt: ...``) while it fails with an exception that
    ``retry_on`` accepts. Any other exception, or success, ends it at once.

    It stops retrying once ``time.monotonic()`` has passed ``deadline`` or ``attempts`` calls have
    failed, and raises ``give_up(last failure, attempts)`` chained to that failure, or the last
    failure itself without ``give_up``. ``on_retry`` is told of each failure before the wait.
    """
    if deadline is None and attempts is None:
        raise ValueError("retrying() needs a deadline or a number of attempts: unbounded, it hides a stuck resource")
    if attempts is not None and attempts < 1:
        raise ValueError(f"retrying() needs at least one attempt, not {attempts}")
    stops: list[tenacity.stop.stop_base] = []
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    if deadline is not None:
        stops.append(_past(deadline))

    def fail(state: tenacity.RetryCallState) -> None:
        failure = _failure(state)
        if give_up is None:
            raise failure
        raise give_up(failure, state.attempt_number) from failure

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.next_action is not None:
            on_retry(_failure(state), state.attempt_number, state.next_action.sleep)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_on),
        wait=tenacity.wait_random_exponential(multiplier=base, max=cap),
        stop=tenacity.stop_any(*stops),
        before_sleep=before_sleep,
        retry_error_callback=fail,
    )


class _past(tenacity.stop.stop_base):
    """Stop once the monotonic clock is past ``deadline``: a deadline can be shared by nested
    retries (a lock wait inside a transaction's attempt), which a delay since the start cannot."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() > self.deadline


def _failure(state: tenacity.RetryCallState) -> BaseException:
    outcome = state.outcome
    failure = outcome.exception() if outcome is not None else None
    if failure is None:  # only failures are retried, so the outcome that stopped us is one
        raise RuntimeError("tenacity gave up on a call that did not fail")
    return failure
