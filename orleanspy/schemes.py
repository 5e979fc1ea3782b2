"""Which backend a URL names, for every provider kind: the one place that reads a scheme.

A URL's scheme (the part before ``://``, lower-cased) names a backend
(``SCHEMES``); each provider kind offers some of the backends (``KINDS``):

    kind       backends              used by
    tables     redis, postgres       membership table, reminder table, grain directory
                                     (``tables.TableConnections``; options, client, CLI)
    storage    memory, redis,        grain storage (``storage.factory``, the silo's
               postgres              default provider)
    streams    redis                 the stream provider (``SiloOptions.streams_url``)

To add a scheme, add it to ``SCHEMES`` with the backend it names: every kind
offering that backend then accepts it, and the backend's own ``connect`` (in
``_redis`` or ``_postgres``) reads the rest of the URL. ``memory`` may stand
alone, without ``://``. Errors name the scheme only, never the URL: the rest
of a URL may hold a password.

This module is in the bottom layer and imports nothing of the providers: it
decides, the providers build (``tables``, ``storage.factory``).
"""

from __future__ import annotations

from typing import Final, Literal

from orleanspy.errors import ConfigurationError

__all__ = [
    "KINDS",
    "SCHEMES",
    "Backend",
    "Kind",
    "backend_of",
    "check_redis_url",
    "missing_extra",
    "scheme_of",
    "schemes_for",
]

Backend = Literal["memory", "redis", "postgres"]
Kind = Literal["tables", "storage", "streams"]

#: Scheme -> the backend it names.
SCHEMES: Final[dict[str, Backend]] = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "postgresql": "postgres",
    "postgres": "postgres",
    "memory": "memory",
}

#: Kind -> the backends it offers, in the order error messages list them.
KINDS: Final[dict[Kind, tuple[Backend, ...]]] = {
    "tables": ("redis", "postgres"),
    "storage": ("memory", "redis", "postgres"),
    "streams": ("redis",),
}

_NAMES: Final[dict[Backend, str]] = {"memory": "memory", "redis": "Redis", "postgres": "PostgreSQL"}


def scheme_of(url: str) -> str:
    """The scheme of ``url``, lower-cased; ``""`` when it has none (``memory``
    standing alone is the scheme ``memory``)."""
    if "://" in url:
        return url.partition("://")[0].lower()
    return "memory" if url.lower() == "memory" else ""


def schemes_for(kind: Kind) -> list[str]:
    """The schemes ``kind`` accepts, as ``"redis://"`` etc., in ``SCHEMES`` order."""
    offered = KINDS[kind]
    return [f"{s}://" for s, b in SCHEMES.items() if b in offered]


def backend_of(url: str, kind: Kind = "tables") -> Backend:
    """The backend ``url`` names for a provider of ``kind``; ``ConfigurationError``
    (naming the scheme, never the URL) when the kind has no such backend."""
    scheme = scheme_of(url)
    backend = SCHEMES.get(scheme)
    if backend is not None and backend in KINDS[kind]:
        return backend
    by_backend = [
        f"{', '.join(f'{s}://' for s, b in SCHEMES.items() if b == wanted)} ({_NAMES[wanted]})"
        for wanted in KINDS[kind]
    ]
    raise ConfigurationError(
        f"unsupported {_WHAT[kind]} URL scheme {scheme!r}: the scheme must be one of "
        + "; ".join(by_backend)
    )


_WHAT: Final[dict[Kind, str]] = {"tables": "table", "storage": "grain storage", "streams": "stream"}


def check_redis_url(url: str, what: str) -> None:
    """Raise ``ConfigurationError`` naming ``what`` and the forms that work
    unless ``url`` names Redis."""
    if SCHEMES.get(scheme_of(url)) != "redis":
        raise ConfigurationError(
            f"{what} {url!r} has no Redis scheme; use redis://HOST:PORT/DB, "
            "rediss://HOST:PORT/DB (TLS) or unix:///PATH/redis.sock"
        )


def missing_extra(module: str, extra: str, what: str) -> ConfigurationError:
    """The one-line error for an optional dependency that is not installed:
    ``what`` needs ``module``, and how to install it (from the package index or
    from a checkout)."""
    return ConfigurationError(
        f"{what} needs {module}, which is not installed: pip install 'orleanspy[{extra}]' "
        f"(in a checkout: pip install -e '.[{extra}]')"
    )
