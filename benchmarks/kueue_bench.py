"""Muster's Kueue admission check under load (run on demand: ``python3 -m benchmarks.kueue_bench``).

Path B in the sandbox with the kind provider at zero latency: ``--workloads`` Workloads
(default 200), each 4 x 8-GPU workers required in one rack plus a launcher, get quota
reserved at once (as Kueue would); the clock runs until every check is Ready. The pool has
enough racks for all of them. Prints Workloads per second to Ready and p50/p99 latency from
quota reservation to Ready; last line ``kueue_bench workloads=<n> per_s=<x> p99_s=<y>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from controller.commands import objects
from controller.config import MusterConfig
from controller.kube import ApiError, KubeClient
from controller.kube.resources import CAPACITY_POOLS, NODES, PROVISIONING_REQUESTS
from controller.kueue import objects as kq
from controller.kueue.planning import workload_of
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
from controller.reconcilers.operator import Controller
from controller.topology_defaults import MUSTER_REQUIRED
from providers.kind import KindProvider
from sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[1]
CHECK = "muster-prov"
NS = "default"


async def reserve(kube: KubeClient, name: str) -> None:
    while True:
        wl = await kube.get(WORKLOADS, name, namespace=NS)
        status = kq.reserve_quota(
            wl, cluster_queue="cq", checks=[CHECK], now="2026-01-01T00:00:00Z",
            flavors={"workers": {objects.GPU: "h100", "cpu": "h100", "memory": "h100"},
                     "launcher": {"cpu": "cpu", "memory": "cpu"}})
        try:
            await kube.merge_patch(WORKLOADS, name, {
                "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
                "status": status}, namespace=NS, subresource="status")
            return
        except ApiError as exc:
            if not exc.conflict:
                raise


async def run(workloads: int, workers: int) -> tuple[float, list[float]]:
    server = SandboxServer()
    for d in (ROOT / "crds", ROOT / "e2e" / "kueue-crds"):
        server.store.load_crd_dir(d)
    await server.start()
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "kubeconfig"
    server.write_kubeconfig(path)
    kube = await KubeClient.from_kubeconfig(path)
    racks = -(-workloads * workers // 16) + 1
    await kube.create(CAPACITY_POOLS, objects.gpu_pool(
        "gpu", blocks=-(-racks // 8), racks_per_block=8, max_nodes=workloads * workers + 16))
    await kube.create(RESOURCE_FLAVORS, kq.resource_flavor(
        "h100", node_labels={"muster.dev/accelerator": "h100"}))
    await kube.create(RESOURCE_FLAVORS, kq.resource_flavor("cpu"))
    for i in range(max(1, workloads // 50)):
        await kube.create(NODES, objects.node(
            f"cpu-{i}", allocatable={"cpu": "128", "memory": "512Gi"}))
    await kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "cfg", class_name="atomic-provisioning.muster.dev"))
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        CHECK, controller_name="muster.dev/provisioning", config="cfg"))
    config = MusterConfig(kueue={"enabled": True},
                          acquisition={"node_ready_timeout_seconds": 60})
    controller = Controller(kube=kube, config=config, use_kopf=False,
                            providers={"kind": KindProvider(kube, heartbeat_seconds=30)})
    await controller.start()
    names = [f"wl-{i}" for i in range(workloads)]
    for name in names:
        await kube.create(WORKLOADS, kq.workload(name, NS, queue="q", pod_sets=[
            kq.pod_set("workers", workers, requests={"cpu": "90", "memory": "900Gi",
                                                     objects.GPU: "8"},
                       annotations={MUSTER_REQUIRED: objects.RACK}),
            kq.pod_set("launcher", 1, requests={"cpu": "1", "memory": "1Gi"}),
        ]), namespace=NS)
    started = time.monotonic()
    poller = asyncio.create_task(wait_ready(kube, workloads))
    reserved_at: dict[str, float] = {}

    async def reserve_one(name: str) -> None:
        await reserve(kube, name)
        reserved_at[name] = time.monotonic()
    await asyncio.gather(*(reserve_one(n) for n in names))
    print(f"quota reserved on {workloads} Workloads in {time.monotonic() - started:.1f}s")
    ready_at, provisioned_at = await poller
    elapsed = time.monotonic() - started
    if controller.kueue is not None:
        print(f"{controller.kueue.reconciles} Workload reconciles "
              f"({controller.kueue.reconciles / workloads:.1f} per Workload)")
    await controller.stop()
    await kube.close()
    await server.stop()
    tmp.cleanup()
    if len(ready_at) < workloads:
        raise SystemExit(f"only {len(ready_at)} of {workloads} checks became Ready")
    lag = [ready_at[n] - provisioned_at.get(n, ready_at[n]) for n in names]
    print(f"request Provisioned -> check Ready: p50 {statistics.median(lag):.2f}s "
          f"max {max(lag):.2f}s (the rest is the request reconciler)")
    return elapsed, [ready_at[n] - reserved_at[n] for n in names]


async def wait_ready(
    kube: KubeClient, workloads: int
) -> tuple[dict[str, float], dict[str, float]]:
    """When each check became Ready and each request Provisioned (by Workload name)."""
    ready_at: dict[str, float] = {}
    provisioned_at: dict[str, float] = {}
    created_at: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while len(ready_at) < workloads and time.monotonic() < deadline:
        for pr in (await kube.list(PROVISIONING_REQUESTS, namespace=NS)).get("items") or []:
            owner = str(workload_of(pr)[0])
            created_at.setdefault(owner, time.monotonic())
            if any(c["type"] == "Provisioned" and c["status"] == "True"
                   for c in (pr.get("status") or {}).get("conditions") or []):
                provisioned_at.setdefault(owner, time.monotonic())
        for wl in (await kube.list(WORKLOADS, namespace=NS)).get("items") or []:
            if any(c["name"] == CHECK and c["state"] == "Ready"
                   for c in (wl.get("status") or {}).get("admissionChecks") or []):
                ready_at.setdefault(wl["metadata"]["name"], time.monotonic())
        # Listing every object is the benchmark's own load on the shared CPU: poll gently.
        await asyncio.sleep(0.5)
    first = min(created_at.values(), default=0.0)
    print(f"requests created over {max(created_at.values(), default=0.0) - first:.1f}s; "
          f"Provisioned over {max(provisioned_at.values(), default=0.0) - first:.1f}s")
    return ready_at, provisioned_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    elapsed, latencies = asyncio.run(run(args.workloads, args.workers))
    q = statistics.quantiles(latencies, n=100)
    per_s = args.workloads / elapsed
    print(f"{args.workloads} Workloads x {args.workers} workers Ready in {elapsed:.1f}s "
          f"({per_s:.1f}/s); reservation -> Ready p50 {q[49]:.2f}s p99 {q[98]:.2f}s")
    print(f"kueue_bench workloads={args.workloads} per_s={per_s:.1f} p99_s={q[98]:.2f}")


if __name__ == "__main__":
    main()
