"""Decoding untrusted bytes is bounded: random and adversarial msgpack never takes
the process down, and every breach of a limit is a ``SerializationError``."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orleanspy import MessagingOptions, SerializationError, register_type
from orleanspy.serialization import Codec, DecodeLimits


@register_type(name="limits.Box")
@dataclass
class Box:
    inner: Any = None


def _ext(code: int, payload: bytes) -> bytes:
    return b"\xc9" + struct.pack(">I", len(payload)) + bytes([code]) + payload


def _key(inner: bytes) -> bytes:
    return b"\xa1k" + inner


# Each wraps a complete msgpack document in one more level of some container or
# extension, written byte by byte so that any depth can be built cheaply.
WRAPPERS: dict[str, Callable[[bytes], bytes]] = {
    "fixarray": lambda b: b"\x91" + b,
    "array16": lambda b: b"\xdc\x00\x01" + b,
    "array32": lambda b: b"\xdd\x00\x00\x00\x01" + b,
    "fixmap": lambda b: b"\x81" + _key(b),
    "map16": lambda b: b"\xde\x00\x01" + _key(b),
    "map32": lambda b: b"\xdf\x00\x00\x00\x01" + _key(b),
    "map_key": lambda b: b"\x81" + b + b"\xc0",
    "dataclass": lambda b: _ext(6, b"\x92\xaalimits.Box\x81\xa5inner" + b),
    "dataclass_bad": lambda b: _ext(6, b),
    "grain_id": lambda b: _ext(1, b),
    "grain_ref": lambda b: _ext(2, b),
    "datetime": lambda b: _ext(3, b),
    "timedelta": lambda b: _ext(4, b),
    "uuid": lambda b: _ext(5, b),
    "unknown_ext": lambda b: _ext(99, b),
}


def _decode(data: bytes, codec: Codec | None = None) -> None:
    """Decoding returns or raises ``SerializationError``; nothing else escapes."""
    with contextlib.suppress(SerializationError):
        (codec or Codec()).decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    _decode(data)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(WRAPPERS)), st.integers(1, 3000)),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([b"\xc0", b"\x90", b"\x80", b"\xa3abc", b"\x01", b""]),
)
def test_deep_nesting_of_every_container_and_extension(
    runs: list[tuple[str, int]], seed: bytes
) -> None:
    data = seed
    for name, times in runs:
        wrap = WRAPPERS[name]
        for _ in range(times):
            data = wrap(data)
    _decode(data)


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_twenty_thousand_levels_of_each_kind_fail_cleanly(name: str) -> None:
    data = b"\xc0"
    for _ in range(20_000):
        data = WRAPPERS[name](data)
    _decode(data)


def test_nested_dataclass_extensions_beyond_the_limit_are_refused() -> None:
    value: Any = None
    for _ in range(17):
        value = Box(value)
    codec = Codec(limits=DecodeLimits(max_ext_depth=16))
    with pytest.raises(SerializationError, match="nested more than 16 deep"):
        codec.decode(codec.encode(value))
    assert codec.decode(codec.encode(value.inner)) == value.inner


def test_nesting_depth_limit_is_exact() -> None:
    codec = Codec(limits=DecodeLimits(max_depth=100))
    ok: Any = []
    for _ in range(99):
        ok = [ok]
    assert codec.decode(codec.encode(ok)) == ok
    with pytest.raises(SerializationError, match="nested more than 100 deep"):
        codec.decode(codec.encode([ok]))
    with pytest.raises(SerializationError, match="nested more than 100 deep"):
        codec.decode(codec.encode({"a": ok, "b": [ok]}))


def test_sizes_are_bounded_by_messaging_options() -> None:
    options = MessagingOptions(max_container_length=10, max_string_length=16)
    codec = Codec(limits=DecodeLimits.of(options))
    assert codec.decode(codec.encode([1] * 10)) == [1] * 10
    for too_big in ([1] * 11, {str(i): i for i in range(11)}, "x" * 17, b"x" * 17):
        with pytest.raises(SerializationError):
            codec.decode(msgpack.packb(too_big, use_bin_type=True))


def test_the_eight_kilobyte_poison_body_is_refused() -> None:
    body = b"\xc0"
    for _ in range(200):
        body = WRAPPERS["dataclass"](body)
    data = b"\x92\x91" + body + b"\x80"  # (args, kwargs)
    assert len(data) < 8 * 1024
    with pytest.raises(SerializationError, match="nested more than"):
        Codec().decode(data)
