"""Reminder rows for the dashboard, a page at a time, straight from the store.

The only part of the dashboard that knows how a table lays its rows out (with
``_reminder_stores``, one reader per store, and ``_reminder_order``, the order's
positions and cursors). A page never holds more than
``limit`` rows, and one request examines no more than ``SCAN_BUDGET`` rows in
the search order: a search that matches little returns a short page and a
cursor to go on, never a walk of the whole table.

The order, on every store: the scheduled rows by next due time, then grain
type and key, then name (``Position``: code-point order of the grain's
canonical text, ties of one millisecond included); then the paused rows, which
have no due time while paused, by grain type and key, then name. Paging is by
keyset: a cursor is the position of the last row examined, and the next page
holds the rows after it in that order, so a row that does not change is shown
exactly once however the pages fall, and rows written meanwhile are shown where
they belong. A row that ticks moves on in the order: one request never shows
it twice, and the page's script does not show a row again that an earlier
page of the same search showed.

The cursor is opaque text: ``a:<next due ms>:<hex of the key>`` among the
scheduled rows, ``z:<hex of the key>`` among the paused rows (``z:`` at their
start). A malformed cursor is a ``ValueError`` (the caller answers 400).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Final

from orleanspy.dashboard._reminder_order import (
    PAUSED_START,
    Page,
    Position,
    Query,
    key_of,
    parse_cursor,
)
from orleanspy.dashboard._reminder_stores import reader_for
from orleanspy.reminders.model import ReminderEntry

__all__ = ["SCAN_BUDGET", "Page", "Position", "Query", "ReminderPages"]

#: Most rows one search request examines.
SCAN_BUDGET: Final = 5000


class ReminderPages:
    """Pages of one reminder table (Redis, PostgreSQL or in memory), in the order
    of the module docstring."""

    def __init__(self, table: Any) -> None:
        self._reader = reader_for(table)

    async def search(
        self, query: Query, cursor: str | None, limit: int, hosted: Container[str] | None
    ) -> Page:
        """Rows matching ``query`` after ``cursor``, at most ``limit``."""
        after = parse_cursor(cursor)
        rows: list[ReminderEntry] = []
        scanned = 0
        if after.due >= 0:
            if query.state != "paused":
                part = await self._reader.scheduled(query, after, limit, hosted, SCAN_BUDGET)
                rows, scanned = part.rows, part.scanned
                if part.last is not None:
                    return Page(rows, part.last.cursor(), scanned)
            if query.state == "active":
                return Page(rows, None, scanned)
            if len(rows) >= limit or scanned >= SCAN_BUDGET:
                return Page(rows, PAUSED_START.cursor(), scanned)
            after = PAUSED_START
        part = await self._reader.paused(
            query, after, limit - len(rows), hosted, SCAN_BUDGET - scanned
        )
        shown = {key_of(row) for row in rows}  # a row paused since the part before
        rows.extend(row for row in part.rows if key_of(row) not in shown)
        scanned += part.scanned
        return Page(rows, None if part.last is None else part.last.cursor(), scanned)
