"""The change feed of ``RedisReminderTable``: sharded pub/sub, one channel per shard.

A change message is ``<writer: 8 hex><hash: 8 hex><msgpack [grain, name,
next_due_ms | nil]>`` or, from upserts, ``... [grain, name, next_due_ms,
priority]`` (``change_payload``; the table's Lua scripts build the same form).
The fixed-width head lets a reader drop its own writes and rows outside its
ranges before decoding anything.

``RedisChanges`` is one subscription: it subscribes to the channels its scope's
ranges map to (the table says which: ``channels_of``), re-subscribes when the
scope changes, raises ``StorageUnavailableError`` when it loses Redis (changes
may have been missed: the reader opens a new feed, ``open``s it, then re-reads),
and ends on ``aclose``. On a Redis Cluster it holds one pub/sub connection per
master (``topology`` given). The PostgreSQL feed is ``reminders.postgres.feed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from orleanspy._redis import (
    Client,
    current_slot_map,
    node_client,
    refresh_slot_map,
    translate_errors,
)
from orleanspy._tasks import raise_if_cancelled
from orleanspy.clock import from_ms
from orleanspy.errors import SerializationError, StorageError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange
from orleanspy.reminders.table import FeedScope
from orleanspy.ring import RingRange
from orleanspy.serialization import pack, unpack

__all__ = ["HEAD", "ClusterTopology", "RedisChanges", "change_payload", "decode_change"]

_log = logging.getLogger(__name__)

# The change feed polls its socket this often so a close from another task is
# noticed; between polls it blocks in Redis, it does not busy-wait.
FEED_POLL_S: Final = 0.5

#: Bytes of a change message's head: writer id, then the row's hash, 8 hex digits each.
HEAD: Final = 16


def change_payload(
    writer: bytes,
    h: int,
    grain_id: GrainId,
    name: str,
    next_due_ms: int | None,
    *,
    priority: int | None = None,
) -> bytes:
    """A change message: the 16-byte head (writer, hash), then msgpack
    ``[grain, name, next_due_ms]`` and, from upserts, the priority."""
    fields: list[Any] = [grain_id.canonical, name, next_due_ms]
    if priority is not None:
        fields.append(priority)
    return b"%s%08x%s" % (writer, h, pack(fields))


def decode_change(data: bytes) -> ReminderChange:
    """A change message (head included) as a ``ReminderChange``."""
    fields = unpack(data[HEAD:])
    if not isinstance(fields, list) or len(fields) not in (3, 4):
        raise ValueError("a change is [grain, name, next_due_ms] or with a priority")
    canonical, name, due_ms = fields[:3]
    priority = fields[3] if len(fields) == 4 else None
    if priority is not None and (type(priority) is not int or not -128 <= priority <= 127):
        raise ValueError(f"bad priority in change: {priority!r}")
    return ReminderChange(
        GrainId.parse(canonical), name, None if due_ms is None else from_ms(due_ms), priority
    )


class ClusterTopology:
    """What a table's cluster feeds share: whether the slot map is stale (a feed
    lost a node; the next subscription re-reads the map before it subscribes),
    and the node connections they hold, which the table's close shuts."""

    __slots__ = ("closed", "open_nodes", "stale")

    def __init__(self) -> None:
        self.stale = False
        #: Set by ``close``: from then on no feed keeps a node connection it opens.
        self.closed = False
        #: Every node connection a feed holds (pub/sub, client): what the table's
        #: close shuts for feeds that could not (a reader stopped mid-subscribe).
        self.open_nodes: set[tuple[Any, Any]] = set()

    async def close(self) -> None:
        """Close every node connection still open; a connection a feed is still
        opening closes itself when its connect returns (``RedisChanges._open_node``)."""
        self.closed = True
        nodes, self.open_nodes = list(self.open_nodes), set()
        for pubsub, client in nodes:
            await _close_node(pubsub, client)


class RedisChanges:
    """One sharded pub/sub subscription to the change channels a scope wants,
    resubscribing as the scope changes.

    On one Redis it reads its one connection directly. On a cluster each
    shard's channel lives on the node that serves its slot: the feed holds one
    pub/sub connection per node, each read by a task of its own into one queue,
    so a change on any node is seen as soon as it arrives (no node waits for
    another's poll).

    Losing Redis (a connection, a node, a slot that moved: the server ends the
    subscription) raises ``StorageUnavailableError`` from ``__anext__``: changes
    may have been missed, so the reader opens a new feed, ``open``s it, and only
    then re-reads the table (``ReminderLoader.follow``).
    """

    def __init__(
        self,
        client: Client,
        scope: FeedScope,
        *,
        writer: bytes,
        channels_of: Callable[[Iterable[RingRange] | None], set[str]],
        registry: set[RedisChanges],
        topology: ClusterTopology | None = None,
    ) -> None:
        self._client = client
        self._topology = topology
        self._cluster = topology is not None
        self._scope = scope
        self._skip = writer if scope.skip_own_writes else None
        self._channels_of = channels_of
        self._registry = registry
        self._pubsub: Any = None
        self._channels: set[str] = set()
        self._version = -1
        self._closed = asyncio.Event()
        self._scope_changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._busy = False
        self._following: asyncio.Task[None] | None = None
        # Subscriptions sent but not yet confirmed by Redis, and what arrived
        # while ``open`` waited for the confirmations.
        self._unconfirmed = 0
        self._confirmed = asyncio.Event()
        self._early: list[bytes] = []
        # Cluster: per node name, its pub/sub, its client and its reader task;
        # the node each channel was subscribed on; what the readers found.
        self._nodes: dict[str, tuple[Any, Any, asyncio.Task[None]]] = {}
        self._channel_node: dict[str, str] = {}
        self._leaving: set[str] = set()
        self._queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        scope.add_listener(self._on_scope_change)

    def _on_scope_change(self) -> None:
        """Re-subscribe at once, beside a reader blocked on the socket (redis-py
        lets one task send subscriptions while another reads)."""
        self._scope_changed.set()
        subscribed = self._pubsub is not None or bool(self._nodes)
        if subscribed and self._following is None and not self._closed.is_set():
            self._following = asyncio.get_running_loop().create_task(self._follow_now())

    async def _follow_now(self) -> None:
        try:
            await self._follow_scope()
        except Exception as exc:
            # E.g. the reader dropped the connection meanwhile: it reconnects and
            # follows the scope then.
            _log.debug("reminder change feed could not re-subscribe yet error=%s", exc)
        finally:
            self._following = None

    def __aiter__(self) -> RedisChanges:
        return self

    async def open(self, timeout: float = 10.0) -> None:
        """Subscribe now and return once Redis has confirmed every subscription:
        a change written after this returns is delivered. ``StorageError`` (most
        often ``StorageUnavailableError``) if Redis cannot be reached."""
        try:
            with translate_errors("reminder change feed open"):
                await self._follow_scope()
                if self._cluster:
                    await asyncio.wait_for(self._confirmed.wait(), timeout)
                    return
                deadline = asyncio.get_running_loop().time() + timeout
                while self._unconfirmed > 0:
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        raise StorageUnavailableError("reminder change feed: no confirmation")
                    data = await self._read_single(min(left, FEED_POLL_S))
                    if data is not None:
                        self._early.append(data)
        except TimeoutError as exc:
            await self._drop()
            raise StorageUnavailableError("reminder change feed: no confirmation") from exc
        except StorageError:
            await self._drop()
            raise

    async def __anext__(self) -> ReminderChange:
        self._busy = True
        skip, scope = self._skip, self._scope
        try:
            while not self._closed.is_set():
                data = await self._receive()
                if data is None:
                    continue
                # The head is fixed-width ASCII: filter before decoding anything.
                if skip is not None and data[:8] == skip:
                    continue
                try:
                    if scope.ranges is not None and not scope.wants_hash(int(data[8:HEAD], 16)):
                        continue
                    change = decode_change(data)
                except (SerializationError, ValueError, TypeError) as exc:
                    _log.warning("reminder change ignored: malformed payload error=%s", exc)
                    continue
                # Not busy any more: ``aclose`` from another task closes at once.
                self._busy = False
                return change
        except asyncio.CancelledError:
            # Cancelled while reading: a timeout around one ``anext`` keeps the
            # subscription for the next; a reader stopped after ``aclose`` found it
            # busy releases the connection here, or never.
            self._busy = False
            if self._closed.is_set():
                await self._drop()
            raise
        except BaseException:
            self._busy = False  # lost Redis: ``_receive`` dropped the subscription
            await self._drop()
            raise
        self._busy = False
        await self._drop()
        raise StopAsyncIteration

    async def _follow_scope(self) -> None:
        """Subscribe to the channels the scope wants now (and only those)."""
        subscribed = self._pubsub is not None or bool(self._nodes)
        if subscribed and self._scope.version == self._version:
            return  # the common case, checked before taking the lock
        async with self._lock:
            with translate_errors("reminder change feed"):
                if self._cluster:
                    await self._follow_scope_cluster()
                else:
                    await self._follow_scope_locked()

    def _wanted(self) -> set[str]:
        return self._channels_of(self._scope.ranges)

    def _sent(self, n: int) -> None:
        self._unconfirmed += n
        if self._unconfirmed > 0:
            self._confirmed.clear()

    def _confirm(self) -> None:
        self._unconfirmed -= 1
        if self._unconfirmed <= 0:
            self._unconfirmed = 0
            self._confirmed.set()

    async def _follow_scope_locked(self) -> None:
        self._scope_changed.clear()
        version = self._scope.version
        if self._pubsub is not None and version == self._version:
            return
        wanted = self._wanted()
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
            self._channels = set()
        pubsub = self._pubsub
        gone, new = self._channels - wanted, wanted - self._channels
        if gone:
            self._leaving |= gone
            await pubsub.sunsubscribe(*sorted(gone))
        if new:
            self._sent(len(new))
            await pubsub.ssubscribe(*sorted(new))
        self._channels = wanted
        self._version = version
        if not self._channels:
            self._confirmed.set()

    async def _follow_scope_cluster(self) -> None:
        """One pub/sub connection per node that serves a wanted channel's slot;
        one SSUBSCRIBE per channel (a command's channels must share a slot)."""
        self._scope_changed.clear()
        version = self._scope.version
        if self._nodes and version == self._version:
            return
        client: Any = self._client
        assert self._topology is not None
        if self._topology.stale:
            self._topology.stale = False
            await refresh_slot_map(client)
        else:
            await current_slot_map(client)
        wanted = self._wanted()
        gone: dict[str, list[str]] = {}
        for channel in sorted(self._channels - wanted):
            name = self._channel_node.pop(channel, None)
            if name in self._nodes:
                gone.setdefault(name, []).append(channel)
        new: dict[str, tuple[Any, list[str]]] = {}
        for channel in sorted(wanted - self._channels):
            node = client.get_node_from_key(channel)
            if node is None:
                raise StorageUnavailableError(f"no redis cluster node serves {channel!r}")
            new.setdefault(node.name, (node, []))[1].append(channel)
        # One write per node carries all its (UN)SUBSCRIBE commands: a command's
        # channels must share a slot, so there is one command per channel, and
        # sending them one by one made a ring change take a round trip per shard.
        for name, channels in gone.items():
            self._leaving.update(channels)
            await self._send(self._nodes[name][0], "SUNSUBSCRIBE", channels)
        # Every primary's connection is opened (concurrently) with the first
        # subscription, so a later ring change costs one write per node, not a
        # connect and handshake: a row written right after a ring change must
        # find the new owner subscribed.
        missing = {
            n.name: n
            for n in [*client.get_primaries(), *(node for node, _ in new.values())]
            if n.name not in self._nodes
        }
        if missing:
            tasks = {name: asyncio.ensure_future(self._open_node(n)) for name, n in missing.items()}
            try:
                await asyncio.wait(tasks.values())
            finally:
                # Cancelled meanwhile: stop the opens still under way and wait for
                # them (each closes what it opened), so no open outlives this call
                # holding a connection nobody knows of.
                pending = [t for t in tasks.values() if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
                # Keep every node that opened, even when cancelled meanwhile or
                # when another failed: ``_drop`` closes them; none is left behind.
                failed: BaseException | None = None
                for name, task in tasks.items():
                    if not task.done() or task.cancelled():
                        continue
                    elif task.exception() is not None:
                        failed = failed or task.exception()
                    else:
                        self._nodes[name] = task.result()
            if failed is not None:
                raise failed
        for name, (_node, channels) in new.items():
            self._sent(len(channels))
            await self._send(self._nodes[name][0], "SSUBSCRIBE", channels)
            for channel in channels:
                self._channel_node[channel] = name
        self._channels = wanted
        self._version = version
        if not self._channels:
            self._confirmed.set()
        if self._closed.is_set():
            await self._drop()  # closed while this subscribed: nothing may stay open

    async def _open_node(self, node: Any) -> tuple[Any, Any, asyncio.Task[None]]:
        """A pub/sub connection to ``node`` with its reader task, registered with
        the topology; closed again, never returned, when this task was cancelled
        or the feed or its table closed during the connect."""
        client = node_client(node)
        pubsub = client.pubsub()
        try:
            await pubsub.connect()  # type: ignore[no-untyped-call]
            # redis-py can finish a connect whose task was cancelled (Python
            # 3.11's ``asyncio.wait_for`` returns a result that arrives with the
            # cancel): the caller has stopped waiting, so nobody would close it.
            raise_if_cancelled()
            if self._closed.is_set() or (self._topology is not None and self._topology.closed):
                raise StorageUnavailableError("reminder change feed closed while connecting")
        except BaseException:
            await _close_node(pubsub, client)
            raise
        if self._topology is not None:
            self._topology.open_nodes.add((pubsub, client))
        task = asyncio.get_running_loop().create_task(self._read_node(pubsub))
        return pubsub, client, task

    @staticmethod
    async def _send(pubsub: Any, command: str, channels: list[str]) -> None:
        """``command`` once per channel, all in one write on ``pubsub``'s connection.
        redis-py's bookkeeping of the subscriptions is not used (the reader counts
        the confirmations), so it never replays them on a reconnect: a lost
        connection ends the feed instead."""
        conn = pubsub.connection
        await conn.send_packed_command(conn.pack_commands([(command, c) for c in channels]))

    async def _read_node(self, pubsub: Any) -> None:
        """Read one node's subscription into the queue until it fails or the
        server ends a subscription nobody asked to end (its slot moved)."""
        queue = self._queue
        try:
            while True:
                with translate_errors("reminder change feed"):
                    response = await pubsub.parse_response(block=False, timeout=FEED_POLL_S)
                if response is None:
                    continue
                if isinstance(response, list) and len(response) == 3:
                    kind = response[0]
                    if kind in (b"smessage", "smessage"):
                        if isinstance(response[2], bytes):
                            queue.put_nowait(response[2])
                        continue
                    if not self._subscription_event(kind, response[1]):
                        raise StorageUnavailableError(
                            "reminder change feed: redis ended the subscription of "
                            f"{response[1]!r} (its slot moved)"
                        )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            queue.put_nowait(exc)

    def _subscription_event(self, kind: Any, channel: Any) -> bool:
        """Count a confirmation; ``False`` for an end of subscription we did not ask for."""
        if kind in (b"ssubscribe", "ssubscribe"):
            self._confirm()
        elif kind in (b"sunsubscribe", "sunsubscribe"):
            name = channel.decode() if isinstance(channel, bytes) else str(channel)
            if name not in self._leaving:
                return False
            self._leaving.discard(name)
        return True

    async def _read_single(self, timeout: float) -> bytes | None:
        """One reply of the one-Redis subscription: a change's payload or ``None``."""
        pubsub = self._pubsub
        response = await pubsub.parse_response(block=False, timeout=timeout)
        if response is None:
            return None
        # A change is ["smessage", channel, payload]: taken straight from the
        # reply, skipping redis-py's per-message dict and bookkeeping.
        if isinstance(response, list) and len(response) == 3:
            kind = response[0]
            if kind in (b"smessage", "smessage"):
                data = response[2]
                return data if isinstance(data, bytes) else None
            if not self._subscription_event(kind, response[1]):
                raise StorageUnavailableError("reminder change feed: redis ended a subscription")
        # Subscription confirmations and the like keep redis-py's state right.
        await pubsub.handle_message(response, ignore_subscribe_messages=True)
        return None

    async def _receive(self) -> bytes | None:
        """The next change message's payload, or ``None`` after a timeout or a
        message of another kind. ``StorageUnavailableError`` when Redis was lost
        (the subscription is dropped: changes may have been missed)."""
        if self._early:
            return self._early.pop(0)
        try:
            with translate_errors("reminder change feed"):
                await self._follow_scope()
                if not self._channels:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._scope_changed.wait(), FEED_POLL_S)
                    return None
                if not self._cluster:
                    return await self._read_single(FEED_POLL_S)
                try:
                    item = await asyncio.wait_for(self._queue.get(), FEED_POLL_S)
                except TimeoutError:
                    return None
                if isinstance(item, BaseException):
                    raise item
                return item
        except StorageError as exc:
            if self._closed.is_set():
                return None
            _log.warning("reminder change feed lost redis error=%s", exc)
            if self._topology is not None:
                self._topology.stale = True
            await self._drop()
            if isinstance(exc, StorageUnavailableError):
                raise
            raise StorageUnavailableError(f"reminder change feed lost redis: {exc}") from exc

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        nodes, self._nodes = self._nodes, {}
        self._channels = set()
        self._channel_node = {}
        self._leaving = set()
        self._version = -1
        self._unconfirmed = 0
        self._confirmed.clear()
        self._queue = asyncio.Queue()
        if pubsub is not None:
            with contextlib.suppress(StorageError), translate_errors("reminder feed close"):
                await pubsub.aclose()
        if nodes:
            # Shielded: a drop cancelled halfway (the reader's task stopped) still
            # closes every node's connection.
            await asyncio.shield(_close_nodes(list(nodes.values()), self._topology))

    async def aclose(self) -> None:
        """End the subscription. A reader blocked in another task stops within
        about half a second; otherwise the connection is released at once."""
        self._closed.set()
        self._scope_changed.set()
        self._scope.remove_listener(self._on_scope_change)
        self._registry.discard(self)
        following, self._following = self._following, None
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        # On a cluster the reader waits on the queue, not on a socket, so the node
        # connections close here even while it reads (their pools are the feed's
        # own: no other close would reach them).
        if not self._busy or self._cluster:
            await self._drop()


async def _close_nodes(
    nodes: list[tuple[Any, Any, asyncio.Task[None]]], topology: ClusterTopology | None
) -> None:
    for pubsub, client, task in nodes:
        task.cancel()
        if topology is not None:
            topology.open_nodes.discard((pubsub, client))
    for pubsub, client, task in nodes:
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await _close_node(pubsub, client)


async def _close_node(pubsub: Any, client: Any) -> None:
    """Close one node's pub/sub and its client (the pool the connection is from),
    the client also when a cancellation surfaces after the first close."""
    try:
        with contextlib.suppress(StorageError), translate_errors("reminder feed close"):
            await pubsub.aclose()
    finally:
        with contextlib.suppress(StorageError), translate_errors("reminder feed close"):
            await client.aclose()
