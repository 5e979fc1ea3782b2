"""``ClusterClient``: call grains in a cluster from outside it, through gateways.

The client reads the membership table for the gateways of Active silos, keeps
one gRPC stream to each, and spreads calls over them round-robin. When a
gateway's stream breaks, calls waiting on it fail with ``SiloUnavailableError``
(a call is never silently sent twice) and new calls go to the others; the
gateway list is refreshed from the table periodically and after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from orleanspy import tracing
from orleanspy.errors import (
    AuthenticationError,
    ClosedError,
    ConfigurationError,
    SiloUnavailableError,
)
from orleanspy.grain import Grain
from orleanspy.identity import GrainId, GrainKey
from orleanspy.messaging.message import Message, MessageKind
from orleanspy.messaging.pending import PendingCalls
from orleanspy.messaging.remote_errors import result_of
from orleanspy.options import MessagingOptions
from orleanspy.reference import GrainFactory
from orleanspy.remindable.management import ReminderManagementGrain, management
from orleanspy.serialization import Codec, DecodeLimits
from orleanspy.tables import TableConnections, table_backend

if TYPE_CHECKING:
    from orleanspy._otel import Tracer
    from orleanspy.membership.table import MembershipTable
    from orleanspy.messaging.transport import GatewayConnection, GatewayConnector

__all__ = ["ClusterClient"]

log = logging.getLogger(__name__)

G = TypeVar("G", bound=Grain)


class _State(enum.Enum):
    CREATED = 1
    OPEN = 2
    CLOSED = 3


class ClusterClient:
    """A client of a cluster; an async context manager (``async with``).

    Gateways come from the membership table at ``redis_url`` (``cluster_id``,
    ``service_id`` as the silos use; a ``postgresql://`` URL works too, as
    does the keyword ``membership_url``), or from a fixed ``gateways`` list of
    ``host:port`` endpoints. A closed client cannot be reopened.

    ``secret`` is the cluster secret the gateways require (the same as
    ``options=MessagingOptions(cluster_secret=...)``). ``ClusterClient.from_env()``
    reads the settings from the environment variables the CLI reads, the secret
    and TLS included (``messaging_from_env``).

    ``connector`` makes its gateway connections (a ``GatewayConnector``; gRPC
    by default, ``InMemoryNetwork.connector()`` for silos on an in-memory
    transport in the same process).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        cluster_id: str = "dev",
        service_id: str = "default",
        *,
        gateways: Sequence[str] | None = None,
        options: MessagingOptions | None = None,
        gateway_refresh: timedelta = timedelta(seconds=10),
        membership_table: MembershipTable | None = None,
        membership_url: str | None = None,
        connector: GatewayConnector | None = None,
        secret: str | None = None,
    ) -> None:
        if secret is not None:
            options = _with_secret(options or MessagingOptions(), secret)
        url = membership_url or redis_url
        if url is None and gateways is None and membership_table is None:
            raise ValueError(
                "ClusterClient needs membership_url (or redis_url), a membership_table or gateways"
            )
        if url is not None:
            table_backend(url)  # a clear error for an unknown scheme, before start()
        self._redis_url = url
        self._cluster_id = cluster_id
        self._service_id = service_id
        self._static = list(gateways) if gateways is not None else None
        self._options = options or MessagingOptions()
        self._refresh_every = gateway_refresh.total_seconds()
        self._table = membership_table
        self._connector = connector
        self._state = _State.CREATED
        self._tracing: Tracer | None = None
        self._stack = AsyncExitStack()
        self._client_id = f"client-{os.getpid()}-{os.urandom(6).hex()}"
        self._connections: dict[str, GatewayConnection] = {}
        # The open connections in rotation order; None after _connections changed.
        self._live: list[tuple[str, GatewayConnection]] | None = None
        self._round_robin = itertools.count()
        self._pending: PendingCalls[Message] = PendingCalls(
            self._options.response_timeout.total_seconds()
        )
        self._factory = GrainFactory(self)
        self._codec = Codec(
            reference_factory=self._factory.reference, limits=DecodeLimits.of(self._options)
        )
        self._refresh_now = asyncio.Event()
        self._refresh_lock = asyncio.Lock()
        self._timeout_ms = int(self._options.response_timeout.total_seconds() * 1000)
        self._last_connect_error: Exception | None = None
        # Gateways that refused this client's secret, since the last success.
        self._refused_by: set[str] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """A client configured as the CLI is: ``ORLEANSPY_MEMBERSHIP_URL``, else
        ``ORLEANSPY_STORAGE_URL``, else ``ORLEANSPY_REDIS_URL`` (where gateways
        are found), ``ORLEANSPY_CLUSTER_ID`` (``dev``), ``ORLEANSPY_SERVICE_ID``
        (``default``), and the messaging options of ``messaging_from_env`` (the
        cluster secret or its file, TLS); a setting the environment leaves out
        comes from the silos' TOML file named by ``ORLEANSPY_CONFIG``, if any.
        Keyword arguments win over both; ``environ`` defaults to ``os.environ``.
        Nothing is read unless this is called (the constructor never reads the
        environment). A bad value is a ``ConfigurationError`` naming its variable
        or key."""
        from orleanspy._cli_config import connection_values

        env = os.environ if environ is None else environ
        file = connection_values(_config_file(env))
        settings: dict[str, Any] = {}
        url: object = next((env[k] for k in _URL_VARIABLES if env.get(k)), None)
        if url is None:
            url = next((file[k][0] for k in _URL_KEYS if k in file), None)
        if url is not None:
            settings["membership_url"] = url
        for key, variable in (
            ("cluster_id", "ORLEANSPY_CLUSTER_ID"),
            ("service_id", "ORLEANSPY_SERVICE_ID"),
        ):
            if env.get(variable):
                settings[key] = env[variable]
            elif key in file:
                settings[key] = file[key][0]
        settings["options"] = cls.messaging_from_env(env)
        settings.update(overrides)
        return cls(**settings)

    @staticmethod
    def messaging_from_env(environ: Mapping[str, str] | None = None) -> MessagingOptions:
        """The messaging options the CLI gives a command that connects to a
        cluster, for a client or a silo this process makes: the cluster secret
        (``ORLEANSPY_CLUSTER_SECRET``, or the file ``ORLEANSPY_CLUSTER_SECRET_FILE``
        names), TLS (``ORLEANSPY_MESSAGING_TLS_CERT_FILE``, ``..._KEY_FILE``,
        ``..._CA_FILE``), any other ``ORLEANSPY_MESSAGING_...`` key, and what
        the environment leaves out from the ``[messaging]`` keys of the file
        ``ORLEANSPY_CONFIG`` names. ``environ`` defaults to ``os.environ``."""
        from orleanspy._cli_config import client_messaging

        env = os.environ if environ is None else environ
        return client_messaging(_config_file(env), env)

    # -- lifecycle ----------------------------------------------------------------------

    def _not_open(self) -> ClosedError:
        if self._state is _State.CREATED:
            return ClosedError(
                "the ClusterClient is not open, it was never started: use `async with "
                "ClusterClient(...) as client:` (or `await client.start()` first)"
            )
        return ClosedError(
            "the ClusterClient is not open, it was closed and does not reopen: make a new "
            "one (`async with ClusterClient(...) as client:` scopes it)"
        )

    async def start(self) -> None:
        """Connect to the gateways. ``AuthenticationError`` ("refused: wrong or
        missing cluster secret") if a gateway refused this client's secret and
        none accepted it; ``SiloUnavailableError`` if none could be reached,
        chained (``__cause__``) to the last connection error."""
        if self._state is not _State.CREATED:
            raise ClosedError("a ClusterClient starts once")
        self._state = _State.OPEN
        # Whether this process traces: a tracer provider set by now counts.
        self._tracing = tracing.refresh()
        try:
            if self._static is None and self._table is None:
                assert self._redis_url is not None
                self._table = await TableConnections(self._stack).membership_table(
                    self._redis_url, cluster_id=self._cluster_id, service_id=self._service_id
                )
            if self._table is not None:
                await self._table.start(self._stack)
            self._stack.push_async_callback(self._close_connections)
            await self._refresh()
            if not self._connections:
                if self._refused_by:
                    # A refused secret must not read as an outage.
                    raise AuthenticationError(
                        "refused: wrong or missing cluster secret (MessagingOptions."
                        "cluster_secret, --secret); refused by gateway "
                        f"{', '.join(sorted(self._refused_by))}"
                    ) from self._last_connect_error
                raise SiloUnavailableError(
                    f"no gateway of the cluster could be reached: {await self._why_no_gateway()}"
                ) from self._last_connect_error
            task = asyncio.get_running_loop().create_task(self._refresher())
            self._stack.push_async_callback(_cancel, task)
        except BaseException:
            await self.aclose()
            raise

    async def _why_no_gateway(self) -> str:
        if self._redis_url is None:
            listed = ", ".join(self._static or ())
            return f"none of the gateways {listed} answered" if listed else "none is listed"
        if table_backend(self._redis_url) != "redis":
            # The Redis-only explanation reads membership records straight from Redis.
            return (
                f"no Active silo of cluster id {self._cluster_id!r}, service id "
                f"{self._service_id!r} with a gateway answered"
            )
        from orleanspy.cluster_status import explain_no_gateway

        return await explain_no_gateway(
            self._redis_url, cluster_id=self._cluster_id, service_id=self._service_id
        )

    async def aclose(self) -> None:
        """Close every gateway connection; pending calls fail with ``ClosedError``."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        await self._stack.aclose()
        await self._pending.close(ClosedError("the client was closed"))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- grains -------------------------------------------------------------------------

    @overload
    def get_grain(self, grain: type[G], key: GrainKey) -> G: ...
    @overload
    def get_grain(self, grain: str, key: GrainKey) -> Any: ...
    def get_grain(self, grain: type[G] | str, key: GrainKey) -> Any:
        """A proxy for ``(grain, key)``: typed for a class, untyped for a type name."""
        if self._state is not _State.OPEN:
            raise self._not_open()
        return self._factory.get_grain(grain, key)

    @property
    def reminders(self) -> ReminderManagementGrain:
        """The reminder management grain (its one-grain methods also take a
        ``(grain class, key)`` pair: ``remindable.management.ReminderManagement``)."""
        return management(self.get_grain(ReminderManagementGrain, ""))

    @property
    def membership_url(self) -> str | None:
        """The URL of the membership table the gateways come from (``None``: given otherwise)."""
        return self._redis_url

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def service_id(self) -> str:
        return self._service_id

    @property
    def gateways(self) -> list[str]:
        """Endpoints of the gateways this client is connected to."""
        return sorted(self._connections)

    async def invoke(
        self,
        grain_id: GrainId,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        one_way: bool = False,
    ) -> Any:
        """Send a call through a gateway (see ``CallInvoker``)."""
        if self._state is not _State.OPEN:
            raise self._not_open()
        tracer = self._tracing
        if tracer is None:
            return await self._send(grain_id, method, args, kwargs, one_way, None)
        # The caller's span; its context travels in the message (W3C traceparent).
        with tracer.call(grain_id, method):
            return await self._send(grain_id, method, args, kwargs, one_way, tracer)

    async def _send(  # noqa: PLR0917 (invoke's arguments)
        self,
        grain_id: GrainId,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        one_way: bool,
        tracer: Tracer | None,
    ) -> Any:
        live = self._live
        if live:
            endpoint, conn = live[next(self._round_robin) % len(live)]
            if conn.closed:
                endpoint, conn = await self._pick()
        else:
            endpoint, conn = await self._pick()
        msg = Message.request(
            grain_id,
            method,
            self._codec.encode((args, kwargs)),
            one_way=one_way,
            expires_at_ms=time.time_ns() // 1_000_000 + self._timeout_ms,
        )
        if tracer is not None:
            tracer.inject(msg.headers)
        if one_way:
            conn.send(msg)
            return None
        fut = self._pending.add(msg.id, grain_id, method, endpoint)
        try:
            conn.send(msg)
            response = await fut
        finally:
            self._pending.discard(msg.id)
        return result_of(response, self._codec)

    # -- gateways -----------------------------------------------------------------------

    async def _pick(self) -> tuple[str, GatewayConnection]:
        for attempt in range(2):
            self._live = live = [(e, c) for e, c in self._connections.items() if not c.closed]
            if live:
                return live[next(self._round_robin) % len(live)]
            if attempt == 0:
                await self._refresh()
        raise SiloUnavailableError("no gateway of the cluster is reachable")

    async def _endpoints(self) -> list[str]:
        if self._static is not None:
            return list(self._static)
        assert self._table is not None
        snapshot = await self._table.read_all()
        return [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in snapshot.gateways()]

    async def _refresh(self) -> None:
        """Connect to gateways we do not have; drop those no longer listed."""
        connector = self._connector
        if connector is None:
            from orleanspy.messaging.grpc import GrpcGatewayConnection

            connector = self._connector = GrpcGatewayConnection

        async with self._refresh_lock:
            try:
                wanted = set(await self._endpoints())
            except Exception as exc:
                log.warning("gateway list unavailable error=%r", exc)
                return
            for endpoint in [e for e in self._connections if e not in wanted]:
                self._live = None
                with contextlib.suppress(Exception):
                    await self._connections.pop(endpoint).aclose()

            async def open_one(endpoint: str) -> None:
                conn = connector(
                    endpoint,
                    client_id=self._client_id,
                    options=self._options,
                    on_message=self._on_message,
                    on_closed=lambda error: self._on_closed(endpoint, conn, error),
                )
                try:
                    await conn.connect()
                except Exception as exc:
                    log.info("gateway unreachable endpoint=%s error=%r", endpoint, exc)
                    self._last_connect_error = exc
                    if isinstance(exc, AuthenticationError):
                        self._refused_by.add(endpoint)
                    return
                self._connections[endpoint] = conn
                self._live = None

            missing = [e for e in wanted if e not in self._connections]
            await asyncio.gather(*(open_one(e) for e in missing))

    async def _refresher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_every):
                    await self._refresh_now.wait()
            self._refresh_now.clear()
            await self._refresh()

    def _on_message(self, message: Message) -> None:
        if message.kind is not MessageKind.RESPONSE:
            return
        self._pending.resolve(message.correlation_id, message)

    def _on_closed(self, endpoint: str, conn: GatewayConnection, error: Exception | None) -> None:
        if self._connections.get(endpoint) is conn:
            del self._connections[endpoint]
        self._live = None
        if self._state is not _State.OPEN:
            return
        # Calls still queued never left: they go through another gateway. Calls
        # already written may have run, so they fail rather than run twice.
        self._resend(conn.take_unsent(), endpoint)
        self._pending.fail_where(
            lambda tag: tag == endpoint,
            SiloUnavailableError(f"gateway {endpoint} went away: {error!r}"),
        )
        self._refresh_now.set()

    def _resend(self, unsent: list[Message], gone: str) -> None:
        live = [(e, c) for e, c in self._connections.items() if not c.closed and e != gone]
        if not unsent or not live:
            return
        for message in unsent:
            endpoint, conn = live[next(self._round_robin) % len(live)]
            conn.send(message)
            self._pending.retag(message.id, endpoint)
        log.info("resent unsent calls count=%d from=%s", len(unsent), gone)

    async def _close_connections(self) -> None:
        conns = list(self._connections.values())
        self._connections.clear()
        self._live = None
        await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)


_URL_VARIABLES = ("ORLEANSPY_MEMBERSHIP_URL", "ORLEANSPY_STORAGE_URL", "ORLEANSPY_REDIS_URL")
# The same, as keys of a silo's TOML file.
_URL_KEYS = ("membership_url", "storage_url", "redis_url")


def _config_file(env: Mapping[str, str]) -> Path | None:
    path = env.get("ORLEANSPY_CONFIG")
    return Path(path) if path else None


def _with_secret(options: MessagingOptions, secret: str) -> MessagingOptions:
    if options.cluster_secret not in (None, secret):
        raise ConfigurationError(
            "ClusterClient: secret= and options.cluster_secret differ; give one of them"
        )
    return dataclasses.replace(options, cluster_secret=secret)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
