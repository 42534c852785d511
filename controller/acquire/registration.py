"""Registration: a machine Muster launched becomes the node Muster planned.

A cloud machine's kubelet registers its Node with what the machine was given: the name and
``spec.providerID`` the cloud gives it, the well-known labels of kubelet and the
cloud-controller-manager (zone, instance type, network topology), and the startup taint
``muster.dev/unregistered:NoExecute`` the provider put into its bootstrap. Nothing but
Muster may use it then. Muster knows the node by its providerID (the acquisition recorded
the providerIDs the provider launched), checks that it registered in the domain its gang was
planned for, writes the pool, acquisition and owner labels, the domain labels the node does
not carry yet and the pool's ``nodeTemplate`` labels and taints, and lifts the startup taint
in one write (conditional on the node's resourceVersion, so a concurrent writer's taints are
never dropped: a conflict is retried at the node's next change).

:func:`registration` is pure; :func:`register` writes. Nodes whose providerID matches no
acquisition are never touched.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.api.capacitypool import CapacityPool
from controller.api.node import Node
from controller.common.topology_defaults import (
    KEY_LABEL,
    OWNER_ANNOTATION,
    OWNER_UID_LABEL,
    POOL_LABEL,
    UNREGISTERED_TAINT,
    foreign_level,
)
from controller.common.topology_defaults import placeholder as placeholder  # the callers' name
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import NODES
from controller.state.bookings import Group

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutsideDomain:
    """The node registered where its gang was not planned: ``label`` is ``observed``, the
    plan wanted ``planned``."""

    node: str
    label: str
    planned: str
    observed: str

    def describe(self) -> str:
        return (f"node {self.node} registered with {self.label}={self.observed}, outside the "
                f"planned domain ({self.label}={self.planned})")


def fresh_domain(group: Group) -> str:
    """The value Muster gives a placeholder domain level the cloud does not report on the
    node (a pool without declared domains: each acquisition is a domain of its own)."""
    digest = hashlib.sha256(f"{group.pool}/{group.key}".encode()).hexdigest()[:10]
    return f"{group.pool[:40]}-{digest}"


def observed_domain(group: Group, nodes: Sequence[Node]) -> dict[tuple[str, str], str]:
    """(label, placeholder value) -> the value the group's registered ``nodes`` carry,
    for each placeholder level of the group's domain all of them agree on."""
    out: dict[tuple[str, str], str] = {}
    for key, value in group.domain.items():
        if not placeholder(value):
            continue
        seen = {n.metadata.labels.get(key) for n in nodes}
        if len(seen) == 1 and None not in seen:
            out[(key, value)] = str(seen.pop())
    return out


def registration_budget(pools: Iterable[CapacityPool], default: float) -> float:
    """How long an acquisition's machines may take to register and be Ready: the longest
    budget of its pools (``spec.registrationTimeoutSeconds``, else ``default``, the
    controller's ``acquisition.node_ready_timeout_seconds``). One wait for the whole gang:
    it is all or nothing, so it is confirmed only once its slowest pool's nodes are."""
    return max((p.spec.registration_timeout_seconds or default for p in pools),
               default=default)


CLOUD_UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
"""The kubelet's ``--cloud-provider=external`` taint, lifted by the cloud-controller-manager
once it has labelled the node (zone, instance type, topology)."""


def awaiting_cloud(node: Node) -> bool:
    """The cloud-controller-manager has not initialised ``node`` yet: its zone and topology
    labels may still be missing, so the domain cannot be checked (nor filled in) yet."""
    return any(t.key == CLOUD_UNINITIALIZED for t in node.spec.taints)


BASE_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})


def missing_devices(node: Node, pool: CapacityPool) -> list[str]:
    """Extended resources (GPUs, EFA, ...) the pool's nodes offer that ``node`` does not
    advertise yet (its device plugin is still starting): until they show, the node is not
    what was planned, and pods asking for them would stay Pending."""
    have = node.allocatable()
    return sorted(
        name for name, amount in pool.spec.node_template.allocatable.items()
        if name not in BASE_RESOURCES and "/" in name and str(amount) not in ("0", "")
        and str(have.get(name, "0")) in ("0", "")
    )


def registration(
    node: Node, pool: CapacityPool, group: Group, *, owner: str, owner_uid: str
) -> dict[str, Any] | OutsideDomain | None:
    """The merge patch that registers ``node`` as a node of ``group``, None when it is
    registered already, or :class:`OutsideDomain` when it is not where the group was planned.
    Call it only once the cloud initialised the node (:func:`awaiting_cloud`).
    """
    labels = node.metadata.labels
    for key, planned in sorted(group.domain.items()):
        observed = labels.get(key)
        if observed is not None and not placeholder(planned) and observed != planned:
            return OutsideDomain(node.metadata.name, key, planned, observed)
    template = pool.spec.node_template
    want: dict[str, str] = dict(template.labels)
    # A placeholder level the cloud did not report gets a value of this acquisition's own
    # (each acquisition is a domain of its own), but only a level the pool's own cloud
    # could report: a GCE node never gets an EC2 network node layer (with both clouds'
    # levels configured, the planner's placeholder spans them all).
    provider = pool.spec.provider
    want.update({k: (fresh_domain(group) if placeholder(v) else v)
                 for k, v in group.domain.items()
                 if k not in labels and not (placeholder(v) and foreign_level(k, provider))})
    want.update({POOL_LABEL: group.pool, KEY_LABEL: group.key})
    if owner_uid:
        want[OWNER_UID_LABEL] = owner_uid
    new_labels = {k: v for k, v in want.items() if labels.get(k) != v}
    taints = [t for t in node.spec.taints if t.key != UNREGISTERED_TAINT]
    have = {(t.key, t.effect) for t in taints}
    added = [t for t in template.taints if (t.key, t.effect) not in have]
    lifted = len(taints) != len(node.spec.taints)
    annotate = bool(owner) and node.metadata.annotations.get(OWNER_ANNOTATION) != owner
    if not new_labels and not added and not lifted and not annotate:
        return None
    metadata: dict[str, Any] = {"resourceVersion": node.metadata.resource_version}
    if new_labels:
        metadata["labels"] = new_labels
    if annotate:
        metadata["annotations"] = {OWNER_ANNOTATION: owner}
    patch: dict[str, Any] = {"metadata": metadata}
    if added or lifted:
        patch["spec"] = {"taints": [
            *(_taint(t.key, t.value, t.effect, t.time_added) for t in taints),
            *(_taint(t.key, t.value, t.effect, None) for t in added),
        ]}
    return patch


def _taint(key: str, value: str, effect: str, added: str | None) -> Mapping[str, str]:
    out = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    if added:
        out["timeAdded"] = added
    return out


async def register(kube: KubeClient, node: str, patch: Mapping[str, Any]) -> Body | None:
    """Write a registration patch and return the Node as written (the caller stores it in
    its cache at once: the watch may bring the change later than the next look); None when
    the node changed or went meanwhile (the caller tries again at its next change)."""
    try:
        return await kube.merge_patch(NODES, node, dict(patch))
    except ApiError as exc:
        if exc.conflict or exc.not_found:
            return None
        raise
