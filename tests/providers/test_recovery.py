"""Pure recovery decisions: adopt complete live keys, release orphans after the grace."""

from __future__ import annotations

import pytest

from controller.api.capacitypool import CapacityPool
from providers.base import AcquireRequest, ProvidedNode, TransientProviderError
from providers.recovery import RecoveryRunner, plan_recovery
from tests.providers.conftest import make_pool


def nodes(key: str, n: int) -> list[ProvidedNode]:
    return [ProvidedNode(name=f"{key}-{i}", provider_id=f"fake://{key}/{i}", pool="p", key=key)
            for i in range(n)]


def test_live_complete_keys_are_adopted_and_orphans_wait_for_the_grace() -> None:
    plan = plan_recovery(nodes("live", 2) + nodes("dead", 3), {"live": 2},
                         first_seen={}, now=100.0, grace_seconds=60)
    assert [n.name for n in plan.adopt["live"]] == ["live-0", "live-1"]
    assert plan.release == () and plan.waiting == {"dead": 60}
    assert plan.first_seen == {"dead": 100.0}

    later = plan_recovery(nodes("live", 2) + nodes("dead", 3), {"live": 2},
                          first_seen=plan.first_seen, now=160.0, grace_seconds=60)
    assert later.release == ("dead",) and later.first_seen == {}
    assert "no live request" in later.reasons["dead"]


def test_an_incomplete_live_key_is_released_after_the_grace() -> None:
    plan = plan_recovery(nodes("live", 1), {"live": 4}, first_seen={"live": 0.0}, now=30.0,
                         grace_seconds=60)
    assert plan.adopt == {} and plan.waiting == {"live": 30.0}
    assert "expects 4 nodes, found 1" in plan.reasons["live"]
    plan = plan_recovery(nodes("live", 1), {"live": 4}, first_seen={"live": 0.0}, now=60.0,
                         grace_seconds=60)
    assert plan.release == ("live",)


def test_unknown_expected_count_adopts_whatever_is_there() -> None:
    plan = plan_recovery(nodes("live", 3), {"live": None}, first_seen={}, now=0.0,
                         grace_seconds=0)
    assert len(plan.adopt["live"]) == 3 and plan.release == ()


def test_an_orphan_that_becomes_live_is_forgotten() -> None:
    plan = plan_recovery(nodes("k", 2), {"k": 2}, first_seen={"k": 0.0}, now=1000.0,
                         grace_seconds=60)
    assert "k" in plan.adopt and plan.first_seen == {} and plan.release == ()


def test_zero_grace_releases_at_once_and_negative_grace_is_refused() -> None:
    assert plan_recovery(nodes("x", 1), {}, first_seen={}, now=5.0,
                         grace_seconds=0).release == ("x",)
    with pytest.raises(ValueError):
        plan_recovery([], {}, first_seen={}, now=0.0, grace_seconds=-1)


class FlakyReleaseProvider:
    """Lists one orphan key until its nodes are gone; its first release fails after
    deleting them (like an AWS placement group still in use)."""

    name = "flaky"

    def __init__(self) -> None:
        self.nodes = nodes("dead", 2)
        self.releases: list[str] = []

    async def validate(self, pool: CapacityPool) -> None:
        return None

    async def acquire(self, request: AcquireRequest) -> list[ProvidedNode]:
        raise AssertionError("recovery never acquires")

    async def release(self, pool: CapacityPool, key: str) -> int:
        self.releases.append(key)
        deleted, self.nodes = len(self.nodes), []
        if len(self.releases) == 1:
            raise TransientProviderError("placement group still in use")
        return deleted

    async def list(self, pool: CapacityPool) -> list[ProvidedNode]:
        return list(self.nodes)


async def test_a_failed_release_is_retried_even_once_the_nodes_are_gone() -> None:
    provider = FlakyReleaseProvider()
    pool = make_pool("fake", {})
    runner = RecoveryRunner(provider, grace_seconds=0, clock=lambda: 0.0)
    first = await runner.sweep(pool, {})
    assert first.failed.keys() == {"dead"} and first.released == {}
    second = await runner.sweep(pool, {})
    assert second.released == {"dead": 0} and second.failed == {}
    third = await runner.sweep(pool, {})
    assert third.released == {} and provider.releases == ["dead", "dead"]
