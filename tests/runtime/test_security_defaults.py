"""Security defaults: who may change reminders from outside, and the warning a silo
gives when its ports are open to other hosts without authentication."""

from __future__ import annotations

import logging

import pytest

from orleanspy import Grain, MessagingOptions, Remindable, SiloOptions, TickStatus
from orleanspy.errors import MessageRejectedError
from orleanspy.identity import GrainId
from orleanspy.runtime.addresses import warn_if_exposed as _warn_if_exposed
from orleanspy.testing.cluster import InProcessCluster


class GuardedGrain(Grain, Remindable, type_name="security.Guarded"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        return None

    async def arm(self) -> None:
        await self.register_or_update_reminder("r", due=3600.0, period=3600.0)


def test_client_management_is_allowed_only_with_authentication_by_default() -> None:
    assert SiloOptions().client_management_allowed is False
    secret = MessagingOptions(cluster_secret="s")
    assert SiloOptions(messaging=secret).client_management_allowed is True
    assert SiloOptions(allow_client_management=True).client_management_allowed is True
    denied = SiloOptions(messaging=secret, allow_client_management=False)
    assert denied.client_management_allowed is False


@pytest.mark.parametrize(
    ("host", "secret", "warned"),
    [
        ("0.0.0.0", None, True),
        ("10.1.2.3", None, True),
        ("0.0.0.0", "s", False),
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
    ],
)
def test_exposed_silo_without_authentication_warns(
    caplog: pytest.LogCaptureFixture, host: str, secret: str | None, warned: bool
) -> None:
    options = SiloOptions(host=host, messaging=MessagingOptions(cluster_secret=secret))
    with caplog.at_level(logging.WARNING, logger="orleanspy.runtime.silo"):
        _warn_if_exposed(options)
    assert any("SECURITY" in r.getMessage() for r in caplog.records) is warned


@pytest.mark.parametrize("secret", [None, "s3cret"])
async def test_clients_change_reminders_only_when_allowed(
    redis_url: str, secret: str | None
) -> None:
    messaging = MessagingOptions(cluster_secret=secret)
    async with InProcessCluster(redis_url, size=1, messaging=messaging) as cluster:
        client = await cluster.client()
        await client.get_grain(GuardedGrain, "g").arm()
        gid = GrainId("security.Guarded", "g")
        assert [r.name for r in await client.reminders.list_for_grain(gid)] == ["r"]
        if secret is None:
            with pytest.raises(MessageRejectedError, match="allow_client_management"):
                await client.reminders.delete(gid, "r")
            assert len(await client.reminders.list_for_grain(gid)) == 1
            # Inside the cluster nothing is restricted.
            assert await cluster.silos[0].client.reminders.delete(gid, "r") is True
        else:
            assert await client.reminders.delete(gid, "r") is True
        assert await client.reminders.list_for_grain(gid) == []
