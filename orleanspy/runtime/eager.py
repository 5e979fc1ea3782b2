"""Run a coroutine's first step now, and make a task of it only if it suspends.

Python 3.12 calls this an eager task (``asyncio.eager_task_factory``); 3.11 has
no such thing, so the runtime does it by hand for turns that arrive from the
network. Most grain methods finish without awaiting anything that is not
already done; for them this saves the task, its scheduling on the loop and its
done-callbacks, which is a good share of a cross-silo call's cost.

Only callers whose own stack is a safe place to run user code use this: the
transport's receive loop does, a grain's call to a local grain does not (a
grain looping on ``await other.ping()`` would then never yield to the loop).
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["start_eagerly"]

_T = TypeVar("_T")


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` up to its first suspension in a copy of the current context.

    Returns ``None`` when it finished in that step (its result, ``None``, is
    dropped), else a task on the running loop that carries it on in the same
    context. A ``CancelledError`` raised by the coroutine's own first step ends
    it as a cancelled task would end; other exceptions propagate, as they would
    out of ``Task.result()``.
    """
    context = contextvars.copy_context()
    try:
        yielded = context.run(coro.send, None)
    except StopIteration:
        return None
    except asyncio.CancelledError:
        return None
    return asyncio.get_running_loop().create_task(_continue(coro, yielded), context=context)


async def _continue(coro: Coroutine[Any, Any, _T], yielded: Any) -> _T:
    return await _resume(coro, yielded)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, _T], yielded: Any) -> Generator[Any, Any, _T]:
    # Hand the task what the first step yielded (the future it waits on, or
    # None for a bare yield), then relay every resume and every thrown
    # exception (cancellation above all) to the coroutine, as a task would.
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                result: _T = stop.value
                return result
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                result = stop.value
                return result
