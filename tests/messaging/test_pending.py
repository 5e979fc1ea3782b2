"""PendingCalls: one sweeper times calls out in order; resolve, fail and close."""

from __future__ import annotations

import asyncio

import pytest

from orleanspy import ClosedError, GrainCallTimeoutError
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
