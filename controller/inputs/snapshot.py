"""From API objects to the fit engine's input: :class:`Snapshot` and :class:`GangRequest`.

The one converter between the boundary (pydantic models, raw YAML/JSON dicts) and the pure
engine (frozen dataclasses): quantities become integers, pod specs become
:class:`PodShape`s, topology annotations become :class:`TopologyRequest`s, Nodes and bound
Pods become free capacity, CapacityPools become :class:`PoolState`s with their headroom.
Raw dicts never reach ``controller.fit``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from controller.api.capacitypool import CapacityPool
from controller.api.node import Node
from controller.api.pod import Pod, PodSpec, PodTemplate
from controller.api.provisioningrequest import ProvisioningRequest
from controller.api.quantity import to_resources
from controller.api.validation import (
    pod_template_problems,
    request_unknown_fields,
    unknown_fields,
)
from controller.common.topology_defaults import (
    DEFAULT_LEVELS,
    DEFAULT_PODS_PER_NODE,
    FRESH_PREFIX,
    KUEUE_PREFERRED,
    KUEUE_REQUIRED,
    KUEUE_UNCONSTRAINED,
    MUSTER_PREFERRED,
    MUSTER_REQUIRED,
    POOL_LABEL,
    foreign_level,
)
from controller.fit.ports import port_resources, unlisted
from controller.fit.taints import effective_taints
from controller.fit.types import (
    GangRequest,
    NodeState,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    Resources,
    Taint,
    Toleration,
    TopologyMode,
    TopologyRequest,
)
from controller.fit.types import Snapshot as FitSnapshot
from controller.inputs.constraints import BoundPod, PodSetFacts, inter_pod, node_affinity_terms
from controller.inputs.dra_snapshot import (
    DraCatalog,
    DraError,
    attach_devices,
    catalog_from_documents,
    with_claims,
)
from controller.inputs.node_labels import node_labels
from controller.inputs.tas_slices import SLICE_SIZE, kueue_problems, slice_request, unconstrained

MAX_FRESH_DOMAINS = 64
"""Placeholder domains synthesized per fresh-domain pool (enough for any single gang)."""

M = TypeVar("M", bound=BaseModel)


class SnapshotError(ValueError):
    """Input that cannot be turned into a snapshot or request (names the object/field)."""


class InvalidTemplate(SnapshotError):
    """A PodTemplate the API server would refuse, or whose topology annotations contradict
    each other or the request (names the template and the field)."""


# ---------------------------------------------------------------------------- requests


def pod_requests(spec: PodSpec) -> dict[str, int]:
    """What one pod takes of its node: its effective requests, one ``pods`` slot, and its
    host ports as resources (:mod:`controller.fit.ports`)."""
    requests = spec.effective_requests()
    requests["pods"] = requests.get("pods", 0) + 1
    ports = spec.host_ports()
    if ports:
        for res, amount in port_resources(ports).items():
            requests[res] = requests.get(res, 0) + amount
    return requests


def shape_of(spec: PodSpec) -> PodShape:
    """The placement-relevant view of one pod; every pod also takes one ``pods`` slot."""
    requests = pod_requests(spec)
    terms = node_affinity_terms(spec)
    tolerations = tuple(
        Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
        for t in spec.tolerations
    )
    return PodShape(
        requests=requests,
        node_selector=dict(spec.node_selector),
        affinity_terms=terms,
        tolerations=tolerations,
        node_name=spec.node_name or None,
    )


def resolve_level(value: str, levels: Sequence[str]) -> str:
    """A level given as a full label key or as its last segment ("rack")."""
    if value in levels:
        return value
    short = [lv for lv in levels if lv.rsplit("/", 1)[-1] == value]
    return short[0] if len(short) == 1 else value


def topology_conflicts(annotations: Mapping[str, str]) -> list[str]:
    """Topology annotations of one template that contradict each other (Kueue's webhook
    refuses more than one of its own; Muster's two exclude each other; a Muster annotation
    naming another constraint than Kueue's is a contradiction, not a precedence)."""
    out = []
    muster = [k for k in (MUSTER_REQUIRED, MUSTER_PREFERRED) if annotations.get(k)]
    if len(muster) > 1:
        out.append(f"metadata.annotations: {' and '.join(muster)} are both set")
    # Kueue's own annotations, as its webhook checks them (presence counts, whatever the
    # value); an unconstrained=false asks for nothing a Muster annotation could contradict.
    out.extend(kueue_problems(annotations))
    kueue = [k for k in (KUEUE_REQUIRED, KUEUE_PREFERRED) if k in annotations]
    if unconstrained(annotations):
        kueue.append(KUEUE_UNCONSTRAINED)
    if len(muster) == 1 and len(kueue) == 1:
        mode = {MUSTER_REQUIRED: "required", MUSTER_PREFERRED: "preferred"}[muster[0]]
        other = {KUEUE_REQUIRED: "required", KUEUE_PREFERRED: "preferred",
                 KUEUE_UNCONSTRAINED: "unconstrained"}[kueue[0]]
        if (mode, annotations[muster[0]]) != (other, annotations.get(kueue[0])):
            out.append(f"metadata.annotations: {muster[0]}={annotations[muster[0]]} "
                       f"contradicts {kueue[0]}={annotations[kueue[0]]}")
    return out


def topology_of(annotations: Mapping[str, str], levels: Sequence[str]) -> TopologyRequest:
    """Muster's annotations first, then Kueue's TAS pod-set annotations, else none.

    An unknown level is passed through unchanged so the engine reports it as Invalid.
    """
    for key, mode in (
        (MUSTER_REQUIRED, TopologyMode.REQUIRED),
        (MUSTER_PREFERRED, TopologyMode.PREFERRED),
    ):
        if annotations.get(key):
            return TopologyRequest(mode, resolve_level(annotations[key], levels))
    if unconstrained(annotations):
        return TopologyRequest()
    for key, mode in (
        (KUEUE_REQUIRED, TopologyMode.REQUIRED),
        (KUEUE_PREFERRED, TopologyMode.PREFERRED),
    ):
        if annotations.get(key):
            return TopologyRequest(mode, resolve_level(annotations[key], levels))
    return TopologyRequest()


def pod_set_name(template_name: str, request_name: str) -> str:
    """Kueue names templates ``ppt-<pr>-<podset>``; recover the pod set name from that."""
    prefix = f"ppt-{request_name}-"
    return template_name[len(prefix):] if template_name.startswith(prefix) else template_name


def gang_of(
    request: ProvisioningRequest,
    templates: Mapping[str, PodTemplate],
    levels: Sequence[str] = DEFAULT_LEVELS,
    dra: DraCatalog | None = None,
    bound: Sequence[BoundPod] | None = None,
) -> GangRequest:
    """One pod set per ``spec.podSets`` entry; SnapshotError names a missing template.
    ``dra``: DeviceClasses, ResourceClaimTemplates and ResourceClaims the pods' claims use.
    ``bound``: the running pods, for required pod (anti-)affinity (None: not known, so a
    term that could select one is refused; see :mod:`controller.inputs.constraints`)."""
    name = request.metadata.name
    namespace = request.metadata.namespace or "default"
    pod_sets: list[PodSetRequest] = []
    used: set[str] = set()
    facts: list[PodSetFacts] = []
    for i, ps in enumerate(request.spec.pod_sets):
        ref = ps.pod_template_ref.name
        template = templates.get(ref)
        if template is None:
            raise SnapshotError(
                f"spec.podSets[{i}].podTemplateRef.name: PodTemplate {ref} not found"
            )
        set_name = pod_set_name(ref, name)
        if set_name in used:
            set_name = f"{set_name}-{i}"
        used.add(set_name)
        facts.append(PodSetFacts(set_name, template.template.metadata.labels))
    for i, ps in enumerate(request.spec.pod_sets):
        ref = ps.pod_template_ref.name
        template = templates[ref]
        set_name = facts[i].name
        spec = template.template.spec
        # What the API server would refuse first: reading the pods' requests fails on some
        # of it (a negative quantity), and that must be said as the field it is.
        problems = [*pod_template_problems(template),
                    *topology_conflicts(template.template.metadata.annotations)]
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise InvalidTemplate(f"PodTemplate {ref}: {problems[0]}{more}")
        try:
            shape = with_claims(shape_of(spec), spec, namespace, dra or DraCatalog())
        except ValueError as exc:
            raise SnapshotError(f"PodTemplate {ref}: {exc}") from exc
        annotations = template.template.metadata.annotations
        topology = topology_of(annotations, levels)
        shape, topology = inter_pod(
            spec, shape, topology, own=facts[i], namespace=namespace,
            others=[f for j, f in enumerate(facts) if j != i], levels=levels, bound=bound,
        )
        try:
            sliced = slice_request(annotations, levels)
        except ValueError as exc:
            raise InvalidTemplate(f"PodTemplate {ref}: {exc}") from exc
        if sliced is not None and ps.count % sliced[1]:
            raise InvalidTemplate(
                f"PodTemplate {ref}: metadata.annotations[{SLICE_SIZE}]: {sliced[1]} does not "
                f"divide spec.podSets[{i}].count {ps.count}"
            )
        if sliced is not None:
            topology = replace(topology, slice_level=sliced[0], slice_size=sliced[1])
        pod_sets.append(PodSetRequest(set_name, ps.count, shape, topology))
    return GangRequest(f"{request.metadata.namespace or 'default'}/{name}", tuple(pod_sets))


# ---------------------------------------------------------------------------- cluster


def node_allocatable(node: Node) -> dict[str, int]:
    """What the scheduler counts on an existing node: ``status.allocatable`` (the API server
    defaults it to capacity when a node reports none) and nothing else. A node that lists no
    ``pods`` takes no pod: the scheduler allows ``allocatable.pods`` pods, 0 when unlisted
    (NodeResourcesFit, "Too many pods"); every kubelet reports it."""
    return to_resources(node.allocatable())


def usage_by_node(pods: Iterable[Pod]) -> dict[str, dict[str, int]]:
    """Requests of bound pods that still hold capacity, summed per node."""
    usage: dict[str, dict[str, int]] = {}
    for pod in pods:
        if not pod.holds_capacity or pod.spec.node_name is None:
            continue
        slot = usage.setdefault(pod.spec.node_name, {})
        requests = pod_requests(pod.spec)
        for res, amount in requests.items():
            slot[res] = slot.get(res, 0) + amount
    return usage


def node_state(
    node: Node,
    used: Mapping[str, int] | None = None,
    booked: Resources | None = None,
    *,
    taint_cache: dict[tuple[Taint, ...], tuple[Taint, ...]] | None = None,
) -> NodeState:
    """Free = allocatable - bound pods' requests - capacity booked by other requests.

    ``taint_cache`` shares equal taint tuples between nodes: the engine groups nodes by the
    identity of their taint tuple first, which is much cheaper than hashing taints.
    """
    allocatable = node_allocatable(node)
    free = dict(allocatable)
    for taken in (used or {}, booked or {}):
        for res, amount in taken.items():
            have = free.get(res)
            free[res] = (unlisted(res) if have is None else have) - amount
    taints = effective_taints(
        (Taint(t.key, t.value, t.effect) for t in node.spec.taints),
        node.condition_statuses(), unschedulable=node.spec.unschedulable,
    )
    if taint_cache is not None:
        taints = taint_cache.setdefault(taints, taints)
    labels = dict(node.metadata.labels)
    return NodeState(
        name=node.metadata.name,
        labels=labels,
        taints=taints,
        allocatable=allocatable,
        free=free,
        schedulable=node.usable,
        pool=labels.get(POOL_LABEL),
    )


def _pool_nodes(pool: CapacityPool, nodes: Iterable[Node]) -> tuple[int, list[int]]:
    """(the pool's nodes, how many of them lie in each declared domain) in one pass.

    A node lies in a domain when it carries every label the domain declares. Domains are
    indexed by the label keys they declare (one set of keys in practice), so the pass costs
    one lookup per node, not one per domain: the controller rebuilds headroom whenever
    nodes come or go.
    """
    name = pool.metadata.name
    topo = pool.spec.topology
    declared = topo.domains if topo else []
    by_keys: dict[tuple[str, ...], dict[tuple[str | None, ...], list[int]]] = {}
    for i, d in enumerate(declared):
        keys = tuple(sorted(d.labels))
        by_keys.setdefault(keys, {}).setdefault(tuple(d.labels[k] for k in keys), []).append(i)
    per = [0] * len(declared)
    total = 0
    for node in nodes:
        labels = node.metadata.labels
        if labels.get(POOL_LABEL) != name:
            continue
        total += 1
        for keys, index in by_keys.items():
            for i in index.get(tuple([labels.get(k) for k in keys]), ()):
                per[i] += 1
    return total, per


def pool_state(
    pool: CapacityPool,
    nodes: Sequence[Node],
    levels: Sequence[str] = DEFAULT_LEVELS,
    *,
    in_flight: int | None = None,
) -> PoolState:
    """Headroom of one pool given the nodes it already has: the pool-wide ``maxNodes``
    minus the pool's nodes, each declared domain's limit minus its nodes, capped by the
    pool's headroom. The one headroom rule, for ``muster fit`` and the controller's cache
    alike (``nodes`` may be every node or only the pool's).

    ``in_flight``: nodes acquired but not registered yet (defaults to
    ``status.inFlightNodes``); they count against ``maxNodes`` like registered ones.
    """
    name = pool.metadata.name
    spec = pool.spec
    have, per_domain = _pool_nodes(pool, nodes)
    pending = pool.status.in_flight_nodes if in_flight is None else in_flight
    max_new = max(0, spec.max_nodes - have - pending)
    template = spec.node_template
    try:
        allocatable = to_resources(template.allocatable)
    except ValueError as exc:
        raise SnapshotError(f"CapacityPool {name}: spec.nodeTemplate.allocatable.{exc}") from exc
    allocatable.setdefault("pods", DEFAULT_PODS_PER_NODE)
    # What every new node carries: the template's labels and what its kubelet and cloud add
    # (its hostname, unknown yet, is the engine's to give).
    labels = {**node_labels(template.labels, parameters=spec.parameters), POOL_LABEL: name}
    taints = tuple(Taint(t.key, t.value, t.effect) for t in template.taints)
    topo = spec.topology
    domains: list[PoolDomain] = []
    if topo is None:
        domains.append(PoolDomain(labels={}, max_new_nodes=max_new))
    elif topo.domains:
        for d, there in zip(topo.domains, per_domain, strict=True):
            limit = d.max_nodes if d.max_nodes is not None else topo.max_nodes_per_domain
            domains.append(
                PoolDomain(dict(d.labels), max(0, min(limit - there, max_new)),
                           max_nodes=limit, pool_nodes=there)
            )
    else:
        # Every acquisition creates a fresh domain (e.g. a new placement group): offer
        # placeholder domains labelled down to the acquisition level, with the levels the
        # pool's nodes can carry (another cloud's topology, in a hierarchy spanning clouds,
        # is never on them: planned there, no node of the pool would be in the domain).
        upto = [lv for lv in levels[: levels.index(topo.level) + 1]
                if not foreign_level(lv, spec.provider)] if topo.level in levels else [
            topo.level
        ]
        count = min(MAX_FRESH_DOMAINS, math.ceil(max_new / topo.max_nodes_per_domain))
        for k in range(count):
            value = f"{FRESH_PREFIX}-{name}-{k}"
            domains.append(
                PoolDomain(
                    {level: value for level in upto},
                    min(topo.max_nodes_per_domain, max_new),
                    max_nodes=topo.max_nodes_per_domain,
                )
            )
    return PoolState(
        name=name,
        labels=labels,
        taints=taints,
        allocatable=allocatable,
        domains=tuple(domains),
        max_new_nodes=max_new,
        price_per_node_hour=spec.price_per_node_hour,
        acquisition_level=topo.level if topo else None,
        ready_seconds=spec.expected_ready_seconds,
        booked_nodes=pending,
    )


def build_snapshot(
    nodes: Sequence[Node],
    pods: Iterable[Pod] = (),
    pools: Sequence[CapacityPool] = (),
    levels: Sequence[str] = DEFAULT_LEVELS,
    *,
    booked: Mapping[str, Resources] | None = None,
    dra: DraCatalog | None = None,
) -> FitSnapshot:
    """The engine's view of the cluster. ``booked``: per node, capacity other requests hold.
    ``dra``: ResourceSlices (devices per node) and ResourceClaims (allocated devices)."""
    usage = usage_by_node(pods)
    booked = booked or {}
    states = []
    taint_cache: dict[tuple[Taint, ...], tuple[Taint, ...]] = {}
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        name = node.metadata.name
        try:
            states.append(
                node_state(node, usage.get(name), booked.get(name), taint_cache=taint_cache)
            )
        except ValueError as exc:
            raise SnapshotError(f"Node {node.metadata.name}: status.allocatable.{exc}") from exc
    pool_states = tuple(
        pool_state(p, nodes, levels) for p in sorted(pools, key=lambda p: p.metadata.name)
    )
    try:
        states, pool_states = attach_devices(states, pool_states, pools, dra)
    except DraError as exc:
        raise SnapshotError(str(exc)) from exc
    return FitSnapshot(nodes=tuple(states), pools=pool_states, levels=tuple(levels))


# ---------------------------------------------------------------------------- YAML files


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every object in a (multi-document) YAML file; ``kind: List`` is flattened."""
    try:
        raw = list(yaml.safe_load_all(path.read_text()))
    except OSError as exc:
        raise SnapshotError(f"{path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise SnapshotError(f"{path}: not a text file (not UTF-8); expected YAML") from None
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    out: list[dict[str, Any]] = []
    for doc in raw:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise SnapshotError(f"{path}: every document must be a Kubernetes object")
        if doc.get("kind") == "List" or (doc.get("kind", "").endswith("List") and "items" in doc):
            items = doc.get("items") or []
            out.extend(i for i in items if isinstance(i, dict))
        else:
            out.append(doc)
    return out


def by_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def error_location(loc: Sequence[int | str]) -> str:
    """pydantic's ``('spec', 'podSets', 0, 'count')`` as ``spec.podSets[0].count``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def parse_object(model: type[M], doc: Mapping[str, Any]) -> M:
    """Validate one object; SnapshotError with a one-line ``field: problem`` message."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        what = f"{doc.get('kind', model.__name__)} {name}: " if name else (
            f"{doc.get('kind', model.__name__)}: "
        )
        where = error_location(first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SnapshotError(f"{what}{where}: {first['msg']}{more}") from exc


def request_from_documents(
    docs: Sequence[Mapping[str, Any]],
    levels: Sequence[str] = DEFAULT_LEVELS,
    cluster: Sequence[Mapping[str, Any]] = (),
) -> tuple[ProvisioningRequest, GangRequest]:
    """The ProvisioningRequest in ``docs`` and its gang (templates from the same docs; DRA
    objects from ``docs`` and ``cluster``). PodTemplates are read with strict field
    validation: a field the API server does not know is an error, as with ``kubectl``."""
    for d in by_kind(docs, "PodTemplate"):
        unknown = unknown_fields(d)
        if unknown:
            name = (d.get("metadata") or {}).get("name")
            raise InvalidTemplate(f"PodTemplate {name}: {unknown[0]}")
    requests = by_kind(docs, "ProvisioningRequest")
    if len(requests) != 1:
        raise SnapshotError(
            f"expected exactly one ProvisioningRequest, found {len(requests)}"
        )
    unknown = request_unknown_fields(requests[0])
    if unknown:
        name = (requests[0].get("metadata") or {}).get("name")
        raise SnapshotError(f"ProvisioningRequest {name}: {unknown[0]}")
    request = parse_object(ProvisioningRequest, requests[0])
    templates = {
        t.metadata.name: t
        for t in (parse_object(PodTemplate, d) for d in by_kind(docs, "PodTemplate"))
    }
    dra = catalog_from_documents([*docs, *cluster], parse_object)
    nodes = [parse_object(Node, d) for d in by_kind(cluster, "Node")]
    pods = [parse_object(Pod, d) for d in by_kind(cluster, "Pod")]
    return request, gang_of(request, templates, levels, dra, bound_pods(nodes, pods))


def bound_pods(nodes: Iterable[Node], pods: Iterable[Pod]) -> list[BoundPod]:
    """The pods running on ``nodes``, for inter-pod constraints."""
    labels = {n.metadata.name: n.metadata.labels for n in nodes}
    out = []
    for pod in pods:
        node = pod.spec.node_name
        if not pod.holds_capacity or node is None or node not in labels:
            continue
        aff = pod.spec.affinity
        anti = tuple(aff.pod_anti_affinity.required) if aff and aff.pod_anti_affinity else ()
        out.append(BoundPod(pod.metadata.namespace or "default", pod.metadata.labels,
                            labels[node], anti, node=node))
    return out


def snapshot_from_documents(
    cluster: Sequence[Mapping[str, Any]],
    pools: Sequence[Mapping[str, Any]] = (),
    levels: Sequence[str] = DEFAULT_LEVELS,
) -> FitSnapshot:
    nodes = [parse_object(Node, d) for d in by_kind(cluster, "Node")]
    pods = [parse_object(Pod, d) for d in by_kind(cluster, "Pod")]
    pool_objs = [parse_object(CapacityPool, d) for d in by_kind([*cluster, *pools],
                                                                  "CapacityPool")]
    dra = catalog_from_documents(cluster, parse_object)
    return build_snapshot(nodes, pods, pool_objs, levels, dra=dra)
