"""Logs: the silo's name on every record, and structured (JSON) output.

Metrics live in ``orleanspy.metrics`` (recording points) and
``orleanspy._prometheus`` (exposition); this module is about log records.

Log records get the silo's name through ``SiloNameFilter`` on a handler, so a
format can say ``%(silo)s``; ``set_current_silo`` lets several silos in one
process tell their records apart (tasks inherit the context they start in, and
a silo names itself while it starts its tasks). ``JsonFormatter`` writes one
JSON object per record for log shippers (``orleanspy --log-format json``).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar, Token

__all__ = [
    "JsonFormatter",
    "SiloNameFilter",
    "current_silo",
    "reset_current_silo",
    "set_current_silo",
]


_current_silo: ContextVar[str | None] = ContextVar("orleanspy_current_silo", default=None)


def set_current_silo(name: str | None) -> Token[str | None]:
    """Name the silo for log records of this context and the tasks it starts.

    Returns a token for ``reset_current_silo``, which restores the name before.
    """
    return _current_silo.set(name)


def reset_current_silo(token: Token[str | None]) -> None:
    """Undo the ``set_current_silo`` call that returned ``token``."""
    _current_silo.reset(token)


def current_silo() -> str | None:
    """The silo name set for this context, if any."""
    return _current_silo.get()


class SiloNameFilter(logging.Filter):
    """Stamps ``record.silo`` so a format can include ``%(silo)s``; passes every record.

    The name is, first found: a ``silo`` the caller gave in ``extra``, the
    context's ``set_current_silo`` name, else the ``name`` given here. Attach it
    to handlers (a logger's filters do not see records of child loggers).
    """

    def __init__(self, name: str = "-") -> None:
        super().__init__()
        self.silo_name = name

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "silo", None) is None:
            record.silo = _current_silo.get() or self.silo_name
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601 UTC), ``level``, ``logger``,
    ``silo`` (when a ``SiloNameFilter`` stamped it), ``message`` and, for an
    exception, ``exc_info`` (the formatted traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        silo = getattr(record, "silo", None)
        if silo is not None:
            doc["silo"] = silo
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
