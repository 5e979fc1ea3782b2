"""``PostgresMembershipTable``: the membership table of a cluster in PostgreSQL.

Two tables, shaped like Orleans' SQL membership provider (a version row per
deployment beside the silo rows)::

    orleanspy_membership_version   (service_id, cluster_id) PRIMARY KEY,
                                   version bigint, etag text
    orleanspy_membership           (service_id, cluster_id, silo) PRIMARY KEY,
                                   status smallint, i_am_alive bigint (ms),
                                   record bytea (the row, msgpack), etag text

Every protocol write is one transaction that locks the version row
(``SELECT ... FOR UPDATE``), checks its etag, writes the silo row with its own
etag check, and moves the version on; so two writers that read the same
snapshot can never both succeed. The first write of a cluster inserts the
version row, and a concurrent first write loses on its primary key. Etags are
values of the sequence ``orleanspy_membership_etag``: unique while the
database lives. ``update_i_am_alive`` touches only the ``i_am_alive`` column.
``read_all`` reads rows and version in one statement, so they agree.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any, Final

from orleanspy._postgres import Pool, migrate, open_pool, translate_errors
from orleanspy.clock import to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import (
    INITIAL_VERSION,
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
    TableVersion,
)
from orleanspy.schema import SchemaVersion
from orleanspy.serialization import pack, unpack

__all__ = ["PostgresMembershipTable"]

_SCHEMA: Final[tuple[tuple[str, ...], ...]] = (
    (
        "CREATE SEQUENCE IF NOT EXISTS orleanspy_membership_etag",
        """CREATE TABLE IF NOT EXISTS orleanspy_membership_version (
            service_id text NOT NULL,
            cluster_id text NOT NULL,
            version bigint NOT NULL,
            etag text NOT NULL,
            PRIMARY KEY (service_id, cluster_id)
        )""",
        """CREATE TABLE IF NOT EXISTS orleanspy_membership (
            service_id text NOT NULL,
            cluster_id text NOT NULL,
            silo text NOT NULL,
            status smallint NOT NULL,
            i_am_alive bigint NOT NULL,
            record bytea NOT NULL,
            etag text NOT NULL,
            PRIMARY KEY (service_id, cluster_id, silo)
        )""",
    ),
)

# The version row (or a row of NULLs) joined with every silo row, in one snapshot.
_READ_ALL: Final = """
SELECT v.version, v.etag AS version_etag, m.silo, m.status, m.i_am_alive, m.record, m.etag
FROM (SELECT 1) one
LEFT JOIN orleanspy_membership_version v ON v.service_id = $1 AND v.cluster_id = $2
LEFT JOIN orleanspy_membership m ON m.service_id = $1 AND m.cluster_id = $2
"""


class _LostRace(Exception):
    """Rolls a write's transaction back; the write reports ``False``."""


class PostgresMembershipTable:
    """A ``MembershipTable`` in PostgreSQL.

    ``url_or_pool``: a ``postgresql://`` URL (the table opens a pool in
    ``start`` and closes it when the stack unwinds) or an ``asyncpg`` pool (used
    as is, never closed here). ``start`` creates or migrates the schema.
    """

    schema = SchemaVersion("postgres", "membership", len(_SCHEMA))

    def __init__(self, url_or_pool: str | Pool, *, cluster_id: str, service_id: str) -> None:
        for what, value in (("cluster_id", cluster_id), ("service_id", service_id)):
            if not value or any(c in value for c in "{}:|"):
                raise ValueError(f"{what} must be non-empty without '{{', '}}', ':', '|'")
        self._source = url_or_pool
        self._pool: Pool | None = None
        self.cluster_id = cluster_id
        self.service_id = service_id

    async def start(self, stack: AsyncExitStack) -> None:
        if self._pool is not None:
            raise RuntimeError("PostgresMembershipTable.start() was already called")
        pool = await open_pool(self._source, stack, max_size=4)
        self.migration = await migrate(pool, "membership", _SCHEMA)
        self._pool = pool

    @property
    def _p(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("PostgresMembershipTable used before start()")
        return self._pool

    async def read_all(self) -> MembershipSnapshot:
        with translate_errors("membership read_all"):
            records = await self._p.fetch(_READ_ALL, self.service_id, self.cluster_id)
        version = INITIAL_VERSION
        rows: dict[SiloAddress, tuple[MembershipEntry, str]] = {}
        try:
            for rec in records:
                if rec["version"] is not None:
                    version = TableVersion(int(rec["version"]), str(rec["version_etag"]))
                if rec["silo"] is None:
                    continue
                fields = unpack(rec["record"])
                fields["s"] = int(rec["status"])
                fields["ia"] = int(rec["i_am_alive"])
                entry = MembershipEntry.from_record(fields)
                rows[entry.silo] = (entry, str(rec["etag"]))
        except (KeyError, ValueError, TypeError, SerializationError) as exc:
            raise StorageError(f"malformed membership row in postgresql: {exc}") from exc
        return MembershipSnapshot(rows, version)

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        return await self._write(entry, None, version)

    async def update_row(self, entry: MembershipEntry, etag: str, version: TableVersion) -> bool:
        return await self._write(entry, etag, version)

    async def update_i_am_alive(self, silo: SiloAddress, at: datetime) -> None:
        with translate_errors("membership update_i_am_alive"):
            await self._p.execute(
                "UPDATE orleanspy_membership SET i_am_alive = $4 "
                "WHERE service_id = $1 AND cluster_id = $2 AND silo = $3",
                self.service_id,
                self.cluster_id,
                str(silo),
                to_ms(at),
            )

    async def delete_dead_before(self, cutoff: datetime) -> int:
        with translate_errors("membership delete_dead_before"):
            records = await self._p.fetch(
                "DELETE FROM orleanspy_membership WHERE service_id = $1 AND cluster_id = $2 "
                "AND status = $3 AND i_am_alive < $4 RETURNING silo",
                self.service_id,
                self.cluster_id,
                int(SiloStatus.DEAD),
                to_ms(cutoff),
            )
        return len(records)

    async def _write(self, entry: MembershipEntry, etag: str | None, version: TableVersion) -> bool:
        """Insert (``etag`` None) or update the row, and move the version on, in
        one transaction; ``False`` (nothing written) on any lost check."""
        what = "membership insert_row" if etag is None else "membership update_row"
        keys = (self.service_id, self.cluster_id)
        record = entry.to_record()
        status, alive = int(record.pop("s")), int(record.pop("ia"))
        try:
            with translate_errors(what):
                async with self._p.acquire() as conn, conn.transaction():
                    await self._check_version(conn, version)
                    new_etag = str(
                        await conn.fetchval("SELECT nextval('orleanspy_membership_etag')")
                    )
                    if etag is None:
                        written = await conn.fetchval(
                            "INSERT INTO orleanspy_membership (service_id, cluster_id, silo, "
                            "status, i_am_alive, record, etag) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                            "ON CONFLICT DO NOTHING RETURNING 1",
                            *keys,
                            str(entry.silo),
                            status,
                            alive,
                            pack(record),
                            new_etag,
                        )
                    else:
                        written = await conn.fetchval(
                            "UPDATE orleanspy_membership SET status = $4, i_am_alive = $5, "
                            "record = $6, etag = $7 WHERE service_id = $1 AND cluster_id = $2 "
                            "AND silo = $3 AND etag = $8 RETURNING 1",
                            *keys,
                            str(entry.silo),
                            status,
                            alive,
                            pack(record),
                            new_etag,
                            etag,
                        )
                    if written is None:
                        raise _LostRace
                    await conn.execute(
                        "UPDATE orleanspy_membership_version SET version = $3, etag = $4 "
                        "WHERE service_id = $1 AND cluster_id = $2",
                        *keys,
                        version.version,
                        new_etag,
                    )
        except _LostRace:
            return False
        return True

    async def _check_version(self, conn: Any, version: TableVersion) -> None:
        """Lock the version row and check ``version`` against it (raising
        ``_LostRace`` or ``ValueError``); the first write creates the row."""
        keys = (self.service_id, self.cluster_id)
        current = await conn.fetchrow(
            "SELECT version, etag FROM orleanspy_membership_version "
            "WHERE service_id = $1 AND cluster_id = $2 FOR UPDATE",
            *keys,
        )
        if current is None:
            if version.etag != INITIAL_VERSION.etag:
                raise _LostRace
            if version.version <= INITIAL_VERSION.version:
                raise ValueError(_NOT_ABOVE.format(version.version))
            # A concurrent first write that committed wins on the primary key.
            created = await conn.fetchval(
                "INSERT INTO orleanspy_membership_version (service_id, cluster_id, version, etag) "
                "VALUES ($1, $2, 0, '') ON CONFLICT DO NOTHING RETURNING 1",
                *keys,
            )
            if created is None:
                raise _LostRace
            return
        if str(current["etag"]) != version.etag:
            raise _LostRace
        if version.version <= int(current["version"]):
            raise ValueError(_NOT_ABOVE.format(version.version))


_NOT_ABOVE: Final = "table version {} is not above the stored one: pass snapshot.version.next()"
