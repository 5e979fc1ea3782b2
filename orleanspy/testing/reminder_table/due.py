"""The due index: range reads, due reads (and skipping ones) against brute force,
the index following rewrites, ``upcoming``, paused rows out of the index."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    ReminderEntry,
)
from orleanspy.reminders.table import (
    PausableReminderTable,
    SkippingReminderTable,
)
from orleanspy.ring import RingRange
from orleanspy.testing.reminder_table._support import (
    BULK,
    T0,
    TOP,
    TableFactory,
    as_stored,
    bulk_entries,
    check_due_answer,
    due_order,
    new_row,
    next_change,
    prime,
    random_range,
    upsert_all,
)

__all__ = [
    "check_due_index_follows_rewrites",
    "check_paused_rows_leave_the_due_index",
    "check_read_due_against_brute_force",
    "check_read_due_skipping_against_brute_force",
    "check_read_range_random_bounds",
    "check_upcoming",
]


async def check_read_range_random_bounds(factory: TableFactory) -> None:
    """``read_range`` over 1,000 rows equals a brute-force filter for random
    ranges, wrap-around, the edges of the hash space and ``(0, 0)``."""
    rng = random.Random(20260801)
    async with factory() as table:
        entries = bulk_entries(table, rng, BULK)
        await upsert_all(table, entries)
        hashes = sorted({e.hash for e in entries})
        ranges = [random_range(rng) for _ in range(24)]
        # Bounds exactly on row hashes test the open/closed ends.
        for _ in range(6):
            a, b = rng.choice(hashes), rng.choice(hashes)
            ranges += [RingRange(a, b), RingRange(b, a), RingRange(a, a)]
        ranges += [RingRange(0, 0), RingRange(0, TOP), RingRange(TOP, 0), RingRange(TOP, TOP)]
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
        entries = bulk_entries(table, rng, BULK)
        etags = await upsert_all(table, entries)
        pool = [as_stored(e, etags[e.key]) for e in entries]
        cases: list[tuple[RingRange, datetime, int]] = [
            (RingRange(0, 0), T0 + timedelta(hours=3), BULK + 10),
            (RingRange(0, 0), T0 - timedelta(seconds=1), 10),
            (RingRange(0, 0), T0 + timedelta(minutes=30), 1),
            (RingRange(TOP, 0), T0 + timedelta(hours=3), 50),
            (RingRange(3 << 30, 1 << 30), T0 + timedelta(hours=1), 100),  # wraps
        ]
        for _ in range(30):
            before = T0 + timedelta(milliseconds=rng.randrange(-1000, 2 * 3600 * 1000 + 1000))
            cases.append((random_range(rng), before, rng.choice([1, 7, 50, 200, 5000])))
        for r, before, limit in cases:
            got = await table.read_due(r, before, limit)
            check_due_answer("read_due", got, pool, r=r, before=before, limit=limit)
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
        entries = bulk_entries(table, rng, BULK)
        etags = await upsert_all(table, entries)
        pool = [as_stored(e, etags[e.key]) for e in entries]
        cases: list[tuple[RingRange, datetime, int]] = [
            (RingRange(0, 0), T0 + timedelta(hours=3), BULK + 10),
            (RingRange(0, 0), T0 + timedelta(minutes=30), 50),
            (RingRange(3 << 30, 1 << 30), T0 + timedelta(hours=1), 100),  # wraps
        ]
        for _ in range(20):
            before = T0 + timedelta(milliseconds=rng.randrange(-1000, 2 * 3600 * 1000 + 1000))
            cases.append((random_range(rng), before, rng.choice([1, 7, 50, 200, 5000])))
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
                order = [due_order(e) for e in got]
                assert order == sorted(order), f"{what}: rows not in the due order"
                by_key = {p.key: p for p in pool}
                assert all(e == by_key[e.key] for e in got[:3]), f"{what}: rows differ"
                kept = sorted(due_order(e) for e in qualifying if e.key not in skip)
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
                cut = sorted(due_order(e) for e in qualifying)[limit - 1]
                skipped_in = sum(1 for e in qualifying if e.key in skip and due_order(e) <= cut)
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
            due = T0 + timedelta(milliseconds=rng.randrange(0, 3600 * 1000))
            row = model.get(key)
            op = rng.random()
            if row is None or op < 0.3:
                e = new_row(table, gid, due=due, priority=rng.choice(_SOME_PRIORITIES))
                model[key] = as_stored(e, await table.upsert(e))
            elif op < 0.85:
                assert row.etag is not None
                etag = await table.update_schedule(gid, "r", row.etag, due, row.next_due)
                assert etag is not None, "CAS with the current etag lost"
                model[key] = as_stored(replace(row, next_due=due, last_fire=row.next_due), etag)
            else:
                assert row.etag is not None
                assert await table.remove(gid, "r", row.etag) is True
                del model[key]
        pool = list(model.values())
        assert await table.count() == len(pool)
        full = sorted(e.key for e in await table.read_range(RingRange.full()))
        assert full == sorted(model), "read_range disagrees with the writes made"
        for _ in range(20):
            r = random_range(rng)
            before = T0 + timedelta(milliseconds=rng.randrange(0, 3600 * 1000))
            limit = rng.choice([1, 10, 100, 1000])
            got = await table.read_due(r, before, limit)
            check_due_answer("read_due", got, pool, r=r, before=before, limit=limit)
            assert all(e == model[e.key] for e in got), "read_due returned an outdated row"


async def check_upcoming(factory: TableFactory) -> None:
    """``upcoming`` is ``read_due`` over the whole ring."""
    rng = random.Random(7)
    async with factory() as table:
        entries = bulk_entries(table, rng, 300)
        etags = await upsert_all(table, entries)
        pool = [as_stored(e, etags[e.key]) for e in entries]
        for before, limit in [
            (T0 - timedelta(milliseconds=1), 10),
            (T0 + timedelta(minutes=10), 5),
            (T0 + timedelta(hours=1), 1000),
            (T0 + timedelta(hours=5), 300),
            (T0 + timedelta(hours=5), 299),
        ]:
            got = await table.upcoming(before, limit)
            check_due_answer("upcoming", got, pool, r=None, before=before, limit=limit)


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
            await prime(table, feed)
            gid, other = GrainId("Paused", "p"), GrainId("Paused", "q")
            await table.upsert(new_row(table, other))
            assert (await next_change(feed)).next_due == T0
            etag = await table.upsert(new_row(table, gid, paused=True))
            change = await next_change(feed)
            assert (change.grain_id, change.next_due) == (gid, None), (
                f"a paused row's upsert published {change}, expected next_due None"
            )
            row = await table.read(gid, "r")
            assert row is not None and row.paused, "read lost the paused flag"
            assert [e.paused for e in await table.read_grain(gid)] == [True]
            assert await table.count() == 3  # the probe, q and p
            later = T0 + timedelta(days=1)
            for got in (
                await table.read_due(RingRange.full(), later, 100),
                await table.upcoming(later, 100),
            ):
                assert gid not in [e.grain_id for e in got], "a paused row is in the due index"
                assert other in [e.grain_id for e in got]
            moved = await table.update_schedule(gid, "r", etag, T0 + timedelta(minutes=1), T0)
            assert moved is not None, "CAS on a paused row with its etag lost"
            row = await table.read(gid, "r")
            assert row is not None and row.paused, "update_schedule unpaused the row"
            assert gid not in [e.grain_id for e in await table.upcoming(later, 100)]
            await table.upsert(replace(row, paused=False))
            assert (await next_change(feed)).next_due == T0 + timedelta(minutes=1)
            back = await table.read_due(RingRange.full(), later, 100)
            assert gid in [e.grain_id for e in back], "a resumed row is not in the due index"
            resumed = await table.read(gid, "r")
            assert resumed is not None and not resumed.paused
        finally:
            await feed.aclose()
