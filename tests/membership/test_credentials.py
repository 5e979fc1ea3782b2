"""The credentials verifier: what it is derived from, and which rows it is checked against."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy.identity import SiloAddress
from orleanspy.membership.credentials import (
    CredentialsMismatchError,
    check_verifier,
    cluster_verifier,
)
from orleanspy.membership.model import (
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
    TableVersion,
)
from orleanspy.options import MembershipOptions, MessagingOptions, TlsOptions

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ME = SiloAddress("10.0.0.9", 11111, 500)
OPTIONS = MembershipOptions()


def verifier(secret: str | None = None, tls: TlsOptions | None = None, cluster: str = "dev") -> str:
    return cluster_verifier(
        MessagingOptions(cluster_secret=secret, tls=tls), service_id="svc", cluster_id=cluster
    )


def pem(path: Path, body: bytes) -> str:
    """A PEM file around ``body`` (the verifier hashes the DER bytes it encodes)."""
    text = base64.encodebytes(body).decode()
    path.write_text(f"-----BEGIN CERTIFICATE-----\n{text}-----END CERTIFICATE-----\n")
    return str(path)


def tls(tmp_path: Path, ca: bytes) -> TlsOptions:
    return TlsOptions(
        ca_file=pem(tmp_path / f"ca-{ca.hex()}.pem", ca),
        cert_file=pem(tmp_path / "cert.pem", b"cert"),
        key_file=pem(tmp_path / "key.pem", b"key"),
    )


def row(
    silo: SiloAddress,
    verifier: str | None,
    status: SiloStatus = SiloStatus.ACTIVE,
    alive: datetime = NOW,
) -> MembershipEntry:
    return MembershipEntry(
        silo=silo, status=status, name="m", start_time=alive, i_am_alive=alive, verifier=verifier
    )


def snapshot(*rows: MembershipEntry) -> MembershipSnapshot:
    return MembershipSnapshot({r.silo: (r, "1") for r in rows}, TableVersion(1, "1"))


def test_the_verifier_is_derived_from_the_secret_and_never_holds_it() -> None:
    secret = "correct horse battery staple"
    v = verifier(secret)
    assert v == verifier(secret)
    assert v != verifier("another secret")
    assert v != verifier(secret, cluster="other")  # salted per cluster
    assert secret not in v
    assert verifier(None) == "v1;secret=none;ca=none"


def test_the_verifier_names_the_tls_trust_root(tmp_path: Path) -> None:
    one, two = tls(tmp_path, b"ca-one"), tls(tmp_path, b"ca-two")
    assert verifier(tls=one) == verifier(tls=one)
    assert verifier(tls=one) != verifier(tls=two)
    assert verifier(tls=one) != verifier()


@pytest.mark.parametrize(
    ("mine", "theirs", "says"),
    [
        (None, "s", "this silo has no cluster secret and the cluster requires one"),
        ("s", None, "this silo has a cluster secret and the cluster runs without one"),
        ("s", "t", "cluster secret (MessagingOptions.cluster_secret, --secret) differs"),
    ],
)
def test_a_secret_that_differs_from_a_live_members_is_refused(
    mine: str | None, theirs: str | None, says: str
) -> None:
    member = SiloAddress("10.0.0.1", 11111, 1)
    snap = snapshot(row(member, verifier(theirs)))
    with pytest.raises(CredentialsMismatchError, match="refusing to join") as caught:
        check_verifier(verifier(mine), snap, ME, NOW, OPTIONS)
    assert says in str(caught.value)
    assert str(member) in str(caught.value)


def test_a_trust_root_that_differs_is_refused(tmp_path: Path) -> None:
    member = SiloAddress("10.0.0.1", 11111, 1)
    snap = snapshot(row(member, verifier(tls=tls(tmp_path, b"ca-one"))))
    with pytest.raises(CredentialsMismatchError, match="TLS trust root"):
        check_verifier(verifier(tls=tls(tmp_path, b"ca-two")), snap, ME, NOW, OPTIONS)
    with pytest.raises(CredentialsMismatchError, match="TLS setting"):
        check_verifier(verifier(), snap, ME, NOW, OPTIONS)


def test_only_live_members_of_other_runs_are_compared() -> None:
    other = verifier("other")
    stale = NOW - OPTIONS.i_am_alive_staleness - timedelta(seconds=1)
    snap = snapshot(
        row(SiloAddress("10.0.0.1", 1, 1), other, SiloStatus.DEAD),
        row(SiloAddress("10.0.0.2", 1, 1), other, alive=stale),
        row(SiloAddress("10.0.0.3", 1, 1), None),  # an older version's row says nothing
        row(SiloAddress(ME.host, ME.port, ME.generation - 1), other),  # my earlier run
        row(SiloAddress("10.0.0.4", 1, 1), verifier("mine")),
    )
    check_verifier(verifier("mine"), snap, ME, NOW, OPTIONS)
    check_verifier(None, snapshot(row(SiloAddress("10.0.0.5", 1, 1), other)), ME, NOW, OPTIONS)
