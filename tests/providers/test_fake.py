"""The fake provider is a real provider: all or nothing, idempotent by key, findable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.acquire.groups import AcquisitionFailed, acquire_all
from controller.acquire.registration import OutsideDomain, register, registration
from controller.api.capacitypool import CapacityPool
from controller.api.node import Node
from controller.commands import objects
from controller.common.topology_defaults import UNREGISTERED_TAINT
from controller.kube import KubeClient
from controller.kube.resources import LEASES, NODES
from controller.state.bookings import Group
from providers.base import AcquireRequest, CapacityUnavailable, ProviderConfigError, QuotaExceeded
from providers.fake import FakeProvider

R1 = {objects.BLOCK: "b1", objects.RACK: "b1-r1"}
R2 = {objects.BLOCK: "b1", objects.RACK: "b1-r2"}


def pool(**parameters: Any) -> CapacityPool:
    return CapacityPool.model_validate(objects.gpu_pool("gpu", parameters=parameters))


def req(key: str, count: int, domain: dict[str, str] = R1, p: CapacityPool | None = None
        ) -> AcquireRequest:
    return AcquireRequest(key=key, pool=p or pool(), count=count, domain=domain,
                          owner="ns/gang", owner_uid="uid-1")


async def _nodes(kube: KubeClient) -> list[dict[str, Any]]:
    return list((await kube.list(NODES, label_selector="fake.muster.dev/pool=gpu"))["items"])


async def test_acquire_creates_nodes_from_the_template_in_the_domain(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    got = await provider.acquire(req("k1", 3))
    assert len(got) == 3
    nodes = await _nodes(kube)
    assert len(nodes) == 3
    node = nodes[0]
    labels = node["metadata"]["labels"]
    # As a kubelet registers it: where the cloud put it, kubelet's own labels, the startup
    # taint of its user data; none of Muster's labels or the pool template's taints.
    assert labels[objects.RACK] == "b1-r1" and labels["kubernetes.io/os"] == "linux"
    assert not {k for k in labels if k.startswith("muster.dev/")} - {"muster.dev/provider"}
    assert node["spec"]["providerID"].startswith("kind://gpu/k1/")
    assert node["spec"]["taints"] == [{"key": UNREGISTERED_TAINT, "effect": "NoExecute"}]
    assert node["status"]["allocatable"][objects.GPU] == "8"
    assert any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"]["conditions"])
    assert {n.provider_id for n in got} == {n["spec"]["providerID"] for n in nodes}


async def test_registration_makes_the_node_the_one_muster_planned(kube: KubeClient) -> None:
    """Muster's registration writes pool, acquisition, owner and the template's labels and
    taints and lifts the startup taint; a second pass finds nothing to do; a node that
    registered in another rack than planned is refused."""
    provider = FakeProvider(kube)
    got = await provider.acquire(req("k1", 1))
    body = await kube.get(NODES, got[0].name)
    group = Group("k1", "gpu", R1, 1, (got[0].name,), (got[0].provider_id,))
    patch = registration(Node.model_validate(body), pool(), group, owner="ns/gang",
                         owner_uid="uid-1")
    assert isinstance(patch, dict)
    assert await register(kube, got[0].name, patch) is not None
    after = await kube.get(NODES, got[0].name)
    labels = after["metadata"]["labels"]
    assert labels["muster.dev/pool"] == "gpu" and labels["muster.dev/acquisition-key"] == "k1"
    assert labels["muster.dev/owner-uid"] == "uid-1"
    assert after["spec"]["taints"] == [objects.GPU_TAINT]
    node = Node.model_validate(after)
    assert node.settled
    assert registration(node, pool(), group, owner="ns/gang", owner_uid="uid-1") is None
    # A stale write (the node changed since it was read) is refused, not applied blindly.
    assert await register(kube, got[0].name, patch) is None
    elsewhere = Group("k1", "gpu", R2, 1, (got[0].name,), (got[0].provider_id,))
    outside = registration(node, pool(), elsewhere, owner="ns/gang", owner_uid="uid-1")
    assert isinstance(outside, OutsideDomain) and outside.observed == "b1-r1"


async def test_same_key_returns_the_same_nodes(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    first = await provider.acquire(req("k1", 2))
    again = await provider.acquire(req("k1", 2))
    assert sorted(n.name for n in first) == sorted(n.name for n in again)
    assert len(await _nodes(kube)) == 2
    assert [c.outcome for c in provider.calls if c.op == "acquire"] == ["ok", "reused"]


async def test_concurrent_calls_with_one_key_create_once(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    await asyncio.gather(*(provider.acquire(req("k1", 4)) for _ in range(3)))
    assert len(await _nodes(kube)) == 4


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        pytest.param(lambda p: p.grant_next(2), CapacityUnavailable, id="grant-2-of-4"),
        pytest.param(lambda p: p.fail_next(QuotaExceeded("vCPU quota")), QuotaExceeded,
                     id="injected-quota"),
        pytest.param(lambda p: p.set_stock("gpu", R1, 3), CapacityUnavailable,
                     id="stock-out-in-domain"),
    ],
)
async def test_a_shortfall_leaves_no_node_behind(
    kube: KubeClient, setup: Any, error: type[Exception]
) -> None:
    provider = FakeProvider(kube)
    setup(provider)
    with pytest.raises(error):
        await provider.acquire(req("k1", 4))
    assert await _nodes(kube) == []


async def test_stock_is_per_domain_and_counts_other_keys(kube: KubeClient) -> None:
    p = pool(stock=[{"labels": R1, "nodes": 3}])
    provider = FakeProvider(kube)
    await provider.acquire(req("k1", 2, p=p))
    with pytest.raises(CapacityUnavailable) as err:
        await provider.acquire(req("k2", 2, p=p))
    assert err.value.available == 1
    await provider.acquire(req("k3", 2, R2, p=p))
    assert len(await _nodes(kube)) == 4


async def test_release_deletes_the_key_and_is_idempotent(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    await provider.acquire(req("k1", 2))
    await provider.acquire(req("k2", 1))
    assert await provider.release(pool(), "k1") == 2
    assert await provider.release(pool(), "k1") == 0
    assert [n.key for n in await provider.list(pool())] == ["k2"]


async def test_invalid_pool_parameters_are_named(kube: KubeClient) -> None:
    with pytest.raises(ProviderConfigError, match="colour"):
        await FakeProvider(kube).validate(pool(colour="blue"))
    with pytest.raises(ProviderConfigError, match="defaultStock"):
        await FakeProvider(kube).validate(pool(defaultStock=-1))


async def test_heartbeat_keeps_a_lease_per_node(kube: KubeClient) -> None:
    provider = FakeProvider(kube, heartbeat_seconds=0.05)
    got = await provider.acquire(req("k1", 1))
    await provider.start()
    try:
        for _ in range(50):
            lease = await kube.get_or_none(LEASES, got[0].name, namespace="kube-node-lease")
            if lease is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await provider.stop()
    assert lease is not None and lease["spec"]["holderIdentity"] == got[0].name


async def test_all_or_nothing_across_groups(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    provider.set_stock("gpu", R2, 1)
    groups = [Group("ka", "gpu", R1, 3), Group("kb", "gpu", R2, 2)]
    with pytest.raises(AcquisitionFailed) as err:
        await acquire_all(groups, owner="ns/g", owner_uid="u", pools={"gpu": pool()},
                          provider_for=lambda _: provider)
    assert err.value.retryable and "1 of 2" in str(err.value)
    assert await _nodes(kube) == []


async def test_overlapping_acquisitions_never_grant_more_than_the_stock(
    kube: KubeClient,
) -> None:
    provider = FakeProvider(kube)
    provider.set_stock("gpu", R1, 3)
    results = await asyncio.gather(
        *(provider.acquire(req(f"k{i}", 2)) for i in range(4)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert len(granted) == 1, results
    assert all(isinstance(r, CapacityUnavailable) for r in results if r not in granted)
    assert len(await _nodes(kube)) == 2


async def test_a_node_carries_the_labels_the_plan_saw(kube: KubeClient) -> None:
    """One definition (controller.inputs.node_labels) for the fake provider's Nodes and the fit
    engine's picture of a new node: once Muster registered it, every label of the picture
    is on the Node, and the Node's well-known kubelet labels are in the picture (the
    hostname aside, unknown)."""
    from controller.acquire.registration import registration
    from controller.api.node import Node
    from controller.common.topology_defaults import HOSTNAME
    from controller.inputs.node_labels import KUBELET_KEYS
    from controller.inputs.snapshot import pool_state
    from controller.state.bookings import Group

    p = pool()
    await FakeProvider(kube).acquire(req("k9", 1, p=p))
    node = (await _nodes(kube))[0]
    group = Group(key="k9", pool=p.metadata.name, domain=R1, count=1)
    patch = registration(Node.model_validate(node), p, group, owner="", owner_uid="")
    assert isinstance(patch, dict), patch
    labels = {**node["metadata"]["labels"], **patch["metadata"].get("labels", {})}
    picture = {**pool_state(p, []).labels, **R1}
    assert picture.items() <= labels.items()
    assert {k for k in KUBELET_KEYS if k != HOSTNAME} <= picture.keys()
    assert labels[HOSTNAME] == node["metadata"]["name"]
    assert node["status"]["nodeInfo"]["architecture"] == labels["kubernetes.io/arch"]


async def test_a_reservation_is_shared_by_the_pool_s_domains_and_never_used_partially(
    kube: KubeClient,
) -> None:
    p = pool(reservation={"id": "res-1", "nodes": 5})
    provider = FakeProvider(kube)
    await provider.validate(p)
    await provider.acquire(req("k1", 3, p=p))
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req("k2", 3, R2, p=p))  # 2 left: not 2 of 3
    assert len(await _nodes(kube)) == 3
    [figures] = await provider.reservations(p)
    assert (figures.id, figures.reserved, figures.used, figures.free) == ("res-1", 5, 3, 2)
    await provider.acquire(req("k3", 2, R2, p=p))
    assert (await provider.reservations(p))[0].free == 0
    assert await provider.reservations(pool()) == []


async def test_a_reservation_outside_its_window_grants_nothing(kube: KubeClient) -> None:
    provider = FakeProvider(kube)
    ended = pool(reservation={"id": "block-1", "nodes": 8, "start": "2020-01-01T00:00:00Z",
                              "end": "2020-01-08T00:00:00Z"})
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req("k1", 1, p=ended))
    [figures] = await provider.reservations(ended)
    assert figures.end is not None and figures.end.year == 2020
    assert await _nodes(kube) == []


@pytest.mark.parametrize("value", [
    {"id": "r"}, {"id": "", "nodes": 1}, {"id": "r", "nodes": -1}, {"id": "r", "nodes": 1,
                                                                     "colour": "x"},
    {"id": "r", "nodes": 1, "end": "tomorrow"}, {"id": "r", "nodes": 1, "end": "2026-12-01"},
])
async def test_bad_reservation_parameters_are_named(kube: KubeClient, value: Any) -> None:
    with pytest.raises(ProviderConfigError, match=r"parameters\.reservation"):
        await FakeProvider(kube).validate(pool(reservation=value))
