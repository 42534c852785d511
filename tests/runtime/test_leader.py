"""Lease-based leader election against the API sandbox (real optimistic concurrency on the
Lease, real 409s), with sub-second durations: what client-go's leaderelection guarantees,
proven for :class:`controller.runtime.leader.LeaderElector`.

- two candidates on one Lease: exactly one leads, the other stands by;
- a leader that can no longer renew (partitioned from the API server) gives up after the
  renew deadline, and the standby takes over only after the lease duration, later: never two
  leaders at once;
- conflicts on renewal (409 storms) are retried while the deadline allows, and lose the
  lease when they outlast it; a Lease taken over by someone else is noticed at once;
- releasing on a clean stop hands over at the standby's next retry, not after the lease
  duration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from controller.commands import objects
from controller.config import ConfigError, LeaderElectionConfig, MusterConfig, load_config
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    LEASES,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
    Resource,
)
from controller.operator import Controller
from controller.runtime.leader import LeaderElector, LeadershipLost, from_config, lease_namespace
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from tests.helpers import eventually

NS = "muster-system"
LEASE = "muster"
FAST = {"lease_duration_seconds": 1, "renew_deadline_seconds": 0.5, "retry_period_seconds": 0.1}
# For the test that needs a leader to keep renewing for several lease durations: a renew
# deadline a loaded CI machine's event-loop stalls cannot outlast (0.5 s was lost once).
STEADY = {"lease_duration_seconds": 2, "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2}


class PartitionableKube(KubeClient):
    """A client whose requests fail as if the network to the API server were cut."""

    partitioned = False

    def _check(self) -> None:
        if self.partitioned:
            raise ApiError(0, "ClientConnectorError", "partitioned from the API server")

    async def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Body:
        self._check()
        return await super().get(res, name, namespace=namespace)

    async def create(self, res: Resource, body: Body, *, namespace: str | None = None) -> Body:
        self._check()
        return await super().create(res, body, namespace=namespace)

    async def merge_patch(self, res: Resource, name: str, patch: Body, *,
                          namespace: str | None = None, subresource: str | None = None) -> Body:
        self._check()
        return await super().merge_patch(res, name, patch, namespace=namespace,
                                         subresource=subresource)


@pytest.fixture
async def clients(
    server: SandboxServer, kube: KubeClient, tmp_path: Path
) -> AsyncIterator[Callable[[], Any]]:
    """A factory of separate clients, one per candidate (as separate pods would have)."""
    await kube.create(NAMESPACES, {"metadata": {"name": NS}})
    path = server.write_kubeconfig(tmp_path / "candidates")
    made: list[KubeClient] = []

    async def make() -> PartitionableKube:
        client = await PartitionableKube.from_kubeconfig(path)
        made.append(client)
        return client  # type: ignore[return-value]

    try:
        yield make
    finally:
        for client in made:
            await client.close()


def _elector(client: KubeClient, identity: str, **durations: Any) -> LeaderElector:
    return LeaderElector(client, name=LEASE, namespace=NS, identity=identity,
                         **{**FAST, **durations})


async def _stop(*electors: LeaderElector, tasks: tuple[asyncio.Task[Any], ...] = ()) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for elector in electors:
        await elector.release()


async def _spec(kube: KubeClient) -> Body:
    return dict((await kube.get(LEASES, LEASE, namespace=NS))["spec"])


async def test_two_candidates_exactly_one_leads(kube: KubeClient, clients: Any) -> None:
    a = _elector(await clients(), "pod-a", **STEADY)
    b = _elector(await clients(), "pod-b", **STEADY)
    tasks = (asyncio.create_task(a.acquire()), asyncio.create_task(b.acquire()))
    done, pending = await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, "one candidate must win the Lease"
    # Several lease durations later the loser is still standing by: the winner renews.
    await asyncio.sleep(2.5 * STEADY["lease_duration_seconds"])
    assert len(pending) == 1 and not next(iter(pending)).done()
    leaders = [e for e in (a, b) if e.is_leader]
    assert len(leaders) == 1
    (leader,) = leaders
    standby = b if leader is a else a
    assert standby.holder == leader.identity
    spec = await _spec(kube)
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == STEADY["lease_duration_seconds"]
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] <= spec["renewTime"]
    await _stop(a, b, tasks=tuple(pending))


async def test_partitioned_leader_gives_up_before_the_standby_takes_over(
    kube: KubeClient, clients: Any
) -> None:
    leader_kube = await clients()
    leader = _elector(leader_kube, "pod-a")
    await leader.acquire()
    events: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    leader.on_lost(lambda: events.append(("a lost", loop.time())))
    standby = _elector(await clients(), "pod-b")
    campaign = asyncio.create_task(standby.acquire())
    await asyncio.sleep(0.5)
    assert not campaign.done()

    leader_kube.partitioned = True
    cut = loop.time()
    await asyncio.wait_for(campaign, timeout=5)
    events.append(("b leads", loop.time()))

    assert leader.lost.is_set() and not leader.is_leader
    assert [name for name, _ in events] == ["a lost", "b leads"], events
    lost_at, took_at = events[0][1], events[1][1]
    # The leader gave up at its renew deadline (0.5 s), well before the lease duration ...
    assert lost_at - cut < 0.9
    # ... and the standby waited out the lease duration since it last saw a renewal.
    assert took_at - cut >= 1.0 - 0.15
    spec = await _spec(kube)
    assert spec["holderIdentity"] == "pod-b" and spec["leaseTransitions"] == 1
    # A lost elector does not campaign again (the process exits and restarts instead), and
    # does not release a Lease that is no longer its own.
    with pytest.raises(LeadershipLost):
        await leader.acquire()
    assert await leader.release() is False
    await _stop(standby)


async def test_conflicts_shorter_than_the_renew_deadline_keep_the_lease(
    server: SandboxServer, kube: KubeClient, clients: Any
) -> None:
    leader = _elector(await clients(), "pod-a", lease_duration_seconds=3,
                      renew_deadline_seconds=1.0, retry_period_seconds=0.1)
    await leader.acquire()
    before = (await _spec(kube))["renewTime"]
    storm = server.faults.add_conflicts(1.0, verbs="patch", resources="leases")
    await asyncio.sleep(0.5)
    assert leader.conflicts >= 3, "renewals were retried through the storm"
    server.faults.remove(storm)
    await eventually(lambda: _renewed_since(kube, before), within=2)
    assert leader.is_leader and not leader.lost.is_set()
    await _stop(leader)


async def test_conflicts_outlasting_the_renew_deadline_lose_the_lease(
    server: SandboxServer, clients: Any
) -> None:
    leader = _elector(await clients(), "pod-a")
    await leader.acquire()
    halted: list[bool] = []
    leader.on_lost(lambda: halted.append(leader.is_leader))
    server.faults.add_conflicts(1.0, verbs="patch", resources="leases")
    await asyncio.wait_for(leader.lost.wait(), timeout=2)
    # The callback ran when leadership already read as lost.
    assert halted == [False]
    server.faults.clear()


async def test_a_lease_taken_by_another_holder_is_lost_at_the_next_renewal(
    kube: KubeClient, clients: Any
) -> None:
    leader = _elector(await clients(), "pod-a", lease_duration_seconds=10,
                      renew_deadline_seconds=5, retry_period_seconds=0.1)
    await leader.acquire()
    loop = asyncio.get_running_loop()
    await kube.merge_patch(LEASES, LEASE, {"spec": {"holderIdentity": "intruder"}},
                           namespace=NS)
    taken = loop.time()
    await asyncio.wait_for(leader.lost.wait(), timeout=2)
    # Not after the 5 s renew deadline: a Lease naming someone else is proof enough.
    assert loop.time() - taken < 1.0
    assert (await _spec(kube))["holderIdentity"] == "intruder"


async def test_release_hands_over_at_the_next_retry(kube: KubeClient, clients: Any) -> None:
    leader = _elector(await clients(), "pod-a", lease_duration_seconds=10,
                      renew_deadline_seconds=5, retry_period_seconds=0.1)
    standby = _elector(await clients(), "pod-b", lease_duration_seconds=10,
                       renew_deadline_seconds=5, retry_period_seconds=0.1)
    await leader.acquire()
    campaign = asyncio.create_task(standby.acquire())
    await asyncio.sleep(0.3)
    assert not campaign.done()
    loop = asyncio.get_running_loop()
    assert await leader.release() is True
    released = loop.time()
    assert not leader.is_leader and not leader.lost.is_set()
    spec = await _spec(kube)
    assert spec["holderIdentity"] == "" and spec["leaseTransitions"] == 0
    await asyncio.wait_for(campaign, timeout=2)
    # Far below the 10 s lease duration: at most one jittered retry period (0.22 s).
    assert loop.time() - released < 1.0
    spec = await _spec(kube)
    assert spec["holderIdentity"] == "pod-b" and spec["leaseTransitions"] == 1
    await _stop(standby)


async def test_a_missing_namespace_is_reported_and_retried(
    server: SandboxServer, kube: KubeClient, tmp_path: Path
) -> None:
    client = await KubeClient.from_kubeconfig(server.write_kubeconfig(tmp_path / "kc"))
    elector = LeaderElector(client, name=LEASE, namespace="nowhere", identity="pod-a", **FAST)
    try:
        campaign = asyncio.create_task(elector.acquire())
        await eventually(lambda: _value(elector.last_error), within=2)
        assert elector.last_error is not None
        assert "namespace nowhere does not exist" in elector.last_error
        assert "leader_election.namespace" in elector.last_error
        assert not campaign.done()
        await kube.create(NAMESPACES, {"metadata": {"name": "nowhere"}})
        await asyncio.wait_for(campaign, timeout=2)  # retried, and it leads now
        assert elector.is_leader and elector.last_error is None
        await elector.release()
    finally:
        await client.close()


async def test_losing_the_lease_halts_the_controller_before_anything_else_runs(
    kube: KubeClient, clients: Any
) -> None:
    # As `muster run` wires it: the controller starts once leading, halt() is the callback.
    elector = _elector(await clients(), "pod-a")
    await elector.acquire()
    controller = Controller(kube=kube, config=MusterConfig(),
                            providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})
    seen: list[bool] = []
    elector.on_lost(controller.halt)
    elector.on_lost(lambda: seen.append(controller.ready))
    await controller.start()
    try:
        assert controller.ready
        await kube.merge_patch(LEASES, LEASE, {"spec": {"holderIdentity": "intruder"}},
                               namespace=NS)
        await asyncio.wait_for(elector.lost.wait(), timeout=2)
        assert seen == [False], "halted synchronously, before the next callback ran"
        await asyncio.sleep(0)
        assert all(t.done() for t in controller.queue.tasks), "no reconcile worker is left"
        # A request arriving now is seen by the cache but never reconciled.
        await kube.create(NAMESPACES, {"metadata": {"name": "team"}})
        await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
        await kube.create(POD_TEMPLATES, objects.pod_template(
            "workers", namespace="team", requests={"cpu": "8", objects.GPU: "8"},
            required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION]),
            namespace="team")
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "late", namespace="team", pod_sets=[("workers", 1)]), namespace="team")
        await asyncio.sleep(1.0)
        late = await kube.get(PROVISIONING_REQUESTS, "late", namespace="team")
        assert not (late.get("status") or {}).get("conditions"), late.get("status")
        assert not (await kube.list(NODES, label_selector="muster.dev/pool=gpu"))["items"]
    finally:
        await controller.stop()


async def _renewed_since(kube: KubeClient, before: str) -> bool:
    return bool((await _spec(kube))["renewTime"] > before)


async def _value(value: Any) -> Any:
    return value


# ---------------------------------------------------------------- configuration

def test_config_defaults_replace_a_dead_leader_in_about_8_seconds() -> None:
    # Shorter than client-go's 15/10/2 s, with the same ordering (docs/operations/ha.md).
    cfg = load_config().leader_election
    assert cfg.enabled is True
    assert (cfg.lease_duration_seconds, cfg.renew_deadline_seconds,
            cfg.retry_period_seconds) == (8, 6.0, 1.0)
    assert cfg.lease_name == "muster" and cfg.namespace is None


@pytest.mark.parametrize(("values", "message"), [
    ({"lease_duration_seconds": 10, "renew_deadline_seconds": 10},
     "lease_duration_seconds (10) must be greater than renew_deadline_seconds"),
    ({"renew_deadline_seconds": 2, "retry_period_seconds": 2},
     "must be greater than 1.2 x retry_period_seconds"),
    ({"lease_duration_seconds": 0}, "greater than or equal to 1"),
])
def test_config_refuses_durations_that_allow_two_leaders(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    import yaml

    file = tmp_path / "muster.yaml"
    file.write_text(yaml.safe_dump({"leader_election": values}))
    with pytest.raises(ConfigError, match="leader_election") as exc:
        load_config(file)
    assert message in str(exc.value)


def test_lease_namespace_comes_from_config_then_service_account_then_default(
    tmp_path: Path
) -> None:
    sa = tmp_path / "namespace"
    assert lease_namespace("ops", sa) == "ops"
    assert lease_namespace(None, sa) == "muster-system"  # outside a pod
    sa.write_text("platform\n")
    assert lease_namespace(None, sa) == "platform"


async def test_elector_from_config(kube: KubeClient) -> None:
    cfg = LeaderElectionConfig(namespace="ops", lease_name="m", lease_duration_seconds=4,
                               renew_deadline_seconds=3, retry_period_seconds=1)
    elector = from_config(kube, cfg)
    assert elector.key == "ops/m"
    assert (elector.lease_duration, elector.renew_deadline, elector.retry_period) == (4, 3, 1)
    assert elector.identity != from_config(kube, cfg).identity, "one identity per process"
