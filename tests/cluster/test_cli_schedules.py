"""``orleanspy reminders`` for labels, calendars and backfills, run for real in
subprocesses straight on a Redis table (no silo up), with its errors."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from tests.cluster.test_cli import acli, ok_json

pytestmark = pytest.mark.slow


async def _seed(redis_url: str, service: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id=service)
        await table.start(stack)
        now = datetime.now(UTC)
        for i in range(5):
            labels = {"tenant": "acme" if i < 3 else "globex", "env": "prod"}
            await table.upsert(
                new_entry(
                    ReminderSpec(period=3600, labels=labels),
                    service_id=service,
                    grain_id=GrainId("LabelGrain", f"k{i}"),
                    name="r",
                    now=now - timedelta(hours=3),
                    options=ReminderOptions(),
                )
            )


async def test_labels_calendars_and_backfills_from_the_command_line(
    redis_url: str, tmp_path: Path
) -> None:
    service = "cli-schedules"
    await _seed(redis_url, service)
    url = ("--redis-url", redis_url, "--service-id", service)
    rem = (*url, "reminders")

    counted, listed, bad = await asyncio.gather(
        acli(*rem, "count", "--label", "tenant=acme"),
        acli(*rem, "list", "--label", "tenant=acme", "--label", "env=prod", "--json"),
        acli(*rem, "count", "--label", "tenant"),
    )
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.strip() == "3"
    rows = ok_json(listed)
    assert isinstance(rows, list)
    assert sorted(r["grain"] for r in rows) == ["LabelGrain/k0", "LabelGrain/k1", "LabelGrain/k2"]
    assert rows[0]["labels"] == {"env": "prod", "tenant": "acme"}
    assert bad.returncode == 2 and "write key=value" in bad.stderr

    dump = tmp_path / "acme.jsonl"
    exported = await acli(*rem, "export", "--label", "tenant=acme", "--output", str(dump))
    assert exported.returncode == 0, exported.stderr
    assert len(dump.read_text().splitlines()) == 3
    paused = await acli(*rem, "pause-many", "--label", "tenant=globex", "--json")
    assert ok_json(paused) == {"paused": 2, "dry_run": False}
    resumed = await acli(*rem, "resume-many", "--label", "tenant=globex", "--dry-run")
    assert resumed.stdout.strip() == "would be resumed 2 rows"
    nothing = await acli(*rem, "delete-many")
    assert nothing.returncode == 2 and "--type or --label" in nothing.stderr
    deleted = await acli(*rem, "delete-many", "--label", "tenant=globex")
    assert deleted.stdout.strip() == "deleted 2 rows"
    assert (await acli(*rem, "count")).stdout.strip() == "3"

    # Calendars: set, read, list, and delete refused while a reminder uses it.
    made = await acli(*rem, "calendar", "set", "de", "--tz", "Europe/Berlin",
                      "--exclude-date", "2026-12-25", "--exclude-weekday", "sat,sun",
                      "--exclude-range", "2027-01-04T08:00:00Z/2027-01-04T12:00:00Z",
                      "--json")  # fmt: skip
    assert ok_json(made)["updated"] == 0
    got = ok_json(await acli(*rem, "calendar", "get", "de", "--json"))
    assert got == {
        "name": "de",
        "tz": "Europe/Berlin",
        "exclude_dates": ["2026-12-25"],
        "exclude_weekdays": [5, 6],
        "exclude_ranges": [["2027-01-04T08:00:00+00:00", "2027-01-04T12:00:00+00:00"]],
    }
    listing = await acli(*rem, "calendar", "list")
    assert listing.returncode == 0 and "de (version" in listing.stdout
    assert "weekdays sat,sun" in listing.stdout
    wrong = await acli(*rem, "calendar", "set", "de", "--exclude-weekday", "someday")
    assert wrong.returncode == 2 and "not a weekday" in wrong.stderr
    unknown = await acli(*rem, "calendar", "get", "nope")
    assert unknown.returncode == 1 and "unknown calendar 'nope'" in unknown.stderr
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id=service)
        await table.start(stack)
        stored = await table.read_calendar("de")
        assert stored is not None
        await table.upsert(
            new_entry(
                ReminderSpec(cron="0 0 9 25 * *", tz="Europe/Berlin", calendar="de"),
                service_id=service,
                grain_id=GrainId("LabelGrain", "cal"),
                name="pay",
                now=datetime.now(UTC),
                options=ReminderOptions(),
                calendar=stored,
            )
        )
    refused = await acli(*rem, "calendar", "delete", "de")
    assert refused.returncode == 1 and "used by 1 reminder" in refused.stderr
    forced = await acli(*rem, "calendar", "delete", "de", "--force", "--json")
    assert ok_json(forced) == {"deleted": "de", "detached": 1}

    # Backfills: asked for (no silo runs it here), listed, refused twice, cancelled.
    now = datetime.now(UTC).replace(microsecond=0)
    start = (now - timedelta(hours=2)).isoformat()
    end = now.isoformat()
    asked = await acli(*rem, "backfill", "LabelGrain/k0", "r", "--from", start, "--to", end,
                       "--overlap", "skip", "--json")  # fmt: skip
    job = ok_json(asked)
    assert isinstance(job, dict)
    assert job["total"] == 2 and job["delivered"] == 0 and job["overlap"] == "SKIP"
    twice = await acli(*rem, "backfill", "LabelGrain/k0", "r", "--from", start, "--to", end)
    assert twice.returncode == 1 and "is running" in twice.stderr
    backwards = await acli(*rem, "backfill", "LabelGrain/k1", "r", "--from", end, "--to", start)
    assert backwards.returncode == 1 and "is not before end" in backwards.stderr
    missing = await acli(*rem, "backfill", "LabelGrain/k1", "nope", "--from", start, "--to", end)
    assert missing.returncode == 1 and "has no reminder 'nope'" in missing.stderr
    naive = await acli(*rem, "backfill", "LabelGrain/k1", "r", "--from", "2026-01-01T00:00",
                       "--to", end)  # fmt: skip
    assert naive.returncode == 2 and "has no offset" in naive.stderr
    jobs = ok_json(await acli(*rem, "backfills", "--json"))
    assert isinstance(jobs, list) and [j["grain_id"] for j in jobs] == ["LabelGrain/s:k0"]
    cancelled = await acli(*rem, "backfill-cancel", "LabelGrain/k0", "r")
    assert cancelled.returncode == 0, cancelled.stderr
    assert (await acli(*rem, "backfills")).stdout.strip() == "no backfill runs"
