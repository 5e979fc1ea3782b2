"""Whole rows: etags, reads, every field's round trip (the optional schedule
fields too), conditional and bulk writes, removal by etag, the count."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    ScheduleUpdate,
)
from orleanspy.reminders.table import (
    BatchingReminderTable,
    BulkReminderTable,
    PausableReminderTable,
)
from orleanspy.ring import RingRange
from orleanspy.testing.reminder_table._support import (
    T0,
    TableFactory,
    as_stored,
    new_row,
)

__all__ = [
    "check_count",
    "check_read_and_read_grain",
    "check_remove_checks_the_etag",
    "check_round_trip_every_field",
    "check_schedule_fields",
    "check_upsert_if",
    "check_upsert_if_many_and_read_grains",
    "check_upsert_many",
    "check_upsert_returns_distinct_etags",
]


async def check_upsert_returns_distinct_etags(factory: TableFactory) -> None:
    """Each upsert returns a new etag, also five parallel upserts of one key."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "etags")
        seen = [await table.upsert(new_row(table, gid)) for _ in range(3)]
        assert len(set(seen)) == 3, f"sequential upserts returned repeated etags {seen}"
        parallel = await asyncio.gather(
            *(table.upsert(new_row(table, gid, due=T0 + timedelta(seconds=i))) for i in range(5))
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
                e = new_row(table, gid, name, due=T0 + timedelta(seconds=len(name)))
                stored[(gid, name)] = as_stored(e, await table.upsert(e))
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
            new_row(
                table,
                GrainId("RoundTrip", "cron"),
                "weekday-9am",
                period=None,
                cron="0 0 9 * * 1-5",
                tz="Europe/Berlin",
                due=at,
            ),
            new_row(
                table,
                GrainId("RoundTrip", 7),
                "interval",
                period=timedelta(hours=1, milliseconds=5),
                last_fire=at - timedelta(hours=1),
                due=at,
            ),
            new_row(
                table,
                GrainId("RoundTrip", uuid.UUID(int=42)),
                "ünïcode name ✓",
                cron="*/5 * * * *",
                period=None,
                priority=ReminderPriority.CRITICAL,
                action=MissedReminderAction.FIRE_IMMEDIATELY,
                due=at,
            ),
            new_row(
                table,
                GrainId("RoundTrip", "low"),
                "bg",
                priority=ReminderPriority.BACKGROUND,
                action=MissedReminderAction.NOTIFY,
                due=at,
            ),
            new_row(table, GrainId("RoundTrip", "min"), "p-128", priority=-128, due=at),
            new_row(
                table,
                GrainId("RoundTrip", "max"),
                "p127",
                priority=127,
                due=at,
                start_at=datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
            ),
            new_row(
                table,
                GrainId("RoundTrip", ""),
                "empty key",
                due=at,
                action=MissedReminderAction.SKIP,
            ),
            new_row(table, GrainId("RoundTrip", "decl"), "declared", due=at, declared=True),
            new_row(
                table,
                GrainId("RoundTrip", "fp"),
                "fingerprinted",
                due=at,
                declared=True,
                fingerprint="0123456789ab:100:1:",
            ),
            new_row(
                table,
                GrainId("RoundTrip", "grace"),
                "own grace",
                due=at,
                grace=timedelta(seconds=90, milliseconds=5),
            ),
            new_row(
                table, GrainId("RoundTrip", "nograce"), "zero grace", due=at, grace=timedelta(0)
            ),
        ]
        for e in variants:
            etag = await table.upsert(e)
            got = await table.read(e.grain_id, e.name)
            expected = as_stored(e, etag)
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


async def check_schedule_fields(factory: TableFactory) -> None:
    """The optional schedule fields round-trip and survive every write that does
    not set them: a one-shot row (neither period nor cron), jitter, ``starts_at``,
    ``ends_at``, ``max_ticks``/``final_due``, a payload of the codec's types and
    a ``RetryPolicy``, an ``OverlapPolicy``, a catch-up window, a deadline and
    a resume time come back from ``read``, ``read_grain``, ``read_due`` and
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
            new_row(table, gid, "once", period=None, due=at, start_at=at, payload="x"),
            new_row(
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
            new_row(
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
            new_row(
                table,
                gid,
                "policies",
                due=at,
                action=MissedReminderAction.FIRE_IMMEDIATELY,
                overlap=OverlapPolicy.CANCEL_OTHER,
                catchup_window=timedelta(hours=2, milliseconds=7),
                deadline=timedelta(seconds=45, milliseconds=3),
                resumed_at=at - timedelta(minutes=3),
            ),
        ]
        etags = {e.name: await table.upsert(e) for e in shaped}
        want = {e.name: as_stored(e, etags[e.name]) for e in shaped}
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
        expected = as_stored(replace(shaped[1], next_due=moved, last_fire=at), etag)
        assert got == expected, f"update_schedule lost fields:\n got {got}\nwant {expected}"
        policies = shaped[3]
        etag_p = await table.update_schedule(gid, "policies", etags["policies"], moved, at)
        got = await table.read(gid, "policies")
        expected = as_stored(replace(policies, next_due=moved, last_fire=at), etag_p or "")
        assert etag_p is not None and got == expected, f"update_schedule lost fields: {got}"
        if isinstance(table, BatchingReminderTable):
            later = moved + timedelta(minutes=1)
            [etag2] = await table.update_schedule_many(
                [ScheduleUpdate(gid, "bounded", etag, later, moved)]
            )
            assert etag2 is not None, "a valid batched CAS was refused"
            got = await table.read(gid, "bounded")
            expected = as_stored(replace(shaped[1], next_due=later, last_fire=moved), etag2)
            assert got == expected, f"update_schedule_many lost fields:\n got {got}"
        if isinstance(table, BulkReminderTable):
            bulk = [replace(e, name=f"bulk-{e.name}") for e in shaped]
            bulk_etags = await table.upsert_many(bulk)
            for e, etag in zip(bulk, bulk_etags, strict=True):
                got = await table.read(gid, e.name)
                assert got == as_stored(e, etag), f"upsert_many lost fields:\n got {got}"
        # A rewrite without the fields clears them (the row is what was written).
        plain = new_row(table, gid, "bounded", due=at)
        etag = await table.upsert(plain)
        got = await table.read(gid, "bounded")
        assert got == as_stored(plain, etag), f"a rewrite kept old optional fields: {got}"

        if isinstance(table, PausableReminderTable):
            records = [
                FireRecord(gid, "once", at, at, FireOutcome.RETRYING, "silo-a", attempt=2),
                FireRecord(gid, "once", at, at, FireOutcome.OK, "silo-a", attempt=3, final=True),
            ]
            await table.append_history(records, 5)
            got_history = await table.read_history(gid, "once")
            assert got_history == records[::-1], f"attempt/final did not round-trip: {got_history}"


async def check_upsert_if(factory: TableFactory) -> None:
    """``upsert_if`` writes only on its condition: absent for ``None``, else the
    current etag; concurrent inserts of one row, and concurrent replaces on one
    etag, each make exactly one winner, and the row is the winner's."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "cond")
        first = new_row(table, gid, "c", due=T0)
        etag = await table.upsert_if(first, None)
        assert etag is not None, "insert into an empty slot failed"
        assert await table.upsert_if(first, None) is None, "insert over an existing row"
        moved = replace(first, next_due=T0 + timedelta(hours=1), priority=9)
        assert await table.upsert_if(moved, "stale") is None, "replace with a wrong etag"
        got = await table.read(gid, "c")
        assert got == as_stored(first, etag), "a refused upsert_if changed the row"
        new_etag = await table.upsert_if(moved, etag)
        assert new_etag is not None and new_etag != etag
        assert await table.read(gid, "c") == as_stored(moved, new_etag)
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
        first = [new_row(table, g, priority=i % 3) for i, g in enumerate(gids)]
        etags = await table.upsert_if_many([(e, None) for e in first[:20]])
        assert all(etags), f"inserts into empty slots failed: {etags}"
        stored = await _read_many(table, [(e.grain_id, e.name) for e in first])
        assert stored[:20] == [
            as_stored(e, t) for e, t in zip(first[:20], etags, strict=True) if t is not None
        ]
        assert stored[20:] == [None] * 20, "read_grains invented rows"
        tricky = [GrainId("ContractBulkIf", "a|b"), GrainId("ContractBulkIf", "a")]
        for g in tricky:
            for name in ("x", "y"):
                await table.upsert(new_row(table, g, name))
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
                assert row == as_stored(moved[i], result), f"row {i}: not the written row"
        paused = [r for r in after if r is not None and r.paused]
        due = await table.upcoming(T0 + timedelta(days=1), 1000)
        assert not {r.key for r in paused} & {r.key for r in due}, "a paused row is due"


async def check_upsert_many(factory: TableFactory) -> None:
    """``upsert_many`` (a ``BulkReminderTable``) writes every row as ``upsert``
    would, with the etags in order. Skipped for tables without it."""
    async with factory() as table:
        if not isinstance(table, BulkReminderTable):
            return
        entries = [
            new_row(table, GrainId("ContractBulk", i % 97), f"b{i}", due=T0, priority=i % 7 - 3)
            for i in range(600)
        ]
        etags = await table.upsert_many(entries)
        assert len(etags) == len(entries), "one etag per row"
        assert await table.count() == len(entries)
        for e, etag in list(zip(entries, etags, strict=True))[::50]:
            assert await table.read(e.grain_id, e.name) == as_stored(e, etag)
        due = await table.read_due(RingRange.full(), T0, 10)
        assert [int(e.priority) for e in due] == [3] * 10, "bulk rows missing from the due index"
        assert await table.upsert_many([]) == []


async def check_remove_checks_the_etag(factory: TableFactory) -> None:
    """``remove`` deletes only with the current etag; a missing row gives ``False``."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "rm")
        assert await table.remove(gid, "r", "no-such-etag") is False, "removed a missing row"
        stale = await table.upsert(new_row(table, gid))
        current = await table.upsert(new_row(table, gid, due=T0 + timedelta(minutes=1)))
        other = await table.upsert(new_row(table, gid, "other"))
        assert await table.remove(gid, "r", stale) is False, "removed with a stale etag"
        assert await table.remove(gid, "r", "wrong-etag") is False, "removed with a wrong etag"
        assert await table.remove(gid, "r", other) is False, "removed with another row's etag"
        assert await table.read(gid, "r") is not None, "a failed remove deleted the row"
        assert await table.remove(gid, "r", current) is True, "remove with the right etag failed"
        assert await table.read(gid, "r") is None, "removed row still readable"
        assert [r.name for r in await table.read_grain(gid)] == ["other"]
        assert await table.remove(gid, "r", current) is False, "removed the same row twice"
        assert await table.count() == 1
        due = await table.read_due(RingRange.full(), T0 + timedelta(days=1), 10)
        assert [r.name for r in due] == ["other"], "removed row still in the due index"


async def check_count(factory: TableFactory) -> None:
    """``count`` follows inserts and removes, not upserts of existing rows."""
    async with factory() as table:
        assert await table.count() == 0, "a fresh table is not empty"
        gids = [GrainId("ContractGrain", i) for i in range(25)]
        etags = [await table.upsert(new_row(table, g)) for g in gids]
        assert await table.count() == 25
        await table.upsert(new_row(table, gids[0], due=T0 + timedelta(days=1)))
        await table.upsert(new_row(table, gids[0], "second"))
        assert await table.count() == 26
        assert await table.remove(gids[1], "r", etags[1]) is True
        assert await table.remove(gids[2], "r", "wrong") is False
        assert await table.count() == 25
