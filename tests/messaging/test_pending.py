"""PendingCalls: one sweeper times calls out in order; resolve, fail and close."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orleanspy import ClosedError, GrainCallTimeoutError
from orleanspy.messaging import pending as pending_module
from orleanspy.messaging.pending import PendingCalls


async def test_unanswered_calls_time_out_in_order_and_answered_ones_do_not() -> None:
    pending: PendingCalls[str] = PendingCalls(timeout=0.05)
    first = pending.add(1, "G/a", "m")
    answered = pending.add(2, "G/b", "m")
    third = pending.add(3, "G/c", "m")
    assert pending.resolve(2, "ok")
    assert await answered == "ok"
    with pytest.raises(GrainCallTimeoutError, match=r"G/a\.m"):
        await first
    with pytest.raises(GrainCallTimeoutError, match=r"G/c\.m"):
        await third
    assert len(pending) == 0
    assert not pending.resolve(1, "late")  # a late response finds nobody
    await pending.close(ClosedError("done"))


async def test_sweeper_wakes_for_calls_made_after_an_idle_spell() -> None:
    pending: PendingCalls[str] = PendingCalls(timeout=0.02)
    with pytest.raises(GrainCallTimeoutError):
        await pending.add(1, "G/x", "m")
    await asyncio.sleep(0)  # the sweeper is now waiting on an empty queue
    with pytest.raises(GrainCallTimeoutError):
        await asyncio.wait_for(pending.add(2, "G/y", "m"), timeout=2)
    await pending.close(ClosedError("done"))


async def test_fail_where_and_close_fail_the_right_calls() -> None:
    pending: PendingCalls[str] = PendingCalls(timeout=30)
    a = pending.add(1, "G/a", "m", "gw1")
    b = pending.add(2, "G/b", "m", "gw2")
    assert pending.fail_where(lambda tag: tag == "gw1", ConnectionError("gw1 gone")) == 1
    with pytest.raises(ConnectionError):
        await a
    assert not b.done()
    await pending.close(ClosedError("closed"))
    with pytest.raises(ClosedError):
        await b


class _CountingSleeps:
    """``asyncio`` as ``pending`` sees it, counting the sweeper's sleeps."""

    def __init__(self) -> None:
        self.sleeps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.sleeps += 1
        await asyncio.sleep(delay)


async def test_answered_calls_do_not_wake_the_sweeper_at_their_deadlines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A steady caller: 40 calls 5 ms apart, each answered at once, with a
    # timeout of 50 ms. The sweeper sleeps until the oldest call still waiting,
    # not until each answered call's deadline (one wake-up per call).
    counting = _CountingSleeps()
    monkeypatch.setattr(pending_module, "asyncio", counting)
    pending: PendingCalls[str] = PendingCalls(timeout=0.05)
    for i in range(40):
        fut = pending.add(i, "G/a", "m")
        assert pending.resolve(i, "ok") and await fut == "ok"
        await asyncio.sleep(0.005)
    unanswered = pending.add(99, "G/late", "m")
    with pytest.raises(GrainCallTimeoutError, match=r"G/late\.m"):
        await asyncio.wait_for(unanswered, timeout=2)
    assert counting.sleeps <= 5, f"the sweeper slept {counting.sleeps} times for 40 answered calls"
    await pending.close(ClosedError("done"))
