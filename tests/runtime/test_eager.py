"""start_eagerly: the first step runs in the call; a suspended turn goes on as a task."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from orleanspy.runtime.eager import start_eagerly

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="outside")


async def test_a_coroutine_that_does_not_suspend_finishes_inside_the_call() -> None:
    seen: list[str] = []

    async def turn() -> None:
        where.set("inside")
        seen.append(where.get())

    assert start_eagerly(turn()) is None
    assert seen == ["inside"]
    assert where.get() == "outside"  # the turn ran in a copy of the context


async def test_a_suspended_coroutine_goes_on_as_a_task_in_the_same_context() -> None:
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen: list[object] = []

    async def turn() -> None:
        where.set("inside")
        seen.append(await gate)
        await asyncio.sleep(0)  # a bare yield is relayed too
        seen.append(where.get())

    task = start_eagerly(turn())
    assert task is not None and not task.done()
    gate.set_result(7)
    await task
    assert seen == [7, "inside"]
    assert where.get() == "outside"


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    cleaned: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def turn() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            cleaned.append("cancelled at its await")
            raise

    task = start_eagerly(turn())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cancelled at its await"]
    assert task.cancelled()


async def test_errors_surface_where_a_task_would_put_them() -> None:
    async def fails_at_once() -> None:
        raise KeyError("now")

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise KeyError("later")

    async def cancels_itself() -> None:
        raise asyncio.CancelledError

    with pytest.raises(KeyError, match="now"):
        start_eagerly(fails_at_once())
    task = start_eagerly(fails_later())
    assert task is not None
    with pytest.raises(KeyError, match="later"):
        await task
    assert start_eagerly(cancels_itself()) is None
