"""Input and output types of the fit engine.

Pure data: frozen dataclasses, no pydantic, no Kubernetes client. The state layer
(`controller.inputs.snapshot`) converts API objects into these; the reconcilers, the
`muster fit` CLI and the simulator all hand the same types to `controller.fit.plan`.

Resource amounts are integers in canonical units: ``cpu`` in millicores, every other
resource (memory, ephemeral-storage, ``nvidia.com/gpu`` ...) in its base unit, rounded up.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controller.fit.dra_types import ClaimShape, NodeDevices, PodDevices

Resources = Mapping[str, int]
"""Resource name -> amount in canonical units (cpu in millicores)."""


class Mode(enum.StrEnum):
    CHECK = "check"
    """check-capacity: existing nodes only."""
    PROVISION = "provision"
    """existing nodes first, then new nodes from CapacityPools."""


class TopologyMode(enum.StrEnum):
    NONE = "none"
    REQUIRED = "required"
    """every pod of the pod set in one domain of ``level``."""
    PREFERRED = "preferred"
    """fewest domains, starting at ``level`` and climbing when needed (Kueue TAS)."""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty matches every effect


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One matchExpressions entry of a required node affinity term."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """Requirements ANDed; the terms of a pod are ORed (nodeSelectorTerms)."""

    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()
    """matchFields entries; only ``metadata.name`` is meaningful (a new node has no name
    yet, so a term with matchFields never matches a new-node slot)."""


@dataclass(frozen=True, slots=True)
class Spread:
    """A DoNotSchedule topology spread constraint (the scheduler's PodTopologySpread): over
    every eligible domain of ``key`` (domains of existing nodes and of the nodes the plan
    adds), the most matching pods minus the fewest stays within ``max_skew``."""

    key: str
    max_skew: int = 1
    min_domains: int = 1
    """With fewer eligible domains than this, the fewest is taken as 0."""
    honor_affinity: bool = True
    """nodeAffinityPolicy Honor: only nodes matching the pod's node affinity are domains."""
    honor_taints: bool = False
    """nodeTaintsPolicy Honor: only nodes whose taints the pod tolerates are domains."""
    affinity_terms: tuple[SelectorTerm, ...] | None = None
    """The pod's own required node affinity, which nodeAffinityPolicy Honor reads (None:
    the shape's). The shape's terms may also hold filters that are not node affinity (nodes
    excluded for inter-pod anti-affinity, an allocated claim's nodes): the scheduler still
    counts those nodes as domains."""
    running: tuple[tuple[str, int], ...] = ()
    """(node name, running pods the constraint's selector matches there): counted where the
    node is an eligible domain."""
    peers: tuple[str, ...] = ()
    """Other pod sets of the gang whose pods the selector matches (counted too)."""
    counts_self: bool = True
    """Whether the selector matches the pod set's own pods (False: its pods only go where
    the matching pods already are within ``max_skew`` of the fewest)."""


@dataclass(frozen=True, slots=True)
class PodShape:
    """What decides where one pod of a pod set can go."""

    requests: Resources
    """Effective requests: max(sum of containers, largest init container) + overhead."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity_terms: tuple[SelectorTerm, ...] = ()
    """Required node affinity; empty means unconstrained."""
    tolerations: tuple[Toleration, ...] = ()
    claims: tuple[ClaimShape, ...] = ()
    """DRA ResourceClaims each pod needs allocated on its node (see controller.fit.devices)."""
    node_name: str | None = None
    """``spec.nodeName``: the pod is bound to this existing node by its creator (no new node
    can be it), and only the kubelet's admission applies (NoExecute taints, not NoSchedule)."""
    max_per_node: int | None = None
    """At most this many pods of the pod set on one node (required pod anti-affinity of the
    pod set with itself on ``kubernetes.io/hostname``)."""
    spread: Spread | None = None
    """A DoNotSchedule topology spread constraint (:class:`Spread`)."""
    more_spreads: tuple[Spread, ...] = ()
    """Further DoNotSchedule constraints on other keys (at most one besides the hostname
    key's; the snapshot builder refuses more)."""

    @property
    def spreads(self) -> tuple[Spread, ...]:
        return (self.spread, *self.more_spreads) if self.spread is not None else ()
    unsupported: tuple[str, ...] = ()
    """Constraints of the pod spec the engine cannot plan, each naming its field: the gang
    is refused (:attr:`ReasonCode.UNSUPPORTED`), never planned as if they were absent."""


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    mode: TopologyMode = TopologyMode.NONE
    level: str | None = None
    """A node label key that is one of ``Snapshot.levels``."""
    slice_level: str | None = None
    """Kueue TAS slices (``podset-slice-required-topology``): every consecutive
    ``slice_size`` pods of the pod set in one domain of this level, while ``mode`` and
    ``level`` still hold for the whole pod set (:mod:`controller.fit.slices`)."""
    slice_size: int = 0


@dataclass(frozen=True, slots=True)
class PodSetRequest:
    name: str
    count: int
    shape: PodShape
    topology: TopologyRequest = TopologyRequest()


@dataclass(frozen=True, slots=True)
class GangRequest:
    """All-or-nothing across every pod set."""

    name: str  # "<namespace>/<name>", for messages
    pod_sets: tuple[PodSetRequest, ...]
    run_seconds: float | None = None
    """How long the gang's new nodes must stay usable (``maxRunDurationSeconds``): no new
    node is planned in a pool whose capacity ends sooner (:attr:`PoolState.open_seconds`)."""


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Resources
    free: Resources
    """allocatable - requests of bound pods - capacity booked by other requests."""
    schedulable: bool = True
    """False for NotReady nodes and nodes being deleted: never used. A cordoned node
    (``spec.unschedulable``) is schedulable with the ``node.kubernetes.io/unschedulable``
    taint, as the scheduler sees it (:mod:`controller.fit.taints`)."""
    pool: str | None = None
    """CapacityPool that created the node, if any (counts against the pool's limits)."""
    devices: NodeDevices | None = None
    """DRA devices the node publishes (ResourceSlices) and what is allocated of them."""


@dataclass(frozen=True, slots=True)
class PoolDomain:
    """A topology domain a pool can add nodes into."""

    labels: Mapping[str, str]
    """Topology labels every new node in this domain carries (all levels it knows)."""
    max_new_nodes: int
    """How many more nodes the pool may add here: stock and the domain limit, minus nodes
    the pool already has in it."""
    max_nodes: int | None = None
    """The domain's total limit (nodes the pool may ever have here), for messages and for
    judging NeverFits."""
    booked_nodes: int = 0
    """New nodes already booked here by other requests (not in ``max_new_nodes``)."""
    pool_nodes: int = 0
    """Nodes of the pool that exist here now (within ``max_nodes``)."""


@dataclass(frozen=True, slots=True)
class PoolState:
    name: str
    labels: Mapping[str, str]
    """Template labels of a new node (without the domain's topology labels)."""
    taints: tuple[Taint, ...]
    allocatable: Resources
    domains: tuple[PoolDomain, ...]
    max_new_nodes: int
    """Total nodes the pool may still add (maxNodes - current nodes)."""
    price_per_node_hour: float = 0.0
    acquisition_level: str | None = None
    """Topology level one acquisition lands in as a unit (e.g. one placement group)."""
    ready_seconds: float = 0.0
    booked_nodes: int = 0
    """Nodes acquired or booked but not registered yet: excluded from ``max_new_nodes`` now,
    counted back when judging NeverFits (they will exist, and be freed, eventually)."""
    devices: NodeDevices | None = None
    """DRA devices every new node will publish (the node template's ResourceSlices)."""
    open_seconds: float | None = None
    """How long from the snapshot's moment new nodes of the pool stay usable (a Capacity
    Block's end); None: unbounded."""
    reserved_busy: int = 0
    """New nodes the pool's reservation could hold but cannot now (in use by other
    instances, or a block not begun): excluded from ``max_new_nodes``, counted back when
    judging NeverFits (a reservation's own size is a limit; its use by others is not)."""
    reserved: bool = False
    """New nodes come out of a reservation that is paid for whether used or not (an ODCR,
    a Capacity Block, a GCP specific reservation): where such a pool and an on-demand one
    both serve a gang, the reserved one is used (see :attr:`planning_price`)."""

    @property
    def planning_price(self) -> float:
        """What one more node of this pool costs the plan: nothing for reserved capacity
        (its price is owed anyway), else the price per node-hour. Every choice between
        pools ranks by this, and ties go to reserved pools; plans report the real price."""
        return 0.0 if self.reserved else self.price_per_node_hour


def usable_for(pools: tuple[PoolState, ...], run_seconds: float | None) -> tuple[
        PoolState, ...]:
    """``pools`` with no headroom where capacity ends before a run of ``run_seconds`` would
    (a request is never planned onto a block that ends under it)."""
    if run_seconds is None:
        return pools
    return tuple(
        replace(p, max_new_nodes=0, domains=tuple(replace(d, max_new_nodes=0)
                                                 for d in p.domains))
        if p.open_seconds is not None and p.open_seconds < run_seconds else p
        for p in pools
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeState, ...]
    pools: tuple[PoolState, ...] = ()
    levels: tuple[str, ...] = ()
    """Topology level label keys, top (widest) to bottom, e.g. block, rack, hostname."""


# ---------------------------------------------------------------------------- output


@dataclass(frozen=True, slots=True)
class NewNodeSlot:
    """A node that does not exist yet: the ``index``-th new node of ``pool`` in ``domain``."""

    pool: str
    domain: Mapping[str, str]
    index: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """``pods`` pods of ``pod_set`` go to one existing node or one new-node slot."""

    pod_set: str
    pods: int
    node: str | None = None
    new_node: NewNodeSlot | None = None
    domain: Mapping[str, str] = field(default_factory=dict)
    """The node's topology labels (levels of the snapshot it has)."""
    requests: Resources = field(default_factory=dict)
    """Requests of one pod of the pod set, so a plan can be booked (``apply_plan``)."""
    devices: tuple[PodDevices, ...] = ()
    """With DRA claims: the device allocation of each of the ``pods`` pods."""


@dataclass(frozen=True, slots=True)
class NewNodes:
    """Nodes to acquire from one pool into one domain, as one all-or-nothing unit."""

    pool: str
    domain: Mapping[str, str]
    count: int
    cost_per_hour: float


@dataclass(frozen=True, slots=True)
class PodSetPlacement:
    pod_set: str
    level: str | None
    """The topology level the pod set was kept within, if any."""
    domain: str | None
    """That level's value when the pod set fits in one domain, else None."""
    domains_used: int
    domain_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels of all levels from the top down to ``level`` identifying the chosen domain
    (a rack value alone may repeat across blocks); empty when the pod set spans domains."""


@dataclass(frozen=True, slots=True)
class Plan:
    request: str
    mode: Mode
    assignments: tuple[Assignment, ...]
    new_nodes: tuple[NewNodes, ...]
    placements: tuple[PodSetPlacement, ...]
    cost_per_hour: float

    @property
    def fits_existing(self) -> bool:
        return not self.new_nodes


class ReasonCode(enum.StrEnum):
    INVALID = "Invalid"
    NO_MATCHING_NODES = "NoMatchingNodes"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    TOPOLOGY = "TopologyConstraint"
    POOL_LIMIT = "PoolLimit"
    NEVER_FITS = "NeverFits"
    """Larger than anything the cluster plus every pool could ever hold."""
    UNSUPPORTED = "Unsupported"
    """The pods carry a placement constraint Muster does not plan (refused, not ignored)."""


@dataclass(frozen=True, slots=True)
class Reason:
    code: ReasonCode
    pod_set: str | None
    message: str
    """Names the constraint and the shortfall, e.g. "pod set workers needs 16 pods x 8
    nvidia.com/gpu within one value of rack; the best rack has room for 11; pool p5 can add 2
    more nodes there (its domain limit is 8)"."""
    needed: int = 0
    best: int = 0
    """Pods the best place found could hold (``needed`` - ``best`` is the shortfall)."""
    level: str | None = None
    """The topology level the pod set must fit within, when that is what failed."""
    domain: str | None = None
    """The domain of ``level`` that came closest (its values, widest first, joined by /)."""


_PERMANENT = frozenset({ReasonCode.NEVER_FITS, ReasonCode.INVALID, ReasonCode.UNSUPPORTED})


@dataclass(frozen=True, slots=True)
class NoFit:
    request: str
    mode: Mode
    reasons: tuple[Reason, ...]

    @property
    def permanent(self) -> bool:
        """True when no amount of waiting can help (NeverFits, Invalid or Unsupported)."""
        return any(r.code in _PERMANENT for r in self.reasons)


Result = Plan | NoFit
