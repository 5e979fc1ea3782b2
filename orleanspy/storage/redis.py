"""``RedisGrainStorage``: grain state in Redis, one hash per grain state.

Layout (``P`` = ``orleanspy:<service_id>:``)::

    P state:{<service_id>:<grain type>/<key>}:<state name>   HASH  d -> state bytes
                                                                   e -> etag

    P state:{<service_id>:<grain type>/<key>}:<state name>:cleared:<token>
                                                          STRING, for 2 minutes after a clear

The braces are a Redis Cluster hash tag: every state of one grain lives in one
slot, and each script touches keys of one grain only, so the layout runs
unchanged on Redis Cluster. State names cannot hold ':' or '}'
(``orleanspy.state`` checks), so no two states share a key, and no state's key
is a clear's token key (which lets a clear sent twice answer the same both
times; ``_CLEAR``).

Writes and clears are Lua scripts: compare the stored etag, then write or
delete, atomically. Reads and writes that arrive together share one pipeline
(see ``storage._batch``), so a silo activating or writing many grains at once
pays the round trip and the client's per-call cost once per batch, not once per
grain. Etags are 64
random bits made by the writer, so an etag never comes back after a clear (a
counter in the hash would restart at 1).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final

from orleanspy._redis import (
    Client,
    Redis,
    call_script,
    connect,
    key_prefix,
    reply_error,
    resolve,
    retry_failover,
    run_script_calls,
    translate_errors,
)
from orleanspy._redis_schema import adopt, migrate
from orleanspy.errors import StorageError
from orleanspy.identity import GrainId
from orleanspy.schema import SchemaVersion
from orleanspy.storage._batch import Batcher
from orleanspy.storage.contract import StoredState

if TYPE_CHECKING:
    from orleanspy.options import RedisOptions

__all__ = ["RedisGrainStorage"]

# KEYS: the state hash. ARGV: expected etag ('' = nothing stored), data, new etag.
# Returns 1 when written, false on a lost race. A write whose new etag is already
# stored is this very write sent again (the client resends a command whose reply
# a dropped connection lost; etags are 64 random bits): it succeeded, return 1.
_WRITE: Final = """
local cur = redis.call('HGET', KEYS[1], 'e')
if cur and cur == ARGV[3] then return 1 end
if ARGV[1] == '' then
  if cur then return false end
elseif cur ~= ARGV[1] then
  return false
end
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'e', ARGV[3])
return 1
"""

# KEYS: the state hash, this clear's token key. ARGV: expected etag ('' = nothing
# stored), how long the token is kept (ms). Returns 1 when the state is gone now,
# 0 on a lost race. A clear that removes the state leaves its token behind for a
# while: the same clear run again (its reply was lost, and redis-py or the
# failover retry sent it again) finds the token and answers 1 again, where the
# state alone would say "nothing stored, not your version": a lost race.
_CLEAR: Final = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
local cur = redis.call('HGET', KEYS[1], 'e')
if ARGV[1] == '' then
  if cur then return 0 end
  return 1
end
if cur ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
"""

#: How long a clear's token is kept: longer than any retry of it goes on (a
#: retry stops at its call's deadline, the response timeout).
CLEAR_TOKEN_TTL_MS: Final = 120_000


_MALFORMED: Final = (
    "malformed grain state record at redis key {key!r}: it needs fields 'd' and 'e' as "
    "bytes (was it written by something else, or by a client with decode_responses=True?)"
)

# One write: (key, expected etag or '', data, new etag).
_Write = tuple[str, str, bytes, str]


#: The schema steps of this layout (``orleanspy._redis_schema``).
SCHEMA_STEPS = (adopt(),)


class RedisGrainStorage:
    """A ``GrainStorage`` in Redis.

    ``url_or_client``: a URL (the provider creates its client and closes it with
    the start stack) or a ``redis.asyncio.Redis`` client created with bytes
    responses (never closed here). ``service_id`` scopes the keys. Up to
    ``concurrency`` reads (and as many writes) go to Redis on their own at once;
    more share pipelines (on Redis Cluster, one per node, sent concurrently).
    ``options``: ``RedisOptions``; with ``wait_replicas`` every write and clear
    waits for that many replicas before it is acknowledged.
    """

    schema = SchemaVersion("redis", "grain_state", len(SCHEMA_STEPS))

    def __init__(
        self,
        url_or_client: str | Redis,
        *,
        service_id: str = "default",
        concurrency: int = 8,
        options: RedisOptions | None = None,
    ) -> None:
        self.service_id = service_id
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._source: Redis | None = None if isinstance(url_or_client, str) else url_or_client
        self._client: Client | None = None
        self._options = options
        self._prefix = f"{key_prefix(service_id)}state:{{{service_id}:"
        self._reads: Batcher[str, StoredState | None] = Batcher(
            self._read_many, concurrency=concurrency
        )
        self._writes: Batcher[_Write, bool] = Batcher(self._write_many, concurrency=concurrency)
        self._write: Any = None
        self._clear: Any = None

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect (if given a URL) and register the scripts."""
        if self._source is None:
            assert self._url is not None
            self._source = connect(self._url)
            stack.push_async_callback(self._source.aclose)
        with translate_errors("grain state start"):
            self._client = await resolve(self._source)
        self.migration = await migrate(self._client, "grain_state", SCHEMA_STEPS)
        self._write = self._client.register_script(_WRITE)
        self._clear = self._client.register_script(_CLEAR)

    @property
    def _c(self) -> Client:
        if self._client is None:
            raise RuntimeError("RedisGrainStorage used before start()")
        return self._client

    def key(self, grain_id: GrainId, name: str) -> str:
        """The Redis key of one grain state (for tools and tests)."""
        return f"{self._prefix}{grain_id.canonical}}}:{name}"

    # Each operation is retried through a failover, within the deadline of the
    # grain call it serves (``retry_failover``); each is safe to repeat after an
    # attempt whose reply was lost (see the scripts above).

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        key = self.key(grain_id, name)
        return await retry_failover(
            self._c, "grain state read", lambda _attempt: self._reads.submit(key)
        )

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        # One new etag for every attempt: a retry whose first attempt landed
        # finds it stored and reports success, not a lost race.
        write = (self.key(grain_id, name), etag or "", data, secrets.token_hex(8))
        done = await retry_failover(
            self._c, "grain state write", lambda _attempt: self._writes.submit(write)
        )
        return write[3] if done else None

    async def clear(self, grain_id: GrainId, name: str, etag: str | None) -> bool:
        key = self.key(grain_id, name)
        # The token key shares the state's hash tag (one slot, one script).
        keys = [key, f"{key}:cleared:{secrets.token_hex(8)}"]
        args = [etag or "", CLEAR_TOKEN_TTL_MS]
        done = await retry_failover(
            self._c,
            "grain state clear",
            lambda _attempt: call_script(self._c, self._clear, keys, args, self._options),
        )
        return bool(done)

    # -- batches ------------------------------------------------------------------------

    async def _read_many(self, keys: Sequence[str]) -> list[StoredState | Exception | None]:
        """The records at ``keys``: one ``HMGET``, or a pipeline of them. A malformed
        record is its own read's error, not the whole batch's."""
        with translate_errors("grain state read"):
            if len(keys) == 1:
                replies = [await self._c.hmget(keys[0], ["d", "e"])]
            else:
                pipe = self._c.pipeline(transaction=False)
                for key in keys:
                    pipe.hmget(key, ["d", "e"])
                replies = await pipe.execute(raise_on_error=False)
        return [_record(key, reply) for key, reply in zip(keys, replies, strict=True)]

    async def _write_many(self, writes: Sequence[_Write]) -> list[bool | Exception]:
        """Run the write script for each of ``writes`` (a pipeline for several; the
        scripts still run one after another, each atomic)."""
        with translate_errors("grain state write"):
            if len(writes) == 1:
                key, expected, data, new = writes[0]
                done = await call_script(
                    self._c, self._write, [key], [expected, data, new], self._options
                )
                return [bool(done)]
            # Only calls answered NOSCRIPT are sent again (they did not run).
            replies = await run_script_calls(
                self._c,
                _WRITE,
                self._write.sha,
                [([key], [expected, data, new]) for key, expected, data, new in writes],
                wait=self._options,
                raise_on_error=False,
            )
        # A call's own failure (a connection lost mid-batch, a slot moving) is
        # classified as translate_errors would: unavailable ones are retried.
        return [
            reply_error(r, "grain state write") if isinstance(r, Exception) else bool(r)
            for r in replies
        ]


def _record(key: str, reply: Any) -> StoredState | Exception | None:
    if isinstance(reply, Exception):
        return reply_error(reply, "grain state read")
    data, etag = reply
    if data is None and etag is None:
        return None
    if not isinstance(data, bytes) or not isinstance(etag, bytes):
        return StorageError(_MALFORMED.format(key=key))
    return StoredState(data, etag.decode())
