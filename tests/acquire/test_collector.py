"""The collector releases what no booking protects: orphans after the grace period, idle
gangs after the TTL, and finishes a release that failed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.acquire.collector import Collector
from controller.acquire.providers import ProviderSet
from controller.acquire.recovery import GroupView, Seen, decide
from controller.api.capacitypool import CapacityPool
from controller.commands import objects
from controller.common.clock import ManualClock
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS
from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION, Phase
from controller.state.bookings import Booking, Group
from controller.state.cache import ClusterState
from controller.state.object_store import CONSUME_ANNOTATION
from providers.base import AcquireRequest, ProvidedNode, TransientProviderError
from providers.fake import FakeProvider
from providers.registry import ProviderContext
from tests.cluster_objects import plan_on

R1 = {objects.BLOCK: "b1", objects.RACK: "b1-r1"}


def _request(name: str, uid: str, phase: Phase, key: str) -> dict[str, Any]:
    booking = Booking(plan_on([], new=1), attempt=1, groups=(Group(key, "gpu", R1, 1),))
    return {
        "metadata": {
            "name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1",
            "annotations": {PHASE_ANNOTATION: phase, PLAN_ANNOTATION: booking.to_annotation()},
        },
        "spec": {"provisioningClassName": "atomic-provisioning.muster.dev", "podSets": []},
    }


def _pod(name: str, node: str, request: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns",
                     "annotations": {CONSUME_ANNOTATION: request}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


GRACE = 60


async def test_orphans_go_after_the_grace_bookings_stay_idle_gangs_go_after_the_ttl(
    kube: KubeClient,
) -> None:
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    provider = FakeProvider(kube)

    async def acquire(key: str, uid: str) -> str:
        got = await provider.acquire(AcquireRequest(key, pool, 1, R1, "ns/x", uid))
        return got[0].name

    await acquire("orphan-1-0", "gone-uid")
    await acquire("booked-1-0", "uid-b")
    used = await acquire("used-1-0", "uid-u")

    clock = ManualClock()
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    state.upsert_request(_request("b", "uid-b", Phase.BOOKED, "booked-1-0"))
    state.upsert_request(_request("u", "uid-u", Phase.ENDED, "used-1-0"))
    state.upsert_pod(_pod("p0", used, "u"))
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": provider})
    collector = Collector(
        state=state, providers=providers, idle_ttl=300, grace=GRACE, now=clock.now,
        in_flight=lambda key: False,
    )

    assert await collector.run_once() == []  # the orphan waits out the grace
    await clock.advance(GRACE)
    first = await collector.run_once()
    assert [(r.key, r.nodes) for r in first] == [("orphan-1-0", 1)]

    state.delete_pod("ns/p0")
    assert await collector.run_once() == []  # idle, but not for 300 s yet
    await clock.advance(299)
    assert await collector.run_once() == []
    await clock.advance(1)
    assert [r.key for r in await collector.run_once()] == ["used-1-0"]
    assert sorted(n.key for n in await provider.list(pool)) == ["booked-1-0"]


@pytest.mark.parametrize("grace", [GRACE, 0], ids=["with-grace", "without-grace"])
async def test_a_plan_the_cache_has_not_shown_yet_keeps_its_nodes_within_the_grace(
    kube: KubeClient, grace: float,
) -> None:
    """Crash recovery: a restarted controller (or a new leader) lists the pool before its
    cache shows the plan that recorded a key, whose nodes the provider already launched.
    Within the grace those nodes stay, and once the plan shows up they are held for good;
    a true orphan goes after the grace. Without a grace (``without-grace``: what the
    collector did before) the live request's nodes would be released at the first sweep."""
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    provider = FakeProvider(kube)
    await provider.acquire(AcquireRequest("w-uid-1-0", pool, 2, R1, "ns/w", "w-uid"))
    await provider.acquire(AcquireRequest("gone-uid-1-0", pool, 1, R1, "ns/gone", "gone-uid"))

    clock = ManualClock()
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": provider})
    collector = Collector(state=state, providers=providers, idle_ttl=300, grace=grace,
                          now=clock.now, in_flight=lambda key: False)

    first = {r.key for r in await collector.run_once()}
    if not grace:
        assert first == {"w-uid-1-0", "gone-uid-1-0"}  # a live request's nodes lost
        return
    assert first == set()
    await clock.advance(GRACE - 1)
    assert await collector.run_once() == []
    state.upsert_request(_request("w", "w-uid", Phase.ACQUIRING, "w-uid-1-0"))  # it arrives
    await clock.advance(1)
    assert [r.key for r in await collector.run_once()] == ["gone-uid-1-0"]
    await clock.advance(10 * GRACE)
    assert await collector.run_once() == []
    assert {n.key for n in await provider.list(pool)} == {"w-uid-1-0"}


class FlakyRelease(FakeProvider):
    """Its first release of a key fails after deleting the nodes (like an AWS placement
    group still in use while its instances terminate)."""

    failed: set[str]

    async def release(self, pool: CapacityPool, key: str) -> int:
        deleted = await super().release(pool, key)
        if key not in self.failed:
            self.failed.add(key)
            raise TransientProviderError("placement group still in use")
        return deleted


async def test_a_failed_release_is_retried_once_its_nodes_are_gone(kube: KubeClient) -> None:
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    provider = FlakyRelease(kube)
    provider.failed = set()
    nodes: list[ProvidedNode] = await provider.acquire(
        AcquireRequest("dead-1-0", pool, 2, R1, "ns/dead", "dead"))
    assert len(nodes) == 2
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": provider})
    collector = Collector(state=state, providers=providers, idle_ttl=300, grace=0,
                          now=ManualClock().now, in_flight=lambda key: False)

    assert await collector.run_once() == []  # the release failed (after deleting the nodes)
    assert await provider.list(pool) == []
    retried = await collector.run_once()  # not listed any more, released again all the same
    assert [(r.key, r.why) for r in retried] == [("dead-1-0", "retrying a release that failed")]
    assert await collector.run_once() == []
    assert [c.key for c in provider.calls if c.op == "release"] == ["dead-1-0", "dead-1-0"]


class RefusingRelease(FakeProvider):
    """Refuses the first ``refuse`` releases before deleting anything (a provider outage)."""

    refuse: int

    async def release(self, pool: CapacityPool, key: str) -> int:
        if self.refuse > 0:
            self.refuse -= 1
            raise TransientProviderError("service unavailable")
        return await super().release(pool, key)


@pytest.mark.parametrize("used", [False, True], ids=["orphan", "idle"])
async def test_a_refused_release_is_retried_at_the_next_sweep_not_after_another_wait(
    kube: KubeClient, used: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    """A release the provider refuses (its nodes still listed) is tried again at the next
    sweep: the group already waited out its grace (an orphan) or idle TTL (a used gang),
    and each refusal must not restart that wait, which a user pays for by the hour. The
    decision log says the failure once, then the release."""
    caplog.set_level(logging.INFO, logger="muster.decisions")
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    pool = CapacityPool.model_validate(objects.gpu_pool("gpu"))
    provider = RefusingRelease(kube)
    provider.refuse = 2
    clock = ManualClock()
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    if used:
        node = (await provider.acquire(AcquireRequest("u-1-0", pool, 1, R1, "ns/u", "uid-u")))[0]
        state.upsert_request(_request("u", "uid-u", Phase.ENDED, "u-1-0"))
        state.upsert_pod(_pod("p0", node.name, "u"))
        assert node.name
    else:
        await provider.acquire(AcquireRequest("u-1-0", pool, 1, R1, "ns/gone", "gone-uid"))
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": provider})
    collector = Collector(state=state, providers=providers, idle_ttl=GRACE, grace=GRACE,
                          now=clock.now, in_flight=lambda key: False)

    assert await collector.run_once() == []
    state.delete_pod("ns/p0")
    assert await collector.run_once() == []  # the wait starts
    await clock.advance(GRACE)
    assert await collector.run_once() == []  # due, refused
    await clock.advance(1)
    assert await collector.run_once() == []  # refused again
    await clock.advance(1)
    assert [r.key for r in await collector.run_once()] == ["u-1-0"]
    assert await provider.list(pool) == []
    outcomes = [r.__dict__["muster_fields"]["outcome"] for r in caplog.records
                if r.name == "muster.decisions"]
    assert outcomes == ["failed", "released"], outcomes


T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("view", "seen", "after", "release"), [
    (GroupView(holder=Phase.BOOKED), Seen(unheld_since=T0), 10**6, False),
    (GroupView(in_flight=True), Seen(), 10**6, False),
    (GroupView(booked=True), Seen(used=True, idle_since=T0), 10**6, False),
    (GroupView(in_use=True), Seen(unheld_since=T0), 10**6, False),
    (GroupView(), Seen(unheld_since=T0), GRACE - 1, False),
    (GroupView(), Seen(unheld_since=T0), GRACE, True),
    (GroupView(owner_known=True, holder=Phase.FAILED), Seen(unheld_since=T0), GRACE, True),
    # A used gang, or one whose booking ended: the idle TTL, not the grace.
    (GroupView(), Seen(used=True, idle_since=T0), GRACE, False),
    (GroupView(holder=Phase.ENDED), Seen(idle_since=T0), 300, True),
    # Its pool is being deleted: a used gang goes at once, an orphan still waits the grace.
    (GroupView(pool_deleting=True), Seen(used=True), 0, True),
    (GroupView(pool_deleting=True), Seen(), 0, False),
])
def test_the_release_decision(view: GroupView, seen: Seen, after: float, release: bool) -> None:
    decision = decide(view, seen, now=T0 + timedelta(seconds=after), grace=GRACE, idle_ttl=300)
    assert decision.release is release, decision.why


@pytest.mark.parametrize("view", [GroupView(), GroupView(owner_known=True)])
def test_an_orphan_release_says_only_what_the_sweeps_saw(view: GroupView) -> None:
    # Pods of other requests may have run on the nodes between two sweeps or before a
    # restart; the collector cannot say that no pod ever ran on them.
    decision = decide(view, Seen(unheld_since=T0), now=T0 + timedelta(seconds=GRACE),
                      grace=GRACE, idle_ttl=300)
    assert decision.release
    assert "ever" not in decision.why
    assert "no pod runs on it, nor did at any sweep since this Muster started" in decision.why


class _RenamingCloud:
    """A provider whose machines register under other names than it reports (EKS with
    resource-name hostnames): only the providerID ties a machine to its Node."""

    name = "kind"

    def __init__(self, machines: list[ProvidedNode]) -> None:
        self.machines = machines
        self.released: list[str] = []

    async def validate(self, pool: CapacityPool) -> None:
        return None

    async def acquire(self, request: AcquireRequest) -> list[ProvidedNode]:
        raise AssertionError("not called")

    async def release(self, pool: CapacityPool, key: str) -> int:
        self.released.append(key)
        gone = [m for m in self.machines if m.key == key]
        self.machines = [m for m in self.machines if m.key != key]
        return len(gone)

    async def list(self, pool: CapacityPool) -> list[ProvidedNode]:
        return list(self.machines)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


async def test_booked_and_busy_machines_are_known_by_provider_id_not_by_name(
    kube: KubeClient,
) -> None:
    """The provider's name for a machine is a hint: a booking that recorded the machine's
    providerID holds it, and a pod on the Node it registered as keeps it in use, whatever
    the Node is called."""
    clock = ManualClock()
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu")])
    machines = [
        ProvidedNode(f"ip-10-0-0-{i}.ec2.internal", f"aws:///us-east-1a/i-0{i}", "gpu", key,
                     "ns/x", uid)
        for i, (key, uid) in enumerate([("booked-1-0", "uid-b"), ("used-1-0", "uid-u")])
    ]
    nodes = []
    for i in range(2):
        body = objects.node(f"i-0{i}", allocatable={"cpu": "96", objects.GPU: "8"})
        body.setdefault("spec", {})["providerID"] = f"aws:///us-east-1a/i-0{i}"
        nodes.append(body)
    state.replace_nodes(nodes)
    booked = Booking(plan_on([], new=1), attempt=1, groups=(
        Group("booked-1-0", "gpu", R1, 1, ("ip-10-0-0-0.ec2.internal",),
              ("aws:///us-east-1a/i-00",)),))
    state.upsert_request({
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b", "resourceVersion": "1",
                     "annotations": {PHASE_ANNOTATION: Phase.BOOKED,
                                     PLAN_ANNOTATION: booked.to_annotation()}},
        "spec": {"provisioningClassName": "atomic-provisioning.muster.dev", "podSets": []},
    })
    state.upsert_request(_request("u", "uid-u", Phase.ENDED, "used-1-0"))
    state.upsert_pod(_pod("p0", "i-01", "u"))
    cloud = _RenamingCloud(machines)
    providers = ProviderSet(ProviderContext(kube=kube), instances={"kind": cloud})
    collector = Collector(state=state, providers=providers, idle_ttl=300, grace=GRACE,
                          now=clock.now, in_flight=lambda key: False)
    for _ in range(3):
        await clock.advance(400)
        assert await collector.run_once() == []
    assert cloud.released == []
    state.delete_pod("ns/p0")
    await collector.run_once()
    await clock.advance(300)
    assert [r.key for r in await collector.run_once()] == ["used-1-0"]
