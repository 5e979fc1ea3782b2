"""Credentials checked before joining: the verifier each membership row carries.

A silo's verifier is derived from what it will present to its peers: the
cluster secret (``MessagingOptions.cluster_secret``) and the TLS trust root
(``TlsOptions.ca_file``). It never holds the secret: the secret part is a
PBKDF2-HMAC-SHA256 of the secret (200,000 rounds, salted with the service and
cluster ids), so reading the table does not reveal it and guessing it costs
as much per guess as for any stored password. The TLS part is the SHA-256 of
the CA certificate. Format: ``v1;secret=<hex|none>;ca=<hex|none>``.

Before it writes Joining, a silo compares its verifier with that of every
live member (Joining, Active or ShuttingDown, heartbeat not stale, not an
earlier incarnation of itself: ``agreement.live_members``) and refuses to
start if any differs, naming which part and which member. Rows without a
verifier (written by an older version) are not compared. A mis-deployed silo
so never writes a row, takes ranges, votes or ticks (docs/decisions.md,
"Credentials checked before joining"). The ring mode is checked the same way
(``membership.agreement``).
"""

from __future__ import annotations

import hashlib
import ssl
from datetime import datetime

from orleanspy.errors import ConfigurationError
from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import live_members
from orleanspy.membership.model import MembershipSnapshot
from orleanspy.options import MembershipOptions, MessagingOptions

__all__ = ["CredentialsMismatchError", "check_verifier", "cluster_verifier"]

_ROUNDS = 200_000
_VERSION = "v1"


class CredentialsMismatchError(ConfigurationError):
    """This silo's cluster secret or TLS trust root is not the cluster's."""


def cluster_verifier(messaging: MessagingOptions, *, service_id: str, cluster_id: str) -> str:
    """The verifier of ``messaging``'s credentials for one cluster (see the module
    docstring). Reads the CA file when TLS is set."""
    secret = "none"
    if messaging.cluster_secret is not None:
        salt = f"orleanspy-cluster-verifier|{service_id}|{cluster_id}".encode()
        digest = hashlib.pbkdf2_hmac("sha256", messaging.cluster_secret.encode(), salt, _ROUNDS)
        secret = digest.hex()[:32]
    ca = "none"
    if messaging.tls is not None:
        with open(messaging.tls.ca_file, encoding="ascii", errors="replace") as f:
            pem = f.read()
        try:
            der = ssl.PEM_cert_to_DER_cert(pem)
        except ValueError:
            der = pem.encode()
        ca = hashlib.sha256(der).hexdigest()[:32]
    return f"{_VERSION};secret={secret};ca={ca}"


def _parts(verifier: str) -> dict[str, str]:
    out = {}
    for item in verifier.split(";")[1:]:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def check_verifier(
    mine: str | None,
    snapshot: MembershipSnapshot,
    me: SiloAddress,
    now: datetime,
    options: MembershipOptions,
) -> None:
    """Raise ``CredentialsMismatchError`` if a live member's row carries another
    verifier than ``mine`` (``None``: nothing to check)."""
    if mine is None:
        return
    for silo, entry in live_members(snapshot, me, now, options):
        theirs = entry.verifier
        if theirs is None or theirs == mine:
            continue
        a, b = _parts(mine), _parts(theirs)
        if a.get("secret") != b.get("secret"):
            what = (
                "this silo's cluster secret (MessagingOptions.cluster_secret, --secret) "
                "differs from the cluster's"
            )
            if a.get("secret") == "none":
                what = "this silo has no cluster secret and the cluster requires one"
            elif b.get("secret") == "none":
                what = "this silo has a cluster secret and the cluster runs without one"
        elif a.get("ca") != b.get("ca"):
            what = (
                "this silo's TLS trust root (TlsOptions.ca_file) differs from the cluster's"
                if a.get("ca") != "none" and b.get("ca") != "none"
                else "this silo's TLS setting (on or off) differs from the cluster's"
            )
        else:
            what = "this silo's credentials differ from the cluster's (another verifier format)"
        raise CredentialsMismatchError(
            f"refusing to join: {what} (member {silo}, {entry.status.name}); nothing was "
            "written to the membership table. Start it with the cluster's credentials."
        )
