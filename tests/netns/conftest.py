"""The network fault suite's fixture: a bridge and test hosts of its own, removed
after each test even when it failed; skipped where namespaces cannot be made."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.needs import missing
from tests.netns.hosts import TestNet, unavailable

# The driver forks silos, Redis and `ip` while the session may hold gRPC state
# from other tests; grpcio's fork handlers crashed some children that way.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"


@pytest.fixture
def make_net(tmp_path: Path) -> Iterator[Callable[[int], TestNet]]:
    """``make_net(size)``: a ``TestNet`` of ``size`` hosts, closed after the test."""
    reason = unavailable()
    if reason is not None:
        missing("netns", reason)
    nets: list[TestNet] = []

    def make(size: int) -> TestNet:
        net = TestNet(tmp_path, size)
        nets.append(net)
        return net

    try:
        yield make
    finally:
        for net in nets:
            net.close()
