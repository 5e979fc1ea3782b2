"""The embedded runtime: activation, turns, reentrancy, errors, method rules."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest

from orleanspy import (
    ActivationError,
    ClosedError,
    ConfigurationError,
    Grain,
    GrainCallTimeoutError,
    GrainId,
    GrainMethodNotFoundError,
    MessagingOptions,
    RemoteGrainError,
    SerializationError,
    Silo,
    SiloOptions,
    UnknownGrainTypeError,
    always_interleave,
    read_only,
    reentrant,
)
from orleanspy.reference import GrainReference


class ActivationCountingGrain(Grain):
    activations = 0

    async def on_activate(self) -> None:
        type(self).activations += 1
        await asyncio.sleep(0)  # give concurrent first calls a chance to race
        self.calls = 0

    async def hit(self) -> int:
        self.calls += 1
        return self.calls


class TurnProbeGrain(Grain):
    """Records overlap: a second call entering while one is inside is interleaving."""

    async def on_activate(self) -> None:
        self.inside = 0
        self.max_inside = 0

    async def work(self, yields: int) -> int:
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        for _ in range(yields):
            await asyncio.sleep(0)
        self.inside -= 1
        return self.max_inside

    @read_only
    async def peek(self, yields: int) -> int:
        return await self.work(yields)

    @always_interleave
    async def status(self) -> int:
        return self.inside


@reentrant
class ReentrantProbeGrain(TurnProbeGrain):
    pass


class PingGrain(Grain):
    async def ping_other(self, other_key: str, depth: int) -> int:
        if depth == 0:
            return 0
        other = self.get_grain(PingGrain, other_key)
        return 1 + await other.ping_other(str(self.grain_key), depth - 1)

    async def call_self(self) -> str:
        me = self.get_grain(PingGrain, self.grain_key)
        return await me.echo("self")

    async def echo(self, value: str) -> str:
        return value

    async def call_via(self, ref: PingGrain, value: str) -> str:
        return await ref.echo(value)


class FlakyActivationGrain(Grain):
    fail_next = True

    async def on_activate(self) -> None:
        if FlakyActivationGrain.fail_next:
            FlakyActivationGrain.fail_next = False
            raise RuntimeError("database not ready")

    async def hello(self) -> str:
        return "hello"


class AppError(Exception):
    pass


class OddError(Exception):
    def __init__(self, a: int, b: int) -> None:  # not constructible from one string
        super().__init__(f"{a}/{b}")


class ErrorGrain(Grain):
    async def value_error(self) -> None:
        raise ValueError("bad value")

    async def app_error(self) -> None:
        raise AppError("app failed")

    async def odd_error(self) -> None:
        raise OddError(1, 2)

    async def unserializable_result(self) -> object:
        return object()

    async def slow(self) -> None:
        await asyncio.Event().wait()

    async def _private(self) -> int:
        return 1


class QueueGrain(Grain):
    """Holds its turn until ``release`` is set; records what ran after it."""

    holding: asyncio.Event
    release: asyncio.Event
    ran: list[str]

    async def hold(self) -> None:
        QueueGrain.holding.set()
        await QueueGrain.release.wait()

    async def mark(self, what: str) -> None:
        QueueGrain.ran.append(what)


@pytest.fixture
async def silo():
    async with Silo.local() as s:
        yield s


async def test_concurrent_first_calls_make_one_activation(silo: Silo) -> None:
    ActivationCountingGrain.activations = 0
    ref = silo.client.get_grain(ActivationCountingGrain, "x")
    results = await asyncio.gather(*(ref.hit() for _ in range(50)))
    assert ActivationCountingGrain.activations == 1
    assert sorted(results) == list(range(1, 51))
    assert silo.activation_count == 1


async def test_turns_never_interleave_for_non_reentrant_grain(silo: Silo) -> None:
    ref = silo.client.get_grain(TurnProbeGrain, "t")
    seen = await asyncio.gather(*(ref.work(5) for _ in range(20)))
    assert max(seen) == 1


async def test_reentrant_grain_interleaves(silo: Silo) -> None:
    ref = silo.client.get_grain(ReentrantProbeGrain, "r")
    seen = await asyncio.gather(*(ref.work(5) for _ in range(20)))
    assert max(seen) > 1


async def test_read_only_calls_interleave_with_each_other_only(silo: Silo) -> None:
    ref = silo.client.get_grain(TurnProbeGrain, "ro")
    seen = await asyncio.gather(*(ref.peek(5) for _ in range(10)))
    assert max(seen) > 1
    ref2 = silo.client.get_grain(TurnProbeGrain, "ro2")
    mixed = await asyncio.gather(ref2.work(5), ref2.peek(5), ref2.work(5))
    assert max(mixed) == 1


async def test_always_interleave_runs_during_a_turn(silo: Silo) -> None:
    ref = silo.client.get_grain(TurnProbeGrain, "ai")
    busy = asyncio.ensure_future(ref.work(200))
    for _ in range(50):
        if await ref.status() == 1:
            break
    else:
        pytest.fail("always_interleave call never observed the running turn")
    assert await busy == 1


async def test_call_chain_back_into_a_waiting_grain_does_not_deadlock() -> None:
    opts = SiloOptions(messaging=MessagingOptions(response_timeout=timedelta(seconds=5)))
    async with Silo.local(opts) as silo:
        a = silo.client.get_grain(PingGrain, "a")
        assert await a.ping_other("b", 4) == 4  # a -> b -> a -> b -> a
        assert await a.call_self() == "self"


async def test_grain_reference_travels_as_argument(silo: Silo) -> None:
    a = silo.client.get_grain(PingGrain, "a")
    b = silo.client.get_grain(PingGrain, "b")
    assert await a.call_via(b, "via b") == "via b"


async def test_on_activate_failure_fails_call_and_leaves_nothing(silo: Silo) -> None:
    FlakyActivationGrain.fail_next = True
    ref = silo.client.get_grain(FlakyActivationGrain, "f")
    with pytest.raises(ActivationError, match="database not ready"):
        await ref.hello()
    assert silo.activation_count == 0
    assert await ref.hello() == "hello"  # a fresh activation
    assert silo.activation_count == 1


async def test_builtin_and_importable_exceptions_keep_their_type(silo: Silo) -> None:
    ref = silo.client.get_grain(ErrorGrain, "e")
    with pytest.raises(ValueError, match="bad value") as info:
        await ref.value_error()
    assert any("remote traceback" in n for n in info.value.__notes__)
    with pytest.raises(AppError, match="app failed"):
        await ref.app_error()


async def test_unrebuildable_exception_becomes_remote_grain_error(silo: Silo) -> None:
    ref = silo.client.get_grain(ErrorGrain, "e")
    with pytest.raises(RemoteGrainError) as info:
        await ref.odd_error()
    assert info.value.remote_type.endswith("OddError")
    assert info.value.remote_message == "1/2"
    assert "odd_error" in info.value.remote_traceback


async def test_unserializable_argument_and_result(silo: Silo) -> None:
    ref = silo.client.get_grain(PingGrain, "s")
    with pytest.raises(SerializationError, match="object"):
        await ref.echo(object())
    with pytest.raises(SerializationError):
        await silo.client.get_grain(ErrorGrain, "s").unserializable_result()


async def test_private_sync_and_base_methods_are_not_callable(silo: Silo) -> None:
    ref = silo.client.get_grain(ErrorGrain, "m")
    for name in ("_private", "on_activate", "register_timer", "nope"):
        with pytest.raises(GrainMethodNotFoundError):
            getattr(ref, name)
    assert not hasattr(ref, "nope")
    untyped = silo.client.get_grain("ErrorGrain", "m")
    with pytest.raises(GrainMethodNotFoundError, match="_private"):
        await untyped._private()
    with pytest.raises(GrainMethodNotFoundError):
        await untyped.on_deactivate()
    assert silo.activation_count == 0  # rejected before any activation


def test_a_public_sync_method_is_rejected_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError, match=r"SyncGrain\.total .*not 'async def'"):

        class SyncGrain(Grain):
            def total(self) -> int:
                return 1

    class HelperGrain(Grain):  # private helpers, static and class methods stay allowed
        def _helper(self) -> int:
            return 1

        @staticmethod
        def util() -> int:
            return 1


async def test_unknown_grain_type_is_rejected(silo: Silo) -> None:
    with pytest.raises(UnknownGrainTypeError, match="NoSuchGrain"):
        await silo.client.get_grain("NoSuchGrain", "k").anything()


async def test_typed_proxies_are_one_class_per_grain_class_with_real_methods(silo: Silo) -> None:
    ref = silo.client.get_grain(PingGrain, 1)
    by_name = silo.client.get_grain("PingGrain", 2)
    assert isinstance(ref, GrainReference)
    assert type(by_name) is type(ref)
    assert "echo" in vars(type(ref))  # a method of the class, not a __getattr__ closure
    assert ref.grain_id == GrainId("PingGrain", 1)  # the reference's own names keep their meaning
    assert await ref.echo("typed") == "typed"
    assert await by_name.echo("by name") == "by name"


class LoopingGrain(Grain):
    async def echo_many(self, times: int) -> None:
        ping = self.get_grain(PingGrain, "loop")
        for i in range(times):
            await ping.echo(i)


async def test_a_grain_calling_local_grains_in_a_loop_still_yields_to_the_loop(
    silo: Silo,
) -> None:
    # A local call to an idle activation runs inline in the caller's task and
    # need not suspend; so that a grain awaiting local grains back to back
    # cannot starve everything else, every 64th such call yields to the loop
    # first (Dispatcher._INLINE_STREAK).
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks = 0
    try:
        await silo.client.get_grain(LoopingGrain, 1).echo_many(640)
    finally:
        task.cancel()
    assert ticks >= 640 // 64


async def test_untyped_proxy_calls_by_type_name(silo: Silo) -> None:
    ref = silo.client.get_grain("PingGrain", 7)
    assert await ref.echo("untyped") == "untyped"


async def test_call_times_out_with_grain_call_timeout_error() -> None:
    opts = SiloOptions(
        messaging=MessagingOptions(response_timeout=timedelta(milliseconds=50)),
        deactivation_timeout=timedelta(milliseconds=100),  # the hung turn bounds stop()
    )
    async with Silo.local(opts) as silo:
        with pytest.raises(GrainCallTimeoutError, match="slow"):
            await silo.client.get_grain(ErrorGrain, "t").slow()


async def test_a_call_whose_caller_gave_up_while_it_queued_is_not_run() -> None:
    """A call that waited for its turn past its caller's deadline is dropped, not
    run late: the caller may have sent it again (a reminder tick retried), and
    running both would run it twice."""
    QueueGrain.holding, QueueGrain.release = asyncio.Event(), asyncio.Event()
    QueueGrain.ran = []
    opts = SiloOptions(messaging=MessagingOptions(response_timeout=timedelta(milliseconds=100)))
    async with Silo.local(opts) as silo:
        g = silo.client.get_grain(QueueGrain, "q")
        hold = asyncio.ensure_future(g.hold())
        await QueueGrain.holding.wait()
        with pytest.raises(GrainCallTimeoutError):
            await g.mark("late")  # queued behind hold() until its caller gives up
        QueueGrain.release.set()
        with contextlib.suppress(GrainCallTimeoutError):
            await hold  # its own deadline may have passed too
        await g.mark("on time")  # the activation serves as before
        assert QueueGrain.ran == ["on time"]


async def test_stopped_silo_refuses_calls_and_restart() -> None:
    silo = Silo.local()
    await silo.start()
    await silo.stop()
    with pytest.raises(ClosedError):
        silo.client.get_grain(PingGrain, "x")
    with pytest.raises(ClosedError):
        await silo.start()
