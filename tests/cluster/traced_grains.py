"""Grains of the tracing and audit tests on real silo processes (``orleanspy silo
--import traced_grains``). With ``ORLEANSPY_TEST_SPANS`` set, the process traces
into that file, one JSON object per finished span, as an application configures
an OpenTelemetry SDK before its silo starts (the orleanspy[otel] extra brings only
the API)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from orleanspy import Grain, Remindable, TickStatus


class JsonLinesExporter(SpanExporter):
    """Each finished span as a line: name, kind, ids, parent, trace state, attributes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            assert s.context is not None
            lines.append(json.dumps({
                "name": s.name,
                "kind": s.kind.name,
                "trace_id": f"{s.context.trace_id:032x}",
                "span_id": f"{s.context.span_id:016x}",
                "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
                "trace_state": s.context.trace_state.to_header(),
                "attributes": {k: str(v) for k, v in (s.attributes or {}).items()},
            }))  # fmt: skip
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


_SPANS = os.environ.get("ORLEANSPY_TEST_SPANS")
if _SPANS:
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(_SPANS)))
    trace.set_tracer_provider(_provider)


class EchoGrain(Grain, type_name="traced.Echo"):
    async def echo(self, text: str) -> str:
        return text


class AuditedTicker(Grain, Remindable, type_name="traced.Ticker"):
    async def start(self) -> None:
        await self.register_or_update_reminder("beat", due=3600, period=3600)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass
