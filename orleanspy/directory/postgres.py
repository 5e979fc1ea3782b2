"""The PostgreSQL grain directory: first writer wins on a primary key.

One table, shared by every cluster and service of a database::

    orleanspy_directory
        (service_id, cluster_id, grain_id) PRIMARY KEY,
        silo text, activation_id text
    index (service_id, cluster_id, silo)        unregister_silo

``register`` is one statement: insert the entry unless the grain has one, and
return whichever entry is stored (``INSERT ... ON CONFLICT DO NOTHING``, then
the existing row in the same statement). ``unregister`` is a compare-and-delete
on silo and activation id. Because the silo is a column, ``unregister_silo``
removes a dead silo's entries exactly, in one indexed statement.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Final

from orleanspy._postgres import Pool, migrate, open_pool, translate_errors
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import ConfigurationError, StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.schema import SchemaVersion

__all__ = ["PostgresGrainDirectory"]

_SCHEMA: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_directory (
            service_id text NOT NULL,
            cluster_id text NOT NULL,
            grain_id text NOT NULL,
            silo text NOT NULL,
            activation_id text NOT NULL,
            PRIMARY KEY (service_id, cluster_id, grain_id)
        )""",
        "CREATE INDEX IF NOT EXISTS orleanspy_directory_silo "
        "ON orleanspy_directory (service_id, cluster_id, silo)",
    ),
)

# The inserted row, or else the row that was there. A row inserted by a
# concurrent transaction after this statement's snapshot is invisible to the
# second SELECT; the caller then asks again (see ``register``).
_REGISTER: Final = """
WITH ins AS (
    INSERT INTO orleanspy_directory (service_id, cluster_id, grain_id, silo, activation_id)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT DO NOTHING
    RETURNING silo, activation_id
)
SELECT silo, activation_id FROM ins
UNION ALL
SELECT silo, activation_id FROM orleanspy_directory
WHERE service_id = $1 AND cluster_id = $2 AND grain_id = $3 AND NOT EXISTS (SELECT 1 FROM ins)
"""


def _decode(silo: str, activation_id: str) -> ActivationAddress:
    try:
        return ActivationAddress(SiloAddress.parse(silo), activation_id)
    except ValueError as exc:
        raise StorageError(f"malformed grain directory entry {silo!r}: {exc}") from exc


class PostgresGrainDirectory:
    """A ``GrainDirectory`` in PostgreSQL, shared by every silo of a cluster.

    ``url_or_pool``: a ``postgresql://`` URL (a pool opened in ``start`` and
    closed when the stack unwinds) or an ``asyncpg`` pool (used as is).
    """

    schema = SchemaVersion("postgres", "directory", len(_SCHEMA))

    def __init__(self, url_or_pool: str | Pool, *, cluster_id: str, service_id: str) -> None:
        if not service_id or not cluster_id:
            raise ConfigurationError("service_id and cluster_id must not be empty")
        self._source = url_or_pool
        self._pool: Pool | None = None
        self.cluster_id = cluster_id
        self.service_id = service_id

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and create or migrate the schema; ``StorageUnavailableError`` if
        the server cannot be reached."""
        pool = await open_pool(self._source, stack)
        self.migration = await migrate(pool, "directory", _SCHEMA)
        self._pool = pool

    @property
    def _p(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("PostgresGrainDirectory used before start()")
        return self._pool

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        """See ``GrainDirectory.register``."""
        args = (
            self.service_id,
            self.cluster_id,
            grain_id.canonical,
            str(address.silo),
            address.activation_id,
        )
        with translate_errors("grain directory register"):
            # A winner committed between the insert's conflict check and the read
            # is not in the statement's snapshot; a second try always sees it.
            for _ in range(3):
                rec = await self._p.fetchrow(_REGISTER, *args)
                if rec is not None:
                    return _decode(rec["silo"], rec["activation_id"])
        raise StorageError(f"grain directory register of {grain_id} found no entry to return")

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        """See ``GrainDirectory.lookup``."""
        with translate_errors("grain directory lookup"):
            rec = await self._p.fetchrow(
                "SELECT silo, activation_id FROM orleanspy_directory "
                "WHERE service_id = $1 AND cluster_id = $2 AND grain_id = $3",
                self.service_id,
                self.cluster_id,
                grain_id.canonical,
            )
        return None if rec is None else _decode(rec["silo"], rec["activation_id"])

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> bool:
        """See ``GrainDirectory.unregister``: a compare-and-delete."""
        with translate_errors("grain directory unregister"):
            rec = await self._p.fetchrow(
                "DELETE FROM orleanspy_directory WHERE service_id = $1 AND cluster_id = $2 "
                "AND grain_id = $3 AND silo = $4 AND activation_id = $5 RETURNING 1",
                self.service_id,
                self.cluster_id,
                grain_id.canonical,
                str(address.silo),
                address.activation_id,
            )
        return rec is not None

    async def unregister_silo(self, silo: SiloAddress) -> int:
        """Remove every entry on ``silo`` (exact); returns how many."""
        with translate_errors("grain directory unregister_silo"):
            records = await self._p.fetch(
                "DELETE FROM orleanspy_directory WHERE service_id = $1 AND cluster_id = $2 "
                "AND silo = $3 RETURNING 1",
                self.service_id,
                self.cluster_id,
                str(silo),
            )
        return len(records)
