"""A minimal stream provider: publish items on named streams, subscribe, replay.

The reminder service publishes ``MissedReminder`` events here (stream
``orleanspy.reminders.missed``). ``provider`` holds the contract; ``memory`` and
``redis`` are the backends. Import the backend module you use; this package
imports nothing, so Redis loads only when it is picked.
"""

from __future__ import annotations
