"""Local calls: immutable arguments are handed over as they are, mutable ones copied."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest

from orleanspy import Grain, GrainId, Silo, SiloOptions, TickStatus, register_type
from orleanspy.reminders.model import ReminderPriority
from orleanspy.runtime.immutable import all_immutable


@register_type(name="tests.FrozenPoint")
@dataclass(frozen=True)
class FrozenPoint:
    x: int
    label: str


@register_type(name="tests.MutablePoint")
@dataclass
class MutablePoint:
    x: int


@register_type(name="tests.FrozenHolder")
@dataclass(frozen=True)
class FrozenHolder:
    items: list[int]


@dataclass(frozen=True)
class Unregistered:
    x: int


class KeeperGrain(Grain):
    """Keeps what it was given and mutates it, as a careless grain might."""

    async def on_activate(self) -> None:
        self.kept: list[object] = []

    async def keep(self, value: object) -> None:
        self.kept.append(value)
        if isinstance(value, list):
            value.append("grain was here")
        elif isinstance(value, dict):
            value["grain"] = "was here"
        elif isinstance(value, MutablePoint):
            value.x = -1

    async def same(self, index: int, value: object) -> bool:
        return self.kept[index] is value


@pytest.fixture
async def silo() -> AsyncIterator[Silo]:
    async with Silo.local(SiloOptions(grain_types=(KeeperGrain,))) as s:
        yield s


def _tick() -> TickStatus:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    return TickStatus(
        first_tick_time=now,
        period=timedelta(seconds=1),
        cron=None,
        current_tick_time=now,
        delivered_at=now,
        priority=ReminderPriority.CRITICAL,
    )


async def test_mutable_arguments_are_copied_for_a_local_grain(silo: Silo) -> None:
    ref = silo.client.get_grain(KeeperGrain, "copy")
    values: list[object] = [[1, 2], {"a": 1}, MutablePoint(3), FrozenHolder([1])]
    for i, value in enumerate(values):
        await ref.keep(value)
        assert not await ref.same(i, value)
    assert values[0] == [1, 2]
    assert values[1] == {"a": 1}
    assert values[2] == MutablePoint(3)


async def test_immutable_arguments_reach_a_local_grain_uncopied(silo: Silo) -> None:
    ref = silo.client.get_grain(KeeperGrain, "same")
    values: list[object] = [
        _tick(),
        FrozenPoint(1, "a"),
        (1, "two", FrozenPoint(3, "c")),
        GrainId("T", uuid.uuid4()),
        datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2))),
    ]
    for i, value in enumerate(values):
        await ref.keep(value)
        assert await ref.same(i, value), value


def test_what_counts_as_immutable() -> None:
    yes = [
        None,
        True,
        2**63,
        1.5,
        "s",
        b"b",
        ReminderPriority.NORMAL,
        uuid.uuid4(),
        timedelta(1),
        datetime.now(UTC),
        _tick(),
        (1, (2, ("x",))),
    ]
    no = [
        [1],
        {"a": 1},
        {1},
        2**64,  # beyond msgpack: must fail through the codec as it would remotely
        MutablePoint(1),
        FrozenHolder([1]),
        Unregistered(1),
        (1, [2]),
        object(),
    ]
    for value in yes:
        assert all_immutable((value,), {}), value
        assert all_immutable((), {"k": value}), value
    for value in no:
        assert not all_immutable((value,), {}), value
        assert not all_immutable((1,), {"k": value}), value
