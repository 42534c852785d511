"""AWS reservations as pools, against botocore's Stubber (which validates every request
against the EC2 service model): an ODCR by id or resource group, a Capacity Block."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from providers.aws import AwsProvider, parse_parameters
from providers.base import AcquireRequest, CapacityUnavailable, ProviderConfigError
from tests.providers.conftest import (
    AWS_ZONE,
    ZONE_LABEL,
    aws_parameters,
    fast_aws_settings,
    make_pool,
)
from tests.providers.test_aws_stubbed import (
    KEY,
    KEY_FILTERS,
    OWNER,
    TAGS,
    describe,
    fleet_response,
    ids,
    instance,
)

BLOCK = {"id": "cr-0123456789abcdef0", "type": "capacity-block"}
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/gpu-odcrs"
START = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
END = datetime(2026, 12, 10, 11, 30, tzinfo=UTC)


@pytest.fixture
def stubbed() -> Iterator[tuple[AwsProvider, Stubber]]:
    client = boto3.client(
        "ec2", region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    with Stubber(client) as stubber:
        yield AwsProvider(fast_aws_settings(), client_factory=lambda _r: client), stubber
        stubber.assert_no_pending_responses()


def request(count: int = 4, zone: str = AWS_ZONE, **params: Any) -> AcquireRequest:
    pool = make_pool("aws", aws_parameters(**params))
    return AcquireRequest(key=KEY, pool=pool, count=count, domain={ZONE_LABEL: zone},
                          owner=OWNER, owner_uid="uid-1")


def reservation(**overrides: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "CapacityReservationId": BLOCK["id"],
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": AWS_ZONE,
        "TotalInstanceCount": 16,
        "AvailableInstanceCount": 12,
        "State": "active",
        "ReservationType": "capacity-block",
        "StartDate": START,
        "EndDate": END,
    }
    found.update(overrides)
    return found


def add_template(stubber: Stubber) -> None:
    stubber.add_response(
        "describe_launch_template_versions",
        {"LaunchTemplateVersions": [{"LaunchTemplateData": {"ImageId": "ami-0abc"}}]},
        {"Versions": ["3"], "LaunchTemplateId": "lt-0123456789abcdef0"},
    )


def add_reservation(stubber: Stubber, **overrides: Any) -> None:
    stubber.add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [reservation(**overrides)]},
        {"CapacityReservationIds": [BLOCK["id"]]},
    )


COPY_TAGS = sorted([*TAGS, {"Key": "muster.dev/launch-template", "Value": ANY}],
                   key=lambda t: str(t["Key"]))


async def test_a_gang_launches_into_a_capacity_block(stubbed: Any) -> None:
    provider, stubber = stubbed
    req = request(capacityReservation=BLOCK)
    add_template(stubber)
    add_reservation(stubber)
    await provider.validate(req.pool)

    launched = ids(4)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_launch_template", {}, {
        "LaunchTemplateName": ANY,
        "LaunchTemplateData": {
            "ImageId": "ami-0abc",
            "CapacityReservationSpecification": {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {"CapacityReservationId": BLOCK["id"]},
            },
            "InstanceMarketOptions": {"MarketType": "capacity-block"},
        },
        "TagSpecifications": ANY,
    })
    stubber.add_response("create_fleet", fleet_response(launched), {
        "Type": "instant",
        "ClientToken": ANY,
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateName": ANY, "Version": "1"},
            "Overrides": [{"InstanceType": "p5.48xlarge", "SubnetId": "subnet-0aaa1111",
                           "AvailabilityZone": AWS_ZONE}],
        }],
        # No OnDemandOptions: MinTargetCapacity governs on-demand capacity, not a block.
        "TargetCapacitySpecification": {"TotalTargetCapacity": 4,
                                        "DefaultTargetCapacityType": "capacity-block"},
        # The block's instances and their volumes carry the acquisition's tags.
        "TagSpecifications": [{"ResourceType": "instance", "Tags": COPY_TAGS},
                              {"ResourceType": "volume", "Tags": TAGS},
                              {"ResourceType": "fleet", "Tags": TAGS}],
    })
    stubber.add_response("describe_instances", describe([instance(i) for i in launched]),
                         {"InstanceIds": launched})
    stubber.add_response("describe_instance_topology", {"Instances": []},
                         {"InstanceIds": launched})

    nodes = await provider.acquire(req)
    assert len(nodes) == 4


async def test_a_block_too_small_for_the_gang_is_not_used_partially(stubbed: Any) -> None:
    # A Capacity Block fleet fills what it can; Muster counts and rolls the rest back.
    provider, stubber = stubbed
    req = request(capacityReservation=BLOCK)
    launched = ids(3)
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    add_template(stubber)
    stubber.add_response("create_launch_template", {}, None)
    stubber.add_response("create_fleet", fleet_response(launched, [
        {"ErrorCode": "InsufficientInstanceCapacity",
         "ErrorMessage": "Insufficient capacity in the Capacity Block",
         "Lifecycle": "capacity-block"}]), None)
    stubber.add_response("describe_instances", describe([instance(i) for i in launched]),
                         {"Filters": KEY_FILTERS})
    stubber.add_response("terminate_instances", {"TerminatingInstances": []},
                         {"InstanceIds": launched})

    with pytest.raises(CapacityUnavailable, match="3 of 4"):
        await provider.acquire(req)


async def test_an_odcr_resource_group_is_targeted_by_the_template_and_used_first(
    stubbed: Any,
) -> None:
    provider, stubber = stubbed
    req = request(capacityReservation={"resourceGroupArn": GROUP_ARN})
    add_template(stubber)
    await provider.validate(req.pool)  # no DescribeCapacityReservations: a group has no id
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    stubber.add_response("create_launch_template", {}, {
        "LaunchTemplateName": ANY,
        "LaunchTemplateData": {
            "ImageId": "ami-0abc",
            "CapacityReservationSpecification": {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {"CapacityReservationResourceGroupArn": GROUP_ARN},
            },
        },
        "TagSpecifications": ANY,
    })
    stubber.add_response("create_fleet", fleet_response([], [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "reservation full"}]), {
        "Type": "instant",
        "ClientToken": ANY,
        "LaunchTemplateConfigs": ANY,
        "TargetCapacitySpecification": {"TotalTargetCapacity": 4,
                                        "DefaultTargetCapacityType": "on-demand"},
        "OnDemandOptions": {
            "MinTargetCapacity": 4, "SingleInstanceType": True, "SingleAvailabilityZone": True,
            "CapacityReservationOptions": {"UsageStrategy": "use-capacity-reservations-first"},
        },
        "TagSpecifications": ANY,
    })
    stubber.add_response("describe_instances", describe([]), {"Filters": KEY_FILTERS})
    with pytest.raises(CapacityUnavailable):
        await provider.acquire(req)


async def test_reservation_figures_are_the_cloud_s_own(stubbed: Any) -> None:
    provider, stubber = stubbed
    add_reservation(stubber)
    figures = await provider.reservations(request(capacityReservation=BLOCK).pool)
    assert [(f.zone, f.reserved, f.used, f.free) for f in figures] == [(AWS_ZONE, 16, 4, 12)]
    assert figures[0].start == START and figures[0].end == END


async def test_a_pool_without_a_named_reservation_has_no_figures(stubbed: Any) -> None:
    provider, _ = stubbed
    assert await provider.reservations(request().pool) == []


async def test_a_resource_group_s_members_each_get_figures(stubbed: Any) -> None:
    provider, stubber = stubbed
    a, b, other = "cr-0aaa", "cr-0bbb", "cr-0ccc"
    stubber.add_response("describe_capacity_reservations", {"CapacityReservations": [
        reservation(CapacityReservationId=a, ReservationType="default",
                    TotalInstanceCount=8, AvailableInstanceCount=8),
        reservation(CapacityReservationId=other, ReservationType="default"),
        reservation(CapacityReservationId=b, AvailabilityZone="us-east-1b",
                    ReservationType="default", TotalInstanceCount=4, AvailableInstanceCount=1),
    ]}, {"Filters": [
        {"Name": "instance-type", "Values": ["p5.48xlarge"]},
        {"Name": "availability-zone", "Values": [AWS_ZONE, "us-east-1b"]},
        {"Name": "state", "Values": ["active", "pending", "scheduled"]},
    ]})
    for rid, groups in ((a, [GROUP_ARN]), (other, []), (b, [GROUP_ARN, GROUP_ARN + "-x"])):
        stubber.add_response("get_groups_for_capacity_reservation", {
            "CapacityReservationGroups": [{"GroupArn": g, "OwnerId": "123456789012"}
                                          for g in groups]},
            {"CapacityReservationId": rid})
    figures = await provider.reservations(
        request(capacityReservation={"resourceGroupArn": GROUP_ARN}).pool)
    assert [(f.id, f.zone, f.reserved, f.used, f.free) for f in figures] == [
        (a, AWS_ZONE, 8, 0, 8), (b, "us-east-1b", 4, 3, 1)]


async def test_after_validate_a_plan_outside_the_reservation_s_zone_is_refused(
    stubbed: Any,
) -> None:
    provider, stubber = stubbed
    req = request(capacityReservation=BLOCK)
    add_template(stubber)
    add_reservation(stubber)
    await provider.validate(req.pool)
    provider.check(req)
    with pytest.raises(ProviderConfigError, match=f"in zone {AWS_ZONE}, not us-east-1b"):
        provider.check(request(zone="us-east-1b", capacityReservation=BLOCK))


@pytest.mark.parametrize(("found", "message"), [
    ({"AvailabilityZone": "us-east-1c"}, "zone us-east-1c, where spec.parameters.subnets"),
    ({"InstanceType": "p4d.24xlarge"}, "reserves p4d.24xlarge, not p5.48xlarge"),
    ({"ReservationType": "default"}, "is a default reservation, not capacity-block"),
])
async def test_a_reservation_that_cannot_serve_the_pool_is_refused_before_anything_is_bought(
    stubbed: Any, found: dict[str, Any], message: str,
) -> None:
    provider, stubber = stubbed
    add_template(stubber)
    add_reservation(stubber, **found)
    with pytest.raises(ProviderConfigError, match=message):
        await provider.validate(request(capacityReservation=BLOCK).pool)


async def test_an_unknown_reservation_is_a_configuration_error(stubbed: Any) -> None:
    provider, stubber = stubbed
    add_template(stubber)
    stubber.add_client_error(
        "describe_capacity_reservations",
        service_error_code="InvalidCapacityReservationId.NotFound",
        service_message="The capacity reservation ID does not exist",
        http_status_code=400,
    )
    with pytest.raises(ProviderConfigError):
        await provider.validate(request(capacityReservation=BLOCK).pool)


async def test_an_empty_answer_names_the_missing_reservation(stubbed: Any) -> None:
    provider, stubber = stubbed
    add_template(stubber)
    stubber.add_response("describe_capacity_reservations", {"CapacityReservations": []},
                         {"CapacityReservationIds": [BLOCK["id"]]})
    with pytest.raises(ProviderConfigError, match=f"{BLOCK['id']} not found"):
        await provider.validate(request(capacityReservation=BLOCK).pool)


@pytest.mark.parametrize("value", [
    {},
    {"id": "cr-0abc", "resourceGroupArn": GROUP_ARN},
    {"resourceGroupArn": GROUP_ARN, "type": "capacity-block"},
    {"id": "odcr-1"},
    {"id": "cr-0abc", "type": "spot"},
    {"resourceGroupArn": "gpu-odcrs"},
])
def test_bad_reservation_parameters_name_the_field(value: dict[str, Any]) -> None:
    pool = make_pool("aws", aws_parameters(capacityReservation=value))
    with pytest.raises(ProviderConfigError, match=r"spec\.parameters\.capacityReservation"):
        parse_parameters(pool)
