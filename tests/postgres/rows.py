"""Bulk-load reminder rows straight into a PostgreSQL reminder table (for tests that
need tens of thousands of rows to look at query plans)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orleanspy.reminders.postgres import PostgresReminderTable

# The columns a record gives, in order; ``paused`` goes before ``version`` when asked.
COLUMNS = (
    "service_id", "grain_id", "name", "grain_hash", "bucket", "priority",
    "start_at", "next_due", "period_ms", "action",
)  # fmt: skip


async def copy_rows(
    table: PostgresReminderTable, records: Sequence[tuple[Any, ...]], *, paused: bool = False
) -> None:
    """COPY ``records`` (``COLUMNS``, then ``paused`` if asked, then ``version``) into
    the table, then ANALYZE it so the planner sees them."""
    columns = [*COLUMNS, *(("paused",) if paused else ()), "version"]
    async with table._p.acquire() as conn:
        await conn.copy_records_to_table("orleanspy_reminders", records=records, columns=columns)
        await conn.execute("ANALYZE orleanspy_reminders")
