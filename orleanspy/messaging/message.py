"""The message envelope, in pure Python (the wire form lives in ``frames.py``)."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orleanspy.identity import GrainId, SiloAddress

__all__ = [
    "PRINCIPAL_HEADER",
    "SYSTEM_TYPE_PREFIX",
    "Message",
    "MessageKind",
    "ResponseStatus",
    "next_message_id",
    "settle",
]

#: The header naming who a call to one of the runtime's own grains acts for (the
#: reminder management grain: its audit log records it). A gateway sets it from
#: what its transport authenticated and drops any a client sent; a silo sets it
#: on its own such calls; silos pass it on as members of the cluster.
PRINCIPAL_HEADER = "principal"
#: The runtime's own grain types are named ``orleanspy.<Name>``.
SYSTEM_TYPE_PREFIX = "orleanspy."


class MessageKind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    ONE_WAY = 2


class ResponseStatus(enum.IntEnum):
    """For responses: ``OK`` carries the result; ``ERROR`` an error payload
    ``{"type", "message", "traceback"}``; ``REJECTED`` a refusal by the runtime
    (malformed, unknown grain or method, too many forwards, shutting down)."""

    OK = 0
    ERROR = 1
    REJECTED = 2


_ids = itertools.count(1)


def next_message_id() -> int:
    """A message id unique within this process."""
    return next(_ids)


@dataclass(slots=True)
class Message:
    """One request, response or one-way message.

    ``correlation_id`` is, on a response, the ``id`` of the request it answers.
    ``sender_silo`` is where a response must go; ``sender_client`` names the
    gateway client behind it when the request came from a ``ClusterClient``.
    ``expires_at_ms`` (epoch ms, 0 = never) lets a receiver drop work whose
    caller has given up. ``headers["chain"]`` lists the grain ids of the call
    chain (newline separated) for call-chain reentrancy; ``traceparent`` and
    ``tracestate`` carry the caller's trace context (``orleanspy.tracing``);
    ``principal`` who a call to a runtime grain acts for (``PRINCIPAL_HEADER``).
    A peer that does not know a header ignores it (the map is in every
    release's envelope).
    """

    id: int
    kind: MessageKind
    target_grain: GrainId | None = None
    method: str = ""
    body: bytes = b""
    sender_silo: SiloAddress | None = None
    sender_client: str | None = None
    target_silo: SiloAddress | None = None
    correlation_id: int = 0
    expires_at_ms: int = 0
    forward_count: int = 0
    status: ResponseStatus = ResponseStatus.OK
    headers: dict[str, str] = field(default_factory=dict)
    #: In-process only, never sent: a request's ``(args, kwargs)`` when every
    #: argument is immutable and ``body`` has not been encoded (the local call
    #: fast path). Whoever sends the message off the process encodes it first.
    local_args: tuple[tuple[Any, ...], dict[str, Any]] | None = field(default=None, repr=False)
    #: In-process only, never sent: called once (through ``settle``) when a
    #: one-way message read from the network has had its turn, or was dropped,
    #: or left this process; it frees the in-flight slot its sender holds.
    on_settled: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def request(
        cls,
        grain_id: GrainId,
        method: str,
        body: bytes,
        *,
        one_way: bool,
        expires_at_ms: int,
        sender_silo: SiloAddress | None = None,
    ) -> Message:
        """A new request (or one-way message) for ``grain_id.method``."""
        return cls(
            id=next_message_id(),
            kind=MessageKind.ONE_WAY if one_way else MessageKind.REQUEST,
            target_grain=grain_id,
            method=method,
            body=body,
            sender_silo=sender_silo,
            expires_at_ms=expires_at_ms,
        )

    def response(self, status: ResponseStatus, body: bytes) -> Message:
        """The response to this request, addressed back to its sender.

        It names no grain or method: the caller finds its call by
        ``correlation_id``, and leaving them out keeps responses cheap to encode
        and decode.
        """
        # Positional, in field order: responses are made once per call.
        return Message(
            next_message_id(),
            MessageKind.RESPONSE,
            None,
            "",
            body,
            None,
            self.sender_client,
            self.sender_silo,
            self.id,
            0,
            0,
            status,
            {},
        )


def settle(message: Message) -> None:
    """Call ``message.on_settled`` once, if set: its one-way turn is over (run,
    dropped, or written to another silo), so its sender's slot is free."""
    done = message.on_settled
    if done is not None:
        message.on_settled = None
        done()
