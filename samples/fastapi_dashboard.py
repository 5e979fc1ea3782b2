"""The orleanspy dashboard mounted in your own FastAPI app.

Run a silo (``orleanspy silo --redis-url redis://127.0.0.1:6379/0 --gateway-port 30000``),
then::

    pip install 'orleanspy[dashboard]' fastapi
    ORLEANSPY_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn samples.fastapi_dashboard:app

and open http://127.0.0.1:8000/orleans/. The client is ``ClusterClient.from_env()``:
on a secured cluster give it what the silos were given, ``ORLEANSPY_CLUSTER_SECRET``
(or ``ORLEANSPY_CLUSTER_SECRET_FILE``) and, with TLS, ``ORLEANSPY_MESSAGING_TLS_CERT_FILE``,
``..._KEY_FILE`` and ``..._CA_FILE`` (or ``ORLEANSPY_CONFIG``, the silos' TOML file).
The dashboard reads the store the client's membership table is in and sends
reminder actions through the client's gateways (the silos decide with
``allow_client_management``). Put your own authentication in front of the
mount, or pass ``token=``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from orleanspy import ClusterClient, dashboard

LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def make_app(client: ClusterClient, *, token: str | None = None) -> FastAPI:
    """Your app: its own routes, and the dashboard under ``/orleans``. The client
    is opened and closed with the app (its lifespan); the dashboard may be made
    before it opens."""

    orleans = dashboard.app(client, token=token)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with client:
            yield
            await orleans.aclose()  # a mount gets no lifespan: close its connections

    app = FastAPI(title="shop", lifespan=lifespan)

    @app.get("/hello")
    async def hello() -> dict[str, object]:
        return {"hello": "world", "gateways": client.gateways}

    app.mount("/orleans", orleans)
    return app


# The environment as the CLI reads it; a local Redis when it names no store.
app = make_app(ClusterClient.from_env({"ORLEANSPY_REDIS_URL": LOCAL_REDIS, **os.environ}))
