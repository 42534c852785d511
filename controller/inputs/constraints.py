"""Pod-spec constraints beyond node selection, turned into what the fit engine plans, or
into a refusal naming the field (pure; used by :func:`controller.inputs.snapshot.gang_of`).

What becomes what (docs/design/filter-parity.md has the whole table):

* required pod anti-affinity of a pod set with itself on ``kubernetes.io/hostname``: at most
  one pod of the pod set per node (:attr:`PodShape.max_per_node`); on another key, at most
  one per domain of it (a :class:`Spread` with :data:`ONE_PER_DOMAIN`; nodes without the key,
  which the scheduler would allow, are not used);
* required anti-affinity against pods already running, and running pods' required
  anti-affinity against the gang: the domains holding them are excluded (a ``NotIn``
  requirement on the topology key), when the caller knows the bound pods;
* required pod affinity to running pods: only the domains of the key that hold a selected
  running pod (an ``In`` requirement);
* required pod affinity of a pod set with itself: the pod set is required in one domain of
  the topology key (the first pod may go anywhere, the rest follow it), when the key is one of
  the snapshot's levels;
* a DoNotSchedule topology spread constraint: :class:`controller.fit.types.Spread`, counting
  the pod set's own pods, the running pods of the namespace it matches (per node) and the
  other pod sets of the gang it matches; one key plus the hostname on one pod set;
* everything else that constrains placement and the engine cannot plan is refused:
  affinity or anti-affinity between pod sets or with running pods Muster cannot see through,
  spread on two keys besides the hostname, spread counting other pod sets but not its own
  pods, volumes bound to storage topology, RuntimeClasses, other schedulers, restart rules
  needing node-declared features.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.api.pod import (
    LabelSelector,
    PodAffinityTerm,
    PodSpec,
    TopologySpreadConstraint,
)
from controller.common.topology_defaults import HOSTNAME
from controller.fit.types import (
    PodShape,
    SelectorRequirement,
    SelectorTerm,
    Spread,
    TopologyMode,
    TopologyRequest,
)

DEFAULT_SCHEDULER = "default-scheduler"
ONE_PER_DOMAIN = 1 << 30
"""``minDomains`` of the :class:`Spread` standing for a pod set's anti-affinity with itself on
a key other than the hostname: never that many domains, so the fewest counts as 0 and with
maxSkew 1 every domain holds at most one of its pods."""
NEUTRAL_VOLUMES = frozenset({
    "emptyDir", "configMap", "secret", "projected", "downwardAPI", "hostPath", "nfs", "image",
})
"""Volume sources the scheduler does not filter nodes on."""


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod running on a node, as far as inter-pod constraints go."""

    namespace: str
    labels: Mapping[str, str]
    node_labels: Mapping[str, str]
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    """Its own required anti-affinity terms (they repel the gang's pods too)."""
    node: str = ""
    """The node's name (topology spread counts the pods per node)."""


@dataclass(frozen=True, slots=True)
class PodSetFacts:
    """What the other pod sets' constraints need to know of one pod set."""

    name: str
    labels: Mapping[str, str]


def needs_running_pods(spec: PodSpec) -> bool:
    """Whether the pod's own constraints select running pods (pod affinity or anti-affinity,
    a DoNotSchedule spread): then every running pod's labels matter, not only those of the
    running pods that repel others."""
    aff = spec.affinity
    return bool(aff and (aff.pod_affinity or aff.pod_anti_affinity)) or any(
        t.when_unsatisfiable == "DoNotSchedule" for t in spec.topology_spread_constraints
    )


def refusals(spec: PodSpec) -> list[str]:
    """Fields of ``spec`` that constrain placement in ways the engine does not plan."""
    out: list[str] = []
    for i, volume in enumerate(spec.volumes):
        kinds = sorted(k for k in volume if k != "name")
        kind = kinds[0] if kinds else "unknown"
        if kind not in NEUTRAL_VOLUMES:
            out.append(
                f"spec.volumes[{i}] ({volume.get('name', '?')}) is a {kind} volume: volume "
                "binding, zones and attach limits (VolumeBinding, VolumeZone, "
                "VolumeRestrictions, NodeVolumeLimits) are not planned"
            )
    if spec.runtime_class_name:
        out.append(
            f"spec.runtimeClassName {spec.runtime_class_name}: a RuntimeClass adds its "
            "nodeSelector, tolerations and overhead when the pod is created, and Muster does "
            "not read RuntimeClasses"
        )
    if spec.scheduler_name and spec.scheduler_name != DEFAULT_SCHEDULER:
        out.append(
            f"spec.schedulerName {spec.scheduler_name}: Muster plans for the default "
            "kube-scheduler"
        )
    if spec.host_network and (spec.model_extra or {}).get("hostUsers") is False:
        out.append(
            "spec.hostNetwork with spec.hostUsers false: user namespaces on the host network "
            "need a feature the node declares (NodeDeclaredFeatures), which Muster does not "
            "model"
        )
    for kind, containers in (("containers", spec.containers),
                             ("initContainers", spec.init_containers)):
        for i, c in enumerate(containers):
            if c.restart_policy_rules:
                out.append(
                    f"spec.{kind}[{i}].restartPolicyRules: restart rules can require a "
                    "feature the node declares (NodeDeclaredFeatures), which Muster does not "
                    "model"
                )
    return out


def node_affinity_terms(spec: PodSpec) -> tuple[SelectorTerm, ...]:
    """The pod's own required node affinity (``nodeSelectorTerms``) as engine terms."""
    return tuple(
        SelectorTerm(
            match_expressions=tuple(
                SelectorRequirement(r.key, r.operator, tuple(r.values))
                for r in term.match_expressions
            ),
            match_fields=tuple(
                SelectorRequirement(r.key, r.operator, tuple(r.values))
                for r in term.match_fields
            ),
        )
        for term in spec.required_terms()
    )


def _spread_selects(
    tsc: TopologySpreadConstraint, owner: Mapping[str, str], labels: Mapping[str, str]
) -> bool:
    if tsc.label_selector is None or not tsc.label_selector.matches(labels):
        return False
    return all(labels.get(k) == owner[k] for k in tsc.match_label_keys if k in owner)


def _spread(
    spec: PodSpec, shape: PodShape, topology: TopologyRequest, own: PodSetFacts,
    namespace: str, others: Sequence[PodSetFacts], bound: Sequence[BoundPod] | None,
) -> tuple[PodShape, list[str]]:
    """DoNotSchedule topology spread as :class:`Spread`s counting every pod the selector
    matches (the pod set's own, other pod sets', running pods of the namespace), or, when
    it matches no pod at all, only "the node carries the key"."""
    why: list[str] = []
    spreads: list[Spread] = list(shape.spreads)  # self anti-affinity on a key, if any
    if spreads and topology.mode is not TopologyMode.NONE:
        why.append(f"spec.affinity.podAntiAffinity: anti-affinity of the pod set with itself "
                   f"on {spreads[0].key} within a {topology.mode.value} topology on "
                   f"{topology.level} is not planned")
    hard = [(i, t) for i, t in enumerate(spec.topology_spread_constraints)
            if t.when_unsatisfiable == "DoNotSchedule"]
    for i, tsc in hard:
        where = f"spec.topologySpreadConstraints[{i}] (DoNotSchedule on {tsc.topology_key})"
        peers = tuple(o.name for o in others if _spread_selects(tsc, own.labels, o.labels))
        if bound is None:
            why.append(f"{where}: the running pods it could count are not known here")
            continue
        running: dict[str, int] = {}
        for p in bound:
            if p.namespace == namespace and _spread_selects(tsc, own.labels, p.labels):
                running[p.node] = running.get(p.node, 0) + 1
        counts_self = _spread_selects(tsc, own.labels, own.labels)
        if not counts_self and not peers and not running:
            # Counts nothing: only nodes without the key are filtered out.
            req = SelectorRequirement(tsc.topology_key, "Exists")
            terms = shape.affinity_terms or (SelectorTerm(),)
            shape = replace(shape, affinity_terms=tuple(
                replace(t, match_expressions=(*t.match_expressions, req)) for t in terms))
            continue
        if not counts_self and peers:
            why.append(f"{where}: it counts pod set(s) {', '.join(peers)} of the gang but not "
                       "its own pods, which is not planned")
            continue
        if topology.mode is not TopologyMode.NONE:
            why.append(f"{where}: spreading within a {topology.mode.value} topology on "
                       f"{topology.level} is not planned")
            continue
        spreads.append(Spread(
            tsc.topology_key, tsc.max_skew, tsc.min_domains or 1,
            honor_affinity=tsc.node_affinity_policy != "Ignore",
            honor_taints=tsc.node_taints_policy == "Honor",
            # The pod's own node affinity: the exclusions Muster adds to the shape for
            # inter-pod anti-affinity or allocated claims filter nodes, yet leave them
            # eligible domains (found by the scheduler oracle).
            affinity_terms=node_affinity_terms(spec),
            running=tuple(sorted(running.items())),
            peers=peers,
            counts_self=counts_self,
        ))
    others_keys = [s.key for s in spreads if s.key != HOSTNAME]
    if len(others_keys) > 1:
        why.append(f"spec.topologySpreadConstraints: DoNotSchedule spread (or self "
                   f"anti-affinity) on {' and '.join(others_keys)} together is not planned "
                   f"(one key besides {HOSTNAME})")
    elif spreads:
        first = next(s for s in spreads if s.key != HOSTNAME) if others_keys else spreads[0]
        shape = replace(shape, spread=first,
                        more_spreads=tuple(s for s in spreads if s is not first))
    return shape, why


def _selects(
    term: PodAffinityTerm, owner_labels: Mapping[str, str], labels: Mapping[str, str]
) -> bool:
    """Whether ``term`` of a pod labelled ``owner_labels`` selects a pod labelled
    ``labels`` (matchLabelKeys/mismatchLabelKeys take their values from the owner)."""
    selector = term.label_selector
    if selector is None:
        return False  # a nil selector selects nothing
    if not selector.matches(labels):
        return False
    for key in term.match_label_keys:
        if key in owner_labels and labels.get(key) != owner_labels[key]:
            return False
    for key in term.mismatch_label_keys:
        if key in owner_labels and labels.get(key) == owner_labels[key]:
            return False
    return True


def _in_scope(term: PodAffinityTerm, owner_namespace: str, namespace: str) -> bool | None:
    """Whether ``namespace`` is among the term's namespaces; None when a namespaceSelector
    decides it (namespace labels are not known here)."""
    selector = term.namespace_selector
    if selector is not None:
        if selector == LabelSelector():
            return True  # an empty namespaceSelector is every namespace
        return None if namespace not in term.namespaces else True
    return namespace in (term.namespaces or [owner_namespace])


def _exclude(shape: PodShape, key: str, values: Iterable[str]) -> PodShape:
    """``shape`` kept off the nodes whose ``key`` label is one of ``values``."""
    blocked = tuple(sorted(set(values)))
    if not blocked:
        return shape
    req = SelectorRequirement(key, "NotIn", blocked)
    terms = shape.affinity_terms or (SelectorTerm(),)
    return replace(shape, affinity_terms=tuple(
        replace(t, match_expressions=(*t.match_expressions, req)) for t in terms
    ))


def inter_pod(
    spec: PodSpec,
    shape: PodShape,
    topology: TopologyRequest,
    *,
    own: PodSetFacts,
    namespace: str,
    others: Sequence[PodSetFacts],
    levels: Sequence[str],
    bound: Sequence[BoundPod] | None,
) -> tuple[PodShape, TopologyRequest]:
    """The pod set's required pod (anti-)affinity as engine constraints; refusals go to
    ``shape.unsupported``. ``bound``: the running pods, or None when the caller cannot see
    them (then a term that could select a running pod is refused)."""
    unsupported = list(shape.unsupported)
    unsupported.extend(refusals(spec))
    if spec.node_name:
        # No scheduler places a pod that names its node: the kubelet admits it, checking
        # resources, host ports, node name, node affinity and NoExecute taints, never pod
        # (anti-)affinity or spread (found by tests/fit/reference_scheduler.py).
        return replace(shape, unsupported=tuple(unsupported)), topology
    aff = spec.affinity
    anti = aff.pod_anti_affinity.required if aff and aff.pod_anti_affinity else []
    pro = aff.pod_affinity.required if aff and aff.pod_affinity else []
    for i, term in enumerate(anti):
        where = f"spec.affinity.podAntiAffinity.required[{i}]"
        shape, why = _anti(term, shape, where, own, namespace, others, bound)
        unsupported.extend(why)
    for i, term in enumerate(pro):
        where = f"spec.affinity.podAffinity.required[{i}]"
        near = _near_running(term, own, namespace, others, bound)
        if near is not None:
            shape = _require(shape, term.topology_key, near)
            continue
        topology, why = _affinity(term, topology, where, own, namespace, others, levels,
                                  bound)
        unsupported.extend(why)
    shape, why = _spread(spec, shape, topology, own, namespace, others, bound)
    unsupported.extend(why)
    if bound:
        shape = _repelled(shape, own, namespace, bound)
    return replace(shape, unsupported=tuple(unsupported)), topology


def _anti(
    term: PodAffinityTerm, shape: PodShape, where: str, own: PodSetFacts, namespace: str,
    others: Sequence[PodSetFacts], bound: Sequence[BoundPod] | None,
) -> tuple[PodShape, list[str]]:
    key = term.topology_key
    if _in_scope(term, namespace, namespace) is None:
        return shape, [f"{where}: a namespaceSelector Muster cannot evaluate"]
    hit = [o.name for o in others if _selects(term, own.labels, o.labels)]
    if hit:
        return shape, [f"{where}: anti-affinity with pod set(s) {', '.join(hit)} of the "
                       "gang is not planned"]
    why: list[str] = []
    if _selects(term, own.labels, own.labels):
        if key == HOSTNAME:
            shape = replace(shape, max_per_node=1)
        elif any(s.key != HOSTNAME for s in shape.spreads):
            why.append(f"{where}: anti-affinity of the pod set with itself on {key} beside "
                       f"another on {shape.spreads[0].key} is not planned")
        else:
            # At most one pod of the pod set per domain of the key: a spread whose fewest is
            # always taken as 0 with maxSkew 1, counted on every node carrying the key.
            one = Spread(key, 1, ONE_PER_DOMAIN, honor_affinity=False, honor_taints=False)
            shape = replace(shape, spread=one, more_spreads=shape.spreads)
    if bound is None:
        why.append(f"{where}: the running pods it could select are not known here")
        return shape, why
    blocked = [
        p.node_labels[key] for p in bound
        if key in p.node_labels and _in_scope(term, namespace, p.namespace) is not False
        and _selects(term, own.labels, p.labels)
    ]
    return _exclude(shape, key, blocked), why


def _affinity(
    term: PodAffinityTerm, topology: TopologyRequest, where: str, own: PodSetFacts,
    namespace: str, others: Sequence[PodSetFacts], levels: Sequence[str],
    bound: Sequence[BoundPod] | None,
) -> tuple[TopologyRequest, list[str]]:
    key = term.topology_key
    if _in_scope(term, namespace, namespace) is None:
        return topology, [f"{where}: a namespaceSelector Muster cannot evaluate"]
    hit = [o.name for o in others if _selects(term, own.labels, o.labels)]
    if hit:
        return topology, [f"{where}: affinity to pod set(s) {', '.join(hit)} of the gang is "
                          "not planned"]
    if bound is None:
        return topology, [f"{where}: the running pods it could select are not known here"]
    if any(_in_scope(term, namespace, p.namespace) is not False
           and _selects(term, own.labels, p.labels) for p in bound):
        return topology, [f"{where}: affinity to running pods is not planned"]
    if not _selects(term, own.labels, own.labels):
        return topology, [f"{where}: selects no pod of the gang and no running pod, so the "
                          "scheduler can place none of these pods"]
    if key not in levels:
        return topology, [f"{where}: affinity of the pod set with itself on {key}, which "
                          f"is not a topology level ({', '.join(levels)})"]
    if topology.mode is TopologyMode.NONE or (
        topology.mode is TopologyMode.REQUIRED and topology.level == key
    ):
        return TopologyRequest(TopologyMode.REQUIRED, key), []
    return topology, [f"{where}: affinity on {key} together with a {topology.mode.value} "
                      f"topology on {topology.level} is not planned"]


def _near_running(
    term: PodAffinityTerm, own: PodSetFacts, namespace: str, others: Sequence[PodSetFacts],
    bound: Sequence[BoundPod] | None,
) -> list[str] | None:
    """Required pod affinity to running pods: the values of the term's key where a running
    pod it selects is (the scheduler admits a pod only into such a domain while any pod
    matches, and the pod set's own pods can only join those domains), or None when the term
    is something else (no running pod matches, another pod set matches, or it is unknown)."""
    if bound is None or _in_scope(term, namespace, namespace) is None:
        return None
    if any(_selects(term, own.labels, o.labels) for o in others):
        return None
    key = term.topology_key
    selected = [(p, _in_scope(term, namespace, p.namespace)) for p in bound
                if _selects(term, own.labels, p.labels)]
    if any(scope is None for _, scope in selected):
        return None  # a namespaceSelector decides: refused below
    matched = [p for p, scope in selected if scope]
    if not matched:
        return None
    return sorted({p.node_labels[key] for p in matched if key in p.node_labels})


def _require(shape: PodShape, key: str, values: Sequence[str]) -> PodShape:
    """``shape`` kept to the nodes whose ``key`` label is one of ``values`` (none: no node)."""
    req = SelectorRequirement(key, "In", tuple(values))
    terms = shape.affinity_terms or (SelectorTerm(),)
    return replace(shape, affinity_terms=tuple(
        replace(t, match_expressions=(*t.match_expressions, req)) for t in terms
    ))


def _repelled(
    shape: PodShape, own: PodSetFacts, namespace: str, bound: Sequence[BoundPod]
) -> PodShape:
    """Running pods' own required anti-affinity against this pod set's pods."""
    blocked: dict[str, list[str]] = {}
    for p in bound:
        for term in p.anti_affinity:
            key = term.topology_key
            if key not in p.node_labels:
                continue
            # An unknown namespaceSelector is taken to select the gang (the cautious side).
            if _in_scope(term, p.namespace, namespace) is not False and _selects(
                term, p.labels, own.labels
            ):
                blocked.setdefault(key, []).append(p.node_labels[key])
    for key, values in sorted(blocked.items()):
        shape = _exclude(shape, key, values)
    return shape
