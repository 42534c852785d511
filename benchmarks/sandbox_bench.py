"""Sandbox scale benchmark (run on demand, not a test).

Measures the per-request cost of GET, PATCH and POST and the watch delivery latency over HTTP,
first on an empty store, then on a store populated in-process with 10,000 nodes, 100,000 pods
and 1,000 ProvisioningRequests; prints the loaded/empty ratio per operation and the process
RSS. The goal is ratios near 1: single-object operations and watch fan-out must not depend
on how many objects are stored.

    python3 -m benchmarks.sandbox_bench [--nodes 10000 --pods 100000 --requests 1000]

Last line: ``sandbox_bench nodes=.. pods=.. get_ratio=.. patch_ratio=.. post_ratio=..
watch_ratio=.. rss_mb=..``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from sandbox import SandboxServer, Store

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = 20
WATCHERS = 5


def rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc; falls back to the peak)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _node(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"node-{i:05d}",
                     "labels": {"topology.kubernetes.io/zone": f"z{i % 4}",
                                "muster.dev/rack": f"rack-{i // 16}"}},
        "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pod(i: int, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{
        "name": "worker", "image": "trainer:latest",
        "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}},
    }]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": f"pod-{i:06d}", "namespace": f"ns-{i % NAMESPACES}",
                         "labels": {"app": "train", "job": f"job-{i // 8}"}}, "spec": spec}


def _request(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": f"req-{i:04d}", "namespace": f"ns-{i % NAMESPACES}"},
        "spec": {"provisioningClassName": "atomic-provisioning.muster.dev",
                 "podSets": [{"count": 8, "podTemplateRef": {"name": f"tpl-{i}"}}]},
    }


def populate(store: Store, nodes: int, pods: int, requests: int) -> float:
    start = time.perf_counter()
    for n in range(NAMESPACES):
        store.create("namespaces", {"metadata": {"name": f"ns-{n}"}})
    node_rt, pod_rt = store.resolve("nodes"), store.resolve("pods")
    for i in range(nodes):
        store.create_raw(node_rt, _node(i), None)
    for i in range(pods):
        node = f"node-{i % nodes:05d}" if nodes and i % 10 else None
        store.create_raw(pod_rt, _pod(i, node), f"ns-{i % NAMESPACES}")
    pr_rt = store.resolve("provisioningrequests.autoscaling.x-k8s.io")
    for i in range(requests):
        store.create_raw(pr_rt, _request(i), f"ns-{i % NAMESPACES}")
    return time.perf_counter() - start


async def _timed(n: int, op: Any) -> float:
    """Median seconds per call of ``op(i)`` over ``n`` calls (after 20 warm-up calls)."""
    for i in range(20):
        await op(-1 - i)
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await op(i)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


async def measure(server: SandboxServer, iterations: int, tag: str) -> dict[str, float]:
    """Per-request medians for GET, PATCH, POST, and watch delivery latency."""
    base = server.url
    store = server.store
    ns = "ns-0"
    if ("", ns) not in store.table(store.resolve("namespaces")).objects:
        store.create("namespaces", {"metadata": {"name": ns}})
    if (ns, "probe") not in store.table(store.resolve("pods")).objects:
        store.create("pods", {**_pod(999_999, None), "metadata": {
            "name": "probe", "namespace": ns, "labels": {"app": "probe"}}})
    pod_url = f"{base}/api/v1/namespaces/{ns}/pods/probe"
    results: dict[str, float] = {}
    conn = aiohttp.TCPConnector(limit=WATCHERS + 4)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def get(_: int) -> None:
            async with session.get(pod_url) as resp:
                assert resp.status == 200
                await resp.read()

        counter = iter(range(10**9))

        async def patch(_: int) -> None:
            body = json.dumps({"metadata": {"annotations": {"n": str(next(counter))}}})
            async with session.patch(pod_url, data=body, headers={
                    "Content-Type": "application/merge-patch+json"}) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        async def post(i: int) -> None:
            body = _pod(0, None)
            body["metadata"]["name"] = f"bench-{tag}-{i + 100}"
            body["metadata"]["namespace"] = ns
            async with session.post(f"{base}/api/v1/namespaces/{ns}/pods",
                                    data=json.dumps(body),
                                    headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 201, await resp.text()
                await resp.read()

        results["get"] = await _timed(iterations, get)
        results["patch"] = await _timed(iterations, patch)
        results["post"] = await _timed(iterations, post)
        results["watch"] = await _watch_latency(session, server, ns, iterations // 2)
    return results


async def _watch_latency(
    session: aiohttp.ClientSession, server: SandboxServer, ns: str, n: int,
) -> float:
    """Median time from an in-process write to its event reaching all WATCHERS over HTTP."""
    rv = str(server.store.resource_version)
    url = f"{server.url}/api/v1/namespaces/{ns}/pods"
    responses = [
        await session.get(url, params={"watch": "true", "resourceVersion": rv,
                                       "fieldSelector": "metadata.name=probe"})
        for _ in range(WATCHERS)
    ]
    samples = []
    try:
        for i in range(n + 10):
            t0 = time.perf_counter()
            server.store.patch("pods", "probe", {"metadata": {"labels": {"i": str(i)}}}, ns)
            for resp in responses:
                line = await resp.content.readline()
                assert json.loads(line)["type"] == "MODIFIED"
            if i >= 10:
                samples.append(time.perf_counter() - t0)
    finally:
        for resp in responses:
            resp.close()
    return statistics.median(samples)


async def _list_all(server: SandboxServer) -> float:
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        async with session.get(f"{server.url}/api/v1/pods") as resp:
            await resp.read()
        return time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    rss_before = rss_mb()
    empty = SandboxServer(crd_dir=ROOT / "crds")
    loaded = SandboxServer(crd_dir=ROOT / "crds", store=Store(history=10_000))
    took = populate(loaded.store, args.nodes, args.pods, args.requests)
    gc.collect()
    rss_loaded = rss_mb()
    print(f"populated nodes={args.nodes} pods={args.pods} requests={args.requests} "
          f"in {took:.1f}s; store rss +{rss_loaded - rss_before:.0f} MiB")
    # Alternate rounds between both servers so drift (warm-up, CPU frequency, GC) hits both.
    rounds: dict[str, list[dict[str, float]]] = {"empty": [], "loaded": []}
    async with empty, loaded:
        for r in range(args.rounds):
            for tag, server in (("empty", empty), ("loaded", loaded)):
                rounds[tag].append(await measure(server, args.iterations, f"{tag}{r}"))
        list_s = await _list_all(loaded)
    base = {op: statistics.median(m[op] for m in rounds["empty"]) for op in rounds["empty"][0]}
    full = {op: statistics.median(m[op] for m in rounds["loaded"]) for op in base}
    ratios = {op: full[op] / base[op] for op in base}
    print(f"{'operation':<10}{'empty_ms':>10}{'loaded_ms':>11}{'ratio':>8}")
    for op in base:
        print(f"{op:<10}{base[op] * 1e3:>10.3f}{full[op] * 1e3:>11.3f}{ratios[op]:>8.2f}")
    print(f"LIST of all {loaded.store.count('pods')} pods over HTTP: {list_s:.2f}s (O(n))")
    print(
        f"sandbox_bench nodes={args.nodes} pods={args.pods} requests={args.requests} "
        f"get_ratio={ratios['get']:.2f} patch_ratio={ratios['patch']:.2f} "
        f"post_ratio={ratios['post']:.2f} watch_ratio={ratios['watch']:.2f} "
        f"rss_mb={rss_mb():.0f}"
    )


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=1_000)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_args()))
