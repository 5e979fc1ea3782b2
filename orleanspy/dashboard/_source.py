"""Where the dashboard reads the cluster and sends its actions.

A ``Source`` gives the cluster's status (membership plus the silos' status
records, ``orleanspy.cluster_status``), reminder rows a page at a time, one
row with its history, the dead letters a page at a time, and the management
actions (on rows, and ``replay``/``discard`` of a dead letter). Three kinds:

- ``SiloSource(silo)``: a silo serving its own dashboard, read through the
  narrow ``runtime.guests.SiloView`` (the dashboard imports no ``Silo``). Actions go through the
  silo's own client, which inside the cluster is never restricted, so the
  dashboard checks ``SiloOptions.client_management_allowed`` itself: the same
  authority a gateway client needs. The audit log records them as the
  dashboard's principal (``dashboard:<token name>``).
- ``StoreSource(...)``: the store's URLs, for ``orleanspy dashboard`` and for an
  app that mounts the dashboard beside a ``ClusterClient``; actions go through
  that client's gateway, whose silo applies ``allow_client_management`` and
  records the principal the gateway authenticated.

Connections open on first use and close with ``aclose``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any, Protocol

from orleanspy.cluster_status import ClusterStatus, SiloRow, StatusReader, open_status_reader
from orleanspy.dashboard._reminder_reads import ReminderPages
from orleanspy.errors import OrleansPyError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import read_counters
from orleanspy.reminders.audit import AuditedReminderTable, AuditQuery, AuditRecord, acting_as
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.letters import DeadLetterPage, DeadLetterTable
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry
from orleanspy.reminders.stores import BackfillStore
from orleanspy.runtime.guests import SiloView
from orleanspy.tables import TableConnections
from orleanspy.versions import PROTOCOL, ProtocolWindow

__all__ = [
    "ACTIONS",
    "LETTER_ACTIONS",
    "ManagementRefused",
    "SiloSource",
    "Source",
    "StoreSource",
]

#: The actions the reminders page offers, with the management grain's method names.
ACTIONS = (
    "pause",
    "resume",
    "trigger",
    "set_priority",
    "set_action",
    "delete",
    "backfill",
    "cancel_backfill",
)
#: The actions the dead letters page offers (management grain methods taking an id).
LETTER_ACTIONS = ("replay", "discard")
_REFUSED = (
    "changing reminders from the dashboard needs the authority management "
    "changes need: set a cluster secret or TLS, or "
    "SiloOptions(allow_client_management=True)"
)


class ManagementRefused(OrleansPyError):
    """The dashboard may not change reminders here (the message says which option)."""


class Source(Protocol):
    async def cluster(self) -> ClusterStatus: ...
    async def pages(self) -> ReminderPages: ...
    async def row(self, grain: GrainId, name: str) -> ReminderEntry | None: ...
    async def history(self, grain: GrainId, name: str) -> list[FireRecord]: ...
    async def backfill(self, grain: GrainId, name: str) -> BackfillJob | None: ...
    async def counters(self, grain: GrainId, name: str) -> ReminderCounters: ...
    async def audit(self, query: AuditQuery) -> list[AuditRecord]: ...
    async def act(
        self, action: str, grain: GrainId, name: str, value: Any, *, principal: str
    ) -> object:
        """Do ``action``; ``principal``: who the dashboard's own check authenticated
        (a source whose actions a gateway authenticates records the gateway's)."""
        ...

    async def dead_letters(
        self, grain: GrainId | None, name: str | None, cursor: str | None, limit: int
    ) -> DeadLetterPage: ...
    async def act_letter(self, action: str, letter_id: str, *, principal: str) -> object: ...
    async def aclose(self) -> None: ...


async def _call(mgmt: Any, action: str, grain: GrainId, name: str, value: Any) -> object:
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if action == "set_priority":
        return await mgmt.set_priority(grain, name, int(value))
    if action == "set_action":
        return await mgmt.set_action(grain, name, MissedReminderAction[str(value).upper()])
    if action == "backfill":
        start, end, overlap = value
        return await mgmt.backfill(grain, name, start, end, overlap)
    method: Callable[[GrainId, str], Awaitable[object]] = getattr(mgmt, action)
    return await method(grain, name)


async def _call_letter(mgmt: Any, action: str, letter_id: str) -> object:
    if action not in LETTER_ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    method: Callable[[str], Awaitable[object]] = getattr(mgmt, action)
    return await method(letter_id)


class SiloSource:
    """The cluster as one silo sees it (an embedded silo: itself alone)."""

    def __init__(self, silo: SiloView) -> None:
        self._silo = silo
        self._stack = AsyncExitStack()
        self._reader: StatusReader | None = None
        self._lock = asyncio.Lock()

    async def cluster(self) -> ClusterStatus:
        silo = self._silo
        o = silo.options
        if silo.membership is None or silo.status_store is None:
            return self._alone()
        async with self._lock:
            if self._reader is None:
                from orleanspy.cluster_status import StatusReader

                assert silo.membership_table is not None
                self._reader = StatusReader(
                    silo.membership_table, silo.status_store,
                    cluster_id=o.cluster_id, service_id=o.service_id,
                )  # fmt: skip
        return await self._reader.read()

    def _alone(self) -> ClusterStatus:
        from orleanspy.runtime.status import StatusRecorder

        silo = self._silo
        rec = StatusRecorder(silo.readings()).record()
        started = datetime.fromtimestamp(silo.address.generation / 1000, UTC)
        row = SiloRow(
            name=silo.name, status="active", address=str(silo.address), gateway=None,
            started=started, ring_share=100.0, activations=silo.activation_count,
            reminders=_int(rec.get("reminders_held")), status_age=0.0,
            last_heartbeat=datetime.now(UTC), version=str(rec.get("version")),
            cpu_percent=None, loop_lag=None, grain_types=None,
            protocols=ProtocolWindow.mine().text(),
            record=dict(rec, updated_ms=int(time.time() * 1000)),
        )  # fmt: skip
        o = silo.options
        # An embedded silo is its own cluster: its level is its own newest protocol.
        return ClusterStatus(o.cluster_id, o.service_id, 0, (row,), (), feature_level=PROTOCOL)

    async def pages(self) -> ReminderPages:
        table = self._silo.reminder_table
        if table is None:
            raise ManagementRefused("the silo has not started its reminder table")
        return ReminderPages(table)

    async def row(self, grain: GrainId, name: str) -> ReminderEntry | None:
        table = self._silo.reminder_table
        return None if table is None else await table.read(grain, name)

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        return list(await self._silo.client.reminders.history(grain, name))

    async def backfill(self, grain: GrainId, name: str) -> BackfillJob | None:
        return await _backfill_of(self._silo.reminder_table, grain, name)

    async def counters(self, grain: GrainId, name: str) -> ReminderCounters:
        table = self._silo.reminder_table
        return ReminderCounters() if table is None else await read_counters(table, grain, name)

    async def audit(self, query: AuditQuery) -> list[AuditRecord]:
        return list(await self._silo.client.reminders.audit(query))

    async def act(
        self, action: str, grain: GrainId, name: str, value: Any, *, principal: str
    ) -> object:
        if not self._silo.options.client_management_allowed:
            raise ManagementRefused(_REFUSED)
        # Inside the silo every call is trusted: the dashboard's check says who acts.
        with acting_as(principal):
            return await _call(self._silo.client.reminders, action, grain, name, value)

    async def dead_letters(
        self, grain: GrainId | None, name: str | None, cursor: str | None, limit: int
    ) -> DeadLetterPage:
        page: DeadLetterPage = await self._silo.client.reminders.dead_letters(
            grain, name, cursor, limit
        )
        return page

    async def act_letter(self, action: str, letter_id: str, *, principal: str) -> object:
        if not self._silo.options.client_management_allowed:
            raise ManagementRefused(_REFUSED)
        with acting_as(principal):
            return await _call_letter(self._silo.client.reminders, action, letter_id)

    async def aclose(self) -> None:
        await self._stack.aclose()


class StoreSource:
    """The cluster read from its store: membership at ``membership_url``,
    reminders at ``reminders_url`` (default: the same). Actions go through
    ``client`` (a ``ClusterClient``, or anything with ``.reminders``), or the
    client ``client_factory(stack)`` opens on first use (closed with ``stack``)."""

    def __init__(
        self,
        membership_url: str,
        *,
        cluster_id: str = "dev",
        service_id: str = "default",
        reminders_url: str | None = None,
        client: Any = None,
        client_factory: Callable[[AsyncExitStack], Awaitable[Any]] | None = None,
        shards: int | None = None,
    ) -> None:
        self._membership_url = membership_url
        self._reminders_url = reminders_url or membership_url
        self._cluster_id = cluster_id
        self._service_id = service_id
        self._client = client
        self._client_factory = client_factory
        self._shards = shards or ReminderOptions().shards
        self._stack = AsyncExitStack()
        self._lock = asyncio.Lock()
        self._reader: StatusReader | None = None
        self._table: Any = None

    @classmethod
    def of_client(cls, client: Any, storage_url: str | None = None) -> StoreSource:
        """A source beside ``client``: its membership table's URL unless given."""
        url = storage_url or getattr(client, "membership_url", None)
        if url is None:
            raise ValueError("dashboard.app(client): give storage_url (the cluster's store)")
        return cls(url, cluster_id=client.cluster_id, service_id=client.service_id,
                   client=client)  # fmt: skip

    async def _open(self) -> tuple[StatusReader, Any]:
        async with self._lock:
            if self._reader is None:
                connections = TableConnections(self._stack)
                self._reader = await open_status_reader(
                    self._stack, self._membership_url, cluster_id=self._cluster_id,
                    service_id=self._service_id, connections=connections,
                )  # fmt: skip
                table = await connections.reminder_table(
                    self._reminders_url, service_id=self._service_id, shards=self._shards
                )
                await table.start(self._stack)
                self._table = table
        return self._reader, self._table

    async def cluster(self) -> ClusterStatus:
        reader, _ = await self._open()
        return await reader.read()

    async def pages(self) -> ReminderPages:
        _, table = await self._open()
        return ReminderPages(table)

    async def row(self, grain: GrainId, name: str) -> ReminderEntry | None:
        _, table = await self._open()
        row: ReminderEntry | None = await table.read(grain, name)
        return row

    async def history(self, grain: GrainId, name: str) -> list[FireRecord]:
        _, table = await self._open()
        reader = getattr(table, "read_history", None)
        return [] if reader is None else list(await reader(grain, name))

    async def backfill(self, grain: GrainId, name: str) -> BackfillJob | None:
        _, table = await self._open()
        return await _backfill_of(table, grain, name)

    async def counters(self, grain: GrainId, name: str) -> ReminderCounters:
        _, table = await self._open()
        return await read_counters(table, grain, name)

    async def _management(self) -> Any:
        async with self._lock:
            if self._client is None:
                if self._client_factory is None:
                    raise ManagementRefused("this dashboard has no client to change reminders")
                self._client = await self._client_factory(self._stack)
        return self._client.reminders

    async def audit(self, query: AuditQuery) -> list[AuditRecord]:
        _, table = await self._open()
        if not isinstance(table, AuditedReminderTable):
            return []
        return await table.read_audit(query)

    async def act(
        self, action: str, grain: GrainId, name: str, value: Any, *, principal: str
    ) -> object:
        # Through the client's gateway, which records the principal it authenticated
        # (the client's certificate or the cluster secret), not this dashboard's.
        return await _call(await self._management(), action, grain, name, value)

    async def dead_letters(
        self, grain: GrainId | None, name: str | None, cursor: str | None, limit: int
    ) -> DeadLetterPage:
        """Read straight from the table, as the rows are (no gateway needed)."""
        _, table = await self._open()
        if not isinstance(table, DeadLetterTable):
            return DeadLetterPage([], None)
        letters, nxt = await table.read_dead_letters(cursor, limit, grain_id=grain, name=name)
        return DeadLetterPage(letters, nxt)

    async def act_letter(self, action: str, letter_id: str, *, principal: str) -> object:
        # Recorded as the gateway's principal, as ``act``.
        return await _call_letter(await self._management(), action, letter_id)

    async def aclose(self) -> None:
        await self._stack.aclose()


async def _backfill_of(table: object, grain: GrainId, name: str) -> BackfillJob | None:
    """The reminder's running backfill, from a table that keeps them."""
    if not isinstance(table, BackfillStore):
        return None
    return await table.read_backfill(grain, name)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None
