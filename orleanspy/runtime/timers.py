"""Grain timers: non-durable callbacks that run as turns of their activation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Protocol

from orleanspy.clock import Clock
from orleanspy.errors import ConfigurationError
from orleanspy.identity import GrainId

__all__ = ["TimerHandle", "TimerOwner"]

log = logging.getLogger(__name__)


def _as_seconds(value: timedelta | float | None, what: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds >= 0:  # also catches NaN
        raise ConfigurationError(f"timer {what} must be >= 0, got {value!r}")
    return seconds


class TimerOwner(Protocol):
    """What a timer needs of the activation it runs in (implemented by ``Activation``)."""

    @property
    def grain_id(self) -> GrainId: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def accepts_timer_ticks(self) -> bool:
        """``False`` once the activation is going away: the timer stops."""
        ...

    def enqueue_timer_tick(self, callback: Callable[[], Awaitable[None]]) -> asyncio.Future[None]:
        """Run ``callback`` as a turn; the future completes when the turn ends."""
        ...

    def forget_timer(self, handle: TimerHandle) -> None: ...


class TimerHandle:
    """A running grain timer. ``dispose()`` stops it; it also stops with its activation.

    The first tick comes ``due`` after registration; each next one ``period``
    after the previous callback returned (so ticks never overlap). An exception
    in the callback is logged and the timer goes on.
    """

    def __init__(
        self,
        activation: TimerOwner,
        callback: Callable[[], Awaitable[None]],
        due: timedelta | float,
        period: timedelta | float | None,
    ) -> None:
        due_s = _as_seconds(due, "due")
        self._period = _as_seconds(period, "period")
        if self._period == 0:
            raise ConfigurationError("timer period must be > 0 (or None for a one-shot timer)")
        self._activation = activation
        self._callback = callback
        self.ticks = 0
        self._task = asyncio.get_running_loop().create_task(self._run(due_s or 0.0))

    @property
    def disposed(self) -> bool:
        return self._task.done()

    def dispose(self) -> None:
        """Stop the timer; a tick already running finishes its turn."""
        if not self._task.done():
            self._task.cancel()
        self._activation.forget_timer(self)

    async def _run(self, due: float) -> None:
        clock = self._activation.clock
        await clock.sleep(due)
        while self._activation.accepts_timer_ticks:
            done = self._activation.enqueue_timer_tick(self._callback)
            try:
                await done
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer callback failed grain=%s", self._activation.grain_id)
            self.ticks += 1
            if self._period is None:
                break
            await clock.sleep(self._period)
        self._activation.forget_timer(self)
