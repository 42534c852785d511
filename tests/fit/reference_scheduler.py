"""An independent reference of the kube-scheduler's default Filter plugins, for checking the
fit engine on e2e/parity_cases.py without a cluster. Written from the plugins' documented
behaviour on raw Kubernetes JSON; it imports nothing of controller.fit.

:func:`gang_fits` answers "is there an order and a choice of nodes in which every pod of
the gang passes every filter, one pod after another" by exhaustive search. That is an upper
bound of what the real scheduler achieves (it does not backtrack), so: Muster saying "fits"
where this says "no" is a Muster bug; the reverse is Muster being cautious.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Body = Mapping[str, Any]
HOST = "kubernetes.io/hostname"
_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DEC = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 0.001}
_INT = re.compile(r"[+-]?[0-9]+")


def quantity(text: str | int) -> float:
    text = str(text)
    for suffix, factor in (*_BIN.items(), *_DEC.items()):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def _container(c: Body) -> dict[str, float]:
    res = c.get("resources") or {}
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {k: quantity(v) for k, v in merged.items()}


def _sidecar(c: Body) -> bool:
    return c.get("restartPolicy") == "Always"


def requests(pod: Body) -> dict[str, float]:
    """resourcehelper.PodRequests: regular containers and sidecars run together; each
    ordinary init container runs next to the sidecars started before it; the pod needs the
    larger; pod-level cpu and memory requests replace the containers'."""
    spec = pod["spec"]
    total: dict[str, float] = {}
    for c in spec["containers"]:
        for k, v in _container(c).items():
            total[k] = total.get(k, 0) + v
    sidecars: dict[str, float] = {}
    peak: dict[str, float] = {}
    for c in spec.get("initContainers") or []:
        mine = _container(c)
        if _sidecar(c):
            for k, v in mine.items():
                sidecars[k] = sidecars.get(k, 0) + v
            step = dict(sidecars)
        else:
            step = {k: sidecars.get(k, 0) + mine.get(k, 0) for k in {*sidecars, *mine}}
        for k, v in step.items():
            peak[k] = max(peak.get(k, 0), v)
    for k, v in sidecars.items():
        total[k] = total.get(k, 0) + v
    for k, v in peak.items():
        total[k] = max(total.get(k, 0), v)
    for k, v in _container({"resources": spec.get("resources") or {}}).items():
        if k in ("cpu", "memory"):
            total[k] = v
    total["pods"] = 1
    return total


def ports(pod: Body) -> list[tuple[str, str, int]]:
    """schedutil.GetHostPorts: sidecars' and regular containers' host ports (hostNetwork
    defaults hostPort to containerPort)."""
    spec = pod["spec"]
    out = []
    containers = [c for c in spec.get("initContainers") or [] if _sidecar(c)]
    for c in [*containers, *spec["containers"]]:
        for p in c.get("ports") or []:
            port = p.get("hostPort") or (p["containerPort"] if spec.get("hostNetwork") else 0)
            if port:
                out.append((p.get("protocol", "TCP"), p.get("hostIP", "") or "0.0.0.0", port))
    return out


def _tolerates(tol: Body, taint: Body) -> bool:
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    if tol.get("key") and tol["key"] != taint["key"]:
        return False
    if tol.get("operator") == "Exists":
        return True
    return tol.get("value", "") == taint.get("value", "")


CONDITION_TAINTS = {("Ready", "False"): "node.kubernetes.io/not-ready",
                    ("Ready", "Unknown"): "node.kubernetes.io/unreachable",
                    ("MemoryPressure", "True"): "node.kubernetes.io/memory-pressure",
                    ("DiskPressure", "True"): "node.kubernetes.io/disk-pressure",
                    ("PIDPressure", "True"): "node.kubernetes.io/pid-pressure",
                    ("NetworkUnavailable", "True"): "node.kubernetes.io/network-unavailable"}


def node_taints(node: Body) -> list[Body]:
    """The node's taints once the node lifecycle controller has run: its NoSchedule
    condition taints are exactly those its conditions call for."""
    conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
    keep = [t for t in node.get("spec", {}).get("taints") or []
            if not (t["key"] in CONDITION_TAINTS.values() and t["effect"] == "NoSchedule")]
    return keep + [{"key": taint, "effect": "NoSchedule"}
                   for (kind, status), taint in CONDITION_TAINTS.items()
                   if conditions.get(kind) == status]


def _requirement(req: Body, value: str | None) -> bool:
    op, values = req["operator"], req.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if value is None or not _INT.fullmatch(value) or not _INT.fullmatch(values[0]):
        return False
    return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])


def node_affinity(pod: Body, node: Body) -> bool:
    labels = node["metadata"].get("labels") or {}
    spec = pod["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    for term in required["nodeSelectorTerms"]:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_requirement(r, labels.get(r["key"])) for r in exprs) and all(
            _requirement(r, node["metadata"]["name"]) for r in fields
        ):
            return True
    return False


def _selector(sel: Body | None, labels: Mapping[str, str]) -> bool:
    if sel is None:
        return False
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    return all(_requirement(r, labels.get(r["key"])) for r in sel.get("matchExpressions") or [])


class Cluster:
    def __init__(self, nodes: Sequence[Body], running: Sequence[Body]) -> None:
        self.nodes = list(nodes)
        self.by_name = {n["metadata"]["name"]: n for n in nodes}
        self.placed: list[tuple[Body, str]] = [(p, p["spec"]["nodeName"]) for p in running]

    def _on(self, name: str) -> list[Body]:
        return [p for p, n in self.placed if n == name]

    def fits(self, pod: Body, node: Body) -> bool:
        name = node["metadata"]["name"]
        spec = pod["spec"]
        bound = spec.get("nodeName")
        if bound and bound != name:
            return False
        taints = node_taints(node)
        if not bound:
            if node.get("spec", {}).get("unschedulable") and not any(
                _tolerates(t, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
                for t in spec.get("tolerations") or []
            ):
                return False
            blocking = [t for t in taints if t["effect"] in ("NoSchedule", "NoExecute")]
        else:
            blocking = [t for t in taints if t["effect"] == "NoExecute"]
        if any(not any(_tolerates(tol, t) for tol in spec.get("tolerations") or [])
               for t in blocking):
            return False
        if not node_affinity(pod, node):
            return False
        return (self._resources(pod, node) and self._ports(pod, name)
                and (bool(bound) or (self._spread(pod, node) and self._inter_pod(pod, node))))

    def _resources(self, pod: Body, node: Body) -> bool:
        alloc = {k: quantity(v) for k, v in node["status"]["allocatable"].items()}
        used: dict[str, float] = {}
        for p in self._on(node["metadata"]["name"]):
            for k, v in requests(p).items():
                used[k] = used.get(k, 0) + v
        return all(v <= 0 or used.get(k, 0) + v <= alloc.get(k, 0) + 1e-9
                   for k, v in requests(pod).items())

    def _ports(self, pod: Body, name: str) -> bool:
        used = [q for p in self._on(name) for q in ports(p)]
        for proto, ip, port in ports(pod):
            for uproto, uip, uport in used:
                if (proto, port) == (uproto, uport) and (
                    "0.0.0.0" in (ip, uip) or ip == uip
                ):
                    return False
        return True

    def _domain(self, name: str, key: str) -> str | None:
        labels: Mapping[str, str] = self.by_name[name]["metadata"].get("labels") or {}
        return labels.get(key)

    def _spread(self, pod: Body, node: Body) -> bool:
        ns = pod["metadata"]["namespace"]
        own = pod["metadata"].get("labels") or {}
        for tsc in pod["spec"].get("topologySpreadConstraints") or []:
            if tsc["whenUnsatisfiable"] != "DoNotSchedule":
                continue
            key = tsc["topologyKey"]
            here = (node["metadata"].get("labels") or {}).get(key)
            if here is None:
                return False
            sel = dict(tsc.get("labelSelector") or {})
            for k in tsc.get("matchLabelKeys") or []:
                if k in own:
                    sel.setdefault("matchLabels", {})
                    sel["matchLabels"] = {**sel["matchLabels"], k: own[k]}
            eligible = [n for n in self.nodes if key in (n["metadata"].get("labels") or {})
                        and (tsc.get("nodeAffinityPolicy") == "Ignore" or node_affinity(pod, n))
                        and (tsc.get("nodeTaintsPolicy") != "Honor" or all(
                            any(_tolerates(tol, t) for tol in pod["spec"].get("tolerations") or [])
                            for t in node_taints(n) if t["effect"] in ("NoSchedule", "NoExecute")))]
            counts = {n["metadata"]["labels"][key]: 0 for n in eligible}
            names = {n["metadata"]["name"] for n in eligible}
            for p, on in self.placed:
                if on in names and p["metadata"]["namespace"] == ns and _selector(
                        sel, p["metadata"].get("labels") or {}):
                    counts[self._domain(on, key) or ""] += 1
            low = 0 if len(counts) < (tsc.get("minDomains") or 1) else min(counts.values(),
                                                                             default=0)
            self_match = 1 if _selector(sel, own) else 0
            if counts.get(here, 0) + self_match - low > tsc["maxSkew"]:
                return False
        return True

    def _terms(self, pod: Body, kind: str) -> list[Body]:
        aff = (pod["spec"].get("affinity") or {}).get(kind) or {}
        return list(aff.get("requiredDuringSchedulingIgnoredDuringExecution") or [])

    @staticmethod
    def _scope(term: Body, owner: Body, other: Body) -> bool:
        if term.get("namespaceSelector") == {}:
            return True
        spaces = term.get("namespaces") or [owner["metadata"]["namespace"]]
        return bool(other["metadata"]["namespace"] in spaces)

    def _inter_pod(self, pod: Body, node: Body) -> bool:
        labels = node["metadata"].get("labels") or {}
        own = pod["metadata"].get("labels") or {}
        for term in self._terms(pod, "podAntiAffinity"):
            key = term["topologyKey"]
            if key not in labels:
                continue
            for p, on in self.placed:
                theirs = p["metadata"].get("labels") or {}
                if (self._domain(on, key) == labels[key] and self._scope(term, pod, p)
                        and _selector(term.get("labelSelector"), theirs)):
                    return False
        for p, on in self.placed:
            for term in self._terms(p, "podAntiAffinity"):
                key = term["topologyKey"]
                if (key in labels and self._domain(on, key) == labels[key]
                        and self._scope(term, p, pod)
                        and _selector(term.get("labelSelector"), own)):
                    return False
        terms = self._terms(pod, "podAffinity")
        if not terms:
            return True
        anywhere = any(all(self._scope(t, pod, p) and _selector(
            t.get("labelSelector"), p["metadata"].get("labels") or {}) for t in terms)
            for p, _ in self.placed)
        if not anywhere:
            return all(_selector(t.get("labelSelector"), own) for t in terms) and all(
                t["topologyKey"] in labels for t in terms)
        for term in terms:
            key = term["topologyKey"]
            if key not in labels or not any(
                self._domain(on, key) == labels[key] and self._scope(term, pod, p)
                and _selector(term.get("labelSelector"), p["metadata"].get("labels") or {})
                for p, on in self.placed
            ):
                return False
        return True


def gang_fits(nodes: Sequence[Body], running: Sequence[Body], pods: Sequence[Body],
              *, budget: int = 20_000) -> bool | None:
    """Whether some order of choices places every pod (None: search budget exhausted).
    Pods of one template are interchangeable; states are memoised."""
    cluster = Cluster(nodes, running)
    groups: list[list[Body]] = []
    for pod in pods:
        name = pod["metadata"]["name"].rsplit("-", 1)[0]
        if groups and groups[-1][0]["metadata"]["name"].rsplit("-", 1)[0] == name:
            groups[-1].append(pod)
        else:
            groups.append([pod])
    seen: set[tuple[tuple[str, ...], ...]] = set()
    steps = [0]

    def search(g: int, i: int, state: tuple[tuple[str, ...], ...]) -> bool | None:
        if g == len(groups):
            return True
        if i == len(groups[g]):
            return search(g + 1, 0, (*state, ()))
        key = (*state[:-1], tuple(sorted(state[-1])))
        if key in seen:
            return False
        seen.add(key)
        steps[0] += 1
        if steps[0] > budget:
            return None
        pod = groups[g][i]
        unknown = False
        for node in nodes:
            if not cluster.fits(pod, node):
                continue
            name = node["metadata"]["name"]
            cluster.placed.append((pod, name))
            got = search(g, i + 1, (*state[:-1], (*state[-1], name)))
            cluster.placed.pop()
            if got:
                return True
            unknown = unknown or got is None
        return None if unknown else False

    return search(0, 0, ((),))
