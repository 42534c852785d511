"""Muster's Kueue admission check under load (run on demand: ``python3 -m benchmarks.kueue_bench``).

Path B (Muster's own admission check, ``controllerName: muster.dev/provisioning``) with the
fake provider at zero latency: ``--workloads`` Workloads (default 200), each 4 x 8-GPU
workers required in one rack plus a launcher on an existing CPU node, all created first;
then they get quota at once and the clock starts. The pool has enough racks for all of them.
Muster's controller runs in this process in both cases.

* In the API sandbox (default) no Kueue runs: the benchmark plays Kueue's scheduler and
  writes every Workload's quota reservation itself, all at once.
* With ``--kubeconfig PATH`` real Kueue runs the cluster's side: the Workloads wait in a
  ClusterQueue created with ``stopPolicy: Hold`` and the clock starts when the benchmark
  lifts it; Kueue reserves quota (one Workload per ClusterQueue per scheduling cycle), sees
  Muster's check Ready and admits. Nodes are kwok's (``heartbeat_seconds=0``), and a node
  counts only once the node lifecycle controller lifted its start-up taints. Everything the
  run creates is its own and removed at the end (:mod:`benchmarks.target`).

Times are taken from watch events. Prints Workloads per second to check Ready (and, with
real Kueue, to Admitted), p50/p99 from quota reservation to Ready; last line
``kueue_bench workloads=<n> per_s=<x> p99_s=<y>`` (per_s and p99_s to check Ready).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.target import (
    Target,
    add_target_arguments,
    apf_report,
    apf_snapshot,
    target,
)
from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.common.topology_defaults import MUSTER_REQUIRED
from controller.config import MusterConfig
from controller.kube import ApiError, Body, KubeClient, WatchEvent
from controller.kube.resources import CAPACITY_POOLS, NODES, PROVISIONING_REQUESTS
from controller.kueue.drafts import workload_of
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench"
MUSTER_CHECK = "muster.dev/provisioning"
KUEUE_CHECK = "kueue.x-k8s.io/provisioning-request"


@dataclass(frozen=True)
class Names:
    check: str
    config: str
    gpu_flavor: str
    cpu_flavor: str
    cluster_queue: str
    pool: str

    @classmethod
    def of(cls, t: Target) -> Names:
        return cls(check=t.name("muster-prov"), config=t.name("cfg"),
                   gpu_flavor=t.name("h100"), cpu_flavor=t.name("cpu"),
                   cluster_queue=t.name("cq"), pool=t.name("gpu"))


@dataclass
class Timeline:
    """When each Workload was first seen with quota reserved, its check Ready, admitted;
    when each ProvisioningRequest (by owning Workload) was first seen Provisioned."""

    check: str
    reserved: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    admitted: dict[str, float] = field(default_factory=dict)
    requested: dict[str, float] = field(default_factory=dict)
    provisioned: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_workload(self, event: WatchEvent) -> None:
        wl, now = event.object, time.monotonic()
        name = wl["metadata"]["name"]
        status = wl.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conditions.get("QuotaReserved") == "True":
            self.reserved.setdefault(name, now)
        if conditions.get("Admitted") == "True":
            self.admitted.setdefault(name, now)
        if any(c.get("name") == self.check and c.get("state") == "Ready"
               for c in status.get("admissionChecks") or []):
            self.ready.setdefault(name, now)
        self.changed.set()

    def on_request(self, event: WatchEvent) -> None:
        pr, now = event.object, time.monotonic()
        # Path A's requests are owned by their Workload; path B's by their PodTemplates and
        # annotated with the Workload (Kueue deletes Workload-owned requests not its own).
        owner = workload_of(pr)[0]
        if owner is None:
            return
        self.requested.setdefault(owner, now)
        if any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or []):
            self.provisioned.setdefault(owner, now)


async def reserve(kube: KubeClient, t: Target, names: Names, workload: str) -> None:
    """Kueue's quota reservation, written by hand (sandbox only)."""
    while True:
        wl = await kube.get(WORKLOADS, workload, namespace=t.namespace)
        status = kq.reserve_quota(
            wl, cluster_queue=names.cluster_queue, checks=[names.check],
            now="2026-01-01T00:00:00Z",
            flavors={"workers": {r: names.gpu_flavor for r in (objects.GPU, "cpu", "memory")},
                     "launcher": {"cpu": names.cpu_flavor, "memory": names.cpu_flavor}})
        try:
            await kube.merge_patch(WORKLOADS, workload, {
                "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
                "status": status}, namespace=t.namespace, subresource="status")
            return
        except ApiError as exc:
            if not exc.conflict:
                raise


async def seed(t: Target, names: Names, args: argparse.Namespace) -> None:
    """The pool, flavors, check and its parameters (path B: and CPU nodes for the launcher);
    on a real cluster also the (held) ClusterQueue and the LocalQueue real Kueue needs."""
    workloads, workers = args.workloads, args.workers
    racks = -(-workloads * workers // 16) + 1
    pool = objects.gpu_pool(names.pool, blocks=-(-racks // 8), racks_per_block=8,
                            max_nodes=workloads * workers + 16)
    pool["spec"]["nodeTemplate"]["labels"].update(t.selector)
    await t.create(CAPACITY_POOLS, pool)
    gpu_labels = {"muster.dev/accelerator": "h100", **t.selector}
    if args.path == "a":
        # Kueue copies the flavor's nodeLabels and tolerations into the request's pod
        # templates; Muster's own check (path B) tolerates the selected pools' taints itself.
        await t.create(RESOURCE_FLAVORS, kq.resource_flavor(
            names.gpu_flavor, node_labels=gpu_labels, tolerations=[objects.GPU_TOLERATION]))
    else:
        await t.create(RESOURCE_FLAVORS, kq.resource_flavor(names.gpu_flavor,
                                                            node_labels=gpu_labels))
    await t.create(RESOURCE_FLAVORS, kq.resource_flavor(names.cpu_flavor,
                                                        node_labels=t.selector))
    if args.path == "a":
        # Kueue's check: a request for the GPU pod set only, the rack Muster booked copied
        # into its nodeSelector on admission.
        prc = kq.provisioning_request_config(
            names.config, class_name="atomic-provisioning.muster.dev",
            selector_details={objects.RACK: objects.RACK})
        prc["spec"]["managedResources"] = [objects.GPU]
        await t.create(PROVISIONING_REQUEST_CONFIGS, prc)
        await t.create(ADMISSION_CHECKS, kq.admission_check(
            names.check, controller_name=KUEUE_CHECK, config=names.config))
    else:
        # Muster's check plans every pod set: the launcher on an existing CPU node.
        for i in range(max(1, workloads // 50)):
            node = objects.node(t.name(f"cpu-{i}"),
                                allocatable={"cpu": "128", "memory": "512Gi"},
                                labels=t.selector)
            # On a real cluster kwok is their kubelet (heartbeats), as for the pool's nodes.
            node["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake"}
            await t.create(NODES, node)
        await t.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
            names.config, class_name="atomic-provisioning.muster.dev"))
        await t.create(ADMISSION_CHECKS, kq.admission_check(
            names.check, controller_name=MUSTER_CHECK, config=names.config))
    if not t.real:
        return
    # The CPU flavor first: Kueue tries flavors in order, so the launcher gets it and the
    # GPU workers (no GPU quota there) get the H100 flavor, as the sandbox run assigns them.
    n = workloads * workers
    cq = kq.cluster_queue(names.cluster_queue, checks=[names.check], flavors={
        names.cpu_flavor: {"cpu": str(workloads + 128), "memory": f"{workloads + 512}Gi",
                           objects.GPU: "0"},
        names.gpu_flavor: {"cpu": str(90 * n), "memory": f"{900 * n}Gi",
                           objects.GPU: str(8 * n)},
    })
    cq["spec"]["namespaceSelector"] = {
        "matchLabels": {"kubernetes.io/metadata.name": t.namespace}}
    cq["spec"]["stopPolicy"] = "Hold"
    await t.create(CLUSTER_QUEUES, cq)
    await t.kube.create(LOCAL_QUEUES, kq.local_queue(QUEUE, t.namespace, names.cluster_queue),
                        namespace=t.namespace)


def workload_body(t: Target, name: str, workers: int) -> Body:
    return kq.workload(name, t.namespace, queue=QUEUE, pod_sets=[
        kq.pod_set("workers", workers, requests={"cpu": "90", "memory": "900Gi",
                                                 objects.GPU: "8"},
                   annotations={MUSTER_REQUIRED: objects.RACK}),
        kq.pod_set("launcher", 1, requests={"cpu": "1", "memory": "1Gi"}),
    ])


@contextlib.asynccontextmanager
async def kueue_sandbox() -> AsyncIterator[Path]:
    """A fresh in-process sandbox with Muster's and Kueue's CRDs; yields its kubeconfig."""
    server = SandboxServer()
    for d in (ROOT / "crds", ROOT / "e2e" / "kueue-crds"):
        server.store.load_crd_dir(d)
    await server.start()
    tmp = tempfile.TemporaryDirectory()
    try:
        yield server.write_kubeconfig(Path(tmp.name) / "kubeconfig")
    finally:
        await server.stop()
        tmp.cleanup()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with target(args, kueue_sandbox) as t:
        names = Names.of(t)
        own = await t.muster_client()
        controller: Controller | None = None
        try:
            await seed(t, names, args)
            # Path A needs no Kueue code in Muster: Kueue writes the requests.
            # The default node-ready timeout (900 s): on a real cluster a burst of new nodes
            # waits minutes for the node lifecycle controller to lift their not-ready taint.
            config = MusterConfig(kueue={"enabled": args.path == "b"})
            # In the sandbox the provider heartbeats its nodes; on a real cluster kwok does.
            provider = FakeProvider(own, heartbeat_seconds=0 if t.real else 30)
            controller = Controller(kube=own, config=config,
                                    providers={"kind": provider})
            await controller.start()
            apf_before = await apf_snapshot(t.kubeconfig) if t.real else None
            result = await measure(t, names, args)
            if controller.kueue is not None:
                result["reconciles"] = controller.kueue.reconciles
            if t.real:
                print(apf_report(apf_before, await apf_snapshot(t.kubeconfig)))
        finally:
            if t.real:
                # With the controller still running: it releases the requests' nodes.
                running = controller is not None and controller.ready
                print(await t.cleanup([WORKLOADS, PROVISIONING_REQUESTS, LOCAL_QUEUES],
                                      within=300 if running else 10))
            if controller is not None:
                await controller.stop()
            await own.close()
    return result


async def measure(t: Target, names: Names, args: argparse.Namespace) -> dict[str, Any]:
    kube, n = t.kube, args.workloads
    timeline = Timeline(check=names.check)
    if t.real:
        # Its controller (Muster for path B, Kueue for path A) marks the AdmissionCheck
        # Active; Kueue admits nothing through it before.
        await _until(lambda: _active(kube, names.check), 30, "the AdmissionCheck to be Active")
    watches = [
        asyncio.create_task(kube.watch(WORKLOADS, lambda items: None, timeline.on_workload,
                                       namespace=t.namespace)),
        asyncio.create_task(kube.watch(PROVISIONING_REQUESTS, lambda items: None,
                                       timeline.on_request, namespace=t.namespace)),
    ]
    workloads = [f"wl-{i:04d}" for i in range(n)]
    limit = asyncio.Semaphore(32)

    async def create(name: str) -> None:
        async with limit:
            await kube.create(WORKLOADS, workload_body(t, name, args.workers),
                              namespace=t.namespace)

    try:
        await asyncio.gather(*(create(w) for w in workloads))
        started = time.monotonic()
        if t.real:
            await kube.merge_patch(CLUSTER_QUEUES, names.cluster_queue,
                                   {"spec": {"stopPolicy": "None"}})
        else:
            async def reserve_one(name: str) -> None:
                async with limit:
                    await reserve(kube, t, names, name)

            await asyncio.gather(*(reserve_one(w) for w in workloads))
            print(f"quota reserved by hand on {n} Workloads in "
                  f"{time.monotonic() - started:.1f}s")
        # Real Kueue admits once every check is Ready; the sandbox has no one to admit.
        wanted = timeline.admitted if t.real else timeline.ready
        deadline = started + args.timeout
        while len(wanted) < n and time.monotonic() < deadline:
            timeline.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(timeline.changed.wait(), timeout=1.0)
        missing = [w for w in workloads if w not in wanted]
        if missing:
            await explain(kube, t.namespace, names.check, missing)
    finally:
        for w in watches:
            w.cancel()
        for w in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await w
    return summarize(timeline, workloads, started, real=t.real)


async def explain(kube: KubeClient, namespace: str, check: str, missing: list[str]) -> None:
    """Why the Workloads that did not finish are stuck: their check state and their
    ProvisioningRequests' conditions (the first five)."""
    print(f"{len(missing)} Workload(s) not done: {', '.join(missing[:10])}", file=sys.stderr)
    requests = (await kube.list(PROVISIONING_REQUESTS, namespace=namespace)).get("items") or []
    for name in missing[:5]:
        wl = await kube.get_or_none(WORKLOADS, name, namespace=namespace) or {}
        status = wl.get("status") or {}
        conds = {c["type"]: f"{c['status']}/{c.get('reason', '')}"
                 for c in status.get("conditions") or []}
        states = [f"{c.get('state')}: {c.get('message', '')}"
                  for c in status.get("admissionChecks") or [] if c.get("name") == check]
        print(f"  {name}: {conds}; check {states}", file=sys.stderr)
        for pr in requests:
            if workload_of(pr)[0] == name:
                prc = [f"{c['type']}={c['status']}/{c.get('reason', '')}: "
                       f"{c.get('message', '')[:160]}"
                       for c in (pr.get("status") or {}).get("conditions") or []]
                print(f"    {pr['metadata']['name']}: {prc}", file=sys.stderr)


def summarize(tl: Timeline, workloads: list[str], started: float, *, real: bool
              ) -> dict[str, Any]:
    n = len(workloads)
    if len(tl.ready) < n:
        print(f"only {len(tl.ready)} of {n} checks became Ready", file=sys.stderr)

    def span(times: dict[str, float]) -> float:
        return max(times.values(), default=started) - started

    def q(values: list[float]) -> tuple[float, float]:
        if len(values) < 2:
            return (values[0], values[0]) if values else (float("nan"), float("nan"))
        cuts = statistics.quantiles(values, n=100)
        return cuts[49], cuts[98]

    print(f"quota reserved over {span(tl.reserved):.1f}s; ProvisioningRequests created over "
          f"{span(tl.requested):.1f}s, Provisioned over {span(tl.provisioned):.1f}s; "
          f"checks Ready over {span(tl.ready):.1f}s"
          + (f"; Admitted over {span(tl.admitted):.1f}s" if real else ""))
    to_ready = [tl.ready[w] - tl.reserved[w] for w in workloads if w in tl.ready
                and w in tl.reserved]
    lag = [tl.ready[w] - tl.provisioned[w] for w in workloads if w in tl.ready
           and w in tl.provisioned]
    if lag:
        print(f"request Provisioned -> check Ready: p50 {statistics.median(lag):.2f}s "
              f"max {max(lag):.2f}s (the rest is the request reconciler)")
    p50, p99 = q(to_ready)
    result: dict[str, Any] = {
        "workloads": len(tl.ready), "elapsed_s": span(tl.ready),
        "per_s": len(tl.ready) / span(tl.ready) if span(tl.ready) > 0 else 0.0,
        "p50_s": p50, "p99_s": p99,
    }
    if real:
        a50, a99 = q([tl.admitted[w] - tl.reserved[w] for w in workloads
                      if w in tl.admitted and w in tl.reserved])
        result.update(admitted=len(tl.admitted), admitted_s=span(tl.admitted),
                      admitted_per_s=len(tl.admitted) / span(tl.admitted)
                      if span(tl.admitted) > 0 else 0.0,
                      admitted_p50_s=a50, admitted_p99_s=a99)
    return result


async def _active(kube: KubeClient, check: str) -> bool:
    ac = await kube.get(ADMISSION_CHECKS, check)
    return any(c["type"] == "Active" and c["status"] == "True"
               for c in (ac.get("status") or {}).get("conditions") or [])


async def _until(probe: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kueue_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--path", choices=["a", "b"], default=None,
                        help="b: Muster's own admission check (the default in the sandbox); "
                        "a: Kueue's built-in provisioning-request check with Muster's class "
                        "(the default with --kubeconfig; needs real Kueue)")
    add_target_arguments(parser, " and its real Kueue")
    args = parser.parse_args(argv)
    if args.path is None:
        args.path = "a" if args.kubeconfig else "b"
    if args.path == "a" and not args.kubeconfig:
        parser.error("--path a needs real Kueue: give --kubeconfig")
    logging.basicConfig(level=logging.WARNING)
    r = asyncio.run(run(args))
    n = args.workloads
    where = (f"path {args.path.upper()}, "
             + (f"cluster {args.kubeconfig}, real Kueue" if args.kubeconfig
                else "sandbox, Kueue played by hand"))
    if "reconciles" in r:
        print(f"{r['reconciles']} Workload reconciles ({r['reconciles'] / n:.1f} per Workload)")
    print(f"{where}: {r['workloads']} of {n} Workloads x {args.workers} workers Ready in "
          f"{r['elapsed_s']:.1f}s ({r['per_s']:.1f}/s); reservation -> Ready "
          f"p50 {r['p50_s']:.2f}s p99 {r['p99_s']:.2f}s")
    if "admitted" in r:
        print(f"admitted by Kueue: {r['admitted']} in {r['admitted_s']:.1f}s "
              f"({r['admitted_per_s']:.1f}/s); reservation -> Admitted "
              f"p50 {r['admitted_p50_s']:.2f}s p99 {r['admitted_p99_s']:.2f}s")
    print(f"kueue_bench workloads={r['workloads']} per_s={r['per_s']:.1f} "
          f"p99_s={r['p99_s']:.2f}")


if __name__ == "__main__":
    main()
