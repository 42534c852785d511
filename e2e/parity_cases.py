"""Seeded cases for the differential test against the real kube-scheduler (issue 13).

Each :class:`Case` is a small cluster (Nodes, and Pods already running on them) and a gang
(a check-capacity ProvisioningRequest with its PodTemplates), all as Kubernetes JSON objects.
Muster's answer comes from ``muster fit --mode check --json`` (:func:`muster_answer`); the
scheduler's answer is: create ``case.nodes()`` and ``case.running()``, then ``case.pods()``,
and see whether every pod gets bound. Typical use::

    from e2e.parity_cases import cases, muster_answer
    for case in cases(seed=0, count=500):
        ours = muster_answer(case)          # Answer(fits=..., refused=..., reasons=...)
        ...create case.namespace, case.nodes(), case.running(), then case.pods()...
        theirs = all pods bound within the timeout
        agree = ours.refused or ours.fits == theirs

Conventions that make the two answers comparable:

* every node carries ``parity.muster.dev/case=<case id>`` and every pod template selects it,
  so a case's pods see only its own nodes even when cases share a cluster (the control-plane
  node, other cases' nodes). Run cases one at a time or in their own namespaces; nodes are
  cluster-scoped and named ``<case id>-n<i>``;
* nodes report Ready (add them as kwok or fake nodes: no kubelet). A node marked
  ``condition-taint`` is Ready yet still carries ``node.kubernetes.io/not-ready``, which the
  node lifecycle controller removes: wait for that before judging;
* ``running()`` pods carry ``spec.nodeName`` and hold capacity from creation;
* a case Muster *refuses* (``Answer.refused``) names a constraint it does not plan; the
  scheduler may still place it: count those apart, they are documented limits, not
  disagreements (docs/design/filter-parity.md);
* a ``"node-name"`` case has pods with ``spec.nodeName``: no scheduler places them, the
  node's kubelet admits or rejects them (resources, ports, node affinity, NoExecute taints).
  kwok does no admission, so on kwok nodes such a pod always "runs": judge those cases by
  the pod's admission on a real kubelet, or leave them out;
* a node with a ``pressure`` condition (memory, disk, PID) may carry its taint or not: the
  node lifecycle controller adds or removes it to follow the condition, so wait for that
  too (``e2e.scheduler_oracle`` does);
* a spread constraint with ``nodeAffinityPolicy: Ignore`` counts domains of every node in
  the cluster, the other cases' included: run such a case alone;
* several pod sets in one gang compete for nodes in the order the scheduler takes their
  pods, which Muster does not control (``"pod-sets"`` in ``Case.fields``); single pod set
  cases have no such order effect.

``python3 -m e2e.parity_cases [--seed S] [--count N] [--out DIR]`` writes every case as
``<id>/cluster.json``, ``<id>/request.json``, ``<id>/pods.json`` and Muster's answer as
``<id>/muster.json``; with ``--provision``, the provisioning-mode cases (:func:`provision_case`:
CapacityPools in ``pools.json``, the nodes of Muster's plan as the fake provider registers
them in ``planned.json``).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Body = dict[str, Any]

CASE_LABEL = "parity.muster.dev/case"
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
BLOCK = "topology.muster.dev/block"
RACK = "topology.muster.dev/rack"
LEVELS = (BLOCK, RACK, HOST)
EXT = "example.com/widget"
PAUSE = "registry.k8s.io/pause:3.10"
PRESSURE = (("MemoryPressure", "node.kubernetes.io/memory-pressure"),
            ("DiskPressure", "node.kubernetes.io/disk-pressure"),
            ("PIDPressure", "node.kubernetes.io/pid-pressure"))

FIELDS = (
    "resources", "pod-count", "extended-resource", "node-name", "node-selector",
    "affinity-in", "affinity-notin", "affinity-exists", "affinity-gt-lt", "match-fields",
    "taints", "no-execute", "prefer-no-schedule", "condition-taint", "unschedulable",
    "host-port", "spread", "anti-affinity", "anti-affinity-running", "pod-affinity",
    "pod-sets", "unsupported",
    "init-containers", "pod-resources", "host-network", "pods-unreported", "no-cpu-request",
    "quantities", "spread-policies", "pressure",
)
"""What a case exercises; case ``i`` always exercises ``FIELDS[i % len(FIELDS)]``."""


@dataclass
class Case:
    id: str
    seed: int
    fields: tuple[str, ...]
    namespace: str
    node_objects: list[Body]
    running_pods: list[Body]
    templates: list[Body]
    request: Body
    counts: dict[str, int] = field(default_factory=dict)
    """PodTemplate name -> pods of that pod set."""
    pools: list[Body] = field(default_factory=list)
    """CapacityPools (provisioning mode): Muster plans new nodes from them, and the nodes it
    plans are created as the fake provider creates them before the gang's pods."""
    planned: list[Body] = field(default_factory=list)
    """The new nodes of Muster's plan (or every node the pools may add, when Muster said
    no), filled in by :meth:`plan_nodes`."""

    @property
    def mode(self) -> str:
        return "provision" if self.pools else "check"

    def plan_nodes(self, answer: Answer) -> list[Body]:
        """The Nodes the provider would register for Muster's plan: ``new_nodes`` of the
        plan, or, when Muster found no plan, every node the pools may add in every domain
        (the scheduler placing the gang there proves a plan existed)."""
        from controller.api.capacitypool import CapacityPool

        pools = {p["metadata"]["name"]: CapacityPool.model_validate(p) for p in self.pools}
        wanted: list[tuple[str, dict[str, str], int]] = []
        if answer.plan is not None:
            wanted = [(n["pool"], dict(n["domain"]), int(n["count"]))
                      for n in answer.plan.get("new_nodes") or ()]
        elif not answer.refused:
            for name, pool in pools.items():
                left = pool.spec.max_nodes
                topo = pool.spec.topology
                for d in (topo.domains if topo else []):
                    n = min(left, d.max_nodes if d.max_nodes is not None
                            else topo.max_nodes_per_domain if topo else left)
                    if n > 0:
                        wanted.append((name, dict(d.labels), n))
                        left -= n
                if topo is None and left > 0:
                    wanted.append((name, {}, left))
        self.planned = [new_node(self, pools[pool], domain, f"{self.id}-x{k}")
                        for k, (pool, domain) in enumerate(
                            (p, d) for p, d, n in wanted for _ in range(n))]
        return [json.loads(json.dumps(n)) for n in self.planned]

    def nodes(self) -> list[Body]:
        return [json.loads(json.dumps(n)) for n in self.node_objects]

    def running(self) -> list[Body]:
        """Pods already bound (spec.nodeName) before the gang arrives."""
        return [json.loads(json.dumps(p)) for p in self.running_pods]

    def pods(self) -> list[Body]:
        """The gang's pods, as a job controller would create them from the templates."""
        out = []
        for t in self.templates:
            name = t["metadata"]["name"]
            for i in range(self.counts[name]):
                tpl = json.loads(json.dumps(t["template"]))
                out.append({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-{i}", "namespace": self.namespace,
                                 "labels": tpl["metadata"].get("labels", {}),
                                 "annotations": tpl["metadata"].get("annotations", {})},
                    "spec": tpl["spec"],
                })
        return out

    def pool_documents(self) -> list[Body]:
        """What ``muster fit --pools`` reads."""
        return [json.loads(json.dumps(p)) for p in self.pools]

    def cluster_documents(self) -> list[Body]:
        """What ``muster fit --snapshot`` reads: the nodes and the running pods."""
        return [*self.nodes(), *self.running()]

    def request_documents(self) -> list[Body]:
        """What ``muster fit`` reads as the request: the ProvisioningRequest and templates."""
        return [json.loads(json.dumps(self.request)), *(json.loads(json.dumps(t))
                                                        for t in self.templates)]


@dataclass(frozen=True)
class Answer:
    fits: bool
    refused: bool
    """Muster refused a constraint it does not plan (then ``fits`` is False)."""
    reasons: tuple[str, ...]
    exit_code: int
    plan: Body | None = None


def new_node(case: Case, pool: Any, domain: dict[str, str], name: str) -> Body:
    """A Node of ``pool`` in ``domain`` exactly as it ends up when a machine of the fake
    cloud registers (its kubelet's labels from controller.inputs.node_labels, the startup taint)
    and Muster registers it (the template's labels and taints, the domain, the startup
    taint lifted), named for the case and labelled with it."""
    from datetime import UTC, datetime

    from controller.acquire.registration import registration
    from controller.api.node import Node
    from controller.state.bookings import Group
    from providers.base import AcquireRequest
    from providers.fake import _machine, kubelet_node

    request = AcquireRequest(key=f"{case.id}-k", pool=pool, count=1, domain=domain,
                             owner=f"{case.namespace}/gang")
    node = kubelet_node(_machine(pool, request, name), now=datetime.now(UTC))
    node["metadata"]["resourceVersion"] = "1"
    group = Group(key=request.key, pool=pool.metadata.name, domain=domain, count=1)
    patch = registration(Node.model_validate(node), pool, group, owner=request.owner,
                         owner_uid="")
    assert isinstance(patch, dict), patch
    node["metadata"]["labels"].update(patch["metadata"].get("labels", {}))
    node["metadata"].setdefault("annotations", {}).update(
        patch["metadata"].get("annotations", {}))
    if "spec" in patch:
        node["spec"]["taints"] = patch["spec"]["taints"]
    del node["metadata"]["resourceVersion"]
    node["metadata"]["labels"][CASE_LABEL] = case.id
    return node


def muster_answer(case: Case, *, workdir: Path | None = None) -> Answer:
    """``muster fit REQUEST --snapshot CLUSTER --mode check --json`` on the case (``--mode
    provision --pools POOLS`` for a case with pools), run in-process through the CLI (the
    same code path as the command)."""
    from typer.testing import CliRunner

    from controller.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        where = workdir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        request = where / "request.json"
        cluster = where / "cluster.json"
        request.write_text(json.dumps({"kind": "List", "items": case.request_documents()}))
        cluster.write_text(json.dumps({"kind": "List", "items": case.cluster_documents()}))
        extra: list[str] = []
        if case.pools:
            pools = where / "pools.json"
            pools.write_text(json.dumps({"kind": "List", "items": case.pool_documents()}))
            extra = ["--pools", str(pools)]
        result = CliRunner().invoke(app, [
            "fit", str(request), "--snapshot", str(cluster), "--mode", case.mode, "--json",
            "--levels", ",".join(LEVELS), *extra,
        ])
    if result.exit_code not in (0, 1):
        text = result.output.strip()
        if case.pools and "PodTemplate" in text:
            # A template the API server refuses (Muster says InvalidParameters): no pod of
            # the gang can be created, so "does not fit" is the answer to compare.
            return Answer(False, False, (text,), result.exit_code)
        return Answer(False, True, (text,), result.exit_code)
    payload = json.loads(result.stdout)
    reasons = tuple(f"{r['code']}: {r['message']}" for r in payload.get("reasons") or ())
    refused = any(r.get("code") == "Unsupported" for r in payload.get("reasons") or ())
    return Answer(bool(payload["fits"]), refused, reasons, result.exit_code,
                  payload if payload["fits"] else None)


# ---------------------------------------------------------------------------- generation


class _Gen:
    def __init__(self, rng: random.Random, case_id: str, focus: str) -> None:
        self.rng = rng
        self.id = case_id
        self.focus = focus
        self.fields: set[str] = {focus}
        self.namespace = case_id

    def want(self, name: str, p: float) -> bool:
        """Exercise ``name`` in this case: always when it is the focus, else with ``p``."""
        if name == self.focus or self.rng.random() < p:
            self.fields.add(name)
            return True
        return False

    # ------------------------------------------------------------------ nodes

    def node(self, i: int) -> Body:
        rng = self.rng
        name = f"{self.id}-n{i}"
        labels = {HOST: name, CASE_LABEL: self.id, BLOCK: "b1", RACK: f"r{i % 2 + 1}",
                  "disk": rng.choice(["ssd", "hdd"]), "gen": str(rng.randint(1, 5))}
        if rng.random() < 0.85:
            labels[ZONE] = f"z{i % 3}"
        pods = rng.choice(["3", "5", "110"]) if "pod-count" in self.fields else "110"
        if "quantities" in self.fields and rng.random() < 0.7:
            cpu = rng.choice(["3800m", "3.5", "7900m", "2", "1.9"])
            memory = rng.choice(["7.5Gi", "16093128Ki", "8000M", "15.5Gi", "4Gi"])
        else:
            cpu = rng.choice(["2", "4", "4", "8"])
            memory = rng.choice(["4Gi", "8Gi", "16Gi"])
        alloc = {"cpu": cpu, "memory": memory, "pods": pods}
        capacity = dict(alloc)
        if "pods-unreported" in self.fields and rng.random() < 0.5:
            # A node whose status lists no pod count (no kubelet would, but nothing stops it).
            del alloc["pods"]
            if rng.random() < 0.5:
                del capacity["pods"]
        if "extended-resource" in self.fields and rng.random() < 0.6:
            alloc[EXT] = capacity[EXT] = str(rng.randint(1, 4))
        spec: Body = {"taints": self._taints()}
        if "unschedulable" in self.fields and rng.random() < 0.5:
            spec["unschedulable"] = True
        if "condition-taint" in self.fields and rng.random() < 0.5:
            spec["taints"].append({"key": "node.kubernetes.io/not-ready",
                                   "effect": "NoSchedule"})
        conditions = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        if "pressure" in self.fields and rng.random() < 0.6:
            kind, taint = rng.choice(PRESSURE)
            bad = rng.random() < 0.6
            conditions.append({"type": kind, "status": "True" if bad else "False",
                               "reason": f"Kubelet{'Has' if bad else 'HasNo'}{kind}"})
            if rng.random() < 0.5:
                # Present or not, the node lifecycle controller makes the taint follow the
                # condition: the scheduler sees it once that happened.
                spec["taints"].append({"key": taint, "effect": "NoSchedule"})
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": spec,
            "status": {"capacity": capacity, "allocatable": alloc,
                       "conditions": conditions},
        }

    def _taints(self) -> list[Body]:
        rng = self.rng
        out = []
        if "taints" in self.fields and rng.random() < 0.5:
            out.append({"key": "dedicated", "value": rng.choice(["ml", "db"]),
                        "effect": "NoSchedule"})
        if "no-execute" in self.fields and rng.random() < 0.5:
            out.append({"key": "maintenance", "value": "true", "effect": "NoExecute"})
        if "prefer-no-schedule" in self.fields and rng.random() < 0.5:
            out.append({"key": "spot", "value": "true", "effect": "PreferNoSchedule"})
        return out

    # ------------------------------------------------------------------ pods

    def tolerations(self) -> list[Body]:
        rng = self.rng
        out: list[Body] = []
        if self.fields & {"taints", "no-execute", "unschedulable", "condition-taint"}:
            for tol in (
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Exists"},
                {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                 "effect": "NoSchedule"},
                {"operator": "Exists"},
            ):
                if rng.random() < 0.25:
                    out.append(tol)
        if "pressure" in self.fields:
            for _, taint in PRESSURE:
                if rng.random() < 0.3:
                    out.append({"key": taint, "operator": "Exists", "effect": "NoSchedule"})
        return out

    def affinity_terms(self) -> list[Body]:
        rng = self.rng
        exprs: list[Body] = []
        if self.want("affinity-in", 0.1):
            exprs.append({"key": "disk", "operator": "In", "values": ["ssd"]})
        if self.want("affinity-notin", 0.1):
            exprs.append({"key": ZONE, "operator": "NotIn",
                          "values": [rng.choice(["z0", "z1", "z2"])]})
        if self.want("affinity-exists", 0.1):
            exprs.append({"key": ZONE, "operator": rng.choice(["Exists", "DoesNotExist"])})
        if self.want("affinity-gt-lt", 0.1):
            exprs.append({"key": "gen", "operator": rng.choice(["Gt", "Lt"]),
                          "values": [str(rng.randint(1, 5))]})
        terms: list[Body] = []
        if exprs:
            terms.append({"matchExpressions": exprs})
        return terms

    def requests(self) -> dict[str, str]:
        rng = self.rng
        if self.want("quantities", 0.08):
            requests = {"cpu": rng.choice(["1500m", "1.5", "0.5", "100m", "2000m", "1e0"]),
                        "memory": rng.choice(["1.5Gi", "1536Mi", "1G", "2.5e9", "750M"])}
        else:
            requests = {"cpu": rng.choice(["250m", "500m", "1", "2", "3"]),
                        "memory": rng.choice(["256Mi", "1Gi", "3Gi", "6Gi"])}
        if self.want("no-cpu-request", 0.04):
            del requests["cpu"]
        return requests

    def init_containers(self, spec: Body) -> None:
        rng = self.rng
        inits = []
        for k in range(rng.randint(1, 2)):
            sidecar = rng.random() < 0.5
            res = {"cpu": rng.choice(["250m", "500m", "1"] if sidecar else ["1", "2", "4"]),
                   "memory": rng.choice(["256Mi", "1Gi", "4Gi"])}
            init: Body = {"name": f"init-{k}", "image": PAUSE, "resources": {"requests": res}}
            if sidecar:
                init["restartPolicy"] = "Always"
                if rng.random() < 0.3:
                    init["ports"] = [{"containerPort": 8082 + k, "hostPort": 8082 + k,
                                      "protocol": "TCP"}]
            inits.append(init)
        spec["initContainers"] = inits

    def pod_resources(self, spec: Body) -> None:
        """Pod-level requests, at least what the containers ask (the API server's rule)."""
        from controller.api.pod import PodSpec

        rng = self.rng
        together = PodSpec.model_validate(spec).container_requests()
        cpu, mem = together.get("cpu", 0), together.get("memory", 0)
        cpu += rng.choice([0, 500, 1000, 2000])
        mem += rng.choice([0, 1, 2]) << 30
        spec["resources"] = {"requests": {"cpu": f"{max(cpu, 100)}m", "memory": str(mem)}}

    def ports(self, container: Body, spec: Body) -> None:
        rng = self.rng
        if self.want("host-port", 0.05):
            port: Body = {"containerPort": 80, "hostPort": rng.choice([8080, 8081]),
                          "protocol": rng.choice(["TCP", "TCP", "UDP"])}
            if rng.random() < 0.3:
                port["hostIP"] = rng.choice(["127.0.0.1", "10.0.0.2"])
            container["ports"] = [port]
        if self.want("host-network", 0.04):
            # The API server defaults hostPort to containerPort; one set must equal it.
            spec["hostNetwork"] = True
            ports = container.setdefault("ports", [])
            for p in ports:
                p["containerPort"] = p["hostPort"]
            extra = rng.choice([8080, 9000])
            if not any(p["containerPort"] == extra for p in ports):
                ports.append({"containerPort": extra, "protocol": "TCP"})

    def spec(self, set_name: str, nodes: list[Body], labels: dict[str, str]) -> Body:
        rng = self.rng
        requests = self.requests()
        limits: dict[str, str] = {}
        if "extended-resource" in self.fields and rng.random() < 0.7:
            requests[EXT] = limits[EXT] = str(rng.randint(1, 2))
        container: Body = {"name": "main", "image": PAUSE,
                           "resources": {"requests": requests, "limits": limits}}
        spec: Body = {"containers": [container], "terminationGracePeriodSeconds": 0,
                      "nodeSelector": {CASE_LABEL: self.id}}
        if self.want("init-containers", 0.06):
            self.init_containers(spec)
        if self.want("pod-resources", 0.05):
            self.pod_resources(spec)
        self.ports(container, spec)
        if self.want("node-selector", 0.15):
            spec["nodeSelector"]["disk"] = rng.choice(["ssd", "hdd"])
        if self.want("node-name", 0.03):
            spec["nodeName"] = rng.choice(nodes)["metadata"]["name"]
        terms = self.affinity_terms()
        if self.want("match-fields", 0.05):
            field_term = {"matchFields": [{"key": "metadata.name",
                                           "operator": rng.choice(["In", "NotIn"]),
                                           "values": [rng.choice(nodes)["metadata"]["name"]]}]}
            terms.append(field_term)
        affinity: Body = {}
        if terms:
            affinity["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        if self.want("anti-affinity", 0.08):
            affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": HOST}]}
        if "anti-affinity-running" in self.fields:
            affinity.setdefault("podAntiAffinity", {}).setdefault(
                "requiredDuringSchedulingIgnoredDuringExecution", []).append(
                {"labelSelector": {"matchLabels": {"app": "db"}},
                 "topologyKey": rng.choice([HOST, ZONE])})
        if self.want("pod-affinity", 0.05):
            affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": dict(labels)},
                 "topologyKey": rng.choice([RACK, HOST])}]}
        if affinity:
            spec["affinity"] = affinity
        tolerations = self.tolerations()
        if tolerations:
            spec["tolerations"] = tolerations
        policies = self.want("spread-policies", 0.03)
        if self.want("spread", 0.08) or policies:
            self.fields.add("spread")
            tsc: Body = {"maxSkew": rng.choice([1, 1, 2]),
                         "topologyKey": rng.choice([HOST, ZONE, RACK]),
                         "whenUnsatisfiable": "DoNotSchedule",
                         "labelSelector": {"matchLabels": dict(labels)}}
            if rng.random() < 0.3:
                tsc["minDomains"] = rng.randint(1, 4)
            if rng.random() < 0.2:
                tsc["nodeTaintsPolicy"] = "Honor"
            if policies:
                tsc["nodeAffinityPolicy"] = rng.choice(["Honor", "Ignore"])
                tsc["nodeTaintsPolicy"] = rng.choice(["Honor", "Ignore"])
                if rng.random() < 0.5:
                    # A label the selector does not name: the pod's own value joins it.
                    labels["rev"] = rng.choice(["a", "b"])
                    tsc["matchLabelKeys"] = ["rev"]
            spec["topologySpreadConstraints"] = [tsc]
        if self.want("unsupported", 0.02):
            choice = rng.choice(["pvc", "runtime", "scheduler"])
            if choice == "pvc":
                spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
                container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
            elif choice == "runtime":
                spec["runtimeClassName"] = "gvisor"
            else:
                spec["schedulerName"] = "other-scheduler"
        return spec

    def running(self, nodes: list[Body]) -> list[Body]:
        rng = self.rng
        out: list[Body] = []
        for i, node in enumerate(nodes):
            if rng.random() > 0.4:
                continue
            # With no-cpu-request, running pods may overcommit cpu (no kubelet here refuses
            # them): a pod asking no cpu still fits there.
            cpus = ["2", "4", "8"] if "no-cpu-request" in self.fields else ["500m", "1"]
            container: Body = {"name": "main", "image": PAUSE, "resources": {"requests": {
                "cpu": rng.choice(cpus), "memory": "512Mi"}}}
            if "host-port" in self.fields and rng.random() < 0.5:
                port: Body = {"containerPort": 80, "hostPort": 8080}
                if rng.random() < 0.3:
                    port["hostIP"] = rng.choice(["127.0.0.1", "10.0.0.2"])
                container["ports"] = [port]
            labels = {"app": rng.choice(["db", "web"])}
            spec: Body = {"nodeName": node["metadata"]["name"], "containers": [container],
                          "terminationGracePeriodSeconds": 0,
                          "tolerations": [{"operator": "Exists"}]}
            if "init-containers" in self.fields and rng.random() < 0.4:
                spec["initContainers"] = [{
                    "name": "sidecar", "image": PAUSE, "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": rng.choice(["500m", "1"]),
                                               "memory": "256Mi"}}}]
            if "anti-affinity-running" in self.fields and rng.random() < 0.3:
                spec["affinity"] = {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"set": "w"}}, "topologyKey": HOST}]}}
            out.append({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"running-{i}", "namespace": self.namespace,
                                     "labels": labels},
                        "spec": spec})
        return out


def _case(seed: int, index: int) -> Case:
    rng = random.Random(f"{seed}/{index}")
    focus = FIELDS[index % len(FIELDS)]
    case_id = f"pc-{seed}-{index:04d}"
    gen = _Gen(rng, case_id, focus)
    for name in ("pod-count", "extended-resource", "taints", "no-execute",
                 "prefer-no-schedule", "condition-taint", "unschedulable", "host-port",
                 "anti-affinity-running", "pods-unreported", "quantities", "pressure",
                 "no-cpu-request", "init-containers"):
        gen.want(name, 0.08)
    gen.fields.add("resources")
    nodes = [gen.node(i) for i in range(rng.randint(1, 5))]
    running = gen.running(nodes)
    sets = 2 if gen.want("pod-sets", 0.1) else 1
    templates: list[Body] = []
    counts: dict[str, int] = {}
    for s in range(sets):
        name = ["w", "l"][s]
        labels = {"set": name, "case": case_id}
        templates.append({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": case_id},
            "template": {"metadata": {"labels": labels},
                         "spec": gen.spec(name, nodes, labels)},
        })
        counts[name] = rng.randint(1, 5)
    request = {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": "gang", "namespace": case_id},
        "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                 "podSets": [{"podTemplateRef": {"name": t["metadata"]["name"]},
                              "count": counts[t["metadata"]["name"]]} for t in templates]},
    }
    return Case(case_id, seed, tuple(sorted(gen.fields)), case_id, nodes, running, templates,
                request, counts)


# ---------------------------------------------------------------------------- new capacity

PROVISION_FIELDS = (
    "spread-zone", "spread-hostname", "spread-pair", "spread-min-domains",
    "spread-taints-honor", "spread-running", "spread-pod-sets", "pinned-pod-set",
    "kubelet-selector", "kubelet-affinity", "overhead", "pool-taints", "spread-existing",
    "match-label-keys",
)
"""What a provisioning-mode case exercises; case ``i`` focuses on
``PROVISION_FIELDS[i % len(PROVISION_FIELDS)]`` (and may add others)."""

OS, ARCH, BETA_OS = "kubernetes.io/os", "kubernetes.io/arch", "beta.kubernetes.io/os"


def _pool(rng: random.Random, case_id: str, name: str, zones: list[str],
          taint: bool) -> Body:
    per = rng.randint(1, 3)
    template: Body = {"labels": {CASE_LABEL: case_id, "pool": name},
                      "allocatable": {"cpu": rng.choice(["2", "4"]), "memory": "8Gi",
                                      "pods": "110"}}
    if rng.random() < 0.2:
        template["labels"][ARCH] = "arm64"
    if taint:
        template["taints"] = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    return {
        "apiVersion": "muster.dev/v1alpha1", "kind": "CapacityPool",
        "metadata": {"name": f"{case_id}-{name}"},
        "spec": {"provider": "fake", "maxNodes": min(6, per * len(zones) + rng.randint(0, 1)),
                 "pricePerNodeHour": rng.choice([1.0, 2.0]), "nodeTemplate": template,
                 "topology": {"level": ZONE, "maxNodesPerDomain": per,
                              "domains": [{"labels": {ZONE: z}} for z in zones]}},
    }


def _spread(rng: random.Random, key: str, labels: dict[str, str]) -> Body:
    return {"maxSkew": rng.choice([1, 1, 2]), "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": dict(labels)}}


def _provision_spec(gen: _Gen, labels: dict[str, str], *, pinned: str | None = None
                    ) -> Body:
    rng, focus = gen.rng, gen.focus
    container: Body = {"name": "main", "image": PAUSE, "resources": {"requests": {
        "cpu": rng.choice(["250m", "500m", "1", "1500m"]),
        "memory": rng.choice(["256Mi", "1Gi"])}}}
    spec: Body = {"containers": [container], "terminationGracePeriodSeconds": 0,
                  "nodeSelector": {CASE_LABEL: gen.id}}
    if pinned is not None:
        spec["nodeSelector"][ZONE] = pinned
        return spec
    tainted = "pool-taints" in gen.fields or focus == "spread-taints-honor"
    if tainted and rng.random() < 0.6:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    if gen.want("kubelet-selector", 0.1):
        key, value = rng.choice([(OS, "linux"), (ARCH, "amd64"), (ARCH, "arm64"),
                                 (BETA_OS, "linux"), (OS, "windows")])
        spec["nodeSelector"][key] = value
    if gen.want("kubelet-affinity", 0.1):
        key = rng.choice([OS, ARCH, HOST])
        op = rng.choice(["Exists", "DoesNotExist", "NotIn"])
        expr: Body = {"key": key, "operator": op}
        if op == "NotIn":
            expr["values"] = ["windows" if key == OS else "s390x" if key == ARCH else "x"]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                             {"nodeSelectorTerms": [{"matchExpressions":
                                                                     [expr]}]}}}
    if gen.want("overhead", 0.05):
        spec["overhead"] = {"cpu": "100m"}
    tscs: list[Body] = []
    spread_fields = ("spread-zone", "spread-running", "spread-pod-sets", "spread-existing",
                     "spread-taints-honor", "spread-min-domains", "match-label-keys")
    if focus in spread_fields or gen.want("spread-zone", 0.3):
        gen.fields.add("spread-zone")
        tscs.append(_spread(rng, ZONE, labels))
    if focus == "spread-hostname":
        tscs.append(_spread(rng, HOST, labels))
    if gen.want("spread-pair", 0.1):
        tscs = [_spread(rng, ZONE, labels), _spread(rng, HOST, labels)]
    for tsc in tscs:
        if focus == "spread-min-domains" or rng.random() < 0.15:
            tsc["minDomains"] = rng.randint(1, 4)
        if focus == "spread-taints-honor" or rng.random() < 0.15:
            tsc["nodeTaintsPolicy"] = "Honor"
        if focus == "match-label-keys":
            labels["rev"] = rng.choice(["a", "b"])
            tsc["matchLabelKeys"] = ["rev"]
    if tscs:
        spec["topologySpreadConstraints"] = tscs
    return spec


def _provision_case(seed: int, index: int) -> Case:
    rng = random.Random(f"provision/{seed}/{index}")
    focus = PROVISION_FIELDS[index % len(PROVISION_FIELDS)]
    case_id = f"pp-{seed}-{index:04d}"
    gen = _Gen(rng, case_id, focus)
    gen.want("pool-taints", 0.1)
    zones = ["z0", "z1", "z2"]
    pool_zones = sorted(rng.sample(zones, rng.randint(1, 3)))
    pools = [_pool(rng, case_id, "a", pool_zones, "pool-taints" in gen.fields)]
    if rng.random() < 0.2:
        other = [z for z in zones if z not in pool_zones] or pool_zones
        pools.append(_pool(rng, case_id, "b", other, False))
    existing = rng.randint(1, 3) if gen.want("spread-existing", 0.3) or focus == (
        "spread-running") else 0
    nodes = []
    for i in range(existing):
        node = gen.node(i)
        node["status"]["allocatable"]["cpu"] = node["status"]["capacity"]["cpu"] = (
            rng.choice(["1", "2", "4"]))
        nodes.append(node)
    sets: list[tuple[str, dict[str, str], str | None]] = [
        ("w", {"set": "w", "case": case_id}, None)]
    if gen.want("spread-pod-sets", 0.1):
        sets = [("w", {"app": "train", "case": case_id}, None),
                ("l", {"app": "train", "case": case_id}, None)]
    if gen.want("pinned-pod-set", 0.1):
        every = sorted({z for p in pools for d in p["spec"]["topology"]["domains"]
                        for z in d["labels"].values()})
        sets.append(("p", {"set": "p", "case": case_id}, rng.choice(every)))
    templates: list[Body] = []
    counts: dict[str, int] = {}
    for name, labels, pinned in sets:
        labels = dict(labels)
        spec = _provision_spec(gen, labels, pinned=pinned)
        templates.append({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": case_id},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        })
        counts[name] = 1 if pinned else rng.randint(1, 9)
    running: list[Body] = []
    if focus == "spread-running" or (nodes and rng.random() < 0.3):
        gen.fields.add("spread-running")
        for i, node in enumerate(nodes):
            for k in range(rng.randint(0, 2)):
                running.append({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"running-{i}-{k}", "namespace": case_id,
                                 "labels": dict(templates[0]["template"]["metadata"]["labels"])},
                    "spec": {"nodeName": node["metadata"]["name"],
                             "containers": [{"name": "main", "image": PAUSE,
                                             "resources": {"requests": {"cpu": "100m"}}}],
                             "terminationGracePeriodSeconds": 0,
                             "tolerations": [{"operator": "Exists"}]}})
    request = {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": "gang", "namespace": case_id},
        "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                 "podSets": [{"podTemplateRef": {"name": t["metadata"]["name"]},
                              "count": counts[t["metadata"]["name"]]} for t in templates]},
    }
    if len(sets) > 1:
        gen.fields.add("pod-sets")
    return Case(case_id, seed, tuple(sorted(gen.fields)), case_id, nodes, running, templates,
                request, counts, pools=pools)


def provision_case(seed: int, index: int) -> Case:
    """Provisioning-mode case ``index`` of ``seed``: CapacityPools, a few existing nodes or
    none, and a gang whose plan needs new nodes."""
    return _provision_case(seed, index)


def provision_cases(seed: int = 0, count: int = 300) -> list[Case]:
    return [_provision_case(seed, i) for i in range(count)]


def case(seed: int, index: int) -> Case:
    """Case ``index`` of ``seed`` alone (the same as ``cases(seed, n)[index]`` for any n)."""
    return _case(seed, index)


def iter_cases(seed: int = 0, count: int = 500) -> Iterator[Case]:
    for index in range(count):
        yield _case(seed, index)


def cases(seed: int = 0, count: int = 500) -> list[Case]:
    """``count`` cases, the same for the same ``seed`` (each also stands alone: case ``i``
    of a seed does not depend on ``count``)."""
    return list(iter_cases(seed, count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("parity-cases"))
    parser.add_argument("--provision", action="store_true",
                        help="provisioning-mode cases (with pools.json and planned.json)")
    args = parser.parse_args(argv)
    tally: dict[str, int] = {"fits": 0, "nofit": 0, "refused": 0}
    made = (provision_cases(args.seed, args.count) if args.provision
            else iter_cases(args.seed, args.count))
    for case in made:
        where = args.out / case.id
        where.mkdir(parents=True, exist_ok=True)
        if case.pools:
            (where / "pools.json").write_text(json.dumps(case.pool_documents(), indent=1))
        (where / "cluster.json").write_text(json.dumps(case.cluster_documents(), indent=1))
        (where / "request.json").write_text(json.dumps(case.request_documents(), indent=1))
        (where / "pods.json").write_text(json.dumps(case.pods(), indent=1))
        answer = muster_answer(case)
        if case.pools:
            (where / "planned.json").write_text(json.dumps(case.plan_nodes(answer), indent=1))
        (where / "muster.json").write_text(json.dumps(
            {"fits": answer.fits, "refused": answer.refused, "reasons": answer.reasons,
             "fields": case.fields}, indent=1))
        tally["refused" if answer.refused else "fits" if answer.fits else "nofit"] += 1
    print(json.dumps({"cases": args.count, "seed": args.seed, **tally}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
