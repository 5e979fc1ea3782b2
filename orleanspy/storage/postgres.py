"""``PostgresGrainStorage``: grain state in PostgreSQL.

It reaches PostgreSQL only through ``orleanspy._postgres``, as every PostgreSQL
backend does: the pool (``jit`` off), the error translation (a lost connection
is ``StorageUnavailableError``) and the schema migration, whose version is
recorded in ``orleanspy_schema`` under the component ``grain_state:<table>``.
One table per ``table`` name::

    CREATE SEQUENCE <table>_version;
    CREATE TABLE <table> (
        service_id text, grain_id text, state_name text,
        data bytea NOT NULL,
        version bigint NOT NULL,          -- the etag
        PRIMARY KEY (service_id, grain_id, state_name));

Reads that arrive together share one ``SELECT ... = ANY($2)`` (see
``storage._batch``), so a silo activating many grains at once sends fewer,
larger queries. The version column is the etag. Every write takes the next value of one
sequence, so a version never comes back for a state, also after a clear
deleted its row. A write with an etag is ``UPDATE ... WHERE version = $etag``;
a write without one is ``INSERT ... ON CONFLICT DO NOTHING``: either way one
statement, and a lost race changes no row and returns none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, Final

from orleanspy._postgres import Pool, migrate, open_pool, translate_errors
from orleanspy._tasks import raise_if_cancelled
from orleanspy.errors import ConfigurationError
from orleanspy.identity import GrainId
from orleanspy.schema import SchemaVersion
from orleanspy.storage._batch import Batcher
from orleanspy.storage.contract import StoredState

__all__ = ["PostgresGrainStorage"]

_IDENT: Final = re.compile(r"[a-z_][a-z0-9_]{0,50}")


def _version(etag: str) -> int | None:
    """The version an etag names; ``None`` for a string this provider never made."""
    return int(etag) if etag.isdigit() and len(etag) < 19 else None


class PostgresGrainStorage:
    """A ``GrainStorage`` in one PostgreSQL table.

    ``url_or_pool``: a ``postgresql://`` URL (the provider opens a pool of up to
    ``pool_size`` connections and closes it with the start stack) or an asyncpg
    pool (never closed here). ``table`` is a lowercase SQL identifier.
    """

    def __init__(
        self,
        url_or_pool: str | Any,
        *,
        service_id: str = "default",
        table: str = "orleanspy_grain_state",
        pool_size: int = 16,
    ) -> None:
        if not _IDENT.fullmatch(table):
            raise ConfigurationError(
                f"PostgresGrainStorage table {table!r} must be a lowercase SQL identifier"
            )
        if pool_size < 1:
            raise ConfigurationError("PostgresGrainStorage pool_size must be >= 1")
        self.service_id = service_id
        self.table = table
        self._url = url_or_pool if isinstance(url_or_pool, str) else None
        self._pool: Pool = None if isinstance(url_or_pool, str) else url_or_pool
        self._pool_size = pool_size
        seq = f"{table}_version"
        where = "service_id = $1 AND grain_id = $2 AND state_name = $3"
        # Migration steps (``_postgres.migrate``). Step 1 is idempotent, so a table
        # made before versions were recorded is adopted as version 1.
        self._schema: tuple[tuple[str, ...], ...] = (
            (
                f"CREATE SEQUENCE IF NOT EXISTS {seq}",
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " service_id text NOT NULL, grain_id text NOT NULL, state_name text NOT NULL,"
                " data bytea NOT NULL, version bigint NOT NULL,"
                " PRIMARY KEY (service_id, grain_id, state_name))",
            ),
        )
        self._read = f"SELECT data, version FROM {table} WHERE {where}"
        self._select_many = (
            f"SELECT grain_id, state_name, data, version FROM {table}"
            " WHERE service_id = $1 AND grain_id = ANY($2::text[])"
        )
        self._reads: Batcher[tuple[str, str], StoredState | None] | None = None
        self.schema = SchemaVersion("postgres", f"grain_state:{table}", len(self._schema))
        self._insert = (
            f"INSERT INTO {table} (service_id, grain_id, state_name, data, version)"
            f" VALUES ($1, $2, $3, $4, nextval('{seq}'))"
            " ON CONFLICT DO NOTHING RETURNING version"
        )
        self._update = (
            f"UPDATE {table} SET data = $4, version = nextval('{seq}')"
            f" WHERE {where} AND version = $5 RETURNING version"
        )
        self._delete = f"DELETE FROM {table} WHERE {where} AND version = $4"
        self._absent = f"SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE {where})"

    async def start(self, stack: AsyncExitStack) -> None:
        """Open the pool (if given a URL) and bring the table to this release's
        schema version (``StorageError`` if a newer release migrated it)."""
        if self._pool is None:
            assert self._url is not None
            self._pool = await open_pool(self._url, stack, max_size=self._pool_size)
        self.migration = await migrate(self._pool, f"grain_state:{self.table}", self._schema)
        self._reads = Batcher(self._read_many, concurrency=self._pool.get_max_size())

    @property
    def _p(self) -> Any:
        if self._pool is None:
            raise RuntimeError("PostgresGrainStorage used before start()")
        return self._pool

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        if self._reads is None:
            raise RuntimeError("PostgresGrainStorage used before start()")
        return await self._reads.submit((grain_id.canonical, name))

    async def _read_many(
        self, keys: Sequence[tuple[str, str]]
    ) -> Sequence[StoredState | Exception | None]:
        """The stored states of ``keys`` (one query; a lone key uses the primary key)."""
        with translate_errors("grain state read"):
            if len(keys) == 1:
                grain, name = keys[0]
                row = await self._p.fetchrow(self._read, self.service_id, grain, name)
                return [None if row is None else StoredState(bytes(row[0]), str(row[1]))]
            grains = list({grain for grain, _ in keys})
            rows = await self._p.fetch(self._select_many, self.service_id, grains)
        # Rows of other states of the same grains came along; readers take only theirs.
        found = {(r[0], r[1]): StoredState(bytes(r[2]), str(r[3])) for r in rows}
        return [found.get(key) for key in keys]

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        key = (self.service_id, grain_id.canonical, name)
        if etag is None:
            with translate_errors("grain state write"):
                version = await self._p.fetchval(self._insert, *key, data)
        else:
            expected = _version(etag)
            if expected is None:
                return None
            with translate_errors("grain state write"):
                version = await self._p.fetchval(self._update, *key, data, expected)
        raise_if_cancelled()
        return None if version is None else str(version)

    async def clear(self, grain_id: GrainId, name: str, etag: str | None) -> bool:
        key = (self.service_id, grain_id.canonical, name)
        if etag is None:
            with translate_errors("grain state clear"):
                return bool(await self._p.fetchval(self._absent, *key))
        expected = _version(etag)
        if expected is None:
            return False
        with translate_errors("grain state clear"):
            status: str = await self._p.execute(self._delete, *key, expected)
        raise_if_cancelled()
        return status == "DELETE 1"
