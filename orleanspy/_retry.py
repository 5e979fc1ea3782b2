"""Retry delays shared by every part that waits out a failing store.

One helper, so the reminder service, the Redis change feed and the Redis stream
provider back off the same way: exponential delays with jitter, reset by the
first success.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta

__all__ = ["Backoff"]


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
