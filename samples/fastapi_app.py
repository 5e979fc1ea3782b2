"""A FastAPI service that hosts orleanspy in its lifespan.

Without configuration it runs an embedded silo (``Silo.local()``: one process, in
memory) beside the web application; with ``ORLEANSPY_REDIS_URL`` (or
``ORLEANSPY_STORAGE_URL`` / ``ORLEANSPY_MEMBERSHIP_URL``) set, it is instead a
client of a running cluster (``ClusterClient.from_env()``, which also reads
``ORLEANSPY_CLUSTER_ID``, ``ORLEANSPY_SERVICE_ID`` and ``ORLEANSPY_CLUSTER_SECRET``)::

    pip install fastapi uvicorn
    uvicorn samples.fastapi_app:app
    curl -s -X POST http://127.0.0.1:8000/counters/a/add/2

The embedded silo leaves the process's garbage collector alone (``tune_gc`` is
for cluster silos), so it does not retune the web application's collector.
The grain classes are imported here, so a cluster's silos serve them when run
with ``orleanspy silo --import samples.fastapi_app``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from orleanspy import ClusterClient, Grain, Silo

_CLUSTER_VARIABLES = ("ORLEANSPY_REDIS_URL", "ORLEANSPY_STORAGE_URL", "ORLEANSPY_MEMBERSHIP_URL")


class WebCounterGrain(Grain):
    """One counter per key, kept while the grain is active."""

    async def on_activate(self) -> None:
        self.total = 0

    async def add(self, k: int) -> int:
        self.total += k
        return self.total

    async def value(self) -> int:
        return self.total


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start orleanspy with the application and stop it with it: the grain
    factory (``silo.client`` or a ``ClusterClient``) lives on ``app.state``."""
    if any(os.environ.get(v) for v in _CLUSTER_VARIABLES):
        async with ClusterClient.from_env() as client:
            app.state.grains = client
            yield
    else:
        async with Silo.local() as silo:
            app.state.grains = silo.client
            yield


app = FastAPI(title="orleanspy sample", lifespan=lifespan)


def _counter(request: Request, key: str) -> Any:
    return request.app.state.grains.get_grain(WebCounterGrain, key)


@app.post("/counters/{key}/add/{k}")
async def add(request: Request, key: str, k: int) -> dict[str, int]:
    return {"total": await _counter(request, key).add(k)}


@app.get("/counters/{key}")
async def value(request: Request, key: str) -> dict[str, int]:
    return {"total": await _counter(request, key).value()}
