"""Export and import of rows with labels and a calendar: the labels travel, the
calendar is bound by name to the importing table's (refused, nothing written,
while it lacks it); rows sent through a call arrive without their rules and are
bound the same way."""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import UTC, datetime

import pytest

from orleanspy import Calendar, Excluded, ReminderError, ReminderOptions
from orleanspy._cli_reminders import export_line, parse_export
from orleanspy.clock import SystemClock
from orleanspy.identity import GrainId
from orleanspy.remindable.operations import ReminderOperations
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.serialization import pack, unpack

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def ops(table: InMemoryReminderTable) -> ReminderOperations:
    return ReminderOperations(
        table, service_id="default", clock=SystemClock(), options=ReminderOptions()
    )


async def test_rows_with_labels_and_a_calendar_export_and_import() -> None:
    async with AsyncExitStack() as stack:
        source, target = InMemoryReminderTable(), InMemoryReminderTable()
        for t in (source, target):
            await t.start(stack)
        de = await source.write_calendar(
            "de",
            Calendar(tz="Europe/Berlin", exclude_dates=["2026-12-25"], exclude_weekdays=[5, 6]),
        )
        row = new_entry(
            ReminderSpec(
                cron="0 0 9 25 * *",
                tz="Europe/Berlin",
                calendar="de",
                on_excluded=Excluded.PREVIOUS_BUSINESS_DAY,
                labels={"tenant": "acme"},
            ),
            service_id="default",
            grain_id=GrainId("Payroll", "acme"),
            name="pay",
            now=NOW,
            options=ReminderOptions(),
            calendar=de,
        )
        await source.upsert(row)
        lines = [export_line(r) for r in (await source.read_page(None, 10))[0]]
        rows = list(parse_export(lines))
        assert rows[0].labels == {"tenant": "acme"} and rows[0].calendar == "de"
        # The target lacks calendar "de": refused, nothing written.
        with pytest.raises(ReminderError, match="use calendar 'de', which this table lacks"):
            await ops(target).import_rows(rows)
        assert await target.count() == 0
        # Through a call the rules stay behind; the import binds the target's own.
        travelled = unpack(pack(rows))
        assert travelled[0].calendar_rules is None
        other = await target.write_calendar("de", Calendar(exclude_weekdays=[6]))
        result = await ops(target).import_rows(travelled)
        assert result.created == 1
        [stored] = (await target.read_page(None, 10))[0]
        assert stored.calendar_rules == other.calendar
        assert stored.calendar_version == other.version
        assert stored.next_due == row.next_due  # exported times are kept
        assert await target.count_indexed("l:tenant=acme") == 1
        assert await target.count_indexed("c:de") == 1
