"""AWS provider against moto (with Fleet semantics): tags, list/release, compensation, and
the crash test: the controller dies after the cloud call and before its status write."""

from __future__ import annotations

import pytest

from controller.acquire.keys import acquisition_key
from providers.base import AcquireRequest, CapacityUnavailable, ProviderConfigError
from tests.providers.aws_fake import ControllerCrash
from tests.providers.conftest import AWS_ZONE, GRACE, ZONE_LABEL, MotoEc2, restarted

DOMAIN = {ZONE_LABEL: AWS_ZONE}


def req(
    moto_ec2: MotoEc2, uid: str, count: int, attempt: int = 0, **pool: object
) -> AcquireRequest:
    p = moto_ec2.pool(**pool)  # type: ignore[arg-type]
    return AcquireRequest(
        key=acquisition_key(uid, attempt, 0), pool=p, count=count,
        domain=DOMAIN, owner=f"ml/{uid}", owner_uid=uid,
    )


async def test_instances_carry_every_muster_tag(moto_ec2: MotoEc2) -> None:
    provider = moto_ec2.provider()
    r = req(moto_ec2, "uid-a", 2)
    nodes = await provider.acquire(r)
    tags = [{t["Key"]: t["Value"] for t in i["Tags"]} for i in moto_ec2.live_instances()]
    assert len(tags) == 2
    for t in tags:
        assert t["muster.dev/pool"] == "gpu-pool"
        assert t["muster.dev/key"] == r.key
        assert t["muster.dev/owner"] == "ml/uid-a"
        assert t["muster.dev/owner-uid"] == "uid-a"
        assert t["muster.dev/cluster"] == "test-cluster"
        assert t["team"] == "ml"
    assert all(n.name.endswith(".ec2.internal") for n in nodes)
    assert nodes[0].labels["topology.k8s.aws/network-node-layer-1"] == "nn-spine-1"


def _volume_and_interface_tags(
    moto_ec2: MotoEc2,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The tags of every volume, and of every network interface, of the live instances."""
    volumes, interfaces = [], []
    for instance in moto_ec2.live_instances():
        volume_ids = [m["Ebs"]["VolumeId"] for m in instance["BlockDeviceMappings"]]
        eni_ids = [n["NetworkInterfaceId"] for n in instance["NetworkInterfaces"]]
        volumes += [{t["Key"]: t["Value"] for t in v.get("Tags", [])} for v in
                    moto_ec2.client.describe_volumes(VolumeIds=volume_ids)["Volumes"]]
        interfaces += [{t["Key"]: t["Value"] for t in n.get("TagSet", [])} for n in
                       moto_ec2.client.describe_network_interfaces(
                           NetworkInterfaceIds=eni_ids)["NetworkInterfaces"]]
    return volumes, interfaces


@pytest.mark.parametrize("bootstrap", ["asIs", "nodeadm"])
async def test_volumes_and_interfaces_carry_the_acquisition_s_tags(
    moto_ec2: MotoEc2, bootstrap: str,
) -> None:
    """A platform team audits cost by tag: every volume and network interface of a gang's
    instances names its pool, acquisition key and owner, whether the pool's own template is
    used as it is (asIs) or Muster's copy of it (nodeadm); the template's own volume tags
    stay."""
    import base64

    template = str(moto_ec2.client.create_launch_template(
        LaunchTemplateName=f"tagged-{bootstrap}", LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "UserData": base64.b64encode(STOCK_USER_DATA.encode()).decode(),
            "TagSpecifications": [{"ResourceType": "volume",
                                   "Tags": [{"Key": "backup", "Value": "daily"}]}],
        })["LaunchTemplate"]["LaunchTemplateId"])
    r = req(moto_ec2, "uid-a", 2, launchTemplate={"id": template}, bootstrap=bootstrap)
    await moto_ec2.provider().acquire(r)
    volumes, interfaces = _volume_and_interface_tags(moto_ec2)
    assert len(volumes) >= 2 and len(interfaces) >= 2  # a root volume and an ENI each
    for tags in volumes + interfaces:
        assert tags["muster.dev/key"] == r.key, tags
        assert tags["muster.dev/pool"] == "gpu-pool"
        assert tags["muster.dev/owner"] == "ml/uid-a"
        assert tags["muster.dev/cluster"] == "test-cluster"
        assert tags["team"] == "ml"
    assert all(t["backup"] == "daily" for t in volumes)


async def test_list_sees_only_this_pool_and_cluster(moto_ec2: MotoEc2) -> None:
    ours = moto_ec2.provider()
    other_cluster = moto_ec2.provider(cluster_name="other-cluster")
    await ours.acquire(req(moto_ec2, "uid-a", 2))
    other = moto_ec2.pool(name="other-pool")
    await ours.acquire(AcquireRequest(key="other-key", pool=other, count=1, domain=DOMAIN,
                                      owner="ml/x"))
    assert len(await ours.list(moto_ec2.pool())) == 2
    assert len(await ours.list(other)) == 1
    assert await other_cluster.list(moto_ec2.pool()) == []


async def test_partial_launch_is_rolled_back_by_the_provider(moto_ec2: MotoEc2) -> None:
    # Capacity-Block-like behaviour: the fleet launches what it can and returns it.
    moto_ec2.client.partial = True
    moto_ec2.client.stock[AWS_ZONE] = 3
    provider = moto_ec2.provider()
    with pytest.raises(CapacityUnavailable) as caught:
        await provider.acquire(req(moto_ec2, "uid-a", 5))
    assert caught.value.available == 3
    assert moto_ec2.live_instances() == []
    assert await provider.list(moto_ec2.pool()) == []


async def test_release_terminates_by_tag_and_is_idempotent(moto_ec2: MotoEc2) -> None:
    provider = moto_ec2.provider()
    a, b = req(moto_ec2, "uid-a", 2), req(moto_ec2, "uid-b", 3)
    await provider.acquire(a)
    await provider.acquire(b)
    assert await provider.release(a.pool, a.key) == 2
    assert await provider.release(a.pool, a.key) == 0
    assert {n.key for n in await provider.list(a.pool)} == {b.key}
    assert len(moto_ec2.live_instances()) == 3


async def test_per_acquisition_placement_group_lives_as_long_as_its_nodes(
    moto_ec2: MotoEc2,
) -> None:
    provider = moto_ec2.provider()
    r = req(moto_ec2, "uid-a", 2, placementGroup={"strategy": "cluster"})
    await provider.acquire(r)
    assert list(moto_ec2.client.placement_groups) == [f"muster-{r.key}"]
    tags = moto_ec2.client.placement_groups[f"muster-{r.key}"]["TagSpecifications"][0]["Tags"]
    assert {"Key": "muster.dev/key", "Value": r.key} in tags
    await provider.release(r.pool, r.key)
    assert moto_ec2.client.placement_groups == {}


@pytest.mark.parametrize("crash_during_call", [False, True],
                         ids=["result-forgotten", "killed-inside-the-call"])
async def test_crash_after_the_cloud_call_leaks_nothing_and_duplicates_nothing(
    moto_ec2: MotoEc2, crash_during_call: bool,
) -> None:
    live = req(moto_ec2, "uid-live", 2)
    dead = req(moto_ec2, "uid-dead", 3)

    before = moto_ec2.provider()
    moto_ec2.client.crash_after_launch = crash_during_call
    for r in (live, dead):
        if crash_during_call:
            with pytest.raises(ControllerCrash):
                await before.acquire(r)
        else:
            await before.acquire(r)  # the status write never happens: result dropped
    moto_ec2.client.crash_after_launch = False
    assert len(moto_ec2.live_instances()) == 5

    # Restart: a new process, new provider, nothing in memory. Only `live` still exists,
    # and its plan has not reached the new process's cache yet.
    after = moto_ec2.provider()
    controller = restarted(after, live.pool)
    assert await controller.sweep() == {}  # both unheld: neither goes within the grace
    await controller.clock.advance(GRACE / 2)
    controller.shows(live)  # the live request's plan arrives
    assert await controller.sweep() == {}

    fleets_before = moto_ec2.client.calls["create_fleet"]
    adopted = await after.acquire(live)  # the reconciler resumes the live request
    assert len(adopted) == 2
    assert moto_ec2.client.calls["create_fleet"] == fleets_before  # nothing new launched

    await controller.clock.advance(GRACE / 2)
    assert await controller.sweep() == {dead.key: 3}
    remaining = moto_ec2.live_instances()
    assert len(remaining) == 2  # zero leaked, zero duplicated
    assert {t["Value"] for i in remaining for t in i["Tags"] if t["Key"] == "muster.dev/key"} == {
        live.key}
    await controller.clock.advance(10 * GRACE)
    assert await controller.sweep() == {}  # held: never released


STOCK_USER_DATA = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="BOUNDARY"

--BOUNDARY
Content-Type: application/node.eks.aws

---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: my-cluster
    apiServerEndpoint: https://example.com
    certificateAuthority: Y2E=
    cidr: 10.100.0.0/16

--BOUNDARY--
"""


def _template(moto_ec2: MotoEc2, name: str, user_data: str) -> str:
    import base64

    return str(moto_ec2.client.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "UserData": base64.b64encode(user_data.encode()).decode(),
        },
    )["LaunchTemplate"]["LaunchTemplateId"])


async def test_a_stock_nodeadm_template_launches_with_muster_s_startup_taint(
    moto_ec2: MotoEc2,
) -> None:
    """The fleet launches from Muster's copy of the pool's template, whose user data is the
    user's NodeConfig plus Muster's (kubelet --register-with-taints); a second acquisition
    reuses the copy."""
    import base64

    from providers.bootstrap import STARTUP_TAINT_FLAG

    template = _template(moto_ec2, "stock-al2023", STOCK_USER_DATA)
    provider = moto_ec2.provider()
    pool = moto_ec2.pool(launchTemplate={"id": template}, bootstrap="nodeadm")
    await provider.validate(pool)
    for uid in ("uid-a", "uid-b"):
        await provider.acquire(AcquireRequest(
            key=acquisition_key(uid, 1, 0), pool=pool, count=1,
            domain={"topology.kubernetes.io/zone": AWS_ZONE}, owner="ns/g", owner_uid=uid))
    copies = [t for t in moto_ec2.client.describe_launch_templates()["LaunchTemplates"]
              if t["LaunchTemplateName"].startswith("muster-gpu-pool-")]
    assert len(copies) == 1
    data = moto_ec2.client.describe_launch_template_versions(
        LaunchTemplateId=copies[0]["LaunchTemplateId"])["LaunchTemplateVersions"][0]
    user_data = base64.b64decode(data["LaunchTemplateData"]["UserData"]).decode()
    assert "my-cluster" in user_data and STARTUP_TAINT_FLAG in user_data
    assert len(moto_ec2.live_instances()) == 2


async def test_a_template_muster_cannot_extend_is_refused_before_anything_is_bought(
    moto_ec2: MotoEc2,
) -> None:
    template = _template(moto_ec2, "al2-script", "#!/bin/bash\n/etc/eks/bootstrap.sh c\n")
    provider = moto_ec2.provider()
    pool = moto_ec2.pool(launchTemplate={"id": template}, bootstrap="nodeadm")
    with pytest.raises(ProviderConfigError, match=r"bootstrap\.sh"):
        await provider.validate(pool)
    with pytest.raises(ProviderConfigError, match=r"bootstrap\.sh"):
        await provider.acquire(AcquireRequest(
            key=acquisition_key("uid-a", 1, 0), pool=pool, count=1,
            domain={"topology.kubernetes.io/zone": AWS_ZONE}, owner="ns/g", owner_uid="uid-a"))
    assert moto_ec2.live_instances() == []


async def test_a_copy_another_muster_process_deletes_before_the_fleet_is_made_again(
    moto_ec2: MotoEc2,
) -> None:
    """Two Muster processes (a former leader and the new one, or one before and after a
    restart): the other's sweep sees the copy this one just created, named by no instance
    and not in its own launches, and deletes it before the fleet is sent. The launch
    creates the copy again and the gang is bought, its instances naming the copy, which
    stays; the pool is never called unusable for it."""
    template = _template(moto_ec2, "stock-al2023-race", STOCK_USER_DATA)
    pool = moto_ec2.pool(launchTemplate={"id": template}, bootstrap="nodeadm")
    this, other = moto_ec2.provider(), moto_ec2.provider()
    launch_group = this._ensure_placement_group
    swept: list[int] = []

    async def other_sweeps_first(*args: object, **kwargs: object) -> str | None:
        if not swept:
            swept.append(await other._sweep_templates(moto_ec2.client, "us-east-1", None))
        return await launch_group(*args, **kwargs)  # type: ignore[arg-type]

    this._ensure_placement_group = other_sweeps_first  # type: ignore[method-assign]
    nodes = await this.acquire(AcquireRequest(
        key=acquisition_key("uid-a", 1, 0), pool=pool, count=2, domain=DOMAIN,
        owner="ns/g", owner_uid="uid-a"))
    assert swept == [1], "the other process deleted the copy in flight"
    assert len(nodes) == 2
    copies = {t["LaunchTemplateName"] for t in
              moto_ec2.client.describe_launch_templates()["LaunchTemplates"]
              if t["LaunchTemplateName"].startswith("muster-gpu-pool-")}
    named = {t["Value"] for i in moto_ec2.live_instances() for t in i["Tags"]
             if t["Key"] == "muster.dev/launch-template"}
    assert len(copies) == 1 and named == copies
    # Named by live instances now, the copy survives the other process's next sweep.
    assert await other._sweep_templates(moto_ec2.client, "us-east-1", None) == 0


async def test_interfaces_of_a_gang_adopted_after_a_crash_are_tagged(moto_ec2: MotoEc2) -> None:
    """Muster dies as the fleet answers (nothing after the call runs): the restarted one
    adopts the key's instances by tag and tags their network interfaces then; the volumes
    were tagged by the fleet itself."""
    r = req(moto_ec2, "uid-crash", 2)
    moto_ec2.client.crash_after_launch = True
    with pytest.raises(ControllerCrash):
        await moto_ec2.provider().acquire(r)
    moto_ec2.client.crash_after_launch = False
    volumes, interfaces = _volume_and_interface_tags(moto_ec2)
    assert all(t["muster.dev/key"] == r.key for t in volumes)
    assert not any("muster.dev/key" in t for t in interfaces)
    assert len(await moto_ec2.provider().acquire(r)) == 2
    volumes, interfaces = _volume_and_interface_tags(moto_ec2)
    assert interfaces and all(t["muster.dev/key"] == r.key for t in interfaces)
