"""Exceptions across the wire: a type name, a message and traceback text, never pickle.

On the caller's side the same type is rebuilt when it is safe: a builtin
exception, an orleanspy error, or an ``Exception`` subclass from a module the
caller has *already imported* (nothing is imported because a peer named it),
constructible from one message string. Otherwise ``RemoteGrainError`` carries
the remote type name, message and traceback. The remote traceback is attached
to rebuilt exceptions as a note.
"""

from __future__ import annotations

import builtins
import sys
import traceback
from typing import Any

from orleanspy import errors
from orleanspy.errors import RemoteGrainError
from orleanspy.messaging.message import Message, ResponseStatus
from orleanspy.serialization import Codec

__all__ = ["error_payload", "rebuild_error", "result_of"]


def error_payload(exc: BaseException) -> dict[str, Any]:
    """The wire form of an exception raised by a grain or by the runtime."""
    cls = type(exc)
    payload: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc) if not isinstance(exc, RemoteGrainError) else exc.remote_message,
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if isinstance(exc, RemoteGrainError):
        payload["remote_type"] = exc.remote_type
    elif all(isinstance(a, _PLAIN) for a in exc.args):
        payload["args"] = list(exc.args)
    return payload


_PLAIN = (str, int, float, bool, type(None))


def _resolve(type_name: str) -> type[BaseException] | None:
    module_name, _, qualname = type_name.rpartition(".")
    module: Any
    if module_name == "builtins":
        module = builtins
    elif module_name == errors.__name__:
        module = errors
    else:
        module = sys.modules.get(module_name)
        if module is None:
            return None
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


def rebuild_error(payload: Any) -> Exception:
    """The exception to raise at the caller for ``payload`` (see module docstring)."""
    if not isinstance(payload, dict):
        return RemoteGrainError("unknown", repr(payload))
    type_name = str(payload.get("type", "unknown"))
    message = str(payload.get("message", ""))
    tb = str(payload.get("traceback", ""))
    if type_name == f"{errors.__name__}.RemoteGrainError":
        return RemoteGrainError(str(payload.get("remote_type", "unknown")), message, tb)
    cls = _resolve(type_name)
    if cls is not None:
        args = payload.get("args")
        try:
            exc = cls(*args) if isinstance(args, list) else cls(message)
        except Exception:
            exc = None
        if isinstance(exc, Exception):
            if tb:
                exc.add_note(f"remote traceback:\n{tb.rstrip()}")
            return exc
    return RemoteGrainError(type_name, message, tb)


def result_of(response: Message, codec: Codec) -> Any:
    """The call's result carried by ``response``, or its error raised."""
    if response.status is ResponseStatus.OK:
        return codec.decode(response.body)
    raise rebuild_error(codec.decode(response.body))
