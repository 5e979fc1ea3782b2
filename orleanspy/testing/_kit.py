"""The one shape every provider kit in ``orleanspy.testing`` takes.

A kit is ``check_<kind>(factory)`` plus ``<KIND>_CHECKS``, the tuple of its
checks. ``factory()`` returns an async context manager that yields a *started*
provider over an empty store and releases it on exit; each call gives a fresh
provider (for a shared server, a fresh service or cluster id per call). Every
check takes the factory, so a check that needs two providers over one store
(racing writers, a restart) opens two. Test suites that want one test per check
parametrise over the tuple and await ``check(factory)``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Protocol, TypeVar

__all__ = ["Check", "ProviderFactory", "on_one_provider", "run_checks", "started"]

P = TypeVar("P")
F = TypeVar("F")


class _Startable(Protocol):
    async def start(self, stack: AsyncExitStack) -> None: ...


S = TypeVar("S", bound=_Startable)

ProviderFactory = Callable[[], AbstractAsyncContextManager[P]]
"""Returns a context manager yielding a started provider over an empty store."""

Check = Callable[[ProviderFactory[P]], Awaitable[None]]
"""One check of a kit: raises ``AssertionError`` saying what it saw."""


def on_one_provider(
    check: Callable[[P], Awaitable[None]],
) -> Callable[[ProviderFactory[P]], Awaitable[None]]:
    """A check on one provider, lifted to the kit shape: it opens one from the factory."""

    @functools.wraps(check)
    async def run(factory: ProviderFactory[P]) -> None:
        async with factory() as provider:
            await check(provider)

    return run


async def run_checks(checks: tuple[Callable[[F], Awaitable[None]], ...], factory: F) -> None:
    """Run ``checks`` in order; the first failure is raised naming its check."""
    for check in checks:
        try:
            await check(factory)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc


@asynccontextmanager
async def started(provider: S) -> AsyncIterator[S]:
    """``provider`` started on a stack of its own, released on exit: the usual body
    of a kit's factory (``lambda: started(MyTable(...))``)."""
    async with AsyncExitStack() as stack:
        await provider.start(stack)
        yield provider
