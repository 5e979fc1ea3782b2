"""Reminder rows in Redis: ``RedisReminderTable``.

A backend package: the table (``table``), its Lua scripts (``scripts``), where
and how a row is kept (``layout``), the reads (``queries``) and the change feed
(``feed``). Importing the package loads the table, and with it redis-py; the
role package ``orleanspy.reminders`` does not import it.
"""

from __future__ import annotations

from orleanspy.reminders.redis.table import RedisReminderTable

__all__ = ["RedisReminderTable"]
