"""Shared Redis plumbing for the Redis backends: clients from URLs, error translation.

Each backend module imports ``redis`` itself only through this module, so a
connection failure always surfaces as ``StorageUnavailableError`` and a script
or protocol failure as ``StorageError``.

URLs (``connect``):

- ``redis://host:port/db``, ``rediss://...`` (TLS): one Redis, or a Redis
  Cluster when the node named answers ``cluster_enabled:1`` (learnt on the
  first connect: ``resolve``);
- ``redis+cluster://host:port[,host:port...]``, ``rediss+cluster://...``: a
  Redis Cluster, any of the nodes named being a starting point;
- ``redis+sentinel://host:port[,host:port...]/master-name[/db]``,
  ``rediss+sentinel://...``: the primary that the sentinels name, followed
  across a failover (credentials in the URL are the primary's);
- ``unix:///path/redis.sock``: one Redis.

A resolved client is a ``redis.asyncio.Redis`` or a ``redis.asyncio.RedisCluster``
(``is_cluster``). Every provider keeps its scripts and multi-key commands
inside one hash slot (hash tags), so a cluster needs only the fan-out and
grouping helpers here (``node_groups``, ``run_script_calls``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from orleanspy._redis_sentinel import sentinel_client
from orleanspy._retry import Backoff, seconds_left
from orleanspy._tasks import raise_if_cancelled
from orleanspy.errors import ConfigurationError, StorageError, StorageUnavailableError

if TYPE_CHECKING:
    from orleanspy.options import RedisOptions

__all__ = [
    "REDIS_URL_SCHEMES",
    "Client",
    "LazyRedis",
    "NoScriptError",
    "Redis",
    "RedisOptions",
    "call_script",
    "connect",
    "current_slot_map",
    "is_cluster",
    "key_prefix",
    "node_client",
    "node_groups",
    "redacted",
    "refresh_slot_map",
    "reply_error",
    "resolve",
    "retry_failover",
    "run_script_calls",
    "translate_errors",
    "wait_reachable",
]

log = logging.getLogger(__name__)

#: A resolved client: one Redis (also behind Sentinel) or a Redis Cluster.
Client: TypeAlias = aioredis.Redis | aioredis.RedisCluster
# A script's reply in a pipeline run with raise_on_error=False when Redis lost the script.
NoScriptError = rexc.NoScriptError

#: Every scheme ``connect`` takes.
REDIS_URL_SCHEMES = (
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "unix://",
)

# Connections per cluster node. redis-py's cluster pool fails a command beyond
# it (it does not wait), so keep it above any provider's own concurrency bound.
_CLUSTER_CONNECTIONS = 256


_NEEDS_POOL = frozenset({"pipeline", "pubsub", "transaction", "monitor", "lock", "client"})


class LazyRedis:
    """The client of a ``redis://`` or ``rediss://`` URL before its first connect,
    which learns whether the node named is part of a Redis Cluster (``INFO
    cluster``) and becomes a ``Redis`` or a ``RedisCluster``. Until ``resolve``
    succeeds it has no commands; afterwards attribute access goes to the
    resolved client."""

    def __init__(self, url: str, max_connections: int) -> None:
        self.url = url
        self._max_connections = max_connections
        self._target: Client | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def resolved(self) -> Client | None:
        return self._target

    async def resolve(self) -> Client:
        """The client, connecting once to tell a cluster from one Redis."""
        if self._target is not None:
            return self._target
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._target is None:
                plain = _single(self.url, self._max_connections)
                try:
                    with translate_errors("redis connect"):
                        info = await plain.info("cluster")
                except BaseException:
                    await plain.aclose()
                    raise
                if str(info.get("cluster_enabled", 0)) == "1":
                    await plain.aclose()
                    parts = urlsplit(self.url)
                    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
                    cluster = _cluster(self.url, [(host, port)])
                    try:
                        with translate_errors("redis cluster connect"):
                            await cluster.initialize()
                    except BaseException:
                        await cluster.aclose()
                        raise
                    self._target = cluster
                    log.info("redis url names a cluster node url=%s", redacted(self.url))
                else:
                    self._target = plain
        return self._target

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Resolve (connecting once), then run the command on the resolved client."""
        target = await self.resolve()
        return await target.execute_command(*args, **options)

    def __getattr__(self, name: str) -> Any:
        target = self.__dict__.get("_target")
        if target is not None:
            return getattr(target, name)
        # Before the first connect, a command method (they all end in
        # ``execute_command``, which resolves) works; anything needing a
        # connection pool (pipelines, pub/sub) needs ``resolve`` first.
        attr = getattr(aioredis.Redis, name, None)
        if callable(attr) and name not in _NEEDS_POOL and not name.startswith("_"):
            return attr.__get__(self)
        raise RuntimeError(f"redis client of {redacted(self.url)} used before resolve()")

    async def aclose(self) -> None:
        if self._target is not None:
            await self._target.aclose()


#: What a provider accepts as a client: resolved, or one ``connect`` made.
Redis: TypeAlias = aioredis.Redis | aioredis.RedisCluster | LazyRedis


async def resolve(client: Redis) -> Client:
    """``client`` itself, or the client a ``LazyRedis`` resolves to (connecting)."""
    if isinstance(client, LazyRedis):
        return await client.resolve()
    return client


def is_cluster(client: Redis) -> bool:
    """Whether ``client`` (resolved) talks to a Redis Cluster."""
    if isinstance(client, LazyRedis):
        return isinstance(client.resolved, aioredis.RedisCluster)
    return isinstance(client, aioredis.RedisCluster)


def _common() -> dict[str, Any]:
    return {
        "socket_connect_timeout": 5,
        "socket_timeout": 10,
        "health_check_interval": 30,
    }


def _single(url: str, max_connections: int) -> aioredis.Redis:
    # A blocking pool makes callers beyond ``max_connections`` wait for a free
    # connection instead of failing with a connection error that would read as
    # "Redis is down".
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=10,
        # Only connection errors: Retry's default would also resend on timeouts.
        retry=Retry(NoBackoff(), 1, supported_errors=(rexc.ConnectionError,)),
        **_common(),
    )
    return aioredis.Redis.from_pool(pool)  # the client owns (and closes) the pool


def _cluster(url: str, nodes: Sequence[tuple[str, int]]) -> aioredis.RedisCluster:
    """A cluster client; ``url`` (plain ``redis``/``rediss`` scheme) gives
    credentials, TLS and options, ``nodes`` the starting points."""
    parts = urlsplit(url)
    if parts.path not in ("", "/", "/0"):
        raise ConfigurationError(
            f"a Redis Cluster has only database 0; {redacted(url)} names {parts.path!r}"
        )
    host, port = nodes[0]
    plain = urlunsplit((parts.scheme, _netloc(parts, host, port), "", parts.query, ""))
    return _ClusterRedis.from_url(
        plain,
        startup_nodes=[ClusterNode(h, p) for h, p in nodes],
        max_connections=_CLUSTER_CONNECTIONS,
        # Failover and resharding are retried by the callers' backoff; a few
        # quick redirection retries here cover a slot that just moved.
        retry=Retry(NoBackoff(), 3),
        **_common(),
    )


class _ClusterRedis(aioredis.RedisCluster):
    """A cluster client whose close closes every node connection.

    redis-py 8.1's ``RedisCluster.aclose`` does nothing while the client waits
    to re-read its slot map: a connection error or timeout that outlived its
    retries (a node killed) leaves every other node's connections open, to be
    reported unclosed by the garbage collector later (8.2 closes them). Here
    every known node is disconnected after redis-py's own close, whatever the
    version did; disconnecting a node twice is harmless, and connections
    reconnect lazily, so redis-py's own ``aclose`` calls, made to force a re-read
    of the slot map, lose nothing."""

    async def aclose(self) -> None:
        await super().aclose()
        manager = self.nodes_manager
        nodes = {id(n): n for n in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
        await asyncio.gather(*(n.disconnect() for n in nodes.values()), return_exceptions=True)


# -- the slot map --------------------------------------------------------------------
#
# What the project asks of redis-py's cluster client, all through its public
# surface (``RedisCluster.initialize``, ``nodes_manager.initialize``,
# ``get_node_from_key``, ``nodes_cache``, ``startup_nodes``) so that it holds on
# every version the dependency range allows; tests/test_redis_py_surface.py
# fails when one of them changes.

_refreshes: weakref.WeakKeyDictionary[aioredis.RedisCluster, asyncio.Future[None]] = (
    weakref.WeakKeyDictionary()
)


async def current_slot_map(client: aioredis.RedisCluster) -> None:
    """Let ``client`` read its slot map if it has none yet or redis-py asked for a
    re-read (a cheap no-op otherwise); the current map keeps serving while a
    re-read redis-py defers (8.2 runs them at most once a second) is pending."""
    await client.initialize()


async def refresh_slot_map(client: aioredis.RedisCluster) -> None:
    """Re-read ``client``'s slot map now, from the cluster.

    For the replies that say the map is stale where redis-py does not notice:
    a script routed by a key whose slot did not move, answering "non local key"
    for a key it builds itself; an ASK or TRYAGAIN under ``WAIT``. redis-py 8.2
    defers a re-read asked for by its own error paths to once a second, which
    left such a call failing for that long; this one is not deferred. Callers
    that find the map stale at once share one re-read."""
    running = _refreshes.get(client)
    if running is None or running.done():
        running = asyncio.ensure_future(client.nodes_manager.initialize())
        _refreshes[client] = running
    await asyncio.shield(running)


def _netloc(parts: Any, host: str, port: int) -> str:
    auth = ""
    if parts.username or parts.password:
        auth = (
            f"{parts.username or ''}:{parts.password or ''}@"
            if parts.password
            else (f"{parts.username}@")
        )
    return f"{auth}{host}:{port}"


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    hosts = netloc.rpartition("@")[2]
    out: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, str(default_port)
        if not host or not port.isdigit():
            raise ConfigurationError(f"bad host:port {item!r} in a Redis URL")
        out.append((host.strip("[]"), int(port)))
    return out


def _sentinel(url: str, scheme: str, max_connections: int) -> aioredis.Redis:
    parts = urlsplit(url)
    sentinels = _hosts(parts.netloc, 26379)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ConfigurationError(
            f"{redacted(url)}: a Sentinel URL names the master: "
            "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER-NAME[/DB]"
        )
    name = path[0]
    db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
    kwargs: dict[str, Any] = {
        **_common(),
        "db": db,
        "username": parts.username,
        "password": parts.password,
        "max_connections": max_connections,
        "retry": Retry(NoBackoff(), 1, supported_errors=(rexc.ConnectionError,)),
    }
    if scheme.startswith("rediss"):
        kwargs["ssl"] = True
    return sentinel_client(sentinels, name, kwargs)


def connect(url: str, *, max_connections: int = 64) -> Redis:
    """A client for ``url`` (see the module doc for the schemes; credentials in
    the URL are honoured). Responses are bytes; callers decode. A plain
    ``redis://`` URL gives a ``LazyRedis``: pass it through ``resolve`` (the
    providers' ``start`` and ``wait_reachable`` do) before use.

    Timeouts: 10 s per reply and 5 s per connect unless the URL says otherwise
    (``?socket_timeout=1&socket_connect_timeout=1``; URL options win). A command
    that meets a dropped or stale connection (``Connection closed by server``
    after a Redis restart) is sent again at once on a fresh connection, before
    any caller's backoff starts; a timeout is not retried here, because its
    outcome is unknown.
    """
    scheme, sep, _ = url.partition("://")
    if not sep or f"{scheme}://" not in REDIS_URL_SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r}: use one of {', '.join(REDIS_URL_SCHEMES)}"
        )
    if scheme.endswith("+cluster"):
        base = scheme.partition("+")[0]
        parts = urlsplit(url)
        nodes = _hosts(parts.netloc, 6379)
        first = urlunsplit((base, _netloc(parts, *nodes[0]), parts.path, parts.query, ""))
        return _cluster(first, nodes)
    if scheme.endswith("+sentinel"):
        return _sentinel(url, scheme, max_connections)
    if scheme == "unix":
        return _single(url, max_connections)
    return LazyRedis(url, max_connections)


def key_prefix(service_id: str) -> str:
    """``orleanspy:{service_id}:`` — the prefix of every key of one service."""
    return f"orleanspy:{service_id}:"


# Replies that mean "the cluster is moving or a node is gone", not a bad request.
_UNAVAILABLE_REPLIES = (
    "non local key",  # a script's key moved to another node meanwhile
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MASTERDOWN",
    "LOADING",
    "READONLY",
    "NOREPLICAS",
    "WAIT cannot be used with replica",  # a WAIT sent to a node that was just demoted
)

# redis-py's errors that mean the same (MOVED/ASK that outlived its retries, a
# slot with no node, a cluster it cannot reach, a replica that was a master).
_UNAVAILABLE_TYPES: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    OSError,
    rexc.ClusterError,
    rexc.AskError,
    rexc.TryAgainError,
    rexc.ReadOnlyError,
    rexc.SlotNotCoveredError,
)


def _from_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the redis package (its last frame)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and f"{os.sep}redis{os.sep}" in last.tb_frame.f_code.co_filename


def _through_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` came up through the redis package (any frame of it): a
    write to a closed transport is refused by the event loop's stream, below
    redis-py's frames."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_REDIS_PY):
            return True
        tb = tb.tb_next
    return False


# Where redis-py's modules live (its package directory, with a trailing separator).
_REDIS_PY = os.path.dirname(os.path.dirname(os.path.abspath(aioredis.__file__))) + os.sep


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise redis errors as the project's storage errors, naming ``what``; and
    re-raise a cancellation redis-py swallowed (see ``orleanspy._tasks``).

    ``StorageUnavailableError`` (retried by callers) for: a connection that
    failed or timed out, a cluster redirection (MOVED/ASK/TRYAGAIN) that
    outlived the client's retries, a cluster that is down or reconfiguring
    (``CLUSTERDOWN``, a slot without a node, a script key that moved away), a
    primary that became a replica (``READONLY``), and the ``AttributeError``
    (a read) and ``RuntimeError`` (a write to a closed transport) redis-py 8.1
    raises from inside while a failover tears its connection down.
    ``StorageError`` for every other Redis error.
    """
    try:
        yield
    except _UNAVAILABLE_TYPES as exc:
        raise_if_cancelled()  # the failure may be how the client ended a cancelled call
        raise StorageUnavailableError(f"redis unavailable during {what}: {exc}") from exc
    except rexc.RedisClusterException as exc:
        raise_if_cancelled()
        if isinstance(exc, rexc.CrossSlotTransactionError):
            raise StorageError(f"redis error during {what}: {exc}") from exc
        raise StorageUnavailableError(f"redis cluster unavailable during {what}: {exc}") from exc
    except rexc.RedisError as exc:
        raise_if_cancelled()
        if any(mark in str(exc) for mark in _UNAVAILABLE_REPLIES):
            raise StorageUnavailableError(f"redis unavailable during {what}: {exc}") from exc
        raise StorageError(f"redis error during {what}: {exc}") from exc
    except AttributeError as exc:
        raise_if_cancelled()
        if _from_redis_py(exc):
            raise StorageUnavailableError(
                f"redis connection torn down during {what}: {exc!r}"
            ) from exc
        raise
    except RuntimeError as exc:
        raise_if_cancelled()
        # redis-py 8.1 writes a command to a connection whose transport a
        # failover closed meanwhile; the event loop refuses ("... the handler
        # is closed"). The command did not go out.
        if _through_redis_py(exc) and "closed" in str(exc):
            raise StorageUnavailableError(
                f"redis connection closed during {what}: {exc!r}"
            ) from exc
        raise
    raise_if_cancelled()


# -- failover: the one retry loop of the call path ------------------------------------

T = TypeVar("T")

#: Backoff between attempts while a primary fails over: the first retry soon
#: (a slot that just moved, a dropped connection), then every half second at
#: most, so a promotion is noticed within that of its happening.
_FAILOVER_FIRST = timedelta(milliseconds=25)
_FAILOVER_MAX = timedelta(milliseconds=500)


async def retry_failover(client: Client, what: str, op: Callable[[int], Awaitable[T]]) -> T:
    """``await op(attempt)``, its Redis errors translated (``translate_errors``,
    naming ``what``), run again while it fails with ``StorageUnavailableError``
    and the call this task works for has time left (``_retry.seconds_left``:
    the grain call's deadline). Then the last ``StorageUnavailableError`` is
    raised, saying how long it tried. Outside a grain call nothing is retried
    here (``_retry.DEFAULT_WINDOW``): the caller's own backoff applies.

    What is retried is what a failover or a reshard looks like to a client: a
    connection refused, lost or timed out; MOVED or ASK past redis-py's own
    redirections; ``CLUSTERDOWN``, ``TRYAGAIN``, a slot without a node;
    ``READONLY`` (a primary that became a replica), ``MASTERDOWN``, ``LOADING``;
    ``WAIT`` answered by too few replicas. Before each retry a cluster client
    re-reads its slot map (``refresh_slot_map``: the promoted replica serves
    the dead primary's slots from then on) and the task backs off (25 ms
    doubling to 0.5 s, jittered). A Sentinel client asks the sentinels for the
    primary on its next connection by itself. ``StorageError`` (a script error,
    a malformed record) and cancellation are never retried.

    ``attempt`` counts from 0. An attempt may have run on the server although
    its reply was lost (the connection dropped after the command went out), so
    ``op`` must be safe to run again: a read, or a write that recognises its own
    earlier attempt (the directory's first-writer-wins script returns the
    stored entry, which is then this very address; a grain-state write finds
    its own new etag stored). ``attempt > 0`` tells a write that it may be a
    retry (a stream publish looks for its own entry first).
    """
    attempt = 0
    backoff: Backoff | None = None
    began = time.monotonic()
    while True:
        try:
            with translate_errors(what):
                result = await op(attempt)
        except StorageUnavailableError as exc:
            left = seconds_left()
            if left <= 0:
                if attempt == 0:
                    raise
                raise StorageUnavailableError(
                    f"{exc} (tried {attempt + 1} times over {time.monotonic() - began:.1f} s, "
                    "until the call's deadline)"
                ) from exc
            if backoff is None:
                backoff = Backoff(_FAILOVER_FIRST, _FAILOVER_MAX)
            delay = min(backoff.next(), left)
            log.debug("redis retry what=%s attempt=%d in=%.3fs error=%s", what, attempt, delay, exc)
            await _refresh_quietly(client)
            await asyncio.sleep(delay)
            attempt += 1
            continue
        if attempt:
            log.debug(
                "redis retry succeeded what=%s attempts=%d after=%.2fs",
                what,
                attempt + 1,
                time.monotonic() - began,
            )
        return result


async def _refresh_quietly(client: Client) -> None:
    """Re-read a cluster client's slot map; a failure (the cluster is still
    electing) is left to the next attempt."""
    if not isinstance(client, aioredis.RedisCluster):
        return
    try:
        with translate_errors("redis cluster slot map"):
            await refresh_slot_map(client)
    except StorageError as exc:
        log.debug("redis cluster slot map not re-read error=%s", exc)


def reply_error(exc: Exception, what: str) -> Exception:
    """The error ``translate_errors`` raises for ``exc``, one command's failure
    returned among a pipeline's replies (``raise_on_error=False``):
    ``StorageUnavailableError`` for a lost connection or a cluster that is
    moving slots, ``StorageError`` for another Redis error; an exception that
    is not Redis's comes back as it is."""
    try:
        with translate_errors(what):
            raise exc
    except Exception as translated:
        return translated
    return exc  # not reached: translate_errors re-raises what it is given


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


async def wait_reachable(client: Redis, url: str, timeout: float, setting: str) -> None:
    """Return once ``client`` answers PING (resolving a ``LazyRedis`` first);
    retry with backoff (0.1 s doubling to 2 s), logging each failed attempt, for
    ``timeout`` seconds. Then raise ``StorageUnavailableError`` naming the URL,
    the wait and ``setting`` (the option that sets the wait)."""
    deadline = time.monotonic() + timeout
    delay, attempt = 0.1, 0
    while True:
        attempt += 1
        try:
            with translate_errors("redis ping"):
                resolved = await resolve(client)
                await resolved.ping()
        except StorageUnavailableError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageUnavailableError(
                    f"could not reach Redis at {redacted(url)} within {timeout:g} s "
                    f"({attempt} attempts; last error: {exc}). Start Redis or fix the URL; "
                    f"{setting} sets how long to wait."
                ) from exc
            log.warning(
                "redis not reachable yet url=%s attempt=%d retry_in=%.1fs error=%s",
                redacted(url),
                attempt,
                min(delay, left),
                exc,
            )
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
            continue
        if attempt > 1:
            log.info("redis reachable url=%s attempts=%d", redacted(url), attempt)
        return


# -- clusters: grouping by node, scripts in pipelines, WAIT --------------------------


async def node_groups(client: Client, keys: Sequence[str]) -> list[list[int]]:
    """Indexes of ``keys`` grouped by the node that serves each key's slot, in
    order of first appearance (one group on a single Redis)."""
    if not isinstance(client, aioredis.RedisCluster):
        return [list(range(len(keys)))]
    await current_slot_map(client)
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        node = client.get_node_from_key(key)
        if node is None:
            raise StorageUnavailableError(f"no redis cluster node serves key {key!r}")
        groups.setdefault(node.name, []).append(i)
    return list(groups.values())


def node_client(node: ClusterNode) -> aioredis.Redis:
    """A plain client of one cluster node, with a small pool of its own (for a
    pub/sub connection to that node: sharded subscriptions live per node)."""
    pool = aioredis.ConnectionPool(
        connection_class=node.connection_class, max_connections=2, **node.connection_kwargs
    )
    return aioredis.Redis.from_pool(pool)


# One script call: its keys (the first routes it on a cluster) and its arguments.
ScriptCall: TypeAlias = tuple[Sequence[Any], Sequence[Any]]


async def run_script_calls(
    client: Client,
    script: str,
    sha: str,
    calls: Sequence[ScriptCall],
    *,
    wait: RedisOptions | None = None,
    raise_on_error: bool = True,
) -> list[Any]:
    """The replies of ``calls`` of one script, in one pipelined round trip (per
    node, concurrently, on a cluster). Raise the first failed call's error
    (callers translate it), or with ``raise_on_error=False`` return it in the
    call's place.

    On one Redis the script is loaded first on the pipeline's connection, so
    NOSCRIPT cannot happen. On a cluster each call is an ``EVALSHA`` routed by
    its first key; a call answered NOSCRIPT (a promoted replica has no scripts:
    they are not replicated) did not run, so only those calls are sent again
    once the script is loaded on every primary; calls that did run are not.
    Likewise a call refused because the client's slot map is stale (MOVED past
    redis-py's retries, CLUSTERDOWN, "non local key") is sent again, at most
    twice, once the map is re-read (``refresh_slot_map``).

    With ``wait.wait_replicas`` each node's commands end with ``WAIT`` on the
    same connection; fewer replicas than asked raises ``StorageUnavailableError``
    (the writes may have happened on the primary).
    """
    if not calls:
        return []
    replicas = wait.wait_replicas if wait is not None else 0
    if not isinstance(client, aioredis.RedisCluster):
        pipe = client.pipeline(transaction=False)
        pipe.script_load(script)
        for keys, args in calls:
            pipe.evalsha(sha, len(keys), *keys, *args)
        if replicas:
            assert wait is not None
            pipe.execute_command("WAIT", replicas, wait.wait_ms)
        replies = (await pipe.execute(raise_on_error=raise_on_error))[1:]
        if replicas:
            _check_wait(replies.pop(), replicas)
        return replies
    results: list[Any] = [None] * len(calls)
    waited: dict[str, Any] = {}  # per node, the WAIT reply of the last attempt there
    todo = list(range(len(calls)))
    for attempt in range(3):
        cpipe = client.pipeline(transaction=False)
        for i in todo:
            keys, args = calls[i]
            cpipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        nodes: list[str] = []
        if replicas:
            assert wait is not None
            await current_slot_map(client)
            seen: dict[str, Any] = {}
            for i in todo:
                node = client.get_node_from_key(calls[i][0][0])
                if node is not None:
                    seen.setdefault(node.name, node)
            for name, node in seen.items():
                cpipe.execute_command("WAIT", replicas, wait.wait_ms, target_nodes=node)
                nodes.append(name)
        # With WAIT, a call must not be redirected: redis-py would resend it on
        # another connection, which the WAIT does not cover.
        replies = await cpipe.execute(raise_on_error=False, allow_redirections=not replicas)
        if any(_slot_map_stale(r) for r in replies):
            # A script that builds keys of other shards (batches per node) is
            # routed by its one declared key, whose slot may not have moved: no
            # MOVED then, so redis-py keeps its old map and every retry would
            # meet the same "non local key". Re-read the map now.
            await refresh_slot_map(client)
        if replicas and any(isinstance(r, (rexc.AskError, rexc.TryAgainError)) for r in replies):
            await refresh_slot_map(client)  # learn where the slots went
            raise StorageUnavailableError("redis cluster slots moved during a write with WAIT")
        again: list[int] = []
        for i, reply in zip(todo, replies, strict=False):
            # A call answered NOSCRIPT or refused for a stale map did not run:
            # sending it again cannot apply it twice.
            if (isinstance(reply, NoScriptError) and attempt == 0) or (
                _slot_map_stale(reply) and not replicas
            ):
                again.append(i)
            results[i] = reply
        waited.update(zip(nodes, replies[len(todo) :], strict=True))
        if not again or attempt == 2:
            break
        if any(isinstance(results[i], NoScriptError) for i in again):
            await client.script_load(script)  # every primary
        todo = again
    for reply in waited.values():
        _check_wait(reply, replicas)
    if raise_on_error:
        for reply in results:
            if isinstance(reply, Exception):
                raise reply
    return results


def _slot_map_stale(reply: Any) -> bool:
    """Whether a pipeline reply says the client's slot map is out of date."""
    if isinstance(reply, (rexc.MovedError, rexc.ClusterDownError, rexc.SlotNotCoveredError)):
        return True
    return isinstance(reply, rexc.ResponseError) and "non local key" in str(reply)


def _check_wait(reply: Any, replicas: int) -> None:
    if isinstance(reply, Exception):
        raise reply
    if int(reply) < replicas:
        raise StorageUnavailableError(
            f"write not replicated in time: {int(reply)} of {replicas} replicas acknowledged "
            "(RedisOptions.wait_replicas / wait_timeout)"
        )


async def call_script(
    client: Client,
    script: Any,
    keys: Sequence[Any],
    args: Sequence[Any],
    wait: RedisOptions | None = None,
) -> Any:
    """One call of a registered script (``client.register_script``): loaded again
    on NOSCRIPT by redis-py (the call did not run then, so that is safe on any
    node); with ``wait.wait_replicas`` the call and ``WAIT`` share a connection
    (``run_script_calls``)."""
    if wait is None or not wait.wait_replicas:
        return await script(keys=keys, args=args)
    (reply,) = await run_script_calls(client, script.script, script.sha, [(keys, args)], wait=wait)
    return reply
