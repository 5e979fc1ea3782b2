"""The poll is the safety net: a row whose change notice was lost is found by the
next poll, within one ``poll_interval``, on every table backend.

Each table here is the real backend with a change feed that drops everything
(``changes`` and ``scoped_changes`` never yield), as if every notice of another
writer's write were lost while the feed stayed up.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderChange
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from tests.reminders.test_service import OPTIONS, START, Recorder, S, advance, entry, running


class _Deaf:
    """A change feed that drops every notice."""

    def __aiter__(self) -> _Deaf:
        return self

    async def __anext__(self) -> ReminderChange:
        await asyncio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


def _deaf(cls: type) -> type:
    """``cls`` with its change feeds replaced by ``_Deaf``."""
    return type(
        f"Deaf{cls.__name__}",
        (cls,),
        {"changes": lambda self: _Deaf(), "scoped_changes": lambda self, scope: _Deaf()},
    )


@pytest.fixture(params=["memory", "redis", "postgres"])
def backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The backend's name and URL (the server fixtures start outside the loop)."""
    name = str(request.param)
    url = "" if name == "memory" else str(request.getfixturevalue(f"{name}_url"))
    return name, url


@pytest.fixture
async def deaf_table(backend: tuple[str, str]) -> AsyncIterator[Any]:
    name, url = backend
    makers: dict[str, Callable[[], Any]] = {
        "memory": _deaf(InMemoryReminderTable),
        "redis": lambda: _deaf(RedisReminderTable)(url, service_id=f"lost-{uuid.uuid4().hex[:8]}"),
        "postgres": lambda: _deaf(PostgresReminderTable)(url, service_id="lost"),
    }
    async with AsyncExitStack() as stack:
        table = makers[name]()
        await table.start(stack)
        yield table


async def test_a_row_whose_notice_was_lost_is_found_within_one_poll_interval(
    deaf_table: Any,
) -> None:
    clock = ManualClock(START)
    held = entry(clock, 1, due=10, period=10)
    await deaf_table.upsert(held)
    rec = Recorder()
    poll = OPTIONS.poll_interval.total_seconds()
    async with running(deaf_table, clock, rec) as svc:
        assert svc.stats.resident == 1
        # A few complete polls pass, each finding nothing new (the window holds
        # every near-due row), ticking the held row on the way.
        for k in range(1, 4):
            await advance(clock, poll)
            await wait_for(lambda k=k: svc.stats.refills >= 1 + k, 10.0, interval=0.01)
        # Another writer adds a row due well inside the look-ahead, long before
        # a later refill's horizon; its notice is lost.
        lost = entry(clock, 2, due=poll + 20, period=3600)
        await deaf_table.upsert(lost)
        assert svc.stats.resident == 1
        refills = svc.stats.refills
        await advance(clock, poll)  # one poll interval
        await wait_for(lambda: svc.stats.refills > refills, 10.0, interval=0.01)
        await wait_for(lambda: svc.stats.resident == 2, 10.0, interval=0.01)
        await clock.set(lost.next_due)
        await wait_for(lambda: lost.key in set(rec.keys()), 10.0, interval=0.01)
    status = next(s for e, s in rec.calls if e.key == lost.key)
    assert status.current_tick_time == lost.next_due and status.missed_ticks == 0
    assert START + 10 * S in rec.slots(held.name)
