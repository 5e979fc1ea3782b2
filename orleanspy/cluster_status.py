"""What a cluster looks like from its store alone: silos, ring shares, load,
membership events, and why a client found no gateway.

Every silo of a cluster publishes a small status record every
``STATUS_INTERVAL``: its version and process, load (CPU share, loop lag),
activations (by type), reminder rows held, and the cumulative counters the
dashboard turns into rates (calls and errors by grain type and method, ticks and
lateness buckets by priority, missed ticks by action and cause). The record
lives beside the membership table, in the same store:

- Redis: the hash ``orleanspy:<service_id>:cluster:{<service_id>:<cluster_id>}:status``
  (one field per silo address, JSON, with the time written);
- PostgreSQL: the table ``orleanspy_silo_status`` (``service_id, cluster_id,
  silo`` -> ``record`` JSON text, ``updated_ms``).

``read_cluster`` joins the records with the membership table and the ring, so
``orleanspy cluster status`` and the dashboard need no running silo to answer.
``explain_no_gateway`` says why a lookup found nothing: the ids looked up, what
the table holds for them, and which other cluster and service ids that Redis knows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol, cast

from orleanspy._redis import Redis, connect, key_prefix, redacted, resolve, translate_errors
from orleanspy.errors import StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import RING_BALANCED, cluster_level, cluster_ring_mode
from orleanspy.membership.model import MembershipSnapshot, SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.membership.table import MembershipTable
from orleanspy.ring import ConsistentRing, ranges_size
from orleanspy.tables import TableConnections, table_backend

__all__ = [
    "STATUS_INTERVAL",
    "ClusterStatus",
    "MembershipEvent",
    "PostgresStatusStore",
    "RedisStatusStore",
    "SiloRow",
    "StatusPublisher",
    "StatusStore",
    "explain_no_gateway",
    "open_status_reader",
    "published_types",
    "read_cluster",
    "read_status",
    "status_key",
    "status_store",
]

log = logging.getLogger(__name__)

#: Seconds between two status records of a silo.
STATUS_INTERVAL = 2.0
#: A record larger than this is not published (a bound for readers too).
MAX_RECORD_BYTES: Final = 256 * 1024
_RING_SIZE = 1 << 32
_MEMBERS_PATTERN = "orleanspy:*:cluster:*:members"


def status_key(service_id: str, cluster_id: str) -> str:
    """The hash holding the silos' status records (beside the membership hash)."""
    return f"{key_prefix(service_id)}cluster:{{{service_id}:{cluster_id}}}:status"


class StatusStore(Protocol):
    """Where silos' status records live. Records are advisory: a store failure
    raises ``StorageError`` and the caller decides (publishers log and retry)."""

    async def publish(self, silo: str, record: dict[str, object]) -> None: ...

    async def remove(self, silo: str) -> None: ...

    async def read(self) -> dict[str, dict[str, object]]:
        """Every record, by silo address; unreadable records are left out."""
        ...


class RedisStatusStore:
    """Status records in one Redis hash (``status_key``)."""

    def __init__(self, client: Redis, *, service_id: str, cluster_id: str) -> None:
        self._client = client
        self._key = status_key(service_id, cluster_id)

    async def publish(self, silo: str, record: dict[str, object]) -> None:
        with translate_errors("status publish"):
            await self._client.hset(self._key, silo, json.dumps(record))

    async def remove(self, silo: str) -> None:
        with translate_errors("status remove"):
            await self._client.hdel(self._key, silo)

    async def read(self) -> dict[str, dict[str, object]]:
        with translate_errors("status read"):
            raw = cast(dict[bytes, bytes], await self._client.hgetall(self._key))
        return _decoded({k.decode(errors="replace"): v for k, v in raw.items()})


_PG_SCHEMA: Final = (
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_silo_status (
            service_id text NOT NULL,
            cluster_id text NOT NULL,
            silo text NOT NULL,
            record text NOT NULL,
            updated_ms bigint NOT NULL,
            PRIMARY KEY (service_id, cluster_id, silo))""",
    ),
)


class PostgresStatusStore:
    """Status records in the table ``orleanspy_silo_status`` (created by ``start``)."""

    def __init__(self, pool: Any, *, service_id: str, cluster_id: str) -> None:
        self._pool = pool
        self._ids = (service_id, cluster_id)

    async def start(self) -> None:
        from orleanspy._postgres import migrate

        await migrate(self._pool, "silo_status", _PG_SCHEMA)

    async def publish(self, silo: str, record: dict[str, object]) -> None:
        from orleanspy._postgres import translate_errors as pg_errors

        with pg_errors("status publish"):
            await self._pool.execute(
                "INSERT INTO orleanspy_silo_status AS t VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (service_id, cluster_id, silo) DO UPDATE "
                "SET record = excluded.record, updated_ms = excluded.updated_ms",
                *self._ids,
                silo,
                json.dumps(record),
                int(time.time() * 1000),
            )

    async def remove(self, silo: str) -> None:
        from orleanspy._postgres import translate_errors as pg_errors

        with pg_errors("status remove"):
            await self._pool.execute(
                "DELETE FROM orleanspy_silo_status "
                "WHERE service_id = $1 AND cluster_id = $2 AND silo = $3",
                *self._ids,
                silo,
            )

    async def read(self) -> dict[str, dict[str, object]]:
        from orleanspy._postgres import translate_errors as pg_errors

        with pg_errors("status read"):
            rows = await self._pool.fetch(
                "SELECT silo, record FROM orleanspy_silo_status "
                "WHERE service_id = $1 AND cluster_id = $2",
                *self._ids,
            )
        return _decoded({r["silo"]: r["record"].encode() for r in rows})


def _decoded(raw: dict[str, bytes]) -> dict[str, dict[str, object]]:
    records: dict[str, dict[str, object]] = {}
    for silo, value in raw.items():
        if len(value) > MAX_RECORD_BYTES:
            continue
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            continue  # advisory data: a bad record shows as unknown
        if isinstance(doc, dict):
            records[silo] = doc
    return records


async def status_store(
    connections: TableConnections, url: str, *, service_id: str, cluster_id: str
) -> StatusStore:
    """The status store beside the membership table at ``url``, sharing its
    client or pool (started: a PostgreSQL table exists once this returns)."""
    if table_backend(url) == "postgres":
        store = PostgresStatusStore(
            await connections.postgres(url), service_id=service_id, cluster_id=cluster_id
        )
        await store.start()
        return store
    return RedisStatusStore(connections.redis(url), service_id=service_id, cluster_id=cluster_id)


class StatusPublisher:
    """Writes one silo's status record now and every ``interval`` seconds until
    the stack unwinds, and removes it then; ``read()`` gives the record's
    fields. A failed write is logged at debug level and retried next round
    (status is advisory)."""

    def __init__(
        self,
        store: StatusStore,
        *,
        silo: Callable[[], SiloAddress],
        read: Callable[[], dict[str, object]],
        interval: float = STATUS_INTERVAL,
    ) -> None:
        self._store = store
        self._silo = silo
        self._read = read
        self._interval = interval

    async def start(self, stack: AsyncExitStack) -> None:
        await self.publish()
        task = asyncio.get_running_loop().create_task(self._run())

        async def stop() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            try:
                await self._store.remove(str(self._silo()))
            except StorageError as exc:
                log.debug("status record not removed error=%r", exc)

        stack.push_async_callback(stop)

    async def publish(self) -> None:
        record = dict(self._read(), updated_ms=int(time.time() * 1000))
        try:
            await self._store.publish(str(self._silo()), record)
        except StorageError as exc:
            log.debug("status record not written error=%r", exc)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.publish()


@dataclass(frozen=True, slots=True)
class SiloRow:
    """One silo as ``cluster status`` and the dashboard show it. ``ring_share``
    is the percentage of the hash ring it owns (Active silos only); the fields
    from its last status record (``activations``, ``reminders``, ``version``,
    ``cpu_percent``, ``loop_lag``) are ``None`` without one, and ``record`` is
    that record as published (the dashboard's counters). ``version`` is the
    release the membership row records (0.2 on), else the record's; ``protocols``
    the wire protocol window the row records (``"1"`` for a 0.1.x row),
    ``ring_mode`` the ring it builds, ``schemas`` its store schema versions."""

    name: str
    status: str
    address: str
    gateway: str | None
    started: datetime
    ring_share: float
    activations: int | None
    reminders: int | None
    status_age: float | None
    last_heartbeat: datetime | None = None
    version: str | None = None
    cpu_percent: float | None = None
    loop_lag: float | None = None
    grain_types: tuple[str, ...] | None = None
    protocols: str = "1"
    ring_mode: str | None = None
    schemas: tuple[tuple[str, int], ...] = ()
    record: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def uptime_seconds(self) -> float:
        return max(0.0, time.time() - self.started.timestamp())

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "status": self.status,
            "address": self.address,
            "gateway": self.gateway,
            "started": self.started.isoformat(),
            "uptime_seconds": round(self.uptime_seconds, 1) if self.status == "active" else None,
            "last_heartbeat": (
                None if self.last_heartbeat is None else self.last_heartbeat.isoformat()
            ),
            "ring_share_percent": round(self.ring_share, 2),
            "activations": self.activations,
            "reminders_held": self.reminders,
            "version": self.version,
            "protocols": self.protocols,
            "ring_mode": self.ring_mode,
            "schemas": dict(self.schemas),
            "cpu_percent": self.cpu_percent,
            "loop_lag_seconds": self.loop_lag,
            "status_age_seconds": None if self.status_age is None else round(self.status_age, 1),
        }


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """Something the membership table says happened: ``kind`` is ``joined``,
    ``suspected`` (``by`` names the voter) or ``dead`` (at the last heartbeat:
    the table keeps no time of death)."""

    at: datetime
    kind: str
    silo: str
    name: str
    by: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"at": self.at.isoformat(), "kind": self.kind, "silo": self.silo,
                "name": self.name, "by": self.by}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """``orphaned_rows``: reminder rows whose grain type no silo hosts, from the
    newest status record that has the figure (``None``: no silo reported it).
    ``feature_level`` is the newest protocol every live silo speaks (the
    features it brings are on: ``orleanspy.versions``); ``ring`` the ring the
    Active silos build."""

    cluster_id: str
    service_id: str
    table_version: int
    silos: tuple[SiloRow, ...]
    events: tuple[MembershipEvent, ...] = ()
    orphaned_rows: int | None = None
    feature_level: int = 1
    ring: str = "balanced"

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "service_id": self.service_id,
            "table_version": self.table_version,
            "feature_level": self.feature_level,
            "ring": self.ring,
            "silos": [s.to_json() for s in self.silos],
            "events": [e.to_json() for e in self.events],
            "orphaned_reminder_rows": self.orphaned_rows,
        }


async def published_types(store: StatusStore) -> set[str]:
    """The grain types named by the silos' status records (``grain_types``)."""
    found: set[str] = set()
    for rec in (await store.read()).values():
        types = rec.get("grain_types")
        if isinstance(types, list):
            found.update(t for t in types if isinstance(t, str))
    return found


def cluster_from(
    snap: MembershipSnapshot,
    records: dict[str, dict[str, object]],
    *,
    cluster_id: str,
    service_id: str,
) -> ClusterStatus:
    """The status of a membership snapshot and the silos' records. Ring shares
    are those of the ring the Active silos record that they build."""
    mode = cluster_ring_mode(snap)
    ring = ConsistentRing.build(snap.active_silos(), balanced=mode == RING_BALANCED)
    now_ms = time.time() * 1000
    rows = []
    events: list[MembershipEvent] = []
    names = {str(e.silo): e.name for e, _ in snap.entries.values()}
    for entry, _etag in sorted(snap.entries.values(), key=lambda e: e[0].start_time):
        address = str(entry.silo)
        rec = records.get(address) if entry.status == SiloStatus.ACTIVE else None
        share = 0.0
        if entry.status == SiloStatus.ACTIVE:
            share = 100.0 * ranges_size(ring.ranges_of(entry.silo)) / _RING_SIZE
        events.append(MembershipEvent(entry.start_time, "joined", address, entry.name))
        for voter, at in entry.suspect_times:
            by = str(voter)
            events.append(MembershipEvent(at, "suspected", address, entry.name, names.get(by, by)))
        if entry.status == SiloStatus.DEAD:
            events.append(MembershipEvent(entry.i_am_alive, "dead", address, entry.name))
        rows.append(
            SiloRow(
                name=entry.name,
                status=entry.status.name.lower(),
                address=address,
                gateway=(f"{entry.silo.host}:{entry.gateway_port}" if entry.gateway_port else None),
                started=entry.start_time.astimezone(UTC),
                ring_share=share,
                activations=_int(rec, "activations"),
                reminders=_int(rec, "reminders_held"),
                status_age=(
                    None if rec is None else max(0.0, (now_ms - _num(rec, "updated_ms")) / 1000)
                ),
                last_heartbeat=entry.i_am_alive.astimezone(UTC),
                version=entry.release or (None if rec is None else _str(rec, "version")),
                cpu_percent=None if rec is None else _float(rec, "cpu_percent"),
                loop_lag=None if rec is None else _float(rec, "loop_lag"),
                grain_types=(
                    None if entry.grain_types is None else tuple(sorted(entry.grain_types))
                ),
                protocols=(
                    str(entry.window.newest)
                    if entry.window.oldest == entry.window.newest
                    else entry.window.text()
                ),
                ring_mode=entry.ring_mode,
                schemas=entry.schemas or (),
                record=rec or {},
            )
        )
    events.sort(key=lambda e: e.at)
    # Every silo counts the same table: the newest count is the cluster's.
    reported = [
        (_num(rec, "updated_ms"), rec["orphaned_rows"])
        for rec in records.values()
        if isinstance(rec.get("orphaned_rows"), int)
    ]
    orphaned = cast(int | None, max(reported)[1] if reported else None)
    return ClusterStatus(
        cluster_id,
        service_id,
        snap.version.version,
        tuple(rows),
        tuple(events),
        orphaned,
        feature_level=cluster_level(snap),
        ring=mode,
    )


async def read_cluster(
    table: MembershipTable, store: StatusStore, *, cluster_id: str, service_id: str
) -> ClusterStatus:
    """The cluster as its store holds it (``StorageUnavailableError`` if unreachable);
    ``table`` is started."""
    snap = await table.read_all()
    try:
        records = await store.read()
    except StorageError as exc:
        log.debug("status records not read error=%r", exc)
        records = {}
    return cluster_from(snap, records, cluster_id=cluster_id, service_id=service_id)


class StatusReader:
    """``read()`` gives the cluster's status, from tables opened once."""

    def __init__(
        self, table: MembershipTable, store: StatusStore, *, cluster_id: str, service_id: str
    ) -> None:
        self._table = table
        self._store = store
        self.cluster_id = cluster_id
        self.service_id = service_id

    async def read(self) -> ClusterStatus:
        return await read_cluster(
            self._table, self._store, cluster_id=self.cluster_id, service_id=self.service_id
        )


async def open_status_reader(
    stack: AsyncExitStack,
    url: str,
    *,
    cluster_id: str,
    service_id: str,
    connections: TableConnections | None = None,
) -> StatusReader:
    """A reader of the cluster whose membership table is at ``url`` (Redis or
    PostgreSQL), its connections closed with ``stack``."""
    conns = connections or TableConnections(stack)
    table = await conns.membership_table(url, cluster_id=cluster_id, service_id=service_id)
    await table.start(stack)
    store = await status_store(conns, url, service_id=service_id, cluster_id=cluster_id)
    return StatusReader(table, store, cluster_id=cluster_id, service_id=service_id)


async def read_status(client: Redis, *, cluster_id: str, service_id: str) -> ClusterStatus:
    """The cluster as one Redis holds it (``StorageUnavailableError`` if unreachable)."""
    table = RedisMembershipTable(client, cluster_id=cluster_id, service_id=service_id)
    async with AsyncExitStack() as stack:
        await table.start(stack)
        store = RedisStatusStore(client, service_id=service_id, cluster_id=cluster_id)
        return await read_cluster(table, store, cluster_id=cluster_id, service_id=service_id)


def _num(rec: dict[str, object], key: str) -> float:
    value = rec.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _float(rec: dict[str, object], key: str) -> float | None:
    value = rec.get(key)
    return float(value) if isinstance(value, int | float) else None


def _str(rec: dict[str, object], key: str) -> str | None:
    value = rec.get(key)
    return value[:64] if isinstance(value, str) else None


def _int(rec: dict[str, object] | None, key: str) -> int | None:
    if rec is None:
        return None
    value = rec.get(key)
    return value if isinstance(value, int) else None


async def other_clusters(client: Redis) -> dict[tuple[str, str], int]:
    """Every ``(service_id, cluster_id)`` with a membership table in this Redis,
    with its number of rows. On a Redis Cluster every master is scanned (SCAN
    per node: redis-py's cluster ``scan_iter``); ``KEYS`` is never used."""
    found: dict[tuple[str, str], int] = {}
    with translate_errors("cluster scan"):
        client = await resolve(client)
        async for key in client.scan_iter(match=_MEMBERS_PATTERN, count=500):
            text = key.decode(errors="replace")
            inner = text[text.find("{") + 1 : text.rfind("}")]
            service, sep, cluster = inner.partition(":")
            if sep:
                count = int(await client.hlen(key))
                found[(service, cluster)] = max(0, count - 1)  # less the version field
    return found


async def explain_no_gateway(redis_url: str, *, cluster_id: str, service_id: str) -> str:
    """Why no gateway was found for ``cluster_id``/``service_id`` in ``redis_url``:
    a sentence for an error message (never raises; says so if Redis fails too)."""
    looked = f"cluster id {cluster_id!r}, service id {service_id!r} in {redacted(redis_url)}"
    client = connect(redis_url)
    try:
        status = await read_status(client, cluster_id=cluster_id, service_id=service_id)
        others = await other_clusters(client)
    except StorageError as exc:
        return f"looked up {looked}, but Redis failed: {exc}"
    finally:
        await client.aclose()
    active = [s for s in status.silos if s.status == "active"]
    if not status.silos:
        held = "the membership table holds no silo for them"
    elif not active:
        held = f"the membership table holds {len(status.silos)} silos for them, none Active"
    elif not any(s.gateway for s in active):
        held = (
            f"the membership table holds {len(active)} Active silos for them, none with a "
            "gateway port (start a silo with --gateway-port / SiloOptions.gateway_port)"
        )
    else:
        listed = ", ".join(s.gateway for s in active if s.gateway)
        held = f"the Active silos list gateways {listed}, but none answered"
    rest = {k: v for k, v in others.items() if k != (service_id, cluster_id)}
    if rest:
        names = ", ".join(
            f"cluster {c!r} service {s!r} ({n} silos)" for (s, c), n in sorted(rest.items())
        )
        tail = f"; this Redis also holds {names}: check --cluster-id and --service-id"
    else:
        tail = "; this Redis holds no other cluster or service ids"
    return f"looked up {looked}: {held}{tail}"
