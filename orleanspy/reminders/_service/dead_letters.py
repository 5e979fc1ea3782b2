"""Dead letters on their way to the table, ahead of the schedule writes.

``DeadLetters.add`` is called by delivery when a tick failed its last attempt
(``reminders.letters``); ``build`` makes the letter from the failed tick. The
persister writes pending letters before the next batch of schedule updates
(``write``): the letter of a slot is stored before the progress that moves the
row past that slot, so a silo that dies in between loses neither (at worst
the slot is delivered again, and fails again, into the same letter: its id is
the occurrence id). A failed write keeps them for the next batch, up to
``MAX_PENDING`` (then the oldest are dropped and logged). Nothing is kept on a
table without dead letters, nor while the cluster lacks ``Feature.DEAD_LETTERS``
(as 0.1 did: the failure is logged and in the fire history only).
"""

from __future__ import annotations

import logging
from typing import Final

from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders.letters import DeadLetter, DeadLetterTable, error_parts
from orleanspy.reminders.model import ReminderEntry, TickStatus, occurrence_of
from orleanspy.reminders.table import ReminderTable
from orleanspy.versions import Feature

__all__ = ["MAX_PENDING", "DeadLetters"]

log = logging.getLogger(__name__)

#: Letters waiting for a write, at most (beyond: the oldest are dropped).
MAX_PENDING: Final = 10_000


class DeadLetters:
    """Pending dead letters, written by ``write``."""

    def __init__(
        self,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        features: ServiceFeatures,
        silo: str = "",
    ) -> None:
        self._table = table if isinstance(table, DeadLetterTable) else None
        self._clock = clock
        self._options = options
        self._features = features
        self._silo = silo
        self._pending: list[DeadLetter] = []
        self.written = 0
        self.failures = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        """Whether letters are kept now (a table that keeps them, the feature on)."""
        return self._table is not None and self._features.on(Feature.DEAD_LETTERS)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def build(
        self, entry: ReminderEntry, status: TickStatus, exc: BaseException, attempts: int
    ) -> DeadLetter:
        """The letter of ``entry``'s tick ``status`` that failed with ``exc``
        after ``attempts`` attempts."""
        kind, message, tb = error_parts(exc)
        return DeadLetter(
            id=occurrence_of(entry.service_id, entry.grain_id, entry.name, status),
            grain_id=entry.grain_id,
            name=entry.name,
            slot=status.current_tick_time,
            first_tick_time=status.first_tick_time,
            attempts=attempts,
            error_type=kind,
            message=message,
            traceback=tb,
            at=self._clock.now(),
            silo=self._silo,
            due_at=status.due_at,
            period=status.period,
            cron=status.cron,
            priority=status.priority,
            missed_ticks=status.missed_ticks,
            payload=status.payload,
            final=status.final,
            deadline=status.deadline,
        )

    def add(self, letter: DeadLetter) -> None:
        self._pending.append(letter)
        if len(self._pending) > MAX_PENDING:
            del self._pending[0]
            self.dropped += 1
            log.warning("reminder dead letter dropped (too many unwritten) id=%s", letter.id)

    async def write(self) -> bool:
        """Write the pending letters in one call; ``False`` (kept for the next
        call) if the table failed. Never raises but for cancellation."""
        if not self._pending or self._table is None:
            return True
        batch = list(self._pending)
        options = self._options
        try:
            await self._table.add_dead_letters(
                batch,
                keep=options.max_dead_letters,
                expire_before=self._clock.now() - options.dead_letter_retention,
            )
        except Exception as exc:
            raise_if_cancelled()
            self.failures += 1
            log.warning("reminder dead letters not written letters=%d error=%r", len(batch), exc)
            return False
        del self._pending[: len(batch)]
        self.written += len(batch)
        return True
