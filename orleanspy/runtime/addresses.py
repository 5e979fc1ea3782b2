"""The address a silo advertises to its peers and clients, and what it says about
the ports it listens on (exposed without authentication; one it cannot bind).

``SiloOptions.advertised_host`` wins when set. Otherwise a silo advertises
``host``, unless ``host`` is a wildcard (``0.0.0.0``, ``::``): a wildcard is
where to listen, never where to dial. Then the silo advertises the local
address the kernel would send from to reach the membership store. Every peer
of the cluster reaches that store too, so this is the interface the cluster's
network shares (a pod's or VM's IP on the network the store lives on; loopback
when the store is on loopback, i.e. every silo on one host). Working it out is
a route look-up (a UDP socket ``connect``, which sends nothing), after a DNS
look-up when the store is named by a host name. With no store host to route to
(a ``unix://`` URL) or no route, the silo refuses to start and says to set
``advertised_host``.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlsplit

from orleanspy.errors import ConfigurationError
from orleanspy.options import SiloOptions, is_loopback, is_wildcard

__all__ = ["advertised_host", "bind_error", "warn_if_exposed"]

log = logging.getLogger(__name__)


def advertised_host(options: SiloOptions) -> str:
    """The host this silo writes into its membership row and peers dial."""
    if options.advertised_host is not None:
        return options.advertised_host
    if not is_wildcard(options.host):
        return options.host
    url = options.membership_table_url
    target = _store_endpoint(url) if url is not None else None
    found = _source_address(*target) if target is not None else None
    if found is None:
        raise ConfigurationError(
            f"SiloOptions.host {options.host!r} listens on every interface, and the address "
            "peers should dial could not be worked out "
            f"({'no membership store URL' if url is None else 'no route to the host of ' + url}); "
            "set SiloOptions.advertised_host (--advertise-host, ORLEANSPY_ADVERTISE_HOST) to "
            "this host's address or DNS name"
        )
    return found


def _store_endpoint(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``redis://``/``rediss://``/``postgresql://`` URL, else ``None``."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme == "unix" or not host:
        return None
    default = 5432 if parts.scheme.startswith("postgres") else 6379
    return host, port or default


def _source_address(host: str, port: int) -> str | None:
    """The local address the kernel picks to reach ``host:port`` (nothing is sent)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(sockaddr)
                local: str = probe.getsockname()[0]
        except OSError:
            continue
        if not is_wildcard(local):
            return local.split("%", 1)[0]  # an IPv6 scope id is local to this host
    return None


def warn_if_exposed(options: SiloOptions) -> None:
    """Shout when the ports are reachable from other hosts with no authentication."""
    m = options.messaging
    if m.cluster_secret is not None or m.tls is not None or is_loopback(options.host):
        return
    log.warning(
        "SECURITY: silo listens on %s without a cluster secret or TLS; anyone who can "
        "reach its silo or gateway port can call any grain and join the cluster. Set "
        "MessagingOptions(cluster_secret=...) or tls=..., or bind to 127.0.0.1",
        options.host,
    )


def bind_error(options: SiloOptions, exc: BaseException) -> ConfigurationError:
    """The transport could not listen: name the port and the option that chose it."""
    text = str(exc)
    if options.gateway_port and f":{options.gateway_port}" in text:
        what, port = "SiloOptions.gateway_port, --gateway-port", options.gateway_port
    else:
        what, port = "SiloOptions.silo_port, --silo-port", options.silo_port
    return ConfigurationError(
        f"cannot listen on {options.host}:{port} ({what}): the port is in use or the "
        "address is not local; pick another port, or 0 for any free port"
    )
