"""What the reminder table checks share: the factory type, rows to write, brute-force
answers of the due order, and a primed change feed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Final

from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    ReminderChange,
    ReminderEntry,
    ReminderPriority,
)
from orleanspy.reminders.table import (
    ReminderTable,
)
from orleanspy.ring import HASH_SPACE, RingRange

__all__ = [
    "BULK",
    "CHANGE_DEADLINE_S",
    "PRIORITIES",
    "PROBE",
    "T0",
    "TOP",
    "Check",
    "TableFactory",
    "as_stored",
    "bulk_entries",
    "check_due_answer",
    "due_order",
    "new_row",
    "next_change",
    "prime",
    "random_range",
    "service_id_of",
    "upsert_all",
]

TableFactory = Callable[[], AbstractAsyncContextManager[ReminderTable]]


Check = Callable[[TableFactory], Awaitable[None]]


T0: Final = datetime(2030, 1, 1, tzinfo=UTC)


TOP: Final = HASH_SPACE - 1


# How long a change may take to arrive before the feed counts as broken.
CHANGE_DEADLINE_S: Final = 10.0


PROBE: Final = GrainId("ContractProbe", "feed-probe")


BULK: Final = 1000


def service_id_of(table: ReminderTable) -> str:
    sid = getattr(table, "service_id", "contract")
    return sid if isinstance(sid, str) else "contract"


def new_row(
    table: ReminderTable,
    grain_id: GrainId,
    name: str = "r",
    *,
    due: datetime = T0,
    **fields: object,
) -> ReminderEntry:
    base = ReminderEntry(
        service_id=service_id_of(table),
        grain_id=grain_id,
        name=name,
        start_at=T0,
        next_due=due,
        period=timedelta(minutes=1),
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def as_stored(entry: ReminderEntry, etag: str) -> ReminderEntry:
    """What a table must return for ``entry``: millisecond times and its etag."""
    return ReminderEntry.from_record({**entry.to_record(), "e": etag})


def random_range(rng: random.Random) -> RingRange:
    """Random bounds, with the edges of the hash space often enough to matter."""
    pick = rng.random()
    if pick < 0.05:
        return RingRange(0, 0)
    if pick < 0.10:
        x = rng.randrange(HASH_SPACE)
        return RingRange(x, x)
    if pick < 0.15:
        return RingRange(TOP, rng.randrange(HASH_SPACE))
    if pick < 0.20:
        return RingRange(rng.randrange(HASH_SPACE), 0)
    return RingRange(rng.randrange(HASH_SPACE), rng.randrange(HASH_SPACE))


async def upsert_all(table: ReminderTable, entries: list[ReminderEntry]) -> dict[str, str]:
    """Upsert concurrently in chunks; the etag of each row by ``key``."""
    etags: dict[str, str] = {}
    for i in range(0, len(entries), 100):
        chunk = entries[i : i + 100]
        for e, etag in zip(chunk, await asyncio.gather(*map(table.upsert, chunk)), strict=True):
            etags[e.key] = etag
    return etags


PRIORITIES: Final = (
    ReminderPriority.CRITICAL,
    ReminderPriority.NORMAL,
    ReminderPriority.NORMAL,
    ReminderPriority.BACKGROUND,
    127,
    -128,
    5,
)


def bulk_entries(table: ReminderTable, rng: random.Random, n: int) -> list[ReminderEntry]:
    """``n`` rows over many grains (two names on some), with next_due spread over
    two hours at millisecond precision and some exact ties, in several priorities
    (the named ones most, the extremes -128 and 127 too)."""
    entries: list[ReminderEntry] = []
    for i in range(n):
        gid = GrainId("ContractGrain", i // 2 if i % 3 else f"k{i}")
        if rng.random() < 0.1:
            due = T0 + timedelta(minutes=rng.randrange(0, 120))
        else:
            due = T0 + timedelta(milliseconds=rng.randrange(0, 2 * 3600 * 1000))
        priority = int(rng.choice(PRIORITIES))
        entries.append(new_row(table, gid, f"r{i}", due=due, priority=priority))
    return entries


def due_order(e: ReminderEntry) -> tuple[int, datetime]:
    """The contract's due order: priority descending, then next_due ascending."""
    return (-int(e.priority), e.next_due)


def check_due_answer(
    what: str,
    got: list[ReminderEntry],
    pool: list[ReminderEntry],
    *,
    r: RingRange | None,
    before: datetime,
    limit: int,
) -> None:
    """``got`` must be the first ``limit`` rows of ``pool`` in ``r`` due by
    ``before`` in the due order: priority descending, then next_due ascending
    (any order, and any choice, among ties of both)."""
    qualifying = [e for e in pool if (r is None or e.hash in r) and e.next_due <= before]
    keys = {e.key for e in qualifying}
    got_keys = [e.key for e in got]
    assert len(got_keys) == len(set(got_keys)), f"{what}: a row came back twice"
    stray = [k for k in got_keys if k not in keys]
    assert not stray, f"{what} {r} before={before}: rows outside range or not due: {stray[:5]}"
    assert len(got) == min(limit, len(qualifying)), (
        f"{what} {r} before={before} limit={limit}: "
        f"{len(got)} rows, expected {min(limit, len(qualifying))}"
    )
    order = [due_order(e) for e in got]
    assert order == sorted(order), (
        f"{what}: rows not in the due order (priority descending, then next_due)"
    )
    if got and len(got) < len(qualifying):
        left = {e.key for e in qualifying} - set(got_keys)
        first_left = min(due_order(e) for e in qualifying if e.key in left)
        assert order[-1] <= first_left, (
            f"{what}: returned a row of (priority, due) ({-order[-1][0]}, {order[-1][1]}) "
            f"while one of ({-first_left[0]}, {first_left[1]}) was left out"
        )
    # The brute-force answer, compared as (priority, due) pairs (ties may pick
    # different rows).
    want = sorted(due_order(e) for e in qualifying)[: len(got)]
    assert order == want, f"{what}: answer differs from the brute-force due order"


async def next_change(it: AsyncIterator[ReminderChange]) -> ReminderChange:
    """The next change not caused by the feed probe, within the deadline."""
    try:
        async with asyncio.timeout(CHANGE_DEADLINE_S):
            while True:
                change = await anext(it)
                if change.grain_id != PROBE:
                    return change
    except TimeoutError:
        raise AssertionError(f"no change arrived within {CHANGE_DEADLINE_S}s") from None


async def prime(table: ReminderTable, it: AsyncIterator[ReminderChange]) -> None:
    """Make sure the subscription is live: write a probe row until its change arrives.

    A feed may subscribe lazily (on the first ``anext``); changes written after
    the first one seen are then guaranteed to reach it while the store is up.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CHANGE_DEADLINE_S
    pending = asyncio.ensure_future(anext(it))
    try:
        while not pending.done():
            assert loop.time() < deadline, (
                f"changes() delivered nothing within {CHANGE_DEADLINE_S}s"
            )
            await table.upsert(new_row(table, PROBE, due=T0))
            await asyncio.wait({pending}, timeout=0.05)
        change = pending.result()
        assert change.grain_id == PROBE, f"unexpected change {change} before any write"
    finally:
        if not pending.done():
            pending.cancel()
