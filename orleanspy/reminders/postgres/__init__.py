"""Reminder rows in PostgreSQL: ``PostgresReminderTable``.

A backend package: the table (``table``), its statements (``sql``), its schema
steps (``migrations``), a row's columns and back (``rows``) and the LISTEN
feed (``feed``). Importing the package loads the table, and with it asyncpg;
the role package ``orleanspy.reminders`` does not import it.
"""

from __future__ import annotations

from orleanspy.reminders.postgres.table import PostgresReminderTable

__all__ = ["PostgresReminderTable"]
