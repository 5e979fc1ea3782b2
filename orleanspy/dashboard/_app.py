"""The dashboard's routes: six pages, their JSON, one event stream per live
page, the reminder and dead letter actions, and the audit log of every
management action.

Security, in order of the request's path through here:

- ``token`` set: every request needs it, as ``Authorization: Bearer <token>``
  or the cookie a first visit with ``?token=`` sets (HttpOnly, SameSite=Strict);
  otherwise 401. Tokens compare in constant time.
- An action acts for the dashboard's principal (``dashboard:<token name>``),
  which the audit log records; nothing a request says changes it.
- Actions are POSTs of JSON carrying the ``X-CSRF-Token`` header equal to the
  ``orleanspy_csrf`` cookie (double submit; a SameSite=Strict cookie another
  site's page cannot read or send), and, when the browser sends an ``Origin``,
  one equal to the request's host; otherwise 403.
- Every input is bounded (``_MAX_TEXT`` characters of search text, cursors of
  ``_reminder_reads``' size, limits, priorities in -128..127) and anything else
  is a 400 naming the field. The pages put every value into the document with
  ``textContent``; the one HTML template escapes the mount path.
- Event streams: at most ``MAX_STREAMS`` open at once (503 beyond), each sends
  at most one event per ``STATUS_INTERVAL``, and the cluster is read at most
  once per interval however many watch: nothing is read while no one does.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from datetime import datetime
from importlib import resources
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from orleanspy.cluster_status import STATUS_INTERVAL, ClusterStatus
from orleanspy.dashboard._pages import (
    cluster_page,
    grains_page,
    letter_summary,
    reminder_detail,
    row_summary,
    timeliness_page,
)
from orleanspy.dashboard._reminder_reads import Query
from orleanspy.dashboard._series import Series
from orleanspy.dashboard._source import ACTIONS, LETTER_ACTIONS, ManagementRefused, Source
from orleanspy.errors import OrleansPyError
from orleanspy.identity import GrainId
from orleanspy.reminders.audit import AuditQuery
from orleanspy.reminders.model import MissedReminderAction

__all__ = ["MAX_STREAMS", "Dashboard", "DashboardApp"]

log = logging.getLogger(__name__)

#: Most event streams open at once, over every page and browser.
MAX_STREAMS: Final = 16
_MAX_TEXT: Final = 200
_MAX_GRAIN: Final = 1024
_MAX_LIMIT: Final = 100
_MAX_BODY: Final = 8192
_MAX_AUDIT: Final = 500
_PAGES: Final = ("cluster", "grains", "reminders", "timeliness", "dead-letters", "audit")
_MAX_LETTER_ID: Final = 128
_STATES: Final = ("any", "paused", "active", "orphaned")
_TOKEN_COOKIE: Final = "orleanspy_dashboard"
_CSRF_COOKIE: Final = "orleanspy_csrf"


class BadInput(ValueError):
    """A request field out of bounds (400, naming it)."""


def _text(request: Request, name: str, limit: int = _MAX_TEXT) -> str:
    value = request.query_params.get(name, "")
    if len(value) > limit:
        raise BadInput(f"{name}: at most {limit} characters")
    if any(ord(c) < 32 for c in value):
        raise BadInput(f"{name}: control characters are not allowed")
    return value


def _grain(text: str) -> GrainId:
    if not text or len(text) > _MAX_GRAIN:
        raise BadInput(f"grain: 1..{_MAX_GRAIN} characters")
    try:
        return GrainId.parse(text)
    except (ValueError, TypeError):
        raise BadInput("grain: not a grain id (type/s:key, type/i:42, type/u:uuid)") from None


def _instant(value: object, what: str) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise BadInput(f"{what}: an ISO 8601 time with its offset")
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"{what}: an ISO 8601 time with its offset") from None
    if at.tzinfo is None:
        raise BadInput(f"{what}: give the offset (Z or +01:00)")
    return at


def _backfill_range(value: object) -> tuple[datetime, datetime, str | None]:
    """A backfill action's ``{"from", "to", "overlap"?}`` (the checks on the range
    itself are the management grain's: it refuses and writes nothing)."""
    if not isinstance(value, dict):
        raise BadInput('value: {"from": ISO time, "to": ISO time}')
    overlap = value.get("overlap")
    if overlap is not None and (not isinstance(overlap, str) or len(overlap) > 32):
        raise BadInput("value.overlap: a policy name")
    return _instant(value.get("from"), "value.from"), _instant(value.get("to"), "value.to"), overlap


def _priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadInput("priority: a number in -128..127") from None
    if not -128 <= value <= 127:
        raise BadInput("priority: a number in -128..127")
    return value


class _Hub:
    """Reads the cluster at most once per ``interval``, whoever asks, and feeds
    the series. It has no task of its own: a read happens only when a page
    request or an open stream asks."""

    def __init__(self, source: Source, interval: float) -> None:
        self.source = source
        self.interval = interval
        self.series = Series()
        self._latest: ClusterStatus | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()
        self.streams = 0
        self.reads = 0

    async def status(self) -> ClusterStatus:
        async with self._lock:
            if self._latest is None or time.monotonic() - self._at >= self.interval * 0.9:
                self._latest = await self.source.cluster()
                self._at = time.monotonic()
                self.reads += 1
                self.series.ingest(self._latest)
            return self._latest


def _hosted(status: ClusterStatus) -> set[str] | None:
    """Grain types some Active silo hosts; ``None`` when a silo hosts every type."""
    hosted: set[str] = set()
    for silo in status.silos:
        if silo.status != "active":
            continue
        if silo.grain_types is None:
            return None
        hosted.update(silo.grain_types)
    return hosted


class Dashboard:
    """The dashboard of one ``Source``; ``routes()`` for a host's app, ``asgi()``
    for a standalone or mounted app."""

    def __init__(
        self,
        source: Source,
        *,
        token: str | None = None,
        token_name: str = "dashboard",
        principal: str | None = None,
        read_only: bool = False,
        interval: float = STATUS_INTERVAL,
    ) -> None:
        self.source = source
        self._token = token
        #: Who this dashboard's actions act for, in the audit log: the token's
        #: holder (``dashboard:<token_name>``), else ``principal`` as the host
        #: says (its TLS), else ``dashboard:local`` (a loopback dashboard).
        self.principal = (
            f"dashboard:{token_name}" if token is not None else principal or "dashboard:local"
        )
        self._read_only = read_only
        self.hub = _Hub(source, interval)
        self._template = (
            resources.files("orleanspy.dashboard").joinpath("static/page.html").read_text()
        )

    # -- security -----------------------------------------------------------------------

    def _authorised(self, request: Request) -> bool:
        if self._token is None:
            return True
        given = request.headers.get("authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(
            given[7:].encode(), self._token.encode()
        ):
            return True
        cookie = request.cookies.get(_TOKEN_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self._token.encode())

    def guard(self, app: ASGIApp) -> DashboardApp:
        """``app`` behind the token check (a pass-through without a token)."""
        return DashboardApp(self, app)

    async def _guarded(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._token is None:
            await app(scope, receive, send)
            return
        request = Request(scope, receive)
        offered = request.query_params.get("token")
        if (
            offered is not None
            and len(offered) <= 1024
            and hmac.compare_digest(offered.encode(), self._token.encode())
        ):
            root, path = scope.get("root_path", ""), scope.get("path", "/")
            base = path if path.startswith(root) else root + path
            response: Response = RedirectResponse(base, 303)
            response.set_cookie(_TOKEN_COOKIE, self._token, httponly=True,
                                samesite="strict", path="/")  # fmt: skip
            await response(scope, receive, send)
            return
        if not self._authorised(request):
            await JSONResponse({"error": "a dashboard token is required"}, 401)(
                scope, receive, send
            )
            return
        await app(scope, receive, send)

    @staticmethod
    def _csrf_ok(request: Request) -> bool:
        cookie = request.cookies.get(_CSRF_COOKIE, "")
        header = request.headers.get("x-csrf-token", "")
        if len(cookie) < 16 or not hmac.compare_digest(cookie.encode(), header.encode()):
            return False
        origin = request.headers.get("origin")
        if origin is not None:
            host = request.headers.get("host", "")
            if origin.partition("://")[2] != host:
                return False
        return True

    # -- pages --------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        name = request.path_params.get("page") or "cluster"
        if name not in _PAGES:
            return JSONResponse({"error": "no such page"}, 404)
        csrf = request.cookies.get(_CSRF_COOKIE)
        if not csrf or len(csrf) > 128:
            csrf = secrets.token_urlsafe(24)
        root = request.scope.get("root_path", "")
        body = (
            self._template.replace("{{base}}", html.escape(root.rstrip("/") + "/", quote=True))
            .replace("{{page}}", name)
            .replace("{{csrf}}", html.escape(csrf, quote=True))
            .replace("{{read_only}}", "true" if self._read_only else "false")
        )
        response = Response(body, media_type="text/html; charset=utf-8")
        response.headers["content-security-policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
        )
        response.headers["x-content-type-options"] = "nosniff"
        response.headers["referrer-policy"] = "no-referrer"
        response.set_cookie(_CSRF_COOKIE, csrf, samesite="strict", path="/")
        return response

    async def _page_data(self, name: str) -> dict[str, Any]:
        status = await self.hub.status()
        if name == "cluster":
            return cluster_page(status)
        if name == "grains":
            return grains_page(status, self.hub.series)
        return timeliness_page(status, self.hub.series)

    async def data(self, request: Request) -> Response:
        name = request.path_params["page"]
        if name not in ("cluster", "grains", "timeliness"):
            return JSONResponse({"error": "no such page"}, 404)
        return _json(await self._page_data(name))

    async def events(self, request: Request) -> Response:
        name = request.query_params.get("page", "")
        if name not in ("cluster", "grains", "timeliness"):
            return JSONResponse({"error": "page: cluster, grains or timeliness"}, 400)
        if self.hub.streams >= MAX_STREAMS:
            return JSONResponse({"error": "too many open streams"}, 503)
        self.hub.streams += 1

        async def stream() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        doc = await self._page_data(name)
                        yield b"data: " + json.dumps(doc, default=str).encode() + b"\n\n"
                    except OrleansPyError as exc:
                        yield b"event: failure\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
                    await asyncio.sleep(self.hub.interval)
            finally:
                self.hub.streams -= 1

        headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def reminders(self, request: Request) -> Response:
        query = Query(
            grain_type=_text(request, "type"),
            key_prefix=_text(request, "key"),
            name=_text(request, "name"),
            priority=_priority(p) if (p := _text(request, "priority", 8)) else None,
            state=_text(request, "state", 16) or "any",
        )
        if query.state not in _STATES:
            raise BadInput(f"state: one of {', '.join(_STATES)}")
        if query.key_prefix and not query.grain_type:
            raise BadInput("key: give the grain type too")
        cursor = _text(request, "cursor", 4096) or None
        try:
            limit = int(_text(request, "limit", 4) or "25")
        except ValueError:
            raise BadInput(f"limit: 1..{_MAX_LIMIT}") from None
        if not 1 <= limit <= _MAX_LIMIT:
            raise BadInput(f"limit: 1..{_MAX_LIMIT}")
        status = await self.hub.status()
        hosted = _hosted(status)
        pages = await self.source.pages()
        try:
            page = await pages.search(query, cursor, limit, hosted)
        except ValueError as exc:
            raise BadInput(f"cursor: {exc}") from None
        rows = [
            row_summary(r, hosted is not None and r.grain_id.type_name not in hosted)
            for r in page.rows
        ]
        return _json({"rows": rows, "cursor": page.cursor, "scanned": page.scanned})

    async def reminder(self, request: Request) -> Response:
        grain = _grain(_text(request, "grain", _MAX_GRAIN))
        name = _text(request, "name")
        row = await self.source.row(grain, name)
        if row is None:
            return JSONResponse({"error": f"{grain} has no reminder {name!r}"}, 404)
        history = await self.source.history(grain, name)
        backfill = await self.source.backfill(grain, name)
        counters = await self.source.counters(grain, name)
        hosted = _hosted(await self.hub.status())
        orphaned = hosted is not None and grain.type_name not in hosted
        return _json(reminder_detail(row, history, orphaned, backfill, counters))

    async def dead_letters(self, request: Request) -> Response:
        text = _text(request, "grain", _MAX_GRAIN)
        grain = _grain(text) if text else None
        name = _text(request, "name") or None
        cursor = _text(request, "cursor", 256) or None
        try:
            limit = int(_text(request, "limit", 4) or "25")
        except ValueError:
            raise BadInput(f"limit: 1..{_MAX_LIMIT}") from None
        if not 1 <= limit <= _MAX_LIMIT:
            raise BadInput(f"limit: 1..{_MAX_LIMIT}")
        try:
            page = await self.source.dead_letters(grain, name, cursor, limit)
        except ValueError as exc:  # a made-up cursor
            raise BadInput(f"cursor: {exc}") from None
        return _json({"letters": [letter_summary(d) for d in page.letters], "cursor": page.cursor})

    async def act(self, request: Request) -> Response:
        if not self._csrf_ok(request):
            return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
        if self._read_only:
            return JSONResponse({"error": "this dashboard is read-only"}, 403)
        if request.headers.get("content-type", "").split(";")[0] != "application/json":
            raise BadInput("send application/json")
        body = await request.body()
        if len(body) > _MAX_BODY:
            raise BadInput(f"body: at most {_MAX_BODY} bytes")
        try:
            doc = json.loads(body)
        except ValueError:
            raise BadInput("body: not JSON") from None
        if not isinstance(doc, dict):
            raise BadInput("body: a JSON object")
        action, name, value = doc.get("action"), doc.get("name"), doc.get("value")
        if action in LETTER_ACTIONS:
            return await self._act_letter(action, doc.get("id"))
        if action not in ACTIONS:
            raise BadInput(f"action: one of {', '.join(ACTIONS + LETTER_ACTIONS)}")
        if not isinstance(name, str) or not 0 < len(name) <= _MAX_TEXT:
            raise BadInput(f"name: 1..{_MAX_TEXT} characters")
        grain_text = doc.get("grain")
        grain = _grain(grain_text if isinstance(grain_text, str) else "")
        if action == "set_priority":
            value = _priority(str(value))
        elif action == "set_action" and (
            not isinstance(value, str) or value.upper() not in MissedReminderAction.__members__
        ):
            raise BadInput("value: fire_immediately, skip or notify")
        elif action == "backfill":
            value = _backfill_range(value)
        try:
            result = await self.source.act(action, grain, name, value, principal=self.principal)
        except ManagementRefused as exc:
            return JSONResponse({"error": str(exc)}, 403)
        except (OrleansPyError, ValueError) as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"[:2000]}, 409)
        log.info(
            "dashboard action=%s grain=%s reminder=%s principal=%s",
            action, grain, name, self.principal,
        )  # fmt: skip
        return _json({"done": action, "result": None if result is None else str(result)[:500]})

    async def audit(self, request: Request) -> Response:
        """The audit log, newest first: filters ``grain`` (with ``name``),
        ``principal``, ``action``, ``limit`` (1..``_MAX_AUDIT``)."""
        grain_text = _text(request, "grain", _MAX_GRAIN)
        name = _text(request, "name") or None
        if name is not None and not grain_text:
            raise BadInput("name: give the grain too")
        try:
            limit = int(_text(request, "limit", 4) or "100")
        except ValueError:
            raise BadInput(f"limit: 1..{_MAX_AUDIT}") from None
        if not 1 <= limit <= _MAX_AUDIT:
            raise BadInput(f"limit: 1..{_MAX_AUDIT}")
        query = AuditQuery(
            grain_id=_grain(grain_text) if grain_text else None,
            name=name,
            principal=_text(request, "principal") or None,
            action=_text(request, "action", 40) or None,
            limit=limit,
        )
        records = await self.source.audit(query)
        return _json({"records": [r.to_json() for r in records]})

    async def _act_letter(self, action: str, letter_id: object) -> Response:
        """``replay`` or ``discard`` of the dead letter ``letter_id`` (after the
        checks ``act`` made: CSRF, read-only, a JSON body)."""
        if (
            not isinstance(letter_id, str)
            or not 0 < len(letter_id) <= _MAX_LETTER_ID
            or not letter_id.isalnum()
        ):
            raise BadInput(f"id: a dead letter's id (1..{_MAX_LETTER_ID} letters and digits)")
        try:
            result = await self.source.act_letter(action, letter_id, principal=self.principal)
        except ManagementRefused as exc:
            return JSONResponse({"error": str(exc)}, 403)
        except (OrleansPyError, ValueError) as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"[:2000]}, 409)
        except Exception as exc:  # a replay whose grain raised again: the letter stays
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"[:2000]}, 409)
        log.info(
            "dashboard action=%s dead_letter=%s principal=%s", action, letter_id, self.principal
        )
        return _json({"done": action, "result": None if result is None else str(result)[:500]})

    # -- assembly -----------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        static = StaticFiles(packages=[("orleanspy.dashboard", "static")])
        inner = [
            Route("/", self.page, methods=["GET", "HEAD"]),
            Route("/api/events", self.events, methods=["GET"]),
            Route("/api/reminders", self.reminders, methods=["GET"]),
            Route("/api/reminder", self.reminder, methods=["GET"]),
            Route("/api/action", self.act, methods=["POST"]),
            Route("/api/audit", self.audit, methods=["GET"]),
            Route("/api/dead-letters", self.dead_letters, methods=["GET"]),
            Route("/api/{page}", self.data, methods=["GET"]),
            Mount("/static", app=static),
            Route("/{page}", self.page, methods=["GET", "HEAD"]),
        ]
        return inner

    def asgi(self) -> DashboardApp:
        from starlette.applications import Starlette

        app = Starlette(routes=self.routes(), exception_handlers={BadInput: _bad_input})
        return self.guard(app)


class DashboardApp:
    """The dashboard's ASGI app. ``aclose()`` closes the connections its source
    opened; an app served on its own does that at lifespan shutdown, a mounted
    one (mounts get no lifespan) when the host's lifespan calls it."""

    def __init__(self, dashboard: Dashboard, app: ASGIApp) -> None:
        self.dashboard = dashboard
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await self.dashboard._guarded(self._app, scope, receive, send)

    async def aclose(self) -> None:
        await self.dashboard.source.aclose()


async def _bad_input(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, 400)


def _json(doc: object) -> Response:
    return Response(
        json.dumps(doc, default=str), media_type="application/json",
        headers={"cache-control": "no-store"},
    )  # fmt: skip
