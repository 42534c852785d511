"""AWS queued provisioning through Capacity Block offerings, against botocore's Stubber
(which validates every request against the EC2 service model): a pool buys a block only
with ``capacityBlockPurchase``, only an offering of the whole gang in the request's zone at
or under ``maxUpfrontFee``, once per key; a bought block is waited for until active, and a
purchasing pool launches only into its key's active block."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from providers.aws import AwsProvider, block_hours
from providers.base import (
    ENDED,
    GRANTED,
    QUEUED,
    AcquireRequest,
    CapacityUnavailable,
    ProviderConfigError,
)
from tests.providers.conftest import (
    AWS_ZONE,
    ZONE_LABEL,
    aws_parameters,
    fast_aws_settings,
    make_pool,
)
from tests.providers.test_aws_stubbed import KEY, OWNER, TAGS

BUY = {"maxUpfrontFee": "50000"}
START = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
BLOCK_FILTERS = [
    {"Name": "tag:muster.dev/cluster", "Values": ["test-cluster"]},
    {"Name": "tag:muster.dev/pool", "Values": ["gpu-pool"]},
    {"Name": "tag:muster.dev/key", "Values": [KEY]},
]


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


def offer(oid: str, fee: str, zone: str = AWS_ZONE, count: int = 4,
          start: datetime = START) -> dict[str, Any]:
    return {"CapacityBlockOfferingId": oid, "InstanceType": "p5.48xlarge",
            "AvailabilityZone": zone, "InstanceCount": count, "StartDate": start,
            "EndDate": datetime(2026, 12, 4, 11, 30, tzinfo=UTC),
            "CapacityBlockDurationHours": 24, "UpfrontFee": fee, "CurrencyCode": "USD"}


def block(state: str) -> dict[str, Any]:
    return {"CapacityReservationId": "cr-0feedfacecafe0001", "State": state,
            "InstanceType": "p5.48xlarge", "AvailabilityZone": AWS_ZONE,
            "ReservationType": "capacity-block", "TotalInstanceCount": 4,
            "AvailableInstanceCount": 4, "StartDate": START,
            "CreateDate": datetime(2026, 12, 2, 9, 0, tzinfo=UTC),
            "EndDate": datetime(2026, 12, 4, 11, 30, tzinfo=UTC)}


def no_block_yet(stubber: Stubber, *found: dict[str, Any]) -> None:
    stubber.add_response("describe_capacity_reservations",
                         {"CapacityReservations": list(found)}, {"Filters": BLOCK_FILTERS})


async def test_the_cheapest_earliest_offering_of_the_whole_gang_in_its_zone_is_bought_once(
    stubbed: tuple[AwsProvider, Stubber],
) -> None:
    provider, stubber = stubbed
    r = request(capacityBlockPurchase=BUY)
    assert provider.queues(r.pool)
    no_block_yet(stubber)
    stubber.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": [
            offer("cb-elsewhere", "100", zone="us-east-1b"),
            offer("cb-too-dear", "90000"),
            offer("cb-too-small", "100", count=2),
            offer("cb-ok", "42000.50"),
        ]},
        {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 48},
    )
    stubber.add_response(
        "purchase_capacity_block", {"CapacityReservation": block("payment-pending")},
        {"CapacityBlockOfferingId": "cb-ok", "InstancePlatform": "Linux/UNIX",
         "TagSpecifications": [{"ResourceType": "capacity-reservation", "Tags": TAGS}]},
    )
    status = await provider.enqueue(r, 30 * 3600, ready_within=0)  # 30 h: a two-day block
    assert (status.outcome, status.state) == (QUEUED, "payment-pending")
    assert status.estimate == START.isoformat()

    # A repeat (a restarted controller) finds the key's block and buys nothing.
    no_block_yet(stubber, block("scheduled"))
    again = await provider.enqueue(r, 30 * 3600, ready_within=0)
    assert again.name == "cr-0feedfacecafe0001" and again.outcome == QUEUED


async def test_no_offering_under_the_limit_buys_nothing_and_waits(
    stubbed: tuple[AwsProvider, Stubber],
) -> None:
    provider, stubber = stubbed
    r = request(capacityBlockPurchase={"maxUpfrontFee": "10", "durationHours": 24})
    no_block_yet(stubber)
    stubber.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": [offer("cb-dear", "42000"), offer("cb-odd", "n/a")]},
        {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 24},
    )
    status = await provider.enqueue(r, None, ready_within=0)
    assert status.outcome == QUEUED and status.state == "no-offering"
    assert "at or under 10" in status.error


@pytest.mark.parametrize(("state", "outcome"), [
    ("scheduled", QUEUED), ("payment-pending", QUEUED), ("active", GRANTED),
    ("expired", ENDED), ("payment-failed", ENDED),
])
async def test_a_bought_block_s_state_is_the_queue_outcome(
    stubbed: tuple[AwsProvider, Stubber], state: str, outcome: str,
) -> None:
    provider, stubber = stubbed
    r = request(capacityBlockPurchase=BUY)
    no_block_yet(stubber, block(state))
    got = await provider.queued(r.pool, r.key)
    assert got is not None and got.outcome == outcome
    # EC2 terminates a block's instances from 30 minutes before its EndDate: that is when
    # the cloud ends the run, whatever Muster's maxRunDurationSeconds says.
    assert got.ends == datetime(2026, 12, 4, 11, 0, tzinfo=UTC).isoformat()
    no_block_yet(stubber)
    assert await provider.queued(r.pool, r.key) is None


async def test_cancelling_says_the_block_stays_and_a_launch_waits_for_an_active_one(
    stubbed: tuple[AwsProvider, Stubber], caplog: pytest.LogCaptureFixture,
) -> None:
    provider, stubber = stubbed
    r = request(capacityBlockPurchase=BUY)
    no_block_yet(stubber, block("scheduled"))
    said = await provider.cancel_queued(r.pool, r.key)
    assert said is not None and "was already bought and cannot be cancelled" in said
    assert "stays reserved (and paid) until" in said
    assert "cannot be cancelled" in caplog.text
    no_block_yet(stubber)
    assert await provider.cancel_queued(r.pool, r.key) is None

    no_block_yet(stubber, block("scheduled"))
    with pytest.raises(CapacityUnavailable, match="launch only into an active one"):
        await provider.launch(r, [])


def test_block_lengths_are_days_then_weeks_and_bounded() -> None:
    assert block_hours(None, 24) == 24
    assert block_hours(600, 24) == 24
    assert block_hours(15 * 24 * 3600, 24) == 21 * 24
    with pytest.raises(ProviderConfigError, match="at most 182 days"):
        block_hours(200 * 24 * 3600, 24)


async def test_a_pool_without_permission_buys_nothing(
    stubbed: tuple[AwsProvider, Stubber],
) -> None:
    provider, _ = stubbed
    r = request()
    assert not provider.queues(r.pool)
    with pytest.raises(ProviderConfigError, match="capacityBlockPurchase"):
        await provider.enqueue(r, 3600, ready_within=0)
