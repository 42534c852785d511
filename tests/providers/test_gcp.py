"""GCP provider against the local Compute REST fake (ClientOptions api_endpoint,
AnonymousCredentials, REST transport): request bodies, polling, errors, crash recovery."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from controller.acquire.keys import acquisition_key
from providers.base import (
    AcquireRequest,
    CapacityUnavailable,
    ProviderConfigError,
    QuotaExceeded,
    TransientProviderError,
)
from providers.gcp import GcpProvider
from providers.naming import gcp_request_id
from tests.providers.conftest import GCP_ZONE, GRACE, ZONE_LABEL, GcpFake, restarted

DOMAIN = {ZONE_LABEL: GCP_ZONE}


def req(gcp: GcpFake, uid: str, count: int, attempt: int = 0, **params: object) -> AcquireRequest:
    pool = gcp.pool(**params)  # type: ignore[arg-type]
    return AcquireRequest(
        key=acquisition_key(uid, attempt, 0), pool=pool, count=count,
        domain=DOMAIN, owner=f"ml/{uid}", owner_uid=uid,
    )


async def test_bulk_insert_body_is_all_or_nothing_with_a_deterministic_request_id(
    gcp_fake: GcpFake,
) -> None:
    r = req(gcp_fake, "uid-a", 4, accelerators=[{"type": "nvidia-l4", "count": 8}],
            machineType="g2-standard-96", serviceAccount={"email": "nodes@p.iam"},
            networkTags=["gpu"])
    nodes = await gcp_fake.provider().acquire(r)

    [call] = gcp_fake.fake.calls("bulk_insert")
    assert call.path == f"/compute/v1/projects/muster-test/zones/{GCP_ZONE}/instances/bulkInsert"
    request_id = call.query["requestId"][0]
    assert request_id == gcp_request_id(r.key) and uuid.UUID(request_id).version == 5
    body = call.body
    assert body["count"] == "4" and body["minCount"] == "4"
    assert body["namePattern"].endswith("-####") and body["namePattern"].startswith("gpu-pool-")
    props = body["instanceProperties"]
    assert props["machineType"] == "g2-standard-96"
    assert props["guestAccelerators"] == [
        {"acceleratorType": "nvidia-l4", "acceleratorCount": 8}]
    assert props["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert props["disks"][0]["initializeParams"]["sourceImage"].endswith("cos-stable")
    assert props["labels"] == {"team": "ml", "muster-pool": "gpu-pool", "muster-key": r.key,
                               "muster-cluster": "test-cluster"}
    meta = {i["key"]: i["value"] for i in props["metadata"]["items"]}
    assert meta["startup-script"].startswith("#!/bin/sh")
    assert meta["muster-key"] == r.key and meta["muster-owner"] == "ml/uid-a"
    assert props["serviceAccounts"][0]["email"] == "nodes@p.iam"
    assert props["tags"] == {"items": ["gpu"]}

    names = sorted(i["name"] for i in gcp_fake.fake.all_instances())
    assert [n.name for n in nodes] == names and len(names) == 4
    assert nodes[0].provider_id == f"gce://muster-test/{GCP_ZONE}/{names[0]}"
    assert nodes[0].labels["node.kubernetes.io/instance-type"] == "g2-standard-96"


async def test_operation_is_polled_on_the_configured_endpoint_until_done(
    gcp_fake: GcpFake,
) -> None:
    gcp_fake.fake.polls_before_done = 3
    nodes = await gcp_fake.provider().acquire(req(gcp_fake, "uid-a", 2))
    assert len(nodes) == 2
    waits = gcp_fake.fake.calls("wait_operation")
    # wait() returned RUNNING three times: the provider kept polling our fake, not Google.
    assert len(waits) == 4
    assert all(w.path.startswith("/compute/v1/projects/muster-test/zones/") for w in waits)


async def test_stock_out_creates_nothing_and_is_capacity_unavailable(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.stock[GCP_ZONE] = 3
    provider = gcp_fake.provider()
    with pytest.raises(CapacityUnavailable, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await provider.acquire(req(gcp_fake, "uid-a", 4))
    assert gcp_fake.fake.all_instances() == []
    assert await provider.list(gcp_fake.pool()) == []


async def test_quota_error_in_the_operation_is_quota_exceeded(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.operation_error = "QUOTA_EXCEEDED"
    with pytest.raises(QuotaExceeded):
        await gcp_fake.provider().acquire(req(gcp_fake, "uid-a", 2))


async def test_rate_limit_is_retried_with_the_same_request_id(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.inject("bulk_insert", 403, "rateLimitExceeded", times=2)
    r = req(gcp_fake, "uid-a", 2)
    assert len(await gcp_fake.provider().acquire(r)) == 2
    calls = gcp_fake.fake.calls("bulk_insert")
    assert len(calls) == 3
    assert {c.query["requestId"][0] for c in calls} == {gcp_request_id(r.key)}


async def test_rate_limit_that_never_ends_is_transient(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.inject("bulk_insert", 403, "rateLimitExceeded", times=10)
    with pytest.raises(TransientProviderError, match="rateLimitExceeded"):
        await gcp_fake.provider().acquire(req(gcp_fake, "uid-a", 2))
    assert len(gcp_fake.fake.calls("bulk_insert")) == 4


@pytest.mark.parametrize(("status", "reason", "error"), [
    (403, "quotaExceeded", QuotaExceeded),
    (503, "insufficientCapacity", CapacityUnavailable),
    (400, "invalid", ProviderConfigError),
    (403, "forbidden", ProviderConfigError),
])
async def test_synchronous_errors_are_mapped(
    gcp_fake: GcpFake, status: int, reason: str, error: type[Exception]
) -> None:
    gcp_fake.fake.inject("bulk_insert", status, reason)
    with pytest.raises(error):
        await gcp_fake.provider().acquire(req(gcp_fake, "uid-a", 2))
    assert len(gcp_fake.fake.calls("bulk_insert")) == 1  # none of these is retried


async def test_same_key_twice_creates_once(gcp_fake: GcpFake) -> None:
    provider = gcp_fake.provider()
    r = req(gcp_fake, "uid-a", 3)
    first = await provider.acquire(r)
    second = await provider.acquire(r)
    assert first == second
    assert len(gcp_fake.fake.calls("bulk_insert")) == 1
    assert len(gcp_fake.fake.all_instances()) == 3


async def test_compact_placement_policy_per_acquisition_is_created_and_deleted(
    gcp_fake: GcpFake,
) -> None:
    provider = gcp_fake.provider()
    r = req(gcp_fake, "uid-a", 2, compactPlacement=True)
    await provider.acquire(r)
    [policy] = gcp_fake.fake.policies["us-central1"].values()
    assert policy["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    props = gcp_fake.fake.calls("bulk_insert")[0].body["instanceProperties"]
    assert props["resourcePolicies"] == [
        f"projects/muster-test/regions/us-central1/resourcePolicies/{policy['name']}"]
    assert await provider.release(r.pool, r.key) == 2
    assert gcp_fake.fake.policies["us-central1"] == {}
    assert gcp_fake.fake.all_instances() == []


async def test_failed_acquire_deletes_its_placement_policy(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.stock[GCP_ZONE] = 1
    with pytest.raises(CapacityUnavailable):
        await gcp_fake.provider().acquire(req(gcp_fake, "uid-a", 2, compactPlacement=True))
    assert gcp_fake.fake.policies["us-central1"] == {}


async def test_list_follows_pages_and_release_is_idempotent(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.page_size = 2
    provider = gcp_fake.provider()
    a, b = req(gcp_fake, "uid-a", 3), req(gcp_fake, "uid-b", 2)
    await provider.acquire(a)
    await provider.acquire(b)
    listed = await provider.list(a.pool)
    assert sorted(n.key for n in listed) == sorted([a.key] * 3 + [b.key] * 2)
    assert await provider.release(a.pool, a.key) == 3
    assert await provider.release(a.pool, a.key) == 0
    assert {n.key for n in await provider.list(a.pool)} == {b.key}


async def test_domain_in_another_zone_is_refused(gcp_fake: GcpFake) -> None:
    r = req(gcp_fake, "uid-a", 1)
    other = AcquireRequest(key=r.key, pool=r.pool, count=1,
                           domain={ZONE_LABEL: "europe-west4-b"}, owner="ml/x")
    with pytest.raises(ProviderConfigError, match="europe-west4-b"):
        await gcp_fake.provider().acquire(other)


A4_NICS = [
    {"subnetwork": "projects/muster-test/regions/us-central1/subnetworks/host-0",
     "nicType": "GVNIC"},
    {"subnetwork": "projects/muster-test/regions/us-central1/subnetworks/host-1",
     "nicType": "GVNIC"},
    *({"subnetwork": f"projects/muster-test/regions/us-central1/subnetworks/rdma-{k}",
       "nicType": "MRDMA"} for k in range(8)),
]


async def test_an_a4_vm_gets_its_ten_nics_and_a_labelled_boot_disk(gcp_fake: GcpFake) -> None:
    """A4 (and A3 Ultra): two gVNIC then eight RDMA NICs, in order, as Compute's API shapes
    them (the fake parses the body with the API's own message types and nicType enum);
    the boot disk carries the VM's labels."""
    r = req(gcp_fake, "uid-n", 1, machineType="a4-highgpu-8g", networkInterfaces=A4_NICS)
    await gcp_fake.provider().acquire(r)
    [call] = gcp_fake.fake.calls("bulk_insert")
    props = call.body["instanceProperties"]
    assert props["networkInterfaces"] == A4_NICS
    assert props["disks"][0]["initializeParams"]["labels"] == props["labels"]
    assert props["labels"]["muster-key"] == r.key


def test_the_nic_types_are_computes_own() -> None:
    from google.cloud import compute_v1

    from providers.gcp import NIC_TYPES
    nic_types: Any = compute_v1.NetworkInterface.NicType  # a proto-plus enum: iterable
    assert set(NIC_TYPES) == {e.name for e in nic_types} - {
        "UNDEFINED_NIC_TYPE", "UNSPECIFIED_NIC_TYPE"}


@pytest.mark.parametrize(("nics", "extra", "words"), [
    ([{"subnetwork": "s", "nicType": "RDMA"}], {}, "nicType"),
    ([{"nicType": "GVNIC"}], {}, "set network or subnetwork"),
    (A4_NICS, {"network": "default"}, "not both"),
    (A4_NICS[2:], {}, "cannot be an RDMA NIC"),
    ([{"subnetwork": "projects/p/regions/europe-west4/subnetworks/x"}], {},
     "not the pool's us-central1"),
    (A4_NICS + A4_NICS[:1], {}, "networkInterfaces"),
])
async def test_bad_network_interfaces_are_refused_before_any_call(
    gcp_fake: GcpFake, nics: list[dict[str, str]], extra: dict[str, str], words: str,
) -> None:
    pool = gcp_fake.pool(networkInterfaces=nics, **extra)
    with pytest.raises(ProviderConfigError, match=words):
        await gcp_fake.provider().validate(pool)
    assert gcp_fake.fake.calls("bulk_insert") == []


async def test_a_placeholder_zone_is_the_pools_zone(gcp_fake: GcpFake) -> None:
    """A pool without declared domains: the planner's placeholder zone is no zone at all;
    the machines go to the pool's zone, and the nodes say so."""
    r = req(gcp_fake, "uid-a", 1)
    fresh = AcquireRequest(key=r.key, pool=r.pool, count=1,
                           domain={ZONE_LABEL: "muster-new-gpu-pool-0"}, owner="ml/x")
    nodes = await gcp_fake.provider().acquire(fresh)
    assert [n.labels[ZONE_LABEL] for n in nodes] == [GCP_ZONE]


@pytest.mark.parametrize(("params", "field"), [
    ({"project": "X"}, "project"),
    ({"zone": "us-central1"}, "zone"),
    ({"labels": {"Team": "ml"}}, "labels"),
    ({"labels": {"muster-key": "x"}}, "labels"),
    ({"metadata": {"muster-owner": "x"}}, "metadata"),
    ({"accelerators": [{"type": "nvidia-h100-80gb", "count": 0}]}, "accelerators"),
    ({"credentialsJson": "{}"}, "credentialsJson"),
])
async def test_validate_names_the_bad_field(gcp_fake: GcpFake, params: dict[str, object],
                                            field: str) -> None:
    with pytest.raises(ProviderConfigError, match=rf"spec\.parameters\.{field}"):
        await gcp_fake.provider().validate(gcp_fake.pool(**params))


async def test_missing_credentials_are_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object,
) -> None:
    from google.auth import exceptions as auth_exc

    def no_adc() -> object:
        raise auth_exc.DefaultCredentialsError("Your default credentials were not found")

    provider = GcpProvider(clients_factory=no_adc)  # type: ignore[arg-type]
    pool = GcpFake(None, "").pool()  # type: ignore[arg-type]
    with pytest.raises(ProviderConfigError, match="Application Default Credentials"):
        await provider.list(pool)


@pytest.mark.parametrize("crash", ["result-forgotten", "killed-while-waiting"])
async def test_crash_after_the_cloud_call_leaks_nothing_and_duplicates_nothing(
    gcp_fake: GcpFake, crash: str,
) -> None:
    live = req(gcp_fake, "uid-live", 2)
    dead = req(gcp_fake, "uid-dead", 3)
    before = gcp_fake.provider()
    if crash == "result-forgotten":
        await before.acquire(live)
        await before.acquire(dead)
    else:
        gcp_fake.fake.polls_before_done = 10**6  # operations never finish for this process
        for inserts, r in enumerate((live, dead), start=1):
            task = asyncio.create_task(before.acquire(r))
            # Wait for this acquisition's own insert, then for a poll after it: counting polls
            # alone races with the previous (cancelled) acquisition's thread, which keeps
            # polling its operation.
            assert await asyncio.to_thread(gcp_fake.fake.wait_for_calls, "bulk_insert", inserts)
            polls = len(gcp_fake.fake.calls("wait_operation"))
            assert await asyncio.to_thread(gcp_fake.fake.wait_for_calls, "wait_operation",
                                           polls + 1)
            task.cancel()  # the process is killed while waiting on the operation
            with pytest.raises(asyncio.CancelledError):
                await task
        gcp_fake.fake.polls_before_done = 0
    assert len(gcp_fake.fake.all_instances()) == 5

    after = gcp_fake.provider()
    controller = restarted(after, live.pool)
    assert await controller.sweep() == {}  # the live plan is not in the cache yet: grace
    await controller.clock.advance(GRACE / 2)
    controller.shows(live)
    assert await controller.sweep() == {}

    inserts = len(gcp_fake.fake.calls("bulk_insert"))
    adopted = await after.acquire(live)
    assert len(adopted) == 2
    assert len(gcp_fake.fake.calls("bulk_insert")) == inserts

    await controller.clock.advance(GRACE / 2)
    assert await controller.sweep() == {dead.key: 3}
    remaining = gcp_fake.fake.all_instances()
    assert len(remaining) == 2
    assert {i["labels"]["muster-key"] for i in remaining} == {live.key}


async def test_an_operation_timeout_ends_the_attempt_and_a_late_vm_is_collected(
    gcp_fake: GcpFake,
) -> None:
    """The one transient-error policy: a bulkInsert still running after the operation
    timeout is a retryable failure, and what it left under the key is deleted at once (the
    controller moves on to a new key). A VM the operation creates afterwards carries the
    abandoned key, and the collector releases it after its grace period."""
    gcp_fake.fake.polls_before_done = 10**6
    r = req(gcp_fake, "uid-a", 2)
    slow = gcp_fake.provider(operation_timeout_seconds=0.2)
    with pytest.raises(TransientProviderError, match="not done after") as caught:
        await slow.acquire(r)
    assert caught.value.retryable
    assert gcp_fake.fake.all_instances() == []
    gcp_fake.fake.polls_before_done = 0

    # The operation finishes late: one more VM under the abandoned key.
    insert = gcp_fake.fake.calls("bulk_insert")[0].body
    gcp_fake.fake.instances[GCP_ZONE]["late-vm"] = {
        "kind": "compute#instance", "id": "1", "name": "late-vm", "status": "RUNNING",
        "zone": f"https://compute.googleapis.com/compute/v1/projects/muster-test/zones/{GCP_ZONE}",
        "machineType": "zones/x/machineTypes/a3-highgpu-8g",
        "labels": dict(insert["instanceProperties"]["labels"]),
        "metadata": insert["instanceProperties"]["metadata"],
    }
    controller = restarted(gcp_fake.provider(), r.pool)
    assert await controller.sweep() == {}
    await controller.clock.advance(GRACE)
    assert await controller.sweep() == {r.key: 1}
    assert gcp_fake.fake.all_instances() == []


def test_the_startup_taint_reaches_a_stock_kube_env_and_the_metadata() -> None:
    from providers.gcp import META_STARTUP_TAINT, STARTUP_TAINT_VALUE, with_startup_taint

    plain = with_startup_taint({"startup-script": "#!/bin/bash"})
    assert plain[META_STARTUP_TAINT] == STARTUP_TAINT_VALUE
    assert plain["startup-script"] == "#!/bin/bash"
    env = with_startup_taint({"kube-env": "CLUSTER_NAME: c\nNODE_TAINTS: 'a=b:NoSchedule'\n"})
    assert f"NODE_TAINTS: 'a=b:NoSchedule,{STARTUP_TAINT_VALUE}'" in env["kube-env"]
    assert "CLUSTER_NAME: c" in env["kube-env"]
    assert with_startup_taint(env)["kube-env"] == env["kube-env"]
    bare = with_startup_taint({"kube-env": "CLUSTER_NAME: c"})
    assert f"NODE_TAINTS: '{STARTUP_TAINT_VALUE}'" in bare["kube-env"]


def test_host_topology_is_read_from_what_compute_reports() -> None:
    from google.cloud import compute_v1

    from providers.gcp import host_topology

    instance = compute_v1.Instance(resource_status=compute_v1.ResourceStatus(
        physical_host_topology=compute_v1.ResourceStatusPhysicalHostTopology(
            block="b1", subblock="sb2", host="h3")))
    assert host_topology(instance) == {
        "cloud.google.com/gce-topology-block": "b1",
        "cloud.google.com/gce-topology-subblock": "sb2",
        "cloud.google.com/gce-topology-host": "h3",
    }
    assert host_topology(compute_v1.Instance()) == {}


async def test_release_with_a_real_acquisition_key_deletes_every_vm(gcp_fake: GcpFake) -> None:
    """Keys are ``<request uid>-<attempt>-<index>`` (40 characters): each VM's delete
    requestId must not be built from the key and the VM name together (over 63 characters)."""
    provider = gcp_fake.provider()
    r = req(gcp_fake, "5ef2bbdb-204f-4acb-9d0b-6510d3dc0e58", 2)
    assert len(r.key) >= 40
    await provider.acquire(r)
    assert len(gcp_fake.fake.all_instances()) == 2
    assert await provider.release(r.pool, r.key) == 2
    assert gcp_fake.fake.all_instances() == []
    ids = {c.query["requestId"][0] for c in gcp_fake.fake.calls("delete_instance")}
    assert len(ids) == 2, "one idempotent requestId per VM"
