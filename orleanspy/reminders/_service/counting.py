"""Per-row counters on their way to the table, with the schedule writes.

``Counts.add`` is called where a tick's outcome is decided (delivery, the
repair pass); it adds to the row's pending ``CounterDelta`` in memory. The
persister writes the deltas of a batch's rows with that batch of schedule
updates (``write``, beside the batch's own round trip; deltas of rows with no
update waiting go with the next batch), so counting costs no round trip of
its own and a batch's counters are as many as its rows. A failed write keeps the deltas for the next
batch, up to ``MAX_PENDING_ROWS`` rows (then they are dropped and the drop is
logged: counters are best effort). Nothing is counted on a table that keeps no
counters, nor while the cluster lacks ``Feature.REMINDER_COUNTERS``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Final

from orleanspy._tasks import raise_if_cancelled
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders.counters import CounterDelta, CountingReminderTable
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.table import ReminderTable
from orleanspy.versions import Feature

__all__ = ["MAX_PENDING_ROWS", "Counts"]

log = logging.getLogger(__name__)

#: Rows whose counter deltas wait for a write, at most (beyond: dropped).
MAX_PENDING_ROWS: Final = 100_000


class Counts:
    """Pending counter deltas per row key, written by ``write``."""

    __slots__ = ("_features", "_pending", "_table", "dropped", "failures", "waiting", "written")

    def __init__(self, table: ReminderTable, features: ServiceFeatures) -> None:
        self._table = table if isinstance(table, CountingReminderTable) else None
        self._features = features
        self._pending: dict[str, CounterDelta] = {}
        #: Whether a row has a schedule update waiting (set by the persister):
        #: its delta then goes with that update's batch.
        self.waiting: Callable[[str], bool] | None = None
        self.written = 0
        self.failures = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        """Rows with a delta not written yet."""
        return len(self._pending)

    def _delta(self, key: str, entry: ReminderEntry) -> CounterDelta | None:
        if self._table is None or not self._features.on(Feature.REMINDER_COUNTERS):
            return None
        delta = self._pending.get(key)
        if delta is None:
            delta = self._pending[key] = CounterDelta(entry.grain_id, entry.name)
        return delta

    def add(self, key: str, entry: ReminderEntry, index: int, n: int = 1) -> None:
        """Add ``n`` to counter ``index`` (``counters.COUNTS``) of row ``key``."""
        if n:
            delta = self._delta(key, entry)
            if delta is not None:
                delta.counts[index] += n

    def error(self, key: str, entry: ReminderEntry, exc: BaseException, at: datetime) -> None:
        """Remember ``exc`` as row ``key``'s last error."""
        delta = self._delta(key, entry)
        if delta is not None:
            delta.error(exc, at)

    async def write(self, keys: Iterable[str] | None = None, *, rest: bool = True) -> None:
        """Write the pending deltas of the rows ``keys`` (those of a schedule
        batch; ``None``: every row) in one ``add_counts``, and with ``rest`` the
        deltas of the rows that have no schedule update waiting (``waiting``
        says which do; theirs go with their own batch). Never raises but for
        cancellation (a failure keeps them for the next call, merged with
        what arrived meanwhile)."""
        if not self._pending or self._table is None:
            return
        if keys is None:
            batch, self._pending = self._pending, {}
        else:
            pending = self._pending
            batch = {k: d for k in keys if (d := pending.pop(k, None)) is not None}
            if rest and self.waiting is not None:
                waiting = self.waiting
                for k in [k for k in pending if not waiting(k)]:
                    batch[k] = pending.pop(k)
            if not batch:
                return
        try:
            await self._table.add_counts(list(batch.values()))
        except Exception as exc:
            raise_if_cancelled()
            self.failures += 1
            log.warning("reminder counters not written rows=%d error=%r", len(batch), exc)
            for key, delta in batch.items():
                newer = self._pending.get(key)
                if newer is not None:
                    delta.merge(newer)
                if len(self._pending) < MAX_PENDING_ROWS or key in self._pending:
                    self._pending[key] = delta
                else:
                    self.dropped += 1
            return
        self.written += len(batch)
