"""``muster demo --kueue``: path B (Muster's own Kueue admission check) in one process.

The sandbox (Muster's CRDs plus the stand-in Kueue CRDs of ``e2e/kueue-crds``), a CapacityPool
of 8-GPU nodes in racks, Muster's controller with ``kueue.enabled``, the sandbox scheduler,
and this module playing Kueue: it creates the ResourceFlavors, the AdmissionCheck, the
ClusterQueue, a Workload whose workers carry ``muster.dev/required-topology: rack`` on a
flavor without a Topology, and reserves its quota. Muster marks the check Active, creates the
ProvisioningRequest, provisions one rack and reports the check Ready with podSetUpdates
pinning the workers there; the demo then admits the Workload and creates its pods with the
updates applied, as Kueue and the Job controller would, and exits 0 once all are bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.commands.crds import crd_dir
from controller.commands.demo_scenario import Timeline, demo_world, show
from controller.common.topology_defaults import MUSTER_REQUIRED
from controller.kube import ApiError, KubeClient
from controller.kube.resources import CAPACITY_POOLS, NODES, PODS, PROVISIONING_REQUESTS
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)

NAMESPACE = "default"
WORKLOAD = "llm-train"
CHECK = "muster-gang"
GPU_FLAVORS = {"cpu": "h100", "memory": "h100", objects.GPU: "h100"}
CPU_FLAVORS = {"cpu": "cpu", "memory": "cpu"}
FLAVORS = {
    "h100": kq.resource_flavor("h100", node_labels={"muster.dev/accelerator": "h100"}),
    "cpu": kq.resource_flavor("cpu"),
}


class KueueDemoFailed(Exception):
    pass


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class KueueDemoView(Timeline):
    """The Workload demo: Muster's admission check state and the request it created too."""

    check: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)

    def render(self, workers: int) -> Group:
        state = Table(title=f"Workload {NAMESPACE}/{WORKLOAD}", show_header=False)
        state.add_row("check", f"{CHECK}: [bold]{self.check.get('state', '-')}[/]")
        state.add_row("message", str(self.check.get("message", ""))[:100])
        conds = (self.request.get("status") or {}).get("conditions") or []
        state.add_row("request", ", ".join(
            f"{c['type']}={c['status']}" for c in conds) or "-")
        for update in self.check.get("podSetUpdates") or []:
            sel = update.get("nodeSelector") or {}
            state.add_row(f"update {update['name']}", ", ".join(
                f"{k.rsplit('/', 1)[-1]}={v}" for k, v in sel.items()) or "annotations only")
        racks = Counter(
            n["metadata"].get("labels", {}).get(objects.RACK, "?") for n in self.nodes
            if n["metadata"].get("labels", {}).get("muster.dev/pool"))
        by_rack = Table(title="new nodes per rack")
        by_rack.add_column("rack")
        by_rack.add_column("nodes", justify="right")
        for rack, count in sorted(racks.items()):
            by_rack.add_row(rack, str(count))
        bound = sum(1 for p in self.pods if p.get("spec", {}).get("nodeName"))
        pods = f"pods bound: {bound}/{workers + 1}" if self.pods else "pods: not created yet"
        return Group(state, by_rack, Panel("\n".join(self.log[-14:]) or "...", title=pods))


async def _seed(kube: KubeClient, *, latency: float, ready_delay: float) -> None:
    for i in (1, 2):
        await kube.create(NODES, objects.node(
            f"cpu-{i}", allocatable={"cpu": "16", "memory": "64Gi"},
            labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"}))
    await kube.create(CAPACITY_POOLS, objects.gpu_pool(
        rack_limits={"b1-r1": 4},
        parameters={"latencySeconds": latency, "readyDelaySeconds": ready_delay}))
    for body in FLAVORS.values():
        await kube.create(RESOURCE_FLAVORS, body)
    await kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        CHECK, class_name="atomic-provisioning.muster.dev"))
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        CHECK, controller_name="muster.dev/provisioning", config=CHECK))
    await kube.create(CLUSTER_QUEUES, kq.cluster_queue(
        "gpu", flavors={"h100": {"cpu": "10000", "memory": "100Ti", objects.GPU: "1024"},
                        "cpu": {"cpu": "64", "memory": "256Gi"}}, checks=[CHECK]))
    await kube.create(LOCAL_QUEUES, kq.local_queue("gangs", NAMESPACE, "gpu"),
                      namespace=NAMESPACE)


async def _write_status(kube: KubeClient, change: Any) -> dict[str, Any]:
    for _ in range(10):
        wl = await kube.get(WORKLOADS, WORKLOAD, namespace=NAMESPACE)
        try:
            return await kube.merge_patch(
                WORKLOADS, WORKLOAD,
                {"metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
                 "status": change(wl)},
                namespace=NAMESPACE, subresource="status")
        except ApiError as exc:
            if not exc.conflict:
                raise
    raise KueueDemoFailed("the Workload status kept conflicting")


async def _observe(kube: KubeClient, view: KueueDemoView) -> None:
    ac = await kube.get(ADMISSION_CHECKS, CHECK)
    for c in (ac.get("status") or {}).get("conditions") or []:
        if c["type"] == "Active" and c["status"] == "True":
            view.once("active", f"AdmissionCheck {CHECK} is [bold]Active[/] (set by Muster)")
    wl = await kube.get(WORKLOADS, WORKLOAD, namespace=NAMESPACE)
    view.check = next((c for c in (wl.get("status") or {}).get("admissionChecks") or []
                       if c["name"] == CHECK), {})
    if view.check:
        view.once(f"check:{view.check['state']}:{view.check.get('message')}",
                  f"check [bold]{view.check['state']}[/]: {view.check.get('message') or '-'}")
    listing = await kube.list(PROVISIONING_REQUESTS, namespace=NAMESPACE)
    view.request = next(iter(listing.get("items") or []), {})
    if view.request:
        view.once("pr", f"Muster created ProvisioningRequest {view.request['metadata']['name']}")
    view.nodes = (await kube.list(NODES)).get("items") or []
    new = sum(1 for n in view.nodes if n["metadata"].get("labels", {}).get("muster.dev/pool"))
    if new:
        view.once(f"nodes:{new}", f"{new} new node(s) registered")
    view.pods = (await kube.list(PODS, namespace=NAMESPACE)).get("items") or []


async def _scenario(kube: KubeClient, view: KueueDemoView, *, workers: int, refresh: Any,
                    time_limit: float) -> None:
    await kube.create(WORKLOADS, kq.workload(WORKLOAD, NAMESPACE, queue="gangs", pod_sets=[
        kq.pod_set("workers", workers,
                   requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
                   annotations={MUSTER_REQUIRED: objects.RACK}),
        kq.pod_set("launcher", 1, requests={"cpu": "2", "memory": "4Gi"}),
    ]), namespace=NAMESPACE)
    await _write_status(kube, lambda wl: kq.reserve_quota(
        wl, cluster_queue="gpu", flavors={"workers": GPU_FLAVORS, "launcher": CPU_FLAVORS},
        checks=[CHECK], now=_now()))
    view.note(f"(as Kueue) Workload {WORKLOAD}: {workers} x 8-GPU workers, "
              f"{MUSTER_REQUIRED}=rack, quota reserved on flavor h100 (no Topology)")
    admitted = False
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        await _observe(kube, view)
        refresh()
        state = view.check.get("state")
        if state == "Rejected":
            raise KueueDemoFailed(f"the check was rejected: {view.check.get('message')}")
        if state == "Ready" and not admitted:
            wl = await _write_status(kube, lambda wl: kq.set_condition(
                wl["status"], "Admitted", True, "Admitted", _now()))
            for ps, count in (("workers", workers), ("launcher", 1)):
                for i in range(count):
                    await kube.create(PODS, kq.admitted_pod(wl, ps, i, flavors=FLAVORS),
                                      namespace=NAMESPACE)
            admitted = True
            view.note(f"(as Kueue) admitted; created {workers + 1} pods with the podSetUpdates")
        bound = [p for p in view.pods if p.get("spec", {}).get("nodeName")]
        if admitted and len(bound) == workers + 1:
            racks = {
                n["metadata"]["labels"].get(objects.RACK) for n in view.nodes
                if n["metadata"]["name"] in {
                    p["spec"]["nodeName"] for p in bound
                    if p["metadata"]["labels"].get("kueue.x-k8s.io/podset") == "workers"}
            }
            view.note(f"[green bold]the gang runs[/]: all workers bound in rack "
                      f"{', '.join(sorted(r for r in racks if r))}")
            refresh()
            return
        await asyncio.sleep(0.2)
    raise KueueDemoFailed(
        f"timed out after {time_limit:.0f}s; check is {view.check.get('state', 'unset')} "
        f"({view.check.get('message') or 'no message'})")


async def run_kueue_demo(
    *, workers: int, time_limit: float, latency: float, ready_delay: float, console: Console,
    kubeconfig_out: Path | None,
) -> None:
    async with demo_world(
        crd_dirs=[crd_dir("crds"), crd_dir("kueue-crds")], kubeconfig_out=kubeconfig_out,
        prefix="muster-kueue-demo-",
    ) as world:
        kube = world.kube
        await _seed(kube, latency=latency, ready_delay=ready_delay)
        view = KueueDemoView()
        await world.start(view, kueue={"enabled": True})
        await show(view, console=console, workers=workers, scenario=lambda refresh: _scenario(
            kube, view, workers=workers, time_limit=time_limit, refresh=refresh))
