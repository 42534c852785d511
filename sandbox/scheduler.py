"""The sandbox scheduler: a small binder standing in for kube-scheduler in the demo and the
kind-less e2e run. It is independent of Muster's fit engine on purpose (import-linter keeps
it so): it places pods the way a cluster would, so tests see where pods really land.

Rules: resource requests (cpu, memory, extended resources such as ``nvidia.com/gpu``, and the
``pods`` count) against node allocatable minus the requests of pods already bound there;
nodeSelector; required node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt, and matchFields
on metadata.name); NoSchedule/NoExecute taints against tolerations; the node's Ready condition
and ``spec.unschedulable``. Pods with scheduling gates, a deletionTimestamp or another
schedulerName are left alone. Among feasible nodes it picks the most allocated one after
placement (bin packing, as a gang-friendly cluster would configure), ties broken by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.errors import ApiError
from sandbox.quantity import QuantityError, pod_requests, resource_map
from sandbox.store import Store, now_iso
from sandbox.watch import Watcher

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]
Key = tuple[str, str]
DONE_PHASES = frozenset({"Succeeded", "Failed"})


def _labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = expr.get("key", ""), expr.get("operator", "")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_holds(term: Mapping[str, Any], node: Obj) -> bool:
    labels = _labels(node)
    fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
    exprs = term.get("matchExpressions") or []
    field_exprs = term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False  # an empty term matches nothing, as in kube-scheduler
    return all(_expression_holds(e, labels) for e in exprs) and all(
        _expression_holds(e, fields) for e in field_exprs
    )


def affinity_allows(pod: Obj, node: Obj) -> bool:
    """nodeSelector and requiredDuringSchedulingIgnoredDuringExecution node affinity."""
    spec = pod.get("spec") or {}
    labels = _labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != str(value):
            return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    return any(_term_holds(t, node) for t in required.get("nodeSelectorTerms") or [])


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (
        taint.get("value") or ""
    )


def taints_allow(pod: Obj, node: Obj) -> bool:
    """Every NoSchedule/NoExecute taint of the node (and the unschedulable taint when the node
    is cordoned) must be tolerated by the pod."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    taints = [
        t for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return all(any(_tolerates(tol, t) for tol in tolerations) for t in taints)


def node_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _allocatable(node: Obj) -> dict[str, int]:
    status = node.get("status") or {}
    alloc = resource_map(status.get("allocatable") or status.get("capacity"))
    alloc.setdefault("pods", 110)
    return alloc


@dataclass
class Placement:
    namespace: str
    name: str
    node: str


class SandboxScheduler:
    """Binds pending pods to nodes (see module docstring). Use ``start``/``stop`` for the
    event-driven background loop or ``schedule_once`` for one synchronous pass."""

    def __init__(
        self,
        store: Store,
        *,
        running_phase: str | None = "Running",
        scheduler_name: str = "default-scheduler",
    ) -> None:
        self.store = store
        self.running_phase = running_phase
        self.scheduler_name = scheduler_name
        self.placements: list[Placement] = []
        self._task: asyncio.Task[None] | None = None
        self._watchers: list[Watcher] = []

    # ------------------------------------------------------------------ decisions

    def _wants(self, pod: Obj) -> bool:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        return (
            not spec.get("nodeName")
            and not spec.get("schedulingGates")
            and not meta.get("deletionTimestamp")
            and (spec.get("schedulerName") or "default-scheduler") == self.scheduler_name
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        )

    def _used(self, node_name: str) -> dict[str, int]:
        used: dict[str, int] = {}
        for pod in self.store.pods_on_node(node_name):
            if (pod.get("status") or {}).get("phase") in DONE_PHASES:
                continue
            try:
                requests = pod_requests(pod)
            except QuantityError:
                continue
            for k, v in requests.items():
                used[k] = used.get(k, 0) + v
        return used

    def explain(self, pod: Obj, node: Obj, used: Mapping[str, int] | None = None) -> str | None:
        """Why ``pod`` cannot go to ``node`` (None when it fits)."""
        name = (node.get("metadata") or {}).get("name", "")
        if not node_ready(node):
            return "node is not Ready"
        if not taints_allow(pod, node):
            return "untolerated taint"
        if not affinity_allows(pod, node):
            return "node selector or affinity mismatch"
        try:
            requests = pod_requests(pod)
            alloc = _allocatable(node)
        except QuantityError as exc:
            return f"invalid quantity: {exc}"
        used = used if used is not None else self._used(name)
        for resource, amount in requests.items():
            if amount and used.get(resource, 0) + amount > alloc.get(resource, 0):
                return f"insufficient {resource}"
        return None

    def _score(self, pod: Obj, node: Obj, used: Mapping[str, int]) -> float:
        requests = pod_requests(pod)
        alloc = _allocatable(node)
        fractions = [
            (used.get(r, 0) + amount) / alloc[r]
            for r, amount in requests.items() if r != "pods" and alloc.get(r)
        ]
        return sum(fractions) / len(fractions) if fractions else 0.0

    def choose(
        self, pod: Obj, nodes: Sequence[Obj], usage: dict[str, dict[str, int]],
    ) -> str | None:
        """The chosen node's name, or None when no node fits."""
        best: tuple[float, str] | None = None
        for node in nodes:
            name = node["metadata"]["name"]
            used = usage.setdefault(name, self._used(name))
            if self.explain(pod, node, used) is not None:
                continue
            score = self._score(pod, node, used)
            # Highest score first, then the smallest name: negate the score for min().
            candidate = (-score, name)
            if best is None or candidate < best:
                best = candidate
        return best[1] if best else None

    def schedule_once(self) -> list[Placement]:
        """One pass over every pending pod, in creation order; returns the bindings made."""
        table = self.store.table(self.store.resolve("pods"))
        assert table.by_node is not None
        bound = [k for keys in table.by_node.values() for k in keys]
        return self._pass(list(table.objects), bound)

    def _pass(self, candidates: Iterable[Key], bound: Iterable[Key]) -> list[Placement]:
        table = self.store.table(self.store.resolve("pods"))
        nodes = sorted(self.store.list_raw(self.store.resolve("nodes"))[0],
                       key=lambda n: n["metadata"]["name"])
        pods = [table.objects[k] for k in candidates
                if k in table.objects and self._wants(table.objects[k])]
        pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                 int(p["metadata"].get("resourceVersion", 0))))
        usage: dict[str, dict[str, int]] = {}
        made: list[Placement] = []
        for pod in pods:
            meta = pod["metadata"]
            node = self.choose(pod, nodes, usage)
            if node is None:
                self._mark_unschedulable(pod, len(nodes))
                continue
            try:
                self.store.bind(meta["name"], meta["namespace"], node, phase=self.running_phase)
            except ApiError as err:
                log.debug("binding %s/%s failed: %s", meta["namespace"], meta["name"], err)
                continue
            for k, v in pod_requests(pod).items():
                usage[node][k] = usage[node].get(k, 0) + v
            made.append(Placement(meta["namespace"], meta["name"], node))
        self._start_bound_pods(bound)
        self.placements.extend(made)
        return made

    def _start_bound_pods(self, keys: Iterable[Key]) -> None:
        # The kubelet's part: pods created with spec.nodeName go Running too.
        if not self.running_phase:
            return
        table = self.store.table(self.store.resolve("pods"))
        for key in list(keys):
            pod = table.objects.get(key)
            if pod is None or not (pod.get("spec") or {}).get("nodeName"):
                continue
            if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            with contextlib.suppress(ApiError):
                self.store.patch("pods", key[1], {"status": {"phase": self.running_phase}},
                                 key[0], subresource="status")

    def _mark_unschedulable(self, pod: Obj, node_count: int) -> None:
        message = f"0/{node_count} nodes are available for this pod"
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("message") == message:
                return
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "PodScheduled"]
        conditions.append({
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastProbeTime": None, "lastTransitionTime": now_iso(),
        })
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            self.store.patch("pods", meta["name"], {"status": {"conditions": conditions}},
                             meta["namespace"], subresource="status")

    # ------------------------------------------------------------------ background loop

    async def start(self) -> None:
        """Schedule in the background, driven by pod and node watch events."""
        if self._task is not None:
            return
        # Without a resourceVersion the watches begin with every current object (ADDED).
        self._watchers = [self.store.watch("pods"), self.store.watch("nodes")]
        self._task = asyncio.create_task(self._run(), name="sandbox-scheduler")

    async def stop(self) -> None:
        for w in self._watchers:
            w.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        pods, nodes = self._watchers
        # Pending pods and bound-but-not-started pods, tracked from events so that a pass costs
        # O(pending + nodes), not O(all pods).
        pending: set[Key] = set()
        starting: set[Key] = set()
        while True:
            await self._either(pods, nodes)
            changed = False
            for type_, ev in await pods.next_batch(0):
                meta = ev.obj["metadata"]
                key = (meta.get("namespace", ""), meta["name"])
                pending.discard(key)
                starting.discard(key)
                if type_ != "DELETED" and self._wants(ev.obj):
                    pending.add(key)
                elif type_ != "DELETED" and (ev.obj.get("spec") or {}).get("nodeName"):
                    starting.add(key)
                changed = True
            if await nodes.next_batch(0):
                changed = True
            if pods.closed or nodes.closed:
                return
            if changed and (pending or starting):
                try:
                    self._pass(sorted(pending), sorted(starting))
                except Exception:  # keep scheduling after a bad pod; log it loudly
                    log.exception("sandbox scheduler pass failed")
                starting.clear()

    @staticmethod
    async def _either(a: Watcher, b: Watcher) -> None:
        """Wait until either watcher has events or is closed."""
        if a.queue or b.queue or a.closed or b.closed:
            return
        a.wakeup.clear()
        b.wakeup.clear()
        waits = [asyncio.create_task(a.wakeup.wait()), asyncio.create_task(b.wakeup.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in waits:
                t.cancel()
