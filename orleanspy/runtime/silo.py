"""The silo host: the composition root. It wires providers and starts components
on one ``AsyncExitStack``; stopping unwinds the stack in reverse order.

With no table URL in ``SiloOptions`` (``storage_url``, ``redis_url``, ...), the
silo is the embedded default: one process, in-memory providers, no network.
With one set, the silo joins a cluster (see ``runtime.cluster``).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from orleanspy import tracing
from orleanspy.clock import Clock, SystemClock
from orleanspy.directory.cached import CachedDirectory
from orleanspy.directory.table import GrainDirectory
from orleanspy.errors import ClosedError, ConfigurationError
from orleanspy.grain import Grain, GrainDefinition, definition_of, registered_definitions
from orleanspy.identity import GrainId, GrainKey, SiloAddress
from orleanspy.membership.agreement import require_feature
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.service import MembershipService
from orleanspy.membership.table import MembershipTable
from orleanspy.messaging.transport import AnswersOnly, Transport
from orleanspy.metrics import SiloMetrics
from orleanspy.observability import reset_current_silo, set_current_silo
from orleanspy.options import SiloOptions
from orleanspy.reference import GrainFactory
from orleanspy.remindable.declarations import register_declared_reminders
from orleanspy.remindable.management import (
    MANAGEMENT_TYPE,
    ReminderManagementGrain,
    management,
)
from orleanspy.remindable.orphans import OrphanWatch
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders._service.adaptive import LoadSignals, default_load
from orleanspy.reminders.model import MissedReminder, ReminderEntry, TickStatus
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.table import FencingReminderTable, ReminderTable
from orleanspy.ring import RingRange
from orleanspy.runtime.addresses import advertised_host, bind_error, warn_if_exposed
from orleanspy.runtime.catalog import Catalog
from orleanspy.runtime.cluster import ClusterLocator, RingFollower
from orleanspy.runtime.collector import tune_collector
from orleanspy.runtime.dispatcher import Dispatcher
from orleanspy.runtime.locator import LocalLocator
from orleanspy.runtime.readings import ReadingsOf, SiloReadings
from orleanspy.schema import SchemaVersion
from orleanspy.storage.contract import GrainStorage
from orleanspy.streams.provider import MISSED_REMINDERS_STREAM, StreamProvider
from orleanspy.tables import TableConnections
from orleanspy.versions import Feature

if TYPE_CHECKING:
    from orleanspy.runtime.ops_http import Check

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
        return management(self._silo._factory().get_grain(ReminderManagementGrain, ""))


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
        membership_table: MembershipTable | None = None,
        directory: GrainDirectory | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.options = options or SiloOptions()
        self.clock: Clock = clock or SystemClock()
        self._reminder_table = reminder_table
        # Whether the silo opened the reminder table itself (from its URL).
        self._reminder_table_opened = False
        self._streams = streams
        self._membership_table = membership_table
        self._directory = directory
        self._transport = transport
        self.reminder_service: ReminderService | None = None
        self._type_names: frozenset[str] = frozenset()
        self._orphans: OrphanWatch | None = None
        self.reminder_table: ReminderTable | None = None
        """The reminder table, once started (tools read it; the service owns it)."""
        self.membership: MembershipService | None = None
        self.ring: RingFollower | None = None
        self.declared_dead = False
        self.stop_reason: str | None = None
        """Why the silo stopped itself (declared Dead, its store lost its data), if it did."""
        self.gateway_port: int | None = None
        """The port clients connect to (a cluster silo with a gateway), once started."""
        self._aborted = False
        self._stop_task: asyncio.Task[None] | None = None
        self._clustered = self.options.clustered or transport is not None
        # Set by ``start`` when this silo tuned the garbage collector; ``stop`` calls it.
        self._restore_collector: Callable[[], None] = _nothing
        self.state = SiloState.CREATED
        self._stack: AsyncExitStack | None = None
        self._dispatcher: Dispatcher | None = None
        self.transport: Transport | None = None
        self.metrics = SiloMetrics()
        """What the silo records; recording only with ``SiloOptions.metrics_port`` set."""
        self.metrics_port: int | None = None
        """The port of ``/metrics``, ``/healthz`` and ``/readyz``, once started."""
        self.dashboard_port: int | None = None
        """The dashboard's port (``SiloOptions.dashboard_port``), once started."""
        self.status_store: Any = None
        """Where this silo's status record goes (a cluster silo), once started."""
        self._heartbeat: Any = None
        self._connections: TableConnections | None = None
        self._storage_client: Any = None
        self.client = SiloClient(self)
        self.name = self.options.name or f"silo-{id(self):x}"
        # A wildcard bind advertises the address the membership store is reached from.
        self.address = SiloAddress(
            advertised_host(self.options)
            if self._clustered
            else self.options.advertised_host or self.options.host,
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
        if opts.clustered:
            raise ConfigurationError(
                "Silo.local() is the embedded silo; drop redis_url / storage_url / "
                "membership_url / reminder_table_url"
            )
        return cls(opts, clock=clock, reminder_table=reminder_table, streams=streams)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every component; on failure, stop what started and re-raise."""
        if self.state is not SiloState.CREATED:
            raise ClosedError(f"silo {self.name} was already started (state {self.state.name})")
        self.state = SiloState.STARTING
        # Tasks started from here on inherit the name for their log records.
        token = set_current_silo(self.name)
        # Whether this process traces: a tracer provider set by now counts.
        tracing.refresh()
        try:
            await self._start()
        except BaseException:
            # What started has been stopped; a failed silo does not restart.
            self.state = SiloState.STOPPED
            raise
        finally:
            reset_current_silo(token)
        if self.options.tune_gc is not False:
            self._restore_collector = tune_collector()
        self.state = SiloState.RUNNING
        log.info("silo started name=%s address=%s", self.name, self.address)

    async def _start(self) -> None:
        async with AsyncExitStack() as stack:
            types = _hosted_types(self.options)
            if self.options.metrics_port is not None or self.options.dashboard_port is not None:
                # First, so /readyz answers "not ready" while the silo joins.
                await self._start_ops_endpoint(stack)
            if self._clustered:
                await self._start_cluster(stack, types)
            else:
                dispatcher = Dispatcher(
                    address=self.address,
                    clock=self.clock,
                    options=self.options,
                    locator=LocalLocator(self.address),
                    grain_types=types,
                )
                self._dispatcher = dispatcher
                dispatcher.grain_metrics = self.metrics.grains
                await self._start_grain_storage(stack, dispatcher, None)
                await dispatcher.catalog.start(stack)
                await self._start_reminders(stack, dispatcher, types)
                self._reminders().set_ranges([RingRange.full()])
                await register_declared_reminders(dispatcher.reminders, types.values())
            if self.options.dashboard_port is not None:
                await self._start_dashboard(stack)
            self._stack = stack.pop_all()

    async def stop(self) -> None:
        """Stop gracefully: deactivate grains, stop components in reverse order.
        While the silo is stopping itself (declared dead), wait for that."""
        if self.state in (SiloState.STOPPING, SiloState.STOPPED):
            own = self._stop_task
            if own is not None and own is not asyncio.current_task() and not own.done():
                await asyncio.shield(own)
            return
        self.state = SiloState.STOPPING
        try:
            if self._stack is not None:
                await self._stack.aclose()
        finally:
            if self._dispatcher is not None:
                await self._dispatcher.close(ClosedError(f"silo {self.name} stopped"))
            self._restore_collector()
            self.state = SiloState.STOPPED
            log.info("silo stopped name=%s", self.name)

    async def abort(self) -> None:
        """Stop as if the process had crashed (for tests of failure detection):
        no membership writes, no ``on_deactivate``, no directory clean-up; peers
        must find out by probing."""
        self._aborted = True
        if self._dispatcher is not None:
            self._dispatcher.catalog.abandon()
        await self.stop()

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

    def _reminders(self) -> ReminderService:
        assert self.reminder_service is not None
        return self.reminder_service

    async def _start_cluster(
        self, stack: AsyncExitStack, types: dict[str, GrainDefinition]
    ) -> None:
        """Join the cluster, one step per line. Push order makes ``stop()`` go:
        ShuttingDown, reminders off, grains deactivated (directory entries
        released), Dead, transport and stores closed."""
        # One Redis client or PostgreSQL pool per URL, shared by the providers
        # that live there, closed by the silo.
        connections = TableConnections(stack, self.options.redis)
        await self._open_cluster_providers(connections)
        transport = self._make_transport()
        directory = await self._start_membership_table_and_directory(stack)
        locator, dispatcher = self._make_cluster_dispatcher(types, transport, directory)
        # Before the transport: a call may activate a grain as soon as it listens.
        await self._start_grain_storage(
            stack, dispatcher, await _default_grain_storage(self.options, connections)
        )
        await self._start_transport(stack, transport, dispatcher)
        membership = self._make_membership_service(stack, transport, locator, types)
        await dispatcher.catalog.start(stack)
        await self._start_reminders(stack, dispatcher, types)
        await self._join_cluster(stack, membership, directory, transport)
        await register_declared_reminders(dispatcher.reminders, types.values())

    def _current_address(self) -> SiloAddress:
        """This silo's address as of now (the transport may bind a new port)."""
        return self.address

    async def _open_cluster_providers(self, connections: TableConnections) -> None:
        """Open the membership table, directory, reminder table and streams that
        were not given, from their URLs."""
        o = self.options

        def url_of(url: str | None) -> str:
            if url is None:
                raise ConfigurationError(
                    "a cluster silo needs SiloOptions.storage_url (or redis_url), or every "
                    "provider (membership_table, directory, reminder_table, streams) given"
                )
            return url

        if self._membership_table is None:
            self._membership_table = await connections.membership_table(
                url_of(o.membership_table_url), cluster_id=o.cluster_id, service_id=o.service_id
            )
        if self._directory is None:
            self._directory = await connections.directory(
                url_of(o.directory_url), cluster_id=o.cluster_id, service_id=o.service_id
            )
        if self._reminder_table is None:
            self._reminder_table_opened = True
            self._reminder_table = await connections.reminder_table(
                url_of(o.reminders_url), service_id=o.service_id, shards=o.reminders.shards
            )
        if self._streams is None and o.streams_url is not None:
            from orleanspy.streams.redis import RedisStreamProvider

            self._streams = RedisStreamProvider(
                connections.redis(o.streams_url), service_id=o.service_id
            )
        # The Redis servers the providers just built use: wait for each (a compose
        # start-up brings Redis up alongside the silos). PostgreSQL pools connect
        # as they open.
        from orleanspy._redis import wait_reachable

        for url, redis_client in connections.redis_clients().items():
            await wait_reachable(
                redis_client,
                url,
                o.storage_start_timeout.total_seconds(),
                "SiloOptions.storage_start_timeout (--storage-timeout)",
            )
        # The membership store's Redis client: /readyz pings it. The status
        # record lives beside the membership table (Redis or PostgreSQL).
        if o.membership_table_url is not None:
            self._storage_client = connections.redis_clients().get(o.membership_table_url)
            self._connections = connections

    def _make_transport(self) -> Transport:
        """The transport given, else gRPC on the configured ports (not started yet)."""
        from orleanspy.messaging.grpc import GrpcTransport

        o = self.options
        return self._transport or GrpcTransport(
            host=o.host,
            port=o.silo_port,
            gateway_port=o.gateway_port,
            options=o.messaging,
            generation=self.address.generation,
            advertised_host=self.address.host,
        )

    async def _start_membership_table_and_directory(self, stack: AsyncExitStack) -> CachedDirectory:
        """Start the membership table and the directory, behind its cache."""
        assert self._membership_table is not None and self._directory is not None
        await self._membership_table.start(stack)
        directory = CachedDirectory(self._directory)
        await directory.start(stack)
        return directory

    def _make_cluster_dispatcher(
        self,
        types: dict[str, GrainDefinition],
        transport: Transport,
        directory: CachedDirectory,
    ) -> tuple[ClusterLocator, Dispatcher]:
        """The dispatcher, locating grains through the directory and membership."""
        locator = ClusterLocator(address=self._current_address, directory=directory)
        dispatcher = Dispatcher(
            address=self.address,
            clock=self.clock,
            options=self.options,
            locator=locator,
            grain_types=types,
            transport=transport,
        )
        self._dispatcher = dispatcher
        if isinstance(transport, AnswersOnly):
            transport.answer_only(locator.knows)
        dispatcher.grain_metrics = self.metrics.grains
        self.transport = transport
        return locator, dispatcher

    async def _start_transport(
        self, stack: AsyncExitStack, transport: Transport, dispatcher: Dispatcher
    ) -> None:
        """Listen; from here on this silo's address is the one the transport bound."""
        try:
            await transport.start(stack, dispatcher)
        except (OSError, RuntimeError) as exc:
            raise bind_error(self.options, exc) from exc
        warn_if_exposed(self.options)
        self.address = transport.address
        self.gateway_port = transport.gateway_port
        dispatcher.address = self.address

    def _make_membership_service(
        self,
        stack: AsyncExitStack,
        transport: Transport,
        locator: ClusterLocator,
        types: dict[str, GrainDefinition],
    ) -> MembershipService:
        """The membership service, wired to the transport's gossip and the locator;
        a graceful stop ends with its final write (Dead)."""
        from orleanspy.membership.agreement import cluster_level, ring_mode
        from orleanspy.membership.credentials import cluster_verifier

        o = self.options
        assert self._membership_table is not None
        membership = MembershipService(
            self._membership_table,
            address=self.address,
            name=self.name,
            gateway_port=transport.gateway_port,
            # A transport that tells a refused connection from silence lets
            # membership declare a killed process Dead at once.
            ping=getattr(transport, "probe", transport.ping),
            clock=self.clock,
            options=o.membership,
            on_declared_dead=self._on_declared_dead,
            gossip=functools.partial(
                _gossip, transport, o.membership.probe_timeout.total_seconds()
            ),
            grain_types=types.keys(),
            verifier=cluster_verifier(
                o.messaging, service_id=o.service_id, cluster_id=o.cluster_id
            ),
            ring_mode=ring_mode(o.membership.balanced_ring),
            ring_follows=o.membership.balanced_ring is None,
            schemas=self._schema_versions(),
        )
        transport.on_gossip(membership.gossip_received)
        if self._dispatcher is not None:
            # What persistent state may write: the newest protocol every live silo speaks.
            self._dispatcher.feature_level = lambda: cluster_level(membership.snapshot)
        stack.push_async_callback(_stop_gossip, transport, membership)
        locator.attach(membership)
        self.membership = membership
        stack.push_async_callback(self._final_membership_write, membership)
        return membership

    async def _join_cluster(
        self,
        stack: AsyncExitStack,
        membership: MembershipService,
        directory: CachedDirectory,
        transport: Transport,
    ) -> None:
        """Join (Joining, then Active) and follow the ring: ranges go to the
        reminder service; a graceful stop first writes ShuttingDown."""
        follower = RingFollower(
            address=self._current_address,
            directory=directory,
            transport=transport,
            on_ranges=self._reminders().set_ranges,
            balanced=self.options.membership.balanced_ring,
            on_mode=membership.ring_built,
            on_dead=self._fence_dead,
        )
        self.ring = follower
        await membership.start(stack)
        stack.push_async_callback(self._leave_cluster, membership)
        membership.add_listener(follower)
        o = self.options
        if self._connections is not None and o.membership_table_url is not None:
            from orleanspy.cluster_status import StatusPublisher, status_store
            from orleanspy.runtime.status import StatusRecorder

            store = await status_store(
                self._connections,
                o.membership_table_url,
                service_id=o.service_id,
                cluster_id=o.cluster_id,
            )
            self.status_store = store
            recorder = StatusRecorder(self.readings(), self._heartbeat)
            await StatusPublisher(store, silo=self._current_address, read=recorder.record).start(
                stack
            )

    async def _start_grain_storage(
        self,
        stack: AsyncExitStack,
        dispatcher: Dispatcher,
        default: GrainStorage | None,
    ) -> None:
        """Start the providers of ``SiloOptions.storage`` (URLs opened here). Without
        it, ``"default"`` is ``default`` (the cluster's own store) when there is one,
        else memory. Started before the catalog, so they close after the last
        ``on_deactivate`` has had its chance to write."""
        from orleanspy.storage.factory import grain_storage_from_url

        o = self.options
        wanted: dict[str, Any]
        if o.storage is not None:
            wanted = dict(o.storage)
        elif default is not None:
            wanted = {"default": default}
        else:
            from orleanspy.storage.memory import InMemoryGrainStorage

            wanted = {"default": InMemoryGrainStorage()}
        providers: dict[str, GrainStorage] = {}
        for name, value in wanted.items():
            provider = (
                grain_storage_from_url(value, service_id=o.service_id)
                if isinstance(value, str)
                else value
            )
            await provider.start(stack)
            providers[name] = provider
        dispatcher.grain_storage = providers

    def _schema_versions(self) -> list[tuple[str, int]]:
        """The store schema versions this silo's providers run with, for its
        membership row (``orleanspy.schema``): each provider that names one."""
        providers: list[object] = [
            self._membership_table,
            self._directory,
            self._reminder_table,
            self._streams,
        ]
        if self._dispatcher is not None:
            providers += self._dispatcher.grain_storage.values()
        found: dict[str, int] = {}
        for provider in providers:
            # A provider that keeps several components names each (``schemas``).
            schemas = getattr(provider, "schemas", None) or (getattr(provider, "schema", None),)
            for schema in schemas:
                if isinstance(schema, SchemaVersion):
                    found[schema.key] = schema.version
        return sorted(found.items())

    async def _final_membership_write(self, membership: MembershipService) -> None:
        """Last step of a graceful stop, once grains are gone: write Dead."""
        if not self._aborted:
            await membership.shutdown()

    def _fence_dead(self, silo: SiloAddress) -> None:
        """A silo is Dead: its reminder writes are fenced before its rows are
        read here, for as long as the membership keeps defunct rows."""
        keep = self.options.membership.defunct_silo_expiration
        self._reminders().fence(silo, keep=keep)

    async def _leave_cluster(self, membership: MembershipService) -> None:
        """First step of a graceful stop: hand the reminders over (ticks in flight
        finished and persisted, nothing more delivered), then tell the cluster
        we are going, so the next owners read what we last wrote."""
        if self.declared_dead or self._aborted:
            return
        if self.reminder_service is not None:
            await self.reminder_service.drain()
        try:
            await membership.update_status(SiloStatus.SHUTTING_DOWN)
        except Exception as exc:
            log.warning("could not write ShuttingDown name=%s error=%r", self.name, exc)

    def _on_declared_dead(self) -> None:
        """The table says we are Dead (or lost our row): stop at once, no more
        writes as a member. The lease is already revoked, so no tick goes out."""
        if self.declared_dead:
            return
        self.declared_dead = True
        self.stop_reason = self.membership.stop_reason if self.membership else None
        log.error("silo stops itself name=%s reason=%s", self.name, self.stop_reason)
        self._stop_task = asyncio.get_running_loop().create_task(self.stop())

    async def _start_reminders(
        self, stack: AsyncExitStack, dispatcher: Dispatcher, types: dict[str, GrainDefinition]
    ) -> None:
        from orleanspy.reminders.memory import InMemoryReminderTable
        from orleanspy.streams.memory import InMemoryStreamProvider

        streams = self._streams or InMemoryStreamProvider()
        await streams.start(stack)
        dispatcher.streams = streams
        table = self._reminder_table or InMemoryReminderTable(self.options.service_id)
        opened = self._reminder_table is None or self._reminder_table_opened
        if opened and isinstance(table, FencingReminderTable):
            # Schedule writes carry this incarnation, so that peers can fence it
            # once they see it Dead. A table passed in is the caller's to label
            # (several silos of one process may share it: ``writer_view``).
            table.writer = self.address
        await table.start(stack)
        self.reminder_table = table
        registry = ReminderRegistry(
            table,
            service_id=self.options.service_id,
            clock=self.clock,
            options=self.options.reminders,
            definitions=types.get,
        )
        dispatcher.set_reminders(registry)
        # Late bound: the silo points the dispatcher's at membership once it joins.
        registry.feature_level = lambda: dispatcher.feature_level()  # noqa: PLW0108
        registry.via = self.name
        self._type_names = frozenset(types)
        registry.hosted_types = self._cluster_types
        membership = self.membership
        if membership is not None:
            # Options 0.1 does not know are refused until every silo knows them.
            def require(feature: Feature | str, what: str) -> None:
                require_feature(membership.snapshot, feature, what)

            registry.require = require

        # A tick gives up well before a plain call would (ReminderOptions.tick_timeout).
        tick_cap = self.options.messaging.response_timeout.total_seconds() / 2

        def deliver(entry: ReminderEntry, status: TickStatus, deadline: float) -> Awaitable[object]:
            # The call's own coroutine, not one around it: a coroutine frame per tick less.
            return dispatcher.invoke(
                entry.grain_id,
                "receive_reminder",
                (entry.name, status),
                {},
                reminder_tick=True,
                deadline=min(deadline, tick_cap),
            )

        async def deliver_tick(grain_id: GrainId, name: str, status: TickStatus) -> None:
            # An off-schedule tick (the management grain's trigger, tests): a
            # tick like the service's own, waited for as long as any call.
            await dispatcher.invoke(
                grain_id, "receive_reminder", (name, status), {}, reminder_tick=True
            )

        registry.deliver_tick = deliver_tick

        async def publish_missed(event: MissedReminder) -> None:
            await streams.publish(MISSED_REMINDERS_STREAM, event)

        def load() -> LoadSignals:
            # Read at every refill (the adaptive bucket follows memory pressure as it
            # changes), with this silo's activation count as the grain signal.
            return replace(default_load(), active_grains=len(dispatcher.catalog))

        service = ReminderService(
            table,
            deliver=deliver,
            clock=self.clock,
            options=self.options.reminders,
            publish_missed=publish_missed,
            load=load,
            name=self.name,
            metrics=self.metrics.reminders,
            lease=self.membership.lease if self.membership is not None else None,
            # Deadlines, dead letters and counters wait for every silo to know them.
            level=dispatcher.feature_level,
        )
        await service.start(stack)
        registry.add_listener(service.notify_change)
        registry.backfill_started = service.kick_backfills
        self.reminder_service = service
        self.streams = streams
        self._orphans = watch = OrphanWatch(registry.operations, self.metrics.reminders)
        task = asyncio.get_running_loop().create_task(watch.run(), name=f"orphans-{self.name}")

        async def stop_watch() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        stack.push_async_callback(stop_watch)

    async def _cluster_types(self) -> set[str]:
        """The grain types this silo hosts and, in a cluster, those the other
        silos publish in their status records (a crashed silo's stale record
        counts: an orphan is only called so when no record names its type)."""
        found = set(self._type_names)
        if self.status_store is not None:
            from orleanspy.cluster_status import published_types

            found |= await published_types(self.status_store)
        return found

    @property
    def hosted_types(self) -> frozenset[str]:
        """The grain types this silo hosts (its status record's ``grain_types``)."""
        return self._type_names

    @property
    def orphaned_rows(self) -> int | None:
        """Reminder rows of types no silo hosts, at the last orphan check
        (``None`` before one)."""
        return None if self._orphans is None else self._orphans.orphaned_rows

    # -- operations endpoint ------------------------------------------------------------

    async def _start_ops_endpoint(self, stack: AsyncExitStack) -> None:
        """Start recording metrics and the loop heartbeat; serve ``/metrics``,
        ``/healthz`` and ``/readyz`` on ``metrics_port`` when set."""
        from orleanspy import _prometheus
        from orleanspy.runtime.ops_http import (
            HTTP_HINT,
            HttpServer,
            LoopHeartbeat,
            http_available,
            ops_app,
        )

        if _prometheus.available():
            self.metrics = SiloMetrics.recording()
        else:
            log.warning("metrics not recorded: pip install 'orleanspy[metrics]' for /metrics")
        heartbeat = LoopHeartbeat()
        await heartbeat.start(stack)
        self._heartbeat = heartbeat
        port = self.options.metrics_port
        if port is None:
            return
        if not http_available():
            raise ConfigurationError(f"SiloOptions.metrics_port (--metrics-port): {HTTP_HINT}")
        server = HttpServer(self._ops_app(ops_app), self.options.host, port)
        await server.start(stack, what="SiloOptions.metrics_port, --metrics-port")
        self.metrics_port = server.port

    def _ops_app(self, make: Any) -> Any:
        from orleanspy import _prometheus

        def metrics() -> bytes | None:
            return _prometheus.render(self.readings()) if self.metrics.enabled else None

        assert self._heartbeat is not None
        return make(metrics=metrics, readiness=self._readiness, heartbeat=self._heartbeat)

    async def _start_dashboard(self, stack: AsyncExitStack) -> None:
        """Serve the guest ``"dashboard"`` (``runtime.guests``: the dashboard
        registers it; the silo never imports it) on ``dashboard_host:dashboard_port``
        (checked in ``SiloOptions``: off loopback only with a token or TLS)."""
        from orleanspy.runtime.guests import guest
        from orleanspy.runtime.ops_http import HTTP_HINT, HttpServer, http_available

        if not http_available():
            raise ConfigurationError(
                "SiloOptions.dashboard_port (--dashboard-port): "
                + HTTP_HINT.replace("[metrics]", "[dashboard]")
            )
        o = self.options
        assert o.dashboard_port is not None
        served = guest("dashboard")(self)
        stack.push_async_callback(served.aclose)
        server = HttpServer(served.app, o.dashboard_host, o.dashboard_port, tls=o.messaging.tls)
        await server.start(stack, what="SiloOptions.dashboard_port, --dashboard-port")
        self.dashboard_port = server.port

    async def _readiness(self) -> dict[str, Check]:
        """The ``/readyz`` checks: running, Active in membership (cluster),
        storage answering, ring ranges owned."""
        from orleanspy.runtime.ops_http import Check

        checks = {"silo": Check(self.state is SiloState.RUNNING, self.state.name.lower())}
        if self._clustered:
            membership = self.membership
            status = membership.status if membership is not None else None
            checks["membership"] = Check(
                status is SiloStatus.ACTIVE and not self.declared_dead,
                self.stop_reason or (status.name.lower() if status else "not joined"),
            )
            if membership is not None:
                lease = membership.lease
                held = lease.held()
                checks["lease"] = Check(held, "held" if held else lease.revoked or "lapsed")
        checks["storage"] = await self._storage_check()
        ranges = self.reminder_service.ranges if self.reminder_service is not None else ()
        checks["ranges"] = Check(bool(ranges), f"{len(ranges)} owned")
        return checks

    async def _storage_check(self) -> Check:
        from orleanspy.runtime.ops_http import Check

        if not self._clustered:
            return Check(True, "in memory")
        if self.state is not SiloState.RUNNING or self.declared_dead:
            # A silo that is stopping (itself, or by the cluster's verdict) may be
            # closing the client: a ping now could take a connection from a pool
            # that no longer releases it.
            return Check(False, "stopping")
        client = self._storage_client
        if client is None:
            ok = self._membership_table is not None and self.membership is not None
            return Check(ok, "provided" if ok else "not connected")
        try:
            async with asyncio.timeout(2.0):
                await client.ping()
        except Exception as exc:
            return Check(False, f"redis: {exc!r}"[:200])
        return Check(True, "redis answers")

    # -- inspection ---------------------------------------------------------------------

    def _factory(self) -> GrainFactory:
        if self.state is not SiloState.RUNNING or self._dispatcher is None:
            hint = (
                "start it first: `async with Silo.local() as silo:` (or `await silo.start()`)"
                if self.state is SiloState.CREATED
                else "a stopped silo does not restart: make a new one"
            )
            raise ClosedError(f"silo {self.name} is not running (state {self.state.name}); {hint}")
        return self._dispatcher.factory

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise ClosedError(f"silo {self.name} was never started")
        return self._dispatcher

    @property
    def membership_table(self) -> MembershipTable | None:
        """The membership table of a cluster silo, once started (tools read it)."""
        return self._membership_table

    @property
    def activation_count(self) -> int:
        """How many activations this silo holds right now."""
        return 0 if self._dispatcher is None else len(self._dispatcher.catalog)

    @property
    def catalog(self) -> Catalog | None:
        """The activations this silo holds (``None`` before start)."""
        return None if self._dispatcher is None else self._dispatcher.catalog

    def readings(self) -> SiloReadings:
        """The read-only view that metrics and the status record read."""
        return ReadingsOf(self)


async def _stop_gossip(transport: Transport, membership: MembershipService) -> None:
    """Stop listening for gossip, and end the table read the last gossip started:
    it must not outlive the store's client, which closes later in the stop."""
    transport.on_gossip(None)
    await membership.stop_gossip_reads()


async def _gossip(transport: Transport, timeout: float, silo: SiloAddress, version: int) -> bool:
    # Gossip rides on the ping: one small unary call, answered by every silo.
    return await transport.ping(silo, timeout, table_version=version)


async def _default_grain_storage(
    o: SiloOptions, connections: TableConnections
) -> GrainStorage | None:
    """Grain storage on the store of the cluster's tables (``storage_url``, else
    ``redis_url``), sharing its client or pool; ``None`` when neither is set or
    ``SiloOptions.storage`` names the providers itself."""
    url = o.storage_url or o.redis_url
    if o.storage is not None or url is None:
        return None
    return await connections.grain_storage(url, service_id=o.service_id)


def _nothing() -> None:
    return None
