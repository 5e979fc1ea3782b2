"""Race scenarios for a reminder table under the reminder service: reads held open.

Part of the reminder table kit: ``check_reminder_table`` runs them after the
contract checks, and ``REMINDER_TABLE_CHECKS`` ends with them
(``REMINDER_RACE_CHECKS``), for one test per check.
Each runs a ``ReminderService`` on a manual clock over the table under test,
wrapped in ``HeldReads``: a chosen read gets its answer from the table, then
waits until the scenario releases it, so the answer is stale by the time the
service sees it. Writes made meanwhile go to the table as usual; those of the
registry tell the service as in a silo, and those of "another writer" are told
to it as its change feed would (a feed leaves out a table instance's own
writes, and the factory gives one instance per store). The
scenarios follow Orleans' reminder service tests (a registration or an
unregistration racing the service's reads of the table) and hold the service,
with this table, to two promises:

- a registration made through the registry takes effect when the call returns,
  also while a read of the table is in progress: the old schedule never fires
  after it;
- a read never installs a row older than the newest change seen for its key,
  and never re-admits a row that was removed.

A table whose reads do not see writes that completed before them fails these.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, Final, cast

from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.model import ReminderChange, ReminderEntry, TickStatus
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.spec import ReminderSpec
from orleanspy.reminders.table import ReminderTable
from orleanspy.ring import RingRange
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import wait_for

__all__ = ["REMINDER_RACE_CHECKS", "HeldReads"]

TableFactory = Callable[[], AbstractAsyncContextManager[ReminderTable]]

_S: Final = timedelta(seconds=1)
_T0: Final = datetime(2031, 6, 1, tzinfo=UTC)
# Real seconds to wait for the service (it runs on the manual clock).
_DEADLINE_S: Final = 10.0
_OPTIONS: Final = ReminderOptions(
    look_ahead=timedelta(minutes=5),
    poll_interval=timedelta(minutes=2),
    repair_interval=timedelta(hours=1),
    base_bucket_size=64,
    permits=4,
    adaptive=False,
    history_size=0,
)
#: The registry's check that a grain may have reminders, for rows of any type.
_ANY_REMINDABLE: Final = cast(GrainDefinition, SimpleNamespace(remindable=True))
# What ``HeldReads.hold`` holds: a point read, or any range read (whichever the
# service uses: ``read_due_skipping`` where the table offers it and the runtime
# sees it, else ``read_due``).
_KIND_OF: Final = {
    "read": "point",
    "read_due": "range",
    "read_due_skipping": "range",
    "read_range": "range",
}


class _Hold:
    def __init__(self) -> None:
        self.answered = asyncio.Event()
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()


class HeldReads:
    """Wraps a ``ReminderTable``: ``hold(kind)`` makes the next point read
    (``"point"``: ``read``) or range read (``"range"``: ``read_due``,
    ``read_due_skipping``, ``read_range``) take its answer from the table, then
    wait until released (``_Hold.answered`` is set once the answer is in).
    Everything else passes through, the optional protocols included (their
    methods are looked up on the wrapped table)."""

    def __init__(self, table: ReminderTable) -> None:
        self._table = table
        self._holds: dict[str, list[_Hold]] = {}

    def hold(self, kind: str) -> _Hold:
        if kind not in ("point", "range"):
            raise ValueError(f"cannot hold {kind!r}: 'point' or 'range'")
        h = _Hold()
        self._holds.setdefault(kind, []).append(h)
        return h

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._table, name)
        if name in _KIND_OF:
            return self._held(name, inner)
        return inner

    # The base protocol's methods, explicitly (a runtime Protocol check looks
    # them up on the class); optional ones come through ``__getattr__``.
    async def start(self, stack: AsyncExitStack) -> None:
        await self._table.start(stack)

    async def upsert(self, entry: ReminderEntry) -> str:
        return await self._table.upsert(entry)

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        result: ReminderEntry | None = await self._held("read", self._table.read)(grain_id, name)
        return result

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        return await self._table.read_grain(grain_id)

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        result: list[ReminderEntry] = await self._held("read_range", self._table.read_range)(r)
        return result

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        result: list[ReminderEntry] = await self._held("read_due", self._table.read_due)(
            r, before, limit
        )
        return result

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        return await self._table.update_schedule(grain_id, name, etag, next_due, last_fire)

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        return await self._table.remove(grain_id, name, etag)

    async def count(self) -> int:
        return await self._table.count()

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        return await self._table.upcoming(before, limit)

    def changes(self) -> Any:
        return self._table.changes()

    def _held(self, kind: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await method(*args, **kwargs)
            holds = self._holds.get(_KIND_OF[kind])
            if holds:
                h = holds.pop(0)
                h.answered.set()
                await h.released.wait()
            return result

        return call


class _Scenario:
    """A started service over a held table, with its registry and ticks."""

    def __init__(self, table: ReminderTable) -> None:
        self.table = HeldReads(table)
        self.clock = ManualClock(_T0)
        self.ticks: list[tuple[str, datetime, datetime]] = []
        service_id = getattr(table, "service_id", "contract")
        self.service_id = service_id if isinstance(service_id, str) else "contract"
        self.registry = ReminderRegistry(
            cast(ReminderTable, self.table),
            service_id=self.service_id,
            clock=self.clock,
            options=_OPTIONS,
            definitions=lambda _type: _ANY_REMINDABLE,
        )

        async def deliver(entry: ReminderEntry, status: TickStatus, deadline: float) -> None:
            self.ticks.append((entry.name, status.current_tick_time, status.first_tick_time))

        self.service = ReminderService(
            cast(ReminderTable, self.table),
            deliver=deliver,
            clock=self.clock,
            options=_OPTIONS,
            name="race",
        )
        self.registry.add_listener(self.service.notify_change)

    async def start(self, stack: AsyncExitStack) -> None:
        self.service.set_ranges([RingRange.full()])
        await self.service.start(stack)
        await self.service.refill_now()

    async def held(self, n: int) -> None:
        await wait_for(lambda: self.service.stats.loaded == n, _DEADLINE_S, what=f"{n} rows held")

    async def advance(self, seconds: float) -> None:
        await self.clock.settle()
        await self.clock.advance(seconds * _S)
        await self.clock.settle()

    def heard(self, entry: ReminderEntry | None, gid: GrainId, name: str) -> None:
        """Tell the service of another writer's write, as a change feed does (a
        feed leaves out this instance's own writes, so the scenario says it)."""
        self.service.notify_change(
            ReminderChange(
                gid,
                name,
                None if entry is None else entry.next_due,
                None if entry is None else int(entry.priority),
            )
        )

    def entry(self, gid: GrainId, name: str, *, due_s: float, period_s: float) -> ReminderEntry:
        start = self.clock.now() + due_s * _S
        return ReminderEntry(
            service_id=self.service_id,
            grain_id=gid,
            name=name,
            start_at=start,
            next_due=start,
            period=period_s * _S,
        )

    def slots(self, name: str) -> list[datetime]:
        return [slot for n, slot, _ in self.ticks if n == name]


@asynccontextmanager
async def _scenario(factory: TableFactory) -> AsyncIterator[_Scenario]:
    async with factory() as table, AsyncExitStack() as stack:
        s = _Scenario(table)
        await s.start(stack)
        yield s


async def check_reregistration_during_a_held_refill_takes_effect_at_once(
    factory: TableFactory,
) -> None:
    """A re-registration made while a range read is held: once it has returned,
    the old schedule never fires, and the read, answered before it, does not
    bring the old row back."""
    async with _scenario(factory) as s:
        gid = GrainId("Race", "rereg")
        await s.registry.register(gid, "r", ReminderSpec(due=10, period=60))
        await s.held(1)
        hold = s.table.hold("range")
        refill = asyncio.create_task(s.service.refill_now())
        try:
            await asyncio.wait_for(hold.answered.wait(), _DEADLINE_S)
            await s.registry.register(gid, "r", ReminderSpec(due=30, period=60))
            await s.advance(15)  # past the old schedule's first slot
            assert s.ticks == [], f"the old schedule fired after re-registration: {s.ticks}"
        finally:
            hold.release()
            await asyncio.wait_for(refill, _DEADLINE_S)
        await s.advance(15)
        await wait_for(lambda: len(s.ticks) == 1, _DEADLINE_S, what="the new schedule's tick")
        assert s.slots("r") == [_T0 + 30 * _S], s.ticks
        await s.advance(60)
        await wait_for(lambda: len(s.ticks) == 2, _DEADLINE_S, what="the next tick")
        assert s.slots("r") == [_T0 + 30 * _S, _T0 + 90 * _S], s.ticks


async def check_a_point_read_answered_before_a_write_installs_no_older_row(
    factory: TableFactory,
) -> None:
    """A row written by another writer is read back (its change is a hint); the
    read is answered, then a newer write of the row and its notification arrive
    before the answer is processed: the older registration is never installed."""
    async with _scenario(factory) as s:
        gid = GrainId("Race", "older")
        hold = s.table.hold("point")
        first = s.entry(gid, "r", due_s=10, period_s=60)
        await s.table.upsert(first)
        s.heard(first, gid, "r")
        await asyncio.wait_for(hold.answered.wait(), _DEADLINE_S)
        newer = s.entry(gid, "r", due_s=30, period_s=60)
        await s.table.upsert(newer)
        s.heard(newer, gid, "r")
        hold.release()
        await s.held(1)
        await s.advance(15)
        assert s.ticks == [], f"the older registration was installed: {s.ticks}"
        await s.advance(15)
        await wait_for(lambda: len(s.ticks) == 1, _DEADLINE_S, what="the newer row's tick")
        assert s.slots("r") == [_T0 + 30 * _S], s.ticks


async def check_a_point_read_does_not_readmit_a_removed_row(factory: TableFactory) -> None:
    """A row written by another writer is read back; the read is answered, then
    the row is unregistered before the answer is processed: it never ticks."""
    async with _scenario(factory) as s:
        gid = GrainId("Race", "removed-point")
        hold = s.table.hold("point")
        row = s.entry(gid, "r", due_s=10, period_s=60)
        etag = await s.table.upsert(row)
        s.heard(row, gid, "r")
        await asyncio.wait_for(hold.answered.wait(), _DEADLINE_S)
        assert await s.registry.unregister(gid, "r"), "the row to unregister is missing"
        hold.release()
        await s.service.refill_now()
        await s.advance(20)
        assert s.ticks == [], f"an unregistered row ticked: {s.ticks}"
        assert s.service.stats.resident == 0
        assert etag  # the write happened


async def check_a_range_read_does_not_readmit_a_removed_row(factory: TableFactory) -> None:
    """A range read is answered with a row, which another writer removes (the
    service hears of it on the feed) before the answer is processed: the row is
    not loaded again and never ticks."""
    async with _scenario(factory) as s:
        gid = GrainId("Race", "removed-range")
        row = s.entry(gid, "r", due_s=100, period_s=600)
        etag = await s.table.upsert(row)
        s.heard(row, gid, "r")
        await s.service.refill_now()
        await s.held(1)
        hold = s.table.hold("range")
        refill = asyncio.create_task(s.service.refill_now())
        try:
            await asyncio.wait_for(hold.answered.wait(), _DEADLINE_S)
            assert await s.table.remove(gid, "r", etag)
            s.heard(None, gid, "r")
        finally:
            hold.release()
            await asyncio.wait_for(refill, _DEADLINE_S)
        assert s.service.stats.resident == 0, "the removed row is held again"
        await s.advance(120)
        assert s.ticks == [], f"a removed row ticked: {s.ticks}"


REMINDER_RACE_CHECKS: Final = (
    check_reregistration_during_a_held_refill_takes_effect_at_once,
    check_a_point_read_answered_before_a_write_installs_no_older_row,
    check_a_point_read_does_not_readmit_a_removed_row,
    check_a_range_read_does_not_readmit_a_removed_row,
)
"""The race scenarios, each taking the factory."""
