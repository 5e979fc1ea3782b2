"""Per-task context: the call chain a turn runs in.

The chain (canonical grain ids of the grains whose turns are waiting on this
call) travels in the ``chain`` header. A request whose chain already holds the
target grain is a call back into a grain that is waiting on it: running it
interleaved (call-chain reentrancy) is the only way it can complete, so the
activation lets it in instead of deadlocking until the response timeout.
"""

from __future__ import annotations

from contextvars import ContextVar

from orleanspy import outbox

__all__ = ["CHAIN_HEADER", "current_chain", "decode_chain", "encode_chain"]

CHAIN_HEADER = "chain"

current_chain: ContextVar[tuple[str, ...]] = ContextVar("orleanspy_call_chain", default=())
# outbox.message_id tells a turn an outbox call started from the calls it makes
# by the depth of the chain (the grain layer does not import this one).
outbox.bind_chain(current_chain)


def encode_chain(chain: tuple[str, ...]) -> str:
    return "\n".join(chain)


def decode_chain(text: str | None) -> tuple[str, ...]:
    return tuple(text.split("\n")) if text else ()
