"""Labels on an embedded silo: stored with the row, and list, count, pause, resume,
delete and export by label selector; bad labels and selectors write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.labels import MAX_LABELS, parse_selector
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

T0 = datetime(2030, 5, 1, tzinfo=UTC)
REMINDERS = ReminderOptions(base_bucket_size=64, permits=4, adaptive=False)
TICKS: list[tuple[GrainId, str]] = []


class TenantGrain(Grain, Remindable, type_name="test_labels.Tenant"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((self.grain_id, name))

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


@pytest.fixture(autouse=True)
def _clear_ticks() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def test_selectors_parse_and_refuse_what_they_cannot_mean() -> None:
    assert parse_selector("tenant=acme") == {"tenant": "acme"}
    assert parse_selector("tenant=acme, env=prod") == {"tenant": "acme", "env": "prod"}
    assert parse_selector(["tenant=a=b"]) == {"tenant": "a=b"}
    assert parse_selector({"env": ""}) == {"env": ""}
    for bad, message in (
        ("tenant", "write key=value"),
        (["tenant=acme", "env"], "write key=value"),
        ("=acme", "not a label key"),
        ("tenant=a,tenant=b", "two values"),
        ("", "empty label selector"),
        (42, "a label selector is"),
    ):
        with pytest.raises(ReminderError, match=message):
            parse_selector(bad)


async def test_list_count_pause_resume_delete_and_export_by_label() -> None:
    clock = ManualClock(T0)
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(TenantGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        for i in range(6):
            tenant = "acme" if i % 2 == 0 else "globex"
            labels = {"tenant": tenant, "env": "prod" if i < 4 else "test"}
            grain = silo.client.get_grain(TenantGrain, f"g{i}")
            row = await grain.register("tick", {"period": 60, "labels": labels})
            assert row.labels == dict(sorted(labels.items()))
        await silo.client.get_grain(TenantGrain, "plain").register("tick", {"period": 60})
        mgmt = silo.client.reminders
        assert await mgmt.count(labels={"tenant": "acme"}) == 3
        assert await mgmt.count(labels="tenant=acme,env=prod") == 2
        assert await mgmt.count(labels={"tenant": "nobody"}) == 0
        page = await mgmt.page(labels={"tenant": "globex"}, limit=2)
        assert len(page.rows) == 2 and page.cursor is not None
        rest = await mgmt.page(page.cursor, 2, labels={"tenant": "globex"})
        keys = {r.grain_id.key for r in [*page.rows, *rest.rows]}
        assert keys == {"g1", "g3", "g5"} and rest.cursor is None
        # Pause acme: its reminders stop ticking, the others go on.
        assert await mgmt.pause_where(labels={"tenant": "acme"}) == 3
        assert await mgmt.pause_where(labels={"tenant": "acme"}) == 0
        await clock.advance(61)
        await wait_for(lambda: len(TICKS) == 4, 5.0, interval=0)
        assert {g.key for g, _ in TICKS} == {"g1", "g3", "g5", "plain"}
        # Paused rows are still selected (and counted) by their labels.
        assert await mgmt.count(labels={"tenant": "acme"}) == 3
        assert await mgmt.resume_where(labels={"tenant": "acme", "env": "prod"}) == 2
        rows = {r.grain_id.key: r for r in await mgmt.upcoming(timedelta(days=1))}
        assert "g0" in rows and "g2" in rows and "g4" not in rows
        # Export (the CLI's) walks the same pages; delete by label, dry run first.
        assert await mgmt.delete_where(labels={"env": "test"}, dry_run=True) == 2
        assert await mgmt.delete_where(labels={"env": "test"}) == 2
        assert await mgmt.count(labels={"env": "test"}) == 0
        assert await table.count() == 5
        with pytest.raises(ReminderError, match="write key=value"):
            await mgmt.count(labels="tenant")
        with pytest.raises(ReminderError, match="grain type or a label selector"):
            await mgmt.delete_where()


async def test_bad_labels_are_refused_and_write_nothing() -> None:
    clock = ManualClock(T0)
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(TenantGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        grain = silo.client.get_grain(TenantGrain, "x")
        too_many = {f"k{i}": "v" for i in range(MAX_LABELS + 1)}
        for labels, message in (
            (too_many, f"at most {MAX_LABELS} labels"),
            ({"bad key": "v"}, "not a label key"),
            ({"k": "x" * 200}, "at most 128 characters"),
            ({"k": "line\nbreak"}, "no control characters"),
            ({"k": 3}, "string value"),
            (["k=v"], "mapping of strings"),
        ):
            with pytest.raises(ReminderError, match=message):
                await grain.register("r", {"period": 60, "labels": labels})
        assert await table.count() == 0
