"""The dispatcher: every message in and out of a silo passes through it.

Requests are validated (known grain type, callable method), then go to the local
activation, or are located (directory cache, directory, placement) and sent to
the silo that has or should create the activation. Responses complete the
caller's pending future, or travel back to the silo (or gateway client) that
sent the request. It also is the silo's ``CallInvoker``: calls made by grains
and by ``silo.client`` start here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orleanspy.clock import Clock
from orleanspy.errors import (
    GrainMethodNotFoundError,
    MessageRejectedError,
    SiloUnavailableError,
    UnknownGrainTypeError,
)
from orleanspy.grain import GrainDefinition, lookup_definition
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.message import Message, MessageKind, ResponseStatus
from orleanspy.messaging.transport import Transport
from orleanspy.metrics import GrainMetrics
from orleanspy.options import SiloOptions
from orleanspy.reference import GrainFactory
from orleanspy.runtime.activation import Activation
from orleanspy.runtime.catalog import Catalog
from orleanspy.runtime.context import CHAIN_HEADER, current_chain, encode_chain
from orleanspy.runtime.locator import Locator
from orleanspy.runtime.pending import PendingCalls
from orleanspy.runtime.remote_errors import error_payload, result_of
from orleanspy.serialization import Codec

if TYPE_CHECKING:
    from orleanspy.directory import ActivationAddress

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Routes messages for one silo; implements ``CallInvoker``, ``MessageSink``
    and ``ActivationHost``."""

    def __init__(
        self,
        *,
        address: SiloAddress,
        clock: Clock,
        options: SiloOptions,
        locator: Locator,
        grain_types: Mapping[str, GrainDefinition],
        transport: Transport | None = None,
    ) -> None:
        self.address = address
        self.clock = clock
        self.codec = Codec(reference_factory=self._reference)
        self.activation_timeout = options.activation_timeout.total_seconds()
        self.deactivation_timeout = options.deactivation_timeout.total_seconds()
        self._response_timeout = options.messaging.response_timeout.total_seconds()
        self._response_timeout_ms = int(self._response_timeout * 1000)
        self._max_forwards = options.messaging.max_forward_count
        self._locator = locator
        self._local_only = locator.local_only
        self._types = grain_types
        self._transport = transport
        self._pending: PendingCalls[Message] = PendingCalls(self._response_timeout)
        self._background: set[asyncio.Task[Any]] = set()
        self.factory = GrainFactory(self)
        self.catalog = Catalog(
            self,
            clock=clock,
            collection_age=options.collection_age,
            check_interval=options.collection_check_interval,
        )
        self._reminders: Any = None
        self.grain_metrics = GrainMetrics()  # the silo sets a recording one

    # -- wiring -------------------------------------------------------------------------

    def _reference(self, grain_id: GrainId, interface: str | None) -> Any:
        return self.factory.reference(grain_id, interface)

    @property
    def reminders(self) -> Any:
        """The reminder registry grains use (set by the silo)."""
        if self._reminders is None:
            raise RuntimeError("this silo has no reminder service")
        return self._reminders

    def set_reminders(self, registry: Any) -> None:
        self._reminders = registry

    def get_grain(self, grain: Any, key: Any) -> Any:
        return self.factory.get_grain(grain, key)

    # -- outgoing calls (CallInvoker) ---------------------------------------------------

    async def invoke(
        self,
        grain_id: GrainId,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        one_way: bool = False,
    ) -> Any:
        """Send a call from this silo and wait for its result (see ``CallInvoker``)."""
        msg = Message.request(
            grain_id,
            method,
            self.codec.encode((args, kwargs)),
            one_way=one_way,
            expires_at_ms=self.clock.now_ms() + self._response_timeout_ms,
            sender_silo=self.address,
        )
        chain = current_chain.get()
        if chain:
            msg.headers[CHAIN_HEADER] = encode_chain(chain)
        if one_way:
            self.route(msg)
            return None
        fut = self._pending.add(msg.id, grain_id, method)
        try:
            self.route(msg)
            response = await fut
        finally:
            self._pending.discard(msg.id)
        return result_of(response, self.codec)

    # -- routing ------------------------------------------------------------------------

    def route(self, msg: Message) -> None:
        """Deliver a request or one-way message locally, or send it where it belongs."""
        gid = msg.target_grain
        if gid is None:
            self._reject(msg, MessageRejectedError("message without a target grain"))
            return
        defn = self._types.get(gid.type_name)
        if defn is None:
            self._route_elsewhere(msg, gid)
            return
        if msg.method not in defn.methods:
            self._reject_method(msg, gid)
            return
        act = self.catalog.get(gid)
        if act is not None:
            act.enqueue(msg)
            return
        if _is_here(msg.target_silo, self.address) or self._local_only:
            self.catalog.get_or_create(gid, defn).enqueue(msg)
            return
        self._send_where_it_lives(msg, gid, defn)

    def _route_elsewhere(self, msg: Message, gid: GrainId) -> None:
        """A grain type this silo does not host: in a cluster, send the call to
        a silo that does (placement only considers those)."""
        if self._local_only or _is_here(msg.target_silo, self.address):
            self._reject(msg, UnknownGrainTypeError(f"no grain type {gid.type_name!r} here"))
            return
        # The class may be imported here without being hosted: then its
        # placement is known and a bad method fails without a round trip.
        try:
            known: GrainDefinition | None = lookup_definition(gid.type_name)
        except UnknownGrainTypeError:
            known = None
        if known is not None and msg.method not in known.methods:
            self._reject_method(msg, gid)
            return
        self._send_where_it_lives(msg, gid, known)

    def _send_where_it_lives(
        self, msg: Message, gid: GrainId, defn: GrainDefinition | None
    ) -> None:
        # The directory cache answers without I/O; otherwise locate (directory
        # lookup, then placement) in the background and send when known.
        silo = self._locator.cached(gid)
        if silo is not None:
            self._send_to(silo, msg)
        else:
            self._spawn(self._locate_and_send(msg, defn))

    def _reject_method(self, msg: Message, gid: GrainId) -> None:
        self._reject(
            msg,
            GrainMethodNotFoundError(
                f"{gid.type_name} has no callable method {msg.method!r}; "
                "only public async methods can be called"
            ),
        )

    async def _locate_and_send(self, msg: Message, defn: GrainDefinition | None) -> None:
        assert msg.target_grain is not None
        try:
            silo = await self._locator.locate(msg.target_grain, defn)
        except Exception as exc:
            self._reject(msg, exc)
            return
        self._send_to(silo, msg)

    def _send_to(self, silo: SiloAddress, msg: Message) -> None:
        msg.target_silo = silo
        if _is_here(silo, self.address):
            self.route(msg)
        elif self._transport is None:
            self._reject(msg, MessageRejectedError(f"no transport to reach {silo}"))
        else:
            self._transport.send(silo, msg)

    def reroute(self, message: Message) -> None:
        """Route again from scratch (the activation it reached went away)."""
        if message.target_grain is not None:
            self._locator.invalidate(message.target_grain)
        message.target_silo = None
        self.route(message)

    def forward(self, message: Message, to: ActivationAddress) -> None:
        """Send a message on to the activation that won the directory race."""
        message.forward_count += 1
        if message.forward_count > self._max_forwards:
            self._reject(
                message,
                MessageRejectedError(
                    f"{message.target_grain}: forwarded "
                    f"{message.forward_count - 1} times; giving up"
                ),
            )
            return
        self._send_to(to.silo, message)

    def _reject(self, msg: Message, exc: Exception) -> None:
        if msg.kind is MessageKind.REQUEST:
            body = self.codec.encode(error_payload(exc))
            self.send_response(msg.response(ResponseStatus.REJECTED, body))
        else:
            log.warning("dropped message id=%d reason=%r", msg.id, exc)

    # -- responses ----------------------------------------------------------------------

    def send_response(self, response: Message) -> None:
        target = response.target_silo
        if target is None or _is_here(target, self.address):
            if response.sender_client is not None and self._transport is not None:
                self._transport.send_to_client(response.sender_client, response)
            else:
                self._complete(response)
        elif self._transport is not None:
            self._transport.send(target, response)

    def _complete(self, response: Message) -> None:
        self._pending.resolve(response.correlation_id, response)

    # -- MessageSink --------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        """A message from the network (another silo, or a client via the gateway)."""
        if message.kind is MessageKind.RESPONSE:
            if message.sender_client is None and message.target_silo is self.address:
                self._complete(message)  # the common case: an answer to a call from here
            else:
                self.send_response(message)
            return
        if message.sender_client is not None and message.sender_silo is None:
            message.sender_silo = self.address
        if message.expires_at_ms and message.expires_at_ms < self.clock.now_ms():
            log.debug("dropped expired message id=%d", message.id)
            return
        self.route(message)

    def undeliverable(self, message: Message, error: Exception) -> None:
        """The transport could not deliver: route again if the target silo turns out
        to be gone, else fail the call; responses are dropped."""
        if message.target_grain is not None:
            self._locator.invalidate(message.target_grain)
        target = message.target_silo
        if (
            message.kind is not MessageKind.RESPONSE
            and isinstance(error, SiloUnavailableError)
            and target is not None
            and message.forward_count < self._max_forwards
        ):
            self._spawn(self._retry_elsewhere(message, target, error))
            return
        self._fail(message, error)

    async def _retry_elsewhere(
        self, message: Message, target: SiloAddress, error: Exception
    ) -> None:
        try:
            gone = await self._locator.silo_unreachable(target)
        except Exception as exc:
            log.warning("membership check failed silo=%s error=%r", target, exc)
            gone = False
        if gone:
            message.forward_count += 1
            self.reroute(message)
        else:
            self._fail(message, error)

    def _fail(self, message: Message, error: Exception) -> None:
        if message.kind is MessageKind.REQUEST:
            body = self.codec.encode(error_payload(error))
            self.send_response(message.response(ResponseStatus.REJECTED, body))
        else:
            log.debug(
                "undeliverable message id=%d kind=%s error=%r", message.id, message.kind, error
            )

    # -- ActivationHost -----------------------------------------------------------------

    async def register_activation(self, activation: Activation) -> ActivationAddress | None:
        if self._local_only:
            return None
        from orleanspy.directory import ActivationAddress

        return await self._locator.register(
            activation.grain_id, ActivationAddress(self.address, activation.activation_id)
        )

    async def activation_ended(self, activation: Activation) -> None:
        self.catalog.remove(activation)
        if self._local_only:
            return
        from orleanspy.directory import ActivationAddress

        try:
            await self._locator.unregister(
                activation.grain_id, ActivationAddress(self.address, activation.activation_id)
            )
        except Exception as exc:
            log.warning("directory unregister failed grain=%s error=%r", activation.grain_id, exc)

    # -- housekeeping -------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self, exc: Exception) -> None:
        """Fail every call still waiting and stop the timeout sweeper (silo stopped)."""
        await self._pending.close(exc)


def _is_here(silo: SiloAddress | None, here: SiloAddress) -> bool:
    # Asked several times per call: the identity test settles nearly every
    # case (parsed addresses are interned, see ``SiloAddress.parse``) without a
    # call to ``SiloAddress.__eq__``.
    return silo is here or (silo is not None and silo == here)
