"""A conformance suite for ``GrainDirectory`` implementations.

``await check_grain_directory(factory)`` runs every check; each call of
``factory()`` returns an async context manager yielding a fresh, started, empty
directory, as every kit in ``orleanspy.testing`` takes
(``orleanspy.testing._kit``). Test suites that want one test per check
parametrise over ``GRAIN_DIRECTORY_CHECKS`` and await ``check(factory)``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from orleanspy.directory.table import ActivationAddress, GrainDirectory
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.testing._kit import ProviderFactory, on_one_provider, run_checks

__all__ = [
    "GRAIN_DIRECTORY_CHECKS",
    "Check",
    "DirectoryFactory",
    "check_grain_directory",
]

DirectoryFactory = ProviderFactory[GrainDirectory]
Check = Callable[[DirectoryFactory], Awaitable[None]]

_SILO_A = SiloAddress("127.0.0.1", 11111, 1)
_SILO_B = SiloAddress("127.0.0.1", 11112, 1)


def _addr(silo: SiloAddress = _SILO_A) -> ActivationAddress:
    return ActivationAddress(silo, uuid.uuid4().hex)


async def check_lookup_of_unknown_grain_is_none(d: GrainDirectory) -> None:
    assert await d.lookup(GrainId("Counter", "nobody")) is None


async def check_register_then_lookup(d: GrainDirectory) -> None:
    g, a = GrainId("Counter", "a"), _addr()
    assert await d.register(g, a) == a
    assert await d.lookup(g) == a


async def check_first_writer_wins(d: GrainDirectory) -> None:
    g, first, second = GrainId("Counter", 7), _addr(_SILO_A), _addr(_SILO_B)
    assert await d.register(g, first) == first
    assert await d.register(g, second) == first, "a later register must return the winner"
    assert await d.register(g, first) == first, "registering the winner again is idempotent"
    assert await d.lookup(g) == first


async def check_concurrent_registers_agree_on_one_winner(d: GrainDirectory) -> None:
    g = GrainId("Counter", uuid.uuid4())
    candidates = [_addr(SiloAddress("127.0.0.1", 20000 + i, 1)) for i in range(20)]
    results = await asyncio.gather(*(d.register(g, a) for a in candidates))
    winners = set(results)
    assert len(winners) == 1, f"20 concurrent registers saw {len(winners)} winners"
    (winner,) = winners
    assert winner in candidates
    assert await d.lookup(g) == winner


async def check_unregister_with_wrong_address_does_nothing(d: GrainDirectory) -> None:
    g, a = GrainId("Counter", "kept"), _addr()
    await d.register(g, a)
    same_silo_new_activation = ActivationAddress(a.silo, a.activation_id + "-other")
    assert await d.unregister(g, same_silo_new_activation) is False
    assert await d.unregister(g, _addr(_SILO_B)) is False
    assert await d.lookup(g) == a


async def check_unregister_then_lookup_and_reregister(d: GrainDirectory) -> None:
    g, a, b = GrainId("Counter", "moved"), _addr(_SILO_A), _addr(_SILO_B)
    await d.register(g, a)
    assert await d.unregister(g, a) is True
    assert await d.lookup(g) is None
    assert await d.unregister(g, a) is False, "a second unregister finds nothing"
    assert await d.register(g, b) == b, "after unregister a new activation can win"
    assert await d.lookup(g) == b


async def check_keys_of_different_kinds_are_different_grains(d: GrainDirectory) -> None:
    as_int, as_str = GrainId("Counter", 1), GrainId("Counter", "1")
    a, b = _addr(_SILO_A), _addr(_SILO_B)
    assert await d.register(as_int, a) == a
    assert await d.register(as_str, b) == b
    assert await d.lookup(as_int) == a and await d.lookup(as_str) == b


async def check_many_grains(d: GrainDirectory) -> None:
    grains = [GrainId("Many", i) for i in range(300)]
    addrs = [_addr(_SILO_A if i % 2 else _SILO_B) for i in range(300)]
    await asyncio.gather(*(d.register(g, a) for g, a in zip(grains, addrs, strict=True)))
    found = await asyncio.gather(*(d.lookup(g) for g in grains))
    assert found == addrs


async def check_unregister_silo_removes_only_that_silo(d: GrainDirectory) -> None:
    on_a = {GrainId("Counter", f"a{i}"): _addr(_SILO_A) for i in range(10)}
    on_b = {GrainId("Counter", f"b{i}"): _addr(_SILO_B) for i in range(10)}
    for g, a in (on_a | on_b).items():
        await d.register(g, a)
    removed = await d.unregister_silo(_SILO_A)
    gone = sum([await d.lookup(g) is None for g in on_a])
    assert removed == gone, f"unregister_silo said {removed} but {gone} entries are gone"
    for g, a in on_b.items():
        assert await d.lookup(g) == a, "another silo's entry was removed"


GRAIN_DIRECTORY_CHECKS: tuple[Check, ...] = tuple(
    on_one_provider(check)
    for check in (
        check_lookup_of_unknown_grain_is_none,
        check_register_then_lookup,
        check_first_writer_wins,
        check_concurrent_registers_agree_on_one_winner,
        check_unregister_with_wrong_address_does_nothing,
        check_unregister_then_lookup_and_reregister,
        check_keys_of_different_kinds_are_different_grains,
        check_many_grains,
        check_unregister_silo_removes_only_that_silo,
    )
)
"""Every check, each taking the factory and running on one fresh, started directory."""


async def check_grain_directory(factory: DirectoryFactory) -> None:
    """Run every check in ``GRAIN_DIRECTORY_CHECKS``; raises ``AssertionError``
    naming the first that fails."""
    await run_checks(GRAIN_DIRECTORY_CHECKS, factory)
