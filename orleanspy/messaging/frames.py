"""Frames on the wire: ``Message`` <-> protobuf ``Batch``, and the batching outbox.

Kept apart from ``grpc.py`` (which owns the connections) so the wire codec and
the batching rule can be read, and measured, on their own. Imports the
generated protobuf messages (as does ``grpc.py``, for its pings), never ``grpc``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from orleanspy.identity import GrainId, GrainKey, SiloAddress
from orleanspy.messaging._generated import messages_pb2 as pb
from orleanspy.messaging.message import Message, MessageKind, ResponseStatus, next_message_id
from orleanspy.options import MessagingOptions

__all__ = [
    "FrameCodec",
    "InvalidEnvelope",
    "Outbox",
    "WireStats",
    "count_items",
    "parse",
    "unencodable",
]

# A rough per-envelope overhead for frame budgeting; exactness does not matter.
_ENVELOPE_OVERHEAD = 160
_SINT64_MIN = -(1 << 63)
_SINT64_MAX = (1 << 63) - 1
_GRAIN_CACHE_SIZE = 8192
_KINDS = (MessageKind.REQUEST, MessageKind.RESPONSE, MessageKind.ONE_WAY)
_STATUSES = (ResponseStatus.OK, ResponseStatus.ERROR, ResponseStatus.REJECTED)


@dataclass(slots=True)
class WireStats:
    """Counters of one transport or gateway connection (for tests and benchmarks)."""

    frames_sent: int = 0
    messages_sent: int = 0
    frames_received: int = 0
    messages_received: int = 0


class InvalidEnvelope(Exception):
    """Bytes that do not parse, or an envelope that parsed but cannot become a ``Message``."""


def parse(kind: Any, data: bytes) -> Any:
    """``kind.FromString(data)`` for a generated message class; raises
    ``InvalidEnvelope`` on garbage (protobuf's own error stays in this module)."""
    try:
        return kind.FromString(data)
    except DecodeError as exc:
        raise InvalidEnvelope(f"malformed {kind.__name__} ({len(data)} bytes)") from exc


# --------------------------------------------------------------------- codec


class FrameCodec:
    """Message <-> Batch frames. Caches what every envelope repeats: silo
    address text (a cluster has few silos) and recently seen grain ids."""

    __slots__ = ("_addr_text", "_grains")

    def __init__(self) -> None:
        self._addr_text: dict[SiloAddress, str] = {}
        # Recently decoded grain ids: a hit skips GrainId's validation and
        # brings its cached hash, which the catalog lookup that follows uses.
        self._grains: dict[tuple[str, GrainKey], GrainId] = {}

    def text(self, address: SiloAddress) -> str:
        text = self._addr_text.get(address)
        if text is None:
            if len(self._addr_text) > 4096:
                self._addr_text.clear()
            text = self._addr_text[address] = str(address)
        return text

    @staticmethod
    def address(text: str) -> SiloAddress:
        # Interned by SiloAddress.parse: the local silo's own address comes back
        # as the transport's object, so "is it me?" is an identity test.
        try:
            return SiloAddress.parse(text)
        except ValueError as exc:
            raise InvalidEnvelope(f"bad silo address {text[:100]!r}") from exc

    def _grain(self, type_name: str, key: GrainKey) -> GrainId:
        # Keys off the wire are str, int or UUID, which never compare equal
        # across types, so (type, key) identifies the grain.
        grains = self._grains
        grain = grains.get((type_name, key))
        if grain is None:
            grain = GrainId(type_name, key)
            if len(grains) >= _GRAIN_CACHE_SIZE:
                grains.clear()  # bounded: a peer naming ever new grains cannot grow it
            grains[type_name, key] = grain
        return grain

    def encode(self, messages: Iterable[Message]) -> bytes:
        batch = pb.Batch()
        add = batch.messages.add
        text = self.text
        for m in messages:
            env: Any = add()
            env.id = m.id
            if m.kind:
                env.kind = m.kind
            grain = m.target_grain
            if grain is not None:
                env.grain_type = grain.type_name
                key = grain.key
                if isinstance(key, str):
                    env.s = key
                elif isinstance(key, int):
                    env.i = key
                else:
                    env.uuid = key.bytes
            if m.method:
                env.method = m.method
            if m.sender_silo is not None:
                env.sender_silo = text(m.sender_silo)
            if m.sender_client:
                env.sender_client = m.sender_client
            if m.target_silo is not None:
                env.target_silo = text(m.target_silo)
            if m.correlation_id:
                env.correlation_id = m.correlation_id
            if m.expires_at_ms:
                env.expires_at_ms = m.expires_at_ms
            if m.forward_count:
                env.forward_count = m.forward_count
            if m.status:
                env.status = m.status
            if m.body:
                env.body = m.body
            if m.headers:
                env.headers.update(m.headers)
        data: bytes = batch.SerializeToString()
        return data

    @staticmethod
    def decode(frame: bytes, max_items: int) -> Sequence[Any]:
        """The envelopes of one frame; raises ``InvalidEnvelope`` on garbage, or
        when the frame holds more than ``max_items`` envelopes and header
        entries together (checked before decoding, see ``count_items``)."""
        if count_items(frame, max_items) > max_items:
            raise InvalidEnvelope(
                f"frame of {len(frame)} bytes holds more than {max_items} envelopes "
                "and header entries (max_frame_items), or bytes no sender writes"
            )
        envelopes: Sequence[Any] = parse(pb.Batch, frame).messages
        return envelopes

    def message(self, env: Any, max_body: int) -> Message:
        """The ``Message`` of a parsed envelope; raises ``InvalidEnvelope`` with a reason."""
        # Indexing the member tuples is much cheaper than calling the enum classes.
        kind = env.kind
        if not 0 <= kind < len(_KINDS):
            raise InvalidEnvelope(f"unknown message kind {kind}")
        status = env.status
        if not 0 <= status < len(_STATUSES):
            raise InvalidEnvelope(f"unknown response status {status}")
        body = env.body
        if len(body) > max_body:
            raise InvalidEnvelope(
                f"message body of {len(body)} bytes exceeds max_message_size {max_body}"
            )
        grain = None
        if env.grain_type:
            which = env.WhichOneof("grain_key")
            key: GrainKey
            try:
                if which == "s":
                    key = env.s
                elif which == "i":
                    key = env.i
                elif which == "uuid":
                    key = uuid.UUID(bytes=env.uuid)
                else:
                    raise InvalidEnvelope("target grain without a key")
                grain = self._grain(env.grain_type, key)
            except (ValueError, TypeError) as exc:
                raise InvalidEnvelope(f"bad target grain: {exc}") from exc
        sender = env.sender_silo
        target = env.target_silo
        headers = env.headers
        # Positional, in field order: about half the cost of keywords, per message.
        return Message(
            env.id,
            _KINDS[kind],
            grain,
            env.method,
            body,
            self.address(sender) if sender else None,
            env.sender_client or None,
            self.address(target) if target else None,
            env.correlation_id,
            env.expires_at_ms,
            env.forward_count,
            _STATUSES[status],
            dict(headers) if headers else {},
        )

    def rejection(self, env: Any, body: bytes) -> tuple[Message, SiloAddress | None] | None:
        """A REJECTED response (``body``: the encoded error payload, as every other
        error travels) to an invalid request envelope and where it goes (``None``
        address: back down the connection it came on), or ``None`` when the
        envelope is not a request and is to be dropped."""
        if env.kind != MessageKind.REQUEST:
            return None
        try:
            sender = self.address(env.sender_silo) if env.sender_silo else None
        except InvalidEnvelope:
            return None
        response = Message(
            id=next_message_id(),
            kind=MessageKind.RESPONSE,
            method=env.method[:200],
            body=body,
            target_silo=sender,
            sender_client=env.sender_client or None,
            correlation_id=env.id,
            status=ResponseStatus.REJECTED,
        )
        return response, sender


# Wire tags of Batch.messages (field 1) and Envelope.headers entries (field 16),
# both length-delimited.
_ENVELOPE_TAG = b"\x0a"
_HEADER_TAG = b"\x82\x01"


def count_items(frame: bytes, limit: int) -> int:
    """A number above ``limit`` if, and only if, ``frame`` holds more than
    ``limit`` envelopes and header entries, or bytes the walk cannot follow
    (``limit + 1``: no sender of ours writes them).

    Decoded, these items are what cost memory: about 180 bytes each in the
    protobuf arena and more as Python objects, so 4 MB of 4-byte envelopes
    would take hundreds of MB. Every item starts with its tag, so counting the
    tag bytes (at C speed) gives an upper bound that settles ordinary frames;
    an item takes at least two bytes, so small frames are not even counted.
    Only above ``limit`` is the frame walked field by field; an envelope of ours
    has at most 13 fields besides its headers, so the walk gives up (``limit +
    1``) after ``16 * limit`` fields: its cost is bounded too.
    """
    bound = len(frame) // 2
    if bound <= limit:
        return bound
    bound = frame.count(_ENVELOPE_TAG) + frame.count(_HEADER_TAG)
    if bound <= limit:
        return bound
    over = limit + 1
    steps_left = 16 * limit
    items = 0
    pos, end = 0, len(frame)
    while pos < end:
        field, wire, pos = _field(frame, pos)
        if wire != 2:
            pos = _skip(frame, pos, wire)
            steps_left -= 1
            continue
        length, pos = _varint(frame, pos)
        stop = pos + length
        if stop > end:
            return over
        if field == 1:
            items += 1
            while pos < stop:
                steps_left -= 1
                if steps_left < 0:
                    return over
                inner, inner_wire, pos = _field(frame, pos)
                if inner_wire != 2:
                    pos = _skip(frame, pos, inner_wire)
                    continue
                skip, pos = _varint(frame, pos)
                pos += skip
                if inner == 16:
                    items += 1
            if pos != stop:
                return over
            if items > limit:
                return items
        pos = stop
        steps_left -= 1
        if steps_left < 0:
            return over
    return items if pos == end else over


def _field(data: bytes, pos: int) -> tuple[int, int, int]:
    key, pos = _varint(data, pos)
    return key >> 3, key & 7, pos


def _skip(data: bytes, pos: int, wire: int) -> int:
    """Past a field of wire type ``wire`` other than length-delimited; past the
    end for groups and unknown wire types (no sender of ours writes them)."""
    if wire == 0:
        return _varint(data, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    return len(data) + 1


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(data)
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    return result, end + 1  # truncated or overlong: past the end ends every walk


def unencodable(message: Message) -> str | None:
    """Why ``message`` cannot go on the wire, or ``None``."""
    grain = message.target_grain
    if grain is not None and type(grain.key) is int and not _SINT64_MIN <= grain.key <= _SINT64_MAX:
        return "int grain keys must fit in 64 bits to travel"
    return None


def _frame_cost(message: Message) -> int:
    return len(message.body) + len(message.method) + _ENVELOPE_OVERHEAD


# -------------------------------------------------------------- frame writer


class Outbox:
    """A FIFO of messages drained into ``Batch`` frames by one writer task.

    ``pump`` writes until cancelled or a write fails; what was taken for a failed
    write stays in ``in_flight`` so the owner can hand it back.
    """

    __slots__ = (
        "_budget",
        "_codec",
        "_max_batch",
        "_max_items",
        "_wakeup",
        "idle",
        "in_flight",
        "peer",
        "queue",
        "stats",
    )

    def __init__(
        self,
        codec: FrameCodec,
        options: MessagingOptions,
        stats: WireStats,
        peer: WireStats | None = None,
    ) -> None:
        self.queue: deque[Message] = deque()
        self.in_flight: list[Message] = []
        self._wakeup = asyncio.Event()
        # Set while everything pushed has been written; lets a stop flush first.
        self.idle = asyncio.Event()
        self.idle.set()
        self._codec = codec
        self._max_batch = options.max_batch
        self._budget = options.max_message_size
        # What a receiver counts against max_frame_items: envelopes and header
        # entries (a traced call carries its trace context and principal too).
        self._max_items = options.max_frame_items
        self.stats = stats
        # Counts of this destination alone (metrics per peer), beside the totals.
        self.peer = peer

    def push(self, message: Message) -> None:
        queue = self.queue
        queue.append(message)
        # Only the first message after the queue ran dry can find the writer
        # parked (or ``idle`` set); later ones are taken by its next round.
        if len(queue) == 1:
            self.idle.clear()
            self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    def take_unsent(self) -> list[Message]:
        """Empty the outbox and return only what was never handed to a write,
        which is safe to send another way. What a failed write took may have
        arrived, so it is dropped, not returned."""
        unsent = list(self.queue)
        self.take_all()
        return unsent

    def take_all(self) -> list[Message]:
        """Everything not yet written (in flight first, then queued), emptied."""
        taken = self.in_flight + list(self.queue)
        self.in_flight = []
        self.queue.clear()
        self.idle.set()
        return taken

    async def pump(
        self,
        write: Callable[[bytes], Awaitable[None]],
        broken: Callable[[], bool],
        written: Callable[[list[Message]], None] | None = None,
    ) -> None:
        """Write frames until cancelled or a write fails; ``written(batch)`` after
        each frame that was written."""
        queue = self.queue
        stats = self.stats
        peer = self.peer
        while not broken():
            if not queue:
                self.idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self.in_flight
            cost = items = 0
            # Budget the frame so the receiver's size and item limits are not hit
            # by many messages together; one message always goes, however large.
            while queue and len(batch) < self._max_batch:
                head = queue[0]
                cost += _frame_cost(head)
                items += 1 + len(head.headers)
                if batch and (cost > self._budget or items > self._max_items):
                    break
                batch.append(queue.popleft())
            frame = self._codec.encode(batch)
            await write(frame)
            stats.frames_sent += 1
            stats.messages_sent += len(batch)
            if peer is not None:
                peer.frames_sent += 1
                peer.messages_sent += len(batch)
            self.in_flight = []
            if written is not None:
                written(batch)
