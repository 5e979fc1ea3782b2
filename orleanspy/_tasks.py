"""Cancellation that a client library swallowed, made visible again.

redis-py (a pooled pipeline) and grpc.aio (a cancelled unary call surfacing as a
``CANCELLED`` status error) can end a call that was cancelled without raising
``CancelledError``. A loop that then catches "storage failed" or "ping failed"
and goes round again never sees its cancellation, and whoever waits for it to
stop (a silo's ``stop()``) waits forever. The Redis and gRPC boundaries call
``raise_if_cancelled`` after every call, success or failure.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelled"]


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
