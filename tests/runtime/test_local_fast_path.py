"""Local calls: immutable arguments are handed over as they are, mutable ones copied;
a call to an idle local activation runs inline in the caller's task and looks the same.
On an embedded silo, so does the call that activates a grain whose activation
cannot wait (no persistent state, the default ``on_activate``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import pytest

from orleanspy import (
    ActivationError,
    Grain,
    GrainCallTimeoutError,
    GrainId,
    MessagingOptions,
    Remindable,
    SerializationError,
    Silo,
    SiloOptions,
    TickStatus,
    register_type,
)
from orleanspy.metrics import RecordingGrainMetrics
from orleanspy.reminders.model import ReminderPriority
from orleanspy.runtime.immutable import all_immutable
from orleanspy.testing import simulate_tick


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


async def test_keyword_arguments_follow_the_same_rule(silo: Silo) -> None:
    ref = silo.client.get_grain(KeeperGrain, "kw")
    await ref.keep(value=0)  # activates it: the calls below run inline
    mutable, frozen = [1], FrozenPoint(1, "a")
    await ref.keep(value=mutable)
    await ref.keep(value=frozen)
    assert not await ref.same(1, mutable)
    assert mutable == [1]
    assert await ref.same(2, frozen)
    assert await ref.same(index=2, value=frozen)


async def test_an_int_the_codec_cannot_carry_fails_as_through_the_codec(silo: Silo) -> None:
    ref = silo.client.get_grain(KeeperGrain, "big")
    await ref.keep(0)
    for big in (2**64, -(2**63) - 1):
        with pytest.raises(SerializationError):
            await ref.keep(big)
        with pytest.raises(SerializationError):
            await ref.keep(value=big)
    assert await ref.same(0, 0)  # nothing else reached the grain


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


class InlineGrain(Grain):
    """A grain whose calls, once it is active and idle, run inline in the caller."""

    async def on_activate(self) -> None:
        self.items: list[int] = []
        self.gate = asyncio.Event()
        self.cancelled = False

    async def ping(self) -> None:
        pass

    async def items_after(self, n: int) -> list[int]:
        self.items.append(n)
        return self.items

    async def pair(self) -> tuple[int, int]:
        return (1, 2)

    async def fail(self) -> None:
        raise KeyError("missing")

    async def hang(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def was_cancelled(self) -> bool:
        return self.cancelled


async def _active(silo: Silo, key: str) -> InlineGrain:
    g = silo.client.get_grain(InlineGrain, key)
    await g.ping()  # activates it; later calls find it idle and run inline
    act = silo.dispatcher.catalog.get(GrainId("InlineGrain", key))
    assert act is not None and act.idle_and_valid()
    return g


async def test_an_inline_call_copies_a_mutable_result_and_lists_a_tuple() -> None:
    async with Silo.local(SiloOptions(grain_types=(InlineGrain,))) as silo:
        g = await _active(silo, "copy")
        first = await g.items_after(1)
        first.append(99)  # the caller's copy, not the grain's list
        assert await g.items_after(2) == [1, 2]
        # As through the codec (a remote caller's view), a tuple comes back as a list.
        assert await g.pair() == [1, 2]


async def test_an_inline_call_raises_what_a_queued_call_raises() -> None:
    async with Silo.local(SiloOptions(grain_types=(InlineGrain,))) as silo:
        g = await _active(silo, "err")
        with pytest.raises(KeyError, match="missing") as caught:
            await g.fail()
        # Rebuilt from the error payload, as for a queued call: not the grain's object.
        assert caught.value.__traceback__ is not None
        assert await g.was_cancelled() is False  # the activation is still there and idle


#: A response timeout short enough to hit: ``hang`` outlasts it.
SHORT_TIMEOUT = SiloOptions(
    grain_types=(InlineGrain,),
    messaging=MessagingOptions(response_timeout=timedelta(milliseconds=80)),
)


async def test_an_inline_call_times_out_with_grain_call_timeout_error() -> None:
    async with Silo.local(SHORT_TIMEOUT) as silo:
        g = await _active(silo, "slow")
        with pytest.raises(GrainCallTimeoutError, match="hang"):
            await g.hang()
        # The turn ran in the caller's task, so the timeout ended it too, and
        # the activation takes calls again.
        assert await g.was_cancelled() is True
        assert current_task_cancelling() == 0


async def test_cancelling_the_caller_cancels_its_inline_turn() -> None:
    async with Silo.local(SiloOptions(grain_types=(InlineGrain,))) as silo:
        g = await _active(silo, "cancel")
        call = asyncio.ensure_future(g.hang())
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await g.was_cancelled() is True


async def test_inline_calls_are_recorded_when_metrics_record() -> None:
    async with Silo.local(SHORT_TIMEOUT) as silo:
        g = await _active(silo, "metered")
        metrics = RecordingGrainMetrics()
        silo.dispatcher.grain_metrics = metrics  # what the silo installs with an exporter
        for _ in range(3):
            await g.ping()
        with pytest.raises(KeyError):
            await g.fail()
        with pytest.raises(GrainCallTimeoutError):
            await g.hang()
        call = asyncio.ensure_future(g.hang())
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert metrics.by_method == {
            ("InlineGrain", "ping"): [3, 0],
            ("InlineGrain", "fail"): [1, 1],
            ("InlineGrain", "hang"): [2, 2],
        }
        series = metrics.by_type["InlineGrain"]
        assert (series.count, series.errors) == (6, 3)
        assert series.sum > 0.08  # the timed-out call alone took the timeout


def current_task_cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


class ColdGrain(Grain, Remindable):
    """Nothing in its activation can wait: no state, the default ``on_activate``."""

    made = 0
    fail_init = False
    tasks: list[asyncio.Task[object] | None] = []

    def __init__(self) -> None:
        ColdGrain.made += 1
        if ColdGrain.fail_init:
            ColdGrain.fail_init = False
            raise RuntimeError("constructor failed")
        self.inside = 0
        self.overlap = False

    async def where(self) -> None:
        ColdGrain.tasks.append(asyncio.current_task())

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        ColdGrain.tasks.append(asyncio.current_task())

    async def work(self) -> bool:
        self.inside += 1
        self.overlap |= self.inside > 1
        for _ in range(3):
            await asyncio.sleep(0)
        self.inside -= 1
        return self.overlap


class WaitingActivationGrain(Grain):
    """``on_activate`` may wait: its activation is a task of its own."""

    async def on_activate(self) -> None:
        await asyncio.sleep(0)

    async def where(self) -> None:
        ColdGrain.tasks.append(asyncio.current_task())


@pytest.fixture
def cold() -> None:
    ColdGrain.made = 0
    ColdGrain.fail_init = False
    ColdGrain.tasks = []


@pytest.mark.usefixtures("cold")
async def test_the_call_that_activates_a_grain_runs_inline_in_the_callers_task() -> None:
    async with Silo.local(SiloOptions(grain_types=(ColdGrain, WaitingActivationGrain))) as silo:
        await silo.client.get_grain(ColdGrain, "c").where()
        assert ColdGrain.tasks == [asyncio.current_task()]
        act = silo.dispatcher.catalog.get(GrainId("ColdGrain", "c"))
        assert act is not None and act.idle_and_valid()
        # A grain whose on_activate can wait still activates in a task, which
        # runs the first call as its turn.
        await silo.client.get_grain(WaitingActivationGrain, "w").where()
        assert ColdGrain.tasks[1] is not asyncio.current_task()
        assert ColdGrain.made == 1


@pytest.mark.usefixtures("cold")
async def test_a_reminder_tick_that_activates_a_grain_runs_inline() -> None:
    async with Silo.local(SiloOptions(grain_types=(ColdGrain,))) as silo:
        for key in range(3):
            await simulate_tick(silo, ColdGrain, key, "r")
        assert ColdGrain.tasks == [asyncio.current_task()] * 3
        assert ColdGrain.made == 3
        assert silo.activation_count == 3


@pytest.mark.usefixtures("cold")
async def test_a_failing_constructor_fails_the_first_call_and_leaves_nothing() -> None:
    async with Silo.local(SiloOptions(grain_types=(ColdGrain,))) as silo:
        ColdGrain.fail_init = True
        ref = silo.client.get_grain(ColdGrain, "f")
        with pytest.raises(ActivationError, match="constructor failed"):
            await ref.where()
        assert silo.activation_count == 0
        assert ColdGrain.made == 1  # one constructor run for the failed call
        await ref.where()  # a fresh activation
        assert ColdGrain.made == 2
        assert silo.activation_count == 1


@pytest.mark.usefixtures("cold")
async def test_concurrent_first_calls_meet_one_activation_and_take_turns() -> None:
    async with Silo.local(SiloOptions(grain_types=(ColdGrain,))) as silo:
        ref = silo.client.get_grain(ColdGrain, "t")
        overlaps = await asyncio.gather(*(ref.work() for _ in range(5)))
        assert overlaps == [False] * 5
        assert ColdGrain.made == 1
