"""Batched schedule persistence with retry.

After a tick is acknowledged the service submits a ``ScheduleUpdate`` (a CAS of
``next_due``/``last_fire`` against the etag the row was loaded with). Updates
are written in batches of up to ``persist_batch`` — one ``update_schedule_many``
round trip when the table offers it, else concurrent ``update_schedule`` calls.

Per row only the latest update matters: a newer one supersedes a pending older
one. When a write succeeds while a newer update for the same row waits, the
newer one is rebased onto the new etag; when it loses its CAS, the newer one
(same stale etag) is discarded with it. Storage errors keep the updates pending
and the batch is retried with backoff, for as long as it takes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import Clock
from orleanspy.metrics import ReminderMetrics
from orleanspy.options import ReminderOptions
from orleanspy.reminders._ticker import Backoff
from orleanspy.reminders.model import ScheduleUpdate, row_key
from orleanspy.reminders.table import BatchingReminderTable, ReminderTable

__all__ = ["Persister", "update_key"]

log = logging.getLogger(__name__)


def update_key(update: ScheduleUpdate) -> str:
    """The row key of an update (same form as ``ReminderEntry.key``)."""
    return row_key(update.grain_id, update.name)


class Persister:
    """Writes schedule updates; reports each outcome to ``on_result(update, etag | None)``.

    ``on_result`` gets the new etag, or ``None`` for a lost CAS (row gone or
    moved by another writer). It is not called for updates that are still
    pending when the persister stops.
    """

    metrics: ReminderMetrics = ReminderMetrics()  # set by the service

    def __init__(
        self,
        table: ReminderTable,
        clock: Clock,
        options: ReminderOptions,
        on_result: Callable[[ScheduleUpdate, str | None], None],
    ) -> None:
        self._table = table
        self._batching = isinstance(table, BatchingReminderTable)
        self._clock = clock
        self._options = options
        self._on_result = on_result
        self._pending: dict[str, ScheduleUpdate] = {}
        self._writing: dict[str, ScheduleUpdate] = {}
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.written = 0
        self.failures = 0

    def __len__(self) -> int:
        """Rows with an update not yet written."""
        return len(self._pending.keys() | self._writing.keys())

    def submit(self, update: ScheduleUpdate) -> None:
        """Queue ``update``; it supersedes any pending update of the same row."""
        self._pending[update_key(update)] = update
        self._idle.clear()
        self._ready.set()

    def latest(self, key: str) -> ScheduleUpdate | None:
        """The newest unwritten update of row ``key``."""
        return self._pending.get(key) or self._writing.get(key)

    def wrote(self, key: str, next_due: datetime) -> bool:
        """Whether an unwritten update of row ``key`` carries ``next_due`` (to tell
        the echo of our own write on the change feed from another writer's change)."""
        return any(
            u is not None and u.next_due == next_due
            for u in (self._pending.get(key), self._writing.get(key))
        )

    async def wait_idle(self) -> None:
        """Return once nothing is pending or being written (for tests and tools)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write until cancelled; back off while the table fails."""
        backoff = Backoff(self._options.retry_initial, self._options.retry_max)
        while True:
            while not self._pending:
                self._ready.clear()
                await self._ready.wait()
            ok = await self._write_batch()
            raise_if_cancelled()
            if ok:
                backoff.reset()
            else:
                await self._clock.sleep(backoff.next())

    async def flush(self) -> int:
        """Try each pending update once, without backoff; return how many remain.

        Used at shutdown (bounded by the caller): updates that cannot be written
        now are left, and their ticks repeat on the next owner (at least once).
        """
        attempts = len(self._pending)
        while self._pending and attempts > 0:
            attempts -= min(attempts, self._options.persist_batch)
            if not await self._write_batch():
                break
        return len(self._pending)

    async def _write_batch(self) -> bool:
        keys = list(self._pending)[: self._options.persist_batch]
        batch = [self._pending.pop(k) for k in keys]
        self._writing.update(zip(keys, batch, strict=True))
        results: Sequence[str | BaseException | None]
        self.metrics.persisted(len(batch))
        try:
            results = await self._write(batch)
        except asyncio.CancelledError:
            self._requeue(batch)
            raise
        except Exception as exc:
            self.failures += 1
            log.warning("reminder persistence failed rows=%d error=%r", len(batch), exc)
            self._requeue(batch)
            return False
        finally:
            for k in keys:
                self._writing.pop(k, None)
        ok = True
        for update, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                ok = False
                self.failures += 1
                log.warning(
                    "reminder persistence failed key=%s error=%r", update_key(update), result
                )
                self._requeue([update])
            else:
                self._settle(update, result)
        if not self._pending and not self._writing:
            self._idle.set()
        return ok

    async def _write(self, batch: list[ScheduleUpdate]) -> Sequence[str | BaseException | None]:
        if self._batching:
            table: BatchingReminderTable = self._table  # type: ignore[assignment]
            return await table.update_schedule_many(batch)
        return await asyncio.gather(
            *(
                self._table.update_schedule(u.grain_id, u.name, u.etag, u.next_due, u.last_fire)
                for u in batch
            ),
            return_exceptions=True,
        )

    def _requeue(self, batch: list[ScheduleUpdate]) -> None:
        for update in batch:
            # A newer update submitted meanwhile supersedes the failed one.
            self._pending.setdefault(update_key(update), update)

    def _settle(self, update: ScheduleUpdate, etag: str | None) -> None:
        key = update_key(update)
        newer = self._pending.get(key)
        if newer is not None and newer.etag == update.etag:
            if etag is None:
                del self._pending[key]
            else:
                self._pending[key] = replace(newer, etag=etag)
        self.written += etag is not None
        self._on_result(update, etag)
