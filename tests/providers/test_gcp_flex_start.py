"""Flex-start queued provisioning through zonal MIG resize requests, against the Compute
REST fake (bodies as the google-cloud-compute REST transport serialises the proto types)."""

from __future__ import annotations

import pytest

from controller.acquire.keys import acquisition_key
from providers.base import AcquireRequest, ProviderConfigError, TransientProviderError
from providers.gcp import flex_instance_names, resize_request_name
from tests.providers.conftest import GCP_ZONE, ZONE_LABEL, GcpFake

MIG = "a3-flex"


def req(gcp: GcpFake, count: int = 16, **params: object) -> AcquireRequest:
    pool = gcp.pool(flexStart={"instanceGroupManager": MIG}, **params)  # type: ignore[arg-type]
    return AcquireRequest(key=acquisition_key("uid-q", 0, 0), pool=pool, count=count,
                          domain={ZONE_LABEL: GCP_ZONE}, owner="ml/train", owner_uid="uid-q")


async def test_a_gang_waits_in_the_queue_all_or_nothing_then_is_granted(
    gcp_fake: GcpFake,
) -> None:
    provider, r = gcp_fake.provider(), req(gcp_fake)
    queued = await provider.enqueue(r, 3 * 3600, ready_within=0)

    [call] = gcp_fake.fake.calls("insert_resize_request")
    assert call.path == (f"/compute/v1/projects/muster-test/zones/{GCP_ZONE}/"
                         f"instanceGroupManagers/{MIG}/resizeRequests")
    # The VMs are named (not resizeBy), so what the MIG creates is the key's.
    assert "resizeBy" not in call.body
    assert [i["name"] for i in call.body["instances"]] == flex_instance_names(
        r.pool.metadata.name, r.key, 16)
    assert call.body["requestedRunDuration"] == {"seconds": "10800"}
    assert call.body["name"] == resize_request_name(r.key)
    assert (queued.state, queued.since) == ("ACCEPTED", "2026-12-02T08:00:00.000-08:00")
    assert gcp_fake.fake.all_instances() == []

    # A repeat (a restarted controller) joins the same request.
    again = await provider.enqueue(r, 3 * 3600, ready_within=0)
    assert again.name == queued.name and len(gcp_fake.fake.resize_requests) == 1

    gcp_fake.fake.grant(GCP_ZONE, MIG, queued.name)
    granted = await provider.queued(r.pool, r.key)
    assert granted is not None and granted.state == "SUCCEEDED"
    assert len(gcp_fake.fake.all_instances()) == 16


async def test_a_cancelled_request_leaves_nothing(gcp_fake: GcpFake) -> None:
    provider, r = gcp_fake.provider(), req(gcp_fake)
    await provider.enqueue(r, 3600, ready_within=0)
    said = await provider.cancel_queued(r.pool, r.key)
    assert said is not None and said.endswith("cancelled and deleted"), said
    assert gcp_fake.fake.resize_requests == {}
    assert [c.path.rsplit("/", 1)[-1] for c in gcp_fake.fake.calls("cancel_resize_request")] \
        == ["cancel"]
    assert await provider.queued(r.pool, r.key) is None
    assert await provider.cancel_queued(r.pool, r.key) is None
    assert gcp_fake.fake.all_instances() == []


async def test_a_granted_request_is_deleted_without_a_cancel(gcp_fake: GcpFake) -> None:
    provider, r = gcp_fake.provider(), req(gcp_fake, 2)
    queued = await provider.enqueue(r, 3600, ready_within=0)
    gcp_fake.fake.grant(GCP_ZONE, MIG, queued.name)
    assert len(gcp_fake.fake.mig_vms(GCP_ZONE, MIG)) == 2
    said = await provider.cancel_queued(r.pool, r.key)
    assert said is not None and said.endswith(
        "deleted (it was SUCCEEDED), and the 2 VM(s) it had made deleted through the MIG"), said
    assert gcp_fake.fake.calls("cancel_resize_request") == []
    assert gcp_fake.fake.resize_requests == {}
    # What the grant made goes with it: nothing is left that no request names any more.
    assert gcp_fake.fake.mig_vms(GCP_ZONE, MIG) == []


async def test_a_request_whose_vms_are_being_made_is_not_reported_cancelled(
    gcp_fake: GcpFake,
) -> None:
    """CREATING can be neither cancelled nor deleted: the cancel is refused (to be tried
    again), the request stays, and the next try deletes it and the VMs it made."""
    provider, r = gcp_fake.provider(), req(gcp_fake, 2)
    queued = await provider.enqueue(r, 3600, ready_within=0)
    gcp_fake.fake.resize_requests[(GCP_ZONE, MIG, queued.name)]["state"] = "CREATING"
    with pytest.raises(TransientProviderError, match="CREATING"):
        await provider.cancel_queued(r.pool, r.key)
    assert len(gcp_fake.fake.resize_requests) == 1
    gcp_fake.fake.grant(GCP_ZONE, MIG, queued.name)
    said = await provider.cancel_queued(r.pool, r.key)
    assert said is not None and "2 VM(s) it had made deleted" in said, said
    assert gcp_fake.fake.resize_requests == {}
    assert gcp_fake.fake.mig_vms(GCP_ZONE, MIG) == []


@pytest.mark.parametrize("seconds", [0, 599, 7 * 24 * 3600 + 1])
async def test_a_run_duration_compute_refuses_is_a_configuration_error(
    gcp_fake: GcpFake, seconds: int,
) -> None:
    with pytest.raises(ProviderConfigError, match="maxRunDurationSeconds"):
        await gcp_fake.provider().enqueue(req(gcp_fake), seconds, ready_within=0)
    assert gcp_fake.fake.calls("insert_resize_request") == []


async def test_a_pool_without_a_mig_cannot_queue(gcp_fake: GcpFake) -> None:
    pool = gcp_fake.pool()
    r = AcquireRequest(key=acquisition_key("uid-q", 0, 0), pool=pool, count=2,
                       domain={ZONE_LABEL: GCP_ZONE}, owner="ml/train")
    with pytest.raises(ProviderConfigError, match=r"flexStart\.instanceGroupManager"):
        await gcp_fake.provider().enqueue(r, 3600, ready_within=0)


async def test_a_refused_insert_is_not_retried_as_transient(gcp_fake: GcpFake) -> None:
    gcp_fake.fake.inject("insert_resize_request", 403, "quotaExceeded")
    from providers.base import QuotaExceeded

    with pytest.raises(QuotaExceeded):
        await gcp_fake.provider().enqueue(req(gcp_fake), 3600, ready_within=0)
    assert len(gcp_fake.fake.calls("insert_resize_request")) == 1


async def test_the_queue_outcome_and_a_flex_pool_never_launching_on_demand(
    gcp_fake: GcpFake,
) -> None:
    """The class asks by outcome: ACCEPTED is queued, SUCCEEDED granted. A flexStart pool's
    ``acquire`` never inserts an on-demand VM (its VMs come from the queue only): before the
    grant it refuses, and nothing is left under the key."""
    from providers.base import GRANTED, QUEUED

    provider, r = gcp_fake.provider(), req(gcp_fake, 2)
    assert provider.queues(r.pool)
    with pytest.raises(ProviderConfigError, match="come only from its queue"):
        await provider.acquire(r)
    queued = await provider.enqueue(r, None, ready_within=0)
    assert queued.outcome == QUEUED
    [call] = gcp_fake.fake.calls("insert_resize_request")
    assert call.body["requestedRunDuration"] == {"seconds": str(7 * 24 * 3600)}
    gcp_fake.fake.grant(GCP_ZONE, MIG, queued.name)
    granted = await provider.queued(r.pool, r.key)
    assert granted is not None and granted.outcome == GRANTED
    assert gcp_fake.fake.calls("bulk_insert") == []


async def test_a_grant_missing_vms_is_a_stock_out_and_leaves_nothing(gcp_fake: GcpFake) -> None:
    """A granted request one of whose VMs is gone (the MIG's run ended, deleted out of
    band): the gang is incomplete, so acquire fails as a stock-out (retryable) and the
    skeleton's compensation deletes the rest through the MIG and the resize request."""
    from providers.base import CapacityUnavailable

    fake = gcp_fake.fake
    provider, r = gcp_fake.provider(), req(gcp_fake, 2)
    queued = await provider.enqueue(r, 3600, ready_within=0)
    fake.grant(GCP_ZONE, MIG, queued.name)
    first = fake.mig_vms(GCP_ZONE, MIG)[0]
    with fake.lock:
        fake.mig_members[(GCP_ZONE, MIG)].discard(first)
        del fake.instances[GCP_ZONE][first]
    with pytest.raises(CapacityUnavailable, match="SUCCEEDED but 1 of its 2 VM"):
        await provider.acquire(r)
    assert fake.calls("bulk_insert") == []
    assert fake.all_instances() == [] and fake.resize_requests == {}


async def test_a_granted_gang_is_adopted_by_name_listed_and_released_through_the_mig(
    gcp_fake: GcpFake,
) -> None:
    """The queue grants on its own (accepted, then CREATING, then SUCCEEDED with every VM
    at once in the MIG, labelled by the MIG's template only). ``acquire`` adopts those VMs
    as the key's nodes without launching anything; a pool listing (the collector's) finds
    them with their key and owner from the resize request; release deletes them through
    the MIG (which would refill a plain delete) and the resize request with them."""
    from providers.base import GRANTED

    fake = gcp_fake.fake
    fake.grant_after_polls = 1
    fake.mig_templates[(GCP_ZONE, MIG)] = {"machineType": "a3-highgpu-8g",
                                            "labels": {"team": "ml"}}
    provider, r = gcp_fake.provider(), req(gcp_fake, 3)
    states = [(await provider.enqueue(r, 3600, ready_within=0)).state]
    for _ in range(3):
        got = await provider.queued(r.pool, r.key)
        assert got is not None
        states.append(got.state)
        if got.outcome == GRANTED:
            break
    # Read once while ACCEPTED (by enqueue), then CREATING for one read (still queued),
    # then SUCCEEDED.
    assert states == ["ACCEPTED", "CREATING", "SUCCEEDED"]
    names = flex_instance_names(r.pool.metadata.name, r.key, 3)
    assert fake.mig_vms(GCP_ZONE, MIG) == names
    assert all(i["labels"] == {"team": "ml"} for i in fake.all_instances())

    nodes = await provider.acquire(r)
    assert [n.name for n in nodes] == names
    assert [n.provider_id for n in nodes] == [
        f"gce://muster-test/{GCP_ZONE}/{n}" for n in names]
    assert {(n.key, n.owner, n.owner_uid, n.pool) for n in nodes} == {
        (r.key, "ml/train", "uid-q", r.pool.metadata.name)}
    assert all(n.labels[ZONE_LABEL] == GCP_ZONE
               and n.labels["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
               for n in nodes)
    assert fake.calls("bulk_insert") == []

    listed = await provider.list(r.pool)
    assert [(n.name, n.key, n.owner) for n in listed] == [
        (n, r.key, "ml/train") for n in names]

    assert await provider.release(r.pool, r.key) == 3
    [delete] = fake.calls("delete_mig_instances")
    assert delete.path.endswith(f"/instanceGroupManagers/{MIG}/deleteInstances")
    assert delete.body == {"instances": [f"zones/{GCP_ZONE}/instances/{n}" for n in names],
                           "skipInstancesOnValidationError": True}
    assert fake.calls("delete_instance") == []
    assert fake.all_instances() == [] and fake.mig_vms(GCP_ZONE, MIG) == []
    assert fake.resize_requests == {}
    assert await provider.list(r.pool) == []
    assert await provider.release(r.pool, r.key) == 0


async def test_a_grant_waits_for_the_zones_stock_and_other_migs_vms_are_not_adopted(
    gcp_fake: GcpFake,
) -> None:
    """The emulated queue grants only when the zone holds the whole gang; VMs of the MIG
    that no resize request of Muster's named (another key's, or the MIG's own) are never
    the key's."""
    from providers.base import GRANTED, QUEUED

    fake = gcp_fake.fake
    fake.grant_after_polls = 0
    fake.stock[GCP_ZONE] = 1
    provider = gcp_fake.provider()
    r = req(gcp_fake, 2)
    await provider.enqueue(r, 3600, ready_within=0)
    for _ in range(3):
        got = await provider.queued(r.pool, r.key)
        assert got is not None and got.outcome == QUEUED and got.state == "ACCEPTED"
    fake._mig_vm(GCP_ZONE, MIG, f"{MIG}-abcd", placement="the MIG's own")
    assert await provider.list(r.pool) == []

    fake.stock[GCP_ZONE] = 10
    for _ in range(2):
        got = await provider.queued(r.pool, r.key)
    assert got is not None and got.outcome == GRANTED
    nodes = await provider.acquire(r)
    assert sorted(n.name for n in nodes) == flex_instance_names(r.pool.metadata.name, r.key, 2)
    assert {n.name for n in await provider.list(r.pool)} == {n.name for n in nodes}


@pytest.mark.parametrize(("run", "ready", "asked"), [
    (3600, 900, 4500),
    (3600, 0.5, 3601),
    (7 * 24 * 3600 - 100, 900, 7 * 24 * 3600),
])
async def test_the_mig_is_asked_for_the_run_plus_the_registration_budget(
    gcp_fake: GcpFake, run: int, ready: float, asked: int,
) -> None:
    """The MIG deletes the VMs requestedRunDuration after it creates them; Muster counts the
    run from Provisioned, up to the registration budget later. Asking for the run alone
    would let the VMs vanish before Muster ends the run (BookedNodesVanished instead of
    RunDurationExpired); Compute's 7-day bound caps it."""
    await gcp_fake.provider().enqueue(req(gcp_fake), run, ready_within=ready)
    [call] = gcp_fake.fake.calls("insert_resize_request")
    assert call.body["requestedRunDuration"] == {"seconds": str(asked)}
