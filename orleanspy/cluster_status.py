"""What a cluster looks like from Redis alone: silos, ring shares, load, and why
a client found no gateway.

Silos with Redis publish a small status record (activations, reminder rows
held) every ``STATUS_INTERVAL`` to the hash
``orleanspy:<service_id>:cluster:{<service_id>:<cluster_id>}:status`` (one
field per silo address, JSON, with the time written). ``read_status`` joins it
with the membership table and the ring, so ``orleanspy cluster status`` needs
no running silo to answer. ``explain_no_gateway`` says why a lookup found
nothing: the ids looked up, what the table holds for them, and which other
cluster and service ids that Redis knows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from orleanspy._redis import Redis, connect, key_prefix, redacted, translate_errors
from orleanspy.errors import StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.ring import ConsistentRing, ranges_size

__all__ = [
    "STATUS_INTERVAL",
    "ClusterStatus",
    "SiloRow",
    "StatusPublisher",
    "explain_no_gateway",
    "published_types",
    "read_status",
    "status_key",
]

log = logging.getLogger(__name__)

#: Seconds between two status records of a silo.
STATUS_INTERVAL = 5.0
_RING_SIZE = 1 << 32
_MEMBERS_PATTERN = "orleanspy:*:cluster:*:members"


def status_key(service_id: str, cluster_id: str) -> str:
    """The hash holding the silos' status records (beside the membership hash)."""
    return f"{key_prefix(service_id)}cluster:{{{service_id}:{cluster_id}}}:status"


class StatusPublisher:
    """Writes one silo's status record now and every ``STATUS_INTERVAL`` until
    the stack unwinds; ``read()`` gives the record's fields. A failed write is
    logged at debug level and retried next round (status is advisory)."""

    def __init__(
        self,
        client: Redis,
        *,
        service_id: str,
        cluster_id: str,
        silo: Callable[[], SiloAddress],
        read: Callable[[], dict[str, object]],
    ) -> None:
        self._client = client
        self._key = status_key(service_id, cluster_id)
        self._silo = silo
        self._read = read

    async def start(self, stack: AsyncExitStack) -> None:
        await self.publish()
        task = asyncio.get_running_loop().create_task(self._run())

        async def stop() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            try:
                with translate_errors("status remove"):
                    await self._client.hdel(self._key, str(self._silo()))
            except StorageError as exc:
                log.debug("status record not removed error=%r", exc)

        stack.push_async_callback(stop)

    async def publish(self) -> None:
        record = dict(self._read(), updated_ms=int(time.time() * 1000))
        try:
            with translate_errors("status publish"):
                await self._client.hset(self._key, str(self._silo()), json.dumps(record))
        except StorageError as exc:
            log.debug("status record not written error=%r", exc)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL)
            await self.publish()


@dataclass(frozen=True, slots=True)
class SiloRow:
    """One silo as ``cluster status`` shows it. ``ring_share`` is the percentage
    of the hash ring it owns (Active silos only); ``activations`` and
    ``reminders`` come from its last status record (``None`` if none)."""

    name: str
    status: str
    address: str
    gateway: str | None
    started: datetime
    ring_share: float
    activations: int | None
    reminders: int | None
    status_age: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "status": self.status,
            "address": self.address,
            "gateway": self.gateway,
            "started": self.started.isoformat(),
            "ring_share_percent": round(self.ring_share, 2),
            "activations": self.activations,
            "reminders_held": self.reminders,
            "status_age_seconds": None if self.status_age is None else round(self.status_age, 1),
        }


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """``orphaned_rows``: reminder rows whose grain type no silo hosts, from the
    newest status record that has the figure (``None``: no silo reported it)."""

    cluster_id: str
    service_id: str
    table_version: int
    silos: tuple[SiloRow, ...]
    orphaned_rows: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "service_id": self.service_id,
            "table_version": self.table_version,
            "silos": [s.to_json() for s in self.silos],
            "orphaned_reminder_rows": self.orphaned_rows,
        }


async def published_types(client: Redis, *, service_id: str, cluster_id: str) -> set[str]:
    """The grain types named by the silos' status records (``grain_types``)."""
    with translate_errors("status read"):
        raw = cast(list[bytes], await client.hvals(status_key(service_id, cluster_id)))
    found: set[str] = set()
    for value in raw:
        try:
            types = json.loads(value).get("grain_types", [])
        except (ValueError, UnicodeDecodeError, AttributeError):
            continue  # advisory data
        found.update(t for t in types if isinstance(t, str))
    return found


async def read_status(client: Redis, *, cluster_id: str, service_id: str) -> ClusterStatus:
    """The cluster as Redis holds it (``StorageUnavailableError`` if unreachable)."""
    table = RedisMembershipTable(client, cluster_id=cluster_id, service_id=service_id)
    async with AsyncExitStack() as stack:
        await table.start(stack)
        snap = await table.read_all()
    with translate_errors("status read"):
        raw = cast(dict[bytes, bytes], await client.hgetall(status_key(service_id, cluster_id)))
    records: dict[str, dict[str, object]] = {}
    for field, value in raw.items():
        try:
            records[field.decode()] = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            continue  # advisory data: a bad record shows as unknown
    ring = ConsistentRing.build(snap.active_silos())
    now_ms = time.time() * 1000
    rows = []
    for entry, _etag in sorted(snap.entries.values(), key=lambda e: e[0].start_time):
        rec = records.get(str(entry.silo)) if entry.status == SiloStatus.ACTIVE else None
        share = 0.0
        if entry.status == SiloStatus.ACTIVE:
            share = 100.0 * ranges_size(ring.ranges_of(entry.silo)) / _RING_SIZE
        rows.append(
            SiloRow(
                name=entry.name,
                status=entry.status.name.lower(),
                address=str(entry.silo),
                gateway=(f"{entry.silo.host}:{entry.gateway_port}" if entry.gateway_port else None),
                started=entry.start_time.astimezone(UTC),
                ring_share=share,
                activations=_int(rec, "activations"),
                reminders=_int(rec, "reminders_held"),
                status_age=(
                    None if rec is None else max(0.0, (now_ms - _num(rec, "updated_ms")) / 1000)
                ),
            )
        )
    reported = [
        (_num(rec, "updated_ms"), rec["orphaned_rows"])
        for rec in records.values()
        if isinstance(rec.get("orphaned_rows"), int)
    ]
    orphaned = max(reported)[1] if reported else None
    return ClusterStatus(
        cluster_id, service_id, snap.version.version, tuple(rows), cast(int | None, orphaned)
    )


def _num(rec: dict[str, object], key: str) -> float:
    value = rec.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _int(rec: dict[str, object] | None, key: str) -> int | None:
    if rec is None:
        return None
    value = rec.get(key)
    return value if isinstance(value, int) else None


async def other_clusters(client: Redis) -> dict[tuple[str, str], int]:
    """Every ``(service_id, cluster_id)`` with a membership table in this Redis,
    with its number of rows."""
    found: dict[tuple[str, str], int] = {}
    with translate_errors("cluster scan"):
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
