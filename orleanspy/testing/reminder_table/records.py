"""Counters and dead letters: what a table keeps beside the rows (0.2)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.counters import (
    COUNTS,
    CounterDelta,
    CountingReminderTable,
    ReminderCounters,
)
from orleanspy.reminders.letters import DeadLetter, DeadLetterTable
from orleanspy.reminders.model import SkipReason
from orleanspy.reminders.table import EndingReminderTable
from orleanspy.testing.reminder_table._support import T0, TableFactory, new_row

__all__ = ["check_dead_letters", "check_reminder_counters"]


def _delta(gid: GrainId, name: str, **counts: int) -> CounterDelta:
    delta = CounterDelta(gid, name)
    for counter, n in counts.items():
        delta.counts[COUNTS.index(counter)] = n
    return delta


async def check_reminder_counters(factory: TableFactory) -> None:
    """``add_counts`` adds deltas to their rows' counters (several of one row in
    one call add up, each counter apart, a delta's last error replaces the
    stored one, one without leaves it); deltas of missing rows are dropped;
    ``read_counts`` of a row without counters, or of no row, is all zero; the
    counters survive ``upsert`` and a schedule CAS, and go with the row on
    ``remove`` and ``end`` (a new row of the same key starts at zero). Skipped
    for tables that are not a ``CountingReminderTable``."""
    async with factory() as table:
        if not isinstance(table, CountingReminderTable):
            return
        gid, other = GrainId("Counted", "c"), GrainId("Counted", "o")
        assert await table.read_counts(gid, "r") == ReminderCounters(), "no row: not zero"
        await table.upsert(new_row(table, gid))
        await table.upsert(new_row(table, other))
        assert await table.read_counts(gid, "r") == ReminderCounters(), "a new row: not zero"
        first = _delta(gid, "r", delivered=3, skipped_overlap=2)
        failed = _delta(gid, "r", failed=1, deadline_exceeded=1, dead_lettered=1)
        failed.error(ValueError("bad ✓ input"), T0)
        missing = _delta(GrainId("Counted", "missing"), "r", delivered=5)
        await table.add_counts([first, failed, missing, _delta(other, "r", skipped_late=4)])
        got = await table.read_counts(gid, "r")
        want = ReminderCounters(
            delivered=3,
            failed=1,
            deadline_exceeded=1,
            dead_lettered=1,
            skipped_overlap=2,
            last_error="ValueError: bad ✓ input",
            last_error_at=T0,
        )
        assert got == want, f"counters after one add:\n got {got}\nwant {want}"
        assert got.skipped() == 2 and got.skipped(SkipReason.OVERLAP) == 2
        assert await table.read_counts(GrainId("Counted", "missing"), "r") == ReminderCounters()
        assert (await table.read_counts(other, "r")).skipped_late == 4, "another row's delta lost"
        every = _delta(gid, "r", **{c: i + 1 for i, c in enumerate(COUNTS)})
        await table.add_counts([every, _delta(gid, "r", delivered=10)])
        got = await table.read_counts(gid, "r")
        expected = [want.counts()[i] + i + 1 for i in range(len(COUNTS))]
        expected[COUNTS.index("delivered")] += 10
        assert list(got.counts()) == expected, f"counters did not add up: {got}"
        assert got.last_error == want.last_error, "a delta without an error cleared it"
        later = _delta(gid, "r")
        later.error(RuntimeError("later"), T0 + timedelta(minutes=1))
        await table.add_counts([later])
        got = await table.read_counts(gid, "r")
        assert (got.last_error, got.last_error_at) == (
            "RuntimeError: later",
            T0 + timedelta(minutes=1),
        )
        # Concurrent adds lose nothing.
        await asyncio.gather(
            *(table.add_counts([_delta(other, "r", delivered=1)]) for _ in range(20))
        )
        assert (await table.read_counts(other, "r")).delivered == 20, "concurrent adds lost counts"
        kept = await table.read_counts(gid, "r")
        etag = await table.upsert(new_row(table, gid, due=T0 + timedelta(days=1)))
        assert await table.read_counts(gid, "r") == kept, "upsert dropped the counters"
        etag2 = await table.update_schedule(gid, "r", etag, T0 + timedelta(days=2), T0)
        assert etag2 is not None and await table.read_counts(gid, "r") == kept, "a CAS lost them"
        assert await table.remove(gid, "r", etag2) is True
        assert await table.read_counts(gid, "r") == ReminderCounters(), "remove kept counters"
        etag3 = await table.upsert(new_row(table, gid))
        assert await table.read_counts(gid, "r") == ReminderCounters(), "a new row inherited them"
        if isinstance(table, EndingReminderTable):
            await table.add_counts([_delta(gid, "r", delivered=1)])
            assert await table.end(gid, "r", etag3) is True
            assert await table.read_counts(gid, "r") == ReminderCounters(), "end kept counters"


def _letter(i: int, *, grain: GrainId | None = None, name: str = "r", at_s: int = 0) -> DeadLetter:
    return DeadLetter(
        id=f"{i:032x}",
        grain_id=grain or GrainId("Lettered", f"g{i % 3}"),
        name=name,
        slot=T0 + timedelta(minutes=i),
        first_tick_time=T0,
        attempts=1 + i % 4,
        error_type="ValueError",
        message=f"failed {i} ✓",
        traceback=f"Traceback (most recent call last):\n  line {i}\nValueError: failed {i}",
        at=T0 + timedelta(seconds=at_s if at_s else i),
        silo="silo-a",
    )


async def check_dead_letters(factory: TableFactory) -> None:
    """Dead letters: every field round-trips (a payload of the codec's types, a
    deadline, a cron, ...); a letter with a stored id replaces it; pages come
    newest first (time, then id, descending), every letter exactly once across
    pages (ties in time included), filtered by grain and/or name against brute
    force; ``keep`` and ``expire_before`` bound what is kept; ``remove`` says
    whether it removed; ``count_dead_letters``; a made-up cursor is a
    ``ValueError``. Letters outlive their row. Skipped for tables that are not
    a ``DeadLetterTable``."""
    async with factory() as table:
        if not isinstance(table, DeadLetterTable):
            return
        assert await table.read_dead_letters(None, 10) == ([], None)
        assert await table.count_dead_letters() == 0
        full = replace(
            _letter(100, grain=GrainId("Lettered", 7), name="ünïcode ✓"),
            due_at=T0 + timedelta(minutes=100, seconds=3),
            period=None,
            cron="0 0 9 * * 1-5",
            priority=-100,
            missed_ticks=4,
            payload={"order": 42, "when": T0, "raw": b"\x00\xff", "ids": [1, 2]},
            final=True,
            deadline=timedelta(seconds=2, milliseconds=5),
        )
        interval = replace(_letter(101), period=timedelta(minutes=1), priority=100)
        await table.add_dead_letters([full, interval], keep=100, expire_before=T0)
        assert await table.read_dead_letter(full.id) == full, "a dead letter changed in storage"
        assert await table.read_dead_letter(interval.id) == interval
        assert await table.read_dead_letter("0" * 32) is None
        again = replace(full, attempts=9, message="again", at=full.at + timedelta(hours=1))
        await table.add_dead_letters([again], keep=100, expire_before=T0)
        assert await table.read_dead_letter(full.id) == again, "same id not replaced"
        assert await table.count_dead_letters() == 2
        assert await table.remove_dead_letter(again.id) is True
        assert await table.remove_dead_letter(again.id) is False, "removed twice"
        assert await table.remove_dead_letter(interval.id) is True
        assert await table.count_dead_letters() == 0

        # 60 letters, some sharing a time, over three grains and two names.
        rng = random.Random(7)
        letters = [
            _letter(i, name="r" if i % 2 else "s", at_s=rng.randrange(1, 20)) for i in range(60)
        ]
        await table.add_dead_letters(letters[:30], keep=1000, expire_before=T0)
        await table.add_dead_letters(letters[30:], keep=1000, expire_before=T0)
        order = sorted(letters, key=lambda d: (d.at, d.id), reverse=True)
        for grain, name in ((None, None), (GrainId("Lettered", "g1"), None), (None, "s"),
                            (GrainId("Lettered", "g2"), "r")):  # fmt: skip
            want = [
                d for d in order
                if (grain is None or d.grain_id == grain) and (name is None or d.name == name)
            ]  # fmt: skip
            for limit in (1, 7, 100):
                got: list[DeadLetter] = []
                cursor: str | None = None
                while True:
                    page, cursor = await table.read_dead_letters(
                        cursor, limit, grain_id=grain, name=name
                    )
                    assert len(page) <= limit
                    got += page
                    if cursor is None:
                        break
                    assert len(page) == limit, "a short page with a cursor"
                assert [d.id for d in got] == [d.id for d in want], (
                    f"pages (limit {limit}, grain {grain}, name {name}) are not the letters "
                    "newest first, each once"
                )
        assert await table.count_dead_letters() == 60
        # Bounds: the expired go, then all but the newest ``keep``.
        cutoff = T0 + timedelta(seconds=10)
        await table.add_dead_letters([], keep=20, expire_before=cutoff)
        left = [d for d in order if d.at >= cutoff][:20]
        page, _ = await table.read_dead_letters(None, 100)
        assert [d.id for d in page] == [d.id for d in left], "bounds kept the wrong letters"
        assert await table.count_dead_letters() == len(left)
        try:
            await table.read_dead_letters("not a cursor", 10)
        except ValueError:
            pass
        else:
            raise AssertionError("a made-up cursor was accepted")
        # Letters belong to the service, not to a row.
        gid = GrainId("Lettered", "row")
        etag = await table.upsert(new_row(table, gid))
        await table.add_dead_letters([_letter(500, grain=gid)], keep=100, expire_before=T0)
        assert await table.remove(gid, "r", etag) is True
        assert await table.read_dead_letter(_letter(500).id) is not None, (
            "a letter went with its row"
        )
