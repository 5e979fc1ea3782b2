"""A throwaway certificate authority and one silo certificate, made with the openssl
command line tool, for the TLS tests.

The CA carries ``basicConstraints`` and ``keyUsage`` and the leaf its key identifiers
and ``extendedKeyUsage``: from Python 3.13 on, ``ssl.create_default_context`` verifies
with ``VERIFY_X509_STRICT``, which rejects a CA without a key usage extension (the
certificates a bare ``openssl req -x509`` makes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

_CA_EXTENSIONS = (
    "basicConstraints=critical,CA:TRUE",
    "keyUsage=critical,keyCertSign,cRLSign",
    "subjectKeyIdentifier=hash",
)


def issue(directory: Path, *, dns_name: str) -> tuple[Path, Path, Path]:
    """``(cert, key, ca)`` in ``directory``: a CA valid for two days and a certificate
    it signed for ``dns_name`` and ``127.0.0.1``, usable as server and as client."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need the openssl command line tool")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    ca_ext = [arg for ext in _CA_EXTENSIONS for arg in ("-addext", ext)]
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        *ca_ext, "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=silo", "-keyout", "silo.key",
        "-out", "silo.csr")  # fmt: skip
    (directory / "ext.cnf").write_text(
        f"subjectAltName=DNS:{dns_name},IP:127.0.0.1\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    run("x509", "-req", "-in", "silo.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "silo.pem")  # fmt: skip
    return directory / "silo.pem", directory / "silo.key", directory / "ca.pem"
