"""Waiting gangs and capacity that frees: time from the freeing to Provisioned=True, and what a
churn of cluster events costs the planner (controller/state/wakeups.py).

Setup: a pool that holds exactly one gang (``--pods`` 8-GPU workers in one rack), a gang
holding it, and ``--waiting`` more gangs created after it, all waiting (CapacityIsNotFound,
backoff 10 s doubling to 60 s). Then ``--cycles`` times: delete the gang that holds the pool
and time, from the deletion's answer and from the moment its last node is gone, until the
oldest waiting gang is Provisioned; one new waiting gang is created after each cycle, so
``--waiting`` gangs wait throughout. Each cycle also checks that the gang served is the
oldest (arrival order).

(``--replan-order backoff``, the default, serves the gang whose backoff timer is due first,
which is not always the oldest: the count is of gangs served before an older one.)

Then ``--churn-seconds`` of churn: pods created and deleted on nodes no gang can use, at
``--churn-rate`` pods a second (each deletion is a "pod finished" event that wakes the waiting
gangs), while the same gangs wait. Reported: wake-up rounds, planner passes and the planner's
busy time (sum of its passes' durations) as a share of the wall time, this process's CPU
(controller and benchmark client; the sandbox runs in its own process), and the request
writes the controller made meanwhile (its backoff timers' writes; a woken gang that still
does not fit writes nothing).

    python3 -m benchmarks.wakeup_bench [--waiting 200] [--cycles 30] [--churn-seconds 20]
    python3 -m benchmarks.wakeup_bench --no-wakeups --cycles 3   # the backoff alone

``--kubeconfig PATH`` runs it against that cluster (see benchmarks/target.py); the churn's
nodes are then kwok's (annotated ``kwok.x-k8s.io/node: fake``).

Last line: ``wakeup_bench waiting=<n> p50_s=<x> p99_s=<y> planner_busy=<share>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import sys
import time
from typing import Any

from benchmarks.controller_bench import _quantile, sandbox
from benchmarks.target import Target, add_target_arguments, target
from controller.commands import objects
from controller.common.topology_defaults import OWNER_ANNOTATION
from controller.config import MusterConfig
from controller.kube import WatchEvent
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from controller.runtime.memory import freeze_heap, tune_gc
from providers.fake import FakeProvider

CHURN_NODES = 4


class Requests:
    """Each request's Provisioned condition as the watch shows it, and when it turned True."""

    def __init__(self) -> None:
        self.reason: dict[str, str] = {}
        self.provisioned: dict[str, float] = {}
        self.events = 0
        self.changed = asyncio.Event()

    def on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            return
        self.events += 1
        name = str(event.object["metadata"]["name"])
        for cond in (event.object.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Provisioned":
                self.reason[name] = str(cond.get("reason"))
                if cond.get("status") == "True" and name not in self.provisioned:
                    self.provisioned[name] = time.monotonic()
        self.changed.set()

    async def until(self, probe: Any, within: float) -> None:
        deadline = time.monotonic() + within
        while not probe():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("not reached in time")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))


class Nodes:
    """The run's pool nodes by owning request, and when a request's last one went."""

    def __init__(self) -> None:
        self.by_owner: dict[str, set[str]] = {}
        self.gone: dict[str, float] = {}

    def on_event(self, event: WatchEvent) -> None:
        meta = event.object["metadata"]
        owner = (meta.get("annotations") or {}).get(OWNER_ANNOTATION, "").rpartition("/")[2]
        if not owner:
            return
        nodes = self.by_owner.setdefault(owner, set())
        if event.type == "DELETED":
            nodes.discard(meta["name"])
            if not nodes:
                self.gone.setdefault(owner, time.monotonic())
        else:
            nodes.add(meta["name"])


async def seed(t: Target, pods: int) -> None:
    pool = objects.gpu_pool(t.name("wake-gpu"), blocks=1, racks_per_block=2,
                            nodes_per_rack=16, max_nodes=pods)
    pool["spec"]["nodeTemplate"]["labels"].update(t.selector)
    await t.create(CAPACITY_POOLS, pool)
    await t.kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace=t.namespace,
        requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=t.selector,
    ), namespace=t.namespace)


async def create_request(t: Target, name: str, pods: int) -> None:
    await t.kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        name, namespace=t.namespace, pod_sets=[("workers", pods)]), namespace=t.namespace)


async def run(args: argparse.Namespace) -> dict[str, float]:
    async with target(args, lambda: sandbox(False)) as t:
        own = await t.muster_client()
        controller: Controller | None = None
        watchers: list[asyncio.Task[None]] = []
        try:
            await seed(t, args.pods)
            config = MusterConfig(
                booking={"duration_seconds": 3600},
                acquisition={"collect_interval_seconds": 3600},
                retry={"replan_on_capacity_change": not args.no_wakeups,
                       "replan_order": args.replan_order},
            )
            provider = FakeProvider(own, heartbeat_seconds=0 if t.real else 3600)
            controller = Controller(kube=own, config=config, providers={"kind": provider})
            passes: list[float] = []
            observe = controller.planner._on_pass

            def on_pass(requests: int, seconds: float) -> None:
                passes.append(seconds)
                if observe is not None:
                    observe(requests, seconds)

            controller.planner._on_pass = on_pass
            tune_gc()
            await controller.start()
            freeze_heap()
            reqs, nodes = Requests(), Nodes()
            watchers = [
                asyncio.create_task(t.kube.watch(
                    PROVISIONING_REQUESTS, lambda page: None, reqs.on_event,
                    namespace=t.namespace)),
                asyncio.create_task(t.kube.watch(
                    NODES, lambda page: None, nodes.on_event,
                    label_selector=",".join(f"{k}={v}" for k, v in t.selector.items()))),
            ]
            result = await measure(t, args, controller, reqs, nodes, passes)
        finally:
            for w in watchers:
                w.cancel()
            for w in watchers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            if t.real:
                running = controller is not None and controller.ready
                print(await t.cleanup([PODS, PROVISIONING_REQUESTS],
                                      within=300 if running else 10))
            if controller is not None:
                await controller.stop()
            await own.close()
    return result


async def measure(t: Target, args: argparse.Namespace, controller: Controller,
                  reqs: Requests, nodes: Nodes, passes: list[float]) -> dict[str, float]:
    pods = args.pods
    await create_request(t, "holder", pods)
    await reqs.until(lambda: "holder" in reqs.provisioned, args.timeout)
    waiting = [f"w-{i:04d}" for i in range(args.waiting)]
    limit = asyncio.Semaphore(32)

    async def make(name: str) -> None:
        async with limit:
            await create_request(t, name, pods)

    for name in waiting:  # one at a time: their creation order is their arrival order
        await make(name)
    await reqs.until(lambda: all(reqs.reason.get(n) == "CapacityIsNotFound" for n in waiting),
                     args.timeout)
    print(f"{len(waiting)} gangs waiting (CapacityIsNotFound)", flush=True)

    from_delete: list[float] = []
    from_free: list[float] = []
    out_of_order = 0
    holder = "holder"
    made = len(waiting)
    for _ in range(args.cycles):
        await t.kube.delete(PROVISIONING_REQUESTS, holder, namespace=t.namespace)
        deleted = time.monotonic()
        await reqs.until(lambda: any(n in reqs.provisioned for n in waiting), args.timeout)
        served = min((n for n in waiting if n in reqs.provisioned),
                     key=lambda n: reqs.provisioned[n])
        if served != waiting[0]:
            out_of_order += 1
        at = reqs.provisioned[served]
        from_delete.append(at - deleted)
        if holder in nodes.gone:
            from_free.append(at - nodes.gone[holder])
        waiting.remove(served)
        holder = served
        name = f"w-{made:04d}"
        made += 1
        await make(name)
        waiting.append(name)
        await reqs.until(lambda n=name: reqs.reason.get(n) == "CapacityIsNotFound",
                         args.timeout)
    from_delete.sort()
    from_free.sort()
    churn = await churn_phase(t, args, controller, reqs, passes) if args.churn_seconds else {}
    return {
        "cycles": float(len(from_delete)),
        "p50_s": _quantile(from_delete, 0.5),
        "p99_s": _quantile(from_delete, 0.99),
        "max_s": from_delete[-1] if from_delete else math.nan,
        "free_p50_s": _quantile(from_free, 0.5),
        "free_p99_s": _quantile(from_free, 0.99),
        "out_of_order": float(out_of_order),
        **churn,
    }


async def churn_phase(t: Target, args: argparse.Namespace, controller: Controller,
                      reqs: Requests, passes: list[float]) -> dict[str, float]:
    """Pods come and go on nodes no waiting gang can use (no GPU, not the run's pool)."""
    names = [t.name(f"churn-{i}") for i in range(CHURN_NODES)]
    for name in names:
        body = objects.node(name, allocatable={"cpu": "64", "memory": "256Gi", "pods": "110"})
        body["metadata"].setdefault("labels", {}).update({"bench.muster.dev/churn": t.run})
        if t.real:
            body["metadata"].setdefault("annotations", {})["kwok.x-k8s.io/node"] = "fake"
        await t.create(NODES, body)
    template = objects.pod_template("churn", namespace=t.namespace, requests={"cpu": "1"})
    rounds0, woken0 = controller.wakeups.rounds, controller.wakeups.woken
    passes0, events0 = len(passes), reqs.events
    cpu0, wall0 = time.process_time(), time.monotonic()
    end = wall0 + args.churn_seconds
    i = 0
    live: list[str] = []
    while time.monotonic() < end:
        due = wall0 + i / args.churn_rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        pod = objects.consumer_pod(f"churn-{i}", request="none", template=template)
        pod["spec"]["nodeName"] = names[i % len(names)]
        await t.kube.create(PODS, pod, namespace=t.namespace)
        live.append(f"churn-{i}")
        if len(live) > 8:
            await t.kube.delete(PODS, live.pop(0), namespace=t.namespace)
        i += 1
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    busy = sum(passes[passes0:])
    return {
        "churn_pods_per_s": i / wall,
        "rounds_per_s": (controller.wakeups.rounds - rounds0) / wall,
        "woken_per_s": (controller.wakeups.woken - woken0) / wall,
        "passes_per_s": (len(passes) - passes0) / wall,
        "planner_busy": busy / wall,
        "process_cpu": cpu / wall,
        "request_events_per_s": (reqs.events - events0) / wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wakeup_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--waiting", type=int, default=200, help="gangs kept waiting")
    parser.add_argument("--pods", type=int, default=2, help="8-GPU workers per gang")
    parser.add_argument("--cycles", type=int, default=30, help="capacity freeings timed")
    parser.add_argument("--churn-seconds", type=float, default=20.0)
    parser.add_argument("--churn-rate", type=float, default=50.0, help="pods a second")
    parser.add_argument("--no-wakeups", action="store_true",
                        help="retry.replan_on_capacity_change off: the backoff alone")
    parser.add_argument("--replan-order", choices=("backoff", "arrival"), default="backoff",
                        help="retry.replan_order: who a round serves first")
    parser.add_argument("--timeout", type=float, default=300.0)
    add_target_arguments(parser, "")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    r = asyncio.run(run(args))
    where = f"cluster: {args.kubeconfig}" if args.kubeconfig else "sandbox: subprocess"
    print(f"{where}; {args.waiting} waiting gangs of {args.pods} nodes; "
          f"wake-ups {'off' if args.no_wakeups else 'on'}, replan order {args.replan_order}")
    print(f"capacity freed -> oldest waiting gang Provisioned over {int(r['cycles'])} cycles: "
          f"from the deletion p50 {r['p50_s']:.3f}s p99 {r['p99_s']:.3f}s max {r['max_s']:.3f}s; "
          f"from the last node gone p50 {r['free_p50_s']:.3f}s p99 {r['free_p99_s']:.3f}s; "
          f"served before an older gang: {int(r['out_of_order'])}")
    if "planner_busy" in r:
        print(f"churn: {r['churn_pods_per_s']:.0f} pods/s finishing; {r['rounds_per_s']:.1f} "
              f"wake-up rounds/s ({r['woken_per_s']:.0f} requests woken/s); "
              f"{r['passes_per_s']:.1f} planner passes/s; planner busy "
              f"{100 * r['planner_busy']:.1f}% of the wall time; this process's CPU "
              f"{100 * r['process_cpu']:.0f}% of one core; {r['request_events_per_s']:.1f} "
              "request updates/s")
    print(f"wakeup_bench waiting={args.waiting} p50_s={r['p50_s']:.3f} p99_s={r['p99_s']:.3f} "
          f"planner_busy={r.get('planner_busy', math.nan):.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
