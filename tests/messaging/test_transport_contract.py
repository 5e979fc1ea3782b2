"""The transport contract (``messaging.transport``): both gateway connections
satisfy ``GatewayConnection``, the extras are named protocols, and a
``ClusterClient`` runs over the in-memory connection as over gRPC."""

from __future__ import annotations

from orleanspy import ClusterClient, Grain, Silo, SiloOptions
from orleanspy.directory.memory import InMemoryGrainDirectory
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.messaging.grpc import GrpcGatewayConnection, GrpcTransport
from orleanspy.messaging.memory import InMemoryGatewayConnection, InMemoryNetwork, InMemoryTransport
from orleanspy.messaging.transport import (
    AnswersOnly,
    ConnectionLossListener,
    GatewayConnection,
    PeerCounters,
    QueueDepths,
    Transport,
    WireCounters,
)
from orleanspy.options import MessagingOptions
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.runtime.dispatcher import Dispatcher
from orleanspy.streams.memory import InMemoryStreamProvider


class EchoGrain(Grain, type_name="test_transport_contract.Echo"):
    async def echo(self, value: str) -> str:
        return f"{value} from {self.grain_id.key}"


def _noop(*_: object) -> None:
    return None


def test_both_gateway_connections_are_gateway_connections() -> None:
    grpc = GrpcGatewayConnection(
        "127.0.0.1:1",
        client_id="c",
        options=MessagingOptions(),
        on_message=_noop,
        on_closed=_noop,
    )
    memory = InMemoryNetwork().connector()(
        "memory:1",
        client_id="c",
        options=MessagingOptions(),
        on_message=_noop,
        on_closed=_noop,
    )
    assert isinstance(memory, InMemoryGatewayConnection)
    for connection in (grpc, memory):
        assert isinstance(connection, GatewayConnection)
        assert not connection.closed and connection.gateway is None
        assert connection.take_unsent() == []


def test_the_extras_are_named_protocols() -> None:
    grpc = GrpcTransport(host="127.0.0.1", port=0, gateway_port=None, options=MessagingOptions())
    memory = InMemoryTransport(InMemoryNetwork(), port=1)
    assert isinstance(memory, Transport)  # (GrpcTransport.address is known once started)
    for extra in (AnswersOnly, WireCounters, PeerCounters, QueueDepths):
        assert isinstance(grpc, extra), extra
        assert not isinstance(memory, extra), extra
    assert issubclass(Dispatcher, ConnectionLossListener)


async def test_a_cluster_client_calls_through_an_in_memory_gateway() -> None:
    network = InMemoryNetwork()
    transport = InMemoryTransport(network, port=7, gateway=True)
    silo = Silo(
        SiloOptions(grain_types=(EchoGrain,)),
        transport=transport,
        membership_table=InMemoryMembershipTable(),
        directory=InMemoryGrainDirectory(),
        reminder_table=InMemoryReminderTable(),
        streams=InMemoryStreamProvider(),
    )
    async with silo:
        client = ClusterClient(gateways=[transport.address.endpoint], connector=network.connector())
        async with client:
            assert await client.get_grain(EchoGrain, "k").echo("hi") == "hi from k"
            assert client.gateways == [transport.address.endpoint]
