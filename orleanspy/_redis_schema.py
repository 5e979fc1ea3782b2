"""Schema versions of the Redis providers: one hash per Redis database.

``orleanspy:schema`` maps a component (``reminders``, ``membership``, ...) to
``"<version>|<release>"``: the version it was last migrated to and the release
that did it (``orleanspy.schema``). A component's steps are coroutines; the
first of every component records the layout of 0.1.x, which wrote no version,
and changes nothing. Steps run under the lock key ``orleanspy:schema:lock`` (a
token set with NX and an expiry, removed only by its holder), so two silos
starting at once apply each step once; a step is recorded as soon as it ends,
so a migration cut short resumes where it stopped.

Both keys stand alone (no hash tag, no multi-key script), so this works the
same on one Redis, behind Sentinel and on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

from orleanspy._redis import Client, translate_errors
from orleanspy.errors import StorageUnavailableError
from orleanspy.schema import MigrationReport, too_new
from orleanspy.versions import __version__

__all__ = ["SCHEMA_KEY", "RedisStep", "adopt", "introduce", "migrate", "read_versions"]

SCHEMA_KEY: Final = "orleanspy:schema"
_LOCK_KEY: Final = "orleanspy:schema:lock"
_LOCK_MS: Final = 60_000
_LOCK_WAIT_S: Final = 90.0

#: One step: what it does (for the report), and the coroutine that does it.
RedisStep: TypeAlias = tuple[str, Callable[[Client], Awaitable[None]]]

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def _nothing(_client: Client) -> None:
    """A step that changes no data (it only records a version)."""


def adopt() -> RedisStep:
    """Step 1 of every Redis component: the layout 0.1.x wrote, recorded."""
    return ("the layout of 0.1.x, recorded (no data changes)", _nothing)


def introduce(summary: str) -> RedisStep:
    """Step 1 of a component a release introduces: its keys are written as the
    release uses them, so the step only records the version (``summary`` says
    what the component holds)."""
    return (summary, _nothing)


def _parse(raw: Any) -> tuple[int, str | None]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    number, _, release = text.partition("|")
    return (int(number) if number.isdigit() else 0), (release or None)


async def read_versions(client: Client) -> dict[str, tuple[int, str | None]]:
    """Every component's recorded ``(version, release)`` in this database."""
    with translate_errors("schema read"):
        raw = await client.hgetall(SCHEMA_KEY)
    return {(k.decode() if isinstance(k, bytes) else str(k)): _parse(v) for k, v in raw.items()}


async def _stored(client: Client, component: str) -> tuple[int, str | None]:
    with translate_errors(f"{component} schema read"):
        raw = await client.hget(SCHEMA_KEY, component)
    return (0, None) if raw is None else _parse(raw)


async def migrate(client: Client, component: str, steps: Sequence[RedisStep]) -> MigrationReport:
    """Bring ``component`` to version ``len(steps)``; ``SchemaTooNewError`` if the
    store is newer than the steps this release knows. The common case (already
    current) is one ``HGET``."""
    current, release = await _stored(client, component)
    if current > len(steps):
        raise too_new("redis", component, current, release, len(steps))
    report = MigrationReport("redis", component, current, len(steps), release)
    if current == len(steps):
        return report
    token = secrets.token_hex(8)
    await _lock(client, token, component)
    try:
        current, release = await _stored(client, component)  # another silo may have done it
        report.before, report.release_before = current, release
        if current > len(steps):
            raise too_new("redis", component, current, release, len(steps))
        for number, (summary, step) in enumerate(steps[current:], start=current + 1):
            await step(client)
            with translate_errors(f"{component} schema record"):
                await client.hset(SCHEMA_KEY, component, f"{number}|{__version__}")
            report.applied.append(f"{number}: {summary}")
    finally:
        with translate_errors("schema unlock"):
            await client.eval(_UNLOCK, 1, _LOCK_KEY, token)
    return report


async def _lock(client: Client, token: str, component: str) -> None:
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        with translate_errors(f"{component} schema lock"):
            if await client.set(_LOCK_KEY, token, nx=True, px=_LOCK_MS):
                return
        if time.monotonic() > deadline:
            raise StorageUnavailableError(
                f"the redis schema lock ({_LOCK_KEY}) stayed held for {_LOCK_WAIT_S:g} s while "
                f"migrating {component}: another migration is running or died holding it "
                f"(it expires {_LOCK_MS // 1000} s after it was taken)"
            )
        await asyncio.sleep(0.05)
