"""Priority lanes and delivery permits.

Due rows wait in three lanes — critical (priority >= 50), normal, background
(priority <= -50); the window owns them (``DueWindow.lanes``). One drainer
``LaneDrainer`` takes from critical first, then normal, then background, and starts a
delivery task for a row while fewer than ``permits`` deliveries are in
flight; a delivery task that finishes takes the next waiting row in the same
order before it ends. Under overload critical rows keep their lateness low and background
rows absorb the lag.

Rows that come due together share one task first: most ticks complete without
suspending (an idle local grain runs the tick inline), so one task delivers
them all in a single step. Only rows still waiting one loop iteration later,
behind a delivery that suspended, get tasks of their own. A task per row cost
a task's creation and one more loop iteration per wake-up (measured on the
in-memory table at 2,000 ticks/s: see docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["BACKGROUND_AT_MOST", "CRITICAL_AT_LEAST", "LaneDrainer", "Laned", "Lanes", "RowSource"]

log = logging.getLogger(__name__)

CRITICAL_AT_LEAST = 50
BACKGROUND_AT_MOST = -50


class Laned(Protocol):
    """What a lane holds: a row with a priority and a key (the window's ``Row``).

    The lanes name no window type, so the window owns them without an import
    circle."""

    @property
    def priority(self) -> int: ...

    @property
    def key(self) -> str: ...


R = TypeVar("R", bound=Laned)


class Lanes(Generic[R]):
    """Three FIFO lanes (one when priorities are disabled)."""

    def __init__(self, enable_priority: bool = True) -> None:
        self._enable = enable_priority
        self._lanes: tuple[deque[R], deque[R], deque[R]] = (deque(), deque(), deque())

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes)

    def __bool__(self) -> bool:
        critical, normal, background = self._lanes
        return bool(critical or normal or background)

    def put(self, row: R) -> None:
        self._lanes[self._lane_of(row)].append(row)

    def pop(self) -> R | None:
        """The oldest row of the highest non-empty lane."""
        for lane in self._lanes:
            if lane:
                return lane.popleft()
        return None

    def remove(self, row: R) -> bool:
        lane = self._lanes[self._lane_of(row)]
        try:
            lane.remove(row)
        except ValueError:
            return False
        return True

    def _lane_of(self, row: R) -> int:
        if not self._enable:
            return 1
        p = row.priority
        if p >= CRITICAL_AT_LEAST:
            return 0
        if p <= BACKGROUND_AT_MOST:
            return 2
        return 1


class RowSource(Protocol[R]):
    """Where the drainer takes due rows from (``DueWindow``): its lanes, and
    ``take`` for the next waiting row."""

    @property
    def lanes(self) -> Lanes[R]: ...

    def take(self) -> R | None: ...


class LaneDrainer(Generic[R]):
    """Drains the window's lanes: runs ``deliver(row)`` for each due row, at most
    ``permits`` at a time, critical lane first.

    ``kick()`` starts a delivery task for the first waiting row and, one loop
    iteration later, one for each row still waiting, while permits are free;
    the ticker calls it right after it moved rows into the lanes, so a tick
    costs no wake-up of a drainer task. A delivery that finishes takes the
    next waiting row itself, so rows left waiting for a permit are not
    forgotten. ``deliver`` must handle its own errors; anything escaping it is
    logged.
    """

    def __init__(
        self, window: RowSource[R], permits: int, deliver: Callable[[R], Awaitable[None]]
    ) -> None:
        self._window = window
        self._free = permits
        self._deliver = deliver
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._spread_soon = False

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def stop_taking(self) -> None:
        """Start no delivery from now on (rows stay in their lanes); deliveries
        running finish, and take no next row."""
        self._stopped = True

    async def wait_idle(self) -> None:
        """Return once no delivery is running."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def kick(self) -> None:
        """Start a delivery task for the first waiting row; the rest follow it in
        that task, or get tasks of their own at the next loop iteration."""
        if self._start() and self._window.lanes and not self._spread_soon:
            self._spread_soon = True
            asyncio.get_running_loop().call_soon(self._spread)

    def _spread(self) -> None:
        """Start a delivery task for each row still waiting while permits are free
        (the first task's delivery suspended before it could take them)."""
        self._spread_soon = False
        while self._start():
            pass

    def _start(self) -> bool:
        """Start a delivery task for the next waiting row if a permit is free."""
        if self._free <= 0 or self._stopped:
            return False
        row = self._window.take()
        if row is None:
            return False
        self._free -= 1
        # The task drops itself from ``_tasks`` as it ends: a done callback
        # would cost one more loop iteration per delivery.
        self._tasks.add(asyncio.create_task(self._one(row)))
        return True

    async def run(self) -> None:
        """Start what waits, then hold until cancelled; then cancel and reap the
        deliveries in flight."""
        try:
            self._spread()
            await asyncio.Future()  # until cancelled
        finally:
            self._stopped = True
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A task cancelled before its first step never ran its ``finally``.
            self._tasks.clear()

    async def _one(self, row: R | None) -> None:
        # A delivery task keeps its permit and takes the next due row itself
        # while rows wait: under a backlog a tick then costs no task of its own.
        window = self._window
        try:
            while row is not None:
                try:
                    await self._deliver(row)
                except Exception:
                    log.exception("reminder delivery failed unexpectedly key=%s", row.key)
                row = None if self._stopped else window.take()
        finally:
            self._free += 1
            self._tasks.discard(asyncio.current_task())
