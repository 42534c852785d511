"""The cloud tier's EC2 endpoint (moto's server behind :mod:`e2e.cloud.ec2`), driven over real
HTTP by Muster's AWS provider as the tier drives it: fleet all-or-nothing, ClientToken
replay, capacity lost mid-fleet rolled back, network topology per placement."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from controller.acquire.keys import acquisition_key
from controller.common.topology_defaults import UNREGISTERED_TAINT
from controller.kube import KubeClient
from controller.kube.resources import NODES
from e2e.cloud.ec2 import AWS_TEST_ENV, Ec2Layer, ec2_endpoint
from e2e.cloud.registrar import Registrar
from providers.aws import AwsProvider, parse_parameters
from providers.base import AcquireRequest, CapacityUnavailable
from providers.naming import aws_client_token
from sandbox.server import SandboxServer
from tests.providers.conftest import (
    AWS_ZONE,
    CRDS,
    ZONE_LABEL,
    aws_parameters,
    fast_aws_settings,
    make_pool,
)
from tests.providers.test_bootstrap import STOCK


@dataclass
class Endpoint:
    url: str
    layer: Ec2Layer
    ec2: Any
    subnets: dict[str, str]
    template: str

    def provider(self) -> AwsProvider:
        return AwsProvider(fast_aws_settings(endpoint_url=self.url))

    def request(self, uid: str, count: int, **params: Any) -> AcquireRequest:
        pool = make_pool(
            "aws",
            aws_parameters(
                **{"launchTemplate": {"id": self.template}, "subnets": self.subnets, **params}
            ),
        )
        return AcquireRequest(
            key=acquisition_key(uid, 0, 0),
            pool=pool,
            count=count,
            domain={ZONE_LABEL: AWS_ZONE},
            owner=f"ml/{uid}",
            owner_uid=uid,
        )

    def live(self) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )
        return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_TEST_ENV.items():
            mp.setenv(k, v)
        with ec2_endpoint() as (url, layer):
            ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
            vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
            subnets = {
                zone: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"][
                    "SubnetId"
                ]
                for zone, cidr in ((AWS_ZONE, "10.0.1.0/24"), ("us-east-1b", "10.0.2.0/24"))
            }
            template = ec2.create_launch_template(
                LaunchTemplateName="muster-gpu", LaunchTemplateData={"ImageId": "ami-12c6146b"}
            )["LaunchTemplate"]["LaunchTemplateId"]
            yield Endpoint(url, layer, ec2, subnets, template)


@pytest.fixture
def ep(endpoint: Endpoint) -> Iterator[Endpoint]:
    yield endpoint
    ids = [i["InstanceId"] for i in endpoint.live()]
    if ids:
        endpoint.ec2.terminate_instances(InstanceIds=ids)
    endpoint.layer.stock.clear()
    endpoint.layer.partial_fleets.clear()


async def test_a_gang_launches_in_one_placement_with_network_topology(ep: Endpoint) -> None:
    nodes = await ep.provider().acquire(ep.request("uid-a", 3))
    assert len(ep.live()) == 3
    layers = {
        tuple(n.labels[f"topology.k8s.aws/network-node-layer-{k}"] for k in (1, 2, 3))
        for n in nodes
    }
    assert len(layers) == 1, "instances of one fleet share their network nodes"
    assert all(n.provider_id.startswith(f"aws:///{AWS_ZONE}/i-") for n in nodes)
    other = await ep.provider().acquire(ep.request("uid-b", 1))
    assert other[0].labels["topology.k8s.aws/network-node-layer-1"] == next(iter(layers))[0]
    assert other[0].labels["topology.k8s.aws/network-node-layer-3"] != next(iter(layers))[2]


async def test_the_gang_s_volumes_and_interfaces_carry_its_tags_over_http(ep: Endpoint) -> None:
    request = ep.request("uid-v", 2)
    await ep.provider().acquire(request)
    volumes = [m["Ebs"]["VolumeId"] for i in ep.live() for m in i["BlockDeviceMappings"]]
    enis = [n["NetworkInterfaceId"] for i in ep.live() for n in i["NetworkInterfaces"]]
    assert volumes and enis
    found = [{t["Key"]: t["Value"] for t in v.get("Tags", [])}
             for v in ep.ec2.describe_volumes(VolumeIds=volumes)["Volumes"]]
    found += [{t["Key"]: t["Value"] for t in n.get("TagSet", [])} for n in
              ep.ec2.describe_network_interfaces(NetworkInterfaceIds=enis)["NetworkInterfaces"]]
    assert all(t.get("muster.dev/key") == request.key and t.get("muster.dev/owner") == "ml/uid-v"
               for t in found), found


async def test_min_target_capacity_is_all_or_nothing(ep: Endpoint) -> None:
    ep.layer.stock[AWS_ZONE] = 2
    with pytest.raises(CapacityUnavailable):
        await ep.provider().acquire(ep.request("uid-c", 3))
    assert ep.live() == []


async def test_client_token_replay_launches_nothing_more(ep: Endpoint) -> None:
    request = ep.request("uid-d", 2)
    first = await ep.provider().acquire(request)
    fleet = ep.provider()._fleet_request(
        parse_parameters(request.pool), request, [(AWS_ZONE, ep.subnets[AWS_ZONE])], None
    )
    assert fleet["ClientToken"] == aws_client_token(request.key)
    again = ep.ec2.create_fleet(**fleet)
    assert sorted(i for e in again["Instances"] for i in e["InstanceIds"]) == sorted(
        n.provider_id.rsplit("/", 1)[1] for n in first
    )
    assert len(ep.live()) == 2


async def test_capacity_lost_mid_fleet_is_rolled_back(ep: Endpoint) -> None:
    ep.layer.inject_partial_fleet(1)
    with pytest.raises(CapacityUnavailable, match="InsufficientInstanceCapacity"):
        await ep.provider().acquire(ep.request("uid-e", 3))
    assert ep.live() == [], "the one instance launched before capacity ran out is terminated"


def test_placement_groups_exist_until_unused(ep: Endpoint) -> None:
    ep.ec2.create_placement_group(GroupName="pg-a", Strategy="cluster")
    groups = ep.ec2.describe_placement_groups(GroupNames=["pg-a"])["PlacementGroups"]
    assert groups[0]["GroupName"] == "pg-a"
    ep.ec2.delete_placement_group(GroupName="pg-a")
    assert ep.ec2.describe_placement_groups()["PlacementGroups"] == []


async def test_the_registrar_registers_what_the_vm_has_and_deletes_it_with_the_vm(
    ep: Endpoint, tmp_path: Path
) -> None:
    """The tier's node lifecycle against the API sandbox: an instance launched from a stock
    nodeadm template (Muster's copy) registers its Node behind the startup taint with the
    cloud's name, providerID and topology; terminated, its Node goes."""
    stock = ep.ec2.create_launch_template(
        LaunchTemplateName="eks-al2023-stock",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "UserData": base64.b64encode(STOCK.encode()).decode(),
        },
    )["LaunchTemplate"]["LaunchTemplateId"]
    request = ep.request(
        "uid-f", 1, bootstrap="nodeadm", launchTemplate={"id": stock, "version": "1"}
    )
    nodes = await ep.provider().acquire(request)
    server = SandboxServer(crd_dir=CRDS)
    await server.start()
    try:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        registrar = Registrar(kubeconfig, ec2=ep.ec2, boot_seconds=0)
        async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
            await registrar.sync(kube)
            node = await kube.get(NODES, nodes[0].name)
            assert node["spec"]["providerID"] == nodes[0].provider_id
            assert node["spec"]["taints"] == [{"key": UNREGISTERED_TAINT, "effect": "NoExecute"}]
            labels = node["metadata"]["labels"]
            assert (
                labels["topology.k8s.aws/network-node-layer-3"]
                == nodes[0].labels["topology.k8s.aws/network-node-layer-3"]
            )
            ep.ec2.terminate_instances(InstanceIds=[nodes[0].provider_id.rsplit("/", 1)[1]])
            await registrar.sync(kube)
            assert await kube.get_or_none(NODES, nodes[0].name) is None
        assert registrar.problems == []
    finally:
        await server.stop()


# ---- capacity reservations ------------------------------------------------------------

GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/gpu-odcrs"


def _reserve(ep: Endpoint, rid: str, count: int, **kw: Any) -> None:
    ep.layer.add_capacity_reservation(rid, zone=AWS_ZONE, instance_type="p5.48xlarge",
                                      count=count, **kw)


@pytest.fixture
def reserved(ep: Endpoint) -> Iterator[Endpoint]:
    yield ep
    ep.layer.capacity_reservations.clear()


async def test_a_gang_launches_into_an_odcr_and_its_figures_count_it(reserved: Endpoint) -> None:
    ep = reserved
    _reserve(ep, "cr-0aaa", 4)
    # The zone has no on-demand stock at all: only the reservation can serve the gang.
    ep.layer.stock[AWS_ZONE] = 0
    request = ep.request("uid-r1", 3, capacityReservation={"id": "cr-0aaa"})
    await ep.provider().validate(request.pool)
    nodes = await ep.provider().acquire(request)
    assert len(nodes) == 3 and len(ep.live()) == 3
    assert {ep.layer.reserved_in[n.provider_id.rsplit("/", 1)[1]] for n in nodes} == {"cr-0aaa"}
    [figures] = await ep.provider().reservations(request.pool)
    assert (figures.zone, figures.reserved, figures.used, figures.free, figures.state) == (
        AWS_ZONE, 4, 3, 1, "active")


async def test_a_reservation_too_small_for_the_gang_launches_nothing(reserved: Endpoint) -> None:
    ep = reserved
    _reserve(ep, "cr-0bbb", 2)
    request = ep.request("uid-r2", 3, capacityReservation={"id": "cr-0bbb"})
    with pytest.raises(CapacityUnavailable, match="ReservationCapacityExceeded"):
        await ep.provider().acquire(request)
    assert ep.live() == []
    [figures] = await ep.provider().reservations(request.pool)
    assert (figures.used, figures.free) == (0, 2)


async def test_a_capacity_block_serves_only_inside_its_window(reserved: Endpoint) -> None:
    from datetime import UTC, datetime, timedelta

    ep = reserved
    now = datetime.now(UTC)
    _reserve(ep, "cr-0ccc", 4, kind="capacity-block", start=now - timedelta(hours=1),
             end=now + timedelta(days=1))
    _reserve(ep, "cr-0ddd", 4, kind="capacity-block", start=now + timedelta(hours=1),
             end=now + timedelta(days=1))
    block = {"id": "cr-0ccc", "type": "capacity-block"}
    request = ep.request("uid-r3", 4, capacityReservation=block)
    await ep.provider().validate(request.pool)
    assert len(await ep.provider().acquire(request)) == 4
    later = ep.request("uid-r4", 1, capacityReservation={"id": "cr-0ddd",
                                                         "type": "capacity-block"})
    [figures] = await ep.provider().reservations(later.pool)
    assert (figures.state, figures.free) == ("scheduled", 0)
    with pytest.raises(CapacityUnavailable):
        await ep.provider().acquire(later)
    assert len(ep.live()) == 4, "nothing launched before the block's start"


async def test_a_capacity_block_is_bought_from_an_offering_and_launched_into(
    reserved: Endpoint,
) -> None:
    """The provider's queued path over HTTP: no block of the gang on sale, then one that
    is: Muster buys it (tagged with the key), launches a capacity-block fleet into it, and a
    cancel says the block stays; the offering is bought once."""
    from botocore.exceptions import ClientError

    from providers.base import GRANTED, QUEUED

    ep = reserved
    ep.layer.stock[AWS_ZONE] = 0  # only the bought block can serve the gang
    buy = {"capacityBlockPurchase": {"maxUpfrontFee": "3000"}}
    request = ep.request("uid-cb1", 2, **buy)
    provider = ep.provider()
    try:
        waiting = await provider.enqueue(request, 7200, ready_within=0)
        assert (waiting.outcome, waiting.state) == (QUEUED, "no-offering")
        assert "for 24 h" in waiting.error
        ep.layer.offer_capacity_block(zone=AWS_ZONE, instance_type="p5.48xlarge", count=3,
                                      upfront_fee="100")  # not the gang's count
        ep.layer.offer_capacity_block(zone=AWS_ZONE, instance_type="p5.48xlarge", count=2,
                                      upfront_fee="9000")  # over maxUpfrontFee
        assert (await provider.enqueue(request, 7200, ready_within=0)).state == "no-offering"
        ep.layer.offer_capacity_block(zone=AWS_ZONE, instance_type="p5.48xlarge", count=2,
                                      upfront_fee="2400")
        bought = await provider.enqueue(request, 7200, ready_within=0)
        assert bought.outcome == GRANTED and bought.state == "active"
        block = ep.layer.capacity_reservations[bought.name]
        assert (block["kind"], block["total"]) == ("capacity-block", 2)
        assert block["tags"]["muster.dev/key"] == request.key
        assert block["end"] - block["start"] == timedelta(hours=24)
        assert [o["fee"] for o in ep.layer.block_offers] == ["100", "9000"], "off sale"
        again = await provider.enqueue(request, 7200, ready_within=0)
        assert again.name == bought.name, "found by its tags, not bought twice"

        nodes = await provider.acquire(request)
        assert {ep.layer.reserved_in[n.provider_id.rsplit("/", 1)[1]] for n in nodes} == {
            bought.name}
        said = await provider.cancel_queued(request.pool, request.key)
        assert said is not None and f"Capacity Block {bought.name} was already bought" in said

        offered = ep.ec2.describe_capacity_block_offerings(
            InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24)
        assert [o["UpfrontFee"] for o in offered["CapacityBlockOfferings"]] == ["9000"]
        with pytest.raises(ClientError, match="InvalidParameterValue"):
            ep.ec2.describe_capacity_block_offerings(
                InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=30)
        with pytest.raises(ClientError, match=r"InvalidCapacityBlockOfferingId\.NotFound"):
            ep.ec2.purchase_capacity_block(CapacityBlockOfferingId="cb-0123456789abcdef0",
                                           InstancePlatform="Linux/UNIX")
    finally:
        ep.layer.block_offers.clear()


async def test_a_resource_group_s_reservations_are_read_and_launched_into(
    reserved: Endpoint,
) -> None:
    ep = reserved
    _reserve(ep, "cr-0e01", 2, groups=(GROUP,))
    _reserve(ep, "cr-0e02", 2)
    ep.layer.add_capacity_reservation("cr-0e03", zone="us-east-1b",
                                      instance_type="p5.48xlarge", count=4, groups=(GROUP,))
    request = ep.request("uid-r5", 2, capacityReservation={"resourceGroupArn": GROUP})
    assert len(await ep.provider().acquire(request)) == 2
    figures = await ep.provider().reservations(request.pool)
    assert [(f.id, f.zone, f.used, f.free) for f in figures] == [
        ("cr-0e01", AWS_ZONE, 2, 0), ("cr-0e03", "us-east-1b", 0, 4)]
async def test_a_placeholder_zone_launches_where_ec2_has_the_stock(ep: Endpoint) -> None:
    """A pool without declared domains (its zone a placeholder): the fleet names both of the
    pool's subnets, EC2 launches the whole gang in the zone that has the stock, and the
    nodes say which."""
    ep.layer.stock[AWS_ZONE] = 0
    request = ep.request("uid-z", 2)
    fresh = AcquireRequest(key=request.key, pool=request.pool, count=2,
                           domain={ZONE_LABEL: "muster-new-gpu-pool-0"}, owner="ml/uid-z")
    nodes = await ep.provider().acquire(fresh)
    assert {n.labels[ZONE_LABEL] for n in nodes} == {"us-east-1b"}
    assert {i["Placement"]["AvailabilityZone"] for i in ep.live()} == {"us-east-1b"}


async def test_a_template_copy_goes_with_the_last_instance_launched_from_it(
    ep: Endpoint,
) -> None:
    """bootstrap: nodeadm launches from Muster's copy of the pool's template; once no live
    instance was launched from it, releasing deletes it (EC2 over HTTP)."""
    source = ep.ec2.create_launch_template(
        LaunchTemplateName="stock-al2023",
        # An image of its own, so its copy is this test's alone (named by its content).
        LaunchTemplateData={"ImageId": "ami-0c0b1e5f7a3d2e9f1",
                            "UserData": base64.b64encode(STOCK.encode()).decode()},
    )["LaunchTemplate"]["LaunchTemplateId"]

    def copies() -> list[str]:
        found = ep.ec2.describe_launch_templates()["LaunchTemplates"]
        return [t["LaunchTemplateName"] for t in found
                if t["LaunchTemplateName"].startswith("muster-gpu-pool-")
                and t["LaunchTemplateName"] not in before]

    # Other tests of the module share the endpoint and leave copies of their own: only the
    # copies made here count.
    before: set[str] = set()
    before = set(copies())

    try:
        provider = ep.provider()
        first = ep.request("uid-t1", 1, bootstrap="nodeadm", launchTemplate={"id": source})
        second = ep.request("uid-t2", 1, bootstrap="nodeadm", launchTemplate={"id": source})
        await provider.acquire(first)
        await provider.acquire(second)
        assert len(copies()) == 1, "one copy per template content"
        await provider.release(first.pool, first.key)
        assert len(copies()) == 1, "the second gang's instance was launched from it"
        await provider.release(second.pool, second.key)
        assert copies() == []
    finally:
        ep.ec2.delete_launch_template(LaunchTemplateId=source)
