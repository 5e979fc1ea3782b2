"""Fire history: what became of each slot, written to the table in batches.

``History.fired`` is called where a slot's fate is decided (delivered, failed in
the grain, skipped, notified); it only appends to a bounded buffer. One task
appends the buffer to the table with ``append_history`` (one call per batch), so
ticks never wait for history. It lets records gather for ``LINGER_S`` (real
time) after the first one arrives: a tick stream then costs one write per
linger, not one per handful of ticks, and a record reaches the table at most
that much later. History is best effort: a failed append is logged
and its records dropped (the schedule, which is what correctness rests on, is
written by the persister); a buffer over ``MAX_BUFFERED`` drops its oldest.
``NoHistory`` records nothing (``ReminderOptions.history_size = 0``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from datetime import datetime
from typing import Final

from orleanspy._frozen import maker
from orleanspy._tasks import raise_if_cancelled
from orleanspy.reminders.model import FireOutcome, FireRecord, MissedReminderAction, ReminderEntry
from orleanspy.reminders.table import PausableReminderTable

__all__ = ["LINGER_S", "MAX_BUFFERED", "History", "NoHistory", "skip_outcome"]

log = logging.getLogger(__name__)

#: Records waiting for a write; beyond this the oldest are dropped.
MAX_BUFFERED: Final = 50_000
_BATCH: Final = 1000
# One record per tick: built without FireRecord's frozen __init__ (orleanspy._frozen);
# ``fired`` is given FireOutcome members, which its __post_init__ would leave alone.
_fire_record = maker(FireRecord)
#: How long records gather before a write.
LINGER_S: Final = 0.05


def skip_outcome(entry: ReminderEntry) -> FireOutcome:
    """How a skipped slot goes into the fire history."""
    if entry.action is MissedReminderAction.NOTIFY:
        return FireOutcome.NOTIFIED
    return FireOutcome.MISSED_SKIPPED


class NoHistory:
    """Records nothing."""

    def fired(
        self,
        entry: ReminderEntry,
        slot: datetime,
        at: datetime,
        outcome: FireOutcome,
        error: str | None = None,
        *,
        attempt: int = 1,
        final: bool = False,
        backfill: bool = False,
    ) -> None:
        """The slot ``slot`` of ``entry`` met ``outcome`` at ``at`` (``error``: the
        grain's exception as ``Type: message``, for ``GRAIN_ERROR`` and
        ``RETRYING``; its ``attempt``-th delivery; ``final``: the reminder's last
        slot; ``backfill``: a slot a backfill delivered)."""


class History(NoHistory):
    """Buffers fire records of silo ``silo`` and appends them to ``table``,
    keeping the newest ``keep`` per row."""

    def __init__(self, table: PausableReminderTable, *, keep: int, silo: str) -> None:
        self._table = table
        self._keep = keep
        self._silo = silo
        self._buffer: deque[FireRecord] = deque(maxlen=MAX_BUFFERED)
        self._wake = asyncio.Event()
        self.written = 0
        self.failures = 0
        # One batch in flight at a time: a flush returns only once the records
        # buffered before it are written, also those a linger batch already took.
        self._writing = asyncio.Lock()

    @property
    def buffered(self) -> int:
        """Records not written yet."""
        return len(self._buffer)

    def fired(
        self,
        entry: ReminderEntry,
        slot: datetime,
        at: datetime,
        outcome: FireOutcome,
        error: str | None = None,
        *,
        attempt: int = 1,
        final: bool = False,
        backfill: bool = False,
    ) -> None:
        self._buffer.append(
            _fire_record(
                entry.grain_id,
                entry.name,
                slot,
                at,
                outcome,
                self._silo,
                error=error,
                attempt=attempt,
                final=final,
                backfill=backfill,
            )
        )
        self._wake.set()

    async def run(self) -> None:
        """Write batches until cancelled."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(LINGER_S)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write the records buffered when called (a failed batch is dropped, not
        retried), after any batch already being written: so once it returns,
        every record buffered before it is in the table (what the persister
        relies on before ending rows, whose records would be dropped after).
        Records that arrive meanwhile wait for the next linger: draining them too
        would write a handful per round trip under a tick stream."""
        async with self._writing:
            left = len(self._buffer)
            while left and self._buffer:
                n = min(left, len(self._buffer), _BATCH)
                left -= n
                batch = [self._buffer.popleft() for _ in range(n)]
                try:
                    await self._table.append_history(batch, self._keep)
                except Exception as exc:
                    raise_if_cancelled()
                    self.failures += 1
                    log.warning(
                        "reminder history not written silo=%s records=%d error=%r",
                        self._silo,
                        len(batch),
                        exc,
                    )
                    return
                self.written += len(batch)
