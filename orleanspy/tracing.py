"""Whether this process traces, and with what.

orleanspy traces with OpenTelemetry when the ``orleanspy[otel]`` extra (the
``opentelemetry-api`` package) is installed *and* the application has set a
tracer provider (``opentelemetry.trace.set_tracer_provider``, or the
``opentelemetry-instrument`` launcher) before a silo or client starts. Then
``refresh()`` returns the process's ``Tracer`` (``orleanspy._otel``, the only
module that imports OpenTelemetry) and the runtime makes spans; otherwise it
returns ``None`` and the runtime's hot paths test one attribute against
``None`` and do nothing else: no import, no context read, no header. The
trace context a call carries on the wire is ``orleanspy.trace_context``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orleanspy._otel import Tracer

__all__ = ["active", "current_ids", "disable", "refresh", "use"]


_active: Tracer | None = None
# A tracer provider given with ``use``, in place of the global one.
_provider: Any = None


def active() -> Tracer | None:
    """The process's tracer, or ``None`` when it does not trace (as of the last
    ``refresh``)."""
    return _active


def refresh() -> Tracer | None:
    """Look again: the tracer when ``opentelemetry-api`` is importable and a
    tracer provider other than the API's default (which records nothing) is
    set (or one was given to ``use``); else ``None``. Silos and clients call it
    as they start, so a provider must be set before then. Cheap; the result is
    kept (``active``)."""
    global _active
    try:
        from orleanspy import _otel
    except ImportError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        _active = None  # the orleanspy[otel] extra is not installed
        return None
    _active = _otel.configured_tracer() if _provider is None else _otel.Tracer(_provider)
    return _active


def use(provider: Any) -> Tracer | None:
    """Trace with ``provider`` (an OpenTelemetry ``TracerProvider``) instead of the
    global one (``None``: the global one again, if set). For an application that
    keeps its provider to itself, and for tests; silos and clients started from
    now on use it (``refresh``)."""
    global _provider
    _provider = provider
    return refresh()


def disable() -> None:
    """Stop tracing in this process until the next ``refresh`` (benchmarks, tests)."""
    global _active
    _active = None


def current_ids() -> tuple[str, str] | None:
    """``(trace id, span id)`` in hex of the span current in this context, when
    this process traces and one is; for log records."""
    tracer = _active
    return None if tracer is None else tracer.current_ids()
