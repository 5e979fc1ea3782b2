"""Grain storage from a URL: the one place that maps a scheme to a backend.

``memory://`` (or ``memory``) is ``InMemoryGrainStorage``; ``redis://``,
``rediss://``, ``unix://`` and the ``+cluster`` / ``+sentinel`` variants are
``RedisGrainStorage``; ``postgresql://`` and
``postgres://`` are ``PostgresGrainStorage``. Backends are imported only when
their scheme is asked for.
"""

from __future__ import annotations

from typing import Final

from orleanspy.errors import ConfigurationError
from orleanspy.storage.contract import GrainStorage

__all__ = ["GRAIN_STORAGE_SCHEMES", "grain_storage_from_url", "storage_scheme"]

_REDIS_STORAGE_SCHEMES: Final = (
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "unix",
)
GRAIN_STORAGE_SCHEMES: Final = ("memory", *_REDIS_STORAGE_SCHEMES, "postgresql", "postgres")


def storage_scheme(url: str) -> str:
    """The scheme of a grain storage URL, lower-cased (``memory`` may stand alone)."""
    return url.partition("://")[0].lower() if "://" in url else url.lower()


def grain_storage_from_url(url: str, *, service_id: str) -> GrainStorage:
    """A new, unstarted provider for ``url``, keyed under ``service_id``."""
    scheme = storage_scheme(url)
    if scheme == "memory":
        from orleanspy.storage.memory import InMemoryGrainStorage

        return InMemoryGrainStorage()
    if scheme in _REDIS_STORAGE_SCHEMES:
        from orleanspy.storage.redis import RedisGrainStorage

        return RedisGrainStorage(url, service_id=service_id)
    if scheme in ("postgresql", "postgres"):
        from orleanspy.storage.postgres import PostgresGrainStorage

        return PostgresGrainStorage(url, service_id=service_id)
    raise ConfigurationError(
        f"grain storage URL {url!r}: the scheme must be one of "
        f"{', '.join(s + '://' for s in GRAIN_STORAGE_SCHEMES)}"
    )
