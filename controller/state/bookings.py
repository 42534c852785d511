"""Bookings: a request's Plan plus its acquisition groups, and how they survive a restart.

A booking is persisted on its ProvisioningRequest as JSON annotations (the API server would
prune unknown status fields of a CRD Muster does not own), and held in memory by
:class:`controller.state.cache.ClusterState`, which subtracts every other request's booking
from the snapshot it hands the fit engine. Pure: encoding, decoding and the "effective plan"
a booking still holds once some of its nodes exist and some of its pods run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from controller.fit.dra_types import ClaimAllocation, DeviceResult, PodDevices
from controller.fit.types import (
    Assignment,
    Mode,
    NewNodes,
    NewNodeSlot,
    Plan,
    PodSetPlacement,
)
from controller.lifecycle import PLAN_ANNOTATION


@dataclass(frozen=True, slots=True)
class Group:
    """New nodes of one pool in one domain, acquired as one unit under ``key``."""

    key: str
    pool: str
    domain: Mapping[str, str]
    count: int
    nodes: tuple[str, ...] = ()
    """Node names once acquired (sorted), empty before: the names the provider expects its
    machines to register as, a hint (a kubelet may register under another name)."""
    provider_ids: tuple[str, ...] = ()
    """``spec.providerID`` of every machine the provider launched (sorted), empty before:
    the identity of the group's nodes. Persisted with the plan once the provider answered,
    so a restarted controller finds the nodes whatever name they registered under."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "pool": self.pool,
            "domain": dict(self.domain),
            "count": self.count,
            "nodes": list(self.nodes),
        }
        if self.provider_ids:
            out["providerIDs"] = list(self.provider_ids)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Group:
        return cls(
            key=str(data["key"]),
            pool=str(data["pool"]),
            domain={str(k): str(v) for k, v in (data.get("domain") or {}).items()},
            count=int(data["count"]),
            nodes=tuple(str(n) for n in data.get("nodes") or ()),
            provider_ids=tuple(str(p) for p in data.get("providerIDs") or ()),
        )


@dataclass(frozen=True, slots=True)
class Booking:
    plan: Plan
    attempt: int
    groups: tuple[Group, ...] = field(default_factory=tuple)
    # Derived once: every node event asks each live booking whether it holds the node, so
    # recomputing these per question made a burst of N requests quadratic in N.
    _existing: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _acquired: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _provider_ids: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_existing", tuple(sorted(
            {a.node for a in self.plan.assignments if a.node is not None})))
        object.__setattr__(self, "_acquired", tuple(n for g in self.groups for n in g.nodes))
        object.__setattr__(self, "_provider_ids",
                           tuple(p for g in self.groups for p in g.provider_ids))

    @property
    def acquired_nodes(self) -> tuple[str, ...]:
        return self._acquired

    @property
    def existing_nodes(self) -> tuple[str, ...]:
        """Nodes that already existed when the plan was made."""
        return self._existing

    @property
    def acquired_provider_ids(self) -> tuple[str, ...]:
        return self._provider_ids

    def with_nodes(
        self,
        nodes: Mapping[str, Sequence[str]],
        provider_ids: Mapping[str, Sequence[str]] | None = None,
    ) -> Booking:
        """The booking with what the provider launched per key: node names (hints) and
        providerIDs (identities)."""
        ids = provider_ids or {}
        groups = tuple(
            replace(g, nodes=tuple(sorted(nodes.get(g.key, g.nodes))),
                    provider_ids=tuple(sorted(ids.get(g.key, g.provider_ids))))
            for g in self.groups
        )
        return replace(self, groups=groups)

    def to_annotation(self) -> str:
        return json.dumps(
            {"attempt": self.attempt, "plan": plan_to_json(self.plan),
             "groups": [g.to_json() for g in self.groups]},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, text: str) -> Booking:
        """Raise ValueError on anything malformed (a hand-edited annotation). Called only by
        :meth:`controller.state.requests.RequestRecord.parse`: a request's plan is decoded
        once, when the request arrives."""
        try:
            data = json.loads(text)
            return cls(
                plan=plan_from_json(data["plan"]),
                attempt=int(data["attempt"]),
                groups=tuple(Group.from_json(g) for g in data.get("groups") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed {PLAN_ANNOTATION} annotation: {exc}") from exc


def template_digest(template: Mapping[str, Any]) -> str:
    """A short digest of a PodTemplate's ``template`` (pod metadata and spec): equal for
    templates that plan the same, whatever their uid or resourceVersion."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stale_templates(
    recorded: Mapping[str, str], current: Mapping[str, str | None]
) -> tuple[list[str], list[str]]:
    """(deleted, changed) template names: what a booking planned from that is gone or not
    what it was. ``current``: name -> digest now, None when the template is missing."""
    deleted = sorted(n for n in recorded if current.get(n) is None)
    changed = sorted(n for n, d in recorded.items()
                     if current.get(n) is not None and current[n] != d)
    return deleted, changed


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return {
        "request": plan.request,
        "mode": str(plan.mode),
        "cost": plan.cost_per_hour,
        "assignments": [
            {
                "podSet": a.pod_set,
                "pods": a.pods,
                "node": a.node,
                "slot": None
                if a.new_node is None
                else [a.new_node.pool, dict(a.new_node.domain), a.new_node.index],
                "domain": dict(a.domain),
                "requests": dict(a.requests),
                **({"devices": [_pod_devices_to_json(p) for p in a.devices]}
                   if a.devices else {}),
            }
            for a in plan.assignments
        ],
        "newNodes": [
            {"pool": n.pool, "domain": dict(n.domain), "count": n.count, "cost": n.cost_per_hour}
            for n in plan.new_nodes
        ],
        "placements": [
            {
                "podSet": p.pod_set,
                "level": p.level,
                "domain": p.domain,
                "domainsUsed": p.domains_used,
                "labels": dict(p.domain_labels),
            }
            for p in plan.placements
        ],
    }


def _pod_devices_to_json(pod: PodDevices) -> list[dict[str, Any]]:
    return [
        {"claim": c.claim, "results": [
            {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device,
             **({"consumedCapacity": dict(r.consumed_capacity)} if r.consumed_capacity else {}),
             **({"adminAccess": True} if r.admin_access else {})}
            for r in c.results
        ]}
        for c in pod
    ]


def _pod_devices_from_json(data: Sequence[Mapping[str, Any]]) -> PodDevices:
    return tuple(
        ClaimAllocation(str(c["claim"]), tuple(
            DeviceResult(str(r["request"]), str(r["driver"]), str(r["pool"]), str(r["device"]),
                         {k: int(v) for k, v in (r.get("consumedCapacity") or {}).items()},
                         bool(r.get("adminAccess", False)))
            for r in c.get("results") or ()
        ))
        for c in data
    )


def _on_node(pods: Sequence[PodDevices], node: str) -> tuple[PodDevices, ...]:
    """Allocations planned on a new node (pool names unknown then, left empty) as they are
    once the node exists: the NVIDIA-style pool is named after the node."""
    return tuple(
        tuple(c._replace(results=tuple(r._replace(pool=r.pool or node) for r in c.results))
              for c in pod)
        for pod in pods
    )


def plan_from_json(data: Mapping[str, Any]) -> Plan:
    return Plan(
        request=str(data["request"]),
        mode=Mode(data["mode"]),
        assignments=tuple(
            Assignment(
                pod_set=a["podSet"],
                pods=int(a["pods"]),
                node=a.get("node"),
                new_node=None
                if a.get("slot") is None
                else NewNodeSlot(a["slot"][0], dict(a["slot"][1]), int(a["slot"][2])),
                domain=dict(a.get("domain") or {}),
                requests={k: int(v) for k, v in (a.get("requests") or {}).items()},
                devices=tuple(_pod_devices_from_json(p) for p in a.get("devices") or ()),
            )
            for a in data["assignments"]
        ),
        new_nodes=tuple(
            NewNodes(n["pool"], dict(n["domain"]), int(n["count"]), float(n.get("cost", 0.0)))
            for n in data["newNodes"]
        ),
        placements=tuple(
            PodSetPlacement(
                pod_set=p["podSet"],
                level=p.get("level"),
                domain=p.get("domain"),
                domains_used=int(p.get("domainsUsed", 1)),
                domain_labels=dict(p.get("labels") or {}),
            )
            for p in data.get("placements") or ()
        ),
        cost_per_hour=float(data.get("cost", 0.0)),
    )


def effective_plan(
    booking: Booking,
    *,
    existing: Mapping[str, bool],
    scheduled_on: Mapping[str, int],
    nodes_by_key: Mapping[str, Collection[str]] | None = None,
) -> Plan:
    """What ``booking`` still holds: the part of its plan other requests must not count.

    New-node slots whose nodes now exist become assignments to those nodes (the pool's
    headroom already counts them as existing nodes); groups not yet materialised stay new
    nodes. Pods of the request already bound to a node (``scheduled_on``: node -> pods
    consuming this request) are taken off that node's booking, because the node's free
    capacity already counts them (the double count of autoscaler#9805).
    ``existing`` tells which node names are currently in the cluster; ``nodes_by_key``
    (acquisition key -> registered node names, by providerID or the nodes' labels) covers
    nodes that registered before the acquisition returned and the booking learnt their
    names, and nodes that registered under another name than the provider's hint; without
    it they would look like free capacity for a moment.
    """
    slot_nodes: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, ...]] = {}
    for g in booking.groups:
        found = tuple(sorted((nodes_by_key or {}).get(g.key, ())))
        # A group's providerIDs resolve to the names its nodes registered under, which
        # may differ from the provider's name hints.
        names = found if g.provider_ids else (g.nodes or found)
        slot_nodes[(g.pool, tuple(sorted(g.domain.items())))] = names
    remaining = dict(scheduled_on)
    assignments: list[Assignment] = []
    for a in booking.plan.assignments:
        node = a.node
        if node is None and a.new_node is not None:
            names = slot_nodes.get((a.new_node.pool, tuple(sorted(a.new_node.domain.items()))), ())
            if a.new_node.index < len(names) and existing.get(names[a.new_node.index], False):
                node = names[a.new_node.index]
            else:
                continue  # still a new node: booked through new_nodes below
        if node is None:
            continue
        used = min(a.pods, remaining.get(node, 0))
        remaining[node] = remaining.get(node, 0) - used
        if a.pods - used > 0:
            # Bound pods hold their devices through their own ResourceClaims now.
            devices = _on_node(a.devices[used:], node)
            assignments.append(
                replace(a, node=node, new_node=None, pods=a.pods - used, devices=devices)
            )
    new_nodes = []
    for nn in booking.plan.new_nodes:
        names = slot_nodes.get((nn.pool, tuple(sorted(nn.domain.items()))), ())
        left = nn.count - sum(1 for n in names if existing.get(n, False))
        if left > 0:
            new_nodes.append(replace(nn, count=left))
    return replace(booking.plan, assignments=tuple(assignments), new_nodes=tuple(new_nodes))


def merge_plans(plans: Sequence[Plan]) -> Plan | None:
    """One Plan holding every assignment and new node of ``plans`` (booked all at once)."""
    if not plans:
        return None
    return Plan(
        request="bookings",
        mode=Mode.PROVISION,
        assignments=tuple(a for p in plans for a in p.assignments),
        new_nodes=tuple(n for p in plans for n in p.new_nodes),
        placements=(),
        cost_per_hour=0.0,
    )
