"""The address a silo advertises: ``advertised_host``, else ``host``, else (a
wildcard bind) the local address the membership store is reached from."""

from __future__ import annotations

import pytest

from orleanspy import Silo, SiloOptions
from orleanspy.errors import ConfigurationError
from orleanspy.runtime.addresses import advertised_host


def test_advertised_host_wins_then_a_specific_bind_address() -> None:
    url = "redis://127.0.0.1:6379/0"
    assert advertised_host(SiloOptions(host="0.0.0.0", advertised_host="10.1.2.3",
                                       redis_url=url)) == "10.1.2.3"  # fmt: skip
    assert advertised_host(SiloOptions(host="127.0.0.5", redis_url=url)) == "127.0.0.5"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_bind_advertises_the_address_the_store_is_reached_from(wildcard: str) -> None:
    # The store is on loopback, so every peer is on this host: loopback it is.
    options = SiloOptions(host=wildcard, redis_url="redis://127.0.0.1:6379/0")
    assert advertised_host(options) == "127.0.0.1"
    assert Silo(options).address.host == "127.0.0.1"


def test_a_wildcard_bind_with_no_route_to_the_store_refuses_and_says_what_to_set() -> None:
    options = SiloOptions(host="0.0.0.0", redis_url="unix:///run/redis.sock")
    with pytest.raises(ConfigurationError, match=r"--advertise-host, ORLEANSPY_ADVERTISE_HOST"):
        advertised_host(options)
