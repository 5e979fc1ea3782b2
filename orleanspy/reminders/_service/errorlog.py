"""Logging a failing tick: one WARNING per failure, its traceback rate-limited."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Final

from orleanspy.reminders.model import error_text

__all__ = ["TRACEBACK_EVERY_S", "GrainErrorLog"]

log = logging.getLogger("orleanspy.reminders._service.delivery")

#: A failing tick's traceback is logged at most once per this many seconds per
#: reminder; the failures in between are counted in the next such line.
TRACEBACK_EVERY_S: Final = 60.0
# Reminders whose last traceback time is remembered, at most (then the oldest go).
_TRACEBACKS_KEPT: Final = 10_000


class GrainErrorLog:
    """One WARNING per failure; its traceback (the grain's, for a remote grain)
    at most every ``TRACEBACK_EVERY_S`` per reminder, with how many failures
    went without one since."""

    def __init__(self, name: str) -> None:
        self._name = name
        # Row key -> (loop time of its last logged traceback, failures since).
        self._tracebacks: dict[str, tuple[float, int]] = {}

    def failed(self, key: str, slot: datetime, exc: BaseException) -> None:
        now = asyncio.get_running_loop().time()
        seen = self._tracebacks.get(key)
        if seen is not None and now - seen[0] < TRACEBACK_EVERY_S:
            self._tracebacks[key] = (seen[0], seen[1] + 1)
            log.warning(
                "reminder tick failed in grain name=%s key=%s slot=%s error=%s",
                self._name,
                key,
                slot.isoformat(),
                error_text(exc),
            )
            return
        if len(self._tracebacks) >= _TRACEBACKS_KEPT:
            self._tracebacks.pop(next(iter(self._tracebacks)))
        self._tracebacks[key] = (now, 0)
        remote = getattr(exc, "remote_traceback", "")
        log.warning(
            "reminder tick failed in grain name=%s key=%s slot=%s error=%s "
            "failures_without_traceback=%d%s",
            self._name,
            key,
            slot.isoformat(),
            error_text(exc),
            0 if seen is None else seen[1],
            f"\nremote traceback:\n{remote.rstrip()}" if remote else "",
            exc_info=None if remote else exc,
        )
