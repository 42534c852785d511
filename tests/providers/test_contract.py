"""The Provider Protocol's promises, checked the same way for every provider.

Each harness wraps one provider with a backend the test controls (stock per domain, a
count of what exists in the "cloud"): AWS on moto with EC2 Fleet semantics, GCP on a local
Compute REST fake, the fake provider on the API sandbox. Keys are the controller's own
(:func:`controller.acquire.keys.acquisition_key`). To add a provider, write a harness
fixture returning a :class:`Harness` and append its name to ``HARNESSES``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from controller.acquire.keys import acquisition_key
from controller.api.capacitypool import CapacityPool
from controller.kube import KubeClient
from controller.kube.resources import NODES
from providers.base import AcquireRequest, CapacityUnavailable, Provider, ProviderConfigError
from providers.fake import PROVIDER_LABEL, FakeProvider
from tests.providers.conftest import AWS_ZONE, GCP_ZONE, ZONE_LABEL, GcpFake, MotoEc2, make_pool


@dataclass
class Harness:
    provider: Provider
    pool: CapacityPool
    domain: dict[str, str]
    set_stock: Callable[[int], None]
    cloud_count: Callable[[], Awaitable[int]]
    bad_parameters: dict[str, Any]

    def request(self, uid: str, count: int, attempt: int = 0) -> AcquireRequest:
        key = acquisition_key(uid, attempt, 0)
        return AcquireRequest(key=key, pool=self.pool, count=count, domain=self.domain,
                              owner=f"ns/{uid}", owner_uid=uid)


@pytest.fixture
def aws_moto_harness(moto_ec2: MotoEc2) -> Harness:
    def set_stock(n: int) -> None:
        moto_ec2.client.stock[AWS_ZONE] = n

    async def count() -> int:
        return len(moto_ec2.live_instances())

    return Harness(moto_ec2.provider(), moto_ec2.pool(), {ZONE_LABEL: AWS_ZONE}, set_stock,
                   count, {})


@pytest.fixture
def gcp_fake_harness(gcp_fake: GcpFake) -> Harness:
    def set_stock(n: int) -> None:
        gcp_fake.fake.stock[GCP_ZONE] = n

    async def count() -> int:
        return len(gcp_fake.fake.all_instances())

    return Harness(gcp_fake.provider(), gcp_fake.pool(compactPlacement=True),
                   {ZONE_LABEL: GCP_ZONE}, set_stock, count, {})


@pytest.fixture
def fake_harness(sandbox_kube: KubeClient) -> Harness:
    provider = FakeProvider(sandbox_kube, heartbeat_seconds=0)
    pool = make_pool("kind", {})
    domain = {ZONE_LABEL: "zone-a"}

    def set_stock(n: int) -> None:
        provider.set_stock(pool.metadata.name, domain, n)

    async def count() -> int:
        listing = await sandbox_kube.list(NODES, label_selector=f"{PROVIDER_LABEL}=kind")
        return len(listing.get("items") or [])

    return Harness(provider, pool, domain, set_stock, count, {"colour": "red"})


HARNESSES = ["aws_moto_harness", "gcp_fake_harness", "fake_harness"]


@pytest.fixture(params=HARNESSES)
def harness(request: pytest.FixtureRequest) -> Harness:
    value: Harness = request.getfixturevalue(request.param)
    return value


async def test_acquire_returns_exactly_n_distinct_nodes(harness: Harness) -> None:
    r = harness.request("uid-1", 4)
    nodes = await harness.provider.acquire(r)
    assert len(nodes) == 4
    assert len({n.name for n in nodes}) == 4 and len({n.provider_id for n in nodes}) == 4
    assert {n.key for n in nodes} == {r.key}
    assert {n.pool for n in nodes} == {harness.pool.metadata.name}
    assert all(n.labels[k] == v for n in nodes for k, v in harness.domain.items())
    assert await harness.cloud_count() == 4


async def test_shortfall_raises_and_leaves_nothing(harness: Harness) -> None:
    harness.set_stock(3)
    with pytest.raises(CapacityUnavailable):
        await harness.provider.acquire(harness.request("uid-1", 4))
    assert await harness.cloud_count() == 0
    assert await harness.provider.list(harness.pool) == []
    # Stock is still there for a gang that fits.
    assert len(await harness.provider.acquire(harness.request("uid-2", 3))) == 3


async def test_acquire_is_idempotent_per_key(harness: Harness) -> None:
    r = harness.request("uid-1", 3)
    first = await harness.provider.acquire(r)
    again = await harness.provider.acquire(r)
    assert [n.provider_id for n in again] == [n.provider_id for n in first]
    assert await harness.cloud_count() == 3


async def test_release_deletes_the_key_and_is_idempotent(harness: Harness) -> None:
    keep = harness.request("uid-keep", 2)
    drop = harness.request("uid-drop", 3)
    await harness.provider.acquire(keep)
    await harness.provider.acquire(drop)
    assert await harness.provider.release(harness.pool, drop.key) == 3
    assert await harness.provider.release(harness.pool, drop.key) == 0
    assert await harness.provider.release(harness.pool, "never-acquired") == 0
    assert await harness.cloud_count() == 2


async def test_list_finds_what_was_acquired(harness: Harness) -> None:
    a = await harness.provider.acquire(harness.request("uid-a", 2))
    b = await harness.provider.acquire(harness.request("uid-b", 1))
    listed = await harness.provider.list(harness.pool)
    assert {(n.provider_id, n.key, n.owner) for n in listed} == {
        (n.provider_id, n.key, n.owner) for n in a + b}


async def test_validate_rejects_bad_parameters(harness: Harness) -> None:
    bad = make_pool(harness.pool.spec.provider, harness.bad_parameters)
    with pytest.raises(ProviderConfigError):
        await harness.provider.validate(bad)
    await harness.provider.validate(harness.pool)
