"""OpenTelemetry traces, checked in the SDK's in-memory exporter: a local call's
one span, a call's spans on both sides of each hop of a 3-hop trace across silos on
real gRPC (client -> silo A -> silo B -> silo C), a tick's span linked to the span
that registered or last changed its reminder, management actions as spans, and
trace ids in JSON log records. Without a tracer provider nothing traces."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from orleanspy import Grain, Remindable, Silo, SiloOptions, TickStatus, tracing
from orleanspy.observability import JsonFormatter
from orleanspy.options import MessagingOptions, ReminderOptions
from orleanspy.testing.cluster import FAST_MEMBERSHIP, InProcessCluster, wait_for

log = logging.getLogger("test_tracing")


class Outer(Grain, type_name="test_tracing.Outer"):
    async def call(self, fail: bool) -> str:
        log.warning("inside outer key=%s", self.grain_id.key)
        return await self.get_grain(Inner, "i").work(fail)


class Inner(Grain, type_name="test_tracing.Inner"):
    async def work(self, fail: bool) -> str:
        if fail:
            raise ValueError("inner failed")
        return "done"


class Hop1(Grain, type_name="test_tracing.Hop1"):
    async def go(self) -> list[str]:
        return [str(self._activation.silo_address), *await self.get_grain(Hop2, "b").go()]


class Hop2(Grain, type_name="test_tracing.Hop2"):
    async def go(self) -> list[str]:
        return [str(self._activation.silo_address), *await self.get_grain(Hop3, "c").go()]


class Hop3(Grain, type_name="test_tracing.Hop3"):
    async def go(self) -> list[str]:
        return [str(self._activation.silo_address)]


class Ticker(Grain, Remindable, type_name="test_tracing.Ticker"):
    async def start(self) -> None:
        await self.register_or_update_reminder("beat", due=timedelta(seconds=0.2), period=1)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Silos and clients started in the test trace into an in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing.use(provider) is not None
    try:
        yield exporter
    finally:
        tracing.use(None)
        tracing.disable()
        provider.shutdown()


def _one(found: Sequence[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    matches = [s for s in found if s.name == name and s.kind is kind]
    assert len(matches) == 1, f"{len(matches)} spans {name} {kind}: {[s.name for s in found]}"
    return matches[0]


def _parent_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    assert child.parent is not None and parent.context is not None
    return (
        child.parent.span_id == parent.context.span_id
        and child.parent.trace_id == parent.context.trace_id
    )


async def test_a_local_call_run_inline_is_one_span_and_errors_mark_it(
    spans: InMemorySpanExporter,
) -> None:
    async with Silo.local() as silo:
        outer = silo.client.get_grain(Outer, "o")
        assert await outer.call(False) == "done"
        with pytest.raises(ValueError, match="inner failed"):
            await outer.call(True)
    found = sorted(spans.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert [(s.name, s.kind) for s in found] == [
        ("test_tracing.Outer/call", SpanKind.INTERNAL),
        ("test_tracing.Inner/work", SpanKind.INTERNAL),
    ] * 2, "a call that runs inline in its caller's task is one span"
    first_outer, first_inner, second_outer, second_inner = found
    assert first_outer.parent is None and _parent_of(first_inner, first_outer)
    assert first_outer.context is not None and second_outer.context is not None
    assert first_outer.context.trace_id != second_outer.context.trace_id
    assert dict(first_outer.attributes or {})["rpc.method"] == "call"
    assert dict(first_outer.attributes or {})["orleanspy.grain"] == "test_tracing.Outer/s:o"
    assert first_outer.status.status_code is StatusCode.UNSET
    assert second_inner.status.status_code is StatusCode.ERROR
    assert second_outer.status.status_code is StatusCode.ERROR


async def test_json_log_records_carry_the_trace_and_span_ids(
    spans: InMemorySpanExporter,
) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    try:
        async with Silo.local() as silo:
            await silo.client.get_grain(Outer, "logged").call(False)
    finally:
        log.removeHandler(handler)
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if "inside outer" in x]
    server = _one(spans.get_finished_spans(), "test_tracing.Outer/call", SpanKind.INTERNAL)
    assert server.context is not None
    assert line["trace_id"] == f"{server.context.trace_id:032x}"
    assert line["span_id"] == f"{server.context.span_id:016x}"


async def test_without_a_tracer_provider_nothing_traces() -> None:
    tracing.use(None)
    assert tracing.refresh() is None, "the API's default provider records nothing"
    async with Silo.local() as silo:
        dispatcher = silo._dispatcher
        assert dispatcher is not None and dispatcher.tracing is None
        assert await silo.client.get_grain(Outer, "plain").call(False) == "done"
    assert tracing.current_ids() is None


@pytest.mark.slow
async def test_a_cross_silo_trace_of_three_hops_and_the_tick_links(
    spans: InMemorySpanExporter, redis_url: str
) -> None:
    secret = MessagingOptions(cluster_secret="tracing-test-secret")
    reminders = ReminderOptions(poll_interval=timedelta(seconds=1), look_ahead=timedelta(seconds=5))
    base = SiloOptions(reminders=reminders)
    async with InProcessCluster(
        redis_url, size=0, options=base, membership=FAST_MEMBERSHIP, messaging=secret
    ) as cluster:
        a = await cluster.add(grain_types=(Hop1, Ticker))
        b = await cluster.add(grain_types=(Hop2,))
        c = await cluster.add(grain_types=(Hop3,))
        await cluster.refresh_all()
        client = await cluster.client()
        hops = await client.get_grain(Hop1, "a").go()
        assert hops == [str(a.address), str(b.address), str(c.address)]

        found = spans.get_finished_spans()
        call = _one(found, "test_tracing.Hop1/go", SpanKind.CLIENT)
        assert call.parent is None and call.context is not None
        chain = [call]
        for hop, silo in (("Hop1", a), ("Hop2", b), ("Hop3", c)):
            server = _one(found, f"test_tracing.{hop}/go", SpanKind.SERVER)
            assert _parent_of(server, chain[-1]), f"{hop}'s turn is not a child of its call"
            assert server.attributes is not None
            assert server.attributes["orleanspy.silo"] == str(silo.address)
            chain.append(server)
            if hop != "Hop3":
                nxt = "Hop2" if hop == "Hop1" else "Hop3"
                out = _one(found, f"test_tracing.{nxt}/go", SpanKind.CLIENT)
                assert _parent_of(out, server)
                chain.append(out)
        assert {s.context.trace_id for s in chain if s.context} == {call.context.trace_id}

        # A tick is a new trace linked to the span that registered its reminder.
        ticker = client.get_grain(Ticker, "t")
        await ticker.start()
        registered = _one(spans.get_finished_spans(), "test_tracing.Ticker/start", SpanKind.SERVER)
        tick = await _next_tick(spans, after=0)
        assert registered.context is not None and tick.context is not None
        assert tick.parent is None and tick.context.trace_id != registered.context.trace_id
        assert [link.context.span_id for link in tick.links] == [registered.context.span_id]
        attributes = dict(tick.attributes or {})
        assert attributes["orleanspy.reminder.name"] == "beat"
        assert attributes["orleanspy.reminder.attempt"] == 1
        assert len(str(attributes["orleanspy.reminder.occurrence_id"])) == 32
        assert "orleanspy.reminder.slot" in attributes
        delivered = [
            s for s in spans.get_finished_spans()
            if s.name == "test_tracing.Ticker/receive_reminder" and _parent_of(s, tick)
        ]  # fmt: skip
        assert delivered, "the tick's grain call is a child of the tick's span"

        # Management actions are spans; a tick links to the one that last changed the row.
        await client.reminders.pause(ticker, "beat")
        await client.reminders.resume(ticker, "beat")
        resumed = _one(spans.get_finished_spans(), "reminders.resume", SpanKind.INTERNAL)
        paused = _one(spans.get_finished_spans(), "reminders.pause", SpanKind.INTERNAL)
        assert dict(paused.attributes or {})["orleanspy.audit.principal"] == "cluster-secret"
        assert dict(resumed.attributes or {})["orleanspy.audit.outcome"] == "ok"
        assert resumed.context is not None
        later = await _next_tick(spans, after=resumed.end_time or 0)
        assert [link.context.span_id for link in later.links] == [resumed.context.span_id]


async def _next_tick(spans: InMemorySpanExporter, *, after: int) -> ReadableSpan:
    """The first tick span that started after ``after`` (ns), waited for."""

    def ticks() -> list[ReadableSpan]:
        return [
            s for s in spans.get_finished_spans()
            if s.name == "test_tracing.Ticker tick" and (s.start_time or 0) > after
        ]  # fmt: skip

    await wait_for(lambda: bool(ticks()), timeout=20, what="a tick span")
    return min(ticks(), key=lambda s: s.start_time or 0)
