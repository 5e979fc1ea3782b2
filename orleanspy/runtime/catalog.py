"""The catalog: this silo's activations, created on demand, collected when idle."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from datetime import timedelta

from orleanspy.clock import Clock
from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId
from orleanspy.runtime.activation import Activation, ActivationHost

__all__ = ["Catalog"]

log = logging.getLogger(__name__)


class Catalog:
    """Exactly one activation per grain id on this silo.

    ``get_or_create`` is synchronous: the activation object exists (and takes
    messages into its mailbox) before its asynchronous activation starts, so
    concurrent first calls always meet the same activation.
    """

    def __init__(
        self,
        host: ActivationHost,
        *,
        clock: Clock,
        collection_age: timedelta,
        check_interval: timedelta,
    ) -> None:
        self._host = host
        self._clock = clock
        self._collection_age = collection_age
        self._check_interval = check_interval
        self._activations: dict[GrainId, Activation] = {}
        self._ids = itertools.count(1)
        self._prefix = os.urandom(4).hex()
        self.collected = 0

    def __len__(self) -> int:
        return len(self._activations)

    @property
    def activations_by_id(self) -> Mapping[GrainId, Activation]:
        """The live table of activations (read-only; the dispatcher's hot path)."""
        return self._activations

    def get(self, grain_id: GrainId) -> Activation | None:
        return self._activations.get(grain_id)

    def get_or_create(self, grain_id: GrainId, definition: GrainDefinition) -> Activation:
        act = self._activations.get(grain_id)
        if act is None:
            act = Activation(grain_id, definition, self._host, f"{self._prefix}-{next(self._ids)}")
            self._activations[grain_id] = act
            act.start()
        return act

    def remove(self, activation: Activation) -> None:
        """Forget ``activation`` (only if it is still the one registered)."""
        if self._activations.get(activation.grain_id) is activation:
            del self._activations[activation.grain_id]

    def activations(self) -> list[Activation]:
        return list(self._activations.values())

    async def start(self, stack: AsyncExitStack) -> None:
        """Start the idle collector; on unwind, deactivate every activation."""
        task = asyncio.get_running_loop().create_task(self._collector())
        stack.push_async_callback(self.deactivate_all)

        async def stop_collector() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        stack.push_async_callback(stop_collector)

    async def collect_idle(self) -> int:
        """Deactivate activations idle longer than their collection age; returns the count."""
        now = self._clock.now()
        victims = [
            act
            for act in self._activations.values()
            if act.is_idle_since(now - (act.definition.collection_age or self._collection_age))
        ]
        tasks = [t for act in victims if (t := act.start_deactivation()) is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.collected += len(victims)
        if victims:
            log.debug("collected idle activations count=%d", len(victims))
        return len(victims)

    async def _collector(self) -> None:
        while True:
            await self._clock.sleep(self._check_interval.total_seconds())
            try:
                await self.collect_idle()
            except Exception:
                log.exception("idle collection failed")

    def abandon(self) -> None:
        """Forget every activation without deactivating it (a simulated crash)."""
        for act in self._activations.values():
            act.abandon()
        self._activations.clear()

    async def deactivate_all(self) -> None:
        """Deactivate everything (silo stop), concurrently, each bounded in time."""
        while self._activations:
            acts = list(self._activations.values())
            await asyncio.gather(*(a.deactivate() for a in acts), return_exceptions=True)
            for a in acts:
                self.remove(a)
