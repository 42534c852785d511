"""The cloud tier's scenarios, each on AWS (EC2 over HTTP) and GCP (Compute over HTTP): what a
platform team meets when Muster buys GPU nodes on EKS or GKE."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from controller.commands import objects
from controller.common.topology_defaults import MUSTER_REQUIRED, POOL_LABEL, UNREGISTERED_TAINT
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    Resource,
)
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
)
from e2e.cloud.tier import (
    AWS_ZONE,
    GCP_PROJECT,
    GCP_ZONE,
    LAUNCH_TEMPLATE,
    REGION,
    STOCK_KUBE_ENV,
    Cloud,
)

pytestmark = [pytest.mark.real, pytest.mark.cloud]

T = TypeVar("T")
RUN_LABEL = "cloud-tier.muster.dev/run"
LEVEL = {
    "aws": "topology.k8s.aws/network-node-layer-3",
    "gcp": "cloud.google.com/gce-topology-subblock",
}
ZONE = "topology.kubernetes.io/zone"
PROVIDER_ID = {"aws": f"aws:///{AWS_ZONE}/", "gcp": f"gce://{GCP_PROJECT}/{GCP_ZONE}/"}


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, within: float = 40.0, what: str = "condition"
) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.25)


@dataclass
class Scenario:
    """One test on one cloud: its namespace, pool and helpers."""

    cloud: Cloud
    kube: KubeClient
    provider: str
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def namespace(self) -> str:
        return f"cloud-{self.run}"

    @property
    def pool(self) -> str:
        return f"{self.provider}-gpu-{self.run}"

    @property
    def level(self) -> str:
        return LEVEL[self.provider]

    def pool_body(self, **spec: Any) -> Body:
        if self.provider == "aws":
            parameters: Body = {
                "region": REGION,
                "launchTemplate": {"name": LAUNCH_TEMPLATE, "version": "1"},
                "instanceType": "p5.48xlarge",
                "subnets": {AWS_ZONE: self.cloud.subnet},
                "recordNetworkTopology": True,
            }
        else:
            parameters = {
                "project": GCP_PROJECT,
                "zone": GCP_ZONE,
                "machineType": "a3-highgpu-8g",
                "image": "projects/cos-cloud/global/images/family/cos-stable",
                "metadata": {"kube-env": STOCK_KUBE_ENV},
            }
        body: Body = {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "CapacityPool",
            "metadata": {"name": self.pool},
            "spec": {
                "provider": self.provider,
                "maxNodes": 8,
                "pricePerNodeHour": 98.0,
                "expectedReadySeconds": 5,
                "nodeTemplate": {
                    "labels": {RUN_LABEL: self.run},
                    "taints": [objects.GPU_TAINT],
                    "allocatable": {
                        "cpu": "180",
                        "memory": "1800Gi",
                        objects.GPU: "8",
                        "pods": "110",
                    },
                },
                "topology": {"level": self.level, "maxNodesPerDomain": 8},
                "parameters": parameters,
            },
        }
        body["spec"].update(spec)
        return body

    async def setup(self, **spec: Any) -> None:
        await self.kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
        )
        await self.kube.create(CAPACITY_POOLS, self.pool_body(**spec))
        template = objects.pod_template(
            "workers",
            namespace=self.namespace,
            requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
            required_level=self.level,
            tolerations=[objects.GPU_TOLERATION],
            node_selector={RUN_LABEL: self.run},
        )
        await self.kube.create(POD_TEMPLATES, template, namespace=self.namespace)
        self.template = template

    async def request(self, name: str, count: int) -> None:
        await self.kube.create(
            PROVISIONING_REQUESTS,
            objects.provisioning_request(
                name,
                pod_sets=[("workers", count)],
                namespace=self.namespace,
            ),
            namespace=self.namespace,
        )

    async def condition(self, request: str, type_: str) -> dict[str, Any] | None:
        pr = await self.kube.get(PROVISIONING_REQUESTS, request, namespace=self.namespace)
        for cond in (pr.get("status") or {}).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return None

    async def wait_condition(
        self, request: str, type_: str, status: str = "True", *, within: float = 60.0
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            cond = await self.condition(request, type_)
            return cond if cond is not None and cond.get("status") == status else None

        return await eventually(probe, within=within, what=f"{request} {type_}={status}")

    async def details(self, request: str) -> dict[str, str]:
        pr = await self.kube.get(PROVISIONING_REQUESTS, request, namespace=self.namespace)
        return dict((pr.get("status") or {}).get("provisioningClassDetails") or {})

    async def pods_for(self, request: str, count: int) -> None:
        details = await self.details(request)
        selector = {self.level: details[self.level]} if self.level in details else {}
        for i in range(count):
            await self.kube.create(
                PODS,
                objects.consumer_pod(
                    f"{request}-{i}",
                    request=request,
                    template=self.template,
                    node_selector=selector,
                ),
                namespace=self.namespace,
            )

    async def cloud_nodes(self) -> list[Body]:
        """The Nodes of this pool's live machines, found by providerID."""
        ids = await asyncio.to_thread(self.machine_ids)
        listing = await self.kube.list(NODES)
        return [
            n
            for n in listing.get("items") or []
            if (n.get("spec") or {}).get("providerID", "").startswith(PROVIDER_ID[self.provider])
            and n["spec"]["providerID"].rsplit("/", 1)[-1] in ids
        ]

    def machines(self) -> list[dict[str, Any]]:
        if self.provider == "aws":
            return self.cloud.live_instances(self.pool)
        # A flex-start MIG's VMs carry the MIG template's labels, not the pool's: they are
        # the pool's by the name Muster gave them.
        with self.cloud.compute.lock:
            flex = [dict(i) for i in self.cloud.compute.all_instances()
                    if i["name"].startswith(f"{self.pool}-")]
        named = {v["name"] for v in flex}
        return flex + [v for v in self.cloud.live_vms(self.pool) if v["name"] not in named]

    def machine_ids(self) -> set[str]:
        """Instance ids (AWS) or VM names (GCP) of the pool's live machines."""
        if self.provider == "aws":
            return {i["InstanceId"] for i in self.cloud.live_instances(self.pool)}
        return {v["name"] for v in self.cloud.live_vms(self.pool)}

    async def bound(self) -> dict[str, str]:
        listing = await self.kube.list(PODS, namespace=self.namespace)
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in listing.get("items") or []
            if p["spec"].get("nodeName")
        }

    async def cleanup(self) -> None:
        with contextlib.suppress(ApiError):
            await self.kube.delete(NAMESPACES, self.namespace)

        async def released() -> bool:
            return not await asyncio.to_thread(self.machines)

        try:
            # A machine left once the scenario's requests are gone is a leak: it fails the
            # scenario that made it, not a later test that meets its Node.
            await eventually(released, within=60, what="the pool's machines to be released")
        finally:
            with contextlib.suppress(ApiError):
                await self.kube.delete(CAPACITY_POOLS, self.pool)


@pytest.fixture(params=["aws", "gcp"])
async def scenario(request: pytest.FixtureRequest, cloud: Cloud) -> AsyncIterator[Scenario]:
    async with await KubeClient.from_kubeconfig(cloud.cluster.admin_kubeconfig) as kube:
        s = Scenario(cloud, kube, request.param)
        cloud.muster.new_lines()
        problems = len(cloud.registrar.problems)
        try:
            yield s
        finally:
            await s.cleanup()
            cloud.registrar.broken_pools.discard(s.pool)
    assert cloud.muster.running, f"the tier's Muster exited:\n{cloud.muster.tail()}"
    assert cloud.registrar.problems[problems:] == [], "the node lifecycle stand-in failed"
    refused = [line for line in cloud.muster.new_lines() if "forbidden" in line.lower()]
    assert not refused, "Muster was refused by RBAC:\n" + "\n".join(refused[:10])


def _taints(node: Body) -> list[str]:
    return [t["key"] for t in (node.get("spec") or {}).get("taints") or []]


async def test_a_gang_is_provisioned_into_one_domain_and_bound(scenario: Scenario) -> None:
    s = scenario
    await s.setup()
    await s.request("gang", 2)
    await s.wait_condition("gang", "Provisioned")
    nodes = await eventually(lambda: _registered(s, 2), what="2 registered cloud nodes")
    details = await s.details("gang")
    domain = details.get(s.level)
    assert domain and not domain.startswith("muster-new-"), details
    provisioned = await s.condition("gang", "Provisioned")
    assert provisioned and "muster-new-" not in str(provisioned.get("message")), provisioned
    zone = AWS_ZONE if s.provider == "aws" else GCP_ZONE
    assert details.get(ZONE) == zone, "the zone level: the zone the nodes registered in"
    foreign = "cloud.google.com/gce-topology" if s.provider == "aws" else "topology.k8s.aws/"
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels[s.level] == domain, "the domain published is the one registered"
        assert labels[ZONE] == zone
        assert not [k for k in labels if k.startswith(foreign)], f"no other cloud's: {labels}"
        assert labels[POOL_LABEL] == s.pool
        assert labels[RUN_LABEL] == s.run, "the pool's nodeTemplate labels were applied"
        assert UNREGISTERED_TAINT not in _taints(node)
        assert objects.GPU in _taints(node)
    await s.pods_for("gang", 2)
    bound = await eventually(lambda: _bound_all(s, 2), what="the scheduler to bind 2 pods")
    assert set(bound.values()) == {n["metadata"]["name"] for n in nodes}


def _reserve(s: Scenario, count: int, *, block: bool) -> tuple[str, Body]:
    """A reservation of ``count`` machines in the tier's zone (AWS: a Capacity Block open
    now, or an ODCR; GCP: a specific reservation, in one block of that size): its id and
    the pool parameters that draw from it."""
    if s.provider == "aws":
        rid = f"cr-0{s.run}"
        now = datetime.now(UTC)
        s.cloud.layer.add_capacity_reservation(
            rid, zone=AWS_ZONE, instance_type="p5.48xlarge", count=count,
            kind="capacity-block" if block else "default",
            start=now - timedelta(hours=1) if block else None,
            end=now + timedelta(days=1) if block else None,
        )
        target: Body = {"id": rid, "type": "capacity-block" if block else "default"}
        return rid, {"capacityReservation": target}
    name = f"res-{s.run}"
    with s.cloud.compute.lock:
        s.cloud.compute.add_reservation(GCP_ZONE, name, count,
                                        blocks={"b1": count} if block else None)
    reservation: Body = {"name": name, **({"block": "b1"} if block else {})}
    return (f"{name}/reservationBlocks/b1" if block else name), {"reservation": reservation}


async def _reservation_row(s: Scenario) -> Body | None:
    pool = await s.kube.get(CAPACITY_POOLS, s.pool)
    rows = (pool.get("status") or {}).get("reservations") or []
    return dict(rows[0]) if rows else None


async def test_a_gang_is_placed_into_a_reservation_block_and_bound(scenario: Scenario) -> None:
    """A pool drawing from a Capacity Block (AWS) or a reservation's block (GCP) of 2: a
    gang of 2 is launched into it, registers and is bound by the scheduler; the pool's
    status shows the block full, as the cloud counts it."""
    s = scenario
    rid, params = _reserve(s, 2, block=True)
    await s.setup(parameters={**s.pool_body()["spec"]["parameters"], **params})
    row = await eventually(lambda: _reservation_row(s), what="the reservation's figures")
    assert (row["id"], row["reserved"], row["free"]) == (rid, 2, 2), row
    await s.request("gang", 2)
    nodes = await _provisioned_on(s, "gang", 2)
    ids = {n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes}
    if s.provider == "aws":
        assert {s.cloud.layer.reserved_in.get(i) for i in ids} == {rid}
    else:
        with s.cloud.compute.lock:
            used = {s.cloud.compute.consumed.get((GCP_ZONE, name)) for name in ids}
        assert used == {(rid.split("/")[0], "b1")}
    await s.pods_for("gang", 2)
    bound = await eventually(lambda: _bound_all(s, 2), what="the scheduler to bind 2 pods")
    assert set(bound.values()) == {n["metadata"]["name"] for n in nodes}

    async def full() -> Body | None:
        found = await _reservation_row(s)
        return found if found is not None and found["free"] == 0 else None

    row = await eventually(full, within=40, what="the reservation's figures to count the gang")
    assert (row["used"], row["free"]) == (2, 0)


async def test_a_reservation_too_small_for_the_gang_is_not_used_partially(
    scenario: Scenario,
) -> None:
    """A pool drawing from a reservation of 1 (AWS: an ODCR; GCP: a specific reservation)
    and a gang of 2: nothing is launched, and the request fails saying the pool's
    reservation cannot hold it."""
    s = scenario
    _, params = _reserve(s, 1, block=False)
    await s.setup(parameters={**s.pool_body()["spec"]["parameters"], **params})
    await eventually(lambda: _reservation_row(s), what="the reservation's figures")
    if s.provider == "aws":
        launches = s.cloud.layer.actions.count("CreateFleet")
    else:
        launches = len(s.cloud.compute.calls("bulk_insert"))
    await s.request("gang", 2)
    failed = await s.wait_condition("gang", "Failed")
    assert failed["reason"] == "CapacityNeverFits", failed
    assert "reservation it draws from" in failed["message"], failed
    assert await asyncio.to_thread(s.machines) == []
    if s.provider == "aws":
        assert s.cloud.layer.actions.count("CreateFleet") == launches
    else:
        assert len(s.cloud.compute.calls("bulk_insert")) == launches


async def _registered(s: Scenario, count: int) -> list[Body] | None:
    nodes = await s.cloud_nodes()
    done = [
        n
        for n in nodes
        if UNREGISTERED_TAINT not in _taints(n)
        and (n["metadata"].get("labels") or {}).get(POOL_LABEL) == s.pool
    ]
    return done if len(done) == count else None


async def _bound_all(s: Scenario, count: int) -> dict[str, str] | None:
    bound = await s.bound()
    return bound if len(bound) == count else None


async def _provisioned_on(s: Scenario, request: str, count: int) -> list[Body]:
    await s.wait_condition(request, "Provisioned")
    return await eventually(lambda: _registered(s, count), what=f"{count} registered nodes")


async def test_capacity_lost_mid_fleet_is_rolled_back(scenario: Scenario) -> None:
    """The launch gets one machine of two before the cloud runs out (GCP: the bulkInsert
    operation fails): the machine of the failed launch is terminated, the request (its pool
    without declared domains) backs off and asks the cloud again, and is provisioned; no
    machine is left but the gang's."""
    s = scenario
    await s.setup()
    known = set(s.cloud.layer.fleets)
    if s.provider == "aws":
        before = s.cloud.layer.actions.count("CreateFleet")
        s.cloud.layer.inject_partial_fleet(1)
    else:
        before = len(s.cloud.compute.calls("bulk_insert"))
        with s.cloud.compute.lock:
            s.cloud.compute.operation_error = "ZONE_RESOURCE_POOL_EXHAUSTED"
    await s.request("gang", 2)

    async def settled() -> str | None:
        for type_ in ("Provisioned", "Failed"):
            cond = await s.condition("gang", type_)
            if cond is not None and cond.get("status") == "True":
                return type_
        return None

    outcome = await eventually(settled, within=60, what="the request to be Provisioned or Failed")
    assert outcome == "Provisioned", await s.condition("gang", "Failed")
    if s.provider == "aws":
        assert s.cloud.layer.actions.count("CreateFleet") >= before + 2, "the cloud asked again"
        partial = set(s.cloud.layer.fleets) - known
        assert partial, "the partial fleet launched a machine"
    else:
        assert len(s.cloud.compute.calls("bulk_insert")) >= before + 2, "the cloud asked again"
    nodes = await eventually(lambda: _registered(s, 2), what="the gang's 2 registered nodes")
    gang = {n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes or []}

    async def rolled_back() -> bool:
        return await asyncio.to_thread(s.machine_ids) == gang

    await eventually(rolled_back, within=30, what=f"only the gang's machines {gang} alive")


async def test_muster_killed_between_launch_and_registration(scenario: Scenario) -> None:
    """Muster dies after the machines were launched and before their Nodes registered; the
    restarted Muster finds them by tag and providerID and provisions with exactly them."""
    s = scenario
    await s.setup()
    s.cloud.registrar.held_pools.add(s.pool)
    try:
        await s.request("gang", 2)
        launched = await eventually(lambda: _machines(s, 2), what="2 machines launched")
        await asyncio.to_thread(s.cloud.muster.stop, signal.SIGKILL)
        s.cloud.registrar.held_pools.discard(s.pool)
        await asyncio.to_thread(s.cloud.muster.start)
        nodes = await _provisioned_on(s, "gang", 2)
    finally:
        s.cloud.registrar.held_pools.discard(s.pool)
    assert {n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes} == launched
    assert await asyncio.to_thread(s.machine_ids) == launched, "no second launch"


async def _machines(s: Scenario, count: int) -> set[str] | None:
    ids = await asyncio.to_thread(s.machine_ids)
    return ids if len(ids) == count else None


async def test_a_machine_that_never_registers_is_released(scenario: Scenario) -> None:
    """Machines whose kubelet never registers are terminated after the registration budget,
    and the request's condition says which and why."""
    s = scenario
    await s.setup()
    s.cloud.registrar.broken_pools.add(s.pool)
    await s.request("gang", 2)
    first = await eventually(lambda: _machines(s, 2), what="2 machines launched")

    async def said_so() -> str | None:
        pr = await s.kube.get(PROVISIONING_REQUESTS, "gang", namespace=s.namespace)
        for cond in (pr.get("status") or {}).get("conditions") or []:
            text = (
                f"{cond.get('type')}={cond.get('status')} {cond.get('reason')}: "
                f"{cond.get('message')}"
            )
            if "never registered" in str(cond.get("message")):
                return text
        return None

    said = await eventually(said_so, within=60, what="a condition naming the unregistered")
    assert PROVIDER_ID[s.provider] in said, f"the machine is named by providerID: {said}"

    async def first_gone() -> bool:
        return not (await asyncio.to_thread(s.machine_ids)) & first

    await eventually(first_gone, within=30, what="the unregistered machines to be terminated")
    pr = await s.kube.get(PROVISIONING_REQUESTS, "gang", namespace=s.namespace)
    provisioned = [
        c
        for c in (pr.get("status") or {}).get("conditions") or []
        if c.get("type") == "Provisioned" and c.get("status") == "True"
    ]
    assert not provisioned, "never a Provisioned gang without its nodes"


async def test_idle_release_terminates_the_machines(scenario: Scenario) -> None:
    """A gang whose request goes away: its machines are idle and released, the instances
    terminated, and their Nodes go with them."""
    s = scenario
    await s.setup()
    await s.request("gang", 2)
    nodes = await _provisioned_on(s, "gang", 2)
    names = {n["metadata"]["name"] for n in nodes}
    await s.kube.delete(PROVISIONING_REQUESTS, "gang", namespace=s.namespace)

    async def terminated() -> bool:
        return not await asyncio.to_thread(s.machine_ids)

    await eventually(terminated, within=40, what="the idle machines to be terminated")

    async def nodes_gone() -> bool:
        listing = await s.kube.list(NODES)
        return not names & {n["metadata"]["name"] for n in listing.get("items") or []}

    await eventually(nodes_gone, within=20, what="their Nodes to go")


async def test_a_machine_terminated_out_of_band_revokes_the_booking(scenario: Scenario) -> None:
    s = scenario
    await s.setup()
    await s.request("gang", 2)
    nodes = await _provisioned_on(s, "gang", 2)
    victim = nodes[0]["spec"]["providerID"].rsplit("/", 1)[-1]
    if s.provider == "aws":
        await asyncio.to_thread(s.cloud.ec2.terminate_instances, InstanceIds=[victim])
    else:
        with s.cloud.compute.lock:
            s.cloud.compute.instances[GCP_ZONE].pop(victim)
    cond = await s.wait_condition("gang", "CapacityRevoked", within=40)
    assert cond["reason"] == "BookedNodesVanished", cond


JOBS = Resource("batch", "v1", "jobs", namespaced=True, kind="Job")
KUEUE_V = "kueue.x-k8s.io/v1beta2"
KUEUE_CHECK = "kueue.x-k8s.io/provisioning-request"
ATOMIC = "atomic-provisioning.muster.dev"


async def test_kueue_path_a_job_runs_on_the_cloud_nodes(scenario: Scenario) -> None:
    """A batch/v1 Job queued in Kueue with its built-in ProvisioningRequest check naming
    Muster's class: Muster buys the gang from the cloud, the machines register, Kueue admits
    with the domain copied from provisioningClassDetails, the scheduler binds every pod."""
    s = scenario
    await s.setup()
    names = {k: f"{k}-{s.run}" for k in ("flavor", "config", "check", "cq")}
    cluster_scoped: list[tuple[Resource, str]] = []

    async def create(res: Resource, body: Body) -> None:
        await s.kube.create(res, body)
        cluster_scoped.append((res, body["metadata"]["name"]))

    try:
        await create(
            RESOURCE_FLAVORS,
            {
                "apiVersion": KUEUE_V,
                "kind": "ResourceFlavor",
                "metadata": {"name": names["flavor"]},
                "spec": {"nodeLabels": {RUN_LABEL: s.run}, "tolerations": [objects.GPU_TOLERATION]},
            },
        )
        await create(
            PROVISIONING_REQUEST_CONFIGS,
            {
                "apiVersion": KUEUE_V,
                "kind": "ProvisioningRequestConfig",
                "metadata": {"name": names["config"]},
                "spec": {
                    "provisioningClassName": ATOMIC,
                    "managedResources": [objects.GPU],
                    "retryStrategy": {
                        "backoffLimitCount": 2,
                        "backoffBaseSeconds": 1,
                        "backoffMaxSeconds": 4,
                    },
                    "podSetUpdates": {
                        "nodeSelector": [
                            {"key": s.level, "valueFromProvisioningClassDetail": s.level}
                        ]
                    },
                },
            },
        )
        await create(
            ADMISSION_CHECKS,
            {
                "apiVersion": KUEUE_V,
                "kind": "AdmissionCheck",
                "metadata": {"name": names["check"]},
                "spec": {
                    "controllerName": KUEUE_CHECK,
                    "parameters": {
                        "apiGroup": "kueue.x-k8s.io",
                        "kind": "ProvisioningRequestConfig",
                        "name": names["config"],
                    },
                },
            },
        )
        await create(
            CLUSTER_QUEUES,
            {
                "apiVersion": KUEUE_V,
                "kind": "ClusterQueue",
                "metadata": {"name": names["cq"]},
                "spec": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": s.namespace}
                    },
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", objects.GPU],
                            "flavors": [
                                {
                                    "name": names["flavor"],
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "1000"},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": objects.GPU, "nominalQuota": "64"},
                                    ],
                                }
                            ],
                        }
                    ],
                    "admissionChecksStrategy": {"admissionChecks": [{"name": names["check"]}]},
                },
            },
        )
        await s.kube.create(
            LOCAL_QUEUES,
            {
                "apiVersion": KUEUE_V,
                "kind": "LocalQueue",
                "metadata": {"name": "training", "namespace": s.namespace},
                "spec": {"clusterQueue": names["cq"]},
            },
            namespace=s.namespace,
        )

        async def active() -> bool:
            cq = await s.kube.get(CLUSTER_QUEUES, names["cq"])
            return any(
                c.get("type") == "Active" and c.get("status") == "True"
                for c in (cq.get("status") or {}).get("conditions") or []
            )

        await eventually(active, within=30, what="the ClusterQueue to be Active")
        await s.kube.create(JOBS, _job("train", s, 2), namespace=s.namespace)

        async def bound() -> list[Body] | None:
            listing = await s.kube.list(
                PODS, namespace=s.namespace, label_selector="batch.kubernetes.io/job-name=train"
            )
            pods = [p for p in listing.get("items") or [] if p["spec"].get("nodeName")]
            return pods if len(pods) == 2 else None

        pods = await eventually(bound, within=120, what="Kueue to admit and 2 pods to bind")
        nodes = {n["metadata"]["name"]: n for n in await s.cloud_nodes()}
        assert len(nodes) == 2, f"Muster bought {sorted(nodes)} for a gang of 2"
        domains = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][s.level] for p in pods}
        assert len(domains) == 1, f"the gang runs in one {s.level}: {domains}"
        assert {p["spec"]["nodeSelector"][s.level] for p in pods} == domains, (
            "Kueue copied the registered domain from provisioningClassDetails"
        )
    finally:
        with contextlib.suppress(ApiError):
            await s.kube.delete(JOBS, "train", namespace=s.namespace)
        await s.cleanup()
        for res, name in reversed(cluster_scoped):
            with contextlib.suppress(ApiError):
                await s.kube.delete(res, name)


def _job(name: str, s: Scenario, workers: int) -> Body:
    """An Indexed Job of ``workers`` 8-GPU pods that must share one domain of the pool's
    level (Muster's pod-template annotation, which Kueue copies to its PodTemplates)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": s.namespace,
            "labels": {"kueue.x-k8s.io/queue-name": "training"},
        },
        "spec": {
            "suspend": True,
            "parallelism": workers,
            "completions": workers,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": {MUSTER_REQUIRED: s.level}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "worker",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {
                                "requests": {"cpu": "8", "memory": "64Gi", objects.GPU: "8"},
                                "limits": {objects.GPU: "8"},
                            },
                        }
                    ],
                },
            },
        },
    }


FLEX_MIG = "a3-flex"
QUEUED = "queued-provisioning.muster.dev"
BLOCK_FEE = "3000.00"
"""What the tier's AWS pools may pay for a Capacity Block (maxUpfrontFee)."""


async def _queue_gang(s: Scenario, run_seconds: int = 3600) -> dict[str, Any]:
    """A queued-class gang of 2 asked of a pool that queues in the cloud (GCP: a flexStart
    pool over the tier's MIG, whose template boots a stock kubelet and nothing of Muster's;
    AWS: a pool allowed to buy Capacity Blocks, none on sale), with a ``run_seconds`` run,
    and the cloud set to hold it: returns its Provisioned=False/QueuedForCapacity
    condition."""
    if s.provider == "gcp":
        compute = s.cloud.compute
        with compute.lock:
            compute.grant_after_polls = None
            compute.mig_templates[(GCP_ZONE, FLEX_MIG)] = {
                "machineType": "a3-highgpu-8g", "labels": {"team": "ml"},
                "metadata": {"kube-env": STOCK_KUBE_ENV}}
        queue: Body = {"flexStart": {"instanceGroupManager": FLEX_MIG}}
    else:
        with s.cloud.layer.lock:
            s.cloud.layer.block_offers.clear()
        queue = {"capacityBlockPurchase": {"maxUpfrontFee": BLOCK_FEE}}
    await s.setup(parameters={**s.pool_body()["spec"]["parameters"], **queue})
    await s.kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "queued", pod_sets=[("workers", 2)], namespace=s.namespace, class_name=QUEUED,
        parameters={"maxRunDurationSeconds": str(run_seconds)}), namespace=s.namespace)

    async def queued() -> dict[str, Any] | None:
        cond = await s.condition("queued", "Provisioned")
        return cond if cond and cond.get("reason") == "QueuedForCapacity" else None

    return await eventually(queued, what="the gang to wait in the cloud's queue")


def _grant(s: Scenario) -> None:
    """The emulated cloud lets the queued gang have its capacity: GCP's queue grants the
    resize request; EC2 puts a Capacity Block of 2 in the pool's zone on sale."""
    if s.provider == "gcp":
        with s.cloud.compute.lock:
            s.cloud.compute.grant_after_polls = 0
    else:
        s.cloud.layer.offer_capacity_block(
            zone=AWS_ZONE, instance_type="p5.48xlarge", count=2, upfront_fee="2400.00")


def _stop_granting(s: Scenario) -> None:
    if s.provider == "gcp":
        with s.cloud.compute.lock:
            s.cloud.compute.grant_after_polls = None
    else:
        with s.cloud.layer.lock:
            s.cloud.layer.block_offers.clear()


def _blocks(s: Scenario) -> dict[str, dict[str, Any]]:
    """The Capacity Blocks bought for the pool (by Muster's pool tag)."""
    with s.cloud.layer.lock:
        return {rid: dict(r) for rid, r in s.cloud.layer.capacity_reservations.items()
                if r.get("tags", {}).get("muster.dev/pool") == s.pool}


def _flex_requests(s: Scenario) -> list[dict[str, Any]]:
    """The MIG's resize requests of this scenario's requests (their description names the
    owning request)."""
    with s.cloud.compute.lock:
        return [dict(r) for (z, m, _), r in s.cloud.compute.resize_requests.items()
                if (z, m) == (GCP_ZONE, FLEX_MIG)
                and f" {s.namespace}/" in str(r.get("description"))]


def _queued_nothing_left(s: Scenario) -> bool:
    """No machine of the queued gang (GCP: no MIG VM, no resize request; AWS: no live
    instance of the pool)."""
    if s.provider == "gcp":
        with s.cloud.compute.lock:
            return s.cloud.compute.mig_vms(GCP_ZONE, FLEX_MIG) == [] and not _flex_requests(s)
    return s.cloud.live_instances(s.pool) == []


async def _queued_nodes(s: Scenario) -> list[Body]:
    """The granted gang's 2 Nodes, registered as the pool's."""
    if s.provider == "gcp":
        with s.cloud.compute.lock:
            names = s.cloud.compute.mig_vms(GCP_ZONE, FLEX_MIG)
        ids = {f"gce://{GCP_PROJECT}/{GCP_ZONE}/{n}" for n in names}
    else:
        ids = {f"{PROVIDER_ID['aws']}{i}" for i in await asyncio.to_thread(s.machine_ids)}

    async def adopted() -> list[Body] | None:
        listing = await s.kube.list(NODES)
        found = [n for n in listing.get("items") or []
                 if (n.get("spec") or {}).get("providerID") in ids
                 and (n["metadata"].get("labels") or {}).get(POOL_LABEL) == s.pool
                 and UNREGISTERED_TAINT not in _taints(n)]
        return found if len(found) == 2 else None

    return await eventually(adopted, what="the granted machines registered as the pool's")


async def test_a_queued_gang_is_provisioned_when_the_cloud_queue_grants_it(
    scenario: Scenario,
) -> None:
    """A queued-class gang waits in the cloud's queue with Provisioned=False/QueuedForCapacity
    (GCP: its flex-start resize request ACCEPTED, no VM; AWS: no Capacity Block of the gang on
    sale, nothing bought). When the emulated cloud grants it (GCP: the queue grants the resize
    request and the MIG creates the named VMs from its own template; AWS: a block goes on
    sale, Muster buys it and launches a capacity-block fleet into it), the machines register
    as kubelet does, are booked, and the scheduler binds the gang's pods. Deleting the request
    leaves no machine (GCP: deleted through the MIG, no resize request left; AWS: the block
    stays bought, as EC2 cannot cancel one, with nothing running in it)."""
    s = scenario
    try:
        cond = await _queue_gang(s)
        assert "each to run 3600s once granted" in cond["message"], cond
        if s.provider == "gcp":
            assert "state ACCEPTED" in cond["message"], cond
            [rr] = _flex_requests(s)
            names = [i["name"] for i in rr["instances"]]
            # The run plus the tier's 8 s registration budget: the MIG's clock starts at
            # the VMs' creation, Muster's at Provisioned, so Muster's end comes first.
            assert rr["requestedRunDuration"] == {"seconds": "3608"} and len(names) == 2
            with s.cloud.compute.lock:
                assert s.cloud.compute.mig_vms(GCP_ZONE, FLEX_MIG) == []
        else:
            assert "state no-offering" in cond["message"], cond
            assert f"at or under {BLOCK_FEE}" in cond["message"], cond
            assert "DescribeCapacityBlockOfferings" in s.cloud.layer.actions
            assert _blocks(s) == {} and await asyncio.to_thread(s.machines) == []

        _grant(s)
        await s.wait_condition("queued", "Provisioned", within=60)
        nodes = await _queued_nodes(s)
        for node in nodes:
            labels = node["metadata"]["labels"]
            assert labels[RUN_LABEL] == s.run, "the pool's nodeTemplate labels were applied"
            assert labels[ZONE] == (GCP_ZONE if s.provider == "gcp" else AWS_ZONE)
        ids = {n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes}
        if s.provider == "gcp":
            with s.cloud.compute.lock:
                assert s.cloud.compute.mig_vms(GCP_ZONE, FLEX_MIG) == sorted(names)
            # Only the MIG's VMs: no VM of Muster's own (labelled with the pool) was inserted.
            assert await asyncio.to_thread(s.cloud.live_vms, s.pool) == []
            assert {n["metadata"]["name"] for n in nodes} == set(names)
        else:
            [(rid, block)] = _blocks(s).items()
            assert block["kind"] == "capacity-block" and block["total"] == 2
            assert block["tags"].get("muster.dev/key"), block["tags"]
            assert {s.cloud.layer.reserved_in.get(i) for i in ids} == {rid}, (
                "the gang was launched into the block it bought")
            assert s.cloud.layer.actions.count("PurchaseCapacityBlock") >= 1
        await s.pods_for("queued", 2)
        bound = await eventually(lambda: _bound_all(s, 2), what="the scheduler to bind 2 pods")
        assert set(bound.values()) == {n["metadata"]["name"] for n in nodes}

        # The job is done: its pods and the request go, so the nodes are idle and released.
        for pod in bound:
            await s.kube.delete(PODS, pod, namespace=s.namespace)
        await s.kube.delete(PROVISIONING_REQUESTS, "queued", namespace=s.namespace)

        async def gone() -> bool:
            return await asyncio.to_thread(_queued_nothing_left, s)

        await eventually(gone, what="the gang's machines to go")
        if s.provider == "gcp":
            with s.cloud.compute.lock:
                assert s.cloud.compute.calls("delete_mig_instances"), "deleted through the MIG"
        else:
            [(rid, block)] = _blocks(s).items()
            [found] = (await asyncio.to_thread(
                s.cloud.ec2.describe_capacity_reservations, CapacityReservationIds=[rid]
            ))["CapacityReservations"]
            assert (found["State"], found["AvailableInstanceCount"]) == ("active", 2), found
    finally:
        _stop_granting(s)


async def test_a_queued_request_deleted_while_it_waits_leaves_nothing_in_the_cloud(
    scenario: Scenario,
) -> None:
    """A queued-class gang waiting in the cloud's queue is deleted (Kueue withdrawing it, a
    user cancelling): the request goes, and the cloud holds nothing of it (GCP: the resize
    request is cancelled and deleted, no VM; AWS: no block bought, no instance). Capacity
    offered afterwards is not taken for it (GCP: a grant finds no request; AWS: a block put
    on sale is not bought)."""
    s = scenario
    try:
        await _queue_gang(s)
        if s.provider == "gcp":
            assert [r["state"] for r in _flex_requests(s)] == ["ACCEPTED"]
        purchases = s.cloud.layer.actions.count("PurchaseCapacityBlock")
        await s.kube.delete(PROVISIONING_REQUESTS, "queued", namespace=s.namespace)

        async def request_gone() -> bool:
            return await s.kube.get_or_none(
                PROVISIONING_REQUESTS, "queued", namespace=s.namespace) is None

        await eventually(request_gone, what="the request to go (its finalizer let go)")
        if s.provider == "gcp":
            with s.cloud.compute.lock:
                assert [c.path.rsplit("/", 1)[-1] for c in
                        s.cloud.compute.calls("cancel_resize_request")][-1:] == ["cancel"]
        assert await asyncio.to_thread(_queued_nothing_left, s)
        _grant(s)
        await asyncio.sleep(3)  # six of the tier's queue polls
        assert await asyncio.to_thread(_queued_nothing_left, s)
        assert await asyncio.to_thread(s.machines) == []
        if s.provider == "aws":
            assert s.cloud.layer.actions.count("PurchaseCapacityBlock") == purchases
            assert _blocks(s) == {}, "nothing was bought for the deleted request"
    finally:
        _stop_granting(s)


async def test_deleting_the_pool_of_a_queued_gang_cancels_its_queued_request(
    scenario: Scenario,
) -> None:
    """The pool is deleted while its gang waits in the cloud's queue (GCP: its resize request
    ACCEPTED; AWS: a Capacity Block bought for it that starts later, scheduled): the request
    fails CapacityPoolDeleted saying what the cloud did, and the pool goes (Muster's
    finalizer held it for the cancel). GCP: the resize request is cancelled and deleted,
    nothing is left in the MIG. AWS: EC2 cannot cancel a bought block; it stays, the
    message says so, and nothing was launched."""
    s = scenario
    try:
        await _queue_gang(s)
        if s.provider == "gcp":
            [rr] = _flex_requests(s)
            assert rr["state"] == "ACCEPTED"
        else:
            s.cloud.layer.offer_capacity_block(
                zone=AWS_ZONE, instance_type="p5.48xlarge", count=2, upfront_fee="2400.00",
                start=datetime.now(UTC) + timedelta(hours=2))

            async def scheduled() -> dict[str, Any] | None:
                cond = await s.condition("queued", "Provisioned")
                text = str((cond or {}).get("message"))
                return cond if "state scheduled, the cloud expects it by" in text else None

            await eventually(scheduled, what="the bought block to be scheduled")
            [(rid, block)] = _blocks(s).items()

        await s.kube.delete(CAPACITY_POOLS, s.pool)
        failed = await s.wait_condition("queued", "Failed")
        assert failed["reason"] == "CapacityPoolDeleted", failed
        assert f"CapacityPool {s.pool} was deleted while the gang waited" in failed["message"]
        if s.provider == "gcp":
            assert f"resize request {rr['name']} of instance group manager {FLEX_MIG} " \
                "cancelled and deleted" in failed["message"], failed
            assert "taken out of the queue" not in failed["message"]
        else:
            assert f"Capacity Block {rid} was already bought and cannot be cancelled: it " \
                "stays reserved (and paid) until" in failed["message"], failed

        async def pool_gone() -> bool:
            return await s.kube.get_or_none(CAPACITY_POOLS, s.pool) is None

        await eventually(pool_gone, what="the pool to go once its queue holds nothing")
        assert await asyncio.to_thread(_queued_nothing_left, s)
        if s.provider == "gcp":
            with s.cloud.compute.lock:
                assert [c.path.rsplit("/", 1)[-1] for c in
                        s.cloud.compute.calls("cancel_resize_request")][-1:] == ["cancel"]
        else:
            assert _blocks(s) == {rid: block}, "the block stays: EC2 has no cancel"
    finally:
        _stop_granting(s)


async def test_the_run_duration_ends_the_booking_and_the_machines_go(
    scenario: Scenario,
) -> None:
    """A gang with maxRunDurationSeconds 12: provisioned, and 12 s later the booking ends
    CapacityRevoked/RunDurationExpired and its machines are terminated, though its request
    still exists. AWS: a queued gang in the Capacity Block it bought (the block stays, as
    EC2 keeps it to its end). GCP: an atomic gang on the on-demand pool, since a flex-start
    run lasts at least 600 s (Compute's bound) and the MIG, not Muster, would end it."""
    s = scenario
    try:
        if s.provider == "aws":
            await _queue_gang(s, run_seconds=12)
            _grant(s)
            request = "queued"
        else:
            await s.setup()
            await s.kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
                "gang", pod_sets=[("workers", 2)], namespace=s.namespace,
                parameters={"maxRunDurationSeconds": "12"}), namespace=s.namespace)
            request = "gang"
        nodes = await _provisioned_on(s, request, 2)
        ids = {n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes}
        if s.provider == "aws":
            [(rid, _)] = _blocks(s).items()
            assert {s.cloud.layer.reserved_in.get(i) for i in ids} == {rid}
        revoked = await s.wait_condition(request, "CapacityRevoked", within=40)
        assert revoked["reason"] == "RunDurationExpired", revoked
        assert "12s after the capacity was provisioned" in revoked["message"], revoked

        async def terminated() -> bool:
            return not (await asyncio.to_thread(s.machine_ids)) & ids

        await eventually(terminated, within=40, what="the run's machines to be terminated")
        assert await s.kube.get_or_none(
            PROVISIONING_REQUESTS, request, namespace=s.namespace) is not None
    finally:
        _stop_granting(s)
