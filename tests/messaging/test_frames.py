"""FrameCodec on its own: decoded grain ids and addresses are shared objects; a
frame's items are counted before it is decoded, and a sender's frames stay within
the item limit."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid

import pytest

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.frames import FrameCodec, InvalidEnvelope, Outbox, WireStats, count_items
from orleanspy.messaging.message import Message, MessageKind, next_message_id
from orleanspy.options import MessagingOptions
from orleanspy.testing.cluster import wait_for

HERE = SiloAddress("127.0.0.1", 11111, 42)  # equal to, not the same object as, the interned one


def request(grain: GrainId) -> Message:
    return Message(
        id=next_message_id(),
        kind=MessageKind.REQUEST,
        target_grain=grain,
        method="m",
        sender_silo=SiloAddress("127.0.0.1", 22222, 7),
        target_silo=HERE,
    )


def round_trip(codec: FrameCodec, messages: list[Message]) -> list[Message]:
    frame = codec.encode(messages)
    return [codec.message(env, 1 << 20) for env in codec.decode(frame, 10_000)]


def test_repeated_grains_decode_to_one_object_and_keys_keep_their_type() -> None:
    codec = FrameCodec()
    key = uuid.uuid4()
    sent = [GrainId("G", 1), GrainId("G", "1"), GrainId("G", key), GrainId("G", 1)]
    first = round_trip(codec, [request(g) for g in sent])
    again = round_trip(codec, [request(g) for g in sent])

    assert [m.target_grain for m in first] == sent
    assert type(first[0].target_grain.key) is int  # type: ignore[union-attr]
    assert type(first[1].target_grain.key) is str  # type: ignore[union-attr]
    assert first[0].target_grain is first[3].target_grain
    assert all(a.target_grain is b.target_grain for a, b in zip(first, again, strict=True))


def test_addresses_decode_to_the_interned_object() -> None:
    codec = FrameCodec()
    here = SiloAddress("127.0.0.1", 11111, 42).intern()  # as a transport does
    (decoded,) = round_trip(codec, [request(GrainId("G", 1))])
    assert decoded.target_silo is here
    assert decoded.sender_silo is SiloAddress.parse("127.0.0.1:22222@7")


def test_the_grain_cache_is_bounded() -> None:
    codec = FrameCodec()
    for start in range(0, 20_000, 1000):
        round_trip(codec, [request(GrainId("G", k)) for k in range(start, start + 1000)])
    assert len(codec._grains) <= 8192


def with_headers(n: int, body: bytes) -> Message:
    msg = request(GrainId("G", n))
    msg.body = body
    msg.headers = {f"h{i}": "v" for i in range(n)}
    return msg


def test_item_count_exceeds_the_limit_exactly_when_the_frame_does() -> None:
    codec = FrameCodec()
    rng = random.Random(7)
    for _ in range(50):
        messages = [
            # Bodies full of tag bytes force the walk; headers are items too.
            with_headers(rng.randrange(4), bytes(rng.choice(b"\x0a\x82\x01a") for _ in range(300)))
            for _ in range(rng.randrange(1, 40))
        ]
        frame = codec.encode(messages)
        expected = len(messages) + sum(len(m.headers) for m in messages)
        for limit in (1, 5, expected - 1, expected, expected + 1):
            counted = count_items(frame, limit)
            assert (counted > limit) == (expected > limit)
            assert counted <= max(expected, limit + 1)


def test_a_frame_over_the_item_limit_is_refused_before_decoding() -> None:
    codec = FrameCodec()
    tiny = b"\x0a\x02\x08\x01" * 1000
    with pytest.raises(InvalidEnvelope, match="max_frame_items"):
        codec.decode(tiny, 999)
    assert len(codec.decode(tiny, 1000)) == 1000
    many_headers = codec.encode([with_headers(50, b"")])
    with pytest.raises(InvalidEnvelope, match="max_frame_items"):
        codec.decode(many_headers, 50)
    assert len(codec.decode(many_headers, 51)) == 1


@pytest.mark.parametrize(
    "frame",
    [
        b"\x0b" + b"\x0a\x02\x08\x01" * 100,  # a group (wire type 3) hides what follows
        b"\x0a\x0a" * 10 + b"\x0a\xff",  # truncated length
        b"\x0a\x0a" * 10 + b"\x10" + b"\x80" * 20,  # overlong varint
        b"\x0a\x05\x08\x01" + b"\x0a\x02\x08\x01" * 100,  # length past the end
        b"\x0a\x90\x03" + b"\x08\x01" * 200 + b"\x0a\x00" * 10,  # too many fields to walk
    ],
)
def test_bytes_the_walk_cannot_follow_count_as_too_many(frame: bytes) -> None:
    assert count_items(frame, 10) == 11
    with pytest.raises(InvalidEnvelope):
        FrameCodec.decode(frame, 10)


async def test_a_sender_cuts_its_frames_to_the_item_limit_its_peers_apply() -> None:
    """Traced calls carry more headers (trace context, principal): a frame of ours
    never holds more envelopes and header entries than ``max_frame_items``, so a
    peer with the same setting never refuses it."""
    options = MessagingOptions(max_batch=32, max_frame_items=64)
    outbox = Outbox(FrameCodec(), options, WireStats())
    for i in range(100):
        msg = Message.request(GrainId("T", i), "m", b"x", one_way=True, expires_at_ms=0)
        msg.headers.update(
            traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", tracestate="k=v",
            principal="local",
        )  # fmt: skip
        outbox.push(msg)
    frames: list[bytes] = []

    async def write(frame: bytes) -> None:
        frames.append(frame)

    task = asyncio.ensure_future(outbox.pump(write, lambda: False))
    await wait_for(lambda: outbox.idle.is_set() and not outbox.queue, timeout=5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # A peer with the same limit takes every frame (it counts before decoding).
    decoded = [FrameCodec.decode(frame, 64) for frame in frames]
    items = [len(envs) + sum(len(e.headers) for e in envs) for envs in decoded]
    assert sum(items) == 400 and max(items) <= 64, items
    assert len(frames) >= 400 // 64
