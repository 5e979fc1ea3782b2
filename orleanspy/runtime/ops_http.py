"""The silo's operations endpoint: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP.

A deliberately small HTTP/1.1 server on the silo's own event loop
(``asyncio.start_server``): one GET per connection, answered and closed. That
it answers at all shows the loop runs; ``/healthz`` adds the loop's recent
lag, measured by a heartbeat task.

- ``/metrics``: Prometheus text (``orleanspy._prometheus``), or 501 saying how
  to install ``orleanspy[metrics]`` when ``prometheus_client`` is missing.
- ``/healthz``: 200 while the loop's lag stays below ``MAX_LAG_SECONDS``, else 503.
- ``/readyz``: 200 when the silo can take work: Active in membership, storage
  answering, owning ring ranges; else 503. The JSON body names every check.

Requests are hostile bytes: the request head is bounded in size and time, and
anything but a GET/HEAD of a known path gets a 4xx. A failing check is an
answer (503), never a crash of the silo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

__all__ = ["MAX_LAG_SECONDS", "Check", "OpsServer"]

log = logging.getLogger(__name__)

#: /healthz fails when the event loop was blocked this long (a heartbeat came late).
MAX_LAG_SECONDS = 10.0
_HEARTBEAT_SECONDS = 0.5
_HEAD_LIMIT = 8192
_READ_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check: ``ok``, and a short word for operators."""

    ok: bool
    detail: str


Readiness = Callable[[], Awaitable[dict[str, Check]]]


class OpsServer:
    """Serves the three endpoints on ``host:port`` (``0``: a free port) until the
    stack unwinds. ``metrics()`` returns the ``/metrics`` body, or ``None`` when
    metrics are not available; ``readiness()`` runs the readiness checks."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: Callable[[], bytes | None],
        readiness: Readiness,
    ) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._readiness = readiness
        self._lag = 0.0
        self.port: int | None = None

    async def start(self, stack: AsyncExitStack) -> None:
        """Listen; raises ``OSError`` when the port cannot be bound (the caller
        names the option that chose it)."""
        server = await asyncio.start_server(
            self._serve, self._host, self._port, limit=_HEAD_LIMIT, reuse_address=True
        )
        self.port = server.sockets[0].getsockname()[1]
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat())

        async def stop() -> None:
            heartbeat.cancel()
            server.close()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await server.wait_closed()

        stack.push_async_callback(stop)
        log.info("operations endpoint listening on http://%s:%d", self._host, self.port)

    async def _heartbeat(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(_HEARTBEAT_SECONDS)
            # How much later than asked the loop came back: time it was busy.
            self._lag = max(0.0, time.monotonic() - before - _HEARTBEAT_SECONDS)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, ctype, body = await self._answer(reader)
        except Exception as exc:  # a bad request or a failing check must not reach the loop
            log.debug("operations endpoint request failed error=%r", exc)
            status, ctype, body = 400, "text/plain", b"bad request\n"
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode("ascii") + body)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes]:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return 400, "text/plain", b"bad request\n"
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, "text/plain", b"bad request\n"
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return 405, "text/plain", b"only GET\n"
        if path == b"/metrics":
            body = self._metrics()
            if body is None:
                return (
                    501,
                    "text/plain",
                    b"metrics need prometheus_client: pip install 'orleanspy[metrics]'\n",
                )
            return 200, "text/plain; version=0.0.4; charset=utf-8", body
        if path == b"/healthz":
            ok = self._lag < MAX_LAG_SECONDS
            doc: dict[str, object] = {"alive": True, "loop_lag_seconds": round(self._lag, 4)}
            return (200 if ok else 503), "application/json", _json(doc)
        if path == b"/readyz":
            checks = await self._readiness()
            ready = all(c.ok for c in checks.values())
            doc = {"ready": ready, "checks": {k: {"ok": c.ok, "detail": c.detail}
                                              for k, c in checks.items()}}  # fmt: skip
            return (200 if ready else 503), "application/json", _json(doc)
        return 404, "text/plain", b"not found: try /metrics, /healthz or /readyz\n"


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def _json(doc: object) -> bytes:
    return (json.dumps(doc, sort_keys=True) + "\n").encode()
