"""``ManualClock``: time that only moves when a test moves it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from orleanspy.clock import to_ms

__all__ = ["ManualClock"]

_DEFAULT_START = datetime(2030, 1, 1, tzinfo=UTC)


class ManualClock:
    """A ``Clock`` whose time advances only through ``advance`` / ``set``.

    Sleepers wake in deadline order. ``advance`` first lets the event loop run
    what is ready at the current time, then jumps from one sleeper's deadline to
    the next and lets the loop run between jumps, so a periodic loop (sleep, work,
    sleep) sees every one of its deadlines, as with real time.
    """

    def __init__(self, start: datetime = _DEFAULT_START, *, settle_rounds: int = 20) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start.astimezone(UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._settle_rounds = settle_rounds

    def now(self) -> datetime:
        return self._now

    def now_ms(self) -> int:
        return to_ms(self._now)

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + timedelta(seconds=max(0.0, seconds)))

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (when, next(self._seq), fut))
        await fut

    def call_at(self, when: datetime, callback: Callable[[], object]) -> asyncio.Future[None]:
        """Call ``callback`` when time reaches ``when`` (as a sleeper would wake);
        cancelling the returned future calls it off."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: None if f.cancelled() else callback())
        if when <= self._now:
            fut.set_result(None)
        else:
            heapq.heappush(self._sleepers, (when, next(self._seq), fut))
        return fut

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> datetime | None:
        """The earliest deadline any live sleeper waits for."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def settle(self) -> None:
        """Let woken tasks run: yield to the event loop up to ``settle_rounds``
        rounds, fewer once nothing else is ready to run.

        On asyncio's own loop the ready queue is visible (``loop._ready``): once
        it held nothing but this task for two rounds in a row, every woken task
        has run to its next wait, and more rounds would only spin. Cutting them
        is what makes ``advance(timedelta(days=4))`` over a silo's 30-second poll
        take a fraction of a second rather than seconds. Other loops (uvloop)
        do not expose it and get every round.
        """
        ready = getattr(asyncio.get_running_loop(), "_ready", None)
        idle = 0
        for _ in range(self._settle_rounds):
            await asyncio.sleep(0)
            if ready is not None:
                idle = idle + 1 if not ready else 0
                if idle >= 2:
                    return

    async def advance(
        self,
        delta: timedelta | float = 0,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
    ) -> None:
        """Move time forward by ``delta`` (a ``timedelta`` or seconds) plus the
        keyword amounts (``advance(days=4)``), waking sleepers deadline by deadline."""
        if isinstance(delta, (int, float)):
            delta = timedelta(seconds=delta)
        delta += timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if delta < timedelta(0):
            raise ValueError("a ManualClock never goes backwards")
        await self.set(self._now + delta)

    async def set(self, when: datetime) -> None:
        """Move time forward to ``when`` (see ``advance``)."""
        if when < self._now:
            raise ValueError("a ManualClock never goes backwards")
        # Work already ready runs at the current time first: a reminder registered
        # just before is still being loaded, and its sleeper must exist before time
        # jumps past its slot (else it is found a day late, and skipped as missed).
        await self.settle()
        while True:
            self._drop_cancelled()
            if not self._sleepers or self._sleepers[0][0] > when:
                break
            deadline = self._sleepers[0][0]
            self._now = max(self._now, deadline)
            while self._sleepers and self._sleepers[0][0] <= self._now:
                _, _, fut = heapq.heappop(self._sleepers)
                if not fut.done():
                    fut.set_result(None)
            await self.settle()
        self._now = when
        await self.settle()

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
