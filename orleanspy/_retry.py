"""Retry delays shared by every part that waits out a failing store, and the
deadline of the grain call a task works for.

One helper, so the reminder service, the Redis change feed, the Redis stream
provider and the stores' failover retries back off the same way: exponential
delays with jitter, reset by the first success. ``within`` and
``seconds_left`` carry a call's deadline to the stores it touches (below).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta

__all__ = ["DEFAULT_WINDOW", "Backoff", "no_deadline", "seconds_left", "within"]


class Backoff:
    """Exponential retry delays from ``initial`` to ``maximum`` with jitter.

    Each delay is drawn from ``[d/2, d]`` where ``d`` doubles per attempt, so
    many silos retrying the same store do not retry in lockstep. ``reset`` after
    a success starts again from ``initial``.
    """

    def __init__(
        self,
        initial: timedelta,
        maximum: timedelta,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._initial = initial.total_seconds()
        self._maximum = max(self._initial, maximum.total_seconds())
        self._rng = rng
        self._attempt = 0

    @property
    def failing(self) -> bool:
        """Whether a delay was handed out since the last ``reset``."""
        return self._attempt > 0

    def next(self) -> float:
        """The next delay in seconds."""
        d = min(self._maximum, math.ldexp(self._initial, min(self._attempt, 62)))
        self._attempt += 1
        return d * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self._attempt = 0


# -- the deadline of the call a task works for -----------------------------------------
#
# A grain call has a deadline (its message's expiry: the caller's response
# timeout). Whatever the runtime does for the call (locate the grain, register
# its activation, read and write its state, publish to a stream) may wait out a
# failing store until then, and no longer: past it nobody waits for the answer.
# The runtime sets it where a call's work starts (``within``); the stores'
# retry loops read it (``seconds_left``). A context variable, because the work
# runs in tasks the call spawns, which copy the context they start in.

#: How long work outside any call (none set) waits out a failing store: not at
#: all. Such work (a provider used directly, the reminder service's own reads
#: and writes, a tick run inline) has its own backoff and would only add to it.
DEFAULT_WINDOW = 0.0

_deadline: ContextVar[float | None] = ContextVar("orleanspy_call_deadline", default=None)


def within(seconds: float) -> None:
    """From now on, this task (and tasks it starts) works for a call that must
    be answered within ``seconds`` (``time.monotonic`` based). Set once where
    the call's work begins, in a task of its own: no reset is needed, the
    value dies with the task's context."""
    _deadline.set(time.monotonic() + max(0.0, seconds))


def no_deadline() -> None:
    """From now on, this task works for no call (nothing waits for an answer):
    ``seconds_left`` gives its default. For a task that may have inherited
    another call's deadline with its context."""
    _deadline.set(None)


def seconds_left(default: float = DEFAULT_WINDOW) -> float:
    """Seconds until the deadline of the call this task works for; ``default``
    when it works for none (``within`` was not called). Never negative."""
    deadline = _deadline.get()
    if deadline is None:
        return default
    return max(0.0, deadline - time.monotonic())
