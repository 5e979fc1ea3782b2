"""The reminder table conformance kit: prove that a ``ReminderTable`` keeps the contract.

A provider author calls it from their own tests with a factory that yields a
fresh, empty, started table per call::

    @asynccontextmanager
    async def make_table():
        async with AsyncExitStack() as stack:
            table = MyReminderTable(...)          # empty, e.g. a fresh service id
            await table.start(stack)
            yield table

    async def test_my_table_keeps_the_contract():
        await check_reminder_table(make_table)

or, for one test per check::

    @pytest.mark.parametrize("check", REMINDER_TABLE_CHECKS, ids=lambda c: c.__name__)
    async def test_contract(check):
        await check(make_table)

A failed check raises ``AssertionError`` saying what was expected. The checks
cover Orleans' ``ReminderTableTestsBase`` (parallel upserts, remove with stale,
wrong and right etag, range reads with random bounds over 1,000 rows including
wrap-around) and the parts orleanspy adds: the due index, schedule CAS (single
and batched, when the table is a ``BatchingReminderTable``), ``upsert_if``
(conditional writes and their races), paging with ``read_page`` and
``count_types`` against brute force, ``upsert_many`` (when it is a
``BulkReminderTable``), ``read_due_skipping`` (when it is a
``SkippingReminderTable``), paused rows and fire history (when it is a
``PausableReminderTable``), ``upcoming``,
``count``, the change feed and a field-by-field round trip, including the
optional schedule fields (one-shot rows, jitter, bounds, payload, retry policy:
``check_schedule_fields``), ended rows' history (when it is an
``EndingReminderTable``) and fenced writers (when it is a
``FencingReminderTable``: ``check_fenced_writer_loses_its_schedule_writes``).
Then the race scenarios of ``reminder_races``: the reminder service over the
table with reads held open (a registration or removal racing a read never lets
a stale row tick). Rows are written with the
table's ``service_id`` attribute when it has one.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Final

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    ScheduleUpdate,
)
from orleanspy.reminders.table import (
    BatchingReminderTable,
    BulkReminderTable,
    ChangeFeed,
    EndingReminderTable,
    FencingReminderTable,
    PausableReminderTable,
    ReminderTable,
    SkippingReminderTable,
)
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.testing.reminder_races import REMINDER_RACE_CHECKS

__all__ = [
    "REMINDER_TABLE_CHECKS",
    "TableFactory",
    "check_reminder_table",
]

TableFactory = Callable[[], AbstractAsyncContextManager[ReminderTable]]
Check = Callable[[TableFactory], Awaitable[None]]

_T0: Final = datetime(2030, 1, 1, tzinfo=UTC)
_TOP: Final = HASH_SPACE - 1
# How long a change may take to arrive before the feed counts as broken.
_CHANGE_DEADLINE_S: Final = 10.0
_PROBE: Final = GrainId("ContractProbe", "feed-probe")
_BULK: Final = 1000


# -- helpers ------------------------------------------------------------------------


def _service_id(table: ReminderTable) -> str:
    sid = getattr(table, "service_id", "contract")
    return sid if isinstance(sid, str) else "contract"


def _entry(
    table: ReminderTable,
    grain_id: GrainId,
    name: str = "r",
    *,
    due: datetime = _T0,
    **fields: object,
) -> ReminderEntry:
    base = ReminderEntry(
        service_id=_service_id(table),
        grain_id=grain_id,
        name=name,
        start_at=_T0,
        next_due=due,
        period=timedelta(minutes=1),
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def _stored(entry: ReminderEntry, etag: str) -> ReminderEntry:
    """What a table must return for ``entry``: millisecond times and its etag."""
    return ReminderEntry.from_record({**entry.to_record(), "e": etag})


def _random_range(rng: random.Random) -> RingRange:
    """Random bounds, with the edges of the hash space often enough to matter."""
    pick = rng.random()
    if pick < 0.05:
        return RingRange(0, 0)
    if pick < 0.10:
        x = rng.randrange(HASH_SPACE)
        return RingRange(x, x)
    if pick < 0.15:
        return RingRange(_TOP, rng.randrange(HASH_SPACE))
    if pick < 0.20:
        return RingRange(rng.randrange(HASH_SPACE), 0)
    return RingRange(rng.randrange(HASH_SPACE), rng.randrange(HASH_SPACE))


async def _upsert_all(table: ReminderTable, entries: list[ReminderEntry]) -> dict[str, str]:
    """Upsert concurrently in chunks; the etag of each row by ``key``."""
    etags: dict[str, str] = {}
    for i in range(0, len(entries), 100):
        chunk = entries[i : i + 100]
        for e, etag in zip(chunk, await asyncio.gather(*map(table.upsert, chunk)), strict=True):
            etags[e.key] = etag
    return etags


_PRIORITIES: Final = (
    ReminderPriority.CRITICAL,
    ReminderPriority.NORMAL,
    ReminderPriority.NORMAL,
    ReminderPriority.BACKGROUND,
    127,
    -128,
    5,
)


def _bulk_entries(table: ReminderTable, rng: random.Random, n: int) -> list[ReminderEntry]:
    """``n`` rows over many grains (two names on some), with next_due spread over
    two hours at millisecond precision and some exact ties, in several priorities
    (the named ones most, the extremes -128 and 127 too)."""
    entries: list[ReminderEntry] = []
    for i in range(n):
        gid = GrainId("ContractGrain", i // 2 if i % 3 else f"k{i}")
        if rng.random() < 0.1:
            due = _T0 + timedelta(minutes=rng.randrange(0, 120))
        else:
            due = _T0 + timedelta(milliseconds=rng.randrange(0, 2 * 3600 * 1000))
        priority = int(rng.choice(_PRIORITIES))
        entries.append(_entry(table, gid, f"r{i}", due=due, priority=priority))
    return entries


def _due_order(e: ReminderEntry) -> tuple[int, datetime]:
    """The contract's due order: priority descending, then next_due ascending."""
    return (-int(e.priority), e.next_due)


def _check_due_answer(
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
    order = [_due_order(e) for e in got]
    assert order == sorted(order), (
        f"{what}: rows not in the due order (priority descending, then next_due)"
    )
    if got and len(got) < len(qualifying):
        left = {e.key for e in qualifying} - set(got_keys)
        first_left = min(_due_order(e) for e in qualifying if e.key in left)
        assert order[-1] <= first_left, (
            f"{what}: returned a row of (priority, due) ({-order[-1][0]}, {order[-1][1]}) "
            f"while one of ({-first_left[0]}, {first_left[1]}) was left out"
        )
    # The brute-force answer, compared as (priority, due) pairs (ties may pick
    # different rows).
    want = sorted(_due_order(e) for e in qualifying)[: len(got)]
    assert order == want, f"{what}: answer differs from the brute-force due order"


async def _next_change(it: AsyncIterator[ReminderChange]) -> ReminderChange:
    """The next change not caused by the feed probe, within the deadline."""
    try:
        async with asyncio.timeout(_CHANGE_DEADLINE_S):
            while True:
                change = await anext(it)
                if change.grain_id != _PROBE:
                    return change
    except TimeoutError:
        raise AssertionError(f"no change arrived within {_CHANGE_DEADLINE_S}s") from None


async def _prime(table: ReminderTable, it: AsyncIterator[ReminderChange]) -> None:
    """Make sure the subscription is live: write a probe row until its change arrives.

    A feed may subscribe lazily (on the first ``anext``); changes written after
    the first one seen are then guaranteed to reach it while the store is up.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CHANGE_DEADLINE_S
    pending = asyncio.ensure_future(anext(it))
    try:
        while not pending.done():
            assert loop.time() < deadline, (
                f"changes() delivered nothing within {_CHANGE_DEADLINE_S}s"
            )
            await table.upsert(_entry(table, _PROBE, due=_T0))
            await asyncio.wait({pending}, timeout=0.05)
        change = pending.result()
        assert change.grain_id == _PROBE, f"unexpected change {change} before any write"
    finally:
        if not pending.done():
            pending.cancel()


# -- the checks ---------------------------------------------------------------------


async def check_upsert_returns_distinct_etags(factory: TableFactory) -> None:
    """Each upsert returns a new etag, also five parallel upserts of one key."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "etags")
        seen = [await table.upsert(_entry(table, gid)) for _ in range(3)]
        assert len(set(seen)) == 3, f"sequential upserts returned repeated etags {seen}"
        parallel = await asyncio.gather(
            *(table.upsert(_entry(table, gid, due=_T0 + timedelta(seconds=i))) for i in range(5))
        )
        assert len(set(parallel)) == 5, f"5 parallel upserts returned {parallel}"
        assert not set(parallel) & set(seen), "a parallel upsert reused an earlier etag"
        row = await table.read(gid, "r")
        assert row is not None and row.etag in parallel, "row's etag is none of the writes'"
        assert await table.count() == 1, "upserts of one key made more than one row"


async def check_read_and_read_grain(factory: TableFactory) -> None:
    """``read`` gives the row with its etag or ``None``; ``read_grain`` gives one
    grain's rows in name order and nothing of other grains."""
    async with factory() as table:
        a = GrainId("ContractGrain", "a")
        ab = GrainId("ContractGrain", "a|b")  # a key that looks like a row-key prefix
        other = GrainId("OtherGrain", "a")
        assert await table.read(a, "r") is None
        assert await table.read_grain(a) == []
        stored: dict[tuple[GrainId, str], ReminderEntry] = {}
        for gid in (a, ab, other):
            for name in ("zeta", "alpha", "mid", "b"):
                e = _entry(table, gid, name, due=_T0 + timedelta(seconds=len(name)))
                stored[(gid, name)] = _stored(e, await table.upsert(e))
        for (gid, name), expected in stored.items():
            got = await table.read(gid, name)
            assert got == expected, f"read({gid}, {name!r}) = {got}, expected {expected}"
        assert await table.read(a, "missing") is None
        for gid in (a, ab, other):
            rows = await table.read_grain(gid)
            assert [r.name for r in rows] == ["alpha", "b", "mid", "zeta"], (
                f"read_grain({gid}) names {[r.name for r in rows]}"
            )
            assert all(r.grain_id == gid for r in rows), f"read_grain({gid}) mixed in other grains"
            assert rows == [stored[(gid, r.name)] for r in rows]


async def check_round_trip_every_field(factory: TableFactory) -> None:
    """Every field survives storage (times at millisecond precision)."""
    async with factory() as table:
        at = datetime(2031, 3, 30, 1, 2, 3, 456789, tzinfo=UTC)
        variants = [
            _entry(
                table,
                GrainId("RoundTrip", "cron"),
                "weekday-9am",
                period=None,
                cron="0 0 9 * * 1-5",
                tz="Europe/Berlin",
                due=at,
            ),
            _entry(
                table,
                GrainId("RoundTrip", 7),
                "interval",
                period=timedelta(hours=1, milliseconds=5),
                last_fire=at - timedelta(hours=1),
                due=at,
            ),
            _entry(
                table,
                GrainId("RoundTrip", uuid.UUID(int=42)),
                "ünïcode name ✓",
                cron="*/5 * * * *",
                period=None,
                priority=ReminderPriority.CRITICAL,
                action=MissedReminderAction.FIRE_IMMEDIATELY,
                due=at,
            ),
            _entry(
                table,
                GrainId("RoundTrip", "low"),
                "bg",
                priority=ReminderPriority.BACKGROUND,
                action=MissedReminderAction.NOTIFY,
                due=at,
            ),
            _entry(table, GrainId("RoundTrip", "min"), "p-128", priority=-128, due=at),
            _entry(
                table,
                GrainId("RoundTrip", "max"),
                "p127",
                priority=127,
                due=at,
                start_at=datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
            ),
            _entry(
                table,
                GrainId("RoundTrip", ""),
                "empty key",
                due=at,
                action=MissedReminderAction.SKIP,
            ),
            _entry(table, GrainId("RoundTrip", "decl"), "declared", due=at, declared=True),
            _entry(
                table,
                GrainId("RoundTrip", "fp"),
                "fingerprinted",
                due=at,
                declared=True,
                fingerprint="0123456789ab:100:1:",
            ),
            _entry(
                table,
                GrainId("RoundTrip", "grace"),
                "own grace",
                due=at,
                grace=timedelta(seconds=90, milliseconds=5),
            ),
            _entry(
                table, GrainId("RoundTrip", "nograce"), "zero grace", due=at, grace=timedelta(0)
            ),
        ]
        for e in variants:
            etag = await table.upsert(e)
            got = await table.read(e.grain_id, e.name)
            expected = _stored(e, etag)
            assert got == expected, f"round trip changed the row:\n got {got}\nwant {expected}"
            assert got.next_due.tzinfo is not None and got.next_due.utcoffset() == timedelta(0)
            assert got.next_due == from_ms(to_ms(e.next_due)), "next_due not kept to the ms"
        # A schedule CAS keeps the fields it does not set, ``declared`` included.
        declared = await table.read(GrainId("RoundTrip", "decl"), "declared")
        assert declared is not None and declared.etag is not None
        moved = at + timedelta(minutes=1)
        assert await table.update_schedule(
            declared.grain_id, declared.name, declared.etag, moved, at
        )
        again = await table.read(declared.grain_id, declared.name)
        assert again is not None and again.declared, "update_schedule lost the declared flag"
        graced = await table.read(GrainId("RoundTrip", "grace"), "own grace")
        assert graced is not None and graced.etag is not None
        assert await table.update_schedule(graced.grain_id, graced.name, graced.etag, moved, at)
        again = await table.read(graced.grain_id, graced.name)
        assert again is not None and again.grace == graced.grace, "update_schedule lost the grace"


async def check_upsert_if(factory: TableFactory) -> None:
    """``upsert_if`` writes only on its condition: absent for ``None``, else the
    current etag; concurrent inserts of one row, and concurrent replaces on one
    etag, each make exactly one winner, and the row is the winner's."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "cond")
        first = _entry(table, gid, "c", due=_T0)
        etag = await table.upsert_if(first, None)
        assert etag is not None, "insert into an empty slot failed"
        assert await table.upsert_if(first, None) is None, "insert over an existing row"
        moved = replace(first, next_due=_T0 + timedelta(hours=1), priority=9)
        assert await table.upsert_if(moved, "stale") is None, "replace with a wrong etag"
        got = await table.read(gid, "c")
        assert got == _stored(first, etag), "a refused upsert_if changed the row"
        new_etag = await table.upsert_if(moved, etag)
        assert new_etag is not None and new_etag != etag
        assert await table.read(gid, "c") == _stored(moved, new_etag)
        assert await table.upsert_if(moved, etag) is None, "the old etag still works"
        racers = [replace(first, name="race", priority=p) for p in range(5)]
        results = await asyncio.gather(*(table.upsert_if(e, None) for e in racers))
        assert sum(r is not None for r in results) == 1, f"{results}: not exactly one insert"
        row = await table.read(gid, "race")
        assert row is not None and row.etag is not None
        writers = [replace(row, priority=10 + p) for p in range(5)]
        results = await asyncio.gather(*(table.upsert_if(e, row.etag) for e in writers))
        won = [w for w, r in zip(writers, results, strict=True) if r is not None]
        assert len(won) == 1, f"{results}: not exactly one replace on one etag"
        after = await table.read(gid, "race")
        assert after is not None and after.priority == won[0].priority, "not the winner's row"


async def _read_many(
    table: BulkReminderTable, keys: list[tuple[GrainId, str]]
) -> list[ReminderEntry | None]:
    grains = list(dict.fromkeys(g for g, _ in keys))
    by_grain = dict(zip(grains, await table.read_grains(grains), strict=True))
    return [next((r for r in by_grain[g] if r.name == n), None) for g, n in keys]


async def check_upsert_if_many_and_read_grains(factory: TableFactory) -> None:
    """``upsert_if_many`` (a ``BulkReminderTable``) decides each row by its own
    condition, as single ``upsert_if`` calls would, across shards; ``read_grains``
    returns what ``read_grain`` returns for each grain, in order (grains without
    rows, and str keys holding ``|``, included). Skipped for tables without them."""
    async with factory() as table:
        if not isinstance(table, BulkReminderTable):
            return
        gids = [GrainId("ContractBulkIf", i) for i in range(40)]
        first = [_entry(table, g, priority=i % 3) for i, g in enumerate(gids)]
        etags = await table.upsert_if_many([(e, None) for e in first[:20]])
        assert all(etags), f"inserts into empty slots failed: {etags}"
        stored = await _read_many(table, [(e.grain_id, e.name) for e in first])
        assert stored[:20] == [
            _stored(e, t) for e, t in zip(first[:20], etags, strict=True) if t is not None
        ]
        assert stored[20:] == [None] * 20, "read_grains invented rows"
        tricky = [GrainId("ContractBulkIf", "a|b"), GrainId("ContractBulkIf", "a")]
        for g in tricky:
            for name in ("x", "y"):
                await table.upsert(_entry(table, g, name))
        singles = [await table.read_grain(g) for g in [*tricky, GrainId("None", 1)]]
        assert await table.read_grains([*tricky, GrainId("None", 1)]) == singles
        moved = [replace(e, priority=50, paused=i % 4 == 0) for i, e in enumerate(first)]
        writes: list[tuple[ReminderEntry, str | None]] = []
        want: list[bool] = []
        for i, e in enumerate(moved):
            if i < 20:
                # The right etag on even rows; on odd ones a stale etag, or an
                # insert-if-absent of a row that exists.
                cond = etags[i] if i % 2 == 0 else None if i % 3 == 0 else "stale"
                writes.append((e, cond))
                want.append(i % 2 == 0)
            else:
                writes.append((e, None))
                want.append(True)
        results = await table.upsert_if_many(writes)
        assert [r is not None for r in results] == want, f"{results}: wrong rows decided"
        after = await _read_many(table, [(e.grain_id, e.name) for e in first])
        for i, (row, result) in enumerate(zip(after, results, strict=True)):
            assert row is not None
            if result is None:
                assert row == stored[i], f"row {i}: a refused write changed it"
            else:
                assert row == _stored(moved[i], result), f"row {i}: not the written row"
        paused = [r for r in after if r is not None and r.paused]
        due = await table.upcoming(_T0 + timedelta(days=1), 1000)
        assert not {r.key for r in paused} & {r.key for r in due}, "a paused row is due"


async def check_upsert_many(factory: TableFactory) -> None:
    """``upsert_many`` (a ``BulkReminderTable``) writes every row as ``upsert``
    would, with the etags in order. Skipped for tables without it."""
    async with factory() as table:
        if not isinstance(table, BulkReminderTable):
            return
        entries = [
            _entry(table, GrainId("ContractBulk", i % 97), f"b{i}", due=_T0, priority=i % 7 - 3)
            for i in range(600)
        ]
        etags = await table.upsert_many(entries)
        assert len(etags) == len(entries), "one etag per row"
        assert await table.count() == len(entries)
        for e, etag in list(zip(entries, etags, strict=True))[::50]:
            assert await table.read(e.grain_id, e.name) == _stored(e, etag)
        due = await table.read_due(RingRange.full(), _T0, 10)
        assert [int(e.priority) for e in due] == [3] * 10, "bulk rows missing from the due index"
        assert await table.upsert_many([]) == []


async def check_remove_checks_the_etag(factory: TableFactory) -> None:
    """``remove`` deletes only with the current etag; a missing row gives ``False``."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "rm")
        assert await table.remove(gid, "r", "no-such-etag") is False, "removed a missing row"
        stale = await table.upsert(_entry(table, gid))
        current = await table.upsert(_entry(table, gid, due=_T0 + timedelta(minutes=1)))
        other = await table.upsert(_entry(table, gid, "other"))
        assert await table.remove(gid, "r", stale) is False, "removed with a stale etag"
        assert await table.remove(gid, "r", "wrong-etag") is False, "removed with a wrong etag"
        assert await table.remove(gid, "r", other) is False, "removed with another row's etag"
        assert await table.read(gid, "r") is not None, "a failed remove deleted the row"
        assert await table.remove(gid, "r", current) is True, "remove with the right etag failed"
        assert await table.read(gid, "r") is None, "removed row still readable"
        assert [r.name for r in await table.read_grain(gid)] == ["other"]
        assert await table.remove(gid, "r", current) is False, "removed the same row twice"
        assert await table.count() == 1
        due = await table.read_due(RingRange.full(), _T0 + timedelta(days=1), 10)
        assert [r.name for r in due] == ["other"], "removed row still in the due index"


async def check_update_schedule_cas(factory: TableFactory) -> None:
    """``update_schedule`` moves the row with the right etag; loses the race with a
    stale one or on a removed row, and then changes nothing."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "cas")
        original = _entry(
            table,
            gid,
            cron="0 * * * *",
            period=None,
            tz="UTC",
            priority=5,
            action=MissedReminderAction.NOTIFY,
        )
        first = await table.upsert(original)
        later = _T0 + timedelta(hours=1)
        fired = _T0 + timedelta(seconds=1, microseconds=1500)
        second = await table.update_schedule(gid, "r", first, later, fired)
        assert second is not None, "CAS with the current etag failed"
        assert second != first, "CAS returned the old etag"
        row = await table.read(gid, "r")
        expected = _stored(replace(original, next_due=later, last_fire=fired), second)
        assert row == expected, f"after CAS:\n got {row}\nwant {expected}"
        assert await table.update_schedule(gid, "r", first, _T0, None) is None, "stale CAS won"
        assert await table.read(gid, "r") == expected, "a lost CAS changed the row"
        third = await table.update_schedule(gid, "r", second, later + timedelta(hours=1), None)
        assert third is not None and third not in (first, second)
        row = await table.read(gid, "r")
        assert row is not None and row.last_fire is None, "CAS could not clear last_fire"
        due = await table.read_due(RingRange.full(), later + timedelta(hours=1), 10)
        assert [r.etag for r in due] == [third], "due index not moved by CAS"
        assert await table.read_due(RingRange.full(), later, 10) == [], "old due time still indexed"
        assert await table.remove(gid, "r", third) is True
        assert await table.update_schedule(gid, "r", third, _T0, None) is None, "CAS on removed row"
        assert await table.read(gid, "r") is None, "CAS resurrected a removed row"
        missing = GrainId("ContractGrain", "never")
        assert await table.update_schedule(missing, "r", "x", _T0, None) is None


async def check_update_schedule_many(factory: TableFactory) -> None:
    """The batched CAS answers like single calls, in order (skipped when the table
    is not a ``BatchingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, BatchingReminderTable):
            return
        assert await table.update_schedule_many([]) == []
        gids = [GrainId("ContractGrain", f"batch{i}") for i in range(4)]
        etags = [await table.upsert(_entry(table, g)) for g in gids]
        stale = etags[2]
        etags[2] = await table.upsert(_entry(table, gids[2]))
        await table.remove(gids[3], "r", etags[3])
        due = _T0 + timedelta(minutes=5)
        updates = [
            ScheduleUpdate(gids[0], "r", etags[0], due, _T0),
            ScheduleUpdate(gids[1], "r", etags[1], due, None),
            ScheduleUpdate(gids[2], "r", stale, due, None),  # stale etag
            ScheduleUpdate(gids[3], "r", etags[3], due, None),  # removed row
            ScheduleUpdate(gids[0], "r", etags[0], due, None),  # lost to the first update
        ]
        results = await table.update_schedule_many(updates)
        assert len(results) == 5, f"{len(results)} results for 5 updates"
        assert results[0] is not None and results[1] is not None, f"valid CASes lost: {results}"
        assert results[2:] == [None, None, None], f"lost races reported as wins: {results}"
        assert results[0] != etags[0] and results[1] != etags[1], "batch kept an old etag"
        for gid, etag in ((gids[0], results[0]), (gids[1], results[1])):
            row = await table.read(gid, "r")
            assert row is not None and row.etag == etag and row.next_due == due
        row = await table.read(gids[0], "r")
        assert row is not None and row.last_fire == _T0
        row = await table.read(gids[2], "r")
        assert row is not None and row.etag == etags[2] and row.next_due == _T0


async def check_update_schedule_many_keeps_lanes_and_fields(factory: TableFactory) -> None:
    """A batched CAS keeps every field it does not set (priority, action,
    ``declared``, ...) and files each row in the due order by its stored
    priority: after the batch, ``read_due`` with a small limit still returns the
    highest priority first even when it is due last (skipped when the table is
    not a ``BatchingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, BatchingReminderTable):
            return
        rows = [
            _entry(
                table,
                GrainId("ContractLanes", i),
                priority=priority,
                action=MissedReminderAction.NOTIFY,
                declared=i == 1,
            )
            for i, priority in enumerate((-100, 0, 100))
        ]
        etags = [await table.upsert(row) for row in rows]
        # The lowest priority falls due first, the highest last.
        dues = [_T0 + timedelta(minutes=m) for m in (1, 2, 3)]
        fired = _T0 + timedelta(seconds=7)
        results = await table.update_schedule_many(
            [
                ScheduleUpdate(row.grain_id, row.name, etag, due, fired)
                for row, etag, due in zip(rows, etags, dues, strict=True)
            ]
        )
        assert all(r is not None for r in results), f"valid CASes lost: {results}"
        for row, etag, due in zip(rows, results, dues, strict=True):
            assert etag is not None
            got = await table.read(row.grain_id, row.name)
            want = _stored(replace(row, next_due=due, last_fire=fired), etag)
            assert got == want, f"after a batched CAS:\n got {got}\nwant {want}"
        later = _T0 + timedelta(hours=1)
        first = await table.read_due(RingRange.full(), later, 1)
        assert [int(r.priority) for r in first] == [100], (
            f"a batched CAS lost the row's priority lane: read_due(limit=1) gave {first}"
        )
        every = await table.read_due(RingRange.full(), later, 10)
        assert [int(r.priority) for r in every] == [100, 0, -100], "not in the due order"


async def check_read_range_random_bounds(factory: TableFactory) -> None:
    """``read_range`` over 1,000 rows equals a brute-force filter for random
    ranges, wrap-around, the edges of the hash space and ``(0, 0)``."""
    rng = random.Random(20260801)
    async with factory() as table:
        entries = _bulk_entries(table, rng, _BULK)
        await _upsert_all(table, entries)
        hashes = sorted({e.hash for e in entries})
        ranges = [_random_range(rng) for _ in range(24)]
        # Bounds exactly on row hashes test the open/closed ends.
        for _ in range(6):
            a, b = rng.choice(hashes), rng.choice(hashes)
            ranges += [RingRange(a, b), RingRange(b, a), RingRange(a, a)]
        ranges += [RingRange(0, 0), RingRange(0, _TOP), RingRange(_TOP, 0), RingRange(_TOP, _TOP)]
        for r in ranges:
            got = await table.read_range(r)
            got_keys = sorted(e.key for e in got)
            want = sorted(e.key for e in entries if e.hash in r)
            assert got_keys == want, (
                f"read_range({r}): {len(got_keys)} rows, expected {len(want)}; "
                f"extra {sorted(set(got_keys) - set(want))[:3]} "
                f"missing {sorted(set(want) - set(got_keys))[:3]}"
            )


async def check_read_due_against_brute_force(factory: TableFactory) -> None:
    """``read_due`` returns the first due rows of the range in the due order
    (priority descending, then next_due), at most ``limit``, for random ranges
    (wrapping too), cut-offs and limits, checked against brute force."""
    rng = random.Random(4242)
    async with factory() as table:
        entries = _bulk_entries(table, rng, _BULK)
        etags = await _upsert_all(table, entries)
        pool = [_stored(e, etags[e.key]) for e in entries]
        cases: list[tuple[RingRange, datetime, int]] = [
            (RingRange(0, 0), _T0 + timedelta(hours=3), _BULK + 10),
            (RingRange(0, 0), _T0 - timedelta(seconds=1), 10),
            (RingRange(0, 0), _T0 + timedelta(minutes=30), 1),
            (RingRange(_TOP, 0), _T0 + timedelta(hours=3), 50),
            (RingRange(3 << 30, 1 << 30), _T0 + timedelta(hours=1), 100),  # wraps
        ]
        for _ in range(30):
            before = _T0 + timedelta(milliseconds=rng.randrange(-1000, 2 * 3600 * 1000 + 1000))
            cases.append((_random_range(rng), before, rng.choice([1, 7, 50, 200, 5000])))
        for r, before, limit in cases:
            got = await table.read_due(r, before, limit)
            _check_due_answer("read_due", got, pool, r=r, before=before, limit=limit)
            assert all(e == next(p for p in pool if p.key == e.key) for e in got[:3]), (
                "read_due rows differ from the stored rows"
            )


class _OnlyContains:
    """A ``Container`` and nothing more: it answers ``in``, cannot be listed."""

    def __init__(self, keys: set[str]) -> None:
        self._keys = keys

    def __contains__(self, key: object) -> bool:
        return key in self._keys


async def check_read_due_skipping_against_brute_force(factory: TableFactory) -> None:
    """``read_due_skipping`` (``SkippingReminderTable`` only) answers like
    ``read_due`` less the skipped keys, which still count towards ``limit``, and
    with ``after`` only rows due after it, with ``take`` the first ``take`` of
    that answer: checked against brute force for
    random ranges, cut-offs, lower bounds, limits and skip sets (empty, some,
    all of the due rows)."""
    rng = random.Random(777)
    async with factory() as table:
        if not isinstance(table, SkippingReminderTable):
            return
        entries = _bulk_entries(table, rng, _BULK)
        etags = await _upsert_all(table, entries)
        pool = [_stored(e, etags[e.key]) for e in entries]
        cases: list[tuple[RingRange, datetime, int]] = [
            (RingRange(0, 0), _T0 + timedelta(hours=3), _BULK + 10),
            (RingRange(0, 0), _T0 + timedelta(minutes=30), 50),
            (RingRange(3 << 30, 1 << 30), _T0 + timedelta(hours=1), 100),  # wraps
        ]
        for _ in range(20):
            before = _T0 + timedelta(milliseconds=rng.randrange(-1000, 2 * 3600 * 1000 + 1000))
            cases.append((_random_range(rng), before, rng.choice([1, 7, 50, 200, 5000])))
        for r, before, limit in cases:
            # Half the cases also bound next_due from below (``after``, exclusive).
            after = rng.choice([None, before - timedelta(minutes=rng.randrange(1, 90))])
            qualifying = [
                e
                for e in pool
                if e.hash in r and e.next_due <= before and (after is None or e.next_due > after)
            ]
            for share in (0.0, 0.3, 1.0):
                skip = {e.key for e in qualifying if rng.random() < share}
                got = await table.read_due_skipping(r, before, limit, skip, after=after)
                what = (
                    f"read_due_skipping {r} after={after} before={before} limit={limit} "
                    f"skip={len(skip)}"
                )
                got_keys = [e.key for e in got]
                # ``take`` keeps the first rows of the same answer.
                take = rng.choice([0, 1, 5, 40])
                taken = await table.read_due_skipping(
                    r, before, limit, skip, after=after, take=take
                )
                assert [e.key for e in taken] == got_keys[:take], f"{what}: take={take}"
                # ``skip`` is any Container: one that only answers ``in`` (it cannot
                # be listed, say, to send it along) gives the same answer.
                view = await table.read_due_skipping(
                    r, before, limit, _OnlyContains(skip), after=after, take=take or None
                )
                assert [e.key for e in view] == got_keys[: take or None], (
                    f"{what}: take={take}, skip only a Container"
                )
                assert len(got_keys) == len(set(got_keys)), f"{what}: a row came back twice"
                assert not skip.intersection(got_keys), f"{what}: returned a skipped row"
                allowed = {e.key for e in qualifying}
                assert all(k in allowed for k in got_keys), f"{what}: a row outside or not due"
                order = [_due_order(e) for e in got]
                assert order == sorted(order), f"{what}: rows not in the due order"
                by_key = {p.key: p for p in pool}
                assert all(e == by_key[e.key] for e in got[:3]), f"{what}: rows differ"
                kept = sorted(_due_order(e) for e in qualifying if e.key not in skip)
                if len(qualifying) <= limit:
                    # Not cut by the limit: every row that is not skipped.
                    assert sorted(got_keys) == sorted(
                        e.key for e in qualifying if e.key not in skip
                    ), f"{what}: expected every due row that is not skipped"
                    continue
                # Cut by the limit: a thinned prefix of ``limit`` rows in the due
                # order. No row left out ranks strictly before the last row
                # returned, and the skipped rows make up what is missing.
                if got:
                    before_last = [o for o in kept if o < order[-1]]
                    assert order[: len(before_last)] == before_last, (
                        f"{what}: a row that ranks before the last one returned is missing"
                    )
                cut = sorted(_due_order(e) for e in qualifying)[limit - 1]
                skipped_in = sum(1 for e in qualifying if e.key in skip and _due_order(e) <= cut)
                assert len(got) <= limit, f"{what}: more than limit rows"
                assert not order or order[-1] <= cut, (
                    f"{what}: returned a row past the first {limit} of the due order"
                )
                assert len(got) + skipped_in >= limit, (
                    f"{what}: {len(got)} rows with {skipped_in} skipped: the answer stops short"
                )


#: Priorities of the rewrite check: both ends and both sides of zero. Not every one of
#: the 256: a PostgreSQL due read scans each priority in use in each bucket, which made
#: this check spend 15 s in 20 reads without finding more.
_SOME_PRIORITIES = (-128, -77, -1, 0, 1, 5, 64, 127)


async def check_due_index_follows_rewrites(factory: TableFactory) -> None:
    """After 1,500 random upserts, schedule CASes and removes over 200 rows, the
    due index, ``count`` and ``read_range`` agree with a model of the rows."""
    rng = random.Random(99)
    async with factory() as table:
        model: dict[str, ReminderEntry] = {}
        grains = [GrainId("Rewrite", i) for i in range(200)]
        for _ in range(1500):
            gid = rng.choice(grains)
            key = f"{gid.canonical}|r"
            due = _T0 + timedelta(milliseconds=rng.randrange(0, 3600 * 1000))
            row = model.get(key)
            op = rng.random()
            if row is None or op < 0.3:
                e = _entry(table, gid, due=due, priority=rng.choice(_SOME_PRIORITIES))
                model[key] = _stored(e, await table.upsert(e))
            elif op < 0.85:
                assert row.etag is not None
                etag = await table.update_schedule(gid, "r", row.etag, due, row.next_due)
                assert etag is not None, "CAS with the current etag lost"
                model[key] = _stored(replace(row, next_due=due, last_fire=row.next_due), etag)
            else:
                assert row.etag is not None
                assert await table.remove(gid, "r", row.etag) is True
                del model[key]
        pool = list(model.values())
        assert await table.count() == len(pool)
        full = sorted(e.key for e in await table.read_range(RingRange.full()))
        assert full == sorted(model), "read_range disagrees with the writes made"
        for _ in range(20):
            r = _random_range(rng)
            before = _T0 + timedelta(milliseconds=rng.randrange(0, 3600 * 1000))
            limit = rng.choice([1, 10, 100, 1000])
            got = await table.read_due(r, before, limit)
            _check_due_answer("read_due", got, pool, r=r, before=before, limit=limit)
            assert all(e == model[e.key] for e in got), "read_due returned an outdated row"


async def check_upcoming(factory: TableFactory) -> None:
    """``upcoming`` is ``read_due`` over the whole ring."""
    rng = random.Random(7)
    async with factory() as table:
        entries = _bulk_entries(table, rng, 300)
        etags = await _upsert_all(table, entries)
        pool = [_stored(e, etags[e.key]) for e in entries]
        for before, limit in [
            (_T0 - timedelta(milliseconds=1), 10),
            (_T0 + timedelta(minutes=10), 5),
            (_T0 + timedelta(hours=1), 1000),
            (_T0 + timedelta(hours=5), 300),
            (_T0 + timedelta(hours=5), 299),
        ]:
            got = await table.upcoming(before, limit)
            _check_due_answer("upcoming", got, pool, r=None, before=before, limit=limit)


async def check_count(factory: TableFactory) -> None:
    """``count`` follows inserts and removes, not upserts of existing rows."""
    async with factory() as table:
        assert await table.count() == 0, "a fresh table is not empty"
        gids = [GrainId("ContractGrain", i) for i in range(25)]
        etags = [await table.upsert(_entry(table, g)) for g in gids]
        assert await table.count() == 25
        await table.upsert(_entry(table, gids[0], due=_T0 + timedelta(days=1)))
        await table.upsert(_entry(table, gids[0], "second"))
        assert await table.count() == 26
        assert await table.remove(gids[1], "r", etags[1]) is True
        assert await table.remove(gids[2], "r", "wrong") is False
        assert await table.count() == 25


async def check_changes_feed(factory: TableFactory) -> None:
    """Every successful upsert and remove reaches every subscriber; schedule
    CASes and lost races publish nothing; ``aclose`` ends a subscription."""
    async with factory() as table:
        first = table.changes()
        second = table.changes()
        for it in (first, second):
            assert isinstance(it, ChangeFeed), "changes() must return an iterator with aclose()"
        try:
            await _prime(table, first)
            await _prime(table, second)
            gid = GrainId("ContractGrain", "feed")
            due = _T0 + timedelta(minutes=3)
            etag = await table.upsert(_entry(table, gid, "n", due=due, priority=-7))
            for it in (first, second):
                change = await _next_change(it)
                assert change == ReminderChange(gid, "n", due), "upsert change"
                assert change.priority == -7, "an upsert's change must carry the row's priority"
            moved = _T0 + timedelta(minutes=9)
            assert await table.update_schedule(gid, "n", "stale", _T0, None) is None
            assert await table.remove(gid, "n", "stale") is False
            new_etag = await table.update_schedule(gid, "n", etag, moved, due)
            assert new_etag is not None
            if isinstance(table, BatchingReminderTable):
                update = ScheduleUpdate(gid, "n", new_etag, moved + timedelta(minutes=1), None)
                new_etag = (await table.update_schedule_many([update]))[0]
                assert new_etag is not None
            assert await table.remove(gid, "n", new_etag) is True
            for it in (first, second):
                # Neither the lost races above nor the schedule CASes that won
                # published anything: the removal is the next change.
                change = await _next_change(it)
                assert change == ReminderChange(gid, "n", None), (
                    f"expected the removal, got {change} (a schedule CAS must not publish)"
                )
                assert change.priority is None, "a removal's change carries no priority"
            if isinstance(table, BulkReminderTable):
                await table.upsert_many([_entry(table, gid, "m", due=due, priority=42)])
                change = await _next_change(first)
                assert change == ReminderChange(gid, "m", due), "upsert_many change"
                assert change.priority == 42, "an upsert_many change must carry the priority"
        finally:
            await first.aclose()
        # A reader blocked in another task is released by aclose. Changes already
        # buffered (second did not read the batch's) may come out first; then the end.
        reader = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        await second.aclose()
        try:
            async with asyncio.timeout(_CHANGE_DEADLINE_S):
                await reader
                for _ in range(100):
                    await anext(second)
            raise AssertionError("changes kept coming after aclose()")
        except StopAsyncIteration:
            pass
        except TimeoutError:
            raise AssertionError("aclose() did not end the change stream") from None


async def check_paused_rows_leave_the_due_index(factory: TableFactory) -> None:
    """A paused row is stored, read back paused and counted, but neither
    ``read_due`` nor ``upcoming`` returns it; a schedule CAS keeps it paused;
    upserting it unpaused puts it back; its changes are published with
    ``next_due=None``. Skipped for tables that are not a ``PausableReminderTable``."""
    async with factory() as table:
        feed = table.changes()
        try:
            if not isinstance(table, PausableReminderTable):
                return
            await _prime(table, feed)
            gid, other = GrainId("Paused", "p"), GrainId("Paused", "q")
            await table.upsert(_entry(table, other))
            assert (await _next_change(feed)).next_due == _T0
            etag = await table.upsert(_entry(table, gid, paused=True))
            change = await _next_change(feed)
            assert (change.grain_id, change.next_due) == (gid, None), (
                f"a paused row's upsert published {change}, expected next_due None"
            )
            row = await table.read(gid, "r")
            assert row is not None and row.paused, "read lost the paused flag"
            assert [e.paused for e in await table.read_grain(gid)] == [True]
            assert await table.count() == 3  # the probe, q and p
            later = _T0 + timedelta(days=1)
            for got in (
                await table.read_due(RingRange.full(), later, 100),
                await table.upcoming(later, 100),
            ):
                assert gid not in [e.grain_id for e in got], "a paused row is in the due index"
                assert other in [e.grain_id for e in got]
            moved = await table.update_schedule(gid, "r", etag, _T0 + timedelta(minutes=1), _T0)
            assert moved is not None, "CAS on a paused row with its etag lost"
            row = await table.read(gid, "r")
            assert row is not None and row.paused, "update_schedule unpaused the row"
            assert gid not in [e.grain_id for e in await table.upcoming(later, 100)]
            await table.upsert(replace(row, paused=False))
            assert (await _next_change(feed)).next_due == _T0 + timedelta(minutes=1)
            back = await table.read_due(RingRange.full(), later, 100)
            assert gid in [e.grain_id for e in back], "a resumed row is not in the due index"
            resumed = await table.read(gid, "r")
            assert resumed is not None and not resumed.paused
        finally:
            await feed.aclose()


async def check_fire_history(factory: TableFactory) -> None:
    """``append_history`` keeps the newest ``keep`` records per row, newest first,
    field by field; ``upsert`` keeps the history, ``remove`` deletes it, and
    records of a missing row are dropped. Skipped for tables that are not a
    ``PausableReminderTable``."""
    async with factory() as table:
        if not isinstance(table, PausableReminderTable):
            return
        gid, other = GrainId("History", "h"), GrainId("History", "o")
        await table.upsert(_entry(table, gid))
        await table.upsert(_entry(table, other))

        def record(i: int, g: GrainId = gid, **fields: object) -> FireRecord:
            base = FireRecord(
                grain_id=g, name="r", slot=_T0 + timedelta(minutes=i),
                at=_T0 + timedelta(minutes=i, milliseconds=250), outcome=FireOutcome.OK,
                silo="silo-a",
            )  # fmt: skip
            return replace(base, **fields)  # type: ignore[arg-type]

        assert await table.read_history(gid, "r") == []
        failed = record(1, outcome=FireOutcome.GRAIN_ERROR, error="ValueError: bad ✓ input")
        await table.append_history([record(0), failed], 3)
        await table.append_history([record(2, other), record(2, GrainId("History", "missing"))], 3)
        got = await table.read_history(gid, "r")
        assert got == [failed, record(0)], got
        assert got[0].lateness == timedelta(milliseconds=250)
        assert await table.read_history(GrainId("History", "missing"), "r") == []
        assert [r.slot for r in await table.read_history(other, "r")] == [
            _T0 + timedelta(minutes=2)
        ]
        odd = [
            record(2, outcome=FireOutcome.MISSED_SKIPPED, silo="silo-b"),
            record(3, outcome=FireOutcome.NOTIFIED),
            record(4, triggered=True),
        ]
        await table.append_history(odd, 3)
        got = await table.read_history(gid, "r")
        assert got == odd[::-1], f"history not trimmed to the newest 3: {got}"
        await table.upsert(_entry(table, gid, due=_T0 + timedelta(days=1)))
        assert len(await table.read_history(gid, "r")) == 3, "upsert dropped the history"
        row = await table.read(gid, "r")
        assert row is not None and row.etag is not None
        assert await table.remove(gid, "r", row.etag) is True
        assert await table.read_history(gid, "r") == [], "remove kept the history"
        await table.upsert(_entry(table, gid))
        assert await table.read_history(gid, "r") == [], "a new row inherited a history"


async def _walk(
    table: ReminderTable, limit: int, type_name: str | None = None, key_prefix: str | None = None
) -> list[ReminderEntry]:
    out: list[ReminderEntry] = []
    cursor: str | None = None
    for _ in range(10_000):
        rows, cursor = await table.read_page(
            cursor, limit, type_name=type_name, key_prefix=key_prefix
        )
        assert len(rows) <= limit, f"a page of {len(rows)} rows for limit {limit}"
        out.extend(rows)
        if cursor is None:
            return out
    raise AssertionError("read_page never ended the walk")


async def check_read_page_against_brute_force(factory: TableFactory) -> None:
    """``read_page`` walks every row exactly once (paused ones too, with their
    etags), whatever the page size; ``type_name`` and ``key_prefix`` select what
    brute force selects (string keys only for a prefix, keys holding ``|``
    included); ``count_types`` agrees; a prefix without a type is refused."""
    async with factory() as table:
        rng = random.Random(7)
        expected: dict[str, ReminderEntry] = {}
        keys: list[object] = []
        for i in range(120):
            keys.append(rng.choice([f"t{i % 7}-{i}", f"a|b{i}", i, uuid.UUID(int=i)]))
        for i, key in enumerate(keys):
            type_name = ("PageGrain", "PageGrainB", "Page")[i % 3]
            gid = GrainId(type_name, key)  # type: ignore[arg-type]
            for name in ("r", "s")[: 1 + i % 2]:
                e = _entry(table, gid, name, paused=i % 5 == 0)
                expected[e.key] = _stored(e, await table.upsert(e))
        for limit in (1, 7, 500):
            walked = await _walk(table, limit)
            got = [r.key for r in walked]
            assert len(got) == len(set(got)), f"limit {limit}: a row came back twice"
            assert set(got) == set(expected), f"limit {limit}: rows missing or extra"
            assert {r.key: r for r in walked} == expected, "a paged row differs from its write"
        for type_name, prefix in (
            ("PageGrain", None),
            ("Page", None),
            ("PageGrainB", "t3"),
            ("PageGrain", "a|"),
            ("PageGrain", "a|b1"),
            ("PageGrain", "1"),
            ("Nothing", None),
        ):
            want = {
                k
                for k, r in expected.items()
                if r.grain_id.type_name == type_name
                and (
                    prefix is None
                    or (isinstance(r.grain_id.key, str) and r.grain_id.key.startswith(prefix))
                )
            }
            got = [r.key for r in await _walk(table, 5, type_name, prefix)]
            assert len(got) == len(set(got)), f"{type_name} {prefix!r}: a row twice"
            assert set(got) == want, f"{type_name} {prefix!r}: {len(got)} rows, want {len(want)}"
        brute: dict[str, int] = {}
        for r in expected.values():
            brute[r.grain_id.type_name] = brute.get(r.grain_id.type_name, 0) + 1
        assert await table.count_types() == brute, "count_types differs from the rows"
        try:
            await table.read_page(None, 10, key_prefix="x")
        except ValueError:
            pass
        else:
            raise AssertionError("a key prefix without a type was accepted")


async def check_schedule_fields(factory: TableFactory) -> None:
    """The optional schedule fields round-trip and survive every write that does
    not set them: a one-shot row (neither period nor cron), jitter, ``starts_at``,
    ``ends_at``, ``max_ticks``/``final_due``, a payload of the codec's types and
    a ``RetryPolicy`` come back from ``read``, ``read_grain``, ``read_due`` and
    ``upcoming``; a schedule CAS (single, batched, ``upsert_many``) keeps them;
    a row rewritten without them loses them. With history (a
    ``PausableReminderTable``), a record's ``attempt`` and ``final`` round-trip."""
    async with factory() as table:
        at = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
        payload = {
            "order": 42,
            "items": ["a", "b"],
            "when": at,
            "id": uuid.UUID(int=7),
            "raw": b"\x00\xff",
            "wait": timedelta(seconds=3),
        }
        gid = GrainId("Shaped", "s")
        shaped = [
            _entry(table, gid, "once", period=None, due=at, start_at=at, payload="x"),
            _entry(
                table,
                gid,
                "bounded",
                due=at,
                jitter=timedelta(seconds=9, milliseconds=5),
                starts_at=at - timedelta(days=1),
                ends_at=at + timedelta(days=30),
                max_ticks=12,
                final_due=at + timedelta(minutes=11),
                payload=payload,
                retry=RetryPolicy(5, timedelta(milliseconds=1500)),
            ),
            _entry(
                table,
                gid,
                "cron",
                period=None,
                cron="0 0 9 * * 1-5",
                tz="Europe/Berlin",
                due=at,
                ends_at=at + timedelta(days=3),
                retry=RetryPolicy(1, timedelta(seconds=1)),
            ),
        ]
        etags = {e.name: await table.upsert(e) for e in shaped}
        want = {e.name: _stored(e, etags[e.name]) for e in shaped}
        for e in shaped:
            got = await table.read(gid, e.name)
            assert got == want[e.name], f"read changed the row:\n got {got}\nwant {want[e.name]}"
            assert got.payload == want[e.name].payload, "the payload did not round-trip"
        assert {e.name: e for e in await table.read_grain(gid)} == want, "read_grain lost fields"
        due = await table.read_due(RingRange.full(), at, 10)
        assert {e.name: e for e in due} == want, f"read_due lost fields: {due}"
        assert {e.name: e for e in await table.upcoming(at, 10)} == want, "upcoming lost fields"
        assert want["once"].one_shot, "a one-shot row came back with a period or cron"

        # A schedule CAS sets next_due/last_fire only.
        moved = at + timedelta(minutes=1)
        etag = await table.update_schedule(gid, "bounded", etags["bounded"], moved, at)
        assert etag is not None, "a valid CAS was refused"
        got = await table.read(gid, "bounded")
        expected = _stored(replace(shaped[1], next_due=moved, last_fire=at), etag)
        assert got == expected, f"update_schedule lost fields:\n got {got}\nwant {expected}"
        if isinstance(table, BatchingReminderTable):
            later = moved + timedelta(minutes=1)
            [etag2] = await table.update_schedule_many(
                [ScheduleUpdate(gid, "bounded", etag, later, moved)]
            )
            assert etag2 is not None, "a valid batched CAS was refused"
            got = await table.read(gid, "bounded")
            expected = _stored(replace(shaped[1], next_due=later, last_fire=moved), etag2)
            assert got == expected, f"update_schedule_many lost fields:\n got {got}"
        if isinstance(table, BulkReminderTable):
            bulk = [replace(e, name=f"bulk-{e.name}") for e in shaped]
            bulk_etags = await table.upsert_many(bulk)
            for e, etag in zip(bulk, bulk_etags, strict=True):
                got = await table.read(gid, e.name)
                assert got == _stored(e, etag), f"upsert_many lost fields:\n got {got}"
        # A rewrite without the fields clears them (the row is what was written).
        plain = _entry(table, gid, "bounded", due=at)
        etag = await table.upsert(plain)
        got = await table.read(gid, "bounded")
        assert got == _stored(plain, etag), f"a rewrite kept old optional fields: {got}"

        if isinstance(table, PausableReminderTable):
            records = [
                FireRecord(gid, "once", at, at, FireOutcome.RETRYING, "silo-a", attempt=2),
                FireRecord(gid, "once", at, at, FireOutcome.OK, "silo-a", attempt=3, final=True),
            ]
            await table.append_history(records, 5)
            got_history = await table.read_history(gid, "once")
            assert got_history == records[::-1], f"attempt/final did not round-trip: {got_history}"


async def check_ended_rows_keep_their_history(factory: TableFactory) -> None:
    """``end`` removes the row as ``remove`` does (the etag checked, the row out of
    ``read``, the due index and ``count``, a removal published) and keeps its fire
    history readable; ``remove`` of a row written again under that key deletes
    every record. Skipped for tables that are not an ``EndingReminderTable``."""
    async with factory() as table:
        if not isinstance(table, EndingReminderTable):
            return
        gid = GrainId("Ended", "e")
        etag = await table.upsert(_entry(table, gid))
        records = [
            FireRecord(gid, "r", _T0, _T0, FireOutcome.RETRYING, "silo-a", attempt=1),
            FireRecord(gid, "r", _T0, _T0, FireOutcome.OK, "silo-a", attempt=2, final=True),
        ]
        await table.append_history(records, 5)
        feed = table.changes()
        try:
            await _prime(table, feed)
            assert await table.end(gid, "r", "0") is False, "end ignored the etag"
            assert await table.read(gid, "r") is not None, "a refused end removed the row"
            counted = await table.count()
            assert await table.end(gid, "r", etag) is True, "end refused the row's etag"
            change = await _next_change(feed)
            assert (change.grain_id, change.next_due) == (gid, None), f"end published {change}"
        finally:
            await feed.aclose()
        assert await table.read(gid, "r") is None, "end kept the row"
        assert await table.count() == counted - 1, "end left the row counted"
        due = await table.read_due(RingRange.full(), _T0 + timedelta(days=1), 10)
        assert gid not in {e.grain_id for e in due}, "end left the row in the due index"
        got = await table.read_history(gid, "r")
        assert got == records[::-1], f"end dropped the history: {got}"
        assert await table.end(gid, "r", etag) is False, "end of a missing row succeeded"
        # Written again and then removed by an operator: nothing is left.
        etag = await table.upsert(_entry(table, gid))
        assert await table.remove(gid, "r", etag) is True
        assert await table.read_history(gid, "r") == [], "remove kept an ended history"


async def check_fenced_writer_loses_its_schedule_writes(factory: TableFactory) -> None:
    """A fenced writer's ``update_schedule`` and ``update_schedule_many`` answer
    ``None`` and change nothing, whatever the etag; other writers (another
    generation on the same endpoint too) and an instance without a writer are
    unaffected; fencing again changes nothing (skipped when the table is not a
    ``FencingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, FencingReminderTable):
            return
        deposed = SiloAddress("10.9.0.1", 11111, generation=1_000)
        successor = SiloAddress("10.9.0.1", 11111, generation=2_000)
        gid = GrainId("ContractGrain", "fenced")
        first = await table.upsert(_entry(table, gid))
        later = _T0 + timedelta(minutes=1)
        table.writer = deposed
        moved = await table.update_schedule(gid, "r", first, later, _T0)
        assert moved is not None, "a writer not fenced lost its CAS"
        etag = moved
        await table.fence(deposed, at=_T0)
        await table.fence(deposed, at=_T0 + timedelta(seconds=1))  # idempotent
        before = await table.read(gid, "r")
        late = later + timedelta(minutes=1)
        lost = await table.update_schedule(gid, "r", etag, late, later)
        assert lost is None, "a fenced writer's update_schedule won"
        if isinstance(table, BatchingReminderTable):
            many = await table.update_schedule_many([ScheduleUpdate(gid, "r", etag, late, later)])
            assert many == [None], f"a fenced writer's update_schedule_many won: {many}"
        assert await table.read(gid, "r") == before, "a fenced writer's CAS changed the row"
        due = await table.read_due(RingRange.full(), late, 10)
        assert [r.next_due for r in due] == [later], "a fenced writer's CAS moved the due index"
        for writer in (successor, None):
            table.writer = writer
            new = await table.update_schedule(gid, "r", etag, late, later)
            assert new is not None, f"writer {writer} lost its CAS to another's fence"
            etag = new
            if isinstance(table, BatchingReminderTable):
                done = await table.update_schedule_many(
                    [ScheduleUpdate(gid, "r", etag, late + timedelta(minutes=1), late)]
                )
                assert done[0] is not None, f"writer {writer} lost a batched CAS to a fence"
                etag = done[0]
        # Pruning drops old fences but never the one being set.
        table.writer = deposed
        await table.fence(
            deposed, at=_T0 + timedelta(days=30), prune_before=_T0 + timedelta(days=9)
        )
        assert await table.update_schedule(gid, "r", etag, late, None) is None, (
            "fencing with prune_before dropped the writer's own fence"
        )


REMINDER_TABLE_CHECKS: Final[tuple[Check, ...]] = (
    check_upsert_returns_distinct_etags,
    check_read_and_read_grain,
    check_round_trip_every_field,
    check_remove_checks_the_etag,
    check_upsert_if,
    check_upsert_many,
    check_upsert_if_many_and_read_grains,
    check_update_schedule_cas,
    check_update_schedule_many,
    check_update_schedule_many_keeps_lanes_and_fields,
    check_read_range_random_bounds,
    check_read_due_against_brute_force,
    check_read_due_skipping_against_brute_force,
    check_due_index_follows_rewrites,
    check_upcoming,
    check_count,
    check_read_page_against_brute_force,
    check_changes_feed,
    check_paused_rows_leave_the_due_index,
    check_fire_history,
    check_schedule_fields,
    check_ended_rows_keep_their_history,
    check_fenced_writer_loses_its_schedule_writes,
    *REMINDER_RACE_CHECKS,
)
"""Every check, each taking the factory; for one pytest case per check (the
contract checks, then the race scenarios of ``reminder_races``)."""


async def check_reminder_table(factory: TableFactory) -> None:
    """Run every check against fresh tables from ``factory``; raises
    ``AssertionError`` (prefixed with the check's name) on the first violation."""
    for check in REMINDER_TABLE_CHECKS:
        try:
            await check(factory)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
