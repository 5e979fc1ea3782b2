"""The orphan check: how many reminder rows belong to grain types no silo hosts.

Every silo runs it every ``ORPHAN_CHECK_INTERVAL`` seconds (and once at start):
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

__all__ = ["ORPHAN_CHECK_INTERVAL", "OrphanWatch"]

log = logging.getLogger(__name__)

#: Seconds between two orphan checks of a silo.
ORPHAN_CHECK_INTERVAL = 60.0


class OrphanWatch:
    """Runs the orphan check (module docstring); ``last`` is its latest result."""

    def __init__(
        self,
        operations: ReminderOperations,
        metrics: ReminderMetrics,
        *,
        interval: float = ORPHAN_CHECK_INTERVAL,
    ) -> None:
        self._ops = operations
        self._metrics = metrics
        self._interval = interval
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
        """Check, then every ``interval`` seconds, until cancelled."""
        while True:
            try:
                await self.check()
            except StorageError as exc:
                log.debug("orphan check failed error=%r", exc)
            await asyncio.sleep(self._interval)
