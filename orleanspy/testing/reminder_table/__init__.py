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
``EndingReminderTable``), fenced writers (when it is a
``FencingReminderTable``: ``check_fenced_writer_loses_its_schedule_writes``),
per-row counters (when it is a ``CountingReminderTable``:
``check_reminder_counters``), dead letters (when it is a ``DeadLetterTable``:
``check_dead_letters``), the operator audit log (when it is an
``AuditedReminderTable``: a record commits with its write or not at all,
queries, settling, retention), and the label index, calendars and backfill jobs
(when it is an ``IndexedReminderTable``, a ``CalendarStore``, a
``BackfillStore``: ``check_label_index_against_brute_force``,
``check_calendars``, ``check_backfill_jobs``).
Then the race scenarios of ``reminder_races``: the reminder service over the
table with reads held open (a registration or removal racing a read never lets
a stale row tick). Rows are written with the
table's ``service_id`` attribute when it has one.

The checks live by contract area: ``rows`` (whole rows, conditional and bulk
writes, every field's round trip), ``schedule`` (the schedule CAS, batched and
fenced), ``due`` (range and due reads against brute force, paused rows),
``paging`` (``read_page``, ``count_types``), ``feed`` (the change feed),
``history`` (fire history, ended rows), ``records`` (counters, dead letters),
``audit`` (the audit log) and ``labels`` (the label index, calendars,
backfills); ``_support`` holds what they share.
"""

from __future__ import annotations

from typing import Final

from orleanspy.testing.reminder_races import REMINDER_RACE_CHECKS
from orleanspy.testing.reminder_table._support import Check, TableFactory
from orleanspy.testing.reminder_table.audit import (
    check_audit_query_filters,
    check_audit_settle_and_retention,
    check_audited_writes_commit_with_their_record,
)
from orleanspy.testing.reminder_table.due import (
    check_due_index_follows_rewrites,
    check_paused_rows_leave_the_due_index,
    check_read_due_against_brute_force,
    check_read_due_skipping_against_brute_force,
    check_read_range_random_bounds,
    check_upcoming,
)
from orleanspy.testing.reminder_table.feed import (
    check_changes_feed,
)
from orleanspy.testing.reminder_table.history import (
    check_ended_rows_keep_their_history,
    check_fire_history,
)
from orleanspy.testing.reminder_table.labels import (
    check_backfill_jobs,
    check_calendars,
    check_label_index_against_brute_force,
)
from orleanspy.testing.reminder_table.paging import (
    check_read_page_against_brute_force,
)
from orleanspy.testing.reminder_table.records import (
    check_dead_letters,
    check_reminder_counters,
)
from orleanspy.testing.reminder_table.rows import (
    check_count,
    check_read_and_read_grain,
    check_remove_checks_the_etag,
    check_round_trip_every_field,
    check_schedule_fields,
    check_upsert_if,
    check_upsert_if_many_and_read_grains,
    check_upsert_many,
    check_upsert_returns_distinct_etags,
)
from orleanspy.testing.reminder_table.schedule import (
    check_fenced_writer_loses_its_schedule_writes,
    check_update_schedule_cas,
    check_update_schedule_many,
    check_update_schedule_many_keeps_lanes_and_fields,
)

__all__ = [
    "REMINDER_TABLE_CHECKS",
    "TableFactory",
    "check_audit_query_filters",
    "check_audit_settle_and_retention",
    "check_audited_writes_commit_with_their_record",
    "check_backfill_jobs",
    "check_calendars",
    "check_changes_feed",
    "check_count",
    "check_dead_letters",
    "check_due_index_follows_rewrites",
    "check_ended_rows_keep_their_history",
    "check_fenced_writer_loses_its_schedule_writes",
    "check_fire_history",
    "check_label_index_against_brute_force",
    "check_paused_rows_leave_the_due_index",
    "check_read_and_read_grain",
    "check_read_due_against_brute_force",
    "check_read_due_skipping_against_brute_force",
    "check_read_page_against_brute_force",
    "check_read_range_random_bounds",
    "check_reminder_counters",
    "check_reminder_table",
    "check_remove_checks_the_etag",
    "check_round_trip_every_field",
    "check_schedule_fields",
    "check_upcoming",
    "check_update_schedule_cas",
    "check_update_schedule_many",
    "check_update_schedule_many_keeps_lanes_and_fields",
    "check_upsert_if",
    "check_upsert_if_many_and_read_grains",
    "check_upsert_many",
    "check_upsert_returns_distinct_etags",
]

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
    check_audited_writes_commit_with_their_record,
    check_audit_query_filters,
    check_audit_settle_and_retention,
    check_reminder_counters,
    check_dead_letters,
    check_label_index_against_brute_force,
    check_calendars,
    check_backfill_jobs,
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
