"""Shared Redis plumbing for the Redis backends: clients from URLs, error translation.

Each backend module imports ``redis`` itself only through this module, so a
connection failure always surfaces as ``StorageUnavailableError`` and a script
or protocol failure as ``StorageError``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from orleanspy._tasks import raise_if_cancelled
from orleanspy.errors import StorageError, StorageUnavailableError

__all__ = [
    "NoScriptError",
    "Redis",
    "connect",
    "key_prefix",
    "redacted",
    "translate_errors",
    "wait_reachable",
]

log = logging.getLogger(__name__)

Redis = aioredis.Redis
# A script's reply in a pipeline run with raise_on_error=False when Redis lost the script.
NoScriptError = rexc.NoScriptError


def connect(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``; credentials
    in the URL are honoured). Responses are bytes; callers decode.

    Timeouts: 10 s per reply and 5 s per connect unless the URL says otherwise
    (``?socket_timeout=1&socket_connect_timeout=1``; URL options win). A command
    that meets a dropped or stale connection (``Connection closed by server``
    after a Redis restart) is sent again at once on a fresh connection, before
    any caller's backoff starts; a timeout is not retried here, because its
    outcome is unknown.
    """
    # A blocking pool makes callers beyond ``max_connections`` wait for a free
    # connection instead of failing with a connection error that would read as
    # "Redis is down".
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=10,
        socket_connect_timeout=5,
        socket_timeout=10,
        health_check_interval=30,
        # Only connection errors: Retry's default would also resend on timeouts.
        retry=Retry(NoBackoff(), 1, supported_errors=(rexc.ConnectionError,)),
    )
    return aioredis.Redis.from_pool(pool)  # the client owns (and closes) the pool


def key_prefix(service_id: str) -> str:
    """``orleanspy:{service_id}:`` — the prefix of every key of one service."""
    return f"orleanspy:{service_id}:"


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise redis errors as the project's storage errors, naming ``what``; and
    re-raise a cancellation redis-py swallowed (see ``orleanspy._tasks``)."""
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
        raise_if_cancelled()  # the failure may be how the client ended a cancelled call
        raise StorageUnavailableError(f"redis unavailable during {what}: {exc}") from exc
    except rexc.RedisError as exc:
        raise_if_cancelled()
        raise StorageError(f"redis error during {what}: {exc}") from exc
    raise_if_cancelled()


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


async def wait_reachable(client: aioredis.Redis, url: str, timeout: float, setting: str) -> None:
    """Return once ``client`` answers PING; retry with backoff (0.1 s doubling to
    2 s), logging each failed attempt, for ``timeout`` seconds. Then raise
    ``StorageUnavailableError`` naming the URL, the wait and ``setting`` (the
    option that sets the wait)."""
    deadline = time.monotonic() + timeout
    delay, attempt = 0.1, 0
    while True:
        attempt += 1
        try:
            await client.ping()
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise_if_cancelled()
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
