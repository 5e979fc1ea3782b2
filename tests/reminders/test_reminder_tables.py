"""The reminder tables: the shared contract suite on every backend, then Redis specifics."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy._redis import connect
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.table import (
    BatchingReminderTable,
    EndingReminderTable,
    FeedScope,
    FencingReminderTable,
    ReminderTable,
    subscribe,
)
from orleanspy.ring import RingRange
from orleanspy.testing.redis_server import RedisClusterServer, RedisServer
from orleanspy.testing.reminder_table import (
    REMINDER_TABLE_CHECKS,
    check_ended_rows_keep_their_history,
    check_fenced_writer_loses_its_schedule_writes,
    check_read_due_against_brute_force,
    check_read_page_against_brute_force,
    check_reminder_table,
    check_schedule_fields,
    check_upsert_if,
    check_upsert_if_many_and_read_grains,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)

Factory = Callable[[], AbstractAsyncContextManager[ReminderTable]]


def memory_factory() -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            table = InMemoryReminderTable("contract")
            await table.start(stack)
            yield table

    return make


def redis_factory(url: str, shards: int) -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            # A fresh service id per table: an empty table on a shared server.
            table = RedisReminderTable(url, service_id=f"c-{uuid.uuid4().hex[:8]}", shards=shards)
            await table.start(stack)
            yield table

    return make


@pytest.fixture(params=["memory", "redis-256", "redis-1", "redis_cluster-256", "redis_cluster-1"])
def table_factory(request: pytest.FixtureRequest) -> Factory:
    """Every reminder table backend (Redis with the default and a single shard, on
    one server and on a 3-master Redis Cluster)."""
    if request.param == "memory":
        return memory_factory()
    kind, shards = request.param.split("-")
    url = request.getfixturevalue(f"{kind}_url")
    return redis_factory(url, int(shards))


@pytest.mark.parametrize("check", REMINDER_TABLE_CHECKS, ids=lambda c: c.__name__)
async def test_reminder_table_contract(table_factory: Factory, check: Any) -> None:
    await check(table_factory)


async def test_check_reminder_table_runs_every_check_on_memory() -> None:
    await check_reminder_table(memory_factory())


async def test_tables_provide_batching() -> None:
    assert isinstance(InMemoryReminderTable(), BatchingReminderTable)
    assert isinstance(RedisReminderTable("redis://x", service_id="s"), BatchingReminderTable)


async def test_memory_table_index_holds_no_stale_items_under_a_tick_stream() -> None:
    # Each schedule CAS leaves the row's old index item behind; a write pops the
    # stale items at the head of its lane, so rows ticking in due order keep the
    # index at one item per row (no periodic full rebuild needed).
    table = InMemoryReminderTable()
    period = timedelta(seconds=1)
    etags = {}
    for i in range(300):
        due = T0 + i * period / 300
        e = ReminderEntry("default", GrainId("G", i), "r", due, due, period=period)
        etags[i] = await table.upsert(e)
    for tick in range(1, 6):
        for i in range(300):
            due = T0 + tick * period + i * period / 300
            new = await table.update_schedule(GrainId("G", i), "r", etags[i], due, None)
            assert new is not None
            etags[i] = new
    items = sum(len(lane) for lanes in table._due for lane in lanes.values())
    assert items == 300
    due = await table.read_due(RingRange.full(), T0 + 6 * period, 1000)
    assert len(due) == 300 and due[0].next_due == T0 + 5 * period


class _RangeBlindTable(InMemoryReminderTable):
    """Breaks the contract: read_due ignores the range."""

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        return await super().read_due(RingRange.full(), before, limit)


async def test_contract_suite_catches_a_table_that_ignores_the_range() -> None:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            table = _RangeBlindTable("contract")
            await table.start(stack)
            yield table

    with pytest.raises(AssertionError, match="outside range"):
        await check_read_due_against_brute_force(make)


class _EtagBlindTable(InMemoryReminderTable):
    """Breaks the contract: upsert_if writes whatever the etag."""

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        return await self.upsert(entry)


class _PageDroppingTable(InMemoryReminderTable):
    """Breaks the contract: every full page loses its last row."""

    async def read_page(self, cursor: str | None, limit: int, **kw: Any) -> Any:
        rows, nxt = await super().read_page(cursor, limit, **kw)
        return (rows[:-1], nxt) if nxt is not None else (rows, nxt)


class _PrefixBlindTable(InMemoryReminderTable):
    """Breaks the contract: a key prefix matches int keys' text too."""

    async def read_page(
        self, cursor: str | None, limit: int, *, type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> Any:  # fmt: skip
        rows, nxt = await super().read_page(cursor, limit, type_name=type_name)
        if key_prefix is not None:
            rows = [r for r in rows if str(r.grain_id.key).startswith(key_prefix)]
        return rows, nxt


class _NoCondTable(InMemoryReminderTable):
    """Breaks the contract: upsert_if_many ignores the conditions."""

    async def upsert_if_many(self, writes: Any) -> list[str | None]:
        return [await self.upsert(e) for e, _ in writes]


def _plain(entry: ReminderEntry) -> ReminderEntry:
    """``entry`` as a table that predates the optional schedule fields stores it."""
    return replace(
        entry,
        jitter=None,
        starts_at=None,
        ends_at=None,
        max_ticks=None,
        final_due=None,
        payload=None,
        retry=None,
    )


class _OptionalFieldsBlindTable(InMemoryReminderTable):
    """Breaks the contract: rows are stored without their optional schedule fields."""

    async def upsert(self, entry: ReminderEntry) -> str:
        return await super().upsert(_plain(entry))


class _CasDropsOptionalFieldsTable(InMemoryReminderTable):
    """Breaks the contract: a schedule CAS rewrites the row without its optional fields."""

    async def update_schedule(
        self, grain_id: GrainId, name: str, etag: str, next_due: datetime, last_fire: Any
    ) -> str | None:
        new = await super().update_schedule(grain_id, name, etag, next_due, last_fire)
        row = await self.read(grain_id, name)
        if new is None or row is None:
            return new
        return await super().upsert(_plain(row))


def _factory_of(cls: type[InMemoryReminderTable]) -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            table = cls("contract")
            await table.start(stack)
            yield table

    return make


@pytest.mark.parametrize(
    ("broken", "check", "match"),
    [
        (_EtagBlindTable, check_upsert_if, "insert over an existing row"),
        (_PageDroppingTable, check_read_page_against_brute_force, "missing or extra"),
        (_PrefixBlindTable, check_read_page_against_brute_force, "rows, want"),
        (_NoCondTable, check_upsert_if_many_and_read_grains, "wrong rows decided"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
async def test_contract_suite_catches_broken_conditional_writes_and_paging(
    broken: type[InMemoryReminderTable], check: Any, match: str
) -> None:
    with pytest.raises(AssertionError, match=match):
        await check(_factory_of(broken))


class _EndForgetsHistoryTable(InMemoryReminderTable):
    """Breaks the contract: ``end`` deletes the history as ``remove`` does."""

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        return await self.remove(grain_id, name, etag)


async def test_contract_suite_catches_an_end_that_drops_the_history() -> None:
    with pytest.raises(AssertionError, match="end dropped the history"):
        await check_ended_rows_keep_their_history(_factory_of(_EndForgetsHistoryTable))


async def test_every_backend_ends_rows_keeping_their_history() -> None:
    # So the kit's check runs on each, not skips.
    assert isinstance(InMemoryReminderTable(), EndingReminderTable)
    assert isinstance(RedisReminderTable("redis://x", service_id="s"), EndingReminderTable)
    assert isinstance(
        PostgresReminderTable("postgresql://x/y", service_id="s"), EndingReminderTable
    )


class _FenceIgnoredTable(InMemoryReminderTable):
    """Breaks the contract: ``fence`` is accepted but schedule writes never check it."""

    async def update_schedule_many_as(
        self, writer: SiloAddress | None, updates: Sequence[ScheduleUpdate]
    ) -> list[str | None]:
        return await super().update_schedule_many_as(None, updates)


async def test_contract_suite_catches_a_table_that_ignores_the_fence() -> None:
    with pytest.raises(AssertionError, match="fenced writer's update_schedule won"):
        await check_fenced_writer_loses_its_schedule_writes(_factory_of(_FenceIgnoredTable))


async def test_every_backend_fences() -> None:
    # So the kit's check runs on each, not skips.
    assert isinstance(InMemoryReminderTable(), FencingReminderTable)
    assert isinstance(RedisReminderTable("redis://x", service_id="s"), FencingReminderTable)
    assert isinstance(
        PostgresReminderTable("postgresql://x/y", service_id="s"), FencingReminderTable
    )


async def test_memory_writer_views_share_rows_and_fences() -> None:
    table = InMemoryReminderTable("contract")
    a, b = SiloAddress("h", 1, generation=1), SiloAddress("h", 1, generation=2)
    view_a, view_b = table.writer_view(a), table.writer_view(b)
    gid = GrainId("G", "view")
    etag = await table.upsert(ReminderEntry("contract", gid, "r", T0, T0, timedelta(seconds=1)))
    await view_b.fence(a, at=T0)
    assert await view_a.update_schedule(gid, "r", etag, T0 + timedelta(seconds=1), T0) is None
    assert await view_b.update_schedule(gid, "r", etag, T0 + timedelta(seconds=1), T0) is not None
    row = await view_a.read(gid, "r")
    assert row is not None and row.next_due == T0 + timedelta(seconds=1)


async def test_contract_suite_catches_a_table_that_drops_the_optional_fields() -> None:
    with pytest.raises(AssertionError, match="read changed the row"):
        await check_schedule_fields(_factory_of(_OptionalFieldsBlindTable))


async def test_contract_suite_catches_a_cas_that_drops_the_optional_fields() -> None:
    with pytest.raises(AssertionError, match="update_schedule lost fields"):
        await check_schedule_fields(_factory_of(_CasDropsOptionalFieldsTable))


# -- Redis specifics -------------------------------------------------------------------


def entry(grain: GrainId, name: str = "r", due: datetime = T0, sid: str = "svc") -> ReminderEntry:
    return ReminderEntry(
        service_id=sid,
        grain_id=grain,
        name=name,
        start_at=T0,
        next_due=due,
        period=timedelta(minutes=1),
    )


async def test_redis_start_refuses_another_shard_count(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        await RedisReminderTable(redis_url, service_id="svc", shards=16).start(stack)
    async with AsyncExitStack() as stack:
        with pytest.raises(StorageError, match="created with 16 shards"):
            await RedisReminderTable(redis_url, service_id="svc", shards=32).start(stack)
    async with AsyncExitStack() as stack:
        # Same count, or another service, is fine.
        await RedisReminderTable(redis_url, service_id="svc", shards=16).start(stack)
        await RedisReminderTable(redis_url, service_id="other", shards=32).start(stack)


async def test_redis_rows_land_in_the_shard_of_their_top_hash_bits(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="svc", shards=16)
        await table.start(stack)
        gid = GrainId("G", "x")
        await table.upsert(entry(gid))
        shard = gid.uniform_hash() >> 28
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        tag = f"{{svc:rem:{shard}}}"
        assert await client.hexists(f"orleanspy:svc:rem:{tag}:rows", f"{gid.canonical}|r")
        assert await client.zscore(
            f"orleanspy:svc:rem:{tag}:due", f"{gid.uniform_hash():08x}|{gid.canonical}|r"
        ) == float(127 * 2**44 + int(T0.timestamp() * 1000))  # NORMAL's lane, then due
        assert await client.zscore(f"orleanspy:svc:rem:{tag}:grain", f"{gid.canonical}|r") == 0


async def test_redis_read_due_is_one_script_call_fetching_only_rows_inside_the_range(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="svc", shards=64)
        await table.start(stack)
        grains = [GrainId("G", i) for i in range(2000)]
        for i in range(0, len(grains), 200):
            await asyncio.gather(*(table.upsert(entry(g)) for g in grains[i : i + 200]))
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)

        async def calls() -> dict[str, int]:
            # Commands a script runs count in commandstats too.
            stats = await client.info("commandstats")
            return {
                name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
                for name in ("evalsha", "eval", "hget", "hmget", "zrangebyscore")
            }

        async def counted(read: Any) -> tuple[Any, dict[str, int]]:
            before = await calls()
            rows = await read
            after = await calls()
            return rows, {name: after[name] - before[name] for name in after}

        # The script is loaded by its first call (an answer of NOSCRIPT, then a load).
        await table.read_due(RingRange.full(), T0, 1)
        # A range inside shard 5 (of 64), cut so that filtering has work to do.
        shard_lo = 5 << 26
        r = RingRange(shard_lo + (1 << 24), shard_lo + (3 << 24))
        in_range = {g.canonical for g in grains if g.uniform_hash() in r}
        assert 0 < len(in_range) < 30
        rows, ran = await counted(table.read_due(r, T0, 1000))
        assert {row.grain_id.canonical for row in rows} == in_range
        assert ran["evalsha"] + ran["eval"] == 1, ran
        # Shards outside the range are not read, rows outside it are not fetched.
        assert ran["zrangebyscore"] <= 2, ran
        assert ran["hget"] == len(in_range) and ran["hmget"] == 0, ran

        # A wrapping range over the last and first shard reads exactly those two.
        r = RingRange((64 << 26) - (1 << 20), 1 << 20)
        in_range = {g.canonical for g in grains if g.uniform_hash() in r}
        rows, ran = await counted(table.read_due(r, T0, 1000))
        assert {row.grain_id.canonical for row in rows} == in_range
        assert ran["evalsha"] + ran["eval"] == 1 and ran["zrangebyscore"] <= 4, ran
        assert ran["hget"] == len(in_range), ran

        # The whole ring is still one call, and a limit caps the rows fetched.
        rows, ran = await counted(table.read_due(RingRange.full(), T0, 25))
        assert len(rows) == 25 and ran["hget"] == 25, ran
        assert ran["evalsha"] + ran["eval"] == 1, ran
        assert rows == sorted(rows, key=lambda row: (row.hash, row.key))  # one due time

        # Skipped rows never leave Redis: the skip set travels with the call, and
        # only the rows taken are fetched.
        first = await table.read_due(RingRange.full(), T0, 100)
        skip = {row.key for row in first[:60]}
        rows, ran = await counted(table.read_due_skipping(RingRange.full(), T0, 100, skip, take=30))
        assert [row.key for row in rows] == [row.key for row in first[60:90]]
        assert ran["evalsha"] + ran["eval"] == 1 and ran["hget"] == 30, ran
        # Skipped rows count towards the limit (the script then merges again,
        # counting them, since the first merge left them out).
        rows = await table.read_due_skipping(RingRange.full(), T0, 65, skip)
        assert [row.key for row in rows] == [row.key for row in first[60:65]]


async def test_redis_client_passed_in_is_not_closed(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        async with AsyncExitStack() as stack:
            table = RedisReminderTable(client, service_id="svc")
            await table.start(stack)
            await table.upsert(entry(GrainId("G", 1)))
        assert await client.ping() is True
        assert await client.hlen("orleanspy:svc:rem:meta") == 1
    finally:
        await client.aclose()


async def test_redis_unavailable_then_recovers(own_redis: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(own_redis.url, service_id="svc", shards=8)
        await table.start(stack)
        gid = GrainId("G", "down")
        await table.upsert(entry(gid))
        own_redis.kill()
        with pytest.raises(StorageUnavailableError):
            await table.upsert(entry(gid))
        with pytest.raises(StorageUnavailableError):
            await table.read_due(RingRange.full(), T0, 10)
        own_redis.start()
        # SIGKILL lost the data; the table works again once the server is back.
        etag = await table.upsert(entry(gid))
        row = await table.read(gid, "r")
        assert row is not None and row.etag == etag
        assert await table.count() == 1


async def test_redis_changes_survive_a_server_restart(own_redis: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(own_redis.url, service_id="svc", shards=8)
        await table.start(stack)
        feed = table.changes()
        stack.push_async_callback(feed.aclose)
        gid = GrainId("G", "feed")
        before_restart = asyncio.ensure_future(anext(feed))
        await _write_until_seen(table, gid, before_restart)

        own_redis.kill()
        own_redis.start()
        after_restart = asyncio.ensure_future(anext(feed))
        change = await _write_until_seen(table, GrainId("G", "after"), after_restart)
        assert change.grain_id == GrainId("G", "after")


async def _write_until_seen(
    table: RedisReminderTable, gid: GrainId, pending: asyncio.Future[ReminderChange]
) -> ReminderChange:
    """Upsert ``gid`` until ``pending`` (an ``anext`` of a feed) yields, with a
    deadline; writes may fail while the server comes back."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not pending.done():
        assert loop.time() < deadline, "no change arrived"
        with suppress(StorageUnavailableError):
            await table.upsert(entry(gid))
        await asyncio.wait({pending}, timeout=0.1)
    return pending.result()


async def test_redis_changes_end_when_the_table_closes(redis_url: str) -> None:
    stack = AsyncExitStack()
    table = RedisReminderTable(redis_url, service_id="svc")
    await table.start(stack)
    feed = table.changes()
    await table.upsert(entry(GrainId("G", 1)))
    reader = asyncio.ensure_future(anext(feed))
    await asyncio.sleep(0)
    await stack.aclose()
    async with asyncio.timeout(10):
        with pytest.raises(StopAsyncIteration):
            await reader


async def _evalsha_calls(client: Any) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_redis_update_schedule_many_is_one_script_call_and_survives_noscript(
    own_redis: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(own_redis.url, service_id="svc", shards=64)
        await table.start(stack)
        grains = [GrainId("G", i) for i in range(300)]
        etags = await asyncio.gather(*(table.upsert(entry(g)) for g in grains))
        assert len({table.shard_of(g.uniform_hash()) for g in grains}) > 10
        later = T0 + timedelta(minutes=1)
        updates = [
            ScheduleUpdate(g, "r", etag, later, T0) for g, etag in zip(grains, etags, strict=True)
        ]
        # One stale etag in the middle loses its race without affecting the others.
        updates[150] = ScheduleUpdate(grains[150], "r", "stale", later, T0)
        client = connect(own_redis.url)
        stack.push_async_callback(client.aclose)
        # A flushed script cache (as after a restart) costs one reload, not an error.
        await client.script_flush()
        before = await _evalsha_calls(client)
        results = await table.update_schedule_many(updates)
        after = await _evalsha_calls(client)
        assert after - before <= 2, "a batch must be one script call (plus one NOSCRIPT retry)"
        assert results[150] is None
        assert all(r is not None for i, r in enumerate(results) if i != 150)
        for i in (0, 149, 151, 299):
            row = await table.read(grains[i], "r")
            assert row is not None
            assert (row.next_due, row.last_fire, row.etag) == (later, T0, results[i])
        unchanged = await table.read(grains[150], "r")
        assert unchanged is not None and unchanged.next_due == T0
        # Loaded now: the next batch is exactly one call.
        again = [
            ScheduleUpdate(g, "r", etag, T0, None)
            for g, etag in zip(grains[:10], results[:10], strict=True)
            if etag is not None
        ]
        before = await _evalsha_calls(client)
        assert all(r is not None for r in await table.update_schedule_many(again))
        assert await _evalsha_calls(client) - before == 1
        row = await table.read(grains[0], "r")
        assert row is not None and row.last_fire is None


async def _next_or_none(feed: Any, timeout: float) -> ReminderChange | None:
    try:
        return await asyncio.wait_for(anext(feed), timeout)
    except TimeoutError:
        return None


async def test_redis_scoped_feed_skips_own_writes_and_unowned_rows(redis_url: str) -> None:
    service = f"scoped-{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        mine = RedisReminderTable(redis_url, service_id=service, shards=16)
        other = RedisReminderTable(redis_url, service_id=service, shards=16)
        await mine.start(stack)
        await other.start(stack)
        grains = [GrainId("G", i) for i in range(64)]
        half = RingRange(0, (1 << 31) - 1)  # hashes in (0, 2**31 - 1]: shards 0..7
        inside = [g for g in grains if g.uniform_hash() in half]
        outside = [g for g in grains if g.uniform_hash() not in half]
        assert inside and outside
        scope = FeedScope([half], skip_own_writes=True)
        feed = subscribe(mine, scope)
        stack.push_async_callback(feed.aclose)
        pending = asyncio.ensure_future(anext(feed))
        # Subscribed lazily: write another's row inside until the feed sees it.
        await _write_until_seen(other, inside[0], pending)
        # Now: own writes, and others' writes outside the range, are not delivered;
        # the marker written last by the other writer inside the range is.
        for g in inside[1:]:
            await mine.upsert(entry(g))
        for g in outside:
            await other.upsert(entry(g))
        await other.upsert(entry(inside[0], name="marker"))
        change = await _next_or_none(feed, 10)
        assert change is not None
        assert (change.grain_id, change.name) == (inside[0], "marker")
        # Only the shards overlapping the range are subscribed.
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        channels = await client.execute_command("PUBSUB", "SHARDCHANNELS", f"*{service}*")
        assert {mine.shard_of(g.uniform_hash()) for g in inside} <= {
            int(c.decode().split(":rem:")[-1].split("}")[0]) for c in channels
        }
        assert len(channels) == 8  # half of 16 shards
        # A range change re-subscribes: the other half now arrives, the first half not.
        scope.set_ranges([RingRange((1 << 31) - 1, 0)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        seen: ReminderChange | None = None
        while seen is None:
            assert loop.time() < deadline, "the feed did not follow the new ranges"
            await other.upsert(entry(inside[1], name="old-half"))
            await other.upsert(entry(outside[0], name="new-half"))
            seen = await _next_or_none(feed, 0.2)
            while seen is not None and seen.name == "old-half":
                # Published before the feed re-subscribed: allowed, then it stops.
                seen = await _next_or_none(feed, 0.2)
        assert (seen.grain_id, seen.name) == (outside[0], "new-half")
        for _ in range(3):
            await other.upsert(entry(inside[1], name="old-half"))
        await other.upsert(entry(outside[0], name="last"))
        while (change := await _next_or_none(feed, 10)) is not None and change.name != "last":
            assert change.name != "old-half", "a change of an unowned row arrived"
        assert change is not None and change.name == "last"


async def test_redis_unscoped_feed_sees_every_writer_and_shard(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id=f"all-{uuid.uuid4().hex[:8]}", shards=16)
        await table.start(stack)
        feed = table.changes()
        stack.push_async_callback(feed.aclose)
        pending = asyncio.ensure_future(anext(feed))
        await _write_until_seen(table, GrainId("G", "first"), pending)
        grains = [GrainId("G", i) for i in range(40)]
        for g in grains:
            await table.upsert(entry(g))
        got: set[GrainId] = set()
        while not set(grains) <= got:
            change = await _next_or_none(feed, 10)
            assert change is not None, f"missing {set(grains) - got}"
            got.add(change.grain_id)


async def test_a_cluster_feed_cancelled_while_it_connects_leaves_no_connection(
    redis_cluster: RedisClusterServer, redis_cluster_url: str
) -> None:
    """A cluster feed opens one pub/sub connection per master concurrently. An
    ``open`` cancelled at any point of that (a silo stopping while its ring
    changes) leaves no connection behind once the table is closed, including
    when redis-py finished the connect despite the cancellation (on Python
    3.11 ``asyncio.wait_for`` returns a result that arrives with the cancel)."""
    before = {(c["port"], c["id"]) for c in redis_cluster.clients()}
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(
            redis_cluster_url, service_id=f"cx-{uuid.uuid4().hex[:8]}", shards=16
        )
        await table.start(stack)
        for spins in range(60):
            feed = table.changes()
            opening = asyncio.ensure_future(feed.open())
            for _ in range(spins):
                await asyncio.sleep(0)
            opening.cancel()
            with suppress(asyncio.CancelledError, StorageError):
                await opening
            if spins % 2:
                await feed.aclose()  # the others are left to the table's close

    def left() -> set[tuple[str, str]]:
        return {(c["port"], c["id"]) for c in redis_cluster.clients()} - before

    deadline = asyncio.get_running_loop().time() + 5
    while left() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert left() == set()
    gc.collect()  # an unclosed connection's ResourceWarning fails the test


@pytest.mark.parametrize("kind", ["redis_url", "redis_cluster_url"])
async def test_redis_label_pages_bound_the_members_one_call_looks_at(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A selector whose first term matches thousands of rows and whose second few:
    a call looks at a bounded number of the first term's members, so the first
    page comes short with a cursor, and the walk still finds exactly the few."""
    make = redis_factory(request.getfixturevalue(kind), 1)
    async with make() as table:
        assert isinstance(table, RedisReminderTable)
        sid = table.service_id
        rows = [
            ReminderEntry(sid, GrainId("Budget", i), "r", T0, T0, period=timedelta(minutes=1),
                          labels={"tenant": "acme", **({"zz": "rare"} if i % 1000 == 999 else {})})
            for i in range(2500)
        ]  # fmt: skip
        await table.upsert_many(rows)
        terms = ["l:tenant=acme", "l:zz=rare"]
        page, cursor = await table.read_indexed(terms, None, 5)
        assert len(page) < 5 and cursor is not None
        found = list(page)
        while cursor is not None:
            page, cursor = await table.read_indexed(terms, cursor, 5)
            found.extend(page)
        assert sorted(r.grain_id.key for r in found) == [999, 1999]
        assert await table.count_indexed("l:zz=rare") == 2
