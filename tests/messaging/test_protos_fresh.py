"""The committed generated code matches a fresh generation from the protos."""

from __future__ import annotations

from pathlib import Path

from orleanspy.messaging import protogen


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path / "_generated")
    committed = sorted(
        p.name for p in protogen.GENERATED_DIR.iterdir() if p.is_file() and p.suffix != ".pyc"
    )

    assert sorted(written) == committed, "run `python -m orleanspy.messaging.protogen`"
    stale = [
        name
        for name in written
        if (tmp_path / "_generated" / name).read_text()
        != (protogen.GENERATED_DIR / name).read_text()
    ]
    assert stale == [], (
        f"stale generated files {stale}: run `python -m orleanspy.messaging.protogen`"
    )


def test_generated_envelope_has_the_documented_fields() -> None:
    from orleanspy.messaging._generated import messages_pb2

    fields = {f.name: f.number for f in messages_pb2.Envelope.DESCRIPTOR.fields}
    assert {
        "id",
        "kind",
        "grain_type",
        "s",
        "i",
        "uuid",
        "method",
        "sender_silo",
        "sender_client",
        "target_silo",
        "correlation_id",
        "expires_at_ms",
        "forward_count",
        "status",
        "headers",
        "body",
    } == set(fields)
    assert [v.name for v in messages_pb2.Kind.DESCRIPTOR.values] == [
        "REQUEST",
        "RESPONSE",
        "ONE_WAY",
    ]
