"""The orleanspy dashboard mounted in your own FastAPI app.

Run a silo (``orleanspy silo --redis-url redis://127.0.0.1:6379/0 --gateway-port 30000``),
then::

    pip install 'orleanspy[dashboard]' fastapi
    ORLEANSPY_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn samples.fastapi_dashboard:app

and open http://127.0.0.1:8000/orleans/. The dashboard reads the store the
client's membership table is in and sends reminder actions through the client's
gateways (the silos decide with ``allow_client_management``). Put your own
authentication in front of the mount, or pass ``token=``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from orleanspy import ClusterClient, dashboard


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


app = make_app(
    ClusterClient(membership_url=os.environ.get("ORLEANSPY_REDIS_URL", "redis://127.0.0.1:6379/0"))
)
