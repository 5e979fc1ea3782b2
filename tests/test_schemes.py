"""One place reads a URL's scheme (``orleanspy.schemes``): every user follows it."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from orleanspy import schemes
from orleanspy.errors import ConfigurationError
from orleanspy.options import SiloOptions
from orleanspy.schemes import backend_of, scheme_of, schemes_for
from orleanspy.storage.factory import grain_storage_from_url
from orleanspy.storage.memory import InMemoryGrainStorage
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.tables import TableConnections, table_backend


def test_each_kind_offers_its_backends() -> None:
    assert backend_of("redis://h/0") == "redis"
    assert backend_of("REDISS://h/0") == "redis"
    assert backend_of("unix:///tmp/r.sock") == "redis"
    assert backend_of("postgres://h/db") == backend_of("postgresql://h/db") == "postgres"
    assert backend_of("memory", "storage") == backend_of("memory://", "storage") == "memory"
    assert backend_of("redis://h/0", "streams") == "redis"
    for url, kind in (
        ("memory://", "tables"),
        ("postgresql://h/db", "streams"),
        ("redis", "tables"),
    ):
        with pytest.raises(ConfigurationError, match="unsupported"):
            backend_of(url, kind)  # type: ignore[arg-type]
    assert scheme_of("redis") == ""  # a bare word is no scheme, but for memory
    assert schemes_for("streams") == ["redis://", "rediss://", "unix://"]


def test_errors_name_the_scheme_and_what_works_never_the_url() -> None:
    with pytest.raises(ConfigurationError) as info:
        backend_of("mysql://app:hunter2@db/app", "storage")
    text = str(info.value)
    assert "'mysql'" in text and "hunter2" not in text
    assert "memory://" in text and "redis://" in text and "postgresql://" in text


def test_a_scheme_added_once_is_accepted_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a scheme is one line in ``SCHEMES``: options, tables, grain storage
    and streams all accept it (the Redis backend's connect reads the URL)."""
    url = "redis+test://127.0.0.1:1/0"
    with pytest.raises(ConfigurationError):
        SiloOptions(storage_url=url)
    monkeypatch.setitem(schemes.SCHEMES, "redis+test", "redis")
    options = SiloOptions(storage_url=url, storage={"other": url})
    assert options.streams_url == url
    assert table_backend(url) == "redis"
    assert isinstance(grain_storage_from_url(url, service_id="s"), RedisGrainStorage)
    assert isinstance(grain_storage_from_url("memory", service_id="s"), InMemoryGrainStorage)


async def test_the_silos_default_storage_shares_the_tables_client() -> None:
    async with AsyncExitStack() as stack:
        connections = TableConnections(stack)
        storage = await connections.grain_storage("redis://127.0.0.1:1/0", service_id="s")
        assert isinstance(storage, RedisGrainStorage)
        assert connections.redis_clients() == {"redis://127.0.0.1:1/0": storage._client}
