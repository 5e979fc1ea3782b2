"""Running a reminder tick in an activation: bind it, skip it if already committed.

Both paths a tick takes into a grain (inline in the reminder service's task, or a
queued message) end here. ``run_tick`` tells the ``TickStatus`` where it runs
(``bind_tick``: its ``occurrence_id`` and ``reminder`` follow), asks every
persistent state of the grain whether that occurrence is committed
(``PersistentState.committed``: memory only, so a warm activation pays no store
read), and calls ``receive_reminder`` only if none is. A committed occurrence
returns ``DEDUPLICATED`` to the reminder service instead, which persists the
slot's progress as if the tick had run and counts it. A tick whose writes queued
outbox messages returns once they are sent (``orleanspy.outbox``).

A status with a ``deadline`` (the reminder's ``deadline=``, or its next slot
under ``OverlapPolicy.CANCEL_OTHER``) is enforced here, where the tick runs,
by the silo's clock: when it passes, ``receive_reminder`` is cancelled (it sees
``CancelledError`` at its next suspension) and the tick raises
``TickDeadlineError`` to the reminder service, wherever that is. Enforcing it
where the tick runs, and not in the caller, is what stops the grain's work:
a caller that stopped waiting would leave it running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from orleanspy.clock import Clock, call_at
from orleanspy.errors import TickDeadlineError
from orleanspy.outbox import SEND_WAIT
from orleanspy.reminders.model import TICK_DEDUPLICATED, TickStatus, bind_tick

if TYPE_CHECKING:
    from orleanspy.grain import GrainDefinition
    from orleanspy.identity import GrainId

__all__ = ["DEDUPLICATED", "TICK_METHOD", "run_tick", "within_deadline"]

#: The method a reminder tick calls.
TICK_METHOD: Final = "receive_reminder"

DEDUPLICATED: Final = TICK_DEDUPLICATED


async def run_tick(  # noqa: PLR0917 (positional: it runs once per tick)
    receive: Callable[..., Awaitable[Any]],
    definition: GrainDefinition,
    service_id: str,
    grain_id: GrainId,
    args: Sequence[Any],
    clock: Clock | None = None,
) -> str | None:
    """Await ``receive(*args)`` (a grain's bound ``receive_reminder``) unless a
    state of the grain committed this occurrence; ``DEDUPLICATED`` then, else
    ``None``. ``args`` is the call's ``(name, status)``; a status that is not a
    ``TickStatus`` goes to the grain as it is (its own signature decides). A
    status's ``deadline`` is enforced by ``clock`` (module docstring; no clock:
    not enforced)."""
    if len(args) == 2 and isinstance(args[1], TickStatus):
        name, status = args
        if isinstance(name, str):
            bind_tick(status, service_id, grain_id, name)
            limit = status.deadline
            if definition.states:
                grain = getattr(receive, "__self__", None)
                for decl in definition.states:
                    if getattr(grain, decl.attribute).committed(name, status):
                        return DEDUPLICATED
                if limit is not None and clock is not None:
                    await within_deadline(clock, limit, receive(*args), f"{grain_id} {name!r}")
                else:
                    await receive(*args)
                # The tick is acknowledged once the messages its writes queued
                # are sent (or SEND_WAIT passed): a crash before that makes the
                # next owner deliver it again, and the activation it makes sends
                # them.
                for decl in definition.states:
                    state = getattr(grain, decl.attribute)
                    if state.outbox_waiting:
                        await state.outbox_drained(SEND_WAIT)
                return None
            if limit is not None and clock is not None:
                await within_deadline(clock, limit, receive(*args), f"{grain_id} {name!r}")
                return None
    await receive(*args)
    return None


async def within_deadline(clock: Clock, limit: timedelta, run: Awaitable[Any], what: str) -> None:
    """Await ``run`` in this task; once ``clock`` passed ``limit`` from now,
    cancel it and raise ``TickDeadlineError`` (a cancellation of the task from
    elsewhere stays a ``CancelledError``)."""
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def cut() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    base = task.cancelling()
    handle = call_at(clock, clock.now() + limit, cut)
    try:
        await run
    except asyncio.CancelledError:
        # Ours only if no one else cancelled the task as well (as asyncio.timeout).
        if fired and task.uncancel() <= base:
            raise TickDeadlineError(
                f"reminder tick of {what} ran longer than its deadline of "
                f"{limit.total_seconds():g} s and was cancelled"
            ) from None
        raise
    else:
        if fired:  # the grain swallowed the cancellation: take it back
            task.uncancel()
    finally:
        handle.cancel()
