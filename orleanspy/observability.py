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
import re
from contextvars import ContextVar, Token

from orleanspy import tracing

__all__ = [
    "JsonFormatter",
    "SiloNameFilter",
    "current_silo",
    "message_fields",
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


_FIELD = re.compile(r"(?:^|\s)([a-z][a-z0-9_]*)=")
_RESERVED = frozenset({"ts", "level", "logger", "msg", "traceback", "trace_id", "span_id"})
#: Attributes a caller may pass in ``extra`` that become keys as they are.
_EXTRA_KEYS = ("grain", "reminder", "peer", "error")


def _top_level(message: str) -> list[bool]:
    """For each character: whether it lies outside quotes and brackets (a repr's inside)."""
    out, depth, quote = [], 0, ""
    for ch in message:
        out.append(depth == 0 and not quote)
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and depth:
            depth -= 1
    return out


def message_fields(message: str) -> dict[str, str]:
    """The ``key=value`` fields of a log message (structured as the project logs):
    each value runs to the next `` key=`` outside quotes and brackets, or the
    end, so a ``repr`` with spaces stays whole."""
    top = _top_level(message)
    found = [m for m in _FIELD.finditer(message) if top[m.start(1)]]
    fields: dict[str, str] = {}
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(message)
        fields[match.group(1)] = message[match.end() : end].strip()
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the record's fields as keys: ``ts`` (ISO
    8601 UTC), ``level``, ``logger``, ``msg`` (the message as text logs show it),
    ``silo`` (when a ``SiloNameFilter`` stamped it), ``trace_id`` and ``span_id``
    (hex, of the span current where the record was logged, when the process
    traces: ``orleanspy.tracing``; a log backend links them to the trace), then
    every ``key=value``
    field of the message (``grain``, ``peer``, ``error``, ...) and the ``extra``
    attributes ``grain``, ``reminder``, ``peer``, ``error``. A reminder's row
    ``key=Type/s:k|name`` also gives ``grain`` and ``reminder``. An exception
    gives ``error`` (``Type: message``) and ``traceback``. A field named like one
    of the fixed keys is written as ``field_<name>``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, object] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": message,
        }
        silo = getattr(record, "silo", None)
        if silo is not None:
            doc["silo"] = silo
        ids = tracing.current_ids()
        if ids is not None:
            doc["trace_id"], doc["span_id"] = ids
        for key, value in message_fields(message).items():
            doc.setdefault(f"field_{key}" if key in _RESERVED else key, value)
        row = doc.get("key")
        if isinstance(row, str) and "|" in row and record.name.startswith("orleanspy.reminders"):
            grain, _, reminder = row.rpartition("|")
            doc.setdefault("grain", grain)
            doc.setdefault("reminder", reminder)
        for name in _EXTRA_KEYS:
            extra = getattr(record, name, None)
            if extra is not None:
                doc[name] = str(extra)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            doc.setdefault("error", f"{type(exc).__name__}: {exc}")
            doc["traceback"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
