"""``orleanspy.dashboard``: an ASGI (Starlette) app showing a cluster, with live updates.

Pages: Cluster (silos, membership events), Grains (activations by type and
silo, call rates and errors by type and method), Reminders (search paged from
the store; history; pause, resume, trigger now, set priority and action,
delete), Timeliness (lateness p50/p99 by priority, ticks/s, missed ticks and
causes, as charts drawn by the package's own SVG code: no CDN).

Served three ways::

    SiloOptions(dashboard_port=8080)                 # by a silo (--dashboard-port)
    orleanspy dashboard --storage-url redis://...    # on its own
    app.mount("/orleans", dashboard.app(client))     # in your FastAPI/Starlette app

It needs the extra ``orleanspy[dashboard]`` (starlette, uvicorn); ``import
orleanspy`` imports none of it. See ``_app`` for the security rules.
"""

from __future__ import annotations

from typing import Any

try:
    import starlette  # noqa: F401
except ImportError:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "orleanspy.dashboard needs starlette and uvicorn: pip install 'orleanspy[dashboard]'"
    ) from None

from orleanspy.dashboard._app import MAX_STREAMS, Dashboard, DashboardApp
from orleanspy.dashboard._source import ManagementRefused, SiloSource, Source, StoreSource
from orleanspy.runtime.guests import Guest, SiloView

__all__ = [
    "MAX_STREAMS",
    "Dashboard",
    "DashboardApp",
    "ManagementRefused",
    "SiloSource",
    "Source",
    "StoreSource",
    "app",
    "silo_guest",
]


def app(
    cluster: Any,
    *,
    storage_url: str | None = None,
    token: str | None = None,
    read_only: bool = False,
) -> DashboardApp:
    """The dashboard as an ASGI app, for ``app.mount("/orleans", dashboard.app(client))``.

    ``cluster`` is a ``ClusterClient``, started by the time a page is asked for
    (the dashboard reads the store its membership table is in, or
    ``storage_url``, and sends actions through the client's gateways, where
    ``allow_client_management`` applies), a running
    ``Silo``, or a ``Source``. ``token``: require it (``Authorization: Bearer``,
    or a first visit with ``?token=``); ``read_only``: refuse every action.
    A mounted app gets no lifespan of its own: call its ``aclose()`` from the
    host app's shutdown to close the connections it opened.
    """
    source: Source
    if hasattr(cluster, "reminder_service") and hasattr(cluster, "options"):  # a Silo
        source = SiloSource(cluster)
    elif hasattr(cluster, "cluster") and hasattr(cluster, "pages"):
        source = cluster
    else:
        source = StoreSource.of_client(cluster, storage_url)
    return Dashboard(source, token=token, read_only=read_only).asgi()


def silo_guest(silo: SiloView) -> Guest:
    """The dashboard as a silo's HTTP guest (``runtime.guests``): read through the
    silo's ``SiloView``, with the silo's ``dashboard_token``. The ``orleanspy``
    package registers this as the guest ``"dashboard"``."""
    source = SiloSource(silo)
    o = silo.options
    app = Dashboard(
        source,
        token=o.dashboard_token,
        token_name=o.dashboard_token_name,
        # Without a token a dashboard off loopback runs only under the cluster's TLS,
        # whose client certificate the HTTPS server checks.
        principal="dashboard:tls-client" if o.messaging.tls is not None else None,
    ).asgi()
    return Guest(app, source.aclose)
