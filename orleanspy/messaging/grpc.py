"""The gRPC transport: silo-to-silo streams, the gateway for clients, pings.

This is the only module that imports ``grpc``: it holds the servers, channels
and streams. The generated protobuf code is imported here (for pings) and by
``frames.py``, the codec of the frames on the streams. The gateway's per-client
state and the credit owed to peer silos live in ``gateway.py``, without gRPC.

Wire shape
    Each silo opens one ``SiloService.Connect`` stream per peer, lazily on the
    first send, and writes only its own messages on it; the peer answers over
    its own outbound stream (a response is just a message addressed to the
    request's ``sender_silo``). Every stream frame is a ``Batch`` of envelopes:
    a per-peer writer task drains up to ``max_batch`` queued messages into one
    frame per write, so a busy stream pays gRPC's per-frame cost once for many
    messages, while a lone message still leaves at once (no delay is added).

Handshake
    The server answers a ``Connect`` call with initial metadata naming its own
    address before the caller writes anything, so an unreachable peer or a
    refused secret is known before any message is committed to the stream.

Versions
    Every call's metadata carries the protocol window its side speaks
    (``x-orleanspy-protocol: 1-2``, ``orleanspy.versions``), and a server's
    initial metadata its own; a side that sends none is 0.1.x (protocol 1). A
    server refuses a ``Connect`` whose window does not overlap its own, or is
    malformed, with ``FAILED_PRECONDITION`` and a message naming both windows;
    the caller raises ``IncompatibleVersionError`` with it (and checks the
    server's window itself, since a 0.1.x server checks nothing). A link knows
    the newest protocol both ends speak (``_PeerLink.protocol``).

Failures
    Messages that were queued and not written when a stream fails (or when
    ``disconnect`` is called) go to ``MessageSink.undeliverable`` with
    ``SiloUnavailableError`` (``AuthenticationError`` when the peer refused the
    cluster secret). There are no acknowledgements: a message written just
    before a connection broke may be lost, and the caller's response timeout
    covers it. The next send reconnects.

Untrusted input
    A frame larger than ``max_message_size`` plus headroom is refused by gRPC
    (``RESOURCE_EXHAUSTED``). A frame that does not parse, or holds more than
    ``max_frame_items`` envelopes and header entries (counted before it is
    decoded), aborts that stream with ``INVALID_ARGUMENT``; an
    envelope that parses but is invalid (bad grain id, unknown kind), whose body
    exceeds ``max_message_size``, or which names another generation of this silo
    as its target is answered with a ``REJECTED`` response when it is a request,
    and dropped with a log line otherwise. The response carries an error payload
    encoded like every other error: ``MessageRejectedError`` with the reason, or
    ``SiloRestartedError`` for an earlier incarnation, which tells the sender to
    re-resolve the grain.

Lost connections
    When a peer link fails or is disconnected, the sink's optional
    ``connection_lost(target, error)`` is called after its unwritten messages
    went to ``undeliverable``: whatever was written on that link is now in doubt,
    and the dispatcher fails (or, once the peer is known dead, re-routes) it.
    The log says so once per change of a peer's state: a WARNING when its link
    goes down, an INFO when it is up again (or the peer left the cluster) with
    how many messages failed meanwhile; never a line per message.

Probes
    ``probe`` tells a refused connection (nothing listens on the peer's port:
    its process is gone from a live host) from silence (a timeout, a host or
    route that is gone): after a failed ping it tries a plain TCP connect to
    the port, so the verdict does not depend on gRPC's error texts.

gRPC's own logging
    Its C core writes to stderr by itself (``Got goaway``, ``add_port.cc``);
    importing this module sets ``GRPC_VERBOSITY=NONE`` unless the environment
    already sets it, so those lines appear only when asked for. Every error
    that matters reaches orleanspy's own log through the translated exceptions.
    (The setting lives in ``orleanspy.messaging``'s ``__init__``, which runs
    before this module imports grpc.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from orleanspy._tasks import raise_if_cancelled
from orleanspy.errors import (
    AuthenticationError,
    ClosedError,
    MessageRejectedError,
    SiloRestartedError,
    SiloUnavailableError,
)
from orleanspy.identity import SiloAddress
from orleanspy.messaging._generated import messages_pb2 as pb
from orleanspy.messaging.frames import (
    FrameCodec,
    InvalidEnvelope,
    Outbox,
    WireStats,
    parse,
    unencodable,
)
from orleanspy.messaging.gateway import ClientLink, ClientRegistry, PeerCredit
from orleanspy.messaging.message import Message, MessageKind
from orleanspy.messaging.remote_errors import error_payload
from orleanspy.messaging.transport import MessageSink, ProbeOutcome
from orleanspy.options import MessagingOptions, TlsOptions
from orleanspy.serialization import pack
from orleanspy.versions import IncompatibleVersionError, ProtocolWindow, incompatibility

__all__ = ["GrpcGatewayConnection", "GrpcTransport", "WireStats"]

log = logging.getLogger(__name__)

SECRET_HEADER = "x-orleanspy-secret"
CLIENT_HEADER = "x-orleanspy-client"
SILO_HEADER = "x-orleanspy-silo"
PROTOCOL_HEADER = "x-orleanspy-protocol"
_MY_WINDOW = ProtocolWindow.mine()

_SILO_CONNECT = "/orleanspy.v1.SiloService/Connect"
_SILO_PING = "/orleanspy.v1.SiloService/Ping"
_GATEWAY_CONNECT = "/orleanspy.v1.GatewayService/Connect"

# Room for envelope fields and frame overhead on top of the largest body allowed.
_HEADROOM = 1 << 20
_CONNECT_TIMEOUT = 5.0
_STOP_FLUSH_TIMEOUT = 2.0
_MAX_CLIENT_ID = 256
_BAD_FRAME = "malformed Batch frame, or more than max_frame_items envelopes and headers"
# grpc-stubs lacks the aio EOF sentinel.
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
_Context = grpc.aio.ServicerContext[Any, Any]


def _read_pem(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _channel_options(options: MessagingOptions) -> list[tuple[str, Any]]:
    result: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", options.max_message_size + _HEADROOM),
        ("grpc.max_send_message_length", -1),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A restarted peer should be reachable again in well under a probe interval.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.enable_retries", 0),
        # Each peer gets its own TCP connection rather than sharing a subchannel.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if options.tls is not None and options.tls.server_name:
        result.append(("grpc.ssl_target_name_override", options.tls.server_name))
    return result


def _server_options(options: MessagingOptions) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", options.max_message_size + _HEADROOM),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]


def _open_channel(endpoint: str, options: MessagingOptions) -> grpc.aio.Channel:
    tls = options.tls
    if tls is None:
        return grpc.aio.insecure_channel(endpoint, options=_channel_options(options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_pem(tls.ca_file),
        private_key=_read_pem(tls.key_file),
        certificate_chain=_read_pem(tls.cert_file),
    )
    return grpc.aio.secure_channel(endpoint, credentials, options=_channel_options(options))


def _bind(server: grpc.aio.Server, host: str, port: int, tls: TlsOptions | None) -> int:
    endpoint = SiloAddress(host, port).endpoint
    if tls is None:
        bound = server.add_insecure_port(endpoint)
    else:
        credentials = grpc.ssl_server_credentials(
            [(_read_pem(tls.key_file), _read_pem(tls.cert_file))],
            root_certificates=_read_pem(tls.ca_file),
            require_client_auth=True,
        )
        bound = server.add_secure_port(endpoint, credentials)
    if not bound:
        raise OSError(f"cannot listen on {endpoint}")
    return bound


def _metadata(options: MessagingOptions, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    mine = (PROTOCOL_HEADER, _MY_WINDOW.text())
    if options.cluster_secret is None:
        return (mine, *extra)
    return ((SECRET_HEADER, options.cluster_secret), mine, *extra)


def _served_metadata(address: str) -> tuple[tuple[str, str], ...]:
    """A server's initial metadata: who it is, and the protocols it speaks."""
    return ((SILO_HEADER, address), (PROTOCOL_HEADER, _MY_WINDOW.text()))


def _peer_window(metadata: Any, who: str) -> ProtocolWindow:
    """The window ``metadata`` declares (none: 0.1.x's, protocol 1);
    ``IncompatibleVersionError`` if it is malformed or shares no protocol with
    this release's, with a message naming both."""
    try:
        theirs = ProtocolWindow.parse(_header(metadata, PROTOCOL_HEADER))
    except IncompatibleVersionError as exc:
        raise IncompatibleVersionError(f"{who}: {exc}") from None
    why = incompatibility(_MY_WINDOW, theirs, who)
    if why is not None:
        raise IncompatibleVersionError(why)
    return theirs


def _stream_call(channel: grpc.aio.Channel, path: str, metadata: Any) -> Any:
    """A raw-bytes bidi call, written with ``call.write`` (no request iterator)."""
    return channel.stream_stream(path, None, None)(None, metadata=metadata)


def _authorized(options: MessagingOptions, context: _Context) -> bool:
    secret = options.cluster_secret
    if secret is None:
        return True
    for key, value in context.invocation_metadata() or ():
        if key == SECRET_HEADER:
            presented = value.encode() if isinstance(value, str) else bytes(value)
            return hmac.compare_digest(presented, secret.encode())
    return False


#: The principal of a gateway client that proved the cluster secret (and no
#: client certificate): whoever holds the secret.
SECRET_PRINCIPAL = "cluster-secret"
#: The principal of a gateway client on a cluster with neither secret nor TLS.
ANONYMOUS_PRINCIPAL = "anonymous"
_MAX_PRINCIPAL = 256


def client_principal(options: MessagingOptions, context: _Context) -> str:
    """Who a gateway client is, from what this connection authenticated (never
    from anything the client sends): ``tls:<certificate subject>`` under mutual
    TLS, ``cluster-secret`` when it proved the cluster secret, else
    ``anonymous``. The management grain's audit log records it."""
    if options.tls is not None:
        auth = context.auth_context() or {}
        for key in ("x509_subject", "x509_common_name"):
            values = list(auth.get(key) or ())
            if values:
                subject = bytes(values[0]).decode(errors="replace")
                return "tls:" + "".join(c for c in subject if c.isprintable())[:_MAX_PRINCIPAL]
    if options.cluster_secret is not None:
        return SECRET_PRINCIPAL
    return ANONYMOUS_PRINCIPAL


def _header(metadata: Any, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v if isinstance(v, str) else bytes(v).decode(errors="replace")
    return None


async def _handshake(call: Any, what: str) -> tuple[str, int]:
    """Wait for the server's initial metadata; return the silo it names and the
    newest protocol both ends speak.

    Raises ``AuthenticationError`` when the server refused the secret,
    ``IncompatibleVersionError`` when either side refused the other's protocol
    window, and ``SiloUnavailableError`` for anything else that ended the call
    first.
    """
    try:
        async with asyncio.timeout(_CONNECT_TIMEOUT):
            metadata = await call.initial_metadata()
            silo = _header(metadata, SILO_HEADER)
            if silo is not None:
                try:
                    window = _peer_window(metadata, what)
                except IncompatibleVersionError:
                    call.cancel()
                    raise
                return silo, _MY_WINDOW.common(window)
            code = await call.code()
            details = await call.details()
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details()
    except TimeoutError:
        call.cancel()
        raise SiloUnavailableError(f"{what}: no answer within {_CONNECT_TIMEOUT} s") from None
    raise _call_error(what, code, details)


def _call_error(what: str, code: grpc.StatusCode | None, details: str | None) -> Exception:
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(f"{what}: refused: wrong or missing cluster secret")
    if code == grpc.StatusCode.FAILED_PRECONDITION and details and "protocol" in details:
        return IncompatibleVersionError(f"{what} refused this side's protocol: {details}")
    name = code.name if code is not None else "UNKNOWN"
    return SiloUnavailableError(f"{what}: {name} {details or ''}".rstrip())


def _error_of(exc: BaseException, what: str) -> Exception:
    if isinstance(exc, AuthenticationError | SiloUnavailableError | IncompatibleVersionError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        return _call_error(what, exc.code(), exc.details())
    return SiloUnavailableError(f"{what}: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------ silo outbound


class _PeerLink:
    """This silo's outbound stream to one peer: connect, write frames, watch.

    The link lives from the first send until the stream fails or the peer is
    disconnected; then it hands back what it did not write and is forgotten,
    so the next send builds a fresh link (and a fresh channel).
    """

    def __init__(self, transport: GrpcTransport, target: SiloAddress) -> None:
        self.target = target
        self._transport = transport
        peer = transport.peer_stats.setdefault(target, WireStats())
        self.outbox = Outbox(transport._codec, transport._options, transport.stats, peer)
        self._broken: Exception | None = None
        self.closed = False
        #: The newest protocol both ends speak, once the handshake is done.
        self.protocol: int | None = None
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"orleanspy-grpc-peer-{target}"
        )

    def fail(self, error: Exception, *, quiet: bool = False) -> None:
        """Stop the link and hand everything unwritten to the sink with ``error``
        (``quiet``: the caller logs the peer's state itself)."""
        if self.closed:
            return
        self.closed = True
        self._transport._forget(self)
        self.task.cancel()
        undelivered = self.outbox.take_all()
        if not quiet:
            self._transport._link_down(self.target, error, len(undelivered))
        sink = self._transport._sink
        assert sink is not None
        for message in undelivered:
            sink.undeliverable(message, error)
        _connection_lost(sink, self.target, error)

    async def _run(self) -> None:
        what = f"silo {self.target}"
        transport = self._transport
        channel = _open_channel(self.target.endpoint, transport._options)
        try:
            # The call names this silo, so the peer can count what it reads per sender.
            call = _stream_call(
                channel,
                _SILO_CONNECT,
                _metadata(
                    transport._options, (SILO_HEADER, transport._codec.text(transport.address))
                ),
            )
            _silo, self.protocol = await _handshake(call, what)
            transport._link_up(self.target)
            watcher = asyncio.create_task(self._watch(call, what))
            try:
                await self.outbox.pump(
                    call.write,
                    lambda: self._broken is not None,
                    functools.partial(transport._credit.written, self.target),
                )
            finally:
                watcher.cancel()
            error: Exception = self._broken or SiloUnavailableError(f"{what}: stream ended")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A failed write says little; the watcher usually knows the status.
            error = self._broken or _error_of(exc, what)
        finally:
            # Closing the channel is awaited even when the link is cancelled,
            # shielded, so that no channel outlives the transport.
            with contextlib.suppress(Exception):
                await asyncio.shield(channel.close(None))
        self.fail(error)

    async def _watch(self, call: Any, what: str) -> None:
        # The server never writes on a silo stream, so read() returns only when
        # the stream ends; that is how an idle link learns its peer is gone.
        try:
            await call.read()
            self._broken = _call_error(what, await call.code(), await call.details())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._broken = _error_of(exc, what)
        self.outbox.wake()


@dataclass(slots=True)
class _Down:
    """A peer whose link is down: since when (monotonic), why, and how many
    messages failed since (the first failure's included)."""

    since: float
    error: Exception
    failed: int


async def _refused(target: SiloAddress, timeout: float) -> bool:
    """Whether a plain TCP connect to ``target``'s port is refused (RST): the
    host is up and nothing listens there. Any other failure, or success, is
    ``False``: a timeout or an unreachable route says nothing about the peer."""
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(target.host, target.port)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


# ---------------------------------------------------------------- transport


class GrpcTransport:
    """``Transport`` over gRPC (see the module docstring for the wire shape).

    ``port`` / ``gateway_port`` of ``0`` pick free ports; ``gateway_port=None``
    runs no gateway. ``address`` is ``(advertised_host or host, bound port,
    generation)``, the generation defaulting to the construction time in ms.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        gateway_port: int | None,
        options: MessagingOptions,
        generation: int | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._gateway_port_request = gateway_port
        self._options = options
        self._generation = generation if generation is not None else time.time_ns() // 1_000_000
        self._advertised_host = advertised_host or host
        self._address: SiloAddress | None = None
        self._gateway_port: int | None = None
        self._codec = FrameCodec()
        self._sink: MessageSink | None = None
        self._links: dict[SiloAddress, _PeerLink] = {}
        self._clients = ClientRegistry()
        self._channels: dict[SiloAddress, grpc.aio.Channel] = {}
        self._stopped = False
        self._gossip_listener: Callable[[int], None] | None = None
        self._down: dict[SiloAddress, _Down] = {}
        self._may_answer: Callable[[SiloAddress], bool] | None = None
        self._timeout_ms = int(options.response_timeout.total_seconds() * 1000)
        # Requests (and one-way messages whose turn has not run) from each peer silo.
        self._credit = PeerCredit(options.max_in_flight, self._timeout_ms)
        #: One-way messages from peers dropped because their sender had
        #: ``max_in_flight`` unsettled messages here.
        self.one_way_refused = 0
        self.stats = WireStats()
        #: Frames and messages written to and read from each peer silo (dropped
        #: on ``disconnect``); read counts come from streams that name their silo.
        self.peer_stats: dict[SiloAddress, WireStats] = {}

    # -- Transport properties

    @property
    def address(self) -> SiloAddress:
        if self._address is None:
            raise RuntimeError("GrpcTransport.address is known once start() returned")
        return self._address

    @property
    def gateway_port(self) -> int | None:
        return self._gateway_port

    # -- lifecycle

    async def start(self, stack: AsyncExitStack, sink: MessageSink) -> None:
        """Bind and serve; push shutdown (stop links, stop servers) onto ``stack``."""
        if self._sink is not None:
            raise RuntimeError("GrpcTransport.start() may be called once")
        self._sink = sink
        options = self._options
        silo_server = grpc.aio.server(options=_server_options(options))
        silo_server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "orleanspy.v1.SiloService",
                    {
                        "Connect": grpc.stream_stream_rpc_method_handler(self._serve_silo),
                        "Ping": grpc.unary_unary_rpc_method_handler(self._serve_ping),
                    },
                ),
            )
        )
        port = _bind(silo_server, self._host, self._port, options.tls)
        self._address = SiloAddress(self._advertised_host, port, self._generation).intern()
        servers = [silo_server]
        if self._gateway_port_request is not None:
            # A separate server, so a client can never reach the silo service.
            gateway = grpc.aio.server(options=_server_options(options))
            gateway.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        "orleanspy.v1.GatewayService",
                        {"Connect": grpc.stream_stream_rpc_method_handler(self._serve_client)},
                    ),
                )
            )
            self._gateway_port = _bind(gateway, self._host, self._gateway_port_request, options.tls)
            servers.append(gateway)
        for server in servers:
            await server.start()
            # No grace: inbound streams never end by themselves (peers keep them
            # open), and every frame read has already been delivered.
            stack.push_async_callback(server.stop, None)
        stack.push_async_callback(self._close_links)
        log.info(
            "grpc transport listening silo=%s gateway_port=%s", self._address, self._gateway_port
        )

    async def _close_links(self) -> None:
        # Flush what is queued (responses above all), bounded, before cutting links.
        outboxes = [link.outbox for link in self._links.values()]
        outboxes += [client.outbox for client in self._clients.links()]
        pending = [box.idle.wait() for box in outboxes if not box.idle.is_set()]
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STOP_FLUSH_TIMEOUT):
                    await asyncio.gather(*pending)
        self._stopped = True
        links = list(self._links.values())
        stopped = SiloUnavailableError("transport stopped")
        for link in links:
            link.fail(stopped)
        clients = self._clients.links()
        for client in clients:
            client.task.cancel()
        tasks = [link.task for link in links] + [c.task for c in clients]
        await asyncio.gather(*tasks, return_exceptions=True)
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(None)

    # -- sending

    def send(self, target: SiloAddress, message: Message) -> None:
        """Queue ``message`` for ``target``; open the link on first use.

        Never raises and never calls the sink re-entrantly: a message that cannot
        be queued (transport stopped, unencodable, body over ``max_message_size``)
        is handed to ``undeliverable`` on the next loop iteration.
        """
        sink = self._sink
        if sink is None or self._stopped:
            self._later(message, SiloUnavailableError("transport not running"))
            return
        if len(message.body) > self._options.max_message_size:
            self._later(
                message,
                MessageRejectedError(
                    f"message body of {len(message.body)} bytes exceeds max_message_size "
                    f"{self._options.max_message_size}"
                ),
            )
            return
        reason = unencodable(message)
        if reason is not None:
            self._later(message, MessageRejectedError(reason))
            return
        link = self._links.get(target)
        if link is None:
            may_answer = self._may_answer
            if (
                message.kind is MessageKind.RESPONSE
                and may_answer is not None
                and not may_answer(target)
            ):
                # The address came from a request; only members are dialled.
                log.warning("not answering a silo outside the membership table silo=%s", target)
                return
            link = self._links[target] = _PeerLink(self, target)
        link.outbox.push(message)

    def answer_only(self, predicate: Callable[[SiloAddress], bool] | None) -> None:
        """Open links for responses only to silos ``predicate`` accepts (the
        membership table's members): the address a response goes to is named by
        the request, and a request may lie."""
        self._may_answer = predicate
        self._credit.member = predicate

    def send_to_client(self, client_id: str, message: Message) -> None:
        """Queue ``message`` down a gateway client's stream; an unknown or
        disconnected client means the message is dropped (debug log)."""
        self._clients.send(client_id, message)

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting to be written, per peer silo and for all gateway
        clients together (``"clients"``): read by the metrics exposition."""
        depths = {str(target): len(link.outbox.queue) for target, link in self._links.items()}
        depths["clients"] = self._clients.queued()
        return depths

    def on_gossip(self, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(table_version)`` for every ping that carries one."""
        self._gossip_listener = listener

    def disconnect(self, target: SiloAddress) -> None:
        """Drop the link to ``target``; its unwritten messages become undeliverable."""
        link = self._links.get(target)
        error = SiloUnavailableError(f"silo {target}: disconnected")
        if link is not None:
            link.fail(error, quiet=True)
        elif self._sink is not None:
            _connection_lost(self._sink, target, error)
        down = self._down.pop(target, None)
        if down is not None:
            log.info(
                "peer link closed peer=%s reason=left the cluster down_for=%.1fs "
                "failed_messages=%d",
                target,
                time.monotonic() - down.since,
                down.failed,
            )
        self.peer_stats.pop(target, None)
        channel = self._channels.pop(target, None)
        if channel is not None:
            task = asyncio.get_running_loop().create_task(channel.close(None))
            task.add_done_callback(_ignore_result)

    def _later(self, message: Message, error: Exception) -> None:
        sink = self._sink
        if sink is not None:
            asyncio.get_running_loop().call_soon(sink.undeliverable, message, error)

    def _link_down(self, target: SiloAddress, error: Exception, dropped: int) -> None:
        """A link to ``target`` failed, with ``dropped`` messages unwritten: log
        the first failure of a run of them, count the rest."""
        if self._stopped:
            return
        down = self._down.get(target)
        if down is None:
            self._down[target] = _Down(time.monotonic(), error, dropped)
            log.warning(
                "peer link down peer=%s failed_messages=%d error=%s", target, dropped, error
            )
            return
        down.failed += dropped
        down.error = error
        log.debug("peer link still down peer=%s dropped=%d error=%s", target, dropped, error)

    def _link_up(self, target: SiloAddress) -> None:
        down = self._down.pop(target, None)
        if down is not None:
            log.info(
                "peer link up again peer=%s down_for=%.1fs failed_messages=%d",
                target,
                time.monotonic() - down.since,
                down.failed,
            )

    def _forget(self, link: _PeerLink) -> None:
        if self._links.get(link.target) is link:
            del self._links[link.target]

    # -- ping

    async def ping(self, target: SiloAddress, timeout: float, table_version: int = 0) -> bool:
        """``True`` if ``target`` (that very generation) answered within ``timeout``;
        a non-zero ``table_version`` goes along as gossip."""
        return await self.probe(target, timeout, table_version) is ProbeOutcome.ANSWERED

    async def probe(
        self, target: SiloAddress, timeout: float, table_version: int = 0
    ) -> ProbeOutcome:
        """Ping ``target`` and say what was found (``ProbeOutcome``), within
        about ``timeout`` seconds; ``table_version`` as for ``ping``."""
        if self._stopped:
            return ProbeOutcome.SILENT
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = _open_channel(target.endpoint, self._options)
        request = pb.PingRequest(table_version=table_version)
        # "from" is a Python keyword, so the field is reached by name.
        setattr(request, "from", self._codec.text(self.address))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            reply_bytes: bytes = await channel.unary_unary(_SILO_PING, None, None)(
                request.SerializeToString(), timeout=timeout, metadata=_metadata(self._options)
            )
            reply = pb.PingReply.FromString(reply_bytes)
            answered = SiloAddress.parse(reply.silo)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_if_cancelled()  # grpc.aio reports a cancelled call as a CANCELLED error
            log.debug("ping failed target=%s error=%r", target, exc)
            code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return ProbeOutcome.UNAUTHORIZED
            left = timeout - (loop.time() - started)
            # A fast failure: was the connection refused? (gRPC's channel may
            # not even have tried, inside its reconnect backoff.)
            if (
                code != grpc.StatusCode.DEADLINE_EXCEEDED
                and left > 0
                and await _refused(target, min(left, 1.0))
            ):
                return ProbeOutcome.REFUSED
            return ProbeOutcome.SILENT
        if answered.generation != target.generation:
            return ProbeOutcome.GONE
        return ProbeOutcome.ANSWERED

    # -- serving

    async def _serve_ping(self, request: bytes, context: _Context) -> bytes:
        if not _authorized(self._options, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster secret required")
        try:
            ping = parse(pb.PingRequest, request)
        except InvalidEnvelope:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed PingRequest")
        if ping.table_version and self._gossip_listener is not None:
            try:
                self._gossip_listener(ping.table_version)
            except Exception:
                log.exception("gossip listener raised version=%d", ping.table_version)
        data: bytes = pb.PingReply(silo=self._codec.text(self.address)).SerializeToString()
        return data

    async def _check_protocol(self, context: _Context, what: str) -> None:
        """Abort a call whose protocol window is malformed or shares none with
        this release's (``FAILED_PRECONDITION``, naming both)."""
        try:
            _peer_window(context.invocation_metadata(), what)
        except IncompatibleVersionError as exc:
            log.warning("refused %s peer=%s: %s", what, context.peer(), exc)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"protocol: {exc}")

    async def _serve_silo(self, _requests: Any, context: _Context) -> None:
        if not _authorized(self._options, context):
            log.warning("refused silo stream without the cluster secret peer=%s", context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster secret required")
        await self._check_protocol(context, "a silo stream")
        await context.send_initial_metadata(_served_metadata(self._codec.text(self.address)))
        sender = _claimed_silo(context)
        peer_stats = self.peer_stats
        while True:
            frame = await context.read()
            if frame is _EOF:
                return
            envelopes = self._decode_frame(frame, None)
            if envelopes is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_FRAME)
                return
            if sender is not None:
                # Once per frame, on the stream's owner: no per-message lookup.
                peer = peer_stats.get(sender)
                if peer is None and self._counts_as_peer(sender):
                    peer = peer_stats[sender] = WireStats()
                if peer is not None:
                    peer.frames_received += 1
                    peer.messages_received += len(envelopes)
            for env in envelopes:
                self._receive_envelope(env, None)

    async def _serve_client(self, _requests: Any, context: _Context) -> None:
        if not _authorized(self._options, context):
            log.warning("refused gateway client without the cluster secret peer=%s", context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster secret required")
        client_id = _header(context.invocation_metadata(), CLIENT_HEADER)
        if not client_id or len(client_id) > _MAX_CLIENT_ID:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{CLIENT_HEADER} header required"
            )
        assert client_id is not None
        await self._check_protocol(context, f"gateway client {client_id[:64]!r}")
        await context.send_initial_metadata(_served_metadata(self._codec.text(self.address)))
        outbox = Outbox(self._codec, self._options, self.stats)
        link = ClientLink(
            client_id,
            outbox,
            context.write,
            self._options.max_in_flight,
            client_principal(self._options, context),
        )
        self._clients.add(link)
        log.debug("gateway client connected client=%s", client_id)
        try:
            while True:
                frame = await context.read()
                if frame is _EOF:
                    return
                envelopes = self._decode_frame(frame, client_id)
                if envelopes is None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_FRAME)
                    return
                for env in envelopes:
                    if link.full:
                        await link.wait_for_room()
                    self._receive_envelope(env, link)
        finally:
            self._clients.remove(link)
            link.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link.task
            log.debug("gateway client disconnected client=%s", client_id)

    def _counts_as_peer(self, silo: SiloAddress) -> bool:
        """Only members of the table get their own counters: a stream's claimed
        name could otherwise grow ``peer_stats`` without bound."""
        may_answer = self._may_answer
        return may_answer is None or may_answer(silo)

    def _decode_frame(self, frame: bytes, client_id: str | None) -> Sequence[Any] | None:
        """The envelopes of one frame; ``None`` if the frame does not parse."""
        try:
            envelopes = FrameCodec.decode(frame, self._options.max_frame_items)
        except InvalidEnvelope as exc:
            log.warning("malformed frame bytes=%d client=%s reason=%s", len(frame), client_id, exc)
            return None
        self.stats.frames_received += 1
        self.stats.messages_received += len(envelopes)
        return envelopes

    def _receive_envelope(self, env: Any, client: ClientLink | None) -> None:
        """Deliver one envelope, from a gateway ``client`` or (``None``) a peer silo.

        From a client, nothing it says about the cluster is trusted
        (``ClientLink.admit``). From a peer, a request beyond ``max_in_flight``
        unanswered ones of its sender is rejected (``PeerCredit``).
        """
        sink = self._sink
        assert sink is not None
        me = self.address
        client_id = client.client_id if client is not None else None
        try:
            message = self._codec.message(env, self._options.max_message_size)
        except InvalidEnvelope as exc:
            self._reject(env, MessageRejectedError(str(exc)), client_id)
            return
        target = message.target_silo
        if client is not None:
            if not client.admit(message, me, self._timeout_ms):
                return
        elif target is not None and target.generation != me.generation:
            self._reject(
                env,
                SiloRestartedError(
                    f"message for {target}, an earlier incarnation of this silo {me}; "
                    "re-resolve the grain"
                ),
                None,
            )
            return
        elif (
            message.kind is MessageKind.REQUEST
            and message.sender_silo is not None
            and not self._credit.owe(message.sender_silo, message)
        ):
            self._reject(
                env,
                MessageRejectedError(
                    f"silo {me} is overloaded: {self._options.max_in_flight} requests "
                    f"from {message.sender_silo} are unanswered"
                ),
                None,
            )
            return
        elif (
            message.kind is MessageKind.ONE_WAY
            and message.sender_silo is not None
            and not self._credit.owe(message.sender_silo, message)
        ):
            # Nobody waits for an answer; one-way delivery is at most once.
            self.one_way_refused += 1
            log.debug("dropped a one-way message, sender overloaded id=%d", message.id)
            return
        try:
            sink.receive(message)
        except Exception:
            # The dispatcher's bug must not take the stream (and the peer's
            # other messages) down with it.
            log.exception("sink.receive raised id=%d", message.id)

    def _reject(self, env: Any, error: Exception, client_id: str | None) -> None:
        rejection = self._codec.rejection(env, pack(error_payload(error)))
        log.info("rejected message id=%d client=%s reason=%s", env.id, client_id, error)
        if rejection is None:
            return
        response, sender = rejection
        if client_id is not None:
            response.sender_client = client_id
            self.send_to_client(client_id, response)
        elif sender is not None:
            self.send(sender, response)


def _claimed_silo(context: _Context) -> SiloAddress | None:
    """The silo an inbound silo stream says it comes from (``None`` if it names
    none or garbage). The cluster secret or mutual TLS decided that the caller is
    a member; which member it is, is its own word, used only for metrics."""
    text = _header(context.invocation_metadata(), SILO_HEADER)
    if not text or len(text) > _MAX_CLIENT_ID:
        return None
    try:
        return SiloAddress.parse(text)
    except ValueError:
        return None


def _connection_lost(sink: MessageSink, target: SiloAddress, error: Exception) -> None:
    lost = getattr(sink, "connection_lost", None)
    if lost is None:
        return
    try:
        lost(target, error)
    except Exception:
        log.exception("connection_lost raised peer=%s", target)


def _ignore_result(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


# ------------------------------------------------------------ client side


class GrpcGatewayConnection:
    """A cluster client's stream to one gateway.

    ``connect`` opens it (``AuthenticationError`` if the gateway refuses the
    secret, ``SiloUnavailableError`` if it cannot be reached). ``send`` queues a
    message, batched as between silos. Every message arriving is passed to
    ``on_message``; when the stream ends ``on_closed`` is called once, with the
    error or ``None`` for a local ``aclose``. Messages still queued then, never
    written, wait in ``take_unsent`` for the client to send another way;
    whatever may have been written is the client's to fail. A closed
    connection does not reopen.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        client_id: str,
        options: MessagingOptions,
        on_message: Callable[[Message], None],
        on_closed: Callable[[Exception | None], None],
    ) -> None:
        self._endpoint = endpoint
        self._client_id = client_id
        self._options = options
        self._on_message = on_message
        self._on_closed = on_closed
        self._codec = FrameCodec()
        self.stats = WireStats()
        self._outbox = Outbox(self._codec, options, self.stats)
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._unsent: list[Message] = []
        self.gateway: SiloAddress | None = None
        #: The newest protocol both ends speak, once connected.
        self.protocol: int | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def take_unsent(self) -> list[Message]:
        """Once closed: the messages that were queued but never written (the
        list is handed over once; later calls return nothing)."""
        unsent, self._unsent = self._unsent, []
        return unsent

    async def __aenter__(self) -> GrpcGatewayConnection:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the stream and wait for the gateway to accept it."""
        if self._closed or self._channel is not None:
            raise ClosedError("a GrpcGatewayConnection connects once")
        what = f"gateway {self._endpoint}"
        self._channel = _open_channel(self._endpoint, self._options)
        self._call = _stream_call(
            self._channel,
            _GATEWAY_CONNECT,
            _metadata(self._options, (CLIENT_HEADER, self._client_id)),
        )
        try:
            silo, self.protocol = await _handshake(self._call, what)
        except BaseException:
            self._closed = True
            await self._channel.close(None)
            raise
        with contextlib.suppress(ValueError):
            self.gateway = SiloAddress.parse(silo)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write(what), name="orleanspy-gateway-writer"),
            loop.create_task(self._read(what), name="orleanspy-gateway-reader"),
        ]

    def send(self, message: Message) -> None:
        """Queue ``message`` for the gateway; ``ClosedError`` once closed."""
        if self._closed:
            raise ClosedError("gateway connection is closed")
        if len(message.body) > self._options.max_message_size:
            raise MessageRejectedError(
                f"message body of {len(message.body)} bytes exceeds max_message_size"
            )
        reason = unencodable(message)
        if reason is not None:
            raise MessageRejectedError(reason)
        self._outbox.push(message)

    async def aclose(self) -> None:
        """Close the stream and the channel; ``on_closed(None)`` if still open."""
        self._finish(None)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._call is not None:
            self._call.cancel()
        if self._channel is not None:
            await self._channel.close(None)

    def _finish(self, error: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._unsent = self._outbox.take_unsent()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        try:
            self._on_closed(error)
        except Exception:
            log.exception("on_closed raised")

    async def _write(self, what: str) -> None:
        try:
            await self._outbox.pump(self._call.write, lambda: self._closed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._finish(_error_of(exc, what))

    async def _read(self, what: str) -> None:
        call = self._call
        codec = self._codec
        max_body = self._options.max_message_size
        try:
            while True:
                frame = await call.read()
                if frame is _EOF:
                    self._finish(_call_error(what, await call.code(), await call.details()))
                    return
                envelopes = FrameCodec.decode(frame, self._options.max_frame_items)
                self.stats.frames_received += 1
                self.stats.messages_received += len(envelopes)
                for env in envelopes:
                    try:
                        message = codec.message(env, max_body)
                    except InvalidEnvelope as exc:
                        log.warning("dropping invalid message from gateway reason=%s", exc)
                        continue
                    try:
                        self._on_message(message)
                    except Exception:
                        log.exception("on_message raised id=%d", message.id)
        except asyncio.CancelledError:
            raise
        except InvalidEnvelope:
            self._finish(SiloUnavailableError(f"{what}: malformed frame from gateway"))
        except Exception as exc:
            self._finish(_error_of(exc, what))
