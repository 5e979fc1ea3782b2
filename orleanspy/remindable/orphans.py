"""The orphan check: how many reminder rows belong to grain types no silo hosts.

Every silo runs it every ``ORPHAN_CHECK_INTERVAL`` seconds, the first time
``FIRST_CHECK_AFTER`` seconds after it starts (by then the silos of the cluster
have published the types they host, so a type is not called orphaned because a
silo that hosts it started a moment later):
``ReminderOperations.orphans`` (per-type counts from the table's index, less
the types the cluster hosts). The result goes to the metric
``orleanspy_reminder_orphaned_rows`` (by grain type) and to the silo's status
record, so ``orleanspy cluster status`` shows it. A failed check is logged at
debug level and tried again next round: the figure is advisory.
"""

from __future__ import annotations

import asyncio
import logging

from orleanspy.errors import StorageError
from orleanspy.metrics import ReminderMetrics
from orleanspy.remindable.operations import ReminderOperations

__all__ = ["FIRST_CHECK_AFTER", "ORPHAN_CHECK_INTERVAL", "OrphanWatch"]

log = logging.getLogger(__name__)

#: Seconds between two orphan checks of a silo.
ORPHAN_CHECK_INTERVAL = 60.0
#: Seconds from a silo's start to its first orphan check.
FIRST_CHECK_AFTER = 10.0


class OrphanWatch:
    """Runs the orphan check (module docstring); ``last`` is its latest result."""

    def __init__(
        self,
        operations: ReminderOperations,
        metrics: ReminderMetrics,
        *,
        interval: float = ORPHAN_CHECK_INTERVAL,
        first_after: float = FIRST_CHECK_AFTER,
    ) -> None:
        self._ops = operations
        self._metrics = metrics
        self._interval = interval
        self._first_after = first_after
        self.last: dict[str, int] = {}

    @property
    def orphaned_rows(self) -> int:
        return sum(self.last.values())

    async def check(self) -> dict[str, int]:
        """One check now; its result (also kept in ``last`` and recorded)."""
        self.last = await self._ops.orphans()
        self._metrics.orphans(self.last)
        if self.last:
            log.info(
                "orphaned reminder rows (no silo hosts their grain type) %s",
                " ".join(f"{t}={n}" for t, n in self.last.items()),
            )
        return self.last

    async def run(self) -> None:
        """Check after ``first_after`` seconds, then every ``interval``, until cancelled."""
        await asyncio.sleep(self._first_after)
        while True:
            try:
                await self.check()
            except StorageError as exc:
                log.debug("orphan check failed error=%r", exc)
            await asyncio.sleep(self._interval)
