"""With the cluster's TLS, the dashboard serves HTTPS and admits only clients with a
certificate signed by the cluster's CA (so it may listen off loopback without a token)."""

from __future__ import annotations

import ssl

import httpx
import pytest

from orleanspy import Silo, SiloOptions
from orleanspy.options import MessagingOptions, TlsOptions
from tests.certs import issue


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    cert, key, ca = issue(tmp_path_factory.mktemp("dashtls"), dns_name="localhost")
    return str(cert), str(key), str(ca)


async def test_tls_dashboard_requires_a_client_certificate(tls_files: tuple[str, str, str]) -> None:
    cert, key, ca = tls_files
    tls = TlsOptions(cert_file=cert, key_file=key, ca_file=ca)
    # Off loopback, TLS stands in for the token.
    SiloOptions(dashboard_port=0, dashboard_host="0.0.0.0", messaging=MessagingOptions(tls=tls))
    options = SiloOptions(dashboard_port=0, messaging=MessagingOptions(tls=tls))
    async with Silo.local(options) as silo:
        url = f"https://127.0.0.1:{silo.dashboard_port}/api/cluster"
        with_cert = ssl.create_default_context(cafile=ca)
        with_cert.load_cert_chain(cert, key)
        async with httpx.AsyncClient(verify=with_cert) as client:
            r = await client.get(url)
            assert r.status_code == 200 and r.json()["silos"]
        without = ssl.create_default_context(cafile=ca)
        async with httpx.AsyncClient(verify=without) as client:
            with pytest.raises(httpx.HTTPError):
                await client.get(url)
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
                await client.get(url.replace("https", "http"))
