"""A cancellation a client library swallowed still stops the task (``orleanspy._tasks``)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis import exceptions as rexc

from orleanspy._redis import translate_errors
from orleanspy.errors import StorageUnavailableError


async def _cancelled_then(body) -> asyncio.Task[None]:
    async def victim() -> None:
        # What a client library may do with a cancelled call: end it quietly.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        body()

    task = asyncio.create_task(victim())
    await asyncio.sleep(0)
    task.cancel()
    return task


def _ok() -> None:
    with translate_errors("a call that returned normally"):
        pass


def _failed() -> None:
    with translate_errors("a call that ended in a connection error"):
        raise rexc.ConnectionError("connection closed by the cancellation")


@pytest.mark.parametrize("body", [_ok, _failed])
async def test_redis_boundary_re_raises_a_swallowed_cancellation(body) -> None:
    task = await _cancelled_then(body)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_cancellation_errors_translate_as_usual() -> None:
    with pytest.raises(StorageUnavailableError, match="connection"):
        _failed()
    _ok()
