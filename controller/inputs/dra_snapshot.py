"""From DRA API objects to the fit engine's device inventory and claims.

* ResourceSlices -> one :class:`NodeDevices` per node: node-local slices (``nodeName``) of
  the newest generation of each complete pool, devices in (driver, pool, slice, device)
  order, attribute and capacity names fully qualified, quantities as integers.
* Allocated ResourceClaims (``status.allocation``) -> devices (and counters, and capacity of
  shared devices) already in use.
* A pod's ``spec.resourceClaims`` + ResourceClaimTemplates + DeviceClasses ->
  :class:`ClaimShape` with compiled CEL selectors; an unknown class or a selector that does
  not compile gives a ClaimShape with ``error`` (the engine answers Invalid, naming it).
* A CapacityPool's ``nodeTemplate.resourceSlices`` -> the devices every new node will have.

Identical nodes share one :class:`DeviceShape` object: attributes whose values never repeat
across the cluster's devices (``uuid``-like) are kept per node, the rest is interned, so the
engine groups 10,000 identical nodes into one equivalence class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel

from controller.api.capacitypool import CapacityPool
from controller.api.dra import Device as ApiDevice
from controller.api.dra import DeviceAttribute as ApiAttribute
from controller.api.dra import (
    DeviceClaim,
    DeviceClass,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    ResourceSliceTemplate,
)
from controller.api.pod import NodeSelector, PodSpec
from controller.api.quantity import parse_quantity
from controller.fit.cel import SelectorError, SemVer, compile_selector
from controller.fit.devices import book
from controller.fit.dra_types import (
    EMPTY_STATE,
    AttrValue,
    ClaimRequest,
    ClaimShape,
    CounterKey,
    CounterUse,
    Device,
    DeviceConstraint,
    DeviceInventory,
    DeviceRequest,
    DeviceResult,
    DeviceShape,
    DeviceState,
    DeviceTaint,
    DeviceToleration,
    NodeDevices,
    RequestPolicy,
)
from controller.fit.types import (
    NodeState,
    PodShape,
    PoolState,
    SelectorRequirement,
    SelectorTerm,
)

NEW_NODE_POOL = ""
"""Pool name of a template device when the template does not name one (the NVIDIA driver
names the pool after the node, which does not exist yet)."""


class DraError(ValueError):
    """A DRA object that cannot be used (names the object and field)."""


def _units(value: str | int | float) -> int:
    """A device quantity in base units, rounded up (bytes, counts; never millicores)."""
    q = parse_quantity(value)
    if q < 0:
        raise ValueError(f"negative quantity {value!r}")
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def qualify(name: str, driver: str) -> str:
    """Unprefixed attribute/capacity names belong to the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


def attribute_value(attr: ApiAttribute, where: str) -> AttrValue:
    if attr.int_ is not None:
        return attr.int_
    if attr.bool_ is not None:
        return attr.bool_
    if attr.string is not None:
        return attr.string
    assert attr.version is not None  # the model guarantees exactly one value
    try:
        return SemVer.parse(attr.version)
    except ValueError as exc:
        raise DraError(f"{where}: {exc}") from exc


# ---------------------------------------------------------------------------- catalog


@dataclass
class DraCatalog:
    """The DRA objects of a cluster (what ``build_snapshot`` and ``gang_of`` need)."""

    slices: list[ResourceSlice] = field(default_factory=list)
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    claims: dict[tuple[str, str], ResourceClaim] = field(default_factory=dict)
    """(namespace, name) ->."""
    templates: dict[tuple[str, str], ResourceClaimTemplate] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        slices: Iterable[ResourceSlice] = (),
        classes: Iterable[DeviceClass] = (),
        claims: Iterable[ResourceClaim] = (),
        templates: Iterable[ResourceClaimTemplate] = (),
    ) -> DraCatalog:
        return cls(
            list(slices),
            {c.metadata.name: c for c in classes},
            {(c.metadata.namespace or "default", c.metadata.name): c for c in claims},
            {(t.metadata.namespace or "default", t.metadata.name): t for t in templates},
        )

    def __bool__(self) -> bool:
        return bool(self.slices or self.classes or self.claims or self.templates)


# ---------------------------------------------------------------------------- devices


def _policy(cap: Any) -> RequestPolicy | None:
    pol = cap.request_policy
    if pol is None:
        return None
    rng = pol.valid_range
    return RequestPolicy(
        default=_units(pol.default) if pol.default is not None else None,
        valid_values=tuple(sorted(_units(v) for v in pol.valid_values)),
        min=_units(rng.min) if rng else None,
        max=_units(rng.max) if rng and rng.max is not None else None,
        step=_units(rng.step) if rng and rng.step is not None else None,
    )


def _device(
    dev: ApiDevice, driver: str, pool: int, where: str
) -> tuple[Device, dict[str, AttrValue]]:
    attrs = {qualify(k, driver): attribute_value(v, f"{where} attribute {k}")
             for k, v in dev.attributes.items()}
    try:
        capacity = {qualify(k, driver): _units(v.value) for k, v in dev.capacity.items()}
        policies = {qualify(k, driver): p for k, v in dev.capacity.items()
                    if (p := _policy(v)) is not None}
        consumes = tuple(
            CounterUse(c.counter_set, {n: _units(x.value) for n, x in c.counters.items()})
            for c in dev.consumes_counters
        )
    except ValueError as exc:
        raise DraError(f"{where}: {exc}") from exc
    taints = tuple(DeviceTaint(t.key, t.value, t.effect) for t in dev.taints)
    return Device(dev.name, driver, pool, attrs, capacity, policies, consumes,
                  dev.allow_multiple_allocations, taints), attrs


def current_slices(slices: Iterable[ResourceSlice]) -> list[ResourceSlice]:
    """Slices of the newest generation of each (driver, pool), for complete pools only
    (the scheduler does not allocate from a pool it has not seen every slice of)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        newest[key] = max(newest.get(key, -1), s.spec.pool.generation)
    groups: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        if s.spec.pool.generation == newest[key]:
            groups.setdefault(key, []).append(s)
    out: list[ResourceSlice] = []
    for key in sorted(groups):
        group = groups[key]
        if len(group) >= group[0].spec.pool.resource_slice_count:
            out.extend(sorted(group, key=lambda s: s.metadata.name))
    return out


@dataclass(frozen=True)
class _SliceLike:
    driver: str
    pool: str
    devices: Sequence[ApiDevice]
    counters: Mapping[str, Mapping[str, int]]
    name: str


class Interner:
    """Equal inventories (and inventory + state pairs) as one shared object, so the engine
    tells identical nodes apart by identity."""

    def __init__(self) -> None:
        self.inventories: dict[tuple[object, ...], DeviceInventory] = {}
        self.shapes: dict[tuple[int, DeviceState], DeviceShape] = {}

    def inventory(
        self,
        devices: tuple[Device, ...],
        counters: Mapping[CounterKey, Mapping[str, int]],
        identity: frozenset[str],
    ) -> DeviceInventory:
        key = (
            tuple(
                (d.name, d.driver, d.pool, tuple(sorted((k, type(v).__name__, str(v))
                                                        for k, v in d.attributes.items())),
                 tuple(sorted(d.capacity.items())), tuple(sorted(d.policies.items())),
                 tuple((c.counter_set, tuple(sorted(c.counters.items()))) for c in d.consumes),
                 d.allow_multiple, d.taints)
                for d in devices
            ),
            tuple(sorted((k, tuple(sorted(v.items()))) for k, v in counters.items())),
            identity,
        )
        got = self.inventories.get(key)
        if got is None:
            got = DeviceInventory(devices, dict(counters), identity)
            self.inventories[key] = got
        return got

    def shape(self, inventory: DeviceInventory, state: DeviceState) -> DeviceShape:
        key = (id(inventory), state)
        got = self.shapes.get(key)
        if got is None:
            got = DeviceShape(inventory, state)
            self.shapes[key] = got
        return got


def _build_node(
    parts: Sequence[_SliceLike], identity_names: frozenset[str], interner: Interner,
) -> tuple[DeviceInventory, tuple[str, ...], tuple[dict[str, AttrValue], ...]]:
    pools: list[str] = []
    devices: list[Device] = []
    identity: list[dict[str, AttrValue]] = []
    counters: dict[CounterKey, Mapping[str, int]] = {}
    for part in parts:
        if part.pool not in pools:
            pools.append(part.pool)
        pi = pools.index(part.pool)
        for set_name, values in part.counters.items():
            counters[(part.driver, pi, set_name)] = values
        for dev in part.devices:
            where = f"ResourceSlice {part.name} device {dev.name}"
            built, attrs = _device(dev, part.driver, pi, where)
            own = {k: v for k, v in attrs.items() if k in identity_names}
            if own:
                built = replace(built, attributes={k: v for k, v in attrs.items()
                                                   if k not in identity_names})
            devices.append(built)
            identity.append(own)
    used_identity = frozenset(k for ident in identity for k in ident)
    inv = interner.inventory(tuple(devices), counters, used_identity)
    return inv, tuple(pools), tuple(identity)


def _counters(sets: Sequence[Any], where: str) -> dict[str, dict[str, int]]:
    try:
        return {cs.name: {n: _units(c.value) for n, c in cs.counters.items()} for cs in sets}
    except ValueError as exc:
        raise DraError(f"{where}: sharedCounters: {exc}") from exc


def _raw(attr: ApiAttribute) -> tuple[str, str]:
    for kind, value in (("int", attr.int_), ("bool", attr.bool_), ("string", attr.string),
                        ("version", attr.version)):
        if value is not None:
            return kind, str(value)
    return "", ""


def identity_attributes(slices: Iterable[ResourceSlice]) -> frozenset[str]:
    """Qualified attribute names whose values never repeat across devices (uuid, serial)."""
    seen: dict[str, dict[tuple[str, str], int]] = {}
    for s in slices:
        for dev in s.spec.devices:
            for name, attr in dev.attributes.items():
                q = qualify(name, s.spec.driver)
                value = _raw(attr)
                counts = seen.setdefault(q, {})
                counts[value] = counts.get(value, 0) + 1
    return frozenset(name for name, counts in seen.items()
                     if len(counts) > 1 and all(c == 1 for c in counts.values()))


def node_devices(
    slices: Sequence[ResourceSlice],
    claims: Iterable[ResourceClaim] = (),
) -> dict[str, NodeDevices]:
    """Node name -> its devices, with allocated claims marked as used."""
    current = current_slices(slices)
    identity_names = identity_attributes(current)
    by_node: dict[str, list[_SliceLike]] = {}
    for s in current:
        if not s.spec.node_name:
            continue  # network-attached devices (nodeSelector/allNodes) are not planned
        where = f"ResourceSlice {s.metadata.name}"
        by_node.setdefault(s.spec.node_name, []).append(
            _SliceLike(s.spec.driver, s.spec.pool.name, s.spec.devices,
                       _counters(s.spec.shared_counters, where), s.metadata.name)
        )
    interner = Interner()
    built: dict[str, tuple[DeviceInventory, tuple[str, ...], tuple[dict[str, AttrValue], ...]]]
    built = {node: _build_node(parts, identity_names, interner)
             for node, parts in sorted(by_node.items())}
    by_pool: dict[str, list[DeviceResult]] = {}
    for r in _claim_results(claims):
        by_pool.setdefault(r.pool, []).append(r)
    out: dict[str, NodeDevices] = {}
    for node, (inv, pools, ident) in built.items():
        devices = NodeDevices(interner.shape(inv, EMPTY_STATE), pools, ident if any(ident) else ())
        mine = [r for p in pools for r in by_pool.get(p, ())]
        if mine:
            devices = book(devices, mine)
            devices = NodeDevices(interner.shape(inv, devices.shape.state), pools,
                                  devices.identity)
        out[node] = devices
    return out


def _claim_results(claims: Iterable[ResourceClaim]) -> list[DeviceResult]:
    """Devices held by allocated claims (capacity names qualified by the result's driver)."""
    out: list[DeviceResult] = []
    for claim in claims:
        alloc = claim.status.allocation
        if alloc is None:
            continue
        for r in alloc.devices.results:
            try:
                consumed = {qualify(k, r.driver): _units(v)
                            for k, v in r.consumed_capacity.items()}
            except ValueError as exc:
                raise DraError(f"ResourceClaim {claim.metadata.namespace}/"
                               f"{claim.metadata.name}: consumedCapacity: {exc}") from exc
            out.append(DeviceResult(r.request, r.driver, r.pool, r.device, consumed,
                                    bool(r.admin_access)))
    return out


def template_devices(
    pool_name: str, templates: Sequence[ResourceSliceTemplate], interner: Interner | None = None
) -> NodeDevices:
    """The devices a CapacityPool's new node will publish (``interner``: share equal
    inventories between pools, so the engine searches each kind of node once)."""
    interner = interner or Interner()
    parts = []
    for i, t in enumerate(templates):
        where = f"CapacityPool {pool_name} spec.nodeTemplate.resourceSlices[{i}]"
        parts.append(_SliceLike(t.driver, t.pool.name if t.pool else NEW_NODE_POOL,
                                t.devices, _counters(t.shared_counters, where), where))
    inv, pools, _ = _build_node(parts, frozenset(), interner)
    return NodeDevices(interner.shape(inv, EMPTY_STATE), pools, ())


# ---------------------------------------------------------------------------- claims


def _tolerations(items: Sequence[Any]) -> tuple[DeviceToleration, ...]:
    return tuple(DeviceToleration(t.key, t.operator, t.value, t.effect) for t in items)


class _Missing(DraError):
    """A referenced object that is not (yet) in the cache."""

    def __init__(self, text: str, missing: str) -> None:
        super().__init__(text)
        self.missing = missing


def _request(
    name: str, req: ExactDeviceRequest | DeviceSubRequest, source: str, catalog: DraCatalog,
) -> DeviceRequest:
    cls = catalog.classes.get(req.device_class_name)
    if cls is None:
        raise _Missing(
            f"{source} request {name}: DeviceClass {req.device_class_name} not found",
            f"DeviceClass {req.device_class_name}",
        )
    selectors = [
        compile_selector(s.cel.expression, f"DeviceClass {req.device_class_name}")
        for s in cls.spec.selectors
    ]
    selectors.extend(
        compile_selector(s.cel.expression, f"{source} request {name}") for s in req.selectors
    )
    try:
        capacity = {k: _units(v) for k, v in (req.capacity.requests if req.capacity else {}
                                              ).items()}
    except ValueError as exc:
        raise DraError(f"{source} request {name}: capacity.requests: {exc}") from exc
    return DeviceRequest(
        name=name,
        device_class=req.device_class_name,
        selectors=tuple(selectors),
        mode=req.allocation_mode,
        count=req.exact_count,
        capacity=capacity,
        tolerations=_tolerations(req.tolerations),
        admin_access=isinstance(req, ExactDeviceRequest) and bool(req.admin_access),
    )


def claim_shape(name: str, source: str, devices: DeviceClaim, catalog: DraCatalog) -> ClaimShape:
    """One pod claim; problems become ``ClaimShape.error`` (the engine answers Invalid)."""
    try:
        requests: list[ClaimRequest] = []
        for r in devices.requests:
            alts: tuple[DeviceRequest, ...]
            if r.exactly is not None:
                alts = (_request(r.name, r.exactly, source, catalog),)
            else:
                alts = tuple(_request(f"{r.name}/{s.name}", s, source, catalog)
                             for s in r.first_available)
            requests.append(ClaimRequest(r.name, alts))
        constraints = tuple(
            DeviceConstraint(tuple(c.requests), c.match_attribute, c.distinct_attribute)
            for c in devices.constraints
        )
    except _Missing as exc:
        return ClaimShape(name, source, (), error=str(exc), missing=(exc.missing,))
    except (DraError, SelectorError) as exc:
        return ClaimShape(name, source, (), error=str(exc))
    return ClaimShape(name, source, tuple(requests), constraints)


def _selector_terms(selector: NodeSelector) -> tuple[SelectorTerm, ...]:
    return tuple(
        SelectorTerm(
            tuple(SelectorRequirement(r.key, r.operator, tuple(r.values))
                  for r in t.match_expressions),
            tuple(SelectorRequirement(r.key, r.operator, tuple(r.values))
                  for r in t.match_fields),
        )
        for t in selector.node_selector_terms
    )


def _and_terms(
    a: tuple[SelectorTerm, ...], b: tuple[SelectorTerm, ...]
) -> tuple[SelectorTerm, ...]:
    """(a1 or a2) and (b1 or b2) as ORed terms; empty ``a`` means unconstrained."""
    if not a:
        return b
    return tuple(
        SelectorTerm(x.match_expressions + y.match_expressions, x.match_fields + y.match_fields)
        for x in a for y in b
    )


def with_claims(shape: PodShape, spec: PodSpec, namespace: str,
                catalog: DraCatalog) -> PodShape:
    """``shape`` plus the pod's ResourceClaims: a claim from a template per pod; a shared
    claim already allocated pins the pod to the allocation's nodes; a shared claim not
    allocated yet is reported as unsupported (Invalid)."""
    if not spec.resource_claims:
        return shape
    claims: list[ClaimShape] = []
    terms = shape.affinity_terms
    for ref in spec.resource_claims:
        if ref.resource_claim_template_name:
            source = f"ResourceClaimTemplate {namespace}/{ref.resource_claim_template_name}"
            template = catalog.templates.get((namespace, ref.resource_claim_template_name))
            if template is None:
                claims.append(ClaimShape(ref.name, source, (), error=f"{source} not found",
                                         missing=(source,)))
                continue
            claims.append(claim_shape(ref.name, source, template.spec.spec.devices, catalog))
        elif ref.resource_claim_name:
            source = f"ResourceClaim {namespace}/{ref.resource_claim_name}"
            claim = catalog.claims.get((namespace, ref.resource_claim_name))
            if claim is None:
                claims.append(ClaimShape(ref.name, source, (), error=f"{source} not found",
                                         missing=(source,)))
                continue
            alloc = claim.status.allocation
            if alloc is None:
                claims.append(ClaimShape(
                    ref.name, source, (),
                    error=f"{source} is shared by the pods and not allocated yet; Muster "
                    "plans claims from ResourceClaimTemplates (one per pod) and shared "
                    "claims that are already allocated",
                ))
                continue
            if alloc.node_selector is not None:
                terms = _and_terms(terms, _selector_terms(alloc.node_selector))
        else:
            claims.append(ClaimShape(
                ref.name, f"pod claim {ref.name}", (),
                error=f"pod claim {ref.name}: needs resourceClaimName or "
                "resourceClaimTemplateName",
            ))
    return replace(shape, claims=tuple(claims), affinity_terms=terms)


# ---------------------------------------------------------------------------- wiring


def attach_devices(
    nodes: Sequence[NodeState],
    pool_states: Sequence[PoolState],
    pools: Sequence[CapacityPool],
    dra: DraCatalog | None,
) -> tuple[list[NodeState], tuple[PoolState, ...]]:
    """Node states with their devices, pool states with their template devices."""
    by_node = node_devices(dra.slices, dra.claims.values()) if dra else {}
    out_nodes = [
        replace(n, devices=by_node[n.name]) if n.name in by_node else n for n in nodes
    ]
    templates = {p.metadata.name: p.spec.node_template.resource_slices for p in pools}
    interner = Interner()
    out_pools = tuple(
        replace(p, devices=template_devices(p.name, templates[p.name], interner))
        if templates.get(p.name) else p
        for p in pool_states
    )
    return out_nodes, out_pools


M = TypeVar("M", bound=BaseModel)
Parser = Callable[[type[BaseModel], Mapping[str, Any]], BaseModel]


def _of_kind(
    docs: Sequence[Mapping[str, Any]], kind: str, model: type[M], parse: Parser
) -> list[M]:
    out: list[M] = []
    for d in docs:
        if d.get("kind") == kind:
            obj = parse(model, d)
            assert isinstance(obj, model)
            out.append(obj)
    return out


def catalog_from_documents(docs: Iterable[Mapping[str, Any]], parse: Parser) -> DraCatalog:
    """The DRA objects among ``docs`` (``parse`` validates one object, naming it on error)."""
    items = list(docs)
    return DraCatalog.of(
        _of_kind(items, "ResourceSlice", ResourceSlice, parse),
        _of_kind(items, "DeviceClass", DeviceClass, parse),
        _of_kind(items, "ResourceClaim", ResourceClaim, parse),
        _of_kind(items, "ResourceClaimTemplate", ResourceClaimTemplate, parse),
    )
