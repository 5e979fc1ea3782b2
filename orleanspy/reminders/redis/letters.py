"""Dead letters of ``RedisReminderTable`` (``reminders.letters.DeadLetterTable``).

Layout (``P`` = ``orleanspy:<service_id>:``, every key under the one Redis
Cluster hash tag ``{<service_id>:dl}``, so each script touches one slot)::

    P dl:{<service_id>:dl}:rows   HASH  id -> msgpack record (``DeadLetter.to_record``)
    P dl:{<service_id>:dl}:at     ZSET  id, score = ms dead-lettered (the listing order)

Letters are few (at most ``ReminderOptions.max_dead_letters`` per service) and
written rarely, so one slot holds them all. A write is one script call
(``scripts.ADD_DEAD_LETTERS``: the letters, then the bounds); a page is one
(``scripts.READ_DEAD_LETTERS``); a removal is one transaction of both keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orleanspy._redis import Client, call_script, key_prefix, translate_errors
from orleanspy.clock import to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.letters import DeadLetter, letter_cursor, parse_letter_cursor
from orleanspy.reminders.table import check_page_limit
from orleanspy.serialization import pack_lua, unpack

__all__ = ["RedisDeadLetters"]


class RedisDeadLetters:
    """The dead letters of one service in Redis (module docstring)."""

    __slots__ = ("_at", "_client", "_rows", "_scripts")

    def __init__(self, client: Client, service_id: str, scripts: dict[str, Any]) -> None:
        base = f"{key_prefix(service_id)}dl:{{{service_id}:dl}}:"
        self._rows = f"{base}rows"
        self._at = f"{base}at"
        self._client = client
        self._scripts = scripts

    async def add(self, letters: Sequence[DeadLetter], keep: int, expire_before: datetime) -> None:
        args: list[Any] = [keep, to_ms(expire_before)]
        for letter in letters:
            args += (letter.id, to_ms(letter.at), pack_lua(letter.to_record()))
        with translate_errors("reminder add_dead_letters"):
            await call_script(
                self._client, self._scripts["dead_letters"], [self._rows, self._at], args
            )

    async def page(
        self, cursor: str | None, limit: int, grain_id: GrainId | None, name: str | None
    ) -> tuple[list[DeadLetter], str | None]:
        check_page_limit(limit)
        after = parse_letter_cursor(cursor)
        args = [
            "+inf" if after is None else after[0],
            "" if after is None else after[1],
            limit,
            "" if grain_id is None else grain_id.canonical,
            "" if name is None else name,
        ]
        with translate_errors("reminder read_dead_letters"):
            raws, more = await call_script(
                self._client, self._scripts["read_dead_letters"], [self._rows, self._at], args
            )
        letters = [_decode(raw) for raw in raws]
        return letters, letter_cursor(letters[-1]) if more and letters else None

    async def get(self, letter_id: str) -> DeadLetter | None:
        with translate_errors("reminder read_dead_letter"):
            raw = await self._client.hget(self._rows, letter_id)
        return None if raw is None else _decode(raw)

    async def remove(self, letter_id: str) -> bool:
        with translate_errors("reminder remove_dead_letter"):
            pipe = self._client.pipeline(transaction=True)
            pipe.hdel(self._rows, letter_id)
            pipe.zrem(self._at, letter_id)
            removed, _ = await pipe.execute()
        return bool(removed)

    async def count(self) -> int:
        with translate_errors("reminder count_dead_letters"):
            return int(await self._client.zcard(self._at))


def _decode(raw: Any) -> DeadLetter:
    if isinstance(raw, str):
        raise StorageError(
            "the redis client decodes responses; create it with decode_responses=False"
        )
    try:
        rec = unpack(raw)
    except SerializationError as exc:
        raise StorageError(f"malformed dead letter in redis: {exc}") from exc
    if not isinstance(rec, dict):
        raise StorageError("malformed dead letter in redis: not a map")
    return DeadLetter.from_record(rec)
