"""A private PostgreSQL database for tests: created on a running server, dropped after.

Unlike Redis, a PostgreSQL server is not cheap to start per test session, so tests
use the server the machine runs (``ORLEANSPY_TEST_POSTGRES_URL``, by default
``postgresql://postgres@127.0.0.1:5432/postgres``) and get a database of their own
on it: ``PostgresDatabase.create()`` makes one with a unique name, ``reset()``
empties it between tests, ``drop()`` removes it. An unreachable server is an error,
never a skip: a test that claims PostgreSQL works must run against one.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orleanspy.errors import StorageError

__all__ = ["DEFAULT_ADMIN_URL", "PostgresDatabase"]

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


async def _execute(url: str, *statements: str) -> None:
    from orleanspy._postgres import connect

    try:
        conn: Any = await connect(url)
    except StorageError as exc:
        raise RuntimeError(
            f"cannot reach PostgreSQL at {url} ({exc}); start a server or set "
            "ORLEANSPY_TEST_POSTGRES_URL to one that accepts the postgres user"
        ) from exc
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


class PostgresDatabase:
    """One throw-away database on a running PostgreSQL server.

    The synchronous methods run their own event loop, so they are usable from plain
    (non-async) pytest fixtures; never call them from inside a running loop.
    """

    def __init__(self, admin_url: str | None = None, *, name: str | None = None) -> None:
        self.admin_url = admin_url or os.environ.get(
            "ORLEANSPY_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL
        )
        self.name = name or f"orleanspy_test_{uuid.uuid4().hex[:12]}"
        self.url = _with_database(self.admin_url, self.name)
        self._created = False

    def create(self) -> PostgresDatabase:
        """Create the database (an error if the server cannot be reached)."""
        asyncio.run(_execute(self.admin_url, f'CREATE DATABASE "{self.name}"'))
        self._created = True
        return self

    def reset(self) -> None:
        """Remove every table, function and type the previous test left (a fresh schema)."""
        asyncio.run(
            _execute(self.url, "DROP SCHEMA IF EXISTS public CASCADE", "CREATE SCHEMA public")
        )

    def drop(self) -> None:
        """Drop the database, ending any sessions still connected to it."""
        if not self._created:
            return
        asyncio.run(_execute(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._created = False

    def __enter__(self) -> PostgresDatabase:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.drop()
