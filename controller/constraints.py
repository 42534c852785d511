"""Pod-spec constraints beyond node selection, turned into what the fit engine plans, or
into a refusal naming the field (pure; used by :func:`controller.snapshot.gang_of`).

What becomes what (docs/design/filter-parity.md has the whole table):

* required pod anti-affinity of a pod set with itself on ``kubernetes.io/hostname``: at most
  one pod of the pod set per node (:attr:`PodShape.max_per_node`);
* required anti-affinity against pods already running, and running pods' required
  anti-affinity against the gang: the domains holding them are excluded (a ``NotIn``
  requirement on the topology key), when the caller knows the bound pods;
* required pod affinity of a pod set with itself: the pod set is required in one domain of
  the topology key (the first pod may go anywhere, the rest follow it), when the key is one of
  the snapshot's levels;
* everything else that constrains placement and the engine cannot plan is refused:
  affinity or anti-affinity between pod sets or with running pods Muster cannot see through,
  topology spread beyond the pod set's own pods, volumes bound to storage topology,
  RuntimeClasses, other schedulers, restart rules needing node-declared features;
* a DoNotSchedule topology spread constraint among the pod set's own pods:
  :class:`controller.fit.types.Spread`.
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
from controller.fit.types import (
    PodShape,
    SelectorRequirement,
    SelectorTerm,
    Spread,
    TopologyMode,
    TopologyRequest,
)
from controller.topology_defaults import HOSTNAME

DEFAULT_SCHEDULER = "default-scheduler"
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
    """DoNotSchedule topology spread: among the pod set's own pods (:class:`Spread`), or,
    when it selects no pod at all, only "the node carries the key"."""
    why: list[str] = []
    hard = [(i, t) for i, t in enumerate(spec.topology_spread_constraints)
            if t.when_unsatisfiable == "DoNotSchedule"]
    for i, tsc in hard:
        where = f"spec.topologySpreadConstraints[{i}] (DoNotSchedule on {tsc.topology_key})"
        hit = [o.name for o in others if _spread_selects(tsc, own.labels, o.labels)]
        if hit:
            why.append(f"{where}: spreading together with pod set(s) {', '.join(hit)} is not "
                       "planned")
            continue
        if bound is None:
            why.append(f"{where}: the running pods it could count are not known here")
            continue
        if any(p.namespace == namespace and _spread_selects(tsc, own.labels, p.labels)
               for p in bound):
            why.append(f"{where}: spreading around running pods is not planned")
            continue
        if not _spread_selects(tsc, own.labels, own.labels):
            # Counts nothing: only nodes without the key are filtered out.
            req = SelectorRequirement(tsc.topology_key, "Exists")
            terms = shape.affinity_terms or (SelectorTerm(),)
            shape = replace(shape, affinity_terms=tuple(
                replace(t, match_expressions=(*t.match_expressions, req)) for t in terms))
            continue
        if shape.spread is not None:
            why.append(f"{where}: a second spread constraint on the pod set is not planned")
        elif topology.mode is not TopologyMode.NONE:
            why.append(f"{where}: spreading within a {topology.mode.value} topology on "
                       f"{topology.level} is not planned")
        else:
            shape = replace(shape, spread=Spread(
                tsc.topology_key, tsc.max_skew, tsc.min_domains or 1,
                honor_affinity=tsc.node_affinity_policy != "Ignore",
                honor_taints=tsc.node_taints_policy == "Honor",
                # The pod's own node affinity: the exclusions Muster adds to the shape for
                # inter-pod anti-affinity or allocated claims filter nodes, yet leave them
                # eligible domains (found by the scheduler oracle).
                affinity_terms=node_affinity_terms(spec),
            ))
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
        else:
            why.append(f"{where}: anti-affinity of the pod set with itself on {key} is "
                       f"planned only on {HOSTNAME}")
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
