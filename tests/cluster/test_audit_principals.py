"""Who the audit log says acted comes from what the transport authenticated, on real
gRPC between real silos: a client certificate's subject under mutual TLS, the
cluster secret's holder, ``anonymous`` on a cluster with neither; a principal a
client writes into its message is dropped by the gateway. A trace context from a
peer silo is parsed with limits too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from orleanspy import (
    AuditQuery,
    Grain,
    GrainId,
    MessagingOptions,
    Remindable,
    SiloOptions,
    TickStatus,
    TlsOptions,
    tracing,
)
from orleanspy.messaging.message import PRINCIPAL_HEADER, Message, ResponseStatus
from orleanspy.remindable.management import MANAGEMENT_TYPE
from orleanspy.reminders.audit import acting_as
from orleanspy.serialization import pack
from orleanspy.testing.cluster import FAST_MEMBERSHIP, InProcessCluster, wait_for
from tests.certs import issue
from tests.cluster.test_faults import RawGateway

pytestmark = pytest.mark.slow


class Watched(Grain, Remindable, type_name="test_audit_principals.Watched"):
    async def start(self) -> None:
        await self.register_or_update_reminder("beat", due=3600, period=3600)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass


class Peer(Grain, type_name="test_audit_principals.Peer"):
    async def echo(self, text: str) -> str:
        return text


async def _pause_and_read(cluster: InProcessCluster, **client: object) -> str:
    c = await cluster.client(**client)
    grain = c.get_grain(Watched, "w")
    await grain.start()
    await c.reminders.pause(grain, "beat")
    (record,) = await c.reminders.audit(AuditQuery(action="pause"))
    assert record.after is not None and record.after.paused
    return record.principal


async def test_a_client_certificate_is_the_principal_under_mutual_tls(
    redis_url: str, tmp_path: Path
) -> None:
    cert, key, ca = issue(tmp_path, dns_name="localhost")
    tls = MessagingOptions(tls=TlsOptions(cert_file=str(cert), key_file=str(key),
                                          ca_file=str(ca), server_name="localhost"))  # fmt: skip
    async with InProcessCluster(redis_url, size=1, messaging=tls) as cluster:
        assert await _pause_and_read(cluster) == "tls:CN=silo"


async def test_the_cluster_secret_holder_is_a_named_principal(redis_url: str) -> None:
    secret = MessagingOptions(cluster_secret="principal-test-secret")
    async with InProcessCluster(redis_url, size=1, messaging=secret) as cluster:
        assert await _pause_and_read(cluster) == "cluster-secret"


async def test_a_principal_a_client_claims_is_dropped(redis_url: str) -> None:
    options = SiloOptions(allow_client_management=True)
    async with InProcessCluster(redis_url, size=1, options=options) as cluster:
        silo = cluster.silos[0]
        assert await _pause_and_read(cluster) == "anonymous"
        assert silo.gateway_port is not None
        async with RawGateway(f"127.0.0.1:{silo.gateway_port}") as raw:
            claim = Message.request(
                GrainId(MANAGEMENT_TYPE, ""), "resume",
                pack(((GrainId("test_audit_principals.Watched", "w"), "beat"), {})),
                one_way=False, expires_at_ms=int(time.time() * 1000) + 30_000,
            )  # fmt: skip
            claim.headers[PRINCIPAL_HEADER] = "dashboard:admin"
            answer = await raw.call(claim)
            assert answer.status is ResponseStatus.OK
        c = await cluster.client()
        (record,) = await c.reminders.audit(AuditQuery(action="resume"))
        assert record.principal == "anonymous", "the gateway must not take the client's word"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        tracing.disable()
        provider.shutdown()


async def test_a_hostile_trace_context_from_a_peer_silo_is_dropped(
    spans: InMemorySpanExporter, redis_url: str
) -> None:
    async with InProcessCluster(redis_url, size=0, membership=FAST_MEMBERSHIP) as cluster:
        sender = await cluster.add(grain_types=())
        host = await cluster.add(grain_types=(Peer,))
        await cluster.refresh_all()
        assert sender.transport is not None
        hostile = {
            "bad": {"traceparent": "00-" + "f" * 31 + "-" + "e" * 16 + "-01"},
            "huge": {"traceparent": "cc-" + "a" * 32 + "-" + "b" * 16 + "-01-" + "z" * 50_000},
            "state": {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
                      "tracestate": "k=" + "v" * 5000},
        }  # fmt: skip
        for key, headers in hostile.items():
            msg = Message.request(
                GrainId("test_audit_principals.Peer", key), "echo", pack(((key,), {})),
                one_way=True, expires_at_ms=int(time.time() * 1000) + 30_000,
                sender_silo=sender.address,
            )  # fmt: skip
            msg.headers.update(headers)
            sender.transport.send(host.address, msg)

        def turns() -> dict[str, object]:
            return {
                str(dict(s.attributes or {})["orleanspy.grain"]).rsplit(":", 1)[1]: s
                for s in spans.get_finished_spans()
                if s.name == "test_audit_principals.Peer/echo" and s.kind is SpanKind.SERVER
            }

        await wait_for(lambda: set(hostile) <= set(turns()), timeout=10, what="the peer's turns")
        served = turns()
        assert served["bad"].parent is None  # type: ignore[attr-defined]
        assert served["huge"].parent is None  # type: ignore[attr-defined]
        state = served["state"]
        assert state.parent is not None and state.parent.span_id == 0xBBBBBBBBBBBBBBBB  # type: ignore[attr-defined]
        assert not state.context.trace_state  # type: ignore[attr-defined]
        # The silo still serves.
        c = await cluster.client()
        assert await c.get_grain(Peer, "after").echo("ok") == "ok"


async def test_a_silo_passes_its_callers_principal_to_the_management_grain_on_another(
    redis_url: str,
) -> None:
    """One management activation serves the cluster: at least one of two silos reaches it
    by a message, which must carry the principal its caller acts for."""
    secret = MessagingOptions(cluster_secret="principal-test-secret")
    async with InProcessCluster(redis_url, size=2, messaging=secret) as cluster:
        first, second = cluster.silos
        grain = first.client.get_grain(Watched, "w")
        await grain.start()
        with acting_as("dashboard:first"):
            await first.client.reminders.pause(grain, "beat")
        with acting_as("dashboard:second"):
            await second.client.reminders.resume(grain, "beat")
        await first.client.reminders.set_priority(grain, "beat", 5)  # no principal: local
        records = await second.client.reminders.audit(AuditQuery())
        by_action = {r.action: r.principal for r in records}
        assert by_action == {
            "pause": "dashboard:first", "resume": "dashboard:second", "set_priority": "local",
        }  # fmt: skip
        hosts = [
            s.name for s in cluster.silos
            if any(g.type_name == MANAGEMENT_TYPE for g in s._dispatcher.catalog.activations_by_id)
        ]  # fmt: skip
        assert len(hosts) == 1, f"one management activation, found on {hosts}"
