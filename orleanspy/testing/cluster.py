"""``InProcessCluster``: several cluster silos in one process, for tests and samples.

Every silo joins the same cluster over real Redis (membership, directory,
reminders) and real gRPC on loopback; only the process is shared. The helper
adds what a test of failures needs: stop one silo gracefully, crash one
(``kill``), add one, and wait for a condition with a deadline instead of a
sleep::

    async with InProcessCluster(redis_url, size=3, membership=fast) as cluster:
        async with await cluster.client() as client:
            await client.get_grain(MyGrain, "a").ping()
        await cluster.kill(0)
        await cluster.wait_for(lambda: cluster.everyone_sees_dead(0), timeout=10)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from orleanspy.client import ClusterClient
from orleanspy.membership.model import SiloStatus
from orleanspy.options import MembershipOptions, MessagingOptions, SiloOptions
from orleanspy.runtime.silo import Silo, SiloState

__all__ = ["FAST_MEMBERSHIP", "InProcessCluster", "wait_for"]

# Failure detection in about two seconds instead of Orleans' fifteen: short
# enough for tests, long enough that a loaded test machine is not mistaken for
# a dead one.
FAST_MEMBERSHIP = MembershipOptions(
    probe_interval=timedelta(seconds=0.3),
    probe_timeout=timedelta(seconds=0.3),
    num_missed_probes_limit=2,
    i_am_alive_interval=timedelta(seconds=1),
    table_refresh_interval=timedelta(seconds=0.5),
)

Predicate = Callable[[], bool | Awaitable[bool]]


async def wait_for(
    predicate: Predicate, timeout: float, *, interval: float = 0.05, what: str = ""
) -> float:
    """Poll ``predicate`` (a plain or async callable) until it returns true.

    Returns the seconds it took. Raises ``TimeoutError`` naming ``what`` (or the
    predicate) if it is still false after ``timeout`` seconds. Exceptions the
    predicate raises propagate: a predicate that can fail transiently must
    catch what it expects.
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not true within {timeout:g}s: {what or predicate!r}")
        await asyncio.sleep(interval)


class InProcessCluster:
    """``size`` cluster silos sharing ``redis_url``, started by ``start()`` (``size=0``:
    none yet, each started by ``add()``).

    ``options`` is the template for every silo (its ``redis_url`` is replaced,
    ``name`` set to ``silo-<n>`` and ``gateway_port`` defaults to a free port);
    ``membership`` and ``messaging`` override the template's, for brevity.
    ``silos`` keeps every silo ever started, in order, stopped ones included,
    so indexes stay stable across ``stop``/``kill``/``add``.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        size: int = 3,
        options: SiloOptions | None = None,
        membership: MembershipOptions | None = None,
        messaging: MessagingOptions | None = None,
    ) -> None:
        if size < 0:
            raise ValueError(f"InProcessCluster size must not be negative, got {size}")
        base = options or SiloOptions(gateway_port=0)
        changes: dict[str, object] = {"redis_url": redis_url}
        if base.gateway_port is None:
            changes["gateway_port"] = 0
        if membership is not None:
            changes["membership"] = membership
        if messaging is not None:
            changes["messaging"] = messaging
        self.options = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        self.redis_url = redis_url
        self._size = size
        self.silos: list[Silo] = []
        self._clients: list[ClusterClient] = []

    # -- life cycle ---------------------------------------------------------

    async def start(self) -> None:
        """Start the silos one after another (each joins a cluster the previous
        ones are already Active in), then make every silo read the table, so
        each sees all the others Active when this returns."""
        try:
            for _ in range(self._size):
                await self._start_one()
            await self.refresh_all()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the clients made by ``client()``, then stop every running silo
        gracefully, newest first. Idempotent."""
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()
        for silo in reversed(self.silos):
            await silo.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _start_one(self, **changes: Any) -> Silo:
        options = dataclasses.replace(self.options, name=f"silo-{len(self.silos)}", **changes)
        silo = Silo(options)
        self.silos.append(silo)
        await silo.start()
        return silo

    async def add(self, **changes: Any) -> Silo:
        """Start one more silo; returns it once every running silo has read
        the table (so all of them know it). ``changes`` replace fields of the
        template ``SiloOptions`` for this silo only (e.g. ``reminders=...``)."""
        silo = await self._start_one(**changes)
        await self.refresh_all()
        return silo

    async def stop(self, index: int) -> None:
        """Stop ``silos[index]`` gracefully (ShuttingDown, grains deactivated, Dead)."""
        await self.silos[index].stop()

    async def kill(self, index: int) -> None:
        """Crash ``silos[index]``: no membership writes, no clean-up. The others
        find out only by probing it (``Silo.abort``)."""
        await self.silos[index].abort()

    async def client(self, **kwargs: object) -> ClusterClient:
        """A started ``ClusterClient`` of this cluster; closed by ``aclose()``.

        ``kwargs`` go to ``ClusterClient``; ``options`` defaults to the silos'
        messaging options (so it carries their cluster secret).
        """
        kwargs.setdefault("options", self.options.messaging)
        client = ClusterClient(
            redis_url=self.redis_url,
            cluster_id=self.options.cluster_id,
            service_id=self.options.service_id,
            **kwargs,  # type: ignore[arg-type]
        )
        await client.start()
        self._clients.append(client)
        return client

    # -- views and waiting ----------------------------------------------------

    @property
    def running(self) -> list[Silo]:
        """The silos in state RUNNING, in index order."""
        return [s for s in self.silos if s.state is SiloState.RUNNING]

    async def refresh_all(self) -> None:
        """Make every running silo read the membership table now."""
        for silo in self.running:
            if silo.membership is not None:
                await silo.membership.refresh()

    def status_seen_by(self, observer: Silo, index: int) -> SiloStatus | None:
        """``silos[index]``'s status in ``observer``'s newest snapshot."""
        if observer.membership is None:
            return None
        return observer.membership.snapshot.status(self.silos[index].address)

    def everyone_sees_dead(self, index: int) -> bool:
        """Whether every running silo other than ``silos[index]`` has it Dead
        (or gone from the table)."""
        others = [s for i, s in enumerate(self.silos) if i != index and s in self.running]
        return all(
            self.status_seen_by(s, index) in (SiloStatus.DEAD, None) for s in others
        ) and bool(others)

    async def wait_for(
        self, predicate: Predicate, timeout: float, *, interval: float = 0.05, what: str = ""
    ) -> float:
        """``wait_for`` (module function): poll until true; seconds taken or ``TimeoutError``."""
        return await wait_for(predicate, timeout, interval=interval, what=what)

    def index_of(self, address: str) -> int:
        """The index of the silo whose ``str(address)`` is ``address``."""
        for i, silo in enumerate(self.silos):
            if str(silo.address) == address:
                return i
        raise KeyError(address)
