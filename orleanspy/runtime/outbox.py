"""Sending what an activation's states queued in their outbox (``orleanspy.outbox``).

One ``OutboxSender`` per activation that has queued messages, made on the first
(``Activation.outbox_ready``). It sends each state's unsent messages in order,
one at a time, and marks each sent in its state (``PersistentState.outbox_sent``);
once a state has none unsent, a turn of the grain writes the sent ones out of
its record (``PersistentState.outbox_flush``: a turn, so it never races the
grain's own writes).

What a send's failure means:

- it may pass (``RETRIED``: the target's silo unreachable or restarting, the
  call timed out, the message refused while a silo stops, an activation that
  failed to start, a store away): sent again after a backoff, 0.1 s doubling
  to ``MAX_BACKOFF``, for as long as the activation lives;
- it never will (an unknown grain type or method, a value that cannot travel):
  logged and dropped, and counted;
- anything else is the target's own exception: the target ran the call, so the
  message was delivered; logged.

It stops with its activation; what is still unsent stays in the store and the
grain's next activation sends it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from orleanspy.errors import (
    ActivationError,
    ClosedError,
    GrainCallTimeoutError,
    GrainMethodNotFoundError,
    MessageRejectedError,
    SerializationError,
    SiloUnavailableError,
    StorageUnavailableError,
    UnknownGrainTypeError,
)
from orleanspy.identity import GrainId
from orleanspy.outbox import OutboxEvent
from orleanspy.state import OUTBOX_CALL

if TYPE_CHECKING:
    from orleanspy.state import PersistentState

__all__ = ["MAX_BACKOFF", "OutboxPort", "OutboxSender"]

log = logging.getLogger(__name__)

#: The longest wait between two sends of one message that failed.
MAX_BACKOFF: Final = 5.0

RETRIED: Final = (
    GrainCallTimeoutError,
    SiloUnavailableError,
    MessageRejectedError,
    ActivationError,
    StorageUnavailableError,
    ClosedError,
)
NEVER: Final = (UnknownGrainTypeError, GrainMethodNotFoundError, SerializationError)


class OutboxPort(Protocol):
    """What the sender needs of its silo (implemented by the dispatcher)."""

    async def send_outbox_call(
        self, grain_id: GrainId, method: str, args: list[Any], message_id: str
    ) -> None:
        """Call ``method`` on ``grain_id`` as a message carrying ``message_id``
        (``orleanspy.outbox.OUTBOX_HEADER``); the target's exception is raised."""
        ...

    async def outbox_publish(self, stream: str, event: OutboxEvent) -> None:
        """Publish ``event`` on ``stream`` with the silo's stream provider."""
        ...


class OutboxSender:
    """Sends the queued messages of one activation's states (module docstring)."""

    def __init__(
        self,
        port: OutboxPort,
        grain_id: GrainId,
        run_turn: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]],
    ) -> None:
        self._port = port
        self._grain_id = grain_id
        self._run_turn = run_turn
        self._waiting: list[PersistentState[Any]] = []
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0

    def wake(self, state: PersistentState[Any]) -> None:
        """``state`` holds unsent messages: send them (soon, in order)."""
        if state not in self._waiting:
            self._waiting.append(state)
        if self._task is None or self._task.done():
            # A context of its own: not the call chain of the turn that woke it
            # (its sends are not calls made by that turn).
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"outbox-{self._grain_id}", context=contextvars.Context()
            )

    async def finish(self, timeout: float) -> None:
        """The activation is going away and runs no more turns: wait up to
        ``timeout`` seconds for what is unsent to be sent, write the sent out of
        the records, and stop. What is still unsent stays stored."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for state in list(self._waiting):
            await state.outbox_drained(max(0.0, deadline - loop.time()))
        # The task may wait for a flush turn, which no longer runs: flushed here.
        self.close()
        for state in self._waiting:
            try:
                await state.outbox_flush()
            except Exception as exc:
                log.info("outbox: record not rewritten grain=%s error=%r", self._grain_id, exc)
        self._waiting.clear()

    def close(self) -> None:
        """Stop sending at once (a crash); unsent messages stay stored."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while self._waiting:
            state = self._waiting[0]
            for entry in state.outbox_unsent():
                await self._send(entry)
                state.outbox_sent(entry[0])
            if not state.outbox_unsent():
                try:
                    await self._run_turn(state.outbox_flush)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # The sent messages stay in the record until the next write;
                    # an activation made meanwhile sends them again (receivers
                    # drop repeats).
                    log.info("outbox: record not rewritten grain=%s error=%r", self._grain_id, exc)
                if not state.outbox_unsent():
                    self._waiting.remove(state)

    async def _send(self, entry: list[Any]) -> None:
        mid, kind, target, name, body = entry
        delay = 0.1
        while True:
            try:
                if kind == OUTBOX_CALL:
                    await self._port.send_outbox_call(GrainId.parse(target), name, body, mid)
                else:
                    await self._port.outbox_publish(target, OutboxEvent(mid, body))
                return
            except asyncio.CancelledError:
                raise
            except RETRIED as exc:
                log.info(
                    "outbox: send failed, retrying in %.1fs grain=%s message=%s error=%r",
                    delay, self._grain_id, mid, exc,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)
            except NEVER as exc:
                self.dropped += 1
                log.error(
                    "outbox: message dropped, it can never be delivered grain=%s message=%s "
                    "target=%s method=%s error=%r",
                    self._grain_id, mid, target, name, exc,
                )  # fmt: skip
                return
            except Exception as exc:
                # The target ran the call and raised: delivered.
                log.warning(
                    "outbox: the receiver raised grain=%s message=%s target=%s method=%s error=%r",
                    self._grain_id, mid, target, name, exc,
                )  # fmt: skip
                return
