"""An in-process transport: several silos (and clients) in one event loop.

``InMemoryNetwork`` is the hub; each ``InMemoryTransport`` registers its address
there when started. Nothing is serialized and nothing is copied: the receiving
sink gets the very ``Message`` object that was sent, so a sender must not touch
a message after sending it (the gRPC transport would not see later changes
either). Only the gateway path makes a shallow copy, because the gateway
stamps ``sender_client``/``sender_silo`` and must not alter the client's object.

Every delivery, and every ``undeliverable`` callback, happens from
``loop.call_soon``, never inside ``send``: the ordering and re-entrancy a
dispatcher sees match a real network. Messages between two silos arrive in the
order sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack

from orleanspy.errors import ClosedError, SiloUnavailableError
from orleanspy.identity import SiloAddress
from orleanspy.messaging.message import Message
from orleanspy.messaging.transport import GatewayConnection, GatewayConnector, MessageSink
from orleanspy.options import MessagingOptions

__all__ = ["InMemoryGatewayConnection", "InMemoryNetwork", "InMemoryTransport"]

log = logging.getLogger(__name__)

_generations = itertools.count(1)


class InMemoryNetwork:
    """The hub that in-memory transports and gateway connections meet in."""

    def __init__(self) -> None:
        self._silos: dict[SiloAddress, InMemoryTransport] = {}
        self._gateways: dict[str, InMemoryTransport] = {}

    def kill(self, address: SiloAddress) -> bool:
        """Simulate a crash of ``address``: it stops receiving and sending, its
        pings fail and its gateway clients are closed with ``SiloUnavailableError``.
        Returns ``False`` if no live silo had that address."""
        transport = self._silos.get(address)
        if transport is None:
            return False
        transport._die(SiloUnavailableError(f"silo {address}: killed"))
        return True

    def connector(self) -> GatewayConnector:
        """A ``GatewayConnector`` for this network (``ClusterClient(connector=...)``)."""

        def connect(
            endpoint: str,
            *,
            client_id: str,
            options: MessagingOptions,
            on_message: Callable[[Message], None],
            on_closed: Callable[[Exception | None], None],
        ) -> GatewayConnection:
            return InMemoryGatewayConnection(
                self,
                endpoint,
                client_id=client_id,
                options=options,
                on_message=on_message,
                on_closed=on_closed,
            )

        return connect

    def alive(self, address: SiloAddress) -> bool:
        """Whether a started, not killed or stopped silo has exactly ``address``."""
        return address in self._silos

    def _join(self, transport: InMemoryTransport) -> None:
        address = transport.address
        if address in self._silos:
            raise RuntimeError(f"address {address} is already in use on this network")
        self._silos[address] = transport
        if transport.gateway_port is not None:
            self._gateways[address.endpoint] = transport

    def _leave(self, transport: InMemoryTransport) -> None:
        address = transport.address
        if self._silos.get(address) is transport:
            del self._silos[address]
        if self._gateways.get(address.endpoint) is transport:
            del self._gateways[address.endpoint]


class InMemoryTransport:
    """``Transport`` for silos in one process (see the module docstring).

    ``port`` only names the silo; ``gateway=True`` makes it accept
    ``InMemoryGatewayConnection`` clients at ``address.endpoint``.
    """

    def __init__(
        self,
        network: InMemoryNetwork,
        *,
        host: str = "memory",
        port: int,
        gateway: bool = False,
        generation: int | None = None,
    ) -> None:
        self._network = network
        self._address = SiloAddress(
            host, port, generation if generation is not None else next(_generations)
        )
        self._gateway = gateway
        self._sink: MessageSink | None = None
        self._running = False
        self._clients: dict[str, InMemoryGatewayConnection] = {}
        self._gossip_listener: Callable[[int], None] | None = None

    @property
    def address(self) -> SiloAddress:
        return self._address

    @property
    def gateway_port(self) -> int | None:
        return self._address.port if self._gateway else None

    async def start(self, stack: AsyncExitStack, sink: MessageSink) -> None:
        """Join the network; leaving it (and closing clients) is pushed on ``stack``."""
        if self._sink is not None:
            raise RuntimeError("InMemoryTransport.start() may be called once")
        self._sink = sink
        self._network._join(self)
        self._running = True
        stack.callback(self._die, SiloUnavailableError(f"silo {self._address}: stopped"))

    def send(self, target: SiloAddress, message: Message) -> None:
        """Deliver ``message`` to ``target``'s sink on the next loop iteration,
        or hand it back as undeliverable if ``target`` is not alive then."""
        if not self._running:
            # A stopped or crashed silo sends nothing; its dispatcher is gone too.
            return
        asyncio.get_running_loop().call_soon(self._deliver, target, message)

    def _deliver(self, target: SiloAddress, message: Message) -> None:
        if not self._running:
            return
        peer = self._network._silos.get(target)
        if peer is None or peer._sink is None:
            assert self._sink is not None
            self._sink.undeliverable(message, SiloUnavailableError(f"silo {target}: unreachable"))
            return
        peer._sink.receive(message)

    def send_to_client(self, client_id: str, message: Message) -> None:
        """Deliver to a connected client; an unknown client means a dropped message."""
        client = self._clients.get(client_id)
        if client is None or not self._running:
            log.debug("dropping message for absent client client=%s id=%d", client_id, message.id)
            return
        asyncio.get_running_loop().call_soon(client._deliver, message)

    async def ping(self, target: SiloAddress, timeout: float, table_version: int = 0) -> bool:
        """``True`` while ``target`` is alive on the network (and this silo is);
        a non-zero ``table_version`` reaches its gossip listener before this
        returns, as over gRPC, where the peer hears it before it answers."""
        if not (self._running and self._network.alive(target)):
            return False
        peer = self._network._silos.get(target)
        if table_version and peer is not None and peer._gossip_listener is not None:
            # A hop later, as over a network: never on the caller's stack. The
            # yield lets that hop run before the answer comes back.
            asyncio.get_running_loop().call_soon(peer._gossip_listener, table_version)
            await asyncio.sleep(0)
        return True

    def on_gossip(self, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(table_version)`` for every ping that carries one."""
        self._gossip_listener = listener

    def disconnect(self, target: SiloAddress) -> None:
        """Nothing to drop: there are no connections and no queues to hand back."""

    def _die(self, error: Exception) -> None:
        if not self._running:
            return
        self._running = False
        self._network._leave(self)
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            client._finish(error)

    def _client_message(self, client_id: str, message: Message) -> None:
        if not self._running or self._clients.get(client_id) is None:
            return
        assert self._sink is not None
        stamped = dataclasses.replace(message, sender_client=client_id, sender_silo=self._address)
        self._sink.receive(stamped)


class InMemoryGatewayConnection:
    """A client's connection to an ``InMemoryTransport`` gateway: a
    ``transport.GatewayConnection`` (``endpoint`` is the gateway's
    ``address.endpoint``). ``network.connector()`` makes them for
    ``ClusterClient(connector=...)``; ``options`` is accepted for that shape
    (nothing is encoded, so no size limit applies)."""

    def __init__(
        self,
        network: InMemoryNetwork,
        endpoint: str,
        *,
        client_id: str,
        on_message: Callable[[Message], None],
        on_closed: Callable[[Exception | None], None],
        options: MessagingOptions | None = None,
    ) -> None:
        self._network = network
        self._endpoint = endpoint
        self._client_id = client_id
        self._on_message = on_message
        self._on_closed = on_closed
        self._gateway: InMemoryTransport | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def gateway(self) -> SiloAddress | None:
        return self._gateway.address if self._gateway is not None else None

    async def __aenter__(self) -> InMemoryGatewayConnection:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Attach to the gateway; ``SiloUnavailableError`` if none is alive there."""
        if self._closed or self._gateway is not None:
            raise ClosedError("an InMemoryGatewayConnection connects once")
        gateway = self._network._gateways.get(self._endpoint)
        if gateway is None:
            self._closed = True
            raise SiloUnavailableError(f"gateway {self._endpoint}: unreachable")
        previous = gateway._clients.get(self._client_id)
        gateway._clients[self._client_id] = self
        if previous is not None:
            previous._finish(SiloUnavailableError("replaced by a newer connection"))
        self._gateway = gateway

    def send(self, message: Message) -> None:
        """Queue ``message`` for the gateway; ``ClosedError`` once closed."""
        if self._closed or self._gateway is None:
            raise ClosedError("gateway connection is closed")
        asyncio.get_running_loop().call_soon(
            self._gateway._client_message, self._client_id, message
        )

    def take_unsent(self) -> list[Message]:
        """Nothing: a message is handed to the gateway's loop as it is sent."""
        return []

    async def aclose(self) -> None:
        """Detach; ``on_closed(None)`` if it was still open."""
        self._finish(None)

    def _deliver(self, message: Message) -> None:
        if not self._closed:
            self._on_message(message)

    def _finish(self, error: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        gateway = self._gateway
        if gateway is not None and gateway._clients.get(self._client_id) is self:
            del gateway._clients[self._client_id]
        self._on_closed(error)
