"""The operator audit log (``AuditedReminderTable``): a record commits with its
write or not at all, queries against brute force, settling, retention."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import datetime, timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.audit import (
    AUDIT_COUNT_SLACK,
    AuditedReminderTable,
    AuditOutcome,
    AuditQuery,
    AuditRecord,
    AuditRetention,
    new_audit_id,
    newest_first,
)
from orleanspy.reminders.model import ReminderEntry
from orleanspy.testing.reminder_table._support import T0, TableFactory, as_stored, new_row

__all__ = [
    "check_audit_query_filters",
    "check_audit_settle_and_retention",
    "check_audited_writes_commit_with_their_record",
]

_KEEP = AuditRetention(timedelta(days=365), 100_000)


def _record(
    i: int,
    grain: GrainId | None,
    *,
    name: str | None = "r",
    principal: str = "tls:CN=ops",
    action: str = "pause",
    outcome: AuditOutcome = AuditOutcome.OK,
    before: ReminderEntry | None = None,
    after: ReminderEntry | None = None,
    at: datetime | None = None,
) -> AuditRecord:
    return AuditRecord(
        id=new_audit_id(),
        at=at or T0 + timedelta(seconds=i),
        principal=principal,
        action=action,
        outcome=outcome,
        grain_id=grain,
        name=None if grain is None else name,
        before=before,
        after=after,
        detail=f'{{"n": {i}, "text": "ü ✓"}}',
        batch=None if i % 2 else f"batch-{i}",
        via="silo-a",
    )


async def _log(table: AuditedReminderTable, **query: object) -> list[AuditRecord]:
    return await table.read_audit(AuditQuery(limit=10_000, **query))  # type: ignore[arg-type]


async def check_audited_writes_commit_with_their_record(factory: TableFactory) -> None:
    """``upsert_if_audited`` and ``remove_audited`` write the row and the record
    together: a condition that does not hold writes neither, one that holds
    both; of concurrent audited writes with one condition exactly one writes,
    with exactly one record. Records come back newest first, field by field
    (rows before and after included). Skipped for tables that keep no log."""
    async with factory() as table:
        if not isinstance(table, AuditedReminderTable):
            return
        gid = GrainId("Audited", "a")
        row = new_row(table, gid)
        created = _record(0, gid, action="import", after=row)
        etag = await table.upsert_if_audited(row, None, created, _KEEP)
        assert etag is not None, "an audited insert of an absent row must write"
        assert await table.read(gid, "r") == as_stored(row, etag)
        assert await _log(table) == [created], "the insert's record must be stored with it"

        changed = replace(row, priority=7)
        lost = [
            await table.upsert_if_audited(changed, None, _record(1, gid), _KEEP),
            await table.upsert_if_audited(changed, "not-an-etag", _record(1, gid), _KEEP),
            await table.remove_audited(gid, "r", "not-an-etag", _record(1, gid), _KEEP),
        ]
        assert lost == [None, None, False], f"writes whose condition fails must lose: {lost}"
        assert await table.read(gid, "r") == as_stored(row, etag), "a lost write changed the row"
        assert await _log(table) == [created], "a lost write must append no record"

        paused = replace(row, paused=True)
        contenders = [
            _record(2, gid, before=row, after=paused, principal=f"p{i}") for i in range(8)
        ]
        results = await asyncio.gather(
            *(table.upsert_if_audited(paused, etag, rec, _KEEP) for rec in contenders)
        )
        winners = [(rec, e) for rec, e in zip(contenders, results, strict=True) if e is not None]
        assert len(winners) == 1, f"{len(winners)} of 8 concurrent audited writes won"
        won, etag2 = winners[0]
        assert etag2 is not None
        assert await table.read(gid, "r") == as_stored(paused, etag2)
        assert await _log(table) == [won, created], "exactly the winner's record must be stored"

        gone = _record(3, gid, action="delete", before=as_stored(paused, etag2))
        assert not await table.remove_audited(gid, "r", etag, _record(3, gid), _KEEP)
        assert await table.remove_audited(gid, "r", etag2, gone, _KEEP)
        assert await table.read(gid, "r") is None, "an audited remove must remove the row"
        assert await _log(table) == [gone, won, created], "the remove's record must be stored"
        assert not await table.remove_audited(gid, "r", etag2, _record(4, gid), _KEEP)
        assert await _log(table) == [gone, won, created]


async def check_audit_query_filters(factory: TableFactory) -> None:
    """``read_audit`` answers each filter (grain, grain and name, principal, action,
    since, until, limit, combined) as brute force over what was appended would,
    newest first (ties in time by id descending). Skipped for tables that keep
    no log."""
    async with factory() as table:
        if not isinstance(table, AuditedReminderTable):
            return
        rng = random.Random(33)
        grains = [GrainId("Audited", k) for k in ("a", "b", 7)] + [None]
        appended: list[AuditRecord] = []
        for i in range(60):
            grain = rng.choice(grains)
            rec = _record(
                i,
                grain,
                name=rng.choice(("r", "s")),
                principal=rng.choice(("local", "cluster-secret", "dashboard:ops")),
                action=rng.choice(("pause", "delete", "trigger")),
                outcome=rng.choice(list(AuditOutcome)),
                at=T0 + timedelta(seconds=rng.randrange(20)),  # ties in time
            )
            appended.append(rec)
            await table.append_audit(rec, _KEEP)
        a = GrainId("Audited", "a")
        queries = [
            AuditQuery(),
            AuditQuery(limit=7),
            AuditQuery(grain_id=a),
            AuditQuery(grain_id=a, name="s"),
            AuditQuery(grain_id=GrainId("Audited", 7), limit=3),
            AuditQuery(principal="dashboard:ops"),
            AuditQuery(action="trigger", limit=5),
            AuditQuery(since=T0 + timedelta(seconds=5), until=T0 + timedelta(seconds=9)),
            AuditQuery(until=T0 + timedelta(seconds=3), principal="local"),
            AuditQuery(grain_id=a, principal="local", action="pause", since=T0),
            AuditQuery(principal="nobody"),
        ]
        for query in queries:
            want = newest_first([r for r in appended if query.matches(r)], query.limit)
            got = await table.read_audit(query)
            assert got == want, f"{query}: {len(got)} records, expected {len(want)} (or order)"


async def check_audit_settle_and_retention(factory: TableFactory) -> None:
    """``settle_audit`` replaces a stored record by id (``False`` for one not
    stored); an append drops the records past ``max_age`` before its own time
    (here: of the same grain) and keeps at most ``max_records +
    AUDIT_COUNT_SLACK`` of them, the newest among them. Skipped for tables that
    keep no log."""
    async with factory() as table:
        if not isinstance(table, AuditedReminderTable):
            return
        gid = GrainId("Audited", "settle")
        pending = _record(0, gid, action="trigger", outcome=AuditOutcome.PENDING)
        await table.append_audit(pending, _KEEP)
        done = pending.settled(AuditOutcome.FAILED, '{"error": "ValueError: no"}')
        assert await table.settle_audit(done), "settling a stored record must succeed"
        assert await _log(table, grain_id=gid) == [done]
        stranger = _record(1, gid)
        assert not await table.settle_audit(stranger), "a record never stored was settled"
        assert await _log(table, grain_id=gid) == [done]

        aged = GrainId("Audited", "aged")
        day = AuditRetention(timedelta(hours=1), 100_000)
        old = _record(0, aged, at=T0)
        new = _record(1, aged, at=T0 + timedelta(hours=1, seconds=1))
        await table.append_audit(old, day)
        await table.append_audit(new, day)
        assert await _log(table, grain_id=aged) == [new], "a record past max_age was kept"

        many = GrainId("Audited", "many")
        few = AuditRetention(timedelta(days=365), 5)
        written = [_record(0, many, at=T0 + timedelta(milliseconds=i)) for i in range(150)]
        for rec in written:
            await table.append_audit(rec, few)
        kept = await _log(table, grain_id=many)
        assert 1 <= len(kept) <= 5 + AUDIT_COUNT_SLACK, (
            f"{len(kept)} records kept with max_records=5 (slack {AUDIT_COUNT_SLACK})"
        )
        assert kept[0] == written[-1], "the newest record must be kept"
        assert kept == newest_first(written, len(kept)), "the kept records must be the newest"
