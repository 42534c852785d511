"""Dynamic Resource Allocation objects Muster reads (``resource.k8s.io/v1``).

ResourceSlice, DeviceClass, ResourceClaim and ResourceClaimTemplate, with the upstream
field names. Models keep unknown fields (``extra="allow"``) so an object read from a newer
API server is not rejected; the fields allocation depends on are typed and validated
(exactly one of ``exactly``/``firstAvailable``, one of ``matchAttribute``/
``distinctAttribute``, one node scope per slice, typed attribute values, quantities).
``controller.inputs.dra_snapshot`` turns them into the fit engine's device inventory and claims.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.api.meta import ObjectMeta
from controller.api.pod import NodeSelector, Quantity

GROUP = "resource.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
ApiVersion = Literal["resource.k8s.io/v1"]
MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_SUBREQUESTS = 8
MAX_DEVICES_PER_SLICE = 128


class _Open(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


# ---------------------------------------------------------------------------- slices


class DeviceAttribute(_Open):
    """Exactly one of int, bool, string, version (a semantic version string)."""

    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = None
    version: str | None = None

    @model_validator(mode="after")
    def _one_value(self) -> DeviceAttribute:
        set_ = [v for v in (self.int_, self.bool_, self.string, self.version) if v is not None]
        if len(set_) != 1:
            raise ValueError("a device attribute needs exactly one of int, bool, string, "
                             "version")
        return self


class CapacityRange(_Open):
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


class CapacityRequestPolicy(_Open):
    default: Quantity | None = None
    valid_values: list[Quantity] = Field(default_factory=list, alias="validValues",
                                         max_length=10)
    valid_range: CapacityRange | None = Field(default=None, alias="validRange")

    @model_validator(mode="after")
    def _one_rule(self) -> CapacityRequestPolicy:
        if self.valid_values and self.valid_range is not None:
            raise ValueError("validValues and validRange are mutually exclusive")
        return self


class DeviceCapacity(_Open):
    value: Quantity
    request_policy: CapacityRequestPolicy | None = Field(default=None, alias="requestPolicy")


class Counter(_Open):
    value: Quantity


class CounterSet(_Open):
    name: str = Field(min_length=1)
    counters: dict[str, Counter] = Field(default_factory=dict)


class DeviceCounterConsumption(_Open):
    counter_set: str = Field(alias="counterSet", min_length=1)
    counters: dict[str, Counter] = Field(default_factory=dict)


class DeviceTaintSpec(_Open):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["None", "NoSchedule", "NoExecute"] = "NoSchedule"


class Device(_Open):
    name: str = Field(min_length=1)
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, DeviceCapacity] = Field(default_factory=dict)
    consumes_counters: list[DeviceCounterConsumption] = Field(
        default_factory=list, alias="consumesCounters", max_length=2
    )
    allow_multiple_allocations: bool = Field(default=False, alias="allowMultipleAllocations")
    taints: list[DeviceTaintSpec] = Field(default_factory=list, max_length=16)
    node_name: str | None = Field(default=None, alias="nodeName")
    all_nodes: bool | None = Field(default=None, alias="allNodes")

    @model_validator(mode="after")
    def _small_enough(self) -> Device:
        if len(self.attributes) + len(self.capacity) > 32:
            raise ValueError(f"device {self.name}: at most 32 attributes and capacities")
        return self


class ResourcePool(_Open):
    name: str = Field(min_length=1)
    generation: int = Field(default=0, ge=0)
    resource_slice_count: int = Field(default=1, alias="resourceSliceCount", ge=1)


class ResourceSliceSpec(_Open):
    driver: str = Field(min_length=1)
    pool: ResourcePool
    node_name: str | None = Field(default=None, alias="nodeName")
    node_selector: NodeSelector | None = Field(default=None, alias="nodeSelector")
    all_nodes: bool | None = Field(default=None, alias="allNodes")
    per_device_node_selection: bool | None = Field(default=None,
                                                   alias="perDeviceNodeSelection")
    devices: list[Device] = Field(default_factory=list, max_length=MAX_DEVICES_PER_SLICE)
    shared_counters: list[CounterSet] = Field(default_factory=list, alias="sharedCounters",
                                              max_length=8)

    @model_validator(mode="after")
    def _one_scope(self) -> ResourceSliceSpec:
        scopes = [self.node_name, self.node_selector,
                  True if self.all_nodes else None,
                  True if self.per_device_node_selection else None]
        if sum(s is not None for s in scopes) != 1:
            raise ValueError("exactly one of nodeName, nodeSelector, allNodes, "
                             "perDeviceNodeSelection must be set")
        return self


class ResourceSlice(_Open):
    api_version: ApiVersion = Field(default="resource.k8s.io/v1", alias="apiVersion")
    kind: Literal["ResourceSlice"] = "ResourceSlice"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ResourceSliceSpec


class ResourceSliceTemplate(_Open):
    """A ResourceSlice ``spec`` a CapacityPool's new nodes will publish (node scope is the
    new node itself, so ``nodeName`` and ``pool.name`` may be left out: they default to the
    node's name when the fake provider publishes the slice)."""

    driver: str = Field(min_length=1)
    pool: ResourcePool | None = None
    devices: list[Device] = Field(default_factory=list, max_length=MAX_DEVICES_PER_SLICE)
    shared_counters: list[CounterSet] = Field(default_factory=list, alias="sharedCounters",
                                              max_length=8)


# ---------------------------------------------------------------------------- classes


class CELSelector(_Open):
    expression: str = Field(min_length=1, max_length=10 * 1024)


class DeviceSelector(_Open):
    cel: CELSelector


class DeviceClassSpec(_Open):
    selectors: list[DeviceSelector] = Field(default_factory=list, max_length=32)
    config: list[dict[str, Any]] = Field(default_factory=list)
    extended_resource_name: str | None = Field(default=None, alias="extendedResourceName")


class DeviceClass(_Open):
    api_version: ApiVersion = Field(default="resource.k8s.io/v1", alias="apiVersion")
    kind: Literal["DeviceClass"] = "DeviceClass"
    metadata: ObjectMeta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)


# ---------------------------------------------------------------------------- claims


class DeviceToleration(_Open):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "None", "NoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class CapacityRequirements(_Open):
    requests: dict[str, Quantity] = Field(default_factory=dict)


class _RequestFields(_Open):
    device_class_name: str = Field(alias="deviceClassName", min_length=1)
    selectors: list[DeviceSelector] = Field(default_factory=list, max_length=32)
    allocation_mode: Literal["ExactCount", "All"] = Field(default="ExactCount",
                                                           alias="allocationMode")
    count: int | None = Field(default=None, ge=1)
    tolerations: list[DeviceToleration] = Field(default_factory=list, max_length=16)
    capacity: CapacityRequirements | None = None

    @model_validator(mode="after")
    def _count_fits_mode(self) -> _RequestFields:
        if self.allocation_mode == "All" and self.count is not None:
            raise ValueError("count must not be set with allocationMode All")
        return self

    @property
    def exact_count(self) -> int:
        return self.count if self.count is not None else 1


class ExactDeviceRequest(_RequestFields):
    admin_access: bool | None = Field(default=None, alias="adminAccess")


class DeviceSubRequest(_RequestFields):
    name: str = Field(min_length=1, max_length=63)


class DeviceRequest(_Open):
    name: str = Field(min_length=1, max_length=63)
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] = Field(default_factory=list,
                                                    alias="firstAvailable",
                                                    max_length=MAX_SUBREQUESTS)

    @model_validator(mode="after")
    def _one_kind(self) -> DeviceRequest:
        if (self.exactly is None) == (not self.first_available):
            raise ValueError(f"request {self.name}: exactly one of exactly, firstAvailable")
        return self


class DeviceConstraint(_Open):
    requests: list[str] = Field(default_factory=list)
    match_attribute: str | None = Field(default=None, alias="matchAttribute")
    distinct_attribute: str | None = Field(default=None, alias="distinctAttribute")

    @model_validator(mode="after")
    def _one_kind(self) -> DeviceConstraint:
        if (self.match_attribute is None) == (self.distinct_attribute is None):
            raise ValueError("a constraint needs exactly one of matchAttribute, "
                             "distinctAttribute")
        attr = self.match_attribute or self.distinct_attribute or ""
        if "/" not in attr:
            raise ValueError(f"constraint attribute {attr!r} must be fully qualified "
                             "(domain/name)")
        return self


class DeviceClaim(_Open):
    requests: list[DeviceRequest] = Field(default_factory=list, max_length=MAX_REQUESTS)
    constraints: list[DeviceConstraint] = Field(default_factory=list,
                                                max_length=MAX_CONSTRAINTS)
    config: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> DeviceClaim:
        names = [r.name for r in self.requests]
        if len(set(names)) != len(names):
            raise ValueError("request names must be unique")
        for c in self.constraints:
            unknown = [n for n in c.requests if n.split("/", 1)[0] not in names]
            if unknown:
                raise ValueError(f"constraint names unknown requests: {', '.join(unknown)}")
        return self


class ResourceClaimSpec(_Open):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)


class DeviceRequestAllocationResult(_Open):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = Field(default=None, alias="adminAccess")
    share_id: str | None = Field(default=None, alias="shareID")
    consumed_capacity: dict[str, Quantity] = Field(default_factory=dict,
                                                   alias="consumedCapacity")


class DeviceAllocationResult(_Open):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)


class AllocationResult(_Open):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    node_selector: NodeSelector | None = Field(default=None, alias="nodeSelector")


class ResourceClaimStatus(_Open):
    allocation: AllocationResult | None = None
    reserved_for: list[dict[str, Any]] = Field(default_factory=list, alias="reservedFor")


class ResourceClaim(_Open):
    api_version: ApiVersion = Field(default="resource.k8s.io/v1", alias="apiVersion")
    kind: Literal["ResourceClaim"] = "ResourceClaim"
    metadata: ObjectMeta
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)


class ResourceClaimTemplateSpec(_Open):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)


class ResourceClaimTemplate(_Open):
    api_version: ApiVersion = Field(default="resource.k8s.io/v1", alias="apiVersion")
    kind: Literal["ResourceClaimTemplate"] = "ResourceClaimTemplate"
    metadata: ObjectMeta
    spec: ResourceClaimTemplateSpec = Field(default_factory=ResourceClaimTemplateSpec)
