"""The label index, calendars and backfill jobs (``reminders.stores``), against brute force."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, Excluded
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.stores import BackfillStore, CalendarStore, IndexedReminderTable
from orleanspy.testing.reminder_table._support import T0, TableFactory, as_stored, new_row

__all__ = [
    "check_backfill_jobs",
    "check_calendars",
    "check_label_index_against_brute_force",
]

_TENANTS = ("acme", "globex", "initech", "a=b")
_ENVS = ("prod", "test")


def _labels(rng: random.Random) -> dict[str, str] | None:
    pick = rng.random()
    if pick < 0.2:
        return None
    labels = {"tenant": rng.choice(_TENANTS)}
    if pick < 0.7:
        labels["env"] = rng.choice(_ENVS)
    return labels


async def _walk(table: IndexedReminderTable, terms: list[str], limit: int) -> list[ReminderEntry]:
    rows: list[ReminderEntry] = []
    cursor: str | None = None
    for _ in range(10_000):
        page, cursor = await table.read_indexed(terms, cursor, limit)
        assert len(page) <= limit, f"read_indexed returned {len(page)} rows for a limit of {limit}"
        rows.extend(page)
        if cursor is None:
            return rows
    raise AssertionError("read_indexed never ended its walk")


async def check_label_index_against_brute_force(factory: TableFactory) -> None:
    """Rows with random labels and calendars, rewritten (labels changed, removed,
    added), removed, schedule-CASed (terms kept) and paused: every selector's
    walk (``read_indexed``, at several page sizes) returns exactly the rows that
    carry all its terms, each once and as stored, and ``count_indexed`` counts
    each term's rows. Skipped for tables that are not an ``IndexedReminderTable``."""
    rng = random.Random(32)
    async with factory() as table:
        if not isinstance(table, IndexedReminderTable):
            return
        rows: dict[str, ReminderEntry] = {}
        etags: dict[str, str] = {}
        for i in range(240):
            gid = GrainId("Labelled", i // 3 if i % 4 else f"k{i}")
            row = new_row(table, gid, f"r{i}", due=T0 + timedelta(seconds=i), labels=_labels(rng))
            if rng.random() < 0.15:
                row = replace(row, calendar=rng.choice(["de", "us"]))
            etags[row.key] = await table.upsert(row)
            rows[row.key] = row
        keys = list(rows)
        rng.shuffle(keys)
        for key in keys[:60]:  # rewrite: new labels (some to none), a calendar dropped
            row = replace(rows[key], labels=_labels(rng), calendar=None)
            etags[key] = await table.upsert(row)
            rows[key] = row
        for key in keys[60:90]:  # removed
            row = rows.pop(key)
            assert await table.remove(row.grain_id, row.name, etags.pop(key))
        for key in keys[90:120]:  # a schedule CAS keeps the row's terms
            row = rows[key]
            due = row.next_due + timedelta(minutes=5)
            new = await table.update_schedule(row.grain_id, row.name, etags[key], due, T0)
            assert new is not None, "schedule CAS lost on an unchanged row"
            etags[key] = new
            rows[key] = replace(row, next_due=due, last_fire=T0)
        for key in keys[120:130]:  # paused rows stay in the index
            row = replace(rows[key], paused=True)
            etags[key] = await table.upsert(row)
            rows[key] = row
        selectors = [
            ["l:tenant=acme"],
            ["l:tenant=a=b"],
            ["l:env=prod", "l:tenant=globex"],
            ["c:de"],
            ["c:us", "l:tenant=initech"],
            ["l:tenant=nobody"],
        ]
        for terms in selectors:
            want = {k for k, r in rows.items() if set(terms) <= set(r.index_terms())}
            for limit in (1, 7, 500):
                got = await _walk(table, terms, limit)
                got_keys = [r.key for r in got]
                assert len(got_keys) == len(set(got_keys)), f"{terms}: a row came back twice"
                assert set(got_keys) == want, (
                    f"{terms} limit={limit}: {len(set(got_keys) - want)} rows too many, "
                    f"{len(want - set(got_keys))} missing"
                )
                for r in got:
                    assert r == as_stored(rows[r.key], etags[r.key]), f"{r.key} not as stored"
            if len(terms) == 1:
                counted = await table.count_indexed(terms[0])
                assert counted == len(want), (
                    f"count_indexed({terms[0]}) = {counted}, not {len(want)}"
                )


async def check_calendars(factory: TableFactory) -> None:
    """Calendars are stored by name with growing versions, read back equal,
    listed by name, and removed only at their version. Skipped for tables that
    are not a ``CalendarStore``."""
    async with factory() as table:
        if not isinstance(table, CalendarStore):
            return
        assert await table.read_calendar("de") is None
        de = Calendar(
            tz="Europe/Berlin",
            exclude_dates=["2026-12-25", "2026-12-26"],
            exclude_weekdays=[5, 6],
            exclude_ranges=[(T0, T0 + timedelta(hours=2))],
        )
        first = await table.write_calendar("de", de)
        assert first.name == "de" and first.calendar == de
        assert await table.read_calendar("de") == first
        us = await table.write_calendar("us", Calendar(tz="America/New_York"))
        changed = await table.write_calendar("de", replace(de, exclude_weekdays=(6,)))
        assert changed.version > first.version and us.version > first.version
        assert (await table.read_calendar("de")) == changed
        assert [c.name for c in await table.read_calendars()] == ["de", "us"]
        assert not await table.remove_calendar("de", first.version), "removed at a stale version"
        assert await table.remove_calendar("de", changed.version)
        assert await table.read_calendar("de") is None
        assert not await table.remove_calendar("de", changed.version)
        assert [c.name for c in await table.read_calendars()] == ["us"]
        # A row may name a calendar; its rules travel with the row.
        row = new_row(table, GrainId("Cal", "a"), calendar="us",
                      on_excluded=Excluded.NEXT_BUSINESS_DAY, calendar_version=us.version,
                      _calendar_rules=us.calendar)  # fmt: skip
        etag = await table.upsert(row)
        got = await table.read(row.grain_id, row.name)
        assert got == as_stored(row, etag) and got is not None
        assert got.calendar_rules == us.calendar and got.on_excluded is Excluded.NEXT_BUSINESS_DAY
        # A schedule CAS keeps the rules, an empty calendar's too (a store that
        # rewrites the record must not turn its empty map into something else).
        empty = replace(row, name="empty", _calendar_rules=Calendar())
        etag = await table.upsert(empty)
        due = T0 + timedelta(minutes=1)
        moved = await table.update_schedule(empty.grain_id, "empty", etag, due, T0)
        assert moved is not None
        got = await table.read(empty.grain_id, "empty")
        assert got is not None and got.calendar_rules == Calendar() and got.next_due == due


async def check_backfill_jobs(factory: TableFactory) -> None:
    """One job per row: added once, read back, updated by etag (a stale etag
    loses), listed, removed (at an etag, or whatever it is). Skipped for tables
    that are not a ``BackfillStore``."""
    async with factory() as table:
        if not isinstance(table, BackfillStore):
            return
        gid = GrainId("Backfilled", "b")
        await table.upsert(new_row(table, gid))
        await table.upsert(new_row(table, gid, "other"))
        job = BackfillJob(gid, "r", T0, T0 + timedelta(hours=1), T0, total=60,
                          overlap="SKIP", created=T0)  # fmt: skip
        assert await table.read_backfill(gid, "r") is None
        added = await table.add_backfill(job)
        assert added is not None and added.etag is not None
        assert added == job.with_etag(added.etag)
        assert await table.add_backfill(job) is None, "a second job for one row"
        other = await table.add_backfill(replace(job, name="other", overlap=None))
        assert other is not None
        moved = added.advanced(T0 + timedelta(minutes=1), ok=True)
        etag = await table.update_backfill(moved, added.etag)
        assert etag is not None and etag != added.etag
        assert await table.update_backfill(moved, added.etag) is None, "a stale etag won"
        assert await table.read_backfill(gid, "r") == moved.with_etag(etag)
        listed = await table.read_backfills()
        assert [(j.name, j.delivered) for j in listed] == [("other", 0), ("r", 1)]
        assert not await table.remove_backfill(gid, "r", added.etag)
        assert await table.remove_backfill(gid, "r", etag)
        assert await table.remove_backfill(gid, "other")
        assert not await table.remove_backfill(gid, "other")
        assert await table.read_backfills() == []
