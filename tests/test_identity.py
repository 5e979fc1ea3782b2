"""Grain ids, silo addresses and the process-stable uniform hash."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from orleanspy import GrainId, SiloAddress, uniform_hash

SAMPLES = ["", "a", "Counter/s:a", "x" * 1000, "ünïcödé"]


def test_uniform_hash_is_stable_across_processes() -> None:
    here = [uniform_hash(s) for s in SAMPLES] + [GrainId("T", 5).uniform_hash()]
    code = (
        "from orleanspy import uniform_hash, GrainId; import sys, json; "
        f"print(json.dumps([uniform_hash(s) for s in {SAMPLES!r}] "
        "+ [GrainId('T', 5).uniform_hash()]))"
    )
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert out.stdout.strip() == str(here).replace("'", '"')


def test_uniform_hash_is_32_bit_and_spreads() -> None:
    values = {GrainId("Counter", i).uniform_hash() for i in range(10_000)}
    assert all(0 <= v < 2**32 for v in values)
    assert len(values) > 9_990
    top_bits = [0] * 8
    for v in values:
        top_bits[v >> 29] += 1
    assert min(top_bits) > 1_000


def test_grain_id_text_forms() -> None:
    gid = GrainId("Counter", 42)
    assert str(gid) == "Counter/42"
    assert gid.canonical == "Counter/i:42"
    assert GrainId("Counter", "42").canonical == "Counter/s:42"
    u = uuid.UUID(int=1)
    for g in (gid, GrainId("Counter", "a/b|c"), GrainId("C", u)):
        assert GrainId.parse(g.canonical) == g


@pytest.mark.parametrize("bad", [("", "k"), ("a/b", "k"), ("T", 1.5), ("T", True)])
def test_grain_id_rejects_bad_parts(bad: tuple[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        GrainId(*bad)  # type: ignore[arg-type]


def test_silo_address_round_trip() -> None:
    for a in (SiloAddress("127.0.0.1", 11111, 5), SiloAddress("::1", 1, 2)):
        assert SiloAddress.parse(str(a)) == a
    assert SiloAddress("::1", 1, 2).endpoint == "[::1]:1"


def test_parsed_silo_addresses_are_interned() -> None:
    text = "10.9.8.7:4242@1700000000123"
    first = SiloAddress.parse(text)
    assert SiloAddress.parse(text) is first
    made = SiloAddress("10.9.8.7", 4242, 1700000000123)
    assert made == first and made is not first and hash(made) == hash(first)
    assert made.intern() is first
    fresh = SiloAddress("10.9.8.7", 4243, 1).intern()  # the first of its kind is kept
    assert SiloAddress.parse(str(fresh)) is fresh
