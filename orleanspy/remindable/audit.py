"""``Auditor``: the one way a management action writes, so every one is audited.

``ReminderOperations`` (what the management grain and the CLI's direct path
run) never writes the table itself: each action goes through one of the
auditor's four doors, which write the row and its ``AuditRecord`` together
(``reminders.audit``, "Together or not at all") and open the action's span
when this process traces:

- ``change(action, grain, name, change)``: read the row, apply ``change``,
  write it guarded by the etag read, the record in the same atomic write; a
  lost race is read again (as ``ReminderOperations`` always did). A change
  that changes nothing records ``UNCHANGED``.
- ``remove(action, grain, name)``: remove the row as it is now (or, with
  ``expect``, only the row as read), with its record; a row that is not there
  records ``ABSENT``.
- ``write(action, row, expected_etag, before=...)``: a conditional whole-row
  write (an import), with its record.
- ``pending(action, ...)``: an action whose effect is not one row write (a
  trigger, a batch such as delete-where or import, and what later actions
  bring: backfill, replay, calendar changes, limits). Its record is stored
  ``PENDING`` first and the action runs only then; the outcome replaces it
  when the ``async with`` ends (``FAILED`` with the error when the body
  raised). Rows a batch writes go through the doors above with
  ``batch=`` its id.

A new action is audited by calling one of these; nothing else in the
management path writes rows. Each door refuses nothing itself: validation is
the action's, before it calls (bad input writes nothing, no record either).

The principal is read from ``acting_principal`` (set by the runtime from an
authenticated source) when the action starts; ``local`` when unset.

Below ``Feature.AUDIT_LOG`` (a 0.1 silo is live), or on a table that keeps no
log, the doors write as 0.1 did, without records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orleanspy import tracing
from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.reminders.audit import (
    LOCAL,
    MAX_DETAIL,
    AuditedReminderTable,
    AuditOutcome,
    AuditRecord,
    AuditRetention,
    acting_principal,
    new_audit_id,
)
from orleanspy.reminders.model import ReminderEntry, error_text
from orleanspy.reminders.table import ReminderTable
from orleanspy.versions import PROTOCOL, Feature

if TYPE_CHECKING:
    from orleanspy._otel import Span

__all__ = ["ATTEMPTS", "Auditor", "PendingAction", "detail_text"]

log = logging.getLogger(__name__)

#: Lost etag races one action re-reads and retries before giving up.
ATTEMPTS = 5

#: Told of every row written (``entry``) or removed (``None``).
Notify = Callable[[GrainId, str, ReminderEntry | None], None]


def detail_text(detail: Mapping[str, Any] | None) -> str | None:
    """An action's arguments or counts as the short JSON text a record keeps."""
    if not detail:
        return None
    text = json.dumps(dict(detail), default=str, sort_keys=True)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


class PendingAction:
    """The handle ``Auditor.pending`` yields: the record's ``id`` (the batch id of
    rows the action writes) and what the outcome's record will say."""

    __slots__ = ("detail", "id", "outcome")

    def __init__(self, record_id: str | None, detail: dict[str, Any]) -> None:
        self.id = record_id
        #: Becomes the settled record's detail (counts, ...); starts as the action's.
        self.detail = detail
        #: The outcome to record when the body returns (``OK`` unless set).
        self.outcome = AuditOutcome.OK


class Auditor:
    """Writes management actions and their audit records (module docstring).

    ``principal`` says who acts (read at each action); ``level`` the cluster's
    feature level; ``via`` where the actions run (a silo's name, ``cli``).
    """

    def __init__(
        self,
        table: ReminderTable,
        *,
        clock: Clock,
        retention: AuditRetention,
        notify: Notify | None = None,
        level: Callable[[], int] = lambda: PROTOCOL,
        principal: Callable[[], str] | None = None,
        via: str | None = None,
    ) -> None:
        self.table = table
        self._clock = clock
        self._retention = retention
        self._notify = notify
        self._level = level
        self._principal = principal or _acting
        self._via = via

    @property
    def enabled(self) -> bool:
        """Whether actions are recorded now: the table keeps a log and every live
        silo has ``Feature.AUDIT_LOG``."""
        return isinstance(self.table, AuditedReminderTable) and self._level() >= Feature.AUDIT_LOG

    # -- the doors ------------------------------------------------------------------

    async def change(
        self,
        action: str,
        grain: GrainId,
        name: str,
        change: Callable[[ReminderEntry], ReminderEntry],
        *,
        detail: Mapping[str, Any] | None = None,
        batch: str | None = None,
    ) -> ReminderEntry:
        """Apply ``change`` to the row as it is now, guarded by its etag, with its
        record; ``ReminderError`` if there is no row or after ``ATTEMPTS`` lost
        races (then nothing was written)."""
        with self._span(action, grain, name) as span:
            principal, text = self._principal(), detail_text(detail)
            for _ in range(ATTEMPTS):
                row = await self.table.read(grain, name)
                if row is None:
                    raise ReminderError(f"{grain} has no reminder {name!r}")
                new = change(row)
                if new is row:
                    await self._record(
                        action, principal, AuditOutcome.UNCHANGED, grain, name, row, row, text,
                        batch, span,
                    )  # fmt: skip
                    return row
                new = self._traced(new)
                etag = await self._write(
                    new, row.etag,
                    self._new_record(action, principal, AuditOutcome.OK, grain, name, row, new,
                                     text, batch),
                )  # fmt: skip
                if etag is not None:
                    _outcome(span, AuditOutcome.OK)
                    new = new.with_etag(etag)
                    self.told(grain, name, new)
                    return new
            raise ReminderError(
                f"could not change reminder {name!r} of {grain}: it kept changing "
                f"({ATTEMPTS} attempts)"
            )

    async def remove(
        self,
        action: str,
        grain: GrainId,
        name: str,
        *,
        expect: ReminderEntry | None = None,
        detail: Mapping[str, Any] | None = None,
        batch: str | None = None,
    ) -> bool:
        """Remove the row with its record; ``False`` if there was none. Without
        ``expect`` the row as it is now (a row moved between the read and the
        remove is read again; ``ReminderError`` after ``ATTEMPTS`` lost races),
        with ``expect`` only that row as read (a row rewritten since is kept,
        unrecorded: nothing happened to it)."""
        with self._span(action, grain, name) as span:
            principal, text = self._principal(), detail_text(detail)
            for _ in range(ATTEMPTS):
                row = expect if expect is not None else await self.table.read(grain, name)
                if row is None or row.etag is None:
                    if expect is None:
                        await self._record(
                            action, principal, AuditOutcome.ABSENT, grain, name, None, None, text,
                            batch, span,
                        )  # fmt: skip
                    return False
                record = self._new_record(
                    action, principal, AuditOutcome.OK, grain, name, row, None, text, batch
                )
                if await self._remove(row, record):
                    _outcome(span, AuditOutcome.OK)
                    self.told(grain, name, None)
                    return True
                if expect is not None:
                    return False
            raise ReminderError(
                f"could not remove reminder {name!r} of {grain}: it kept changing "
                f"({ATTEMPTS} attempts)"
            )

    async def write(
        self,
        action: str,
        row: ReminderEntry,
        expected_etag: str | None,
        *,
        before: ReminderEntry | None,
        detail: Mapping[str, Any] | None = None,
        batch: str | None = None,
    ) -> str | None:
        """Write ``row`` if the stored one is absent (``expected_etag`` ``None``) or
        still has ``expected_etag``, with its record (``before``: the row read);
        the new etag, or ``None`` when another writer got there first."""
        grain, name = row.grain_id, row.name
        with self._span(action, grain, name) as span:
            row = self._traced(row)
            record = self._new_record(
                action, self._principal(), AuditOutcome.OK, grain, name, before, row,
                detail_text(detail), batch,
            )  # fmt: skip
            etag = await self._write(row, expected_etag, record)
            if etag is not None:
                _outcome(span, AuditOutcome.OK)
                self.told(grain, name, row.with_etag(etag))
            return etag

    @asynccontextmanager
    async def pending(
        self,
        action: str,
        grain: GrainId | None = None,
        name: str | None = None,
        *,
        before: ReminderEntry | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[PendingAction]:
        """Record the action ``PENDING``, run the body, then record its outcome
        (module docstring). The handle's ``id`` is ``None`` while actions are
        not recorded."""
        with self._span(action, grain, name) as span:
            handle = PendingAction(None, dict(detail or {}))
            record = None
            if self.enabled:
                record = self._new_record(
                    action, self._principal(), AuditOutcome.PENDING, grain, name, before, before,
                    detail_text(handle.detail), None,
                )  # fmt: skip
                assert isinstance(self.table, AuditedReminderTable)
                await self.table.append_audit(record, self._retention)
                handle.id = record.id
            try:
                yield handle
            except BaseException as exc:  # cancelled too: the action did not finish
                handle.outcome = AuditOutcome.FAILED
                handle.detail["error"] = error_text(exc)
                raise
            finally:
                _outcome(span, handle.outcome)
                if record is not None:
                    await self._settle(record.settled(handle.outcome, detail_text(handle.detail)))

    # -- parts ----------------------------------------------------------------------

    def _new_record(  # noqa: PLR0917 (the record's fields)
        self,
        action: str,
        principal: str,
        outcome: AuditOutcome,
        grain: GrainId | None,
        name: str | None,
        before: ReminderEntry | None,
        after: ReminderEntry | None,
        detail: str | None,
        batch: str | None,
    ) -> AuditRecord:
        return AuditRecord(
            new_audit_id(), self._clock.now(), principal, action, outcome, grain, name,
            before, after, detail, batch, self._via,
        )  # fmt: skip

    async def _record(  # noqa: PLR0917 (the record's fields)
        self,
        action: str,
        principal: str,
        outcome: AuditOutcome,
        grain: GrainId,
        name: str,
        before: ReminderEntry | None,
        after: ReminderEntry | None,
        detail: str | None,
        batch: str | None,
        span: Span | None,
    ) -> None:
        """Record an action that wrote no row (``UNCHANGED``, ``ABSENT``)."""
        _outcome(span, outcome)
        if self.enabled:
            assert isinstance(self.table, AuditedReminderTable)
            record = self._new_record(
                action, principal, outcome, grain, name, before, after, detail, batch
            )
            await self.table.append_audit(record, self._retention)

    async def _settle(self, record: AuditRecord) -> None:
        """Store a pending record's outcome; a failure leaves it ``PENDING`` (the
        action ran: it is not failed for a record that could not be finished)."""
        assert isinstance(self.table, AuditedReminderTable)
        try:
            await self.table.settle_audit(record)
        except Exception as exc:
            log.warning(
                "audit record left pending id=%s action=%s error=%r", record.id, record.action, exc
            )

    async def _write(
        self, row: ReminderEntry, expected_etag: str | None, record: AuditRecord
    ) -> str | None:
        if self.enabled:
            assert isinstance(self.table, AuditedReminderTable)
            return await self.table.upsert_if_audited(row, expected_etag, record, self._retention)
        return await self.table.upsert_if(row, expected_etag)

    async def _remove(self, row: ReminderEntry, record: AuditRecord) -> bool:
        assert row.etag is not None
        if self.enabled:
            assert isinstance(self.table, AuditedReminderTable)
            return await self.table.remove_audited(
                row.grain_id, row.name, row.etag, record, self._retention
            )
        return await self.table.remove(row.grain_id, row.name, row.etag)

    def _traced(self, row: ReminderEntry) -> ReminderEntry:
        """``row`` keeping the current span's context (its ticks link to the
        action), when this process traces and every silo has the feature."""
        tracer = tracing.active()
        if tracer is None or self._level() < Feature.TRACE_LINKS:
            return row
        return replace(row, trace_context=tracer.current_traceparent())

    def _span(
        self, action: str, grain: GrainId | None, name: str | None
    ) -> AbstractContextManager[Span | None]:
        tracer = tracing.active()
        if tracer is None:
            return nullcontext()
        attributes = {
            "audit.action": action,
            "grain": None if grain is None else grain.canonical,
            "reminder.name": name,
            "audit.principal": self._principal(),
        }
        return tracer.management(action, attributes)

    def told(self, grain: GrainId, name: str, entry: ReminderEntry | None) -> None:
        """Tell the local service of a row written (or removed: ``None``)."""
        if self._notify is not None:
            self._notify(grain, name, entry)

    def now(self) -> datetime:
        return self._clock.now()


def _acting() -> str:
    return acting_principal.get() or LOCAL


def _outcome(span: Span | None, outcome: AuditOutcome) -> None:
    if span is not None:
        span.set_attribute("orleanspy.audit.outcome", str(outcome))
