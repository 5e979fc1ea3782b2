"""OpenTelemetry spans for grain calls, reminder ticks and management actions.

The only module that imports ``opentelemetry`` (the ``orleanspy[otel]`` extra:
the API alone). It makes spans through the tracer provider the application
set; which SDK, sampler, processor and exporter (OTLP to a collector, Jaeger,
Tempo) is the application's choice (docs/operations.md). ``orleanspy.tracing``
decides whether this module is used at all.

Spans, named by what they are about (low cardinality: grain types, methods,
actions; keys go in attributes):

- ``Type/method``, kind CLIENT: a grain call that becomes a message, where it
  is made (a client, a grain, a silo's own code). Its context travels in the message's header map
  as W3C ``traceparent``/``tracestate`` (``inject``).
- ``Type/method``, kind SERVER: the call's turn on the grain, a child of the
  caller's span as the message carried it (``serve``). Calls the grain makes
  in the turn are its children.
- ``Type/method``, kind INTERNAL: a local call that runs inline in its
  caller's task (``inline``): one span, since nothing travels.
- ``Type tick``: a reminder tick, where the reminder service delivers it; a
  new trace (a tick is not caused by a request) *linked* to the span that
  registered or last changed the reminder (the row keeps that span's
  ``traceparent``); its grain call is its child.
- ``reminders.<action>``: a management action (pause, delete, ...).

Attributes follow the RPC conventions (``rpc.system`` = ``orleanspy``,
``rpc.service`` the grain type, ``rpc.method``) and name the rest
``orleanspy.*``. A grain's exception marks its spans as errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
)

from orleanspy.trace_context import (
    TRACEPARENT,
    TRACESTATE,
    TraceParent,
    clean_tracestate,
    parse_traceparent,
)
from orleanspy.versions import __version__

if TYPE_CHECKING:
    from orleanspy.identity import GrainId

__all__ = ["Span", "Tracer", "configured_tracer", "remote_parent"]

_SYSTEM = "orleanspy"


def configured_tracer() -> Tracer | None:
    """A ``Tracer`` over the global tracer provider, or ``None`` when none is set
    (the API's proxy and no-op providers record nothing, so orleanspy does not
    trace at all then)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return Tracer(provider)


def _span_context(parent: TraceParent, state: str | None = None) -> SpanContext:
    return SpanContext(
        trace_id=parent.trace_id,
        span_id=parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & 0xFF),
        trace_state=TraceState.from_header([state]) if state else None,
    )


def remote_parent(headers: Mapping[str, str]) -> Context:
    """The context a message's headers carry: its ``traceparent`` (and
    ``tracestate``) as a remote parent, or an empty context (a new trace) when
    it carries none or one that does not parse (``orleanspy.tracing``)."""
    parent = parse_traceparent(headers.get(TRACEPARENT))
    if parent is None:
        return Context()
    state = clean_tracestate(headers.get(TRACESTATE)) if TRACESTATE in headers else None
    return trace.set_span_in_context(NonRecordingSpan(_span_context(parent, state)), Context())


class Tracer:
    """Spans of one process, over ``provider`` (module docstring)."""

    __slots__ = ("_tracer",)

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._tracer = provider.get_tracer("orleanspy", __version__)

    # -- grain calls --------------------------------------------------------------------

    def call(self, grain_id: GrainId, method: str) -> AbstractContextManager[Span]:
        """The caller's span of a call, current inside the ``with``."""
        return self._tracer.start_as_current_span(
            f"{grain_id.type_name}/{method}",
            kind=SpanKind.CLIENT,
            attributes={
                "rpc.system": _SYSTEM,
                "rpc.service": grain_id.type_name,
                "rpc.method": method,
                "orleanspy.grain": grain_id.canonical,
            },
        )

    @staticmethod
    def inject(headers: dict[str, str]) -> None:
        """Put the current span's context into a message's headers (nothing when
        no valid span is current)."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return
        headers[TRACEPARENT] = (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        )
        state = context.trace_state
        if state:
            headers[TRACESTATE] = state.to_header()

    def serve(
        self, grain_id: GrainId, method: str, silo: object, headers: Mapping[str, str]
    ) -> AbstractContextManager[Span]:
        """The callee's span of a call's turn, current inside the ``with``: a child
        of the span the message's ``headers`` carry (checked, ``remote_parent``)."""
        return self._tracer.start_as_current_span(
            f"{grain_id.type_name}/{method}",
            context=remote_parent(headers),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": _SYSTEM,
                "rpc.service": grain_id.type_name,
                "rpc.method": method,
                "orleanspy.grain": grain_id.canonical,
                "orleanspy.silo": str(silo),
            },
        )

    def inline(self, grain_id: GrainId, method: str, silo: object) -> AbstractContextManager[Span]:
        """The one span of a local call that runs inline in its caller's task (no
        message, no hop): kind INTERNAL, a child of the current span."""
        return self._tracer.start_as_current_span(
            f"{grain_id.type_name}/{method}",
            kind=SpanKind.INTERNAL,
            attributes={
                "rpc.system": _SYSTEM,
                "rpc.service": grain_id.type_name,
                "rpc.method": method,
                "orleanspy.grain": grain_id.canonical,
                "orleanspy.silo": str(silo),
            },
        )

    # -- reminder ticks -----------------------------------------------------------------

    def tick(
        self,
        grain_id: GrainId,
        reminder: str,
        *,
        slot: datetime,
        occurrence_id: str,
        attempt: int,
        priority: int,
        missed_ticks: int,
        linked: str | None,
    ) -> AbstractContextManager[Span]:
        """A tick's span: a new trace, linked to ``linked`` (the ``traceparent``
        the row keeps of the span that registered or last changed it)."""
        links: list[Link] = []
        parent = parse_traceparent(linked)
        if parent is not None:
            links.append(Link(_span_context(parent), {"orleanspy.link": "registered"}))
        return self._tracer.start_as_current_span(
            f"{grain_id.type_name} tick",
            context=Context(),
            kind=SpanKind.INTERNAL,
            links=links,
            attributes={
                "orleanspy.grain": grain_id.canonical,
                "orleanspy.reminder.name": reminder,
                "orleanspy.reminder.slot": slot.isoformat(),
                "orleanspy.reminder.occurrence_id": occurrence_id,
                "orleanspy.reminder.attempt": attempt,
                "orleanspy.reminder.priority": priority,
                "orleanspy.reminder.missed_ticks": missed_ticks,
            },
        )

    # -- management ---------------------------------------------------------------------

    def management(
        self, action: str, attributes: Mapping[str, Any]
    ) -> AbstractContextManager[Span]:
        """A management action's span (``reminders.pause``, ...)."""
        return self._tracer.start_as_current_span(
            f"reminders.{action}",
            kind=SpanKind.INTERNAL,
            attributes={f"orleanspy.{k}": v for k, v in attributes.items() if v is not None},
        )

    # -- the current span ---------------------------------------------------------------

    @staticmethod
    def current_traceparent() -> str | None:
        """The current span's ``traceparent``, or ``None`` when no valid span is
        current (what a reminder row keeps for its ticks' links)."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return TraceParent(context.trace_id, context.span_id, int(context.trace_flags)).header()

    @staticmethod
    def current_ids() -> tuple[str, str] | None:
        """``(trace id, span id)`` in hex of the current span, if a valid one is."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"
