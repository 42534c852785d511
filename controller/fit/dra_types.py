"""Dynamic Resource Allocation inputs and outputs of the fit engine (resource.k8s.io/v1).

Pure data, like :mod:`controller.fit.types` (which refers to these from ``PodShape``,
``NodeState``, ``PoolState`` and ``Assignment``). ``controller.inputs.dra_snapshot`` builds them
from ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates.

A node's devices are split so that 10,000 identical nodes cost one allocation search:

* :class:`DeviceShape` (shared, interned by the snapshot builder): the devices without the
  attributes that identify one physical device (``uuid``-like values that never repeat),
  their shared counters, and what is already allocated (:class:`DeviceState`);
* :class:`NodeDevices` (per node): that shape plus the node's pool names and the identity
  attributes, which only matter to a gang whose selectors or constraints name them.

Device and pool references inside a shape are indexes; names are resolved per node.
Capacities and counters are integers in base units (bytes, counts), rounded up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from controller.fit.cel import Selector, SemVer

AttrValue = bool | int | str | SemVer

EMPTY_CAPACITY: Mapping[str, int] = MappingProxyType({})
EXACT_COUNT = "ExactCount"
ALL = "All"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # None | NoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """capacity.requestPolicy of a consumable capacity (KEP-5075)."""

    default: int | None = None
    valid_values: tuple[int, ...] = ()
    """Sorted ascending."""
    min: int | None = None
    max: int | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class CounterUse:
    """A device's ``consumesCounters`` entry: counters of one counter set of its pool."""

    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True, slots=True, eq=False)
class Device:
    name: str
    driver: str
    pool: int
    """Index into :attr:`NodeDevices.pools`."""
    attributes: Mapping[str, AttrValue]
    """Fully qualified names (``gpu.nvidia.com/productName``), identity attributes removed."""
    capacity: Mapping[str, int] = field(default_factory=dict)
    """Fully qualified names -> base units."""
    policies: Mapping[str, RequestPolicy] = field(default_factory=dict)
    consumes: tuple[CounterUse, ...] = ()
    allow_multiple: bool = False
    taints: tuple[DeviceTaint, ...] = ()


CounterKey = tuple[str, int, str]
"""(driver, pool index, counter set name)."""


@dataclass(frozen=True, slots=True)
class DeviceState:
    """What is already allocated on a node (hashable: part of equivalence-class keys)."""

    used: frozenset[int] = frozenset()
    """Devices allocated exclusively (index into :attr:`DeviceInventory.devices`)."""
    counters: tuple[tuple[CounterKey, tuple[tuple[str, int], ...]], ...] = ()
    """Consumed counters, sorted."""
    capacity: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    """Capacity consumed on devices that allow multiple allocations, sorted."""
    shared: frozenset[int] = frozenset()
    """Multi-allocatable devices with at least one allocation (cannot be taken whole)."""


EMPTY_STATE = DeviceState()


@dataclass(frozen=True, slots=True, eq=False)
class DeviceInventory:
    """The devices of one kind of node, shared by every node of that kind."""

    devices: tuple[Device, ...]
    counters: Mapping[CounterKey, Mapping[str, int]] = field(default_factory=dict)
    """sharedCounters: capacity of each counter of each counter set."""
    identity_names: frozenset[str] = frozenset()
    """Attribute names held per node in :attr:`NodeDevices.identity`."""


@dataclass(frozen=True, slots=True, eq=False)
class DeviceShape:
    """An inventory plus its allocation state (interned: nodes share one object)."""

    inventory: DeviceInventory
    state: DeviceState = EMPTY_STATE


@dataclass(frozen=True, slots=True, eq=False)
class NodeDevices:
    shape: DeviceShape
    pools: tuple[str, ...] = ()
    """Pool names, indexed by :attr:`Device.pool`."""
    identity: tuple[Mapping[str, AttrValue], ...] = ()
    """Per device (same order as the inventory), the identity attributes; may be empty."""

    def attributes(self, index: int) -> Mapping[str, AttrValue]:
        dev = self.shape.inventory.devices[index]
        if self.identity and self.identity[index]:
            return {**dev.attributes, **self.identity[index]}
        return dev.attributes


# ---------------------------------------------------------------------------- claims


@dataclass(frozen=True, slots=True, eq=False)
class DeviceRequest:
    """One ``exactly`` request or one ``firstAvailable`` subrequest."""

    name: str
    """``gpu`` or, for a subrequest, ``gpu/small``."""
    device_class: str
    selectors: tuple[Selector, ...]
    """The DeviceClass's selectors, then the request's own (all must match)."""
    mode: str = EXACT_COUNT
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)
    """capacity.requests, fully qualified names -> base units."""
    tolerations: tuple[DeviceToleration, ...] = ()
    admin_access: bool = False
    """adminAccess: the devices may be in use and stay available to others."""


@dataclass(frozen=True, slots=True, eq=False)
class ClaimRequest:
    name: str
    alternatives: tuple[DeviceRequest, ...]
    """One for ``exactly``; the ordered subrequests for ``firstAvailable``."""


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    requests: tuple[str, ...]
    """Request names (empty: every request of the claim); ``gpu/big`` names one
    firstAvailable subrequest, ``gpu`` all of them."""
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class ClaimShape:
    """A claim every pod of a pod set gets (from a ResourceClaimTemplate) or shares."""

    name: str
    """The pod's ``spec.resourceClaims[].name``."""
    source: str
    """For messages: ``ResourceClaimTemplate ns/train-gpus`` or ``ResourceClaim ns/c``."""
    requests: tuple[ClaimRequest, ...]
    constraints: tuple[DeviceConstraint, ...] = ()
    error: str | None = None
    """Set by the snapshot builder when the claim cannot be used as written (a selector
    that does not compile, an unknown DeviceClass): the engine answers Invalid."""
    missing: tuple[str, ...] = ()
    """The objects ``error`` says are not found, as ``Kind name`` (``ResourceClaimTemplate
    ns/t``, ``DeviceClass gpu``): they come through other watches and may only be late."""


# ---------------------------------------------------------------------------- results


class DeviceResult(NamedTuple):
    """One entry of a claim's ``status.allocation.devices.results``.

    Named tuples rather than dataclasses: a 1,024-pod plan creates thousands of these."""

    request: str
    """``gpu`` or ``gpu/small`` for a firstAvailable subrequest."""
    driver: str
    pool: str
    device: str
    consumed_capacity: Mapping[str, int] = EMPTY_CAPACITY
    """For devices that allow multiple allocations."""
    admin_access: bool = False
    """Allocated with adminAccess: does not hold the device."""


class ClaimAllocation(NamedTuple):
    claim: str
    results: tuple[DeviceResult, ...]


PodDevices = tuple[ClaimAllocation, ...]
"""The device allocation of one pod: one entry per claim of its shape."""
