"""Grain storage from a URL: builds the provider the scheme names (``schemes``).

``memory://`` (or ``memory``) is ``InMemoryGrainStorage``; Redis schemes
(``redis://``, ``rediss://``, ``unix://``) are ``RedisGrainStorage``;
PostgreSQL schemes (``postgresql://``, ``postgres://``) are
``PostgresGrainStorage``. Which scheme names which backend is decided in
``orleanspy.schemes`` (kind ``storage``). Backends are imported only when their
scheme is asked for.
"""

from __future__ import annotations

from orleanspy.schemes import backend_of
from orleanspy.storage.contract import GrainStorage

__all__ = ["grain_storage_from_url"]


def grain_storage_from_url(url: str, *, service_id: str) -> GrainStorage:
    """A new, unstarted provider for ``url``, keyed under ``service_id``;
    ``ConfigurationError`` for a scheme grain storage does not offer."""
    backend = backend_of(url, "storage")
    if backend == "memory":
        from orleanspy.storage.memory import InMemoryGrainStorage

        return InMemoryGrainStorage()
    if backend == "redis":
        from orleanspy.storage.redis import RedisGrainStorage

        return RedisGrainStorage(url, service_id=service_id)
    from orleanspy.storage.postgres import PostgresGrainStorage

    return PostgresGrainStorage(url, service_id=service_id)
