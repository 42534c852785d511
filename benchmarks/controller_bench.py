"""Controller throughput: N ProvisioningRequests created at once, time to Provisioned=True.

The API sandbox runs in its own process (as an API server would; ``--in-process`` to share
one), Muster's controller runs here with the fake provider at zero latency. Every request
needs new nodes (``--pods`` 8-GPU workers required in one rack), so each one goes through
the whole path: plan and book, persist plan and keys, acquire, wait for Ready, persist the
booking, Provisioned=True. Latency is measured per request from its creation (POST
returned) to the first watch event showing Provisioned=True.

Two ways to arrive:

* all at once (default): the burst of the issue. Latency then includes queueing behind the
  other requests, so for any controller the p99 is at least about 0.99 N / throughput
  (a p99 of 1 s for 1,000 requests would take about 1,000 requests/s end to end).
* ``--rate R``: open-loop arrivals, R per second (request i is created at i / R whatever
  happened before it). This is the latency a user sees while the controller sustains R.

    python3 -m benchmarks.controller_bench [--requests 1000] [--pods 2] [--rate R]

``--kubeconfig PATH`` runs it against that cluster instead of a sandbox (default 200
requests there): the controller still runs here, as ``--muster-kubeconfig`` if given, with
the fake provider leaving node heartbeats to kwok (``heartbeat_seconds=0``, as on the
real-cluster test tier), and a Node counts as Ready only once the node lifecycle controller
lifted its start-up taints. Everything the run creates is its own (:mod:`benchmarks.target`)
and removed at the end. It also prints where each request's time went (Muster creating its
nodes, the cluster settling them, Muster writing Provisioned) and what the API server's
priority and fairness did.

Last line: ``controller_bench requests=<n> per_s=<x> p99_s=<y>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from benchmarks.target import (
    RUN_LABEL,
    Target,
    add_target_arguments,
    apf_report,
    apf_snapshot,
    target,
)
from controller.api.node import STARTUP_TAINTS
from controller.commands import objects
from controller.common.topology_defaults import OWNER_ANNOTATION
from controller.config import MusterConfig
from controller.kube import WatchEvent
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from controller.runtime.memory import freeze_heap, tune_gc
from providers.fake import FakeProvider

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
REAL_DEFAULT_REQUESTS = 200
SANDBOX_DEFAULT_REQUESTS = 1000


@contextlib.asynccontextmanager
async def sandbox(in_process: bool) -> AsyncIterator[Path]:
    tmp = tempfile.TemporaryDirectory(prefix="muster-bench-")
    path = Path(tmp.name) / "kubeconfig"
    if in_process:
        from sandbox.server import SandboxServer

        server = SandboxServer(crd_dir=CRDS)
        await server.start()
        server.write_kubeconfig(path)
        try:
            yield path
        finally:
            await server.stop()
            tmp.cleanup()
        return
    # MUSTER_BENCH_SANDBOX_PREFIX="-m cProfile -o sandbox.prof" profiles the server side.
    prefix = os.environ.get("MUSTER_BENCH_SANDBOX_PREFIX", "").split()
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurement
        [sys.executable, *prefix, "-m", "sandbox", "--port", "0", "--kubeconfig", str(path),
         "--crds", str(CRDS)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        for _ in range(200):
            if path.exists():
                break
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox exited: {proc.stderr.read() if proc.stderr else ''!r}")
            await asyncio.sleep(0.05)
        yield path
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        tmp.cleanup()


async def seed(t: Target, *, requests: int, pods: int) -> None:
    """The run's pool (its nodes labelled with the run) and the pod template selecting them."""
    racks_needed = math.ceil(requests * pods / 16) + 1
    racks_per_block = 8
    blocks = math.ceil(racks_needed / racks_per_block)
    pool = objects.gpu_pool(
        t.name("bench-gpu"), blocks=blocks, racks_per_block=racks_per_block, nodes_per_rack=16,
        max_nodes=requests * pods + 16,
    )
    pool["spec"]["nodeTemplate"]["labels"].update(t.selector)
    await t.create(CAPACITY_POOLS, pool)
    await t.kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace=t.namespace,
        requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=t.selector,
    ), namespace=t.namespace)


async def run(args: argparse.Namespace) -> dict[str, float]:
    async with target(args, lambda: sandbox(args.in_process)) as t:
        own = await t.muster_client()
        controller: Controller | None = None
        try:
            await seed(t, requests=args.requests, pods=args.pods)
            config = MusterConfig(
                booking={"duration_seconds": 3600},
                acquisition={"max_concurrent_reconciles": args.workers,
                             "collect_interval_seconds": 3600},
            )
            # In the sandbox nothing else heartbeats the nodes (and nothing reads
            # heartbeats); on a real cluster kwok does, as on the real-cluster test tier.
            provider = FakeProvider(own, heartbeat_seconds=0 if t.real else 3600)
            controller = Controller(kube=own, config=config, providers={"kind": provider})
            apf_before = await apf_snapshot(t.kubeconfig) if t.real else None
            # As `muster run` does (controller/runtime/memory.py).
            tune_gc()
            await controller.start()
            freeze_heap()
            result = await measure(t, args)
            result["planner_passes"] = float(controller.planner.passes)
            if t.real:
                print(apf_report(apf_before, await apf_snapshot(t.kubeconfig)))
        finally:
            if t.real:
                # With the controller still running: it releases the deleted requests' nodes.
                running = controller is not None and controller.ready
                print(await t.cleanup([PROVISIONING_REQUESTS], within=300 if running else 10))
            if controller is not None:
                await controller.stop()
            await own.close()
    return result


async def measure(t: Target, args: argparse.Namespace) -> dict[str, float]:
    """Create the requests; time each to its first Provisioned=True watch event."""
    kube = t.kube
    created: dict[str, float] = {}
    provisioned: dict[str, float] = {}
    done = asyncio.Event()

    def on_event(event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        name = str(meta.get("name"))
        if name in provisioned:
            return
        for cond in (event.object.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Provisioned" and cond.get("status") == "True":
                provisioned[name] = time.monotonic()
                if len(provisioned) >= args.requests:
                    done.set()

    nodes = NodeTimes()
    watchers = [asyncio.create_task(kube.watch(
        PROVISIONING_REQUESTS, lambda items: None, on_event, namespace=t.namespace))]
    if t.real:
        # Where a request's time goes on a real cluster. Not in the sandbox, where nodes are
        # Ready when created, and parsing every node event in the controller's process
        # would cost its throughput there a noticeable share.
        watchers.append(asyncio.create_task(kube.watch(
            NODES, lambda items: None, nodes.on_event,
            label_selector=f"{RUN_LABEL}={t.run}")))
    limit = asyncio.Semaphore(64)

    async def create(i: int) -> None:
        name = f"req-{i:04d}"
        if args.rate:
            # Open loop: request i is due at i / rate whatever happened before it.
            await asyncio.sleep(max(0.0, started + i / args.rate - time.monotonic()))
        async with limit:
            await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
                name, namespace=t.namespace, pod_sets=[("workers", args.pods)],
            ), namespace=t.namespace)
        created[name] = time.monotonic()

    started = time.monotonic()
    try:
        await asyncio.gather(*(create(i) for i in range(args.requests)))
        all_created = time.monotonic()
        try:
            await asyncio.wait_for(done.wait(), timeout=args.timeout)
        except TimeoutError:
            print(f"timeout: {len(provisioned)} of {args.requests} provisioned", file=sys.stderr)
    finally:
        for w in watchers:
            w.cancel()
        for w in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
    finished = max(provisioned.values(), default=time.monotonic())
    latencies = sorted(provisioned[n] - created[n] for n in provisioned if n in created)
    total = finished - started
    nodes.report(f"{t.namespace}/", created, provisioned)
    return {
        "requests": float(len(provisioned)),
        "create_s": all_created - started,
        "total_s": total,
        "per_s": len(provisioned) / total if total > 0 else 0.0,
        "p50_s": _quantile(latencies, 0.50),
        "p99_s": _quantile(latencies, 0.99),
        "max_s": latencies[-1] if latencies else math.nan,
    }


class NodeTimes:
    """When each of the run's nodes was first seen, and first seen settled (Ready, no
    start-up taint: what Muster waits for), by the request that owns it."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}
        self.seen: dict[str, float] = {}
        self.settled: dict[str, float] = {}

    def on_event(self, event: WatchEvent) -> None:
        node, now = event.object, time.monotonic()
        name = node["metadata"]["name"]
        if event.type == "DELETED" or name in self.settled:
            return
        self.seen.setdefault(name, now)
        self.owner[name] = (node["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION, "")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        tainted = any(tt.get("key") in STARTUP_TAINTS
                      for tt in (node.get("spec") or {}).get("taints") or [])
        if ready and not tainted:
            self.settled[name] = now

    def report(self, prefix: str, created: dict[str, float],
               provisioned: dict[str, float]) -> None:
        """Where each request's time went: Muster planning and creating its nodes, the
        cluster making them Ready and lifting their start-up taints, Muster noticing and
        writing Provisioned=True (p50 / p99 over the provisioned requests)."""
        last_seen: dict[str, float] = {}
        last_settled: dict[str, float] = {}
        for node, owner in self.owner.items():
            name = owner.removeprefix(prefix)
            last_seen[name] = max(last_seen.get(name, 0.0), self.seen[node])
            if node in self.settled:
                last_settled[name] = max(last_settled.get(name, 0.0), self.settled[node])
        done = [n for n in provisioned if n in created and n in last_settled]
        if not done:
            return
        parts = []
        for label, spans in (
            ("created -> nodes created", [last_seen[n] - created[n] for n in done]),
            ("nodes created -> settled", [last_settled[n] - last_seen[n] for n in done]),
            ("settled -> Provisioned", [provisioned[n] - last_settled[n] for n in done]),
        ):
            spans.sort()
            parts.append(f"{label} {_quantile(spans, 0.5):.3f}/{_quantile(spans, 0.99):.3f}s")
        print("per request, p50/p99: " + "; ".join(parts))


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="controller_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=None,
                        help=f"default {SANDBOX_DEFAULT_REQUESTS}, or {REAL_DEFAULT_REQUESTS} "
                        "with --kubeconfig")
    parser.add_argument("--pods", type=int, default=2, help="8-GPU workers per request")
    parser.add_argument("--workers", type=int, default=256, help="concurrent reconciles")
    parser.add_argument("--in-process", action="store_true",
                        help="run the sandbox in this process (one core for everything)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="create requests at this many per second instead of all at once "
                        "(latency at a sustained arrival rate)")
    parser.add_argument("--timeout", type=float, default=300.0)
    add_target_arguments(parser, "")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = REAL_DEFAULT_REQUESTS if args.kubeconfig else SANDBOX_DEFAULT_REQUESTS
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args))
    arrivals = f"{args.rate:g} per second" if args.rate else "all at once"
    where = (f"cluster: {args.kubeconfig}" if args.kubeconfig
             else f"sandbox: {'in-process' if args.in_process else 'subprocess'}")
    print(f"{where}; arrivals: {arrivals}")
    print(f"created {args.requests} requests in {result['create_s']:.2f}s; "
          f"{int(result['requests'])} Provisioned after {result['total_s']:.2f}s "
          f"({int(result['planner_passes'])} planner passes)")
    print(f"latency to Provisioned: p50 {result['p50_s']:.3f}s  p99 {result['p99_s']:.3f}s  "
          f"max {result['max_s']:.3f}s")
    print(f"controller_bench requests={int(result['requests'])} per_s={result['per_s']:.1f} "
          f"p99_s={result['p99_s']:.3f}")


if __name__ == "__main__":
    main()
