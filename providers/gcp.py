"""GCP Compute Engine provider: N VMs all or nothing with one zonal bulkInsert.

The adapter of the all-or-nothing skeleton (:mod:`providers.atomic`, which adopts by key,
recounts and compensates) over Compute Engine:

* **launch**: ``instances.bulkInsert`` with ``count = minCount = N``: Compute creates N VMs
  or rolls back. ``requestId`` is a UUID5 of the acquisition key, so a repeated call joins
  the original operation. The operation is awaited, then the VMs under the key are listed.
* **find / delete**: VMs carry labels ``muster-pool``, ``muster-key``, ``muster-cluster``
  (values made label-safe) and the exact key and owner in metadata; they are found with a
  label filter and deleted with the per-acquisition placement policy.

The google-cloud-compute client is synchronous: calls run in worker threads, at most
``max_concurrency`` at a time. Operations are awaited with our own
``ZoneOperationsClient``/``RegionOperationsClient`` built with the same endpoint,
credentials and transport, never through ``ExtendedOperation.result()`` (whose internal
client ignores ``client_options``).

**Flex-start** (a pool with ``flexStart.instanceGroupManager``): the gang is asked of the
pool's zonal MIG by one resize request per key, naming its VMs (``instances``, the names the
key's bulkInsert would have: ``<pool>-<hash of key>-0001``...), so the VMs the MIG creates
once Compute grants it are the key's by name. They carry the MIG template's labels, not
Muster's: they are found with ``instanceGroupManagers.listManagedInstances`` (the key's
names; for a pool listing, the names of every key whose resize request, found with
``resizeRequests.list``, Muster made: its description holds the owner and key), read with
``instances.get``, and deleted with ``instanceGroupManagers.deleteInstances`` (a plain
instance delete would be refilled by the MIG), the key's resize request with them.

Credentials come only from Application Default Credentials (GKE Workload Identity, the
metadata server, ``GOOGLE_APPLICATION_CREDENTIALS``); never from a CapacityPool.
Nodes are assumed to register under their instance name (GCE's kubelet default).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from controller.api.capacitypool import CapacityPool
from controller.common.topology_defaults import UNREGISTERED_TAINT
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
from providers.common import (
    INSTANCE_TYPE_LABEL,
    CloudProviderSettings,
    PoolParameters,
    ReservationFigures,
    parse_pool_parameters,
)
from providers.naming import (
    GCP_LABEL_VALUE,
    gcp_label_value,
    gcp_name_prefix,
    gcp_policy_name,
    gcp_request_id,
)
from providers.retry import CloudCalls

log = logging.getLogger(__name__)

LABEL_POOL = "muster-pool"
LABEL_KEY = "muster-key"
LABEL_CLUSTER = "muster-cluster"
META_KEY = "muster-key"
META_OWNER = "muster-owner"
META_OWNER_UID = "muster-owner-uid"
META_POOL = "muster-pool"
RESERVED_PREFIX = "muster-"
META_STARTUP_TAINT = "muster-register-with-taints"
"""Instance metadata naming Muster's startup taint as kubelet's ``--register-with-taints``
takes it; a startup script passes it on (``curl .../attributes/muster-register-with-taints``).
A ``kube-env`` (the GCE configure-helper's settings) gets it in ``NODE_TAINTS`` instead,
so the stock bootstrap applies it without the user adding anything."""
STARTUP_TAINT_VALUE = f"{UNREGISTERED_TAINT}=:NoExecute"
TOPOLOGY_LABELS = {
    "block": "cloud.google.com/gce-topology-block",
    "subblock": "cloud.google.com/gce-topology-subblock",
    "host": "cloud.google.com/gce-topology-host",
}
"""The labels GKE derives from an instance's ``resourceStatus.physicalHostTopology``."""

CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "INSUFFICIENT_CAPACITY",
    "insufficientCapacity",
    "resourcePoolExhausted",
    "zoneResourcePoolExhausted",
})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "limitExceeded"})
THROTTLE_CODES = frozenset({
    "RATE_LIMIT_EXCEEDED",
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "backendError",
    "internalError",
    "INTERNAL_ERROR",
    "SERVICE_UNAVAILABLE",
})

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class Accelerator(PoolParameters):
    type: str = Field(min_length=1, description="Accelerator type, e.g. nvidia-h100-80gb.")
    count: int = Field(ge=1)


class ServiceAccountParams(PoolParameters):
    email: str = Field(min_length=3)
    scopes: list[str] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"]
    )


RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"
"""The reservationAffinity key that targets a specific reservation by name."""


class ReservationParams(PoolParameters):
    consume: Literal["ANY_RESERVATION", "NO_RESERVATION", "SPECIFIC_RESERVATION"] = (
        "ANY_RESERVATION"
    )
    key: str | None = None
    values: list[str] = Field(default_factory=list)
    name: str | None = Field(
        default=None,
        pattern=r"^([a-z][-a-z0-9]{0,61}[a-z0-9]|projects/[a-z][a-z0-9-]{4,28}[a-z0-9]"
        r"/reservations/[a-z][-a-z0-9]{0,61}[a-z0-9])$",
        description="A specific reservation (in the pool's project, or "
        "projects/P/reservations/R shared from another): instances consume only it "
        "(SPECIFIC_RESERVATION) and fail rather than run outside it",
    )
    block: str | None = Field(
        default=None,
        pattern=r"^[a-z][-a-z0-9]{0,61}[a-z0-9]$",
        description="A block of that reservation: the whole gang lands in it",
    )

    @model_validator(mode="after")
    def _named(self) -> ReservationParams:
        if self.block is not None and self.name is None:
            raise ValueError("block needs the reservation's name")
        if self.name is not None:
            if self.key is not None or self.values:
                raise ValueError("set either name (and block) or key and values")
            if "consume" in self.model_fields_set and self.consume != "SPECIFIC_RESERVATION":
                raise ValueError("a named reservation is consumed as SPECIFIC_RESERVATION")
        return self

    def affinity(self) -> tuple[str, str | None, list[str]]:
        """(consume type, key, values) of the instances' reservationAffinity."""
        if self.name is None:
            return self.consume, self.key, list(self.values)
        target = self.name if self.block is None else f"{self.name}/reservationBlocks/{self.block}"
        return "SPECIFIC_RESERVATION", RESERVATION_NAME_KEY, [target]


class FlexStartParams(PoolParameters):
    """Queued provisioning (Dynamic Workload Scheduler flex-start): gangs are asked of an
    existing managed instance group (its instance template FLEX_START) by resize request,
    all or nothing, and wait in Compute's queue instead of failing on a stock-out."""

    instance_group_manager: str = Field(
        alias="instanceGroupManager", pattern=r"^[a-z][-a-z0-9]{0,61}[a-z0-9]$",
        description="The zonal managed instance group (in the pool's zone) resized.",
    )


NIC_TYPES = ("GVNIC", "IDPF", "IRDMA", "MRDMA", "VIRTIO_NET")
"""Compute's ``NetworkInterface.nicType`` values (its API's enum, as google-cloud-compute
carries it, without the undefined/unspecified markers)."""
RDMA_NIC_TYPES = frozenset({"IRDMA", "MRDMA"})
MAX_NETWORK_INTERFACES = 10
"""Compute's most per VM (A3 Ultra and A4: two gVNIC plus eight RDMA NICs)."""
_SUBNET_REGION = re.compile(r"(?:^|/)regions/([a-z]+-[a-z]+[0-9]+)/subnetworks/")


class NetworkInterfaceParams(PoolParameters):
    """One network interface of the VM (A3/A4 GPU VMs: one per GPU NIC, each in a VPC of
    its own)."""

    network: str | None = Field(default=None, min_length=1)
    subnetwork: str | None = Field(default=None, min_length=1)
    nic_type: Literal["GVNIC", "IDPF", "IRDMA", "MRDMA", "VIRTIO_NET"] | None = Field(
        default=None, alias="nicType",
        description="GVNIC for the host and GPUDirect-TCPX(O) NICs, MRDMA for the RDMA NICs "
        "of A3 Ultra and A4",
    )
    queue_count: int | None = Field(default=None, alias="queueCount", ge=1)

    @model_validator(mode="after")
    def _somewhere(self) -> NetworkInterfaceParams:
        if self.network is None and self.subnetwork is None:
            raise ValueError("set network or subnetwork")
        return self


class GcpPoolParameters(PoolParameters):
    """``spec.parameters`` of a CapacityPool with ``provider: gcp``."""

    project: str = Field(pattern=r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
    zone: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
    machine_type: str = Field(alias="machineType", pattern=r"^[a-z0-9-]+$")
    accelerators: list[Accelerator] = Field(
        default_factory=list,
        description="Only for machine types without built-in GPUs (A3/A4 have them).",
    )
    image: str = Field(
        min_length=1,
        description="Boot image, e.g. projects/cos-cloud/global/images/family/cos-stable",
    )
    boot_disk_size_gb: int = Field(default=200, alias="bootDiskSizeGb", ge=10)
    boot_disk_type: str | None = Field(default=None, alias="bootDiskType")
    network: str | None = None
    subnetwork: str | None = None
    network_interfaces: list[NetworkInterfaceParams] = Field(
        default_factory=list, alias="networkInterfaces", max_length=MAX_NETWORK_INTERFACES,
        description="Every network interface of the VM, in order (the first carries its "
        "primary IP); instead of network/subnetwork. GPU VMs with several NICs (A3 Mega: "
        "nine gVNIC; A3 Ultra, A4: two gVNIC then eight MRDMA) list them all",
    )
    network_tags: list[str] = Field(default_factory=list, alias="networkTags")
    metadata: dict[str, str] = Field(
        default_factory=dict, description="Instance metadata, e.g. the kubelet bootstrap script."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    service_account: ServiceAccountParams | None = Field(default=None, alias="serviceAccount")
    compact_placement: bool = Field(
        default=False,
        alias="compactPlacement",
        description="Create a COLLOCATED placement policy per acquisition, deleted on release.",
    )
    provisioning_model: Literal["STANDARD", "SPOT"] = Field(
        default="STANDARD", alias="provisioningModel"
    )
    reservation: ReservationParams | None = None
    flex_start: FlexStartParams | None = Field(default=None, alias="flexStart")
    zone_label: str = Field(default="topology.kubernetes.io/zone", alias="zoneLabel")

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            if key.startswith(RESERVED_PREFIX):
                raise ValueError(f"label {key!r} uses the reserved prefix {RESERVED_PREFIX!r}")
            if not _LABEL_KEY.match(key) or not GCP_LABEL_VALUE.match(label_value):
                raise ValueError(
                    f"label {key}={label_value!r}: keys start with a lowercase letter; keys "
                    "and values use lowercase letters, digits, '-' and '_' (<= 63)"
                )
        return value

    @model_validator(mode="after")
    def _one_way_to_the_network(self) -> GcpPoolParameters:
        nics = self.network_interfaces
        if not nics:
            return self
        if self.network is not None or self.subnetwork is not None:
            raise ValueError("set networkInterfaces or network/subnetwork, not both")
        if nics[0].nic_type in RDMA_NIC_TYPES:
            raise ValueError("networkInterfaces[0] carries the VM's primary IP and cannot be "
                             f"an RDMA NIC ({nics[0].nic_type}); list the gVNIC ones first")
        for k, nic in enumerate(nics):
            found = _SUBNET_REGION.search(nic.subnetwork or "")
            if found and found.group(1) != self.region:
                raise ValueError(f"networkInterfaces[{k}].subnetwork is in region "
                                 f"{found.group(1)}, not the pool's {self.region}")
        return self

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.startswith(RESERVED_PREFIX):
                raise ValueError(f"metadata key {key!r} uses the reserved prefix")
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", key):
                raise ValueError(f"metadata key {key!r} must match [a-zA-Z0-9_-]{{1,128}}")
        return value


def parse_parameters(pool: CapacityPool) -> GcpPoolParameters:
    """The pool's parameters, or :class:`ProviderConfigError` naming the bad field."""
    return parse_pool_parameters(GcpPoolParameters, pool)


class GcpProviderSettings(CloudProviderSettings):
    """Process-wide settings (environment ``MUSTER_GCP_*``); credentials are not settings."""

    model_config = SettingsConfigDict(env_prefix="MUSTER_GCP_", extra="ignore")

    api_endpoint: str | None = None
    """Custom Compute endpoint (Private Service Connect, or a local fake in tests)."""
    cluster_name: str = Field(default="muster", min_length=1)
    operation_timeout_seconds: float = Field(default=900.0, gt=0)
    """How long to wait for a bulkInsert/delete operation before reporting it transient."""
    request_timeout_seconds: float = Field(default=60.0, gt=0)
    """Per HTTP call; a hung call would otherwise hold a worker thread forever."""
    wait_timeout_seconds: float = Field(default=150.0, gt=0)
    """Per ``operations.wait`` call (the server answers within about two minutes)."""
    policy_delete_attempts: int = Field(default=10, ge=1)
    policy_delete_interval_seconds: float = Field(default=5.0, ge=0)


@dataclass(frozen=True, slots=True)
class GcpClients:
    """Every client the provider uses, all with the same endpoint/credentials/transport."""

    instances: Any
    zone_operations: Any
    resource_policies: Any
    region_operations: Any
    reservations: Any = None
    reservation_blocks: Any = None
    resize_requests: Any = None
    instance_group_managers: Any = None

    @classmethod
    def create(
        cls,
        *,
        api_endpoint: str | None = None,
        credentials: Any = None,
        transport: str = "rest",
    ) -> GcpClients:
        """``credentials=None`` means Application Default Credentials."""
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        options = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None
        kwargs: dict[str, Any] = {"transport": transport, "client_options": options}
        if credentials is not None:
            kwargs["credentials"] = credentials
        return cls(
            instances=compute_v1.InstancesClient(**kwargs),
            zone_operations=compute_v1.ZoneOperationsClient(**kwargs),
            resource_policies=compute_v1.ResourcePoliciesClient(**kwargs),
            region_operations=compute_v1.RegionOperationsClient(**kwargs),
            reservations=compute_v1.ReservationsClient(**kwargs),
            reservation_blocks=compute_v1.ReservationBlocksClient(**kwargs),
            resize_requests=compute_v1.InstanceGroupManagerResizeRequestsClient(**kwargs),
            instance_group_managers=compute_v1.InstanceGroupManagersClient(**kwargs),
        )


ClientsFactory = Callable[[], GcpClients]


def _reasons(exc: BaseException) -> list[str]:
    reasons = []
    for item in getattr(exc, "errors", None) or []:
        if isinstance(item, Mapping) and item.get("reason"):
            reasons.append(str(item["reason"]))
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        reasons.append(reason)
    return reasons


def _status(exc: BaseException) -> int:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else 0


def is_transient(exc: BaseException) -> bool:
    """Rate limits, 5xx (except a capacity 503) and connection trouble."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = _reasons(exc)
        if any(r in CAPACITY_CODES or r in QUOTA_CODES for r in reasons):
            return False
        return any(r in THROTTLE_CODES for r in reasons) or _status(exc) in (429,) or (
            _status(exc) >= 500
        )
    import requests

    return isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError)


def map_error(exc: BaseException, what: str) -> ProviderError:
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, gexc.GoogleAPICallError):
        return _error_for_codes(_reasons(exc), f"{what}: {exc}", status=_status(exc))
    if isinstance(exc, auth_exc.DefaultCredentialsError | auth_exc.RefreshError):
        return ProviderConfigError(
            f"{what}: {exc} (credentials come from Workload Identity or Application Default "
            "Credentials)"
        )
    if is_transient(exc):
        return TransientProviderError(f"{what}: {exc}")
    return TransientProviderError(f"{what}: unexpected {type(exc).__name__}: {exc}")


def _error_for_codes(
    codes: Iterable[str], message: str, *, status: int = 0, available: int | None = None
) -> ProviderError:
    found = [c for c in codes if c]
    if any(c in QUOTA_CODES for c in found):
        return QuotaExceeded(message)
    if any(c in CAPACITY_CODES or "RESOURCE_POOL_EXHAUSTED" in c for c in found):
        return CapacityUnavailable(message, available=available)
    if any(c in THROTTLE_CODES for c in found) or status == 429 or status >= 500:
        return TransientProviderError(message)
    return ProviderConfigError(message)


@dataclass(frozen=True, slots=True)
class ExpectedStatus:
    """An HTTP status the caller asked to handle itself (``expect`` of ``CloudCalls.call``)."""

    status: int
    message: str


def _expected(exc: BaseException, expect: Collection[int]) -> ExpectedStatus | None:
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.GoogleAPICallError) and _status(exc) in expect:
        return ExpectedStatus(_status(exc), str(exc))
    return None


Instances = list[Any]
Nodes = list[ProvidedNode]

MIN_RUN_SECONDS = 600
MAX_RUN_SECONDS = 7 * 24 * 3600
"""Compute's bounds of a resize request's requestedRunDuration (10 minutes to 7 days)."""


_OUTCOMES = {"ACCEPTED": QUEUED, "CREATING": QUEUED, "SUCCEEDED": GRANTED,
             "FAILED": ENDED, "CANCELLED": ENDED}
"""A resize request's state as Muster acts on it (ACCEPTED: queued; CREATING: the VMs are
being created, still all or nothing)."""


def flex_run_seconds(run_seconds: int, ready_within: float) -> int:
    """The ``requestedRunDuration`` of a run of ``run_seconds`` once Ready: the MIG's clock
    starts when it creates the VMs, up to ``ready_within`` before Provisioned. Capped at
    Compute's 7 days; a run within ``ready_within`` of that may still see the MIG delete
    the VMs before Muster's end (the booking then ends ``BookedNodesVanished``)."""
    return min(run_seconds + math.ceil(max(ready_within, 0.0)), MAX_RUN_SECONDS)


def resize_request_name(key: str) -> str:
    """The resize request of acquisition ``key`` (RFC 1035, deterministic: a repeated
    insert of the same key is the same request)."""
    return "muster-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def flex_instance_names(pool: str, key: str, count: int) -> list[str]:
    """The VMs the key's resize request names: what its bulkInsert's pattern would give."""
    width = max(4, len(str(count)))
    prefix = gcp_name_prefix(pool, key)
    return [f"{prefix}-{str(i).zfill(width)}" for i in range(1, count + 1)]


def _of_key(pool: str, key: str, name: str) -> bool:
    head = gcp_name_prefix(pool, key) + "-"
    return name.startswith(head) and name[len(head):].isdigit()


def _resize_description(owner: str, owner_uid: str, key: str) -> str:
    return f"muster {owner} {key} {owner_uid}".rstrip()


def _described(description: str) -> tuple[str, str, str] | None:
    """(owner, key, owner uid) of a resize request Muster made, else None."""
    words = (description or "").split()
    if len(words) not in (3, 4) or words[0] != "muster":
        return None
    return words[1], words[2], words[3] if len(words) == 4 else ""


@dataclass(frozen=True, slots=True)
class _Owner:
    key: str
    owner: str = ""
    owner_uid: str = ""


class GcpProvider(AtomicProvider[Any]):
    """The ``gcp`` provider: the all-or-nothing skeleton over Compute Engine VMs. Safe to
    share between concurrent reconcilers."""

    name = "gcp"

    def __init__(
        self,
        settings: GcpProviderSettings | None = None,
        *,
        clients_factory: ClientsFactory | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings or GcpProviderSettings()
        self._factory = clients_factory or (
            lambda: GcpClients.create(api_endpoint=self.settings.api_endpoint)
        )
        self._clients: GcpClients | None = None
        self._flex_owners: dict[str, _Owner] = {}
        """Flex-start VM name -> its key and owner, as the last MIG listing found them."""
        self._client_lock = asyncio.Lock()
        self._calls: CloudCalls[int] = self.settings.calls(
            is_transient=is_transient, map_error=map_error, expected=_expected
        )

    # ---- the adapter ------------------------------------------------------------------

    async def validate(self, pool: CapacityPool) -> None:
        parse_parameters(pool)

    def check(self, request: AcquireRequest) -> None:
        self._check_zone(parse_parameters(request.pool), request)

    # ---- queued provisioning (flex-start resize requests) ------------------------------

    def _flex(self, pool: CapacityPool) -> tuple[GcpPoolParameters, FlexStartParams]:
        params = parse_parameters(pool)
        if params.flex_start is None:
            raise ProviderConfigError(
                f"pool {pool.metadata.name}: queued provisioning needs "
                "spec.parameters.flexStart.instanceGroupManager"
            )
        return params, params.flex_start

    def queues(self, pool: CapacityPool) -> bool:
        return parse_parameters(pool).flex_start is not None

    async def enqueue(self, request: AcquireRequest, run_seconds: int | None, *,
                      ready_within: float) -> QueuedStatus:
        """Ask the pool's MIG for ``request.count`` named VMs at once, idempotent per key.
        The MIG deletes them ``requestedRunDuration`` after it creates them, so it is asked
        for ``run_seconds`` plus ``ready_within`` (within Compute's 7 days): Muster's own
        end of the run, ``run_seconds`` after Provisioned, then comes first and the booking
        ends ``RunDurationExpired``. None: the longest, 7 days, GKE's default."""
        from google.cloud import compute_v1

        if run_seconds is None:
            run_seconds = MAX_RUN_SECONDS
        if not MIN_RUN_SECONDS <= run_seconds <= MAX_RUN_SECONDS:
            raise ProviderConfigError(
                f"acquire {request.key}: a flex-start run lasts {MIN_RUN_SECONDS} to "
                f"{MAX_RUN_SECONDS} seconds, not {run_seconds} (maxRunDurationSeconds)"
            )
        asked = flex_run_seconds(run_seconds, ready_within)
        self.check(request)
        params, flex = self._flex(request.pool)
        clients = await self._get_clients()
        await self._calls.call(
            clients.resize_requests.insert_unary,
            what="instanceGroupManagerResizeRequests.insert",
            timeout=self.settings.request_timeout_seconds,
            expect={409},  # the same key's request, from an earlier try
            request=compute_v1.InsertInstanceGroupManagerResizeRequestRequest(
                project=params.project, zone=params.zone,
                instance_group_manager=flex.instance_group_manager,
                request_id=gcp_request_id(request.key, "resize-request"),
                instance_group_manager_resize_request_resource=(
                    compute_v1.InstanceGroupManagerResizeRequest(
                        name=resize_request_name(request.key),
                        # Named VMs, not resizeBy: what the MIG creates is then the key's.
                        instances=[compute_v1.PerInstanceConfig(name=n) for n in
                                   flex_instance_names(request.pool.metadata.name,
                                                       request.key, request.count)],
                        requested_run_duration=compute_v1.Duration(seconds=asked),
                        description=_resize_description(request.owner, request.owner_uid,
                                                        request.key),
                    )
                ),
            ),
        )
        found = await self.queued(request.pool, request.key)
        if found is None:
            raise TransientProviderError(
                f"acquire {request.key}: resize request {resize_request_name(request.key)} "
                "not visible after its insert"
            )
        return found

    async def queued(self, pool: CapacityPool, key: str) -> QueuedStatus | None:
        """The key's resize request as Compute reports it, or None when there is none."""
        params, flex = self._flex(pool)
        clients = await self._get_clients()
        name = resize_request_name(key)
        got = await self._calls.call(
            clients.resize_requests.get,
            what="instanceGroupManagerResizeRequests.get",
            timeout=self.settings.request_timeout_seconds,
            expect={404},
            project=params.project, zone=params.zone,
            instance_group_manager=flex.instance_group_manager, resize_request=name,
        )
        if isinstance(got, ExpectedStatus):
            return None
        errors = [e.message or e.code for e in got.status.error.errors] if got.status else []
        return QueuedStatus(name=got.name, state=got.state,
                            outcome=_OUTCOMES.get(got.state, QUEUED),
                            since=got.creation_timestamp, error="; ".join(errors))

    async def cancel_queued(self, pool: CapacityPool, key: str) -> str | None:
        """Take the key's request out of Compute's queue and delete it, and delete the VMs a
        grant already made (by name, through the MIG). Cancel works only while ACCEPTED and
        a request is deleted only once it is no longer ACCEPTED or CREATING: one granted
        meanwhile is read again, and one still CREATING (its VMs being made) is a refusal to
        try again later, never reported as done. None when there was none."""
        params, flex = self._flex(pool)
        found = await self.queued(pool, key)
        if found is None:
            return None
        clients = await self._get_clients()
        where = {"project": params.project, "zone": params.zone,
                 "instance_group_manager": flex.instance_group_manager,
                 "resize_request": found.name}
        state, cancelled = found.state, False
        if state == "ACCEPTED":
            got = await self._calls.call(
                clients.resize_requests.cancel_unary,
                what="instanceGroupManagerResizeRequests.cancel",
                timeout=self.settings.request_timeout_seconds,
                expect={400, 404},  # granted or gone meanwhile: read again
                **where,
            )
            if isinstance(got, ExpectedStatus):
                again = await self.queued(pool, key)
                if again is None:
                    return None
                state = again.state
            else:
                state, cancelled = "CANCELLED", True
        if state in ("ACCEPTED", "CREATING"):
            raise TransientProviderError(
                f"resize request {found.name} of instance group manager "
                f"{flex.instance_group_manager} is {state}: it can be neither cancelled nor "
                "deleted while its VMs are being made; trying again")
        got = await self._calls.call(
            clients.resize_requests.delete_unary,
            what="instanceGroupManagerResizeRequests.delete",
            timeout=self.settings.request_timeout_seconds,
            expect={404},
            **where,
        )
        vms = 0 if cancelled else await self._flex_delete_members(clients, params, pool, key, ())
        done = "cancelled and deleted" if cancelled else f"deleted (it was {state})"
        made = f", and the {vms} VM(s) it had made deleted through the MIG" if vms else ""
        return (f"resize request {found.name} of instance group manager "
                f"{flex.instance_group_manager} {done}{made}")

    async def reservations(self, pool: CapacityPool) -> list[ReservationFigures]:
        """The cloud's own figures of the pool's named reservation (reservations.get), or
        of its block (reservationBlocks.get) when the pool names one: empty without a
        name. A reservation shared from another project is read in that project."""
        params = parse_parameters(pool)
        reservation = params.reservation
        if reservation is None or reservation.name is None:
            return []
        project, name = params.project, reservation.name
        if name.startswith("projects/"):
            _, project, _, name = name.split("/")
        clients = await self._get_clients()
        if reservation.block is not None:
            got = await self._calls.call(
                clients.reservation_blocks.get,
                what="reservationBlocks.get",
                timeout=self.settings.request_timeout_seconds,
                project=project, zone=params.zone, reservation=name,
                reservation_block=reservation.block,
            )
            block = got.resource
            return [ReservationFigures(
                id=f"{name}/reservationBlocks/{block.name}", zone=params.zone,
                reserved=int(block.count), free=max(0, int(block.count - block.in_use_count)),
                state=str(block.status),
            )]
        found = await self._calls.call(
            clients.reservations.get,
            what="reservations.get",
            timeout=self.settings.request_timeout_seconds,
            project=project, zone=params.zone, reservation=name,
        )
        sku = found.specific_reservation
        return [ReservationFigures(
            id=name, zone=params.zone, reserved=int(sku.count),
            free=max(0, int(sku.count - sku.in_use_count)), state=str(found.status),
        )]

    async def find(self, pool: CapacityPool, key: str | None) -> Instances:
        params = parse_parameters(pool)
        clients = await self._get_clients()
        if params.flex_start is not None:
            return [i for i, _ in await self._flex_find(clients, params, pool.metadata.name,
                                                         key)]
        return await self._list(clients, params, pool.metadata.name, key=key)

    async def _flex_find(
        self, clients: GcpClients, params: GcpPoolParameters, pool: str, key: str | None
    ) -> list[tuple[Any, _Owner]]:
        """The VMs of the pool's MIG that a granted resize request of ``key`` (None: of any
        key Muster queued through this pool) created, each with its owner."""
        from google.cloud import compute_v1

        assert params.flex_start is not None
        mig = params.flex_start.instance_group_manager
        where = {"project": params.project, "zone": params.zone,
                 "instance_group_manager": mig}
        owners: dict[str, _Owner]
        if key is not None:
            owners = {key: _Owner(key)}
        else:
            listing = compute_v1.ListInstanceGroupManagerResizeRequestsRequest(**where)

            def requests() -> list[Any]:
                return list(clients.resize_requests.list(
                    request=listing, timeout=self.settings.request_timeout_seconds))

            found = await self._calls.call(requests, what="resizeRequests.list")
            owners = {}
            for rr in found:
                described = _described(rr.description)
                if described is not None and rr.name == resize_request_name(described[1]):
                    who, k, uid = described
                    owners[k] = _Owner(k, who, uid)
        if not owners:
            return []
        managed_request = compute_v1.ListManagedInstancesInstanceGroupManagersRequest(**where)

        def managed() -> list[Any]:
            return list(clients.instance_group_managers.list_managed_instances(
                request=managed_request, timeout=self.settings.request_timeout_seconds))

        members = await self._calls.call(managed, what="instanceGroupManagers."
                                         "listManagedInstances")
        mine: dict[str, _Owner] = {}
        for member in members:
            name = member.name or str(member.instance).rsplit("/", 1)[-1]
            owner = next((o for k, o in owners.items() if _of_key(pool, k, name)), None)
            if owner is not None:
                mine[name] = owner

        async def get(name: str) -> Any:
            got = await self._calls.call(
                clients.instances.get, what=f"instances.get {name}",
                timeout=self.settings.request_timeout_seconds, expect={404},
                project=params.project, zone=params.zone, instance=name)
            # 404: the MIG has not created it yet (or deleted it meanwhile).
            return None if isinstance(got, ExpectedStatus) else got

        got = await asyncio.gather(*(get(n) for n in sorted(mine)))
        self._flex_owners.update(mine)
        return [(i, mine[i.name]) for i in got if i is not None]

    async def launch(self, request: AcquireRequest, have: Sequence[Any]) -> Launch[Any]:
        """One zonal bulkInsert under the key's ``requestId`` (a repeated call joins the
        first operation), awaited, then the VMs under the key listed."""
        from google.cloud import compute_v1

        params = parse_parameters(request.pool)
        if params.flex_start is not None:
            # Its VMs come from the MIG's resize requests (found by name, adopted before a
            # launch): an instance insert here would be an on-demand VM.
            queued = await self.queued(request.pool, request.key)
            if queued is None:
                raise ProviderConfigError(
                    f"pool {request.pool.metadata.name}: a flexStart pool's VMs come only "
                    "from its queue (queued-provisioning.muster.dev)")
            # Granted, then some VMs gone (the MIG's run ended, deleted out of band): the
            # gang is incomplete, as a stock-out leaves it.
            raise CapacityUnavailable(
                f"pool {request.pool.metadata.name}: resize request {queued.name} is "
                f"{queued.state} but {len(have)} of its {request.count} VM(s) are in MIG "
                f"{params.flex_start.instance_group_manager}", available=len(have))
        clients = await self._get_clients()
        pool = request.pool.metadata.name
        policy = await self._ensure_policy(clients, params, request)
        body = compute_v1.BulkInsertInstanceResource(
            count=request.count,
            min_count=request.count,
            name_pattern=self._name_pattern(pool, request),
            instance_properties=self._instance_properties(params, request, policy),
        )
        operation = await self._calls.call(
            clients.instances.bulk_insert_unary,
            what="instances.bulkInsert",
            timeout=self.settings.request_timeout_seconds,
            request=compute_v1.BulkInsertInstanceRequest(
                project=params.project,
                zone=params.zone,
                request_id=gcp_request_id(request.key),
                bulk_insert_instance_resource_resource=body,
            ),
        )
        await self._wait_zone(clients, params, operation, what="bulkInsert", count=request.count)
        return Launch(await self._list(clients, params, pool, key=request.key))

    async def delete(self, pool: CapacityPool, key: str, known: Sequence[Any]) -> int:
        """Delete the key's VMs and its placement policy."""
        params = parse_parameters(pool)
        clients = await self._get_clients()
        if params.flex_start is not None:
            deleted = await self._flex_delete(clients, params, pool, key, known)
            log.info("release %s: deleted %d VMs of MIG %s", key, deleted,
                     params.flex_start.instance_group_manager)
            return deleted
        deleted = await self._delete_instances(clients, params, pool.metadata.name, key, known)
        if params.compact_placement:
            await self._delete_policy(clients, params, gcp_policy_name(pool.metadata.name, key))
        log.info("release %s: deleted %d VMs", key, deleted)
        return deleted

    async def _flex_delete(self, clients: GcpClients, params: GcpPoolParameters,
                           pool: CapacityPool, key: str, known: Sequence[Any]) -> int:
        """Delete the key's VMs through the MIG (which lowers its target size; a plain
        instance delete would be refilled), then the key's resize request."""
        deleted = await self._flex_delete_members(clients, params, pool, key, known)
        await self.cancel_queued(pool, key)
        return deleted

    async def _flex_delete_members(self, clients: GcpClients, params: GcpPoolParameters,
                                   pool: CapacityPool, key: str, known: Sequence[Any]) -> int:
        """Delete the key's VMs (found by name in the MIG, plus ``known``) through the MIG;
        how many."""
        from google.cloud import compute_v1

        assert params.flex_start is not None
        found = await self._flex_find(clients, params, pool.metadata.name, key)
        names = sorted({i.name for i, _ in found} | {i.name for i in known})
        if names:
            operation = await self._calls.call(
                clients.instance_group_managers.delete_instances_unary,
                what="instanceGroupManagers.deleteInstances",
                timeout=self.settings.request_timeout_seconds,
                expect={404},
                request=compute_v1.DeleteInstancesInstanceGroupManagerRequest(
                    project=params.project, zone=params.zone,
                    instance_group_manager=params.flex_start.instance_group_manager,
                    request_id=gcp_request_id(key, "mig-delete\x1f" + ",".join(names)),
                    instance_group_managers_delete_instances_request_resource=(
                        compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                            instances=[f"zones/{params.zone}/instances/{n}" for n in names],
                            # A VM the MIG already deleted does not fail the others.
                            skip_instances_on_validation_error=True,
                        )
                    ),
                ),
            )
            if not isinstance(operation, ExpectedStatus):
                await self._wait_zone(clients, params, operation,
                                      what="instanceGroupManagers.deleteInstances")
        return len(names)

    async def to_nodes(
        self, pool: CapacityPool, machines: Sequence[Any], request: AcquireRequest | None
    ) -> Nodes:
        params = parse_parameters(pool)
        owners: dict[str, _Owner] = {}
        if params.flex_start is not None:
            # The MIG's VMs carry no Muster metadata: their names say whose they are.
            if request is not None:
                owners = {i.name: _Owner(request.key, request.owner, request.owner_uid)
                          for i in machines}
            else:
                # The listing that found them just read their owners.
                owners = {i.name: self._flex_owners[i.name] for i in machines
                          if i.name in self._flex_owners}
        return self._nodes(params, pool.metadata.name, machines, owners)

    # ---- request building ------------------------------------------------------------

    def _check_zone(self, params: GcpPoolParameters, request: AcquireRequest) -> None:
        zone = request.chosen.get(params.zone_label)
        if zone is not None and zone != params.zone:
            raise ProviderConfigError(
                f"acquire {request.key}: domain zone {zone} is not pool "
                f"{request.pool.metadata.name}'s zone {params.zone}"
            )

    @staticmethod
    def _name_pattern(pool: str, request: AcquireRequest) -> str:
        width = max(4, len(str(request.count)))
        return f"{gcp_name_prefix(pool, request.key)}-{'#' * width}"

    def _labels(self, params: GcpPoolParameters, pool: str, key: str) -> dict[str, str]:
        labels = dict(params.labels)
        labels.update({
            LABEL_POOL: gcp_label_value(pool),
            LABEL_KEY: gcp_label_value(key),
            LABEL_CLUSTER: gcp_label_value(self.settings.cluster_name),
        })
        return labels

    def _instance_properties(
        self, params: GcpPoolParameters, request: AcquireRequest, policy: str | None
    ) -> Any:
        from google.cloud import compute_v1

        pool = request.pool.metadata.name
        metadata = with_startup_taint(params.metadata)
        metadata.update({
            META_KEY: request.key,
            META_POOL: pool,
            META_OWNER: request.owner,
            META_OWNER_UID: request.owner_uid,
        })
        labels = self._labels(params, pool, request.key)
        # The boot disk is labelled like its VM: cost reports and a cleanup by label see it.
        disk_params = compute_v1.AttachedDiskInitializeParams(
            source_image=params.image, disk_size_gb=params.boot_disk_size_gb, labels=labels
        )
        if params.boot_disk_type:
            disk_params.disk_type = params.boot_disk_type
        scheduling = compute_v1.Scheduling(provisioning_model=params.provisioning_model)
        if params.accelerators or params.machine_type.startswith(("a2-", "a3-", "a4", "g2-")):
            # GPU VMs cannot live-migrate.
            scheduling.on_host_maintenance = "TERMINATE"
        if params.provisioning_model == "SPOT":
            scheduling.instance_termination_action = "DELETE"
        props = compute_v1.InstanceProperties(
            machine_type=params.machine_type,
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True,
                                           initialize_params=disk_params)],
            network_interfaces=_network_interfaces(params),
            metadata=compute_v1.Metadata(
                items=[compute_v1.Items(key=k, value=v) for k, v in sorted(metadata.items())]
            ),
            labels=labels,
            scheduling=scheduling,
        )
        if params.accelerators:
            props.guest_accelerators = [
                compute_v1.AcceleratorConfig(accelerator_type=a.type, accelerator_count=a.count)
                for a in params.accelerators
            ]
        if params.network_tags:
            props.tags = compute_v1.Tags(items=params.network_tags)
        if params.service_account is not None:
            props.service_accounts = [
                compute_v1.ServiceAccount(email=params.service_account.email,
                                          scopes=params.service_account.scopes)
            ]
        if params.reservation is not None:
            consume, key, values = params.reservation.affinity()
            affinity = compute_v1.ReservationAffinity(consume_reservation_type=consume)
            if key:
                affinity.key = key
                affinity.values = values
            props.reservation_affinity = affinity
        if policy is not None:
            props.resource_policies = [policy]
        return props

    # ---- cloud calls ------------------------------------------------------------------

    async def _get_clients(self) -> GcpClients:
        async with self._client_lock:
            if self._clients is None:
                self._clients = await self._calls.once(
                    self._factory, what="create Compute clients"
                )
            return self._clients

    async def _list(
        self, clients: GcpClients, params: GcpPoolParameters, pool: str, *, key: str | None
    ) -> Instances:
        from google.cloud import compute_v1

        labels = {
            LABEL_CLUSTER: gcp_label_value(self.settings.cluster_name),
            LABEL_POOL: gcp_label_value(pool),
        }
        if key is not None:
            labels[LABEL_KEY] = gcp_label_value(key)
        filter_ = " AND ".join(f'(labels.{k} = "{v}")' for k, v in labels.items())
        request = compute_v1.ListInstancesRequest(
            project=params.project, zone=params.zone, filter=filter_
        )

        def pages() -> Instances:
            return list(clients.instances.list(
                request=request, timeout=self.settings.request_timeout_seconds
            ))

        found: Instances = await self._calls.call(pages, what="instances.list")
        # A hashed label could collide in theory; the metadata holds the exact key.
        return [
            i for i in found
            if key is None or _metadata(i).get(META_KEY, key) == key
        ]

    async def _wait_zone(
        self, clients: GcpClients, params: GcpPoolParameters, operation: Any, *, what: str,
        count: int | None = None,
    ) -> Any:
        return await self._wait(
            lambda: clients.zone_operations.wait(
                project=params.project, zone=params.zone, operation=operation.name,
                timeout=self.settings.wait_timeout_seconds,
            ),
            operation, what=what, count=count,
        )

    async def _wait_region(
        self, clients: GcpClients, params: GcpPoolParameters, operation: Any, *, what: str
    ) -> Any:
        return await self._wait(
            lambda: clients.region_operations.wait(
                project=params.project, region=params.region, operation=operation.name,
                timeout=self.settings.wait_timeout_seconds,
            ),
            operation, what=what,
        )

    async def _wait(
        self, wait: Callable[[], Any], operation: Any, *, what: str, count: int | None = None
    ) -> Any:
        """Poll until the operation is DONE (``wait`` may return early), then raise its
        error, if any, as a provider error."""
        from google.cloud import compute_v1

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.operation_timeout_seconds
        while operation.status != compute_v1.Operation.Status.DONE:
            if loop.time() >= deadline:
                raise TransientProviderError(
                    f"{what}: operation {operation.name} not done after "
                    f"{self.settings.operation_timeout_seconds:.0f}s"
                )
            operation = await self._calls.call(wait, what=f"{what}: operations.wait")
        errors = list(operation.error.errors) if operation.error else []
        if errors:
            codes = [e.code for e in errors]
            detail = "; ".join(f"{e.code}: {e.message}" for e in errors)
            raise _error_for_codes(
                codes,
                f"{what}: operation {operation.name} failed ({detail})"
                + ("; nothing was kept" if count is not None else ""),
                status=int(operation.http_error_status_code or 0),
                available=0 if count is not None else None,
            )
        return operation

    async def _ensure_policy(
        self, clients: GcpClients, params: GcpPoolParameters, request: AcquireRequest
    ) -> str | None:
        from google.cloud import compute_v1

        if not params.compact_placement:
            return None
        name = gcp_policy_name(request.pool.metadata.name, request.key)
        policy = compute_v1.ResourcePolicy(
            name=name,
            description=f"muster acquisition {request.key} for {request.owner}",
            group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(
                collocation="COLLOCATED"
            ),
        )
        operation = await self._calls.call(
            clients.resource_policies.insert_unary,
            what="resourcePolicies.insert",
            timeout=self.settings.request_timeout_seconds,
            expect={409},  # ours already, from an earlier try of this key
            request=compute_v1.InsertResourcePolicyRequest(
                project=params.project,
                region=params.region,
                request_id=gcp_request_id(request.key, "placement-policy"),
                resource_policy_resource=policy,
            ),
        )
        if not isinstance(operation, ExpectedStatus):
            await self._wait_region(clients, params, operation, what="resourcePolicies.insert")
        return f"projects/{params.project}/regions/{params.region}/resourcePolicies/{name}"

    async def _delete_policy(
        self, clients: GcpClients, params: GcpPoolParameters, name: str
    ) -> None:
        from google.cloud import compute_v1

        for attempt in range(1, self.settings.policy_delete_attempts + 1):
            operation = await self._calls.call(
                clients.resource_policies.delete_unary,
                what="resourcePolicies.delete",
                timeout=self.settings.request_timeout_seconds,
                expect={400, 404},
                request=compute_v1.DeleteResourcePolicyRequest(
                    project=params.project, region=params.region, resource_policy=name
                ),
            )
            if isinstance(operation, ExpectedStatus):
                if operation.status == 404:
                    return
                # 400 resourceInUseByAnotherResource: VMs are still being deleted.
                if attempt == self.settings.policy_delete_attempts:
                    raise TransientProviderError(
                        f"placement policy {name} still in use: {operation.message}"
                    )
                await asyncio.sleep(self.settings.policy_delete_interval_seconds)
                continue
            await self._wait_region(clients, params, operation, what="resourcePolicies.delete")
            return

    async def _delete_instances(
        self, clients: GcpClients, params: GcpPoolParameters, pool: str, key: str,
        known: Sequence[Any] = (),
    ) -> int:
        from google.cloud import compute_v1

        listed = await self._list(clients, params, pool, key=key)
        names = sorted({i.name for i in listed} | {i.name for i in known})

        async def delete(name: str) -> int:
            operation = await self._calls.call(
                clients.instances.delete_unary,
                what=f"instances.delete {name}",
                timeout=self.settings.request_timeout_seconds,
                expect={404},
                # Flattened arguments do not accept request_id: pass the request object.
                request=compute_v1.DeleteInstanceRequest(
                    project=params.project,
                    zone=params.zone,
                    instance=name,
                    # The VM's name goes into the purpose, not the key: key and name together
                    # exceed the 63 characters a key may have with real acquisition keys.
                    request_id=gcp_request_id(key, f"delete\x1f{name}"),
                ),
            )
            if isinstance(operation, ExpectedStatus):
                return 0
            await self._wait_zone(clients, params, operation, what=f"delete {name}")
            return 1

        results = await asyncio.gather(
            *(delete(name) for name in names), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise map_error(failures[0], f"release {key}") from failures[0]
        return sum(r for r in results if isinstance(r, int))

    # ---- results ----------------------------------------------------------------------

    def _nodes(
        self,
        params: GcpPoolParameters,
        pool: str,
        instances: Sequence[Any],
        owners: Mapping[str, _Owner] | None = None,
    ) -> Nodes:
        nodes = []
        for instance in instances:
            meta = _metadata(instance)
            owner = (owners or {}).get(instance.name)
            if owner is not None:
                meta = {META_KEY: owner.key, META_OWNER: owner.owner,
                        META_OWNER_UID: owner.owner_uid, **meta}
            # What Compute reports (zone, physical host topology), never the planned domain:
            # Muster compares the registered Node with the plan.
            labels = {
                params.zone_label: params.zone,
                INSTANCE_TYPE_LABEL: str(instance.machine_type).rsplit("/", 1)[-1],
                **host_topology(instance),
            }
            nodes.append(ProvidedNode(
                name=instance.name,
                provider_id=f"gce://{params.project}/{params.zone}/{instance.name}",
                pool=pool,
                key=meta.get(META_KEY) or dict(instance.labels).get(LABEL_KEY, ""),
                owner=meta.get(META_OWNER, ""),
                owner_uid=meta.get(META_OWNER_UID, ""),
                labels=labels,
            ))
        return sorted(nodes, key=lambda n: n.name)


def _network_interfaces(params: GcpPoolParameters) -> list[Any]:
    """The VM's network interfaces: the pool's list, else one in network/subnetwork (or
    the project's default network when neither is set)."""
    from google.cloud import compute_v1

    nics: list[NetworkInterfaceParams | None] = list(params.network_interfaces) or [
        NetworkInterfaceParams(network=params.network, subnetwork=params.subnetwork)
        if params.network or params.subnetwork else None
    ]
    out = []
    for nic in nics:
        interface = compute_v1.NetworkInterface()
        if nic is not None:
            if nic.network:
                interface.network = nic.network
            if nic.subnetwork:
                interface.subnetwork = nic.subnetwork
            if nic.nic_type:
                interface.nic_type = nic.nic_type
            if nic.queue_count:
                interface.queue_count = nic.queue_count
        out.append(interface)
    return out


def _metadata(instance: Any) -> dict[str, str]:
    return {item.key: item.value for item in instance.metadata.items}


def with_startup_taint(metadata: Mapping[str, str]) -> dict[str, str]:
    """The pool's instance metadata with Muster's startup taint: always under
    :data:`META_STARTUP_TAINT`, and merged into ``NODE_TAINTS`` of a ``kube-env`` (one
    ``KEY: value`` per line, as the GCE configure-helper reads it)."""
    out = dict(metadata)
    out[META_STARTUP_TAINT] = STARTUP_TAINT_VALUE
    env = out.get("kube-env")
    if env is None:
        return out
    lines = env.splitlines()
    for i, line in enumerate(lines):
        key, sep, value = line.partition(":")
        if sep and key.strip() == "NODE_TAINTS":
            taints = [t for t in value.strip().strip("'\"").split(",") if t]
            if STARTUP_TAINT_VALUE not in taints:
                taints.append(STARTUP_TAINT_VALUE)
            lines[i] = f"NODE_TAINTS: '{','.join(taints)}'"
            break
    else:
        lines.append(f"NODE_TAINTS: '{STARTUP_TAINT_VALUE}'")
    out["kube-env"] = "\n".join(lines) + "\n"
    return out


def host_topology(instance: Any) -> dict[str, str]:
    """GKE's topology labels from ``resourceStatus.physicalHostTopology`` (machine types that
    report it: A3, A4 and similar); empty when absent."""
    status = getattr(instance, "resource_status", None)
    topology = getattr(status, "physical_host_topology", None) if status else None
    if not topology:
        return {}
    return {label: str(getattr(topology, field))
            for field, label in TOPOLOGY_LABELS.items() if getattr(topology, field, "")}


def make_gcp_provider(
    settings: GcpProviderSettings | None = None,
    *,
    clients_factory: ClientsFactory | None = None,
) -> GcpProvider:
    """Factory for the provider registry: settings from ``MUSTER_GCP_*`` when omitted."""
    return GcpProvider(settings, clients_factory=clients_factory)
