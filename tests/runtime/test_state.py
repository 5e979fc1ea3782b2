"""Grain persistent state in a silo: loading before on_activate, write/read/clear,
several states, surviving deactivation, optimistic concurrency between two
activations of one grain, configuration and bad data."""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import pytest

from orleanspy import (
    ActivationError,
    ConfigurationError,
    Grain,
    InconsistentStateError,
    Silo,
    SiloOptions,
    StorageUnavailableError,
    persistent_state,
)
from orleanspy.identity import GrainId
from orleanspy.serialization import Codec
from orleanspy.state import PersistentState, StateDeclaration, decode_state, encode_state
from orleanspy.storage.memory import InMemoryGrainStorage
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.activations import duplicate_activations
from orleanspy.testing.cluster import wait_for
from orleanspy.testing.redis_server import RedisServer


@dataclass
class Profile:
    name: str = ""
    plan: str = "free"
    visits: int = 0


@dataclass
class Cart:
    items: list[str] = field(default_factory=list)


class StateAccountGrain(Grain):
    profile = persistent_state(Profile, storage="default")
    cart = persistent_state(Cart, name="shopping-cart")

    def __init__(self) -> None:
        self.plan_in_init = self.profile.state.plan

    async def on_activate(self) -> None:
        self.seen_on_activate = (self.profile.state.plan, self.profile.etag, self.profile.exists)

    async def set_plan(self, plan: str) -> str | None:
        self.profile.state.plan = plan
        await self.profile.write()
        return self.profile.etag

    async def add_item(self, item: str) -> list[str]:
        self.cart.state.items.append(item)
        await self.cart.write()
        return self.cart.state.items

    async def visit(self) -> int:
        self.profile.state.visits += 1
        await self.profile.write()
        return self.profile.state.visits

    async def activation_view(self) -> tuple[str, str | None, bool, str]:
        plan, etag, exists = self.seen_on_activate
        return plan, etag, exists, self.plan_in_init

    async def view(self) -> tuple[str, int, str | None, bool, list[str]]:
        p = self.profile
        return p.state.plan, p.state.visits, p.etag, p.exists, self.cart.state.items

    async def reload(self) -> str:
        await self.profile.read()
        return self.profile.state.plan

    async def clear(self) -> tuple[str, str | None, bool]:
        await self.profile.clear()
        return self.profile.state.plan, self.profile.etag, self.profile.exists

    async def leave(self) -> None:
        self.deactivate_on_idle()


async def _gone(silo: Silo, gid: GrainId) -> bool:
    return silo.dispatcher.catalog.get(gid) is None


async def test_state_starts_as_the_default_and_is_loaded_before_on_activate() -> None:
    async with Silo.local() as silo:
        g = silo.client.get_grain(StateAccountGrain, "new")
        assert await g.activation_view() == ["free", None, False, "free"]
        assert await g.view() == ["free", 0, None, False, []]


async def test_write_survives_deactivation_and_is_loaded_before_on_activate() -> None:
    async with Silo.local() as silo:
        g = silo.client.get_grain(StateAccountGrain, "a")
        etag = await g.set_plan("gold")
        assert etag is not None
        await g.add_item("lamp")
        await g.leave()
        gid = GrainId("StateAccountGrain", "a")
        await wait_for(lambda: _gone(silo, gid), timeout=10, what="deactivated")
        assert await g.activation_view() == ["gold", etag, True, "gold"]
        assert await g.view() == ["gold", 0, etag, True, ["lamp"]]


async def test_several_states_are_stored_apart_under_their_names() -> None:
    storage = InMemoryGrainStorage()
    async with Silo.local(SiloOptions(storage={"default": storage})) as silo:
        g = silo.client.get_grain(StateAccountGrain, "b")
        await g.set_plan("gold")
        await g.add_item("chair")
        gid = GrainId("StateAccountGrain", "b")
        profile = await storage.read(gid, "profile")
        cart = await storage.read(gid, "shopping-cart")
        assert profile is not None and cart is not None and profile.etag != cart.etag
        codec = Codec()
        assert decode_state(cart.data, Cart, codec, what="t") == Cart(["chair"])
        assert decode_state(profile.data, Profile, codec, what="t").plan == "gold"


async def test_read_reloads_and_clear_removes() -> None:
    storage = InMemoryGrainStorage()
    async with Silo.local(SiloOptions(storage={"default": storage})) as silo:
        g = silo.client.get_grain(StateAccountGrain, "c")
        await g.set_plan("gold")
        gid = GrainId("StateAccountGrain", "c")
        # Someone else changes the stored state: read() picks it up.
        stored = await storage.read(gid, "profile")
        assert stored is not None
        data = encode_state(Profile(plan="silver"), Codec())
        assert await storage.write(gid, "profile", data, stored.etag) is not None
        assert await g.reload() == "silver"
        assert await g.clear() == ["free", None, False]
        assert await storage.read(gid, "profile") is None
        assert await g.view() == ["free", 0, None, False, []]
        # Writing after a clear stores again.
        assert await g.set_plan("bronze") is not None
        assert await storage.read(gid, "profile") is not None


@pytest.fixture(params=["memory", "redis", "postgres"])
def shared_storage(request: pytest.FixtureRequest) -> InMemoryGrainStorage | str:
    """Grain storage two silos share: a memory provider, or a Redis or PostgreSQL URL."""
    if request.param == "memory":
        return InMemoryGrainStorage()
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


async def test_second_activation_writing_gets_inconsistent_state_and_reloads(
    shared_storage: InMemoryGrainStorage | str,
) -> None:
    async with duplicate_activations(shared_storage) as (a, b):
        first = a.client.get_grain(StateAccountGrain, "twin")
        second = b.client.get_grain(StateAccountGrain, "twin")
        # Both activations exist and have read "nothing stored".
        assert await first.view() == ["free", 0, None, False, []]
        assert await second.view() == ["free", 0, None, False, []]
        gid = GrainId("StateAccountGrain", "twin")
        assert a.dispatcher.catalog.get(gid) is not None
        assert b.dispatcher.catalog.get(gid) is not None
        assert await first.visit() == 1
        with pytest.raises(InconsistentStateError, match="another activation changed it"):
            await second.visit()
        # The losing activation is deactivated; the next call reloads the state.
        await wait_for(lambda: _gone(b, gid), timeout=10, what="the stale activation gone")
        assert await second.visit() == 2
        # Now the first one is the stale one.
        with pytest.raises(InconsistentStateError):
            await first.visit()
        await wait_for(lambda: _gone(a, gid), timeout=10, what="the other one gone")
        plan, visits, etag, exists, _ = await first.view()
        assert (plan, visits, exists) == ("free", 2, True) and etag is not None


class CatchingGrain(Grain):
    """Handles the conflict itself: reloads and retries, staying active."""

    counter = persistent_state(Profile)

    async def bump(self) -> int:
        self.counter.state.visits += 1
        try:
            await self.counter.write()
        except InconsistentStateError:
            await self.counter.read()
            self.counter.state.visits += 1
            await self.counter.write()
        return self.counter.state.visits


async def test_a_grain_that_handles_the_conflict_stays_active() -> None:
    async with duplicate_activations(InMemoryGrainStorage()) as (a, b):
        first = a.client.get_grain(CatchingGrain, "k")
        second = b.client.get_grain(CatchingGrain, "k")
        assert await first.bump() == 1
        assert await second.bump() == 2  # its write lost, it reloaded and retried
        gid = GrainId("CatchingGrain", "k")
        assert b.dispatcher.catalog.get(gid) is not None


class ArchiveGrain(Grain):
    archive = persistent_state(Profile, storage="archive")

    async def plan(self) -> str:
        return self.archive.state.plan


async def test_a_missing_storage_name_fails_activation_clearly() -> None:
    async with Silo.local() as silo:
        with pytest.raises(ActivationError, match="'archive', which this silo does not have"):
            await silo.client.get_grain(ArchiveGrain, "x").plan()
    archive = InMemoryGrainStorage()
    options = SiloOptions(storage={"default": "memory://", "archive": archive})
    async with Silo.local(options) as silo:
        assert await silo.client.get_grain(ArchiveGrain, "x").plan() == "free"


async def test_bad_data_in_storage_fails_the_activation_and_the_silo_keeps_running() -> None:
    storage = InMemoryGrainStorage()
    gid = GrainId("StateAccountGrain", "bad")
    await storage.write(gid, "profile", b"\x01\xc1 not msgpack", None)
    async with Silo.local(SiloOptions(storage={"default": storage})) as silo:
        with pytest.raises(ActivationError, match="StateAccountGrain/bad state 'profile'"):
            await silo.client.get_grain(StateAccountGrain, "bad").view()
        assert await storage.read(gid, "profile") is not None, "the bad record is kept"
        assert await silo.client.get_grain(StateAccountGrain, "good").set_plan("gold")


async def test_a_cluster_silo_defaults_to_redis_storage(redis_url: str) -> None:
    options = SiloOptions(redis_url=redis_url, service_id="shop")
    async with Silo(options) as silo:
        default = silo.dispatcher.grain_storage["default"]
        assert isinstance(default, RedisGrainStorage) and default.service_id == "shop"
        await silo.client.get_grain(StateAccountGrain, "r").set_plan("gold")
        stored = await default.read(GrainId("StateAccountGrain", "r"), "profile")
        assert stored is not None
    async with Silo.local() as silo:
        assert isinstance(silo.dispatcher.grain_storage["default"], InMemoryGrainStorage)


async def test_storage_urls_in_options_open_providers(redis_url: str) -> None:
    async with Silo.local(SiloOptions(storage={"default": redis_url})) as silo:
        assert isinstance(silo.dispatcher.grain_storage["default"], RedisGrainStorage)
        await silo.client.get_grain(StateAccountGrain, "u").set_plan("gold")
    async with Silo.local(SiloOptions(storage={"default": redis_url})) as silo:
        assert (await silo.client.get_grain(StateAccountGrain, "u").view())[0] == "gold"


def test_storage_options_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="not a storage URL"):
        SiloOptions(storage={"default": "mysql://x"})
    with pytest.raises(ConfigurationError, match="neither a URL nor a GrainStorage"):
        SiloOptions(storage={"default": object()})
    with pytest.raises(ConfigurationError, match="not a provider name"):
        SiloOptions(storage={"": "memory://"})
    SiloOptions(storage={"default": "postgresql://postgres@127.0.0.1/x", "m": "memory"})


def test_declarations_are_checked_when_the_class_is_defined() -> None:
    @dataclass
    class NeedsArgs:
        x: int

    with pytest.raises(ConfigurationError, match="constructible with no arguments"):
        persistent_state(NeedsArgs)
    with pytest.raises(ConfigurationError, match="state name"):

        class BadName(Grain):
            s = persistent_state(Profile, name="a:b}")

    with pytest.raises(ConfigurationError, match="both named 'p'"):

        class Twice(Grain):
            a = persistent_state(Profile, name="p")
            b = persistent_state(Profile, name="p")

    decl = StateAccountGrain.profile
    assert isinstance(decl, StateDeclaration) and decl.name == "profile"
    assert StateAccountGrain.cart.name == "shopping-cart"
    from orleanspy.grain import definition_of

    assert [d.attribute for d in definition_of(StateAccountGrain).states] == ["profile", "cart"]


async def test_state_attribute_cannot_be_replaced() -> None:
    class Replacing(Grain):
        s = persistent_state(Profile)

        async def replace(self) -> None:
            self.s = None  # type: ignore[assignment]

    async with Silo.local() as silo:
        with pytest.raises(AttributeError, match=r"assign to self\.s\.state instead"):
            await silo.client.get_grain(Replacing, "x").replace()


def test_dataclass_fields_added_and_removed_between_versions_load() -> None:
    @dataclass
    class V1:
        name: str = ""
        old: int = 0

    @dataclass
    class V2:
        name: str = ""
        new: list[int] = field(default_factory=lambda: [1])

    codec = Codec()
    data = encode_state(V1(name="ann", old=3), codec)
    assert data[0] == 1, "the format version byte leads"
    assert decode_state(data, V2, codec, what="t") == V2(name="ann", new=[1])
    assert dataclasses.asdict(decode_state(data, V1, codec, what="t")) == {"name": "ann", "old": 3}


async def test_persistent_state_mirrors_ipersistentstate() -> None:
    storage = InMemoryGrainStorage()
    gid = GrainId("G", "k")
    async with AsyncExitStack():
        s: PersistentState[Profile] = PersistentState(
            Profile, grain_id=gid, name="p", storage=storage, codec=Codec()
        )
        await s.read()
        assert (s.state, s.etag, s.exists) == (Profile(), None, False)
        s.state.plan = "gold"
        await s.write()
        assert s.exists and s.etag is not None
        await s.clear()
        assert (s.state, s.etag, s.exists) == (Profile(), None, False)


class FarewellGrain(Grain):
    """Writes its state in on_deactivate: the storage must still be open then."""

    log = persistent_state(Cart)

    async def touch(self) -> None:
        return None

    async def entries(self) -> list[str]:
        return self.log.state.items

    async def on_deactivate(self) -> None:
        self.log.state.items.append("deactivated")
        await self.log.write()


async def test_on_deactivate_can_write_state_while_the_silo_stops(redis_url: str) -> None:
    options = SiloOptions(storage={"default": redis_url})
    async with Silo.local(options) as silo:
        await silo.client.get_grain(FarewellGrain, "f").touch()
    async with Silo.local(options) as silo:
        assert await silo.client.get_grain(FarewellGrain, "f").entries() == ["deactivated"]


async def test_a_storage_outage_is_an_error_and_lost_data_is_never_overwritten_silently(
    own_redis: RedisServer,
) -> None:
    async with Silo.local(SiloOptions(storage={"default": own_redis.url})) as silo:
        g = silo.client.get_grain(StateAccountGrain, "outage")
        assert await g.visit() == 1
        own_redis.kill()
        with pytest.raises(StorageUnavailableError):
            await g.visit()
        own_redis.start()  # without persistence: the stored state is gone
        # The activation still holds the etag of a state the store no longer has:
        # its write is refused instead of quietly re-creating the state.
        with pytest.raises(InconsistentStateError):
            await g.visit()
        gid = GrainId("StateAccountGrain", "outage")
        await wait_for(lambda: _gone(silo, gid), timeout=10, what="the stale activation gone")
        assert await g.visit() == 1  # reloaded: what the store holds now
