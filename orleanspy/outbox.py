"""The transactional outbox: messages a grain sends once its state write commits.

::

    from orleanspy import outbox

    class InvoiceGrain(Grain, Remindable):
        ledger = persistent_state(Ledger)

        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            self.ledger.state.charged.append(status.current_tick_time)
            await self.ledger.write(tick=status, after=[
                outbox.call(self.get_grain(MailerGrain, self.grain_key), "receipt", 42),
                outbox.publish("billing", {"invoice": str(self.grain_key)}),
            ])

``write(..., after=[...])`` stores the messages in the same record as the
state (and the tick, with ``tick=``): one atomic, etag-checked write commits
all three, or none. Then the runtime sends them, in order, **at least once**:

- a message whose send fails for a reason that may pass (the target's silo is
  unreachable, a call times out, the store of a stream is away) is sent again,
  with backoff, for as long as the activation lives; a message still in the
  record when the grain is next activated (its silo crashed before it was
  sent) is sent by that activation;
- a sent message leaves the record with the grain's next write (or a write
  of the runtime's own, as a turn, once everything pending is sent);
- a tick with ``after=`` is acknowledged to the reminder service only once
  its messages are sent (or after ``SEND_WAIT`` seconds; the rest goes on in
  the background), so a crash before that redelivers the tick: the grain's
  state says it is done (not run again), and the activation the redelivery
  makes sends what is left.

So the receiver may see a message twice. Each carries a **message id**, the
same for every send of one message: ``"<occurrence id>.<index>"`` for a
tick's (``TickStatus.occurrence_id``), a random id with the index otherwise.
A grain method reads it with ``message_id()`` (``None`` when the call did not
come from an outbox); a stream subscriber receives an ``OutboxEvent`` whose
``message_id`` it can check. Keep the ids you applied with the effect (for a
grain: in its state, written with the effect) and drop repeats.

A call whose target cannot take it (an unknown grain type or method) can never
be delivered: it is logged and dropped. A call whose target method raises was
delivered (the target ran it): the exception is logged, and not retried.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from orleanspy.identity import GrainId
from orleanspy.serialization import register_type

__all__ = [
    "MAX_MESSAGES",
    "OUTBOX_HEADER",
    "SEND_WAIT",
    "OutboxCall",
    "OutboxEvent",
    "OutboxMessage",
    "OutboxPublish",
    "call",
    "message_id",
    "publish",
]

#: The most messages one write may queue (a record carries them all).
MAX_MESSAGES: Final = 100

#: Seconds a tick waits for its messages to be sent before it is acknowledged.
SEND_WAIT: Final = 5.0

#: The header an outbox call carries its message id in.
OUTBOX_HEADER: Final = "outbox"


@dataclass(frozen=True, slots=True)
class OutboxCall:
    """A grain call to make once the write commits (``call`` builds one)."""

    grain: GrainId
    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class OutboxPublish:
    """A stream item to publish once the write commits (``publish`` builds one)."""

    stream: str
    item: Any


OutboxMessage = OutboxCall | OutboxPublish


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """What a subscriber of a stream receives for an item an outbox published:
    the ``item`` and its ``message_id`` (the same for every publish of it)."""

    message_id: str
    item: Any


register_type(OutboxEvent, name="orleanspy.OutboxEvent")


def call(grain: Any, method: str, *args: Any) -> OutboxCall:
    """A call of ``method`` with ``args`` on ``grain`` (a grain reference, from
    ``self.get_grain``, or a ``GrainId``), for ``write(after=[...])``. Its result
    is not returned to anyone. ``TypeError`` for a ``grain`` that is neither."""
    if isinstance(grain, GrainId):
        target = grain
    else:
        named = getattr(grain, "__orleanspy_grain_id__", None)
        if named is None:
            raise TypeError(
                f"outbox.call takes a grain reference (self.get_grain(...)) or a GrainId, "
                f"not {type(grain).__name__}"
            )
        target = named()[0]
    if not isinstance(method, str) or not method or method.startswith("_"):
        raise ValueError(f"outbox.call: {method!r} is not a public grain method name")
    return OutboxCall(target, method, args)


def publish(stream: str, item: Any) -> OutboxPublish:
    """``item`` to publish on ``stream`` (subscribers get an ``OutboxEvent``),
    for ``write(after=[...])``."""
    if not isinstance(stream, str) or not stream:
        raise ValueError(
            f"outbox.publish: the stream name must be a non-empty string, not {stream!r}"
        )
    return OutboxPublish(stream, item)


#: (the depth of the call chain of the turn, the message id) of a turn that an
#: outbox call started; the runtime sets it for every message it runs.
current_message: ContextVar[tuple[int, str] | None] = ContextVar(
    "orleanspy_outbox_message", default=None
)
#: The call chain of the running turn (``runtime.context.current_chain``; handed
#: here by the runtime, which this layer does not import).
_chain: ContextVar[tuple[str, ...]] | None = None


def bind_chain(chain: ContextVar[tuple[str, ...]]) -> None:
    """Let ``message_id`` tell the turn an outbox call started from calls it makes
    (the runtime does this once)."""
    global _chain
    _chain = chain


def message_id() -> str | None:
    """The outbox message id of the grain call running now, if an outbox sent it
    (``None`` otherwise, and in the calls that grain method makes in turn)."""
    current = current_message.get()
    if current is None or _chain is None:
        return None
    depth, mid = current
    return mid if len(_chain.get()) == depth else None
