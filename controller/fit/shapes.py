"""Per-node fit of one pod shape: "how many pods of this shape fit on this node".

This is the single place that decides whether a node (existing, or a new node a pool would
create) can run a pod and how many: resources, nodeSelector, required node affinity and
taints. The DRA issue extends :func:`pods_that_fit`; everything else in the engine reasons
over its results (per node, per equivalence class, per topology domain).

Pure functions; :class:`ShapeCounter` only memoises them per equivalence class.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from controller.fit.devices import ClaimFitter, PodAllocation, resolve, with_state
from controller.fit.dra_types import NodeDevices, PodDevices
from controller.fit.ports import is_port, unlisted
from controller.fit.types import (
    PodShape,
    Resources,
    SelectorRequirement,
    SelectorTerm,
    Taint,
    Toleration,
)

UNBOUNDED = 1 << 30
"""Pods per node when a shape requests no resource at all (no resource limits it). The
snapshot builder adds a ``pods: 1`` request so real shapes are bounded by the node's pod
limit."""

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""PreferNoSchedule is a preference of the scheduler, not a barrier."""

NO_EXECUTE = frozenset({"NoExecute"})

NAME_FIELD = "metadata.name"


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        # An empty key with Exists tolerates every taint (of the matching effect).
        return not toleration.key or toleration.key == taint.key
    # Equal (the default operator).
    return toleration.key == taint.key and toleration.value == taint.value


def untolerated(
    taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], *, bound: bool = False
) -> list[Taint]:
    """Taints that keep a pod with ``tolerations`` off the node. ``bound``: the pod names
    its node (``spec.nodeName``), so no scheduler places it and only the kubelet's admission
    applies, which checks NoExecute taints alone."""
    effects = NO_EXECUTE if bound else BLOCKING_EFFECTS
    return [
        t
        for t in taints
        if t.effect in effects and not any(tolerates(tol, t) for tol in tolerations)
    ]


_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_int64(value: str) -> int | None:
    """Go's ``strconv.ParseInt(value, 10, 64)``, which Gt and Lt use on both the label value
    and the requirement's value: an optional sign and ASCII digits, within int64 (Python's
    ``int`` also takes blanks, underscores and non-ASCII digits)."""
    if _INT64.fullmatch(value) is None:
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def requirement_matches(req: SelectorRequirement, value: str | None) -> bool:
    """One matchExpressions/matchFields entry against the label value (None: label absent)."""
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(req.values) != 1:
            return False
        have, bound = parse_int64(value), parse_int64(req.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # unknown operators never match (validated at the API boundary)


def term_matches(term: SelectorTerm, labels: Mapping[str, str], node_name: str | None) -> bool:
    """A nodeSelectorTerm: all requirements ANDed; an empty term matches nothing (k8s)."""
    if not term.match_expressions and not term.match_fields:
        return False
    for req in term.match_expressions:
        if not requirement_matches(req, labels.get(req.key)):
            return False
    for req in term.match_fields:
        value = node_name if req.key == NAME_FIELD else None
        if not requirement_matches(req, value):
            return False
    return True


def selector_matches(shape: PodShape, labels: Mapping[str, str], node_name: str | None) -> bool:
    """``spec.nodeName``, nodeSelector (all pairs) and required node affinity (any term)."""
    if shape.node_name is not None and shape.node_name != node_name:
        return False
    for key, value in shape.node_selector.items():
        if labels.get(key) != value:
            return False
    if shape.affinity_terms:
        return any(term_matches(t, labels, node_name) for t in shape.affinity_terms)
    return True


def resource_fit(requests: Resources, free: Resources) -> int:
    """How many copies of ``requests`` fit into ``free`` (resources only)."""
    fit = UNBOUNDED
    for name, amount in requests.items():
        if amount <= 0:
            continue
        have = free.get(name, 0)
        if have < amount:
            if name in free or not is_port(name):
                return 0
            have = unlisted(name)  # a host port no pod on the node claims
        fit = min(fit, have // amount)
    return fit


def pods_that_fit(
    shape: PodShape,
    node_free: Resources,
    node_labels: Mapping[str, str],
    node_taints: tuple[Taint, ...],
    *,
    node_name: str | None = None,
    devices: NodeDevices | None = None,
    fitter: ClaimFitter | None = None,
) -> int:
    """How many pods of ``shape`` fit on one node with ``node_free`` left.

    ``node_name`` is None for a node that does not exist yet (matchFields cannot match it).
    Zero when a selector, the required node affinity or an untolerated NoSchedule/NoExecute
    taint excludes the node. With DRA claims, also bounded by how many pods get their claims
    allocated on ``devices`` one after another (``fitter`` memoises that search).
    Raises :class:`controller.fit.cel.SelectorError` when a CEL selector fails.
    """
    if not selector_matches(shape, node_labels, node_name):
        return 0
    if node_taints and untolerated(node_taints, shape.tolerations,
                                   bound=shape.node_name is not None):
        return 0
    fit = resource_fit(shape.requests, node_free)
    if shape.max_per_node is not None and fit > shape.max_per_node:
        fit = shape.max_per_node
    if shape.claims and fit > 0:
        fit = (fitter or ClaimFitter(shape.claims)).count(devices, fit)
    return fit


def selector_keys(shape: PodShape) -> tuple[str, ...]:
    """Label keys :func:`selector_matches` reads (sorted): the only labels that can change
    how many pods of the shape a node holds."""
    keys = set(shape.node_selector)
    for term in shape.affinity_terms:
        keys.update(r.key for r in term.match_expressions)
    return tuple(sorted(keys))


def label_keys(shape: PodShape) -> tuple[str, ...]:
    """Label keys the shape's selectors look at (sorted): nodes that agree on them, on their
    free resources and on their taints are equivalent for this shape."""
    keys = set(shape.node_selector)
    for term in shape.affinity_terms:
        keys.update(r.key for r in term.match_expressions)
    keys.update(s.key for s in shape.spreads)
    return tuple(sorted(keys))


def uses_node_name(shape: PodShape) -> bool:
    return shape.node_name is not None or any(term.match_fields for term in shape.affinity_terms)


class ShapeCounter:
    """A pod set's shape as placement commits it: its owner, and (with DRA claims) the
    memoised claim search that allocates each pod's devices on a node.

    Built per pod set placement, so it holds nothing it does not need: how many pods a node
    holds is counted once per node class by the placer, not here.
    """

    __slots__ = ("fitter", "owner", "shape")

    def __init__(self, shape: PodShape, owner: str = "") -> None:
        self.shape = shape
        self.owner = owner
        """The pod set, to file device allocations under."""
        self.fitter = ClaimFitter(shape.claims) if shape.claims else None

    def after(
        self, devices: NodeDevices | None, pods: int
    ) -> tuple[NodeDevices | None, tuple[PodAllocation, ...]]:
        """The node's devices once ``pods`` more pods of this shape hold their claims, and
        each pod's allocation in index form (nothing changes for a shape without claims)."""
        if self.fitter is None or devices is None or pods <= 0:
            return devices, ()
        run = self.fitter.run(devices, pods)
        if len(run.pods) < pods:  # placement only places pods that were counted as fitting
            raise AssertionError(f"{pods} pods placed where {len(run.pods)} fit")
        return with_state(devices, run.states[pods - 1]), run.pods[:pods]

    def resolve(self, devices: NodeDevices, plans: Sequence[PodAllocation]) -> list[PodDevices]:
        """Index-form allocations with the device and pool names of one node."""
        return [resolve(devices, self.shape.claims, p) for p in plans]
