"""Scale: Muster's memory and planning time on a real control plane holding many nodes and
pods.

    python3 -m benchmarks.scale --nodes 10000 --pods 100000 [--requests 20]

Starts the local control plane (:mod:`e2e.cluster`, reused when up) and fills it with
``--nodes`` Ready 8-GPU Nodes in racks of 16 (blocks of 8 racks) and ``--pods`` Pods bound
to them (``spec.nodeName`` set, 100m CPU and 128Mi each, a GPU for one pod in eight). The
nodes have no kubelet: kube-controller-manager is stopped for the run (its node lifecycle
controller would mark kubelet-less nodes NotReady and taint them) and started again at the
end; kwok manages none of them (its heartbeats for 10,000 nodes would swamp two cores).

Then ``muster run`` starts as its own process under its ServiceAccount, lists and watches all
of it, and ``--requests`` ProvisioningRequests arrive one per second: check-capacity gangs of
4 8-GPU workers in one rack (planned on the existing nodes, every booking subtracted) and
atomic ones of 2 that need new nodes from a CapacityPool. Printed: the objects, Muster's
resident memory (VmRSS) once its caches synced and after the requests, the planner's pass
time (``muster_planner_pass_duration_seconds``: mean and max bucket, from /metrics), and one
line ``scale nodes=N pods=P rss_mb=R pass_ms_mean=M provisioned=K/Q``.

Everything is removed at the end (pods, nodes, requests, pool, namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import time
import urllib.request
import uuid
from typing import Any

from benchmarks.soak import rss_mb
from controller.commands import objects
from controller.kube import ApiError, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    Resource,
)
from e2e import cluster as cp
from e2e.chaos import CHAOS_CONFIG, conditions
from e2e.real import MusterProcess

SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", namespaced=True, kind="ServiceAccount")

RUN_LABEL = "scale.muster.dev/run"
RACK_SIZE = 16
RACKS_PER_BLOCK = 8


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def _each(items: list[Any], act: Any, concurrency: int = 48) -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            item = queue.get_nowait()
            for _ in range(5):
                try:
                    await act(item)
                    break
                except ApiError as exc:
                    if exc.conflict:
                        break
                    await asyncio.sleep(0.5)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _node(run: str, i: int) -> dict[str, Any]:
    rack = i // RACK_SIZE
    block = rack // RACKS_PER_BLOCK
    labels = {RUN_LABEL: run, objects.BLOCK: f"s{block}", objects.RACK: f"s{block}-r{rack}"}
    body = objects.node(f"scale-{run}-{i}", labels=labels, taints=[objects.GPU_TAINT],
                        allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"})
    return body


def _pod(run: str, ns: str, i: int, nodes: int) -> dict[str, Any]:
    requests = {"cpu": "100m", "memory": "128Mi"}
    if i % 8 == 0:
        requests[objects.GPU] = "1"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": ns, "labels": {RUN_LABEL: run}},
            "spec": {"nodeName": f"scale-{run}-{i % nodes}",
                     "tolerations": [objects.GPU_TOLERATION],
                     "containers": [{"name": "c", "image": "none",
                                     "resources": {"requests": requests,
                                                   "limits": {k: v for k, v in requests.items()
                                                              if k == objects.GPU}}}]}}


def _pass_seconds(metrics: str) -> tuple[float, float, float]:
    """(passes, total seconds, the smallest bucket bound holding every pass)."""
    count = total = 0.0
    bound = float("inf")
    buckets: list[tuple[float, float]] = []
    for line in metrics.splitlines():
        if line.startswith("muster_planner_pass_duration_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("muster_planner_pass_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("muster_planner_pass_duration_seconds_bucket"):
            m = re.search(r'le="([^"]+)"', line)
            if m:
                buckets.append((float(m[1]), float(line.split()[-1])))
    for le, n in sorted(buckets):
        if n >= count:
            bound = le
            break
    return count, total, bound


class Scale:
    def __init__(self, cluster: cp.Cluster, *, nodes: int, pods: int, requests: int) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.pods = pods
        self.requests = requests
        self.run = uuid.uuid4().hex[:5]
        self.ns = f"scale-{self.run}"
        self.muster = MusterProcess(cluster, config=CHAOS_CONFIG, extra_env={
            "MUSTER_LEADER_ELECTION__ENABLED": "false", "MUSTER_KUEUE__ENABLED": "false",
            "MUSTER_SERVER__METRICS_SECURE": "false",
            # Bookings outlive the run: every request's booking is subtracted while planning.
            "MUSTER_BOOKING__DURATION_SECONDS": "3600"})
        self.muster.log = cluster.logs / "scale-muster.log"

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.muster.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())

    async def main(self) -> str:
        kube = await KubeClient.from_kubeconfig(self.cluster.admin_kubeconfig)
        await kube.create(NAMESPACES, {"metadata": {"name": self.ns}})
        for _ in range(120):  # pods need the namespace's default ServiceAccount
            if await kube.get_or_none(SERVICE_ACCOUNTS, "default", namespace=self.ns):
                break
            await asyncio.sleep(0.5)
        cp.stop_controller_manager(self.cluster)
        try:
            return await self._run(kube)
        finally:
            self.muster.stop()
            await self.cleanup(kube)
            await kube.close()
            cp.start_controller_manager(self.cluster)

    async def _run(self, kube: KubeClient) -> str:
        t0 = time.monotonic()
        await _each(list(range(self.nodes)),
                    lambda i: kube.create(NODES, _node(self.run, i)))
        log(f"{self.nodes} nodes in {time.monotonic() - t0:.0f} s")
        t0 = time.monotonic()
        await _each(list(range(self.pods)),
                    lambda i: kube.create(PODS, _pod(self.run, self.ns, i, self.nodes),
                                          namespace=self.ns))
        log(f"{self.pods} pods in {time.monotonic() - t0:.0f} s")
        pool = objects.gpu_pool(f"scale-{self.run}", max_nodes=64)
        pool["spec"]["nodeTemplate"]["labels"][RUN_LABEL] = self.run
        await kube.create(CAPACITY_POOLS, pool)
        await kube.create(POD_TEMPLATES, objects.pod_template(
            "w8", namespace=self.ns, requests={"cpu": "1", objects.GPU: "8"},
            required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
            node_selector={RUN_LABEL: self.run}), namespace=self.ns)
        t0 = time.monotonic()
        self.muster.start(wait=False)
        await asyncio.to_thread(self.muster.wait_ready, 900.0)
        assert self.muster.proc is not None
        synced_s = time.monotonic() - t0
        rss_synced = rss_mb(self.muster.proc.pid)
        log(f"muster ready in {synced_s:.0f} s, RSS {rss_synced:.0f} MB")
        names = []
        for i in range(self.requests):
            cls = "check-capacity.muster.dev" if i % 2 == 0 else \
                "atomic-provisioning.muster.dev"
            workers = 4 if i % 2 == 0 else 2
            body = objects.provisioning_request(f"r{i}", pod_sets=[("w8", workers)],
                                                namespace=self.ns, class_name=cls)
            await kube.create(PROVISIONING_REQUESTS, body, namespace=self.ns)
            names.append(f"r{i}")
            await asyncio.sleep(1.0)
        deadline = time.monotonic() + 300
        done: set[str] = set()
        while time.monotonic() < deadline and len(done) < len(names):
            for name in names:
                with contextlib.suppress(ApiError):
                    body = await kube.get(PROVISIONING_REQUESTS, name, namespace=self.ns)
                    if conditions(body).get("Provisioned", {}).get("status") == "True":
                        done.add(name)
            await asyncio.sleep(2)
        rss_after = rss_mb(self.muster.proc.pid)
        count, total, bound = await asyncio.to_thread(lambda: _pass_seconds(self.metrics()))
        mean_ms = 1000 * total / count if count else 0.0
        print(f"objects: {self.nodes} nodes, {self.pods} pods; muster ready after "
              f"{synced_s:.0f} s (initial lists), RSS {rss_synced:.0f} MB synced, "
              f"{rss_after:.0f} MB after {len(names)} requests")
        print(f"planner: {count:.0f} passes, mean {mean_ms:.0f} ms, every pass <= "
              f"{bound * 1000:.0f} ms (histogram bucket)")
        return (f"scale nodes={self.nodes} pods={self.pods} rss_mb={max(rss_synced, rss_after):.0f}"
                f" pass_ms_mean={mean_ms:.0f} provisioned={len(done)}/{len(names)}")

    async def cleanup(self, kube: KubeClient) -> None:
        with contextlib.suppress(ApiError):
            listing = await kube.list(PROVISIONING_REQUESTS, namespace=self.ns)
            for item in listing.get("items") or []:
                await kube.merge_patch(PROVISIONING_REQUESTS, item["metadata"]["name"],
                                       {"metadata": {"finalizers": None}}, namespace=self.ns)
        for res, sel in ((NODES, f"{RUN_LABEL}={self.run}"),
                         (NODES, f"fake.muster.dev/pool=scale-{self.run}")):
            with contextlib.suppress(ApiError):
                listing = await kube.list(res, label_selector=sel)
                await _each([n["metadata"]["name"] for n in listing.get("items") or []],
                            lambda n: kube.delete(NODES, n))
        with contextlib.suppress(ApiError):
            await kube.merge_patch(CAPACITY_POOLS, f"scale-{self.run}",
                                   {"metadata": {"finalizers": None}})
            await kube.delete(CAPACITY_POOLS, f"scale-{self.run}")
        with contextlib.suppress(ApiError):
            await kube.delete(NAMESPACES, self.ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    cluster = cp.default_cluster()
    was_up = cp.running(cluster)
    cp.up(cluster)
    try:
        line = asyncio.run(Scale(cluster, nodes=args.nodes, pods=args.pods,
                                 requests=args.requests).main())
    finally:
        if not was_up:
            cp.down(cluster)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
