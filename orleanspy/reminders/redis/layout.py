"""Where ``RedisReminderTable`` keeps a row, and how: shard keys, the due score, records.

``ShardKeys`` names a service's keys (the layout is drawn in ``table``'s module
docstring): a row of grain hash ``h`` lives in shard ``h >> (32 - log2(shards))``,
whose keys share the Redis Cluster hash tag ``{<service_id>:rem:<s>}``. The due
score is ``lane_score``: the priority lane times ``LANE_WIDTH``, plus the due
time in ms. Rows are msgpack records (``ReminderEntry.to_compact_record``);
``decode_row`` reads one back, ``record_without_etag`` encodes one for the
batch scripts. ``SCHEMA_STEPS`` are this layout's schema versions
(``orleanspy._redis_schema``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from orleanspy._redis import key_prefix
from orleanspy._redis_schema import adopt, introduce
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.serialization import pack_lua, unpack

__all__ = [
    "COUNTERS_STEPS",
    "DEAD_LETTERS_STEPS",
    "LANE_WIDTH",
    "SCHEMA_STEPS",
    "ShardKeys",
    "decode_grain_row",
    "decode_row",
    "grain_rows",
    "intervals",
    "lane_score",
    "member",
    "record_without_etag",
]

_TOP: Final = HASH_SPACE - 1

#: The schema steps of this layout: version 1 is 0.1's.
SCHEMA_STEPS: Final = (adopt(),)
#: The rows' counters (``cnt:<key>`` beside each row's history), new in 0.2.
COUNTERS_STEPS: Final = (introduce("per-row counter hashes beside the rows (0.2)"),)
#: The service's dead letters (``dl:{<service_id>:dl}:rows``/``:at``), new in 0.2.
DEAD_LETTERS_STEPS: Final = (introduce("the dead-letter hash and time index (0.2)"),)

#: Width of a priority lane in the due score: next_due ms must lie in [0, 2**44).
LANE_WIDTH: Final = 1 << 44


def lane_score(priority: int, due_ms: int) -> int:
    """The due-index score of a row: priority lane first, then due time (exact in a double)."""
    if not 0 <= due_ms < LANE_WIDTH:
        raise StorageError(f"next_due {due_ms} ms is outside the storable range [1970, 2527)")
    if not -128 <= priority <= 127:
        raise StorageError(f"priority {priority} is outside -128..127")
    return (127 - priority) * LANE_WIDTH + due_ms


def intervals(r: RingRange | None) -> list[tuple[int, int]]:
    """``r`` as inclusive intervals of hashes (``None``: the whole ring)."""
    return [(0, _TOP)] if r is None else r.intervals()


class ShardKeys:
    """The keys of one service's table: ``shards`` (a power of two) shards, each
    named by ``key(shard, kind)`` under one shard key ``prefix`` (the scripts
    build a shard's keys from it: ``prefix .. shard .. '}:' .. kind``)."""

    __slots__ = ("meta", "prefix", "shards", "shift")

    def __init__(self, service_id: str, shards: int) -> None:
        self.shards = shards
        self.shift = 32 - (shards.bit_length() - 1)
        base = key_prefix(service_id)
        self.prefix = f"{base}rem:{{{service_id}:rem:"
        self.meta = f"{base}rem:meta"

    def shard_of(self, h: int) -> int:
        """The shard that holds rows of grain hash ``h``."""
        return h >> self.shift

    def key(self, shard: int, kind: str) -> str:
        return f"{self.prefix}{shard}}}:{kind}"

    def channel(self, shard: int) -> str:
        """The shard's change channel (sharded pub/sub)."""
        return self.key(shard, "changes")

    def shards_of(self, ranges: Iterable[RingRange] | None) -> set[int]:
        """The shards overlapping ``ranges`` (all of them: ``None``)."""
        if ranges is None:
            return set(range(self.shards))
        return {
            s
            for r in ranges
            for a, b in intervals(r)
            for s in range(a >> self.shift, (b >> self.shift) + 1)
        }

    def plan(self, r: RingRange | None) -> list[tuple[int, list[tuple[int, int]]]]:
        """The shards overlapping ``r``, each with ``r``'s part of it as intervals."""
        plan: dict[int, list[tuple[int, int]]] = {}
        for a, b in intervals(r):
            for s in range(a >> self.shift, (b >> self.shift) + 1):
                lo = max(a, s << self.shift)
                hi = min(b, ((s + 1) << self.shift) - 1)
                plan.setdefault(s, []).append((lo, hi))
        return sorted(plan.items())


def member(h: int, key: str) -> str:
    """A row's member of the due index: its hash in 8 hex digits, then its key."""
    return f"{h:08x}|{key}"


def record_without_etag(record: dict[str, Any]) -> bytes:
    """``record`` (which has no ``"e"``) as a msgpack map whose header counts one
    entry more: the batch scripts append ``"e"`` and the etag."""
    body = pack_lua(record)
    count = len(record) + 1
    skip = 1 if body[0] & 0xF0 == 0x80 else 3 if body[0] == 0xDE else 5
    head = bytes((0x80 | count,)) if count < 16 else b"\xde" + count.to_bytes(2, "big")
    return head + body[skip:]


def decode_row(raw: bytes | str) -> ReminderEntry:
    """A stored record as a row; ``StorageError`` for a malformed one or a client
    that decodes responses."""
    if isinstance(raw, str):
        raise StorageError(
            "the redis client decodes responses; create it with decode_responses=False"
        )
    try:
        return ReminderEntry.from_record(unpack(raw))
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed reminder row in redis: {exc}") from exc


def decode_grain_row(raw: bytes | str, grain_id: GrainId) -> ReminderEntry | None:
    """``decode_row`` of a row read for ``grain_id``; ``None`` when it is another
    grain's (a str key may hold '|', so a grain's prefix can match other rows)."""
    if isinstance(raw, str):
        return decode_row(raw)
    try:
        rec = unpack(raw)
        if rec["g"] != grain_id.canonical:
            return None
        return ReminderEntry.from_record(rec, grain_id)
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed reminder row in redis: {exc}") from exc


def grain_rows(reply: Sequence[Any], at: int, grain_id: GrainId) -> tuple[list[ReminderEntry], int]:
    """``grain_id``'s rows, by name, from a ``READ_GRAINS`` reply at ``at`` (a
    count, then that many rows), and where the next grain's part starts."""
    n = int(reply[at])
    rows = [
        r
        for raw in reply[at + 1 : at + 1 + n]
        if raw is not None and (r := decode_grain_row(raw, grain_id)) is not None
    ]
    if len(rows) > 1:
        rows.sort(key=lambda row: row.name)
    return rows, at + 1 + n
