"""The gateway's bookkeeping: connected clients, their flow control, and what
this silo owes each peer silo.

``grpc.py`` reads and writes the streams; the state behind those streams lives
here, so it can be read (and tested) without gRPC. This module imports neither
``grpc`` nor the generated protobuf code.

Clients
    ``ClientRegistry`` maps a client id to the ``ClientLink`` of its stream; a
    client that reconnects replaces its older stream. ``ClientLink`` holds the
    stream's outbox and counts what the client has in flight against
    ``max_in_flight`` (see its docstring); ``admit`` turns a message read from
    a client into one the silo can trust.

Peers
    ``PeerCredit`` counts the requests (and one-way messages whose turn has not
    run) read from each peer silo and not answered yet; a peer's stream also
    carries the answers this silo waits for, so it is never paused: beyond
    ``max_in_flight`` the excess is refused instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from orleanspy.identity import SiloAddress
from orleanspy.messaging.frames import Outbox, unencodable
from orleanspy.messaging.message import (
    PRINCIPAL_HEADER,
    SYSTEM_TYPE_PREFIX,
    Message,
    MessageKind,
    settle,
)
from orleanspy.trace_context import trace_headers

__all__ = ["ClientLink", "ClientRegistry", "PeerCredit", "Unanswered"]

log = logging.getLogger(__name__)

# How often a paused client stream looks for expired requests to forget.
_ROOM_RECHECK = 1.0


def _deadline_cap(timeout_ms: int) -> int:
    """The latest deadline (epoch ms) a message read now may keep."""
    return int(time.time() * 1000) + timeout_ms


class Unanswered:
    """Requests read from one sender and not answered yet, with their deadlines
    (epoch ms, never 0). Counted per message, not per id: a hostile sender may
    repeat ids, and a repeat waits in ``_repeats`` (empty but for such senders)."""

    __slots__ = ("_by_id", "_repeats", "count")

    def __init__(self) -> None:
        self._by_id: dict[int, int] = {}
        self._repeats: list[tuple[int, int]] = []
        self.count = 0

    def add(self, msg_id: int, deadline: int) -> None:
        if msg_id in self._by_id:
            self._repeats.append((msg_id, deadline))
        else:
            self._by_id[msg_id] = deadline
        self.count += 1

    def answered(self, msg_id: int) -> None:
        if self._by_id.pop(msg_id, 0):
            self.count -= 1
            return
        repeats = self._repeats
        for i, (repeat_id, _deadline) in enumerate(repeats):
            if repeat_id == msg_id:
                del repeats[i]
                self.count -= 1
                return

    def forget_expired(self) -> None:
        """Drop requests whose deadline passed: the silo dropped them unanswered."""
        now_ms = time.time() * 1000
        by_id = self._by_id
        for msg_id in [k for k, deadline in by_id.items() if deadline < now_ms]:
            del by_id[msg_id]
        self._repeats = [r for r in self._repeats if r[1] >= now_ms]
        self.count = len(by_id) + len(self._repeats)


class ClientLink:
    """The gateway's downstream half of one client's stream, and its flow control.

    A request counts against ``limit`` (``max_in_flight``) from the moment it is
    read until its response has been written to the client (or, unanswered,
    until its deadline passed). A one-way message counts until its turn has run,
    or it was dropped, or it was written to the silo that runs it (``settle``).
    While the count is at the limit the gateway reads no more from this client,
    so the stream's flow control stops the client's writes.

    ``write`` writes one frame down the stream; a writer task drains ``outbox``
    into it until it fails or the link's ``task`` is cancelled.
    """

    def __init__(
        self,
        client_id: str,
        outbox: Outbox,
        write: Callable[[bytes], Awaitable[None]],
        limit: int,
        principal: str = "anonymous",
    ) -> None:
        self.client_id = client_id
        #: Who the transport authenticated this client as (``admit`` stamps it on
        #: calls to the runtime's own grains).
        self.principal = principal
        self.outbox = outbox
        self._write = write
        self._limit = limit
        self.waiting = Unanswered()
        # Responses queued and not written yet.
        self.unwritten = 0
        self._room = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"orleanspy-grpc-client-{client_id}"
        )

    @property
    def full(self) -> bool:
        return self.waiting.count + self.unwritten >= self._limit

    def admit(self, message: Message, me: SiloAddress, timeout_ms: int) -> bool:
        """Make ``message``, read from this client, one the silo can trust, and
        count it; ``False`` if it must be dropped.

        Nothing the client says about the cluster is trusted: the gateway stamps
        the client and itself (``me``) as the sender, and drops the client's
        headers (a forged call chain could interleave turns on a non-reentrant
        grain; a principal would claim another's authority) but a trace context
        that parses within limits (``tracing.trace_headers``), its target silo
        (it would bypass the directory) and forward count; the deadline is
        capped at ``timeout_ms`` from now. A call to one of the runtime's own
        grains carries the principal the transport authenticated.
        """
        if message.kind is MessageKind.RESPONSE:
            # Clients send calls; a "response" could only try to complete
            # someone else's call.
            log.debug("dropped a response from client=%s id=%d", self.client_id, message.id)
            return False
        message.sender_client = self.client_id
        message.sender_silo = me
        message.target_silo = None
        message.forward_count = 0
        if message.headers:
            message.headers = trace_headers(message.headers)
        grain = message.target_grain
        if grain is not None and grain.type_name.startswith(SYSTEM_TYPE_PREFIX):
            message.headers[PRINCIPAL_HEADER] = self.principal
        cap = _deadline_cap(timeout_ms)
        if not 0 < message.expires_at_ms <= cap:
            message.expires_at_ms = cap
        if message.kind is MessageKind.REQUEST:
            self.waiting.add(message.id, message.expires_at_ms)
        else:
            msg_id = message.id
            self.waiting.add(msg_id, message.expires_at_ms)
            message.on_settled = functools.partial(self._one_way_done, msg_id)
        return True

    def _one_way_done(self, msg_id: int) -> None:
        self.waiting.answered(msg_id)
        if not self.full:
            self._room.set()

    def response_queued(self, message: Message) -> None:
        self.waiting.answered(message.correlation_id)
        self.unwritten += 1

    def _written(self, batch: list[Message]) -> None:
        response = MessageKind.RESPONSE
        for m in batch:
            if m.kind is response:
                self.unwritten -= 1
        if not self.full:
            self._room.set()

    async def wait_for_room(self) -> None:
        """Return once the client is below its in-flight limit."""
        while self.full:
            # Requests the silo dropped unanswered (expired) free their place.
            self.waiting.forget_expired()
            if not self.full:
                return
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_ROOM_RECHECK):
                    await self._room.wait()

    async def _run(self) -> None:
        try:
            await self.outbox.pump(self._write, lambda: False, self._written)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("gateway client write failed client=%s error=%r", self.client_id, exc)
            self.outbox.take_all()


class ClientRegistry:
    """The gateway's connected clients, by client id: one stream each, the newest."""

    __slots__ = ("_links",)

    def __init__(self) -> None:
        self._links: dict[str, ClientLink] = {}

    def links(self) -> list[ClientLink]:
        return list(self._links.values())

    def add(self, link: ClientLink) -> None:
        """Register ``link``; an older stream of the same client is cancelled
        (the client reconnected; the newer stream wins)."""
        previous = self._links.get(link.client_id)
        if previous is not None:
            previous.task.cancel()
        self._links[link.client_id] = link

    def remove(self, link: ClientLink) -> None:
        """Forget ``link`` unless a newer stream of its client replaced it."""
        if self._links.get(link.client_id) is link:
            del self._links[link.client_id]

    def send(self, client_id: str, message: Message) -> None:
        """Queue ``message`` down a client's stream; an unknown or disconnected
        client (or an unencodable message) means it is dropped (debug log)."""
        client = self._links.get(client_id)
        if client is None or unencodable(message) is not None:
            log.debug("dropping message for absent client client=%s id=%d", client_id, message.id)
            return
        if message.kind is MessageKind.RESPONSE:
            client.response_queued(message)
        client.outbox.push(message)

    def queued(self) -> int:
        """Messages waiting to be written to all clients together."""
        return sum(len(client.outbox.queue) for client in self._links.values())


class PeerCredit:
    """What this silo owes each peer silo: requests and one-way messages read
    from it whose answer (or turn) is still due, at most ``limit`` each.

    ``member(silo)``, when set, says whether a sender is in the membership
    table; only members are counted, so made-up senders cannot grow the map.
    """

    __slots__ = ("_limit", "_owed", "_timeout_ms", "member")

    def __init__(self, limit: int, timeout_ms: int) -> None:
        self._limit = limit
        self._timeout_ms = timeout_ms
        self._owed: dict[SiloAddress, Unanswered] = {}
        self.member: Callable[[SiloAddress], bool] | None = None

    def owe(self, sender: SiloAddress, message: Message) -> bool:
        """Count a request (or one-way message) from peer ``sender``; ``False``
        if it has too many unanswered (after forgetting those whose deadline
        passed). A one-way message is settled once its turn ran or it was
        passed on (``on_settled``)."""
        member = self.member
        if member is not None and not member(sender):
            # Not a member (yet): the dispatcher learns of it or drops the
            # request; counting it would let made-up senders grow ``_owed``.
            return True
        owed = self._owed.get(sender)
        if owed is None:
            owed = self._owed[sender] = Unanswered()
        if owed.count >= self._limit:
            owed.forget_expired()
            if owed.count >= self._limit:
                return False
        cap = _deadline_cap(self._timeout_ms)
        deadline = message.expires_at_ms
        owed.add(message.id, deadline if 0 < deadline <= cap else cap)
        if message.kind is MessageKind.ONE_WAY:
            message.on_settled = functools.partial(self._one_way_settled, sender, message.id)
        return True

    def _one_way_settled(self, sender: SiloAddress, msg_id: int) -> None:
        owed = self._owed.get(sender)
        if owed is not None:
            owed.answered(msg_id)
            if not owed.count:
                del self._owed[sender]

    def written(self, target: SiloAddress, batch: list[Message]) -> None:
        """After a frame to ``target`` was written: its responses settle what
        this silo owed ``target``; one-way messages read from a client or a peer
        and passed on to ``target`` free their sender's slot."""
        owed = self._owed.get(target)
        response = MessageKind.RESPONSE
        for m in batch:
            if m.kind is response:
                if owed is not None:
                    owed.answered(m.correlation_id)
            elif m.on_settled is not None:
                settle(m)
        if owed is not None and not owed.count and self._owed.get(target) is owed:
            del self._owed[target]
