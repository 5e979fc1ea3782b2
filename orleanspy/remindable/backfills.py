"""Backfill operations: ask for a backfill, cancel it, list the running ones.

``start`` checks everything before it writes: a reminder that exists, aware
``start < end``, an ``end`` not after now (a backfill delivers past slots),
a range holding at least one and at most ``MAX_BACKFILL_SLOTS`` slots of the
reminder's schedule (``backfill.backfill_schedule``), no other backfill of the
reminder running, the cluster's feature level at ``Feature.REMINDER_BACKFILL``.
Then it stores the job (``stores.BackfillStore``); the silo that owns the row
runs it (``reminders._service.backfill``), within ``ReminderOptions.poll_interval``
(at once when the job was asked for on that silo). ``cancel`` removes the
job: its runner stops before the next slot.

``overlap`` is recorded with the job by name (one of ``OVERLAP_POLICIES``, or
anything with such a ``name``); ``None`` leaves it to the reminder's own policy.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.remindable.calendars import Operations
from orleanspy.reminders.backfill import (
    MAX_BACKFILL_SLOTS,
    BackfillJob,
    backfill_schedule,
    count_slots,
)
from orleanspy.reminders.stores import BackfillStore
from orleanspy.versions import Feature

__all__ = ["OVERLAP_POLICIES", "BackfillOperations", "overlap_name"]

#: The overlap policies a backfill may ask for, by name.
OVERLAP_POLICIES: Final = frozenset(
    {"SKIP", "BUFFER_ONE", "BUFFER_ALL", "CANCEL_OTHER", "ALLOW_ALL"}
)


def overlap_name(overlap: object) -> str | None:
    """``overlap`` as the name a job records: ``None``, a policy's name (any
    case), or a value with such a ``name`` (an enum); ``ReminderError`` otherwise."""
    if overlap is None:
        return None
    name = getattr(overlap, "name", overlap)
    if isinstance(name, str) and name.upper() in OVERLAP_POLICIES:
        return name.upper()
    raise ReminderError(
        f"not an overlap policy: {overlap!r}; use one of {', '.join(sorted(OVERLAP_POLICIES))}"
    )


class BackfillOperations:
    """The backfill operations over ``ops``' table (module docstring)."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops

    @property
    def _store(self) -> BackfillStore:
        table = self._ops.table
        if not isinstance(table, BackfillStore):
            raise ReminderError(f"the reminder table ({type(table).__name__}) keeps no backfills")
        return table

    async def start(
        self,
        grain: GrainId,
        name: str,
        start: datetime,
        end: datetime,
        overlap: object = None,
    ) -> BackfillJob:
        """Ask for every slot of reminder ``name`` of ``grain`` in ``[start, end)``
        to be delivered again, in order (module docstring); the stored job."""
        for what, at in (("start", start), ("end", end)):
            if not isinstance(at, datetime) or at.tzinfo is None:
                raise ReminderError(
                    f"backfill {what} must be a timezone-aware datetime, got {at!r}"
                )
        if start >= end:
            raise ReminderError(
                f"backfill start {start.isoformat()} is not before end {end.isoformat()}: "
                "give a range [start, end) with start < end"
            )
        now = self._ops.now()
        if end > now:
            raise ReminderError(
                f"backfill end {end.isoformat()} is after now ({now.isoformat()}): a backfill "
                "delivers past slots; the schedule delivers the rest"
            )
        policy = overlap_name(overlap)
        store = self._store
        self._ops.require(Feature.REMINDER_BACKFILL)
        row = await self._ops.get(grain, name)
        schedule = backfill_schedule(row, start)
        total = count_slots(schedule, start, end, MAX_BACKFILL_SLOTS)
        if total == 0:
            raise ReminderError(
                f"reminder {name!r} of {grain} has no slot in [{start.isoformat()}, "
                f"{end.isoformat()}): nothing to backfill"
            )
        if total > MAX_BACKFILL_SLOTS:
            raise ReminderError(
                f"[{start.isoformat()}, {end.isoformat()}) holds more than {MAX_BACKFILL_SLOTS} "
                f"slots of reminder {name!r}: split it into shorter backfills"
            )
        job = BackfillJob(grain, name, start, end, start, total, overlap=policy, created=now)
        added = await store.add_backfill(job)
        if added is None:
            raise ReminderError(
                f"a backfill of reminder {name!r} of {grain} is running: wait for it, or "
                "cancel it first"
            )
        self._ops.backfill_started()
        return added

    async def cancel(self, grain: GrainId, name: str) -> bool:
        """Cancel the reminder's backfill (its runner stops before the next slot);
        ``False`` if none runs."""
        return await self._store.remove_backfill(grain, name)

    async def all(self) -> list[BackfillJob]:
        """Every running backfill, with its progress."""
        return await self._store.read_backfills()
