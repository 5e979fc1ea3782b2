"""The failover retry of the call path (``_redis.retry_failover``) on a real Redis.

Replies are lost on purpose by a TCP proxy between the client and Redis: it
forwards each command, and when armed closes the client's connection instead of
passing the reply back. The command ran; the client cannot know, and sends it
again on a fresh connection (redis-py does at once; the retry loop does the
same for an error that outlives redis-py's own attempts). Each write
of the call path must then answer as if it had run once: a grain-state write
reports its own etag (not a lost race), a clear reports the state gone, a
directory registration returns its own address, a stream publish appends one
entry. And the loop keeps to the call's deadline (``_retry.within``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from orleanspy._redis import connect, resolve, retry_failover
from orleanspy._retry import seconds_left, within
from orleanspy.directory.redis import RedisGrainDirectory
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.streams.redis import RedisStreamProvider
from orleanspy.testing.redis_server import RedisServer, free_port


class LossyProxy:
    """Forwards TCP to ``upstream``; ``lose(n)`` makes it drop the next ``n``
    replies (closing the client's connection in their place); ``down()`` refuses
    connections and cuts the open ones, ``up()`` serves again."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.to_lose = 0
        self.lost = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose(self, n: int) -> None:
        self.to_lose = n

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def down(self) -> None:
        # The open connections are cut before the wait: from Python 3.12 on,
        # ``wait_closed`` also waits for every connection the server accepted.
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if replies and self.to_lose:
                        self.to_lose -= 1
                        self.lost += 1
                        break  # the command ran; its reply goes nowhere
                    dst.write(data)
                    await dst.drain()
            for w in (writer, up_writer):
                w.close()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))
        self._writers.difference_update((writer, up_writer))


@pytest.fixture
async def proxy(own_redis: RedisServer) -> AsyncIterator[LossyProxy]:
    p = LossyProxy(own_redis.port)
    await p.up()
    try:
        yield p
    finally:
        await p.down()


GRAIN = GrainId("retry.Grain", 1)
OTHER = GrainId("retry.Grain", 2)


async def test_a_state_write_whose_reply_is_lost_reports_its_own_etag(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(proxy.url)
        await storage.start(stack)
        first = await storage.write(GRAIN, "s", b"one", None)
        assert first is not None  # the script is loaded: what is lost is its reply
        proxy.lose(1)
        second = await storage.write(GRAIN, "s", b"two", first)
        assert proxy.lost == 1
        assert second is not None, "a write that landed was reported as a lost race"
        state = await storage.read(GRAIN, "s")
        assert state is not None and (state.data, state.etag) == (b"two", second)
        # The etag check still holds: the old version loses.
        assert await storage.write(GRAIN, "s", b"three", first) is None


async def test_a_clear_whose_reply_is_lost_reports_the_state_gone(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(proxy.url)
        await storage.start(stack)
        etag = await storage.write(GRAIN, "s", b"one", None)
        assert etag is not None
        await storage.clear(OTHER, "s", None)  # the script is loaded: what is lost is its reply
        proxy.lose(1)
        assert await storage.clear(GRAIN, "s", etag) is True
        assert proxy.lost == 1
        assert await storage.read(GRAIN, "s") is None
        # Another clear of that version (not a resend) still loses.
        again = await storage.write(GRAIN, "s", b"new", None)
        assert again is not None
        assert await storage.clear(GRAIN, "s", etag) is False


async def test_a_registration_whose_reply_is_lost_wins_for_its_own_address(
    proxy: LossyProxy,
) -> None:
    async with AsyncExitStack() as stack:
        directory = RedisGrainDirectory(proxy.url, cluster_id="c", service_id="s")
        await directory.start(stack)
        mine = ActivationAddress(SiloAddress("127.0.0.1", 1, 1), "a1")
        other = ActivationAddress(SiloAddress("127.0.0.1", 2, 1), "a2")
        await directory.register(OTHER, other)  # the script is loaded: what is lost is its reply
        proxy.lose(1)
        assert await directory.register(GRAIN, mine) == mine
        assert proxy.lost == 1
        assert await directory.register(GRAIN, other) == mine  # first writer still wins


async def test_a_publish_whose_reply_is_lost_appends_once(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        streams = RedisStreamProvider(proxy.url, service_id="s")
        await streams.start(stack)
        await streams.publish("warm", 0)
        proxy.lose(1)
        entry = await streams.publish("once", {"n": 1})
        assert proxy.lost == 1
        items = await streams.read("once")
        assert [(i.id, i.item) for i in items] == [(entry, {"n": 1})]


async def test_the_loop_waits_out_an_outage_within_the_deadline(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        client = await resolve(connect(proxy.url))
        stack.push_async_callback(client.aclose)
        await client.set("k", "v")
        await proxy.down()

        async def back_soon() -> None:
            await asyncio.sleep(0.6)
            await proxy.up()

        restore = asyncio.create_task(back_soon())
        within(5.0)
        began = time.monotonic()
        value = await retry_failover(client, "get", lambda _n: client.get("k"))
        await restore
        assert value == b"v"
        assert 0.5 <= time.monotonic() - began < 3.0


async def test_the_loop_gives_up_at_the_deadline_saying_so(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        client = await resolve(connect(proxy.url))
        stack.push_async_callback(client.aclose)
        await client.set("k", "v")
        await proxy.down()
        within(0.4)
        began = time.monotonic()
        with pytest.raises(StorageUnavailableError, match=r"tried \d+ times .* deadline"):
            await retry_failover(client, "get", lambda _n: client.get("k"))
        assert 0.35 <= time.monotonic() - began < 2.0
        assert seconds_left() == 0.0


async def test_the_loop_never_retries_a_storage_error(proxy: LossyProxy) -> None:
    async with AsyncExitStack() as stack:
        client = await resolve(connect(proxy.url))
        stack.push_async_callback(client.aclose)
        attempts: list[int] = []

        async def bad(n: int) -> object:
            attempts.append(n)
            return await client.eval("return redis.error_reply('ERR broken script')", 0)

        with pytest.raises(StorageError) as caught:
            await retry_failover(client, "script", bad)
        assert not isinstance(caught.value, StorageUnavailableError)
        assert attempts == [0]


async def test_outside_a_call_nothing_is_retried(proxy: LossyProxy) -> None:
    """No deadline set: the first failure is raised (the caller's own backoff,
    e.g. the reminder service's, applies)."""
    assert seconds_left() == 0.0
    async with AsyncExitStack() as stack:
        client = await resolve(connect(proxy.url))
        stack.push_async_callback(client.aclose)
        await proxy.down()
        attempts: list[int] = []

        async def get(n: int) -> object:
            attempts.append(n)
            return await client.get("k")

        with pytest.raises(StorageUnavailableError):
            await retry_failover(client, "get", get)
        assert attempts == [0]
