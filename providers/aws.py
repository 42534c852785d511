"""AWS EC2 provider: N instances all or nothing with one instant EC2 Fleet.

The adapter of the all-or-nothing skeleton (:mod:`providers.atomic`, which adopts by key,
recounts and compensates) over EC2:

* **launch**: ``CreateFleet Type=instant`` with ``OnDemandOptions.MinTargetCapacity = N``
  plus ``SingleInstanceType``/``SingleAvailabilityZone`` asks EC2 itself for N or nothing;
  the fleet's ``ClientToken`` is derived from the acquisition key, so a repeated launch
  creates nothing new. A fleet short of N reports its error codes (quota, capacity).
* **find / delete**: every instance and fleet is tagged with pool, key, owner and cluster;
  instances are found by tag, deleted by tag and id, with the per-acquisition placement
  group. :meth:`AwsProvider.list` lets the controller's collector find what an abandoned
  key left.

Credentials come only from the standard AWS chain (IRSA web identity, EKS Pod Identity,
instance profile, environment); never from a CapacityPool.

Node names: an instance is assumed to register as its private DNS name (the EKS default,
``ip-10-0-1-5.ec2.internal`` or, with resource-based hostnames, ``i-0abc.ec2.internal``).
Set ``nodeNameFrom: instanceId`` in the pool when kubelet uses the bare instance id.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from controller.api.capacitypool import CapacityPool
from providers.atomic import AtomicProvider, Launch
from providers.base import (
    ENDED,
    GRANTED,
    QUEUED,
    AcquireRequest,
    CapacityUnavailable,
    ProvidedNode,
    ProviderConfigError,
    ProviderError,
    QueuedStatus,
    QuotaExceeded,
    TransientProviderError,
)
from providers.bootstrap import BootstrapError, merge_nodeadm
from providers.common import (
    INSTANCE_TYPE_LABEL,
    CloudProviderSettings,
    PoolParameters,
    ReservationFigures,
    parse_pool_parameters,
)
from providers.naming import aws_client_token, aws_placement_group_name
from providers.retry import CloudCalls

log = logging.getLogger(__name__)

TAG_POOL = "muster.dev/pool"
TAG_KEY = "muster.dev/key"
TAG_OWNER = "muster.dev/owner"
TAG_OWNER_UID = "muster.dev/owner-uid"
TAG_CLUSTER = "muster.dev/cluster"
TAG_TEMPLATE = "muster.dev/launch-template"
"""On an instance: the name of Muster's launch-template copy it was launched from (empty for
the pool's own template), so a copy no live instance names can be deleted."""
RESERVED_TAG_PREFIX = "muster.dev/"

TOPOLOGY_LABEL_PREFIX = "topology.k8s.aws/network-node-layer-"

LIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = frozenset({"shutting-down", "terminated"})

CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacityOnOutpost",
    "InsufficientFreeAddressesInSubnet",
    # A targeted reservation (or Capacity Block) with too few free instances: capacity that
    # may come back (another gang's release), not a configuration error.
    "ReservationCapacityExceeded",
})
QUOTA_CODES = frozenset({
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "PlacementGroupLimitExceeded",
    "FleetLimitExceeded",
})
THROTTLE_CODES = frozenset({
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
})
_TERMINATE_CHUNK = 1000
TEMPLATE_GONE_CODES = frozenset({"InvalidLaunchTemplateName.NotFoundException",
                                 "InvalidLaunchTemplateId.NotFound"})
_TAG_CHUNK = 1000
BOOTSTRAP_CACHE_SECONDS = 60.0
"""How long a launch template's merged user data is reused before it is read again (a
``$Default``/``$Latest`` version may move)."""
_TOPOLOGY_CHUNK = 100


class LaunchTemplateRef(PoolParameters):
    id: str | None = Field(default=None, pattern=r"^lt-[0-9a-f]+$")
    name: str | None = Field(default=None, min_length=3, max_length=128)
    version: str = Field(default="$Default", pattern=r"^(\$Default|\$Latest|[0-9]+)$")

    @model_validator(mode="after")
    def _one_of(self) -> LaunchTemplateRef:
        if (self.id is None) == (self.name is None):
            raise ValueError("set exactly one of id or name")
        return self


class PlacementGroupParams(PoolParameters):
    strategy: Literal["cluster", "partition", "spread"] = "cluster"
    per_acquisition: bool = Field(
        default=True,
        alias="perAcquisition",
        description="Create one group per acquisition (tagged, deleted on release).",
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="An existing group shared by every acquisition (perAcquisition: false).",
    )

    @model_validator(mode="after")
    def _name_xor_per_acquisition(self) -> PlacementGroupParams:
        if self.per_acquisition and self.name is not None:
            raise ValueError("name is only allowed with perAcquisition: false")
        if not self.per_acquisition and self.name is None:
            raise ValueError("name is required with perAcquisition: false")
        return self


class CapacityReservationParams(PoolParameters):
    """Named capacity the pool draws from: an On-Demand Capacity Reservation (by id or by
    resource group) or a Capacity Block for ML (by its reservation id)."""

    id: str | None = Field(default=None, pattern=r"^cr-[0-9a-f]+$")
    resource_group_arn: str | None = Field(
        default=None,
        alias="resourceGroupArn",
        pattern=r"^arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:[0-9]{12}:group/[A-Za-z0-9._-]+$",
    )
    type: Literal["default", "capacity-block"] = Field(
        default="default",
        description="default: an ODCR (launches fail rather than run outside it); "
        "capacity-block: a Capacity Block (market type capacity-block, fleet target "
        "capacity type capacity-block)",
    )

    @model_validator(mode="after")
    def _one_target(self) -> CapacityReservationParams:
        if (self.id is None) == (self.resource_group_arn is None):
            raise ValueError("set exactly one of id or resourceGroupArn")
        if self.type == "capacity-block" and self.id is None:
            raise ValueError("a capacity-block reservation is named by its id")
        return self


MAX_BLOCK_HOURS = 182 * 24
"""The longest Capacity Block EC2 offers."""


class CapacityBlockPurchaseParams(PoolParameters):
    """Explicit permission to buy Capacity Blocks for ML for the pool's queued requests
    (``queued-provisioning.muster.dev``): without it Muster never buys one."""

    max_upfront_fee: str = Field(
        alias="maxUpfrontFee", pattern=r"^[0-9]+(\.[0-9]+)?$",
        description="The most Muster may pay for one block: an offering's UpfrontFee, in "
        "the offering's currency, must not exceed it")
    duration_hours: int = Field(
        default=24, alias="durationHours", ge=1, le=MAX_BLOCK_HOURS,
        description="The block's length for a request without maxRunDurationSeconds")


class AwsPoolParameters(PoolParameters):
    """``spec.parameters`` of a CapacityPool with ``provider: aws``."""

    region: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")
    launch_template: LaunchTemplateRef = Field(alias="launchTemplate")
    image_id: str | None = Field(default=None, alias="imageId", pattern=r"^ami-[0-9a-f]+$")
    instance_type: str = Field(alias="instanceType", pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")
    subnets: dict[str, str] = Field(
        min_length=1, description="Availability zone -> subnet id new instances launch into."
    )
    zone_label: str = Field(default="topology.kubernetes.io/zone", alias="zoneLabel")
    placement_group: PlacementGroupParams | None = Field(default=None, alias="placementGroup")
    capacity_reservation_usage: Literal["none", "use-capacity-reservations-first"] = Field(
        default="none", alias="capacityReservationUsage"
    )
    capacity_reservation: CapacityReservationParams | None = Field(
        default=None,
        alias="capacityReservation",
        description="Launch only into this reservation or Capacity Block (Muster's copy of "
        "the launch template targets it, with capacity-reservations-only)",
    )
    capacity_block_purchase: CapacityBlockPurchaseParams | None = Field(
        default=None,
        alias="capacityBlockPurchase",
        description="A queued request waits for a Capacity Block offering of its gang (at "
        "most maxUpfrontFee), which Muster buys and launches into once it is active",
    )
    tags: dict[str, str] = Field(default_factory=dict)
    node_name_from: Literal["privateDnsName", "instanceId"] = Field(
        default="privateDnsName", alias="nodeNameFrom"
    )
    record_network_topology: bool = Field(default=True, alias="recordNetworkTopology")
    bootstrap: Literal["nodeadm", "asIs"] = Field(
        default="nodeadm",
        description="nodeadm: Muster launches from a copy of the launch template whose user "
        "data (EKS AL2023, MIME multi-part) gets one more NodeConfig part registering the "
        "node behind muster.dev/unregistered:NoExecute; asIs: the template is used as it is "
        "(its bootstrap sets that taint itself, or the node is usable at once)",
    )

    @field_validator("subnets")
    @classmethod
    def _subnet_ids(cls, value: dict[str, str]) -> dict[str, str]:
        for zone, subnet in value.items():
            if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]+[a-z]", zone):
                raise ValueError(f"{zone!r} is not an availability zone name")
            if not re.fullmatch(r"subnet-[0-9a-f]+", subnet):
                raise ValueError(f"{subnet!r} (zone {zone}) is not a subnet id")
        return value

    @field_validator("tags")
    @classmethod
    def _no_reserved_tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key, tag_value in value.items():
            if key.startswith(RESERVED_TAG_PREFIX) or key.startswith("aws:"):
                raise ValueError(f"tag {key!r} uses a reserved prefix")
            if not 1 <= len(key) <= 128 or len(tag_value) > 256:
                raise ValueError(f"tag {key!r}: keys are 1-128 and values 0-256 characters")
        return value


BLOCK_WAITING = frozenset({"pending", "scheduled", "payment-pending", "assessing", "delayed"})


def block_hours(run_seconds: int | None, default_hours: int) -> int:
    """A Capacity Block length that holds the run: whole days up to 14, then whole weeks
    (EC2's offered lengths), at most 182 days."""
    hours = default_hours if run_seconds is None else math.ceil(run_seconds / 3600)
    days = max(1, math.ceil(hours / 24))
    days = days if days <= 14 else math.ceil(days / 7) * 7
    if days * 24 > MAX_BLOCK_HOURS:
        raise ProviderConfigError(
            f"a Capacity Block lasts at most {MAX_BLOCK_HOURS // 24} days, not {hours} hours "
            "(maxRunDurationSeconds)")
    return days * 24


BLOCK_TERMINATION_LEAD = timedelta(minutes=30)
"""EC2 begins terminating a Capacity Block's instances 30 minutes before the block ends."""


def _block_status(found: Mapping[str, Any]) -> QueuedStatus:
    state = str(found.get("State") or "")
    outcome = GRANTED if state == "active" else QUEUED if state in BLOCK_WAITING else ENDED
    start = found.get("StartDate")
    created = found.get("CreateDate")
    end = found.get("EndDate")
    return QueuedStatus(
        name=str(found.get("CapacityReservationId") or ""), state=state, outcome=outcome,
        since=created.isoformat() if isinstance(created, datetime) else "",
        estimate=start.isoformat() if isinstance(start, datetime) and outcome == QUEUED
        else "",
        ends=(end - BLOCK_TERMINATION_LEAD).isoformat() if isinstance(end, datetime) else "")


def parse_parameters(pool: CapacityPool) -> AwsPoolParameters:
    """The pool's parameters, or :class:`ProviderConfigError` naming the bad field."""
    return parse_pool_parameters(AwsPoolParameters, pool)


class AwsProviderSettings(CloudProviderSettings):
    """Process-wide settings (environment ``MUSTER_AWS_*``); credentials are not settings."""

    model_config = SettingsConfigDict(env_prefix="MUSTER_AWS_", extra="ignore")

    region: str | None = None
    """Default region for pools without ``parameters.region`` (else the AWS chain's)."""
    endpoint_url: str | None = None
    """Custom EC2 endpoint (VPC endpoint, or a local emulator in tests)."""
    cluster_name: str = Field(default="muster", min_length=1, max_length=256)
    describe_attempts: int = Field(default=10, ge=1)
    """Tries to see freshly launched instances (DescribeInstances is eventually consistent)."""
    describe_interval_seconds: float = Field(default=1.0, ge=0)
    placement_group_delete_timeout_seconds: float = Field(default=300.0, ge=0)
    placement_group_poll_seconds: float = Field(default=5.0, ge=0)
    template_sweep_seconds: float = Field(default=600.0, gt=0)
    """How often listing a pool also deletes the cluster's launch-template copies (in the
    pool's region) that no live instance and no launch in flight uses."""


ClientFactory = Callable[[str | None], Any]
"""region -> a boto3 EC2 client (tests inject stubbed or moto-backed clients)."""


def default_client_factory(settings: AwsProviderSettings) -> ClientFactory:
    def make(region: str | None) -> Any:
        import boto3
        from botocore.config import Config

        # Retries are ours (tenacity, with jitter, same token); botocore must not add its own.
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"})
        return boto3.client(
            "ec2",
            region_name=region or settings.region,
            endpoint_url=settings.endpoint_url,
            config=config,
        )

    return make


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _http_status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(status or 0)
    return 0


def is_transient(exc: BaseException) -> bool:
    """Throttling, 5xx and connection trouble: worth retrying with the same token."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ClientError):
        return _error_code(exc) in THROTTLE_CODES or _http_status(exc) >= 500
    return isinstance(exc, ConnectionError | HTTPClientError)


def map_error(exc: BaseException, what: str) -> ProviderError:
    """A botocore exception as a provider error (after retries were spent or skipped)."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientError):
        code = _error_code(exc)
        message = f"{what}: {code}: {exc}"
        return _error_for_codes([code], message, status=_http_status(exc))
    if isinstance(exc, NoCredentialsError | NoRegionError):
        return ProviderConfigError(
            f"{what}: {exc} (credentials come from IRSA, Pod Identity or the instance "
            "profile; the region from the pool, MUSTER_AWS_REGION or AWS_REGION)"
        )
    if is_transient(exc):
        return TransientProviderError(f"{what}: {exc}")
    if isinstance(exc, BotoCoreError):
        return ProviderConfigError(f"{what}: {exc}")
    return TransientProviderError(f"{what}: unexpected {type(exc).__name__}: {exc}")


def _error_for_codes(
    codes: Iterable[str], message: str, *, status: int = 0, available: int | None = None
) -> ProviderError:
    """Most specific class wins: quota, then capacity, then transient, then configuration."""
    found = [code for code in codes if code]
    if any(code in QUOTA_CODES for code in found):
        return QuotaExceeded(message)
    if any(code in CAPACITY_CODES or code.startswith("Insufficient") for code in found):
        return CapacityUnavailable(message, available=available)
    if not found:
        if status >= 500:
            return TransientProviderError(message)
        # A short fleet without an explanation: treat it as a stock-out in this domain.
        return CapacityUnavailable(message, available=available)
    if status >= 500 or all(code in THROTTLE_CODES for code in found):
        return TransientProviderError(message)
    return ProviderConfigError(message)


@dataclass(frozen=True, slots=True)
class ExpectedCode:
    """An EC2 error code the caller asked to handle itself (``expect`` of ``CloudCalls.call``)."""

    code: str


def _expected(exc: BaseException, expect: Collection[str]) -> ExpectedCode | None:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError) and _error_code(exc) in expect:
        return ExpectedCode(_error_code(exc))
    return None


Instance = dict[str, Any]
Instances = list[Instance]
Nodes = list[ProvidedNode]
Ids = list[str]
TagList = list[dict[str, str]]


def _tags_dict(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags", []) or []}


class AwsProvider(AtomicProvider[Instance]):
    """The ``aws`` provider: the all-or-nothing skeleton over EC2. Safe to share between
    concurrent reconcilers."""

    name = "aws"

    def __init__(
        self,
        settings: AwsProviderSettings | None = None,
        *,
        client_factory: ClientFactory | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings or AwsProviderSettings()
        self._factory = client_factory or default_client_factory(self.settings)
        self._clients: dict[str | None, Any] = {}
        self._client_lock = asyncio.Lock()
        self._calls: CloudCalls[str] = self.settings.calls(
            is_transient=is_transient, map_error=map_error, expected=_expected
        )
        self._bootstrap_cache: dict[tuple[str | None, str], tuple[float, dict[str, Any]]] = {}
        self._reservation_cache: dict[tuple[str | None, str], dict[str, Any]] = {}
        self._templates_in_use: Counter[tuple[str | None, str]] = Counter()
        """Copies a launch of this process is using (from their creation to the fleet's
        answer): never deleted meanwhile."""
        self._template_lock = asyncio.Lock()
        """Held while a copy is created and marked in use, and while unused copies are
        deleted: a copy is never deleted between a launch's creating and using it."""
        self._last_sweep: dict[str | None, float] = {}

    # ---- the adapter ------------------------------------------------------------------

    async def validate(self, pool: CapacityPool) -> None:
        """The parameters, and (``bootstrap: nodeadm``) that the launch template's user data
        can carry Muster's startup taint: said before anything is bought."""
        params = parse_parameters(pool)
        if params.bootstrap != "nodeadm" and params.capacity_reservation is None:
            return
        try:
            ec2 = await self._client(params.region)
            await self._merged_template_data(ec2, params)
            if params.capacity_reservation is not None and params.capacity_reservation.id:
                self._check_reservation(params, await self._reservation(ec2, params))
        except ProviderConfigError:
            raise
        except ProviderError as exc:
            # EC2 unreachable now says nothing about the pool: the launch reads the
            # template again and fails there, retryably, if it must.
            log.info("pool %s: launch template not checked now: %s", pool.metadata.name, exc)

    def check(self, request: AcquireRequest) -> None:
        params = parse_parameters(request.pool)
        self._placements(params, request)

    async def reservations(self, pool: CapacityPool) -> list[ReservationFigures]:
        """The cloud's own figures of the pool's reservation (DescribeCapacityReservations),
        or of every member of its resource group: empty for a pool without one.

        DescribeCapacityReservations has no resource-group filter, and listing a group's
        members is the Resource Groups API (another client and permission). EC2 answers
        the other direction, GetGroupsForCapacityReservation: the active reservations of the
        pool's instance type in its subnets' zones are read, and those in the group kept."""
        params = parse_parameters(pool)
        cr = params.capacity_reservation
        if cr is None:
            return []
        ec2 = await self._client(params.region)
        if cr.id is not None:
            return [_figures(await self._reservation(ec2, params))]

        def candidates() -> list[dict[str, Any]]:
            pages = ec2.get_paginator("describe_capacity_reservations").paginate(Filters=[
                {"Name": "instance-type", "Values": [params.instance_type]},
                {"Name": "availability-zone", "Values": sorted(params.subnets)},
                {"Name": "state", "Values": ["active", "pending", "scheduled"]},
            ])
            return [dict(r) for page in pages for r in page.get("CapacityReservations", [])]

        found = await self._calls.call(candidates, what="DescribeCapacityReservations")
        members = []
        for reservation in found:
            groups = await self._calls.call(
                ec2.get_groups_for_capacity_reservation, what="GetGroupsForCapacityReservation",
                CapacityReservationId=reservation["CapacityReservationId"],
            )
            arns = {g.get("GroupArn") for g in groups.get("CapacityReservationGroups") or []}
            if cr.resource_group_arn in arns:
                members.append(_figures(reservation))
        return sorted(members, key=lambda f: (f.zone, f.id))

    # ---- queued provisioning (Capacity Block offerings) ---------------------------------

    def queues(self, pool: CapacityPool) -> bool:
        return parse_parameters(pool).capacity_block_purchase is not None

    async def enqueue(self, request: AcquireRequest, run_seconds: int | None, *,
                      ready_within: float) -> QueuedStatus:
        """The key's Capacity Block, bought now if an offering of the whole gang in the
        request's zone costs at most ``maxUpfrontFee``; else a status saying none is offered
        yet (the next poll looks again). Idempotent: the block carries the key's tags and is
        found before anything is bought. The block is sized for ``run_seconds`` alone
        (whole days: adding ``ready_within`` would buy a day more for a run of whole days);
        its status's ``ends`` bounds Muster's run instead."""
        self.check(request)
        params = parse_parameters(request.pool)
        buy = params.capacity_block_purchase
        if buy is None or params.capacity_reservation is not None:
            raise ProviderConfigError(
                f"pool {request.pool.metadata.name}: buying Capacity Blocks needs "
                "spec.parameters.capacityBlockPurchase and no capacityReservation")
        found = await self.queued(request.pool, request.key)
        if found is not None:
            return found
        hours = block_hours(run_seconds, buy.duration_hours)
        zones = {z for z, _ in self._placements(params, request)}
        ec2 = await self._client(params.region)
        response = await self._calls.call(
            ec2.describe_capacity_block_offerings, what="DescribeCapacityBlockOfferings",
            InstanceType=params.instance_type, InstanceCount=request.count,
            CapacityDurationHours=hours,
        )
        limit = Decimal(buy.max_upfront_fee)
        offers = [o for o in response.get("CapacityBlockOfferings") or []
                  if o.get("AvailabilityZone") in zones
                  and o.get("InstanceCount") == request.count
                  and _fee(o) <= limit]
        if not offers:
            return QueuedStatus(
                name="no offering", state="no-offering", outcome=QUEUED,
                error=f"no Capacity Block of {request.count} x {params.instance_type} for "
                f"{hours} h in {', '.join(sorted(zones))} at or under {buy.max_upfront_fee}")
        offer = min(offers, key=lambda o: (o.get("StartDate"), _fee(o)))
        bought = await self._calls.call(
            ec2.purchase_capacity_block, what="PurchaseCapacityBlock",
            CapacityBlockOfferingId=offer["CapacityBlockOfferingId"],
            InstancePlatform="Linux/UNIX",
            TagSpecifications=[{"ResourceType": "capacity-reservation",
                                "Tags": self._tags(params, request)}],
        )
        log.warning("acquire %s: bought Capacity Block %s (%s %s upfront, %s to %s)",
                    request.key, bought["CapacityReservation"].get("CapacityReservationId"),
                    offer.get("UpfrontFee"), offer.get("CurrencyCode", ""),
                    offer.get("StartDate"), offer.get("EndDate"))
        return _block_status(bought["CapacityReservation"])

    async def queued(self, pool: CapacityPool, key: str) -> QueuedStatus | None:
        """The Capacity Block bought for ``key`` (found by its tags), or None."""
        block = await self._key_block(pool, key)
        return None if block is None else _block_status(block)

    async def cancel_queued(self, pool: CapacityPool, key: str) -> str | None:
        """A bought Capacity Block cannot be cancelled: EC2 keeps it (and its fee) until
        its end. Nothing launches into it once the request is gone; said loudly. None when
        none was bought (the offering is simply no longer looked for)."""
        block = await self._key_block(pool, key)
        if block is None:
            return None
        end = block.get("EndDate")
        until = end.isoformat() if isinstance(end, datetime) else str(end or "its end")
        text = (f"Capacity Block {block.get('CapacityReservationId')} was already bought and "
                f"cannot be cancelled: it stays reserved (and paid) until {until}, with "
                "nothing launched into it")
        log.warning("acquire %s: %s", key, text)
        return text

    async def _key_block(self, pool: CapacityPool, key: str) -> dict[str, Any] | None:
        params = parse_parameters(pool)
        ec2 = await self._client(params.region)
        response = await self._calls.call(
            ec2.describe_capacity_reservations, what="DescribeCapacityReservations",
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.settings.cluster_name]},
                     {"Name": f"tag:{TAG_POOL}", "Values": [pool.metadata.name]},
                     {"Name": f"tag:{TAG_KEY}", "Values": [key]}],
        )
        blocks = [dict(b) for b in response.get("CapacityReservations") or []]
        # A key buys one block; a live one before an ended one.
        blocks.sort(key=lambda b: _block_status(b).outcome == ENDED)
        return blocks[0] if blocks else None

    async def _into_bought_block(
        self, params: AwsPoolParameters, request: AcquireRequest
    ) -> AwsPoolParameters:
        """A purchasing pool launches only into the key's active block."""
        block = await self._key_block(request.pool, request.key)
        if block is None or _block_status(block).outcome != GRANTED:
            raise CapacityUnavailable(
                f"acquire {request.key}: its Capacity Block is "
                f"{'not bought' if block is None else block.get('State')}; instances launch "
                "only into an active one", available=0)
        rid = str(block["CapacityReservationId"])
        self._reservation_cache[(params.region, rid)] = block
        return params.model_copy(update={"capacity_reservation": CapacityReservationParams(
            id=rid, type="capacity-block")})

    async def find(self, pool: CapacityPool, key: str | None) -> Instances:
        params = parse_parameters(pool)
        ec2 = await self._client(params.region)
        return await self._describe_by_tags(ec2, pool.metadata.name, key=key)

    async def launch(self, request: AcquireRequest, have: Sequence[Instance]) -> Launch[Instance]:
        """One instant EC2 Fleet under the key's ``ClientToken`` (a repeated call returns the
        first one's instances), then the launched instances described by id: a listing by tag
        may not show them yet."""
        params = parse_parameters(request.pool)
        if params.capacity_block_purchase is not None:
            params = await self._into_bought_block(params, request)
        placements = self._placements(params, request)
        ec2 = await self._client(params.region)
        response: dict[str, Any] | ExpectedCode = ExpectedCode("")
        for last in (False, True):
            # The in-use mark guards a copy against this process's sweeps only: another
            # Muster process (a former leader, a restarted one) may delete a copy between
            # its creation (or reuse) here and the fleet, as no instance names it yet. EC2
            # refuses such a fleet before creating anything (the ClientToken stays unused),
            # so the copy is created again and the fleet sent once more.
            template, copy, volume_tags = await self._launch_template(
                ec2, params, request.pool.metadata.name)
            try:
                group = await self._ensure_placement_group(ec2, params, request)
                response = await self._calls.call(
                    ec2.create_fleet,
                    what="CreateFleet",
                    expect=() if copy is None or last else TEMPLATE_GONE_CODES,
                    **self._fleet_request(params, request, placements, group,
                                          template=template, copy=copy,
                                          template_volume_tags=volume_tags),
                )
            finally:
                if copy is not None:
                    self._templates_in_use[(params.region, copy)] -= 1
                    if self._templates_in_use[(params.region, copy)] <= 0:
                        del self._templates_in_use[(params.region, copy)]
            if not isinstance(response, ExpectedCode):
                break
            log.info("acquire %s: launch template copy %s was deleted by another Muster "
                     "process before the fleet used it; creating it again", request.key, copy)
        assert not isinstance(response, ExpectedCode)
        launched = [
            instance_id
            for entry in response.get("Instances", []) or []
            for instance_id in entry.get("InstanceIds", []) or []
        ]
        ids = sorted(set(launched) | {i["InstanceId"] for i in have})
        errors = response.get("Errors", []) or []
        if len(ids) != request.count:
            return Launch([{"InstanceId": i} for i in ids],
                          self._fleet_failure(request, len(ids), errors))
        try:
            instances = await self._describe_launched(ec2, params, ids)
        except ProviderError as exc:
            return Launch([{"InstanceId": i} for i in ids], exc)
        if errors:
            log.info("acquire %s: fleet complete despite errors %s", request.key, errors)
        return Launch([i for i in instances if i["State"]["Name"] not in GONE_STATES])

    async def delete(self, pool: CapacityPool, key: str, known: Sequence[Instance]) -> int:
        """Terminate the key's instances (by tag, and ``known`` by id) and its placement
        group."""
        params = parse_parameters(pool)
        ec2 = await self._client(params.region)
        tagged = await self._describe_by_tags(ec2, pool.metadata.name, key=key)
        ids = sorted({i["InstanceId"] for i in tagged} | {i["InstanceId"] for i in known})
        await self._terminate(ec2, ids, what=f"release {key}")
        if params.placement_group is not None and params.placement_group.per_acquisition:
            await self._delete_placement_group(ec2, aws_placement_group_name(key))
        log.info("release %s: terminated %d instances", key, len(ids))
        if ids:
            await self._sweep_templates(ec2, params.region, pool.metadata.name)
        return len(ids)

    async def to_nodes(
        self, pool: CapacityPool, machines: Sequence[Instance], request: AcquireRequest | None
    ) -> Nodes:
        """Nodes named as kubelet registers them (a hint: Muster knows them by providerID);
        an acquisition's also get the instances' observed network topology."""
        params = parse_parameters(pool)
        if request is None:
            await self._sweep_due(params.region)
            return [self._node(params, pool.metadata.name, i, {}) for i in machines]
        ec2 = await self._client(params.region)
        if params.node_name_from == "privateDnsName" and not all(
            i.get("PrivateDnsName") for i in machines
        ):
            machines = await self._describe_launched(
                ec2, params, [i["InstanceId"] for i in machines]
            )
        await self._tag_interfaces(ec2, params, request, machines)
        return await self._nodes(ec2, params, request, machines)

    # ---- requests ---------------------------------------------------------------------

    def _placements(
        self, params: AwsPoolParameters, request: AcquireRequest
    ) -> list[tuple[str, str]]:
        """(zone, subnet) pairs the fleet may launch into: the zone the plan chose, or,
        when it chose none (a pool without declared domains, whose placeholder zone is the
        cloud's to pick, or no zone level at all), every zone of the pool (of its capacity
        reservation, when it has one): EC2 picks one (``SingleAvailabilityZone``), and the
        zone the nodes register in is the one Muster publishes."""
        reserved = self._reserved_zone(params)
        zone = request.chosen.get(params.zone_label)
        if zone is None:
            zones = [reserved] if reserved is not None else sorted(params.subnets)
        elif reserved is not None and zone != reserved:
            cr = params.capacity_reservation
            raise ProviderConfigError(
                f"acquire {request.key}: pool {request.pool.metadata.name} draws from "
                f"capacity reservation {cr.id if cr else ''} in zone {reserved}, not {zone}"
            )
        else:
            zones = [zone]
        missing = [z for z in zones if z not in params.subnets]
        if missing:
            raise ProviderConfigError(
                f"acquire {request.key}: pool {request.pool.metadata.name} has no subnet in "
                f"zone {missing[0]} (spec.parameters.subnets has {sorted(params.subnets)})"
            )
        return [(z, params.subnets[z]) for z in zones]

    def _tags(self, params: AwsPoolParameters, request: AcquireRequest) -> TagList:
        tags = dict(params.tags)
        tags.update({
            TAG_POOL: request.pool.metadata.name,
            TAG_KEY: request.key,
            TAG_OWNER: request.owner,
            TAG_CLUSTER: self.settings.cluster_name,
        })
        if request.owner_uid:
            tags[TAG_OWNER_UID] = request.owner_uid
        return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]

    def _fleet_request(
        self,
        params: AwsPoolParameters,
        request: AcquireRequest,
        placements: Sequence[tuple[str, str]],
        group: str | None,
        *,
        template: Mapping[str, Any] | None = None,
        copy: str | None = None,
        template_volume_tags: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The instant fleet. Its instances and their EBS volumes carry the acquisition's
        tags (an instant fleet tags ``fleet``, ``instance`` and ``volume`` at launch; a
        network interface only through a launch template, see :meth:`_tag_interfaces`),
        whatever template it launches from (the pool's own, Muster's copy, a Capacity
        Block's). ``template_volume_tags`` (the template's own volume tags, when Muster read
        it) are repeated on the volumes beside Muster's, so none is lost whether EC2 merges a
        request's tags of a resource type with the template's or replaces them."""
        template = dict(template or _source_template(params))
        overrides: list[dict[str, Any]] = []
        for zone, subnet in placements:
            override: dict[str, Any] = {
                "InstanceType": params.instance_type,
                "SubnetId": subnet,
                "AvailabilityZone": zone,
            }
            if params.image_id is not None:
                override["ImageId"] = params.image_id
            if group is not None:
                override["Placement"] = {"GroupName": group}
            overrides.append(override)
        on_demand: dict[str, Any] = {
            "MinTargetCapacity": request.count,
            "SingleInstanceType": True,
            "SingleAvailabilityZone": True,
        }
        if params.capacity_reservation_usage != "none" or (
            params.capacity_reservation is not None
            and params.capacity_reservation.type == "default"
        ):
            on_demand["CapacityReservationOptions"] = {
                "UsageStrategy": "use-capacity-reservations-first"
            }
        tags = self._tags(params, request)
        block = (params.capacity_reservation is not None
                 and params.capacity_reservation.type == "capacity-block")
        fleet: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": aws_client_token(request.key),
            "LaunchTemplateConfigs": [
                {"LaunchTemplateSpecification": template, "Overrides": overrides}
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": request.count,
                "DefaultTargetCapacityType": "capacity-block" if block else "on-demand",
            },
            "TagSpecifications": [
                {"ResourceType": "instance",
                 "Tags": sorted([*tags, {"Key": TAG_TEMPLATE, "Value": copy or ""}],
                                key=lambda t: t["Key"])},
                {"ResourceType": "volume",
                 "Tags": _merged_tags(template_volume_tags or {}, tags)},
                {"ResourceType": "fleet", "Tags": tags},
            ],
        }
        if not block:
            # OnDemandOptions (MinTargetCapacity) govern on-demand capacity only: a Capacity
            # Block fleet fills what it can, and launch() counts and rolls back itself.
            fleet["OnDemandOptions"] = on_demand
        return fleet

    def _fleet_failure(
        self, request: AcquireRequest, got: int, errors: Sequence[Mapping[str, Any]]
    ) -> ProviderError:
        codes = [str(e.get("ErrorCode", "")) for e in errors]
        detail = "; ".join(
            f"{e.get('ErrorCode', '?')}: {e.get('ErrorMessage', '')}" for e in errors
        ) or "no error given"
        message = (
            f"acquire {request.key}: EC2 Fleet launched {got} of {request.count} instances "
            f"({detail}); everything launched was terminated"
        )
        return _error_for_codes(codes, message, available=got)

    # ---- bootstrap --------------------------------------------------------------------

    async def _merged_template_data(
        self, ec2: Any, params: AwsPoolParameters
    ) -> dict[str, Any]:
        """The launch template's data with Muster's NodeConfig merged into its user data
        (``bootstrap: nodeadm``) and the reservation targeted (``capacityReservation``)
        (read-only; cached :data:`BOOTSTRAP_CACHE_SECONDS`);
        :class:`ProviderConfigError` when the user data cannot carry it."""
        source = _source_template(params)
        reservation = (params.capacity_reservation.model_dump(by_alias=True)
                       if params.capacity_reservation is not None else None)
        cache_key = (params.region, json.dumps([source, params.bootstrap, reservation],
                                               sort_keys=True))
        loop = asyncio.get_running_loop()
        cached = self._bootstrap_cache.get(cache_key)
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        spec = {k: v for k, v in source.items() if k != "Version"}
        response = await self._calls.call(
            ec2.describe_launch_template_versions, what="DescribeLaunchTemplateVersions",
            Versions=[params.launch_template.version], **spec,
        )
        versions = response.get("LaunchTemplateVersions") or []
        if not versions:
            raise ProviderConfigError(
                f"spec.parameters.launchTemplate: version {params.launch_template.version} of "
                f"{_template_text(params)} not found"
            )
        data = dict(versions[0].get("LaunchTemplateData") or {})
        _check_network_interfaces(params, data)
        if params.capacity_reservation is not None:
            data.update(_reservation_template_data(params.capacity_reservation))
        if params.bootstrap != "nodeadm":
            self._bootstrap_cache[cache_key] = (loop.time() + BOOTSTRAP_CACHE_SECONDS, data)
            return data
        try:
            user_data = base64.b64decode(data.get("UserData") or "").decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ProviderConfigError(
                f"spec.parameters.launchTemplate: the user data of {_template_text(params)} is "
                "not base64 text"
            ) from None
        try:
            merged = merge_nodeadm(user_data)
        except BootstrapError as exc:
            raise ProviderConfigError(
                f"spec.parameters.launchTemplate: {exc} (or set spec.parameters.bootstrap: "
                "asIs when the template registers nodes behind "
                "muster.dev/unregistered:NoExecute itself)"
            ) from None
        data["UserData"] = base64.b64encode(merged.encode()).decode()
        self._bootstrap_cache[cache_key] = (loop.time() + BOOTSTRAP_CACHE_SECONDS, data)
        return data

    async def _launch_template(
        self, ec2: Any, params: AwsPoolParameters, pool: str
    ) -> tuple[dict[str, Any], str | None, dict[str, str] | None]:
        """The launch template the fleet uses, the name of Muster's copy (None for the
        pool's own) and the template's own volume tags (None when it was not read): the
        pool's own (``bootstrap: asIs`` and no reservation), else Muster's copy of it with
        the merged user data and the reservation's targeting, named by its content (created
        once; a copy of the same content is reused). CreateFleet overrides cannot name a
        reservation (the EC2 model has no CapacityReservationSpecification there), so the
        template carries it. The copy is marked in use (the caller unmarks it once the fleet
        answered)."""
        if params.bootstrap == "asIs" and params.capacity_reservation is None:
            return _source_template(params), None, None
        data = dict(await self._merged_template_data(ec2, params))
        volume_tags = {
            t["Key"]: t.get("Value", "")
            for spec in data.get("TagSpecifications") or []
            if spec.get("ResourceType") == "volume"
            for t in spec.get("Tags") or []
        }
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
        name = f"muster-{pool[:80]}-{digest}"
        tags = [{"Key": TAG_CLUSTER, "Value": self.settings.cluster_name},
                {"Key": TAG_POOL, "Value": pool}]
        async with self._template_lock:
            await self._calls.call(
                ec2.create_launch_template, what="CreateLaunchTemplate",
                expect={"InvalidLaunchTemplateName.AlreadyExistsException"},
                LaunchTemplateName=name, LaunchTemplateData=data,
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
            )
            self._templates_in_use[(params.region, name)] += 1
        return {"LaunchTemplateName": name, "Version": "1"}, name, volume_tags

    async def _sweep_due(self, region: str | None) -> None:
        """The bounded sweep: every ``template_sweep_seconds`` per region, from a listing
        (the collector lists every pool periodically), over all of the cluster's copies
        there, those of deleted pools and of a pool's former content included."""
        now = asyncio.get_running_loop().time()
        last = self._last_sweep.get(region)
        if last is not None and now - last < self.settings.template_sweep_seconds:
            return
        self._last_sweep[region] = now
        await self._sweep_templates(await self._client(region), region, None)

    async def _sweep_templates(self, ec2: Any, region: str | None, pool: str | None) -> int:
        """Delete Muster's launch-template copies (of ``pool``, or of every pool of the
        cluster) that no live instance was launched from and no launch in flight uses; an
        instance without the :data:`TAG_TEMPLATE` tag (launched by an older version) keeps
        every copy of its pool. Never fails the caller: what is left is swept later."""
        try:
            return await self._sweep(ec2, region, pool)
        except ProviderError as exc:
            log.info("launch template copies not swept now (%s): %s", pool or "cluster", exc)
            return 0

    async def _sweep(self, ec2: Any, region: str | None, pool: str | None) -> int:
        filters = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.settings.cluster_name]}]
        if pool is not None:
            filters.append({"Name": f"tag:{TAG_POOL}", "Values": [pool]})

        def pages() -> list[dict[str, Any]]:
            paginator = ec2.get_paginator("describe_launch_templates")
            return [t for page in paginator.paginate(Filters=filters)
                    for t in page.get("LaunchTemplates", []) or []]

        copies = [t for t in await self._calls.call(pages, what="DescribeLaunchTemplates")
                  if str(t.get("LaunchTemplateName", "")).startswith("muster-")]
        if not copies:
            return 0
        live = await self._describe(ec2, Filters=[
            *filters, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])
        assert not isinstance(live, ExpectedCode)
        used: set[str] = set()
        untracked: set[str] = set()
        for instance in live:
            tags = _tags_dict(instance)
            if TAG_TEMPLATE in tags:
                used.add(tags[TAG_TEMPLATE])
            else:
                untracked.add(tags.get(TAG_POOL, ""))
        deleted = 0
        async with self._template_lock:
            for copy in copies:
                name = str(copy["LaunchTemplateName"])
                owner = _tags_dict(copy).get(TAG_POOL, "")
                if name in used or owner in untracked or (region, name) in self._templates_in_use:
                    continue
                await self._calls.call(
                    ec2.delete_launch_template, what="DeleteLaunchTemplate",
                    expect=TEMPLATE_GONE_CODES,
                    LaunchTemplateName=name,
                )
                deleted += 1
        if deleted:
            log.info("deleted %d unused launch template cop%s of %s", deleted,
                     "y" if deleted == 1 else "ies", f"pool {pool}" if pool else "the cluster")
        return deleted

    # ---- reservations -----------------------------------------------------------------

    def _reserved_zone(self, params: AwsPoolParameters) -> str | None:
        cr = params.capacity_reservation
        if cr is None or cr.id is None:
            return None
        known = self._reservation_cache.get((params.region, cr.id))
        return None if known is None else str(known.get("AvailabilityZone") or "") or None

    async def _reservation(self, ec2: Any, params: AwsPoolParameters) -> dict[str, Any]:
        cr = params.capacity_reservation
        assert cr is not None and cr.id is not None
        response = await self._calls.call(
            ec2.describe_capacity_reservations, what="DescribeCapacityReservations",
            CapacityReservationIds=[cr.id],
        )
        found = response.get("CapacityReservations") or []
        if not found:
            raise ProviderConfigError(
                f"spec.parameters.capacityReservation: {cr.id} not found in region "
                f"{params.region or 'default'}"
            )
        reservation = dict(found[0])
        self._reservation_cache[(params.region, cr.id)] = reservation
        return reservation

    @staticmethod
    def _check_reservation(params: AwsPoolParameters, found: Mapping[str, Any]) -> None:
        cr = params.capacity_reservation
        assert cr is not None
        zone = found.get("AvailabilityZone")
        if zone not in params.subnets:
            raise ProviderConfigError(
                f"spec.parameters.capacityReservation: {cr.id} is in zone {zone}, where "
                f"spec.parameters.subnets has no subnet ({sorted(params.subnets)})"
            )
        if found.get("InstanceType") != params.instance_type:
            raise ProviderConfigError(
                f"spec.parameters.capacityReservation: {cr.id} reserves "
                f"{found.get('InstanceType')}, not {params.instance_type}"
            )
        kind = found.get("ReservationType", "default")
        if kind != cr.type:
            raise ProviderConfigError(
                f"spec.parameters.capacityReservation: {cr.id} is a {kind} reservation, not "
                f"{cr.type}"
            )

    # ---- cloud calls ------------------------------------------------------------------

    async def _client(self, region: str | None) -> Any:
        async with self._client_lock:
            client = self._clients.get(region)
            if client is None:
                client = await self._calls.once(self._factory, region, what="create EC2 client")
                self._clients[region] = client
            return client

    async def _describe(
        self, ec2: Any, *, expect: Collection[str] = (), **kwargs: Any
    ) -> Instances | ExpectedCode:
        def pages() -> Instances:
            paginator = ec2.get_paginator("describe_instances")
            return [
                instance
                for page in paginator.paginate(**kwargs)
                for reservation in page.get("Reservations", [])
                for instance in reservation.get("Instances", [])
            ]

        result: Instances | ExpectedCode = await self._calls.call(
            pages, what="DescribeInstances", expect=expect
        )
        return result

    async def _describe_by_tags(
        self, ec2: Any, pool: str, *, key: str | None
    ) -> Instances:
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.settings.cluster_name]},
            {"Name": f"tag:{TAG_POOL}", "Values": [pool]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        if key is not None:
            filters.insert(2, {"Name": f"tag:{TAG_KEY}", "Values": [key]})
        instances = await self._describe(ec2, Filters=filters)
        assert not isinstance(instances, ExpectedCode)
        # Filtering is the server's job, but a terminated instance must never be adopted.
        return [i for i in instances if i.get("State", {}).get("Name") not in GONE_STATES]

    async def _describe_launched(
        self, ec2: Any, params: AwsPoolParameters, ids: Sequence[str]
    ) -> Instances:
        """Describe fresh instances, waiting out EC2's eventual consistency: they may be
        unknown (``InvalidInstanceID.NotFound``) or lack a private DNS name at first."""
        instances: Instances = []
        for attempt in range(1, self.settings.describe_attempts + 1):
            found = await self._describe(
                ec2, expect={"InvalidInstanceID.NotFound"}, InstanceIds=list(ids)
            )
            instances = [] if isinstance(found, ExpectedCode) else found
            named = all(
                i.get("PrivateDnsName") or params.node_name_from == "instanceId"
                for i in instances
            )
            if len(instances) == len(ids) and named:
                return instances
            if attempt < self.settings.describe_attempts:
                await asyncio.sleep(self.settings.describe_interval_seconds)
        if len(instances) == len(ids):
            unnamed = [i["InstanceId"] for i in instances if not i.get("PrivateDnsName")]
            raise TransientProviderError(
                f"instances {unnamed} have no private DNS name yet; acquire again with the "
                "same key to pick them up"
            )
        raise TransientProviderError(
            f"only {len(instances)} of {len(ids)} launched instances are visible yet; "
            "acquire again with the same key to pick them up"
        )

    async def _tag_interfaces(
        self, ec2: Any, params: AwsPoolParameters, request: AcquireRequest,
        instances: Sequence[Instance],
    ) -> None:
        """Tag the instances' network interfaces (the EFA ones included) like the
        instances. CreateFleet cannot tag them at launch (only a launch template can, and
        the pool's own template is used as it is), so they are tagged once the instances are
        described, launched or adopted (after a crash between the launch and this call).
        Never fails the acquisition: the instances carry the tags Muster finds them by, and what
        is missing here is an audit gap, said loudly."""
        interfaces = sorted({
            str(nic["NetworkInterfaceId"])
            for instance in instances
            for nic in instance.get("NetworkInterfaces") or []
            if nic.get("NetworkInterfaceId")
        })
        tags = self._tags(params, request)
        for start in range(0, len(interfaces), _TAG_CHUNK):
            try:
                await self._calls.call(
                    ec2.create_tags, what="CreateTags (network interfaces)",
                    Resources=interfaces[start : start + _TAG_CHUNK], Tags=tags,
                )
            except ProviderError as exc:
                log.warning("acquire %s: network interfaces of its instances not tagged "
                            "(ec2:CreateTags on network-interface/*): %s", request.key, exc)
                return

    async def _terminate(self, ec2: Any, ids: Sequence[str], *, what: str) -> None:
        for start in range(0, len(ids), _TERMINATE_CHUNK):
            chunk = list(ids[start : start + _TERMINATE_CHUNK])
            result = await self._calls.call(
                ec2.terminate_instances,
                what=f"{what}: TerminateInstances",
                expect={"InvalidInstanceID.NotFound"},
                InstanceIds=chunk,
            )
            if isinstance(result, ExpectedCode):
                # One unknown id fails the whole call: retry with the ids EC2 still knows.
                known = await self._describe_known(ec2, chunk)
                if known:
                    await self._calls.call(ec2.terminate_instances,
                                     what=f"{what}: TerminateInstances", InstanceIds=known)

    async def _describe_known(self, ec2: Any, ids: Sequence[str]) -> Ids:
        known: Ids = []
        for instance_id in ids:
            found = await self._describe(
                ec2, expect={"InvalidInstanceID.NotFound"}, InstanceIds=[instance_id]
            )
            if isinstance(found, ExpectedCode):
                continue
            known.extend(
                i["InstanceId"] for i in found if i["State"]["Name"] not in GONE_STATES
            )
        return known

    async def _ensure_placement_group(
        self, ec2: Any, params: AwsPoolParameters, request: AcquireRequest
    ) -> str | None:
        group = params.placement_group
        if group is None:
            return None
        if not group.per_acquisition:
            return group.name
        name = aws_placement_group_name(request.key)
        # A duplicate is ours: same key, same name, from an earlier try of this attempt.
        await self._calls.call(
            ec2.create_placement_group,
            what="CreatePlacementGroup",
            expect={"InvalidPlacementGroup.Duplicate"},
            GroupName=name,
            Strategy=group.strategy,
            TagSpecifications=[
                {"ResourceType": "placement-group", "Tags": self._tags(params, request)}
            ],
        )
        return name

    async def _delete_placement_group(self, ec2: Any, name: str) -> None:
        """Delete a group once its instances are gone (EC2 refuses while they terminate)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.placement_group_delete_timeout_seconds
        while True:
            result = await self._calls.call(
                ec2.delete_placement_group,
                what="DeletePlacementGroup",
                expect={"InvalidPlacementGroup.Unknown", "InvalidPlacementGroup.InUse"},
                GroupName=name,
            )
            if not isinstance(result, ExpectedCode) or result.code.endswith("Unknown"):
                return
            if loop.time() >= deadline:
                raise TransientProviderError(
                    f"placement group {name} still in use after "
                    f"{self.settings.placement_group_delete_timeout_seconds:.0f}s; "
                    "release again later"
                )
            await asyncio.sleep(self.settings.placement_group_poll_seconds)

    async def _topology(self, ec2: Any, ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """Network-node labels per instance; empty when unsupported or not yet known."""
        labels: dict[str, dict[str, str]] = {}
        for start in range(0, len(ids), _TOPOLOGY_CHUNK):
            chunk = list(ids[start : start + _TOPOLOGY_CHUNK])
            try:
                response = await self._calls.call(
                    ec2.describe_instance_topology, what="DescribeInstanceTopology",
                    InstanceIds=chunk,
                )
            except (ProviderError, NotImplementedError) as exc:
                # Older instance types, missing permission or an emulator: labels are a
                # bonus for the fit engine, never a reason to fail an acquisition.
                log.info("DescribeInstanceTopology unavailable: %s", exc)
                return labels
            for entry in response.get("Instances", []) or []:
                nodes = entry.get("NetworkNodes") or []
                labels[entry["InstanceId"]] = {
                    f"{TOPOLOGY_LABEL_PREFIX}{level}": node
                    for level, node in enumerate(nodes, start=1)
                }
        return labels

    # ---- results ----------------------------------------------------------------------

    async def _nodes(
        self,
        ec2: Any,
        params: AwsPoolParameters,
        request: AcquireRequest,
        instances: Sequence[Mapping[str, Any]],
    ) -> Nodes:
        topology: dict[str, dict[str, str]] = {}
        if params.record_network_topology:
            topology = await self._topology(ec2, [i["InstanceId"] for i in instances])
        nodes = []
        for instance in instances:
            # What EC2 reports (zone, network node layers), never the planned domain: Muster
            # compares the registered Node's labels with the plan (a node elsewhere fails
            # the acquisition) instead of asserting the plan here.
            extra = dict(topology.get(instance["InstanceId"], {}))
            nodes.append(self._node(params, request.pool.metadata.name, instance, extra))
        return sorted(nodes, key=lambda n: n.name)

    def _node(
        self,
        params: AwsPoolParameters,
        pool: str,
        instance: Mapping[str, Any],
        extra_labels: Mapping[str, str],
    ) -> ProvidedNode:
        tags = _tags_dict(instance)
        instance_id = instance["InstanceId"]
        zone = instance.get("Placement", {}).get("AvailabilityZone", "")
        name = instance_id
        if params.node_name_from == "privateDnsName" and instance.get("PrivateDnsName"):
            name = instance["PrivateDnsName"]
        labels = {params.zone_label: zone, INSTANCE_TYPE_LABEL: instance.get("InstanceType", "")}
        labels.update(extra_labels)
        return ProvidedNode(
            name=name,
            provider_id=f"aws:///{zone}/{instance_id}",
            pool=pool,
            key=tags.get(TAG_KEY, ""),
            owner=tags.get(TAG_OWNER, ""),
            owner_uid=tags.get(TAG_OWNER_UID, ""),
            labels=labels,
        )


def _fee(offer: Mapping[str, Any]) -> Decimal:
    try:
        return Decimal(str(offer.get("UpfrontFee")))
    except InvalidOperation:
        return Decimal("Infinity")  # an unreadable fee is never under the limit


def _figures(found: Mapping[str, Any]) -> ReservationFigures:
    total = int(found.get("TotalInstanceCount") or 0)
    return ReservationFigures(
        id=str(found.get("CapacityReservationId", "")),
        zone=str(found.get("AvailabilityZone", "")),
        reserved=total,
        free=min(total, int(found.get("AvailableInstanceCount") or 0)),
        state=str(found.get("State", "")),
        start=found.get("StartDate"),
        end=found.get("EndDate"),
    )


def _reservation_template_data(cr: CapacityReservationParams) -> dict[str, Any]:
    """Launch-template data that sends instances into the reservation and nowhere else."""
    target: dict[str, str] = (
        {"CapacityReservationId": cr.id} if cr.id is not None
        else {"CapacityReservationResourceGroupArn": str(cr.resource_group_arn)}
    )
    data: dict[str, Any] = {"CapacityReservationSpecification": {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": target,
    }}
    if cr.type == "capacity-block":
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return data


def _check_network_interfaces(params: AwsPoolParameters, data: Mapping[str, Any]) -> None:
    """What EC2 would refuse at launch in a template with network interfaces (EFA on P5,
    P4d, Trn): the fleet's override puts the instances in the pool's subnet of the zone it
    picks, so an interface naming another subnet (or any, when the pool spans zones)
    conflicts; instance-level security groups cannot go with interfaces (each interface
    lists its own ``Groups``, the EFA one included); EFA-only interfaces cannot be the
    primary one (device 0 of card 0)."""
    nics = data.get("NetworkInterfaces") or []
    if not nics:
        return
    where = f"spec.parameters.launchTemplate: {_template_text(params)}"
    if data.get("SecurityGroupIds") or data.get("SecurityGroups"):
        raise ProviderConfigError(
            f"{where} sets security groups on the instance and network interfaces: EC2 "
            "refuses both; list the groups in each interface's Groups")
    subnets = set(params.subnets.values())
    for k, nic in enumerate(nics):
        subnet = nic.get("SubnetId")
        if subnet is not None and (subnet not in subnets or len(subnets) > 1):
            raise ProviderConfigError(
                f"{where}: NetworkInterfaces[{k}] names subnet {subnet}; Muster's fleet "
                "launches into the pool's subnet of the zone it uses (spec.parameters."
                "subnets), so leave SubnetId out of the template's interfaces")
        primary = int(nic.get("DeviceIndex", 0)) == 0 and int(nic.get("NetworkCardIndex", 0)) == 0
        if primary and nic.get("InterfaceType") == "efa-only":
            raise ProviderConfigError(
                f"{where}: NetworkInterfaces[{k}] is the primary interface (card 0, device 0) "
                "and efa-only; it must be an ENA or efa interface")


def _merged_tags(base: Mapping[str, str], tags: TagList) -> TagList:
    """``base`` with ``tags`` over it (``tags`` wins a key both name), sorted by key."""
    merged = dict(base)
    merged.update({t["Key"]: t["Value"] for t in tags})
    return [{"Key": k, "Value": v} for k, v in sorted(merged.items())]


def _source_template(params: AwsPoolParameters) -> dict[str, Any]:
    """The pool's launch template as a LaunchTemplateSpecification."""
    template: dict[str, Any] = {"Version": params.launch_template.version}
    if params.launch_template.id is not None:
        template["LaunchTemplateId"] = params.launch_template.id
    else:
        template["LaunchTemplateName"] = params.launch_template.name
    return template


def _template_text(params: AwsPoolParameters) -> str:
    return f"launch template {params.launch_template.id or params.launch_template.name}"


def make_aws_provider(
    settings: AwsProviderSettings | None = None,
    *,
    client_factory: ClientFactory | None = None,
) -> AwsProvider:
    """Factory for the provider registry: settings from ``MUSTER_AWS_*`` when omitted."""
    return AwsProvider(settings, client_factory=client_factory)
