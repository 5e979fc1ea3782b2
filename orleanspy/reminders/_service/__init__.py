"""The reminder service's parts, one job each (composed by ``reminders.service``).

Everything here is the service side: it reads and writes reminder rows only through
the ``ReminderTable`` contract of the storage side (``reminders.table`` and the
backends beside it), which never imports from this package.
"""
