"""The grain-facing side of reminders, served by the silo.

``registry`` (``ReminderRegistry``: what ``Grain.register_or_update_reminder``
and friends call), ``declarations`` (``@register_reminder`` rows written at silo
start-up) and ``management`` (``ReminderManagementGrain``, ``client.reminders``).
They sit above ``grain`` and the storage side of ``reminders/``, which imports
none of them (docs/architecture.md, section 1).
"""
