"""How ``PostgresReminderTable`` stores a row: its columns' values, and back.

``row_values`` gives a row as the parameters of a whole-row write (the
columns ``sql`` names in ``_ROW_COLUMNS``, in order), ``decode_row`` reads a
selected record back. An etag is the row's ``version`` (``version_of``). The
ring is cut in 256 buckets (``BUCKET_SHIFT``) for the due index
(``slices``); ``due_order`` and ``raw_rank`` are the contract's due order on
rows and on raw records.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any, Final

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import MissedReminderAction, ReminderEntry, extras_from_record
from orleanspy.ring import RingRange
from orleanspy.serialization import pack, unpack

__all__ = [
    "BUCKET_SHIFT",
    "channel_of",
    "decode_row",
    "due_order",
    "index_terms",
    "ms_or_none",
    "raw_rank",
    "row_values",
    "slices",
    "version_of",
]

#: A row's bucket is its grain hash shifted by this: 256 slices of the ring.
BUCKET_SHIFT: Final = 24


def slices(r: RingRange) -> tuple[list[int], list[int], list[int]]:
    """The buckets ``r`` overlaps, each with ``r``'s inclusive hash bounds inside it."""
    buckets: list[int] = []
    los: list[int] = []
    his: list[int] = []
    for a, b in r.intervals():
        for bucket in range(a >> BUCKET_SHIFT, (b >> BUCKET_SHIFT) + 1):
            buckets.append(bucket)
            los.append(max(a, bucket << BUCKET_SHIFT))
            his.append(min(b, ((bucket + 1) << BUCKET_SHIFT) - 1))
    return buckets, los, his


def channel_of(service_id: str) -> str:
    # A channel is an identifier (at most 63 bytes); a digest fits any service id.
    return "orleanspy_rem_" + hashlib.blake2b(service_id.encode(), digest_size=12).hexdigest()


def version_of(etag: str) -> int | None:
    """The version an etag names, or ``None`` for an etag no row can have."""
    if not etag.isascii() or not etag.isdigit() or len(etag) > 19:
        return None
    version = int(etag)
    return version if version < 1 << 63 else None


def ms_or_none(at: datetime | None) -> int | None:
    return None if at is None else to_ms(at)


def row_values(entry: ReminderEntry) -> tuple[Any, ...]:
    """``entry`` as the values of ``sql._ROW_COLUMNS``, in order. A priority outside
    -128..127 is refused (``StorageError``), as the Redis table refuses it: no
    reader could order or announce such a row."""
    if not -128 <= int(entry.priority) <= 127:
        raise StorageError(f"priority {entry.priority} is outside -128..127")
    h = entry.hash
    return (
        entry.grain_id.canonical,
        entry.name,
        h,
        h >> BUCKET_SHIFT,
        int(entry.priority),
        to_ms(entry.start_at),
        to_ms(entry.next_due),
        None if entry.period is None else entry.period // timedelta(milliseconds=1),
        entry.cron,
        entry.tz,
        ms_or_none(entry.last_fire),
        int(entry.action),
        entry.declared,
        entry.paused,
        None if entry.grace is None else entry.grace // timedelta(milliseconds=1),
        _extras(entry),
        entry.fingerprint,
    )


def _extras(entry: ReminderEntry) -> bytes | None:
    extras = entry.extras_record()
    return pack(extras) if extras else None


def decode_row(rec: Any) -> ReminderEntry:
    try:
        period = rec["period_ms"]
        last = rec["last_fire"]
        extras = rec["extras"]
        return ReminderEntry(
            service_id=rec["service_id"],
            grain_id=GrainId.parse(rec["grain_id"]),
            name=rec["name"],
            start_at=from_ms(rec["start_at"]),
            next_due=from_ms(rec["next_due"]),
            period=None if period is None else timedelta(milliseconds=period),
            cron=rec["cron"],
            tz=rec["tz"],
            last_fire=None if last is None else from_ms(last),
            priority=int(rec["priority"]),
            action=MissedReminderAction(rec["action"]),
            etag=str(rec["version"]),
            declared=bool(rec["declared"]),
            paused=bool(rec["paused"]),
            grace=None if rec["grace_ms"] is None else timedelta(milliseconds=rec["grace_ms"]),
            fingerprint=rec["fingerprint"],
            **({} if extras is None else extras_from_record(unpack(extras))),
        )
    except (KeyError, TypeError, ValueError, SerializationError) as exc:
        raise StorageError(f"malformed reminder row in postgresql: {exc}") from exc


def due_order(row: ReminderEntry) -> tuple[int, int, int, str]:
    return (-int(row.priority), to_ms(row.next_due), row.hash, row.key)


def raw_rank(rec: Any) -> tuple[int, int, int, str, str]:
    """``due_order`` on a record's raw columns (no decoding); its first two items
    are what a scan orders by across scans (priority, higher first, then due)."""
    return (-rec["priority"], rec["next_due"], rec["grain_hash"], rec["grain_id"], rec["name"])


def index_terms(entry: ReminderEntry) -> list[str]:
    """The row's label index terms for a single-row write (``stores``)."""
    return entry.index_terms() if entry.labels or entry.calendar else []
