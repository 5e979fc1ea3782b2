"""The event-loop runner behind ``orleanspy.run``: a coroutine on uvloop when it is
installed, else asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    """Run ``main`` to completion, on uvloop where the platform has it."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            result: T = uvloop.run(main)
            return result
    return asyncio.run(main)
