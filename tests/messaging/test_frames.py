"""FrameCodec on its own: decoded grain ids and addresses are shared objects."""

from __future__ import annotations

import uuid

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.frames import FrameCodec
from orleanspy.messaging.message import Message, MessageKind, next_message_id

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
    return [codec.message(env, 1 << 20) for env in codec.decode(codec.encode(messages))]


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
