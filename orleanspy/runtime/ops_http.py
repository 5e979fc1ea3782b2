"""The silo's HTTP stack: ``/metrics``, ``/healthz`` and ``/readyz`` as ASGI routes,
served by uvicorn on the silo's own event loop (the dashboard mounts beside them).

- ``/metrics``: Prometheus text (``orleanspy._prometheus``, ``prometheus_client``'s
  exposition), or 501 saying how to install ``orleanspy[metrics]`` when it is missing.
- ``/healthz``: 200 while the loop's lag stays below ``MAX_LAG_SECONDS``, else 503.
  That it answers at all shows the loop runs; the lag comes from a heartbeat task.
- ``/readyz``: 200 when the silo can take work: Active in membership, storage
  answering, owning ring ranges; else 503. The JSON body names every check.

Starlette and uvicorn are the ``orleanspy[metrics]`` extra (and ``[dashboard]``).
Without them a silo asked for a port fails at start with the install hint.
Requests are hostile bytes: uvicorn's h11 parser bounds the request head and
answers malformed ones with 400; a method other than GET/HEAD on a known path
gets 405, an unknown path 404. A failing check is an answer (503), never a
crash of the silo.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orleanspy.errors import ConfigurationError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

__all__ = [
    "HTTP_HINT",
    "MAX_LAG_SECONDS",
    "Check",
    "HttpServer",
    "LoopHeartbeat",
    "http_available",
    "ops_app",
    "ops_routes",
]

log = logging.getLogger(__name__)

#: /healthz fails when the event loop was blocked this long (a heartbeat came late).
MAX_LAG_SECONDS = 10.0
_HEARTBEAT_SECONDS = 0.5
#: What to install when starlette/uvicorn are missing.
HTTP_HINT = "the silo's HTTP endpoints need starlette and uvicorn: pip install 'orleanspy[metrics]'"


def http_available() -> bool:
    """Whether starlette and uvicorn are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn"))


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check: ``ok``, and a short word for operators."""

    ok: bool
    detail: str


Readiness = Callable[[], Awaitable[dict[str, Check]]]


class LoopHeartbeat:
    """Measures how late the loop comes back from a short sleep (its recent lag)."""

    def __init__(self) -> None:
        self.lag = 0.0

    async def start(self, stack: AsyncExitStack) -> None:
        task = asyncio.get_running_loop().create_task(self._run())

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        stack.push_async_callback(stop)

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(_HEARTBEAT_SECONDS)
            # How much later than asked the loop came back: time it was busy.
            self.lag = max(0.0, time.monotonic() - before - _HEARTBEAT_SECONDS)


def ops_routes(
    *,
    metrics: Callable[[], bytes | None],
    readiness: Readiness,
    heartbeat: LoopHeartbeat,
) -> list[BaseRoute]:
    """The three routes. ``metrics()`` returns the ``/metrics`` body, or ``None``
    when metrics are not available; ``readiness()`` runs the readiness checks."""
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from orleanspy._prometheus import CONTENT_TYPE

    async def metrics_page(request: Request) -> Response:
        body = metrics()
        if body is None:
            return PlainTextResponse(
                "metrics need prometheus_client: pip install 'orleanspy[metrics]'\n", 501
            )
        return Response(body, 200, media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        ok = heartbeat.lag < MAX_LAG_SECONDS
        doc = {"alive": True, "loop_lag_seconds": round(heartbeat.lag, 4)}
        return _json(doc, 200 if ok else 503)

    async def readyz(request: Request) -> Response:
        try:
            checks = await readiness()
        except Exception as exc:  # a failing check is an answer, not a crash
            checks = {"silo": Check(False, f"readiness failed: {exc!r}"[:200])}
        ready = all(c.ok for c in checks.values())
        doc = {
            "ready": ready,
            "checks": {k: {"ok": c.ok, "detail": c.detail} for k, c in checks.items()},
        }
        return _json(doc, 200 if ready else 503)

    return [
        Route("/metrics", metrics_page, methods=["GET", "HEAD"]),
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
    ]


def _json(doc: object, status: int) -> Response:
    from starlette.responses import Response

    body = (json.dumps(doc, sort_keys=True) + "\n").encode()
    return Response(body, status, media_type="application/json")


async def not_found(request: Request, exc: Exception) -> Response:
    """The 404 body names the endpoints (an unknown path is a typo, usually)."""
    from starlette.responses import PlainTextResponse

    return PlainTextResponse("not found: try /metrics, /healthz or /readyz\n", 404)


async def not_allowed(request: Request, exc: Exception) -> Response:
    from starlette.responses import PlainTextResponse

    return PlainTextResponse("only GET\n", 405)


class HttpServer:
    """Serves an ASGI ``app`` with uvicorn on ``host:port`` (``0``: a free port) on
    the running loop until the stack unwinds. ``tls``: serve HTTPS and require a
    client certificate signed by ``tls.ca_file`` (the cluster's own certificates).
    ``lifespan``: run the app's start-up and shut-down (an app of the user's).

    uvicorn is told to leave signals and logging alone: the silo's host owns them.
    """

    def __init__(
        self, app: Any, host: str, port: int, *, tls: Any = None, lifespan: bool = False
    ) -> None:
        self._app = app
        self._lifespan = lifespan
        self._host = host
        self._port = port
        self._tls = tls
        self.port: int | None = None

    async def start(self, stack: AsyncExitStack, *, what: str) -> None:
        """Listen; ``ConfigurationError`` naming ``what`` (the option) when the
        port cannot be bound."""
        import uvicorn

        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot serve HTTP on {self._host}:{self._port} ({what}): "
                f"{exc.strerror or exc}; is another process using the port? Pick another, "
                "or 0 for any free port."
            ) from exc
        sock.listen(64)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        tls: dict[str, Any] = {}
        if self._tls is not None:
            tls = {
                "ssl_certfile": self._tls.cert_file,
                "ssl_keyfile": self._tls.key_file,
                "ssl_ca_certs": self._tls.ca_file,
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            }
        config = uvicorn.Config(
            self._app,
            log_config=None,
            access_log=False,
            lifespan="on" if self._lifespan else "off",
            timeout_graceful_shutdown=2,
            h11_max_incomplete_event_size=16 * 1024,
            server_header=False,
            **tls,
        )
        server = _quiet_server(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))

        async def stop() -> None:
            server.should_exit = True
            try:
                async with asyncio.timeout(5):
                    await task
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            finally:
                sock.close()

        stack.push_async_callback(stop)
        scheme = "https" if self._tls is not None else "http"
        log.info("http listening on %s://%s:%d (%s)", scheme, self._host, self.port, what)


def _server_class() -> type[Any]:
    import uvicorn

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # The process's signals belong to its host (the CLI stops the silo).
            yield

    return QuietServer


def _quiet_server(config: Any) -> Any:
    return _server_class()(config)


def ops_app(
    *,
    metrics: Callable[[], bytes | None],
    readiness: Readiness,
    heartbeat: LoopHeartbeat,
    extra: list[BaseRoute] | None = None,
) -> Any:
    """A Starlette app of the ops routes, plus ``extra`` routes (the dashboard)."""
    from starlette.applications import Starlette

    return Starlette(
        routes=[*ops_routes(metrics=metrics, readiness=readiness, heartbeat=heartbeat),
                *(extra or [])],
        exception_handlers={404: not_found, 405: not_allowed},
    )  # fmt: skip
