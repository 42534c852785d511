"""AWS provider against botocore's Stubber: exact request shapes and every failure path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from providers.aws import AwsProvider, parse_parameters
from providers.base import (
    AcquireRequest,
    CapacityUnavailable,
    ProviderConfigError,
    QuotaExceeded,
    TransientProviderError,
)
from providers.naming import aws_client_token, aws_placement_group_name
from tests.providers.conftest import (
    AWS_ZONE,
    ZONE_LABEL,
    aws_parameters,
    fast_aws_settings,
    make_pool,
)

KEY = "gpu-pool-a0-0123456789abcdef"
OWNER = "ml/train-llama"


@pytest.fixture
def stubbed() -> Iterator[tuple[AwsProvider, Stubber]]:
    client = boto3.client(
        "ec2", region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    with Stubber(client) as stubber:
        yield AwsProvider(fast_aws_settings(), client_factory=lambda _r: client), stubber
        stubber.assert_no_pending_responses()


def request(count: int = 4, **params: Any) -> AcquireRequest:
    pool = make_pool("aws", aws_parameters(**params))
    return AcquireRequest(key=KEY, pool=pool, count=count, domain={ZONE_LABEL: AWS_ZONE},
                          owner=OWNER, owner_uid="uid-1")


TAGS = [
    {"Key": "muster.dev/cluster", "Value": "test-cluster"},
    {"Key": "muster.dev/key", "Value": KEY},
    {"Key": "muster.dev/owner", "Value": OWNER},
    {"Key": "muster.dev/owner-uid", "Value": "uid-1"},
    {"Key": "muster.dev/pool", "Value": "gpu-pool"},
    {"Key": "team", "Value": "ml"},
]
INSTANCE_TAGS = sorted([*TAGS, {"Key": "muster.dev/launch-template", "Value": ""}],
                       key=lambda t: t["Key"])
"""What the fleet tags its instances with: the pool's own template, no copy of Muster's."""
KEY_FILTERS = [
    {"Name": "tag:muster.dev/cluster", "Values": ["test-cluster"]},
    {"Name": "tag:muster.dev/pool", "Values": ["gpu-pool"]},
    {"Name": "tag:muster.dev/key", "Values": [KEY]},
    {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
]


def fleet_params(count: int = 4, placement: str | None = None) -> dict[str, Any]:
    override: dict[str, Any] = {
        "InstanceType": "p5.48xlarge", "SubnetId": "subnet-0aaa1111", "AvailabilityZone": AWS_ZONE,
    }
    if placement:
        override["Placement"] = {"GroupName": placement}
    return {
        "Type": "instant",
        "ClientToken": aws_client_token(KEY),
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-0123456789abcdef0",
                                            "Version": "3"},
            "Overrides": [override],
        }],
        "TargetCapacitySpecification": {"TotalTargetCapacity": count,
                                        "DefaultTargetCapacityType": "on-demand"},
        "OnDemandOptions": {"MinTargetCapacity": count, "SingleInstanceType": True,
                            "SingleAvailabilityZone": True},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": INSTANCE_TAGS},
                              {"ResourceType": "volume", "Tags": TAGS},
                              {"ResourceType": "fleet", "Tags": TAGS}],
    }


def ids(n: int) -> list[str]:
    return [f"i-{k:017x}" for k in range(1, n + 1)]


def instance(instance_id: str, state: str = "running", dns: bool = True) -> dict[str, Any]:
    return {
        "InstanceId": instance_id,
        "InstanceType": "p5.48xlarge",
        "State": {"Code": 16, "Name": state},
        "PrivateDnsName": f"ip-10-0-1-{int(instance_id[-2:], 16)}.ec2.internal" if dns else "",
        "Placement": {"AvailabilityZone": AWS_ZONE},
        "Tags": TAGS,
    }


def describe(instances: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Reservations": [{"ReservationId": "r-1", "Instances": instances}]} if instances else {
        "Reservations": []}


def fleet_response(
    launched: list[str], errors: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {"FleetId": "fleet-1", "Errors": errors or []}
    response["Instances"] = [{"InstanceIds": launched, "InstanceType": "p5.48xlarge",
                              "Lifecycle": "on-demand"}] if launched else []
    return response


def add_happy_launch(stubber: Stubber, count: int = 4, placement: str | None = None) -> None:
    launched = ids(count)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(launched), fleet_params(count, placement))
    stubber.add_response("describe_instances", describe([instance(i) for i in launched]),
                         {"InstanceIds": launched})


async def test_acquire_sends_an_all_or_nothing_instant_fleet(stubbed: Any) -> None:
    provider, stubber = stubbed
    add_happy_launch(stubber)
    stubber.add_response("describe_instance_topology", {"Instances": [
        {"InstanceId": i, "NetworkNodes": ["nn-a", "nn-b", f"nn-c{n % 2}"]}
        for n, i in enumerate(ids(4))
    ]}, {"InstanceIds": ids(4)})

    nodes = await provider.acquire(request())

    assert [n.provider_id for n in nodes] == [f"aws:///{AWS_ZONE}/{i}" for i in ids(4)]
    assert nodes[0].name == "ip-10-0-1-1.ec2.internal"
    assert {n.key for n in nodes} == {KEY} and {n.owner for n in nodes} == {OWNER}
    assert nodes[0].labels["topology.k8s.aws/network-node-layer-1"] == "nn-a"
    assert nodes[1].labels["topology.k8s.aws/network-node-layer-3"] == "nn-c1"
    assert nodes[0].labels[ZONE_LABEL] == AWS_ZONE


async def test_partial_fleet_terminates_what_launched_then_reports_capacity(stubbed: Any) -> None:
    provider, stubber = stubbed
    launched = ids(2)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(launched, [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no p5 left",
         "Lifecycle": "on-demand"}]), fleet_params())
    stubber.add_response("describe_instances", describe([instance(i) for i in launched]),
                         {"Filters": KEY_FILTERS})
    stubber.add_response("terminate_instances", {"TerminatingInstances": []},
                         {"InstanceIds": launched})

    with pytest.raises(CapacityUnavailable) as caught:
        await provider.acquire(request())
    assert caught.value.available == 2
    assert "2 of 4" in str(caught.value) and "InsufficientInstanceCapacity" in str(caught.value)


async def test_empty_fleet_with_insufficient_capacity_launches_and_terminates_nothing(
    stubbed: Any,
) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response([], [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "none"}]), fleet_params())
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(request())


async def test_throttling_is_retried_with_the_same_client_token(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    for _ in range(2):
        stubber.add_client_error("create_fleet", service_error_code="RequestLimitExceeded",
                                 http_status_code=503, expected_params=fleet_params())
    stubber.add_response("create_fleet", fleet_response(ids(4)), fleet_params())
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(4)]),
                         {"InstanceIds": ids(4)})
    stubber.add_client_error("describe_instance_topology",
                             service_error_code="UnsupportedOperation", http_status_code=400)

    nodes = await provider.acquire(request())
    assert len(nodes) == 4
    # Topology is optional: an unsupported type still yields usable nodes.
    assert not any(k.startswith("topology.k8s.aws/") for k in nodes[0].labels)


async def test_throttling_that_never_ends_becomes_transient_and_launches_nothing(
    stubbed: Any,
) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    for _ in range(4):  # fast_aws_settings: 4 tries
        stubber.add_client_error("create_fleet", service_error_code="RequestLimitExceeded",
                                 http_status_code=503, expected_params=fleet_params())
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(TransientProviderError, match="RequestLimitExceeded"):
        await provider.acquire(request())


@pytest.mark.parametrize("code", ["VcpuLimitExceeded", "InstanceLimitExceeded"])
async def test_account_limits_in_the_fleet_body_are_quota_errors(stubbed: Any, code: str) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response([], [
        {"ErrorCode": code, "ErrorMessage": "You have requested more vCPU capacity"}]),
        fleet_params())
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(QuotaExceeded) as caught:
        await provider.acquire(request())
    assert caught.value.retryable is False


async def test_a_limit_raised_by_the_call_is_a_quota_error(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_client_error("create_fleet", service_error_code="InstanceLimitExceeded",
                             http_status_code=400)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(QuotaExceeded):
        await provider.acquire(request())


@pytest.mark.parametrize("code", [
    "InvalidParameterValue", "IdempotentParameterMismatch", "UnauthorizedOperation",
    "InvalidLaunchTemplateId.NotFound",
])
async def test_bad_parameters_and_auth_are_configuration_errors(stubbed: Any, code: str) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_client_error("create_fleet", service_error_code=code, http_status_code=400)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(ProviderConfigError, match=code):
        await provider.acquire(request())


async def test_acquire_again_with_the_same_key_adopts_and_calls_no_fleet(stubbed: Any) -> None:
    provider, stubber = stubbed
    existing = [instance(i) for i in ids(4)]
    stubber.add_response("describe_instances", describe(existing), {"Filters": KEY_FILTERS})
    stubber.add_response("describe_instance_topology", {"Instances": []}, {"InstanceIds": ids(4)})
    nodes = await provider.acquire(request())
    assert [n.provider_id.rsplit("/", 1)[1] for n in nodes] == ids(4)


async def test_fresh_instances_without_dns_name_are_described_again(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(ids(2)), fleet_params(2))
    stubber.add_client_error("describe_instances", service_error_code="InvalidInstanceID.NotFound",
                             http_status_code=400, expected_params={"InstanceIds": ids(2)})
    stubber.add_response("describe_instances",
                         describe([instance(i, state="pending", dns=False) for i in ids(2)]),
                         {"InstanceIds": ids(2)})
    stubber.add_response("describe_instances",
                         describe([instance(i, state="pending") for i in ids(2)]),
                         {"InstanceIds": ids(2)})
    stubber.add_response("describe_instance_topology", {"Instances": []}, {"InstanceIds": ids(2)})
    nodes = await provider.acquire(request(count=2))
    assert [n.name for n in nodes] == ["ip-10-0-1-1.ec2.internal", "ip-10-0-1-2.ec2.internal"]


async def test_placement_group_is_created_tagged_used_and_deleted_on_release(stubbed: Any) -> None:
    provider, stubber = stubbed
    group = aws_placement_group_name(KEY)
    req = request(placementGroup={"strategy": "cluster"}, recordNetworkTopology=False)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_placement_group", {}, {
        "GroupName": group, "Strategy": "cluster",
        "TagSpecifications": [{"ResourceType": "placement-group", "Tags": TAGS}]})
    stubber.add_response("create_fleet", fleet_response(ids(4)), fleet_params(4, group))
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(4)]),
                         {"InstanceIds": ids(4)})
    assert len(await provider.acquire(req)) == 4

    release_filters = KEY_FILTERS
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(4)]),
                         {"Filters": release_filters})
    stubber.add_response("terminate_instances", {}, {"InstanceIds": ids(4)})
    # EC2 refuses while the instances shut down; the provider waits and tries again.
    stubber.add_client_error("delete_placement_group", "InvalidPlacementGroup.InUse",
                             http_status_code=400, expected_params={"GroupName": group})
    stubber.add_response("delete_placement_group", {}, {"GroupName": group})
    assert await provider.release(req.pool, KEY) == 4


async def test_failed_acquire_deletes_its_placement_group(stubbed: Any) -> None:
    provider, stubber = stubbed
    group = aws_placement_group_name(KEY)
    req = request(placementGroup={"strategy": "cluster"})
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_client_error("create_placement_group", "InvalidPlacementGroup.Duplicate",
                             http_status_code=400)
    stubber.add_response("create_fleet", fleet_response([], [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "none"}]),
        fleet_params(4, group))
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("delete_placement_group", {}, {"GroupName": group})
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req)


async def test_release_of_an_unknown_key_returns_zero(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    assert await provider.release(request().pool, KEY) == 0


async def test_list_filters_by_cluster_and_pool_and_follows_pages(stubbed: Any) -> None:
    provider, stubber = stubbed
    filters = [f for f in KEY_FILTERS if f["Name"] != "tag:muster.dev/key"]
    first = describe([instance(i) for i in ids(2)])
    first["NextToken"] = "page-2"
    stubber.add_response("describe_instances", first, {"Filters": filters})
    stubber.add_response("describe_instances", describe([instance("i-00000000000000009")]),
                         {"Filters": filters, "NextToken": "page-2"})
    nodes = await provider.list(request().pool)
    assert len(nodes) == 3 and {n.key for n in nodes} == {KEY}


async def test_node_name_can_be_the_instance_id(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(1)]),
                         {"Filters": ANY})
    nodes = await provider.list(request(nodeNameFrom="instanceId").pool)
    assert nodes[0].name == ids(1)[0]


@pytest.mark.parametrize(("params", "field"), [
    ({"subnets": {}}, "subnets"),
    ({"subnets": {"us-east-1a": "sg-123"}}, "subnets"),
    ({"launchTemplate": {"id": "lt-0123", "name": "both"}}, "launchTemplate"),
    ({"instanceType": "p5"}, "instanceType"),
    ({"tags": {"muster.dev/key": "x"}}, "tags"),
    ({"placementGroup": {"perAcquisition": False}}, "placementGroup"),
    ({"capacityReservationUsage": "sometimes"}, "capacityReservationUsage"),
    ({"accessKeyId": "AKIA..."}, "accessKeyId"),
])
async def test_validate_names_the_bad_field(params: dict[str, Any], field: str) -> None:
    provider = AwsProvider(fast_aws_settings(), client_factory=lambda _r: None)
    pool = make_pool("aws", aws_parameters(**params))
    with pytest.raises(ProviderConfigError, match=rf"spec\.parameters\.{field}"):
        await provider.validate(pool)


async def test_domain_zone_without_subnet_is_a_configuration_error(stubbed: Any) -> None:
    provider, _ = stubbed
    req = request()
    bad = AcquireRequest(key=KEY, pool=req.pool, count=1, domain={ZONE_LABEL: "us-east-1f"},
                         owner=OWNER)
    with pytest.raises(ProviderConfigError, match="no subnet in zone us-east-1f"):
        await provider.acquire(bad)


def test_capacity_reservation_preference_reaches_the_fleet_request() -> None:
    provider = AwsProvider(fast_aws_settings(), client_factory=lambda _r: None)
    req = request(capacityReservationUsage="use-capacity-reservations-first",
                  imageId="ami-0abc")
    built = provider._fleet_request(parse_parameters(req.pool), req,
                                    [(AWS_ZONE, "subnet-0aaa1111")], None)
    assert built["OnDemandOptions"]["CapacityReservationOptions"] == {
        "UsageStrategy": "use-capacity-reservations-first"}
    assert built["LaunchTemplateConfigs"][0]["Overrides"][0]["ImageId"] == "ami-0abc"
    assert len(built["ClientToken"]) <= 64


async def test_partially_visible_instances_are_completed_by_replaying_the_same_token(
    stubbed: Any,
) -> None:
    # After a crash, DescribeInstances (eventually consistent) shows 2 of the 4 instances the
    # first call launched. Replaying CreateFleet with the same ClientToken returns the
    # original fleet's 4 ids and launches nothing: the union is complete.
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(2)]),
                         {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(ids(4)), fleet_params())
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(4)]),
                         {"InstanceIds": ids(4)})
    stubber.add_response("describe_instance_topology", {"Instances": []}, {"InstanceIds": ids(4)})
    assert len(await provider.acquire(request())) == 4


async def test_instances_terminated_behind_our_back_fail_the_acquisition(stubbed: Any) -> None:
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(ids(2)), fleet_params(2))
    stubber.add_response("describe_instances", describe(
        [instance(ids(2)[0]), instance(ids(2)[1], state="terminated")]), {"InstanceIds": ids(2)})
    stubber.add_response("describe_instances", describe([instance(ids(2)[0])]),
                         {"Filters": KEY_FILTERS})
    # Only the live one is left to terminate.
    stubber.add_response("terminate_instances", {}, {"InstanceIds": ids(2)[:1]})
    with pytest.raises(CapacityUnavailable, match="only 1 of 2"):
        await provider.acquire(request(count=2))


async def test_a_placeholder_zone_lets_ec2_pick_among_the_pools_subnets(stubbed: Any) -> None:
    """A pool without declared domains: the planner's placeholder zone (muster-new-...) is
    not an availability zone. The fleet offers every subnet of the pool, EC2 keeps to one
    zone, and the nodes carry the zone the instances are in."""
    provider, stubber = stubbed
    placeholder = {ZONE_LABEL: "muster-new-gpu-pool-0",
                   "topology.k8s.aws/network-node-layer-3": "muster-new-gpu-pool-0"}
    req = AcquireRequest(key=KEY, pool=request().pool, count=2, domain=placeholder,
                         owner=OWNER, owner_uid="uid-1")
    launched = ids(2)
    expected = fleet_params(2)
    expected["LaunchTemplateConfigs"][0]["Overrides"] = [
        {"InstanceType": "p5.48xlarge", "SubnetId": "subnet-0aaa1111",
         "AvailabilityZone": AWS_ZONE},
        {"InstanceType": "p5.48xlarge", "SubnetId": "subnet-0bbb2222",
         "AvailabilityZone": "us-east-1b"},
    ]
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(launched), expected)
    in_b = [{**instance(i), "Placement": {"AvailabilityZone": "us-east-1b"}} for i in launched]
    stubber.add_response("describe_instances", describe(in_b), {"InstanceIds": launched})
    stubber.add_response("describe_instance_topology", {"Instances": []},
                         {"InstanceIds": launched})

    nodes = await provider.acquire(req)

    assert {n.labels[ZONE_LABEL] for n in nodes} == {"us-east-1b"}
    assert {n.provider_id.split("/")[3] for n in nodes} == {"us-east-1b"}


POOL_FILTERS = [
    {"Name": "tag:muster.dev/cluster", "Values": ["test-cluster"]},
    {"Name": "tag:muster.dev/pool", "Values": ["gpu-pool"]},
]


def copy_of(digest: str, pool: str = "gpu-pool") -> dict[str, Any]:
    return {"LaunchTemplateName": f"muster-{pool}-{digest}", "LaunchTemplateId": f"lt-0{digest}",
            "Tags": [{"Key": "muster.dev/cluster", "Value": "test-cluster"},
                     {"Key": "muster.dev/pool", "Value": pool}]}


def launched_from(instance_id: str, copy: str) -> dict[str, Any]:
    return {**instance(instance_id),
            "Tags": [*TAGS, {"Key": "muster.dev/launch-template", "Value": copy}]}


async def test_release_deletes_the_copies_no_live_instance_or_launch_uses(stubbed: Any) -> None:
    """After a release, Muster's launch-template copies of the pool go unless a live instance
    was launched from one or a launch of this process is using it right now."""
    provider, stubber = stubbed
    provider._templates_in_use[(None, "muster-gpu-pool-ccc")] += 1  # a fleet in flight
    stubber.add_response("describe_instances", describe([instance(i) for i in ids(1)]),
                         {"Filters": KEY_FILTERS})
    stubber.add_response("terminate_instances", {"TerminatingInstances": []},
                         {"InstanceIds": ids(1)})
    stubber.add_response("describe_launch_templates", {"LaunchTemplates": [
        copy_of("aaa"), copy_of("bbb"), copy_of("ccc")]}, {"Filters": POOL_FILTERS})
    stubber.add_response("describe_instances", describe([
        launched_from("i-0000000000000000a", "muster-gpu-pool-aaa")]), {"Filters": [
            *POOL_FILTERS, KEY_FILTERS[-1]]})
    stubber.add_response("delete_launch_template", {}, {"LaunchTemplateName":
                                                        "muster-gpu-pool-bbb"})

    assert await provider.release(request().pool, KEY) == 1


async def test_an_instance_of_an_older_version_keeps_every_copy_of_its_pool(
    stubbed: Any,
) -> None:
    """An instance without the launch-template tag (launched before Muster tagged it) could
    come from any copy of its pool: none of them is deleted; another pool's unused one is."""
    provider, stubber = stubbed
    stubber.add_response("describe_instances", describe([]), {"Filters": [
        f for f in KEY_FILTERS if f["Name"] != "tag:muster.dev/key"]})
    stubber.add_response("describe_launch_templates", {"LaunchTemplates": [
        copy_of("aaa"), copy_of("ddd", pool="old-pool")]}, {"Filters": POOL_FILTERS[:1]})
    stubber.add_response("describe_instances", describe([instance(ids(1)[0])]),
                         {"Filters": [POOL_FILTERS[0], KEY_FILTERS[-1]]})
    stubber.add_response("delete_launch_template", {}, {"LaunchTemplateName":
                                                        "muster-old-pool-ddd"})

    assert await provider.list(request().pool) == []


async def test_a_copy_s_volumes_get_the_acquisition_s_tags_and_keep_the_template_s(
    stubbed: Any,
) -> None:
    """bootstrap: nodeadm: the fleet launches from Muster's copy (the template's data as it
    is, its own volume tags included); the fleet tags the volumes with the acquisition's
    tags and repeats the template's own, and each instance names the copy, so the copy can
    go once no instance names it."""
    import base64

    from tests.providers.test_bootstrap import STOCK

    provider, stubber = stubbed
    req = request(bootstrap="nodeadm")
    template_volumes = [{"ResourceType": "volume", "Tags": [{"Key": "backup", "Value": "no"},
                                                           {"Key": "team", "Value": "infra"}]}]
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("describe_launch_template_versions", {"LaunchTemplateVersions": [{
        "LaunchTemplateData": {
            "UserData": base64.b64encode(STOCK.encode()).decode(),
            "TagSpecifications": template_volumes,
        }}]}, None)
    stubber.add_response("create_launch_template", {}, {
        "LaunchTemplateName": ANY, "LaunchTemplateData": {
            "UserData": ANY, "TagSpecifications": template_volumes},
        "TagSpecifications": ANY})
    volume_tags = sorted([*[t for t in TAGS if t["Key"] != "team"],
                          {"Key": "backup", "Value": "no"}, {"Key": "team", "Value": "ml"}],
                         key=lambda t: t["Key"])
    stubber.add_response("create_fleet", fleet_response([], [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "none"}]), {
        "Type": "instant", "ClientToken": ANY, "LaunchTemplateConfigs": ANY,
        "TargetCapacitySpecification": ANY, "OnDemandOptions": ANY,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": ANY},
            # The pool's tags win a key the template also names (team=ml, not infra).
            {"ResourceType": "volume", "Tags": volume_tags},
            {"ResourceType": "fleet", "Tags": TAGS},
        ]})
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req)
    fleet = provider._fleet_request(parse_parameters(req.pool), req,
                                    [(AWS_ZONE, "subnet-0aaa1111")], None,
                                    copy="muster-gpu-pool-0123")
    [instances] = [t for t in fleet["TagSpecifications"] if t["ResourceType"] == "instance"]
    assert {"Key": "muster.dev/launch-template", "Value": "muster-gpu-pool-0123"} in (
        instances["Tags"])
    assert provider._templates_in_use == {}, "the failed launch's copy is in use no more"


def _with_interfaces(instance_id: str, *enis: str) -> dict[str, Any]:
    return {**instance(instance_id),
            "NetworkInterfaces": [{"NetworkInterfaceId": e} for e in enis]}


async def test_the_instances_network_interfaces_get_the_acquisition_s_tags(
    stubbed: Any,
) -> None:
    """An instant fleet cannot tag network interfaces and the pool's own template (asIs)
    is used as it is: every interface of the launched instances (EFA ones included) is
    tagged like the instances once they are described."""
    provider, stubber = stubbed
    launched = ids(2)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(launched), fleet_params(2))
    stubber.add_response("describe_instances", describe([
        _with_interfaces(launched[0], "eni-0a", "eni-0b"),
        _with_interfaces(launched[1], "eni-1a")]), {"InstanceIds": launched})
    stubber.add_response("create_tags", {}, {
        "Resources": ["eni-0a", "eni-0b", "eni-1a"], "Tags": TAGS})
    stubber.add_response("describe_instance_topology", {"Instances": []},
                         {"InstanceIds": launched})

    assert len(await provider.acquire(request(2))) == 2


async def test_interfaces_that_cannot_be_tagged_do_not_fail_the_gang(
    stubbed: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A role without ec2:CreateTags on network interfaces leaves them untagged, said in
    the log; the gang's instances (tagged at launch) are kept."""
    provider, stubber = stubbed
    launched = ids(1)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_fleet", fleet_response(launched), fleet_params(1))
    stubber.add_response("describe_instances", describe([
        _with_interfaces(launched[0], "eni-0a")]), {"InstanceIds": launched})
    stubber.add_client_error("create_tags", service_error_code="UnauthorizedOperation",
                             http_status_code=403)
    stubber.add_response("describe_instance_topology", {"Instances": []},
                         {"InstanceIds": launched})

    assert len(await provider.acquire(request(1))) == 1
    assert "network-interface" in caplog.text and "UnauthorizedOperation" in caplog.text


def _template_with(stubber: Stubber, **data: Any) -> None:
    import base64

    from tests.providers.test_bootstrap import STOCK

    stubber.add_response("describe_launch_template_versions", {"LaunchTemplateVersions": [{
        "LaunchTemplateData": {"UserData": base64.b64encode(STOCK.encode()).decode(),
                               **data}}]}, None)


P5_EFA = [
    {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa", "Groups": ["sg-0efa"]},
    *({"NetworkCardIndex": k, "DeviceIndex": 1 if k == 0 else 0,
       "InterfaceType": "efa-only", "Groups": ["sg-0efa"]} for k in range(0, 32)),
]


async def test_an_efa_template_without_subnets_is_usable(stubbed: Any) -> None:
    """P5 with 32 EFA interfaces in the launch template (no subnet: the fleet's override
    sets it per zone) passes; the checks read the template Muster reads anyway."""
    provider, stubber = stubbed
    _template_with(stubber, NetworkInterfaces=P5_EFA)
    await provider.validate(request(bootstrap="nodeadm").pool)


@pytest.mark.parametrize(("data", "words"), [
    ({"NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": "subnet-0aaa1111",
                             "InterfaceType": "efa"}]}, "leave SubnetId out"),
    ({"NetworkInterfaces": P5_EFA, "SecurityGroupIds": ["sg-1"]}, "Groups"),
    ({"NetworkInterfaces": [{"DeviceIndex": 0, "NetworkCardIndex": 0,
                             "InterfaceType": "efa-only"}]}, "primary interface"),
])
async def test_an_efa_template_ec2_would_refuse_makes_the_pool_unusable(
    stubbed: Any, data: dict[str, Any], words: str,
) -> None:
    provider, stubber = stubbed
    _template_with(stubber, **data)
    with pytest.raises(ProviderConfigError, match=words):
        await provider.validate(request(bootstrap="nodeadm").pool)
