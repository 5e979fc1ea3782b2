"""The silo host: the composition root. It wires providers and starts components
on one ``AsyncExitStack``; stopping unwinds the stack in reverse order.

With ``SiloOptions.redis_url`` unset, the silo is the embedded default: one
process, in-memory providers, no network. With it set, the silo joins a
cluster (see ``runtime.cluster``).
"""

from __future__ import annotations

import enum
import logging
import os
import time
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self, TypeVar, overload

from orleanspy.clock import Clock, SystemClock
from orleanspy.errors import ClosedError, ConfigurationError
from orleanspy.grain import Grain, GrainDefinition, definition_of, registered_definitions
from orleanspy.identity import GrainKey, SiloAddress
from orleanspy.options import SiloOptions
from orleanspy.reference import GrainFactory
from orleanspy.reminders._adaptive import LoadSignals, read_memory_load
from orleanspy.reminders.management import MANAGEMENT_TYPE, ReminderManagementGrain
from orleanspy.reminders.model import MissedReminder, ReminderEntry, TickStatus
from orleanspy.reminders.registration import register_declared_reminders
from orleanspy.reminders.registry import ReminderRegistry
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.table import ReminderTable
from orleanspy.ring import RingRange
from orleanspy.runtime.dispatcher import Dispatcher
from orleanspy.runtime.locator import LocalLocator
from orleanspy.streams.provider import MISSED_REMINDERS_STREAM, StreamProvider

__all__ = ["Silo", "SiloClient", "SiloState"]

log = logging.getLogger(__name__)

G = TypeVar("G", bound=Grain)


class SiloState(enum.Enum):
    CREATED = 1
    STARTING = 2
    RUNNING = 3
    STOPPING = 4
    STOPPED = 5


class SiloClient:
    """Calls into the cluster from the silo's own process (``silo.client``)."""

    def __init__(self, silo: Silo) -> None:
        self._silo = silo

    @overload
    def get_grain(self, grain: type[G], key: GrainKey) -> G: ...
    @overload
    def get_grain(self, grain: str, key: GrainKey) -> Any: ...
    def get_grain(self, grain: type[G] | str, key: GrainKey) -> Any:
        """A proxy for ``(grain, key)``: typed for a class, untyped for a type name."""
        return self._silo._factory().get_grain(grain, key)

    @property
    def reminders(self) -> ReminderManagementGrain:
        """The reminder management grain (``upcoming``, ``count_all``, ...)."""
        return self._silo._factory().get_grain(ReminderManagementGrain, "")


def _hosted_types(options: SiloOptions) -> dict[str, GrainDefinition]:
    if options.grain_types is None:
        return registered_definitions()
    types = {MANAGEMENT_TYPE: definition_of(ReminderManagementGrain)}
    for item in options.grain_types:
        if not (isinstance(item, type) and issubclass(item, Grain)):
            raise ConfigurationError(f"SiloOptions.grain_types: {item!r} is not a Grain class")
        defn = definition_of(item)
        types[defn.type_name] = defn
    return types


class Silo:
    """A host for grains. Use as ``async with Silo.local() as silo:`` or
    ``await silo.start()`` / ``await silo.stop()``. A stopped silo cannot restart.
    """

    def __init__(
        self,
        options: SiloOptions | None = None,
        *,
        clock: Clock | None = None,
        reminder_table: ReminderTable | None = None,
        streams: StreamProvider | None = None,
    ) -> None:
        self.options = options or SiloOptions()
        self.clock: Clock = clock or SystemClock()
        self._reminder_table = reminder_table
        self._streams = streams
        self.reminder_service: ReminderService | None = None
        self.state = SiloState.CREATED
        self._stack: AsyncExitStack | None = None
        self._dispatcher: Dispatcher | None = None
        self.client = SiloClient(self)
        self.name = self.options.name or f"silo-{id(self):x}"
        self.address = SiloAddress(
            self.options.advertised_host or self.options.host,
            self.options.silo_port,
            time.time_ns() // 1_000_000,
        )

    @classmethod
    def local(
        cls,
        options: SiloOptions | None = None,
        *,
        clock: Clock | None = None,
        reminder_table: ReminderTable | None = None,
        streams: StreamProvider | None = None,
    ) -> Silo:
        """The embedded default: one process, in-memory providers, no network."""
        opts = options or SiloOptions()
        if opts.redis_url is not None:
            raise ConfigurationError("Silo.local() is the embedded silo; drop redis_url")
        return cls(opts, clock=clock, reminder_table=reminder_table, streams=streams)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every component; on failure, stop what started and re-raise."""
        if self.state is not SiloState.CREATED:
            raise ClosedError(f"silo {self.name} was already started (state {self.state.name})")
        self.state = SiloState.STARTING
        async with AsyncExitStack() as stack:
            types = _hosted_types(self.options)
            dispatcher = Dispatcher(
                address=self.address,
                clock=self.clock,
                options=self.options,
                locator=LocalLocator(self.address),
                grain_types=types,
            )
            self._dispatcher = dispatcher
            await dispatcher.catalog.start(stack)
            await self._start_reminders(stack, dispatcher, types)
            self._stack = stack.pop_all()
        self.state = SiloState.RUNNING
        log.info("silo started name=%s address=%s", self.name, self.address)

    async def stop(self) -> None:
        """Stop gracefully: deactivate grains, stop components in reverse order."""
        if self.state in (SiloState.STOPPING, SiloState.STOPPED):
            return
        self.state = SiloState.STOPPING
        try:
            if self._stack is not None:
                await self._stack.aclose()
        finally:
            if self._dispatcher is not None:
                self._dispatcher.fail_pending(ClosedError(f"silo {self.name} stopped"))
            self.state = SiloState.STOPPED
            log.info("silo stopped name=%s", self.name)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _start_reminders(
        self, stack: AsyncExitStack, dispatcher: Dispatcher, types: dict[str, GrainDefinition]
    ) -> None:
        from orleanspy.reminders.memory import InMemoryReminderTable
        from orleanspy.streams.memory import InMemoryStreamProvider

        streams = self._streams or InMemoryStreamProvider()
        await streams.start(stack)
        table = self._reminder_table or InMemoryReminderTable(self.options.service_id)
        await table.start(stack)
        registry = ReminderRegistry(
            table,
            service_id=self.options.service_id,
            clock=self.clock,
            options=self.options.reminders,
            definitions=types.get,
        )
        dispatcher.set_reminders(registry)

        async def deliver(entry: ReminderEntry, status: TickStatus) -> None:
            await dispatcher.invoke(entry.grain_id, "receive_reminder", (entry.name, status), {})

        async def publish_missed(event: MissedReminder) -> None:
            await streams.publish(MISSED_REMINDERS_STREAM, event)

        memory_load = read_memory_load()
        cpus = os.cpu_count() or 1

        def load() -> LoadSignals:
            return LoadSignals(cpus, memory_load, len(dispatcher.catalog))

        service = ReminderService(
            table,
            deliver=deliver,
            clock=self.clock,
            options=self.options.reminders,
            publish_missed=publish_missed,
            load=load,
            name=self.name,
        )
        await service.start(stack)
        registry.add_listener(service.notify_change)
        self.reminder_service = service
        self.streams = streams
        service.set_ranges([RingRange.full()])
        await register_declared_reminders(registry, types.values())

    # -- inspection ---------------------------------------------------------------------

    def _factory(self) -> GrainFactory:
        if self.state is not SiloState.RUNNING or self._dispatcher is None:
            raise ClosedError(f"silo {self.name} is not running (state {self.state.name})")
        return self._dispatcher.factory

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise ClosedError(f"silo {self.name} was never started")
        return self._dispatcher

    @property
    def activation_count(self) -> int:
        """How many activations this silo holds right now."""
        return 0 if self._dispatcher is None else len(self._dispatcher.catalog)
