"""What ``muster demo`` runs: the whole story in one process, in well under a minute.

Starts the API sandbox (CRDs from ``crds/``), a few existing nodes, a CapacityPool of
8-GPU nodes in racks grouped into blocks served by the fake provider, Muster's controller
and the sandbox scheduler; submits a gang (N x 8-GPU workers required in one rack plus a
launcher) as PodTemplates and a ProvisioningRequest; once Provisioned, creates the pods
the way a Kueue-admitted job would (consume annotation, nodeSelector from
``provisioningClassDetails``); and shows live how the request moves through its
conditions, nodes appear and pods are bound. Exits 0 once every pod is bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from controller.commands import objects
from controller.commands.crds import crd_dir
from controller.kube import KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)

NAMESPACE = "default"
REQUEST = "llm-train"


class DemoFailed(Exception):
    pass


@dataclass
class Timeline:
    """What a demo shows, refreshed from the API server a few times a second: the nodes and
    pods it watches and a timeline of what happened (both demos share it)."""

    started: float = field(default_factory=time.monotonic)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def note(self, text: str) -> None:
        self.log.append(f"[dim]{time.monotonic() - self.started:5.1f}s[/] {text}")

    def render(self, workers: int) -> Group:
        raise NotImplementedError

    def once(self, mark: str, text: str) -> None:
        """Note ``text`` the first time ``mark`` is seen."""
        if mark not in self.seen:
            self.seen.add(mark)
            self.note(text)


@dataclass
class View(Timeline):
    """The ProvisioningRequest demo: the request's conditions and placement details too."""

    conditions: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)

    def render(self, workers: int) -> Group:
        cond = Table(title=f"ProvisioningRequest {NAMESPACE}/{REQUEST}", expand=True)
        for col in ("Type", "Status", "Reason", "Message"):
            cond.add_column(col, overflow="fold")
        for c in self.conditions:
            style = "green" if c.get("status") == "True" else "yellow"
            cond.add_row(c.get("type", ""), f"[{style}]{c.get('status')}[/]",
                         c.get("reason", ""), c.get("message", ""))
        racks: Counter[str] = Counter()
        ready: Counter[str] = Counter()
        for n in self.nodes:
            labels = n["metadata"].get("labels", {})
            where = labels.get(objects.RACK) or "(no rack)"
            origin = "new" if labels.get("muster.dev/pool") else "existing"
            racks[f"{origin} {where}"] += 1
            if any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in n.get("status", {}).get("conditions", [])):
                ready[f"{origin} {where}"] += 1
        nodes = Table(title="Nodes", expand=True)
        nodes.add_column("Origin / rack")
        nodes.add_column("Nodes", justify="right")
        nodes.add_column("Ready", justify="right")
        for key in sorted(racks):
            nodes.add_row(key, str(racks[key]), str(ready[key]))
        bound = sum(1 for p in self.pods if p.get("spec", {}).get("nodeName"))
        total = workers + 1
        pods = Table(title="Gang pods", expand=True)
        pods.add_column("Created", justify="right")
        pods.add_column("Bound", justify="right")
        pods.add_column("Placement (provisioningClassDetails)", overflow="fold")
        placement = ", ".join(f"{k}={v}" for k, v in sorted(self.details.items()))
        pods.add_row(f"{len(self.pods)}/{total}", f"{bound}/{total}", placement or "-")
        log = Panel("\n".join(self.log[-12:]) or "starting", title="Timeline")
        return Group(cond, nodes, pods, log)


async def _seed(kube: KubeClient, *, workers: int, latency: float, ready_delay: float) -> None:
    for i in range(1, 3):
        await kube.create(NODES, objects.node(
            f"cpu-{i}", allocatable={"cpu": "16", "memory": "64Gi"},
            labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"},
        ))
    # Three GPU machines already racked in b2-r1: the gang can use them plus new ones there.
    for i in range(1, 4):
        await kube.create(NODES, objects.node(
            f"gpu-existing-{i}", allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
            labels={objects.BLOCK: "b2", objects.RACK: "b2-r1"}, taints=[objects.GPU_TAINT],
        ))
    # Rack b1-r1 is nearly sold out: too small for the gang, so Muster must look elsewhere.
    await kube.create(CAPACITY_POOLS, objects.gpu_pool(
        rack_limits={"b1-r1": 4},
        parameters={"latencySeconds": latency, "readyDelaySeconds": ready_delay},
    ))
    await kube.create(POD_TEMPLATES, _worker_template(), namespace=NAMESPACE)
    await kube.create(POD_TEMPLATES, _launcher_template(), namespace=NAMESPACE)


def _worker_template() -> dict[str, Any]:
    return objects.pod_template(
        "workers", requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    )


def _launcher_template() -> dict[str, Any]:
    return objects.pod_template("launcher", requests={"cpu": "2", "memory": "4Gi"})


async def _observe(kube: KubeClient, view: View) -> None:
    pr = await kube.get_or_none(PROVISIONING_REQUESTS, REQUEST, namespace=NAMESPACE)
    if pr is not None:
        status = pr.get("status") or {}
        view.conditions = status.get("conditions") or []
        view.details = status.get("provisioningClassDetails") or {}
        for c in view.conditions:
            view.once(f"{c.get('type')}={c.get('status')}/{c.get('reason')}",
                      f"[bold]{c.get('type')}[/]={c.get('status')} ({c.get('reason')})")
    view.nodes = (await kube.list(NODES)).get("items") or []
    new = sum(1 for n in view.nodes if n["metadata"].get("labels", {}).get("muster.dev/pool"))
    if new:
        view.once(f"nodes:{new}", f"{new} new node(s) registered")
    view.pods = (await kube.list(PODS, namespace=NAMESPACE)).get("items") or []
    bound = sum(1 for p in view.pods if p.get("spec", {}).get("nodeName"))
    if bound:
        view.once(f"bound:{bound}", f"{bound} pod(s) bound")


def _condition(view: View, type_: str) -> dict[str, Any] | None:
    return next((c for c in view.conditions if c.get("type") == type_), None)


async def _scenario(
    kube: KubeClient, view: View, *, workers: int, refresh: Any, time_limit: float
) -> None:
    """Submit the gang, create its pods once Provisioned, return when all are bound."""
    await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        REQUEST, pod_sets=[("workers", workers), ("launcher", 1)],
    ), namespace=NAMESPACE)
    view.note(f"submitted {REQUEST}: {workers} x 8-GPU workers in one rack + 1 launcher")
    pods_created = False
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        await _observe(kube, view)
        refresh()
        failed = _condition(view, "Failed")
        if failed and failed.get("status") == "True":
            raise DemoFailed(f"the request failed: {failed.get('message')}")
        provisioned = _condition(view, "Provisioned")
        if not pods_created and provisioned and provisioned.get("status") == "True":
            selector = objects.placement_selector(view.details)
            worker, launcher = _worker_template(), _launcher_template()
            await asyncio.gather(*(
                kube.create(PODS, objects.consumer_pod(
                    f"workers-{i}", request=REQUEST, template=worker, node_selector=selector
                ), namespace=NAMESPACE)
                for i in range(workers)
            ), kube.create(PODS, objects.consumer_pod(
                "launcher-0", request=REQUEST, template=launcher
            ), namespace=NAMESPACE))
            pods_created = True
            view.note(f"created {workers + 1} pods pinned to "
                      + (", ".join(f"{k}={v}" for k, v in selector.items()) or "anywhere"))
        bound = sum(1 for p in view.pods if p.get("spec", {}).get("nodeName"))
        if pods_created and bound == workers + 1:
            view.note("[green bold]the gang runs[/]: every pod is bound")
            await asyncio.sleep(0.3)
            await _observe(kube, view)
            refresh()
            return
        await asyncio.sleep(0.2)
    last = _condition(view, "Provisioned")
    raise DemoFailed(
        f"timed out after {time_limit:.0f}s; Provisioned is "
        f"{(last or {}).get('status', 'unset')} ({(last or {}).get('message', 'no message')})"
    )


@dataclass
class DemoWorld:
    """The sandbox, a client on it and the sandbox scheduler, for one demo run."""

    server: Any
    kube: KubeClient
    scheduler: Any
    kubeconfig: Path
    controller: Any = None
    """Set by :meth:`start`; stopped on exit."""

    async def start(self, view: Timeline, **sections: Any) -> None:
        """Start Muster's controller (short timers, so a failing demo says so within its
        time limit; the fake provider serves the pools; ``sections``: more configuration)
        and the sandbox scheduler."""
        from controller.config import MusterConfig
        from controller.operator import Controller
        from providers.fake import FakeProvider

        config = MusterConfig(
            retry={"initial_backoff_seconds": 1, "max_backoff_seconds": 5, "max_attempts": 5},
            acquisition={"node_ready_timeout_seconds": 30, "idle_ttl_seconds": 30},
            **sections,
        )
        self.controller = Controller(
            kube=self.kube, config=config,
            providers={"kind": FakeProvider(self.kube, heartbeat_seconds=5)},
        )
        await self.controller.start()
        await self.scheduler.start()
        view.note(f"sandbox API server on {self.server.url} (kubeconfig {self.kubeconfig})")


@contextlib.asynccontextmanager
async def demo_world(
    *, crd_dirs: Sequence[Path], kubeconfig_out: Path | None, prefix: str
) -> AsyncIterator[DemoWorld]:
    """Start the API sandbox with ``crd_dirs`` registered and tear everything down after,
    the controller included, whatever the demo raised."""
    from sandbox.scheduler import SandboxScheduler
    from sandbox.server import SandboxServer

    server = SandboxServer()
    for directory in crd_dirs:
        server.store.load_crd_dir(directory)
    await server.start()
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    path = kubeconfig_out or Path(tmp.name) / "kubeconfig"
    server.write_kubeconfig(path)
    kube = await KubeClient.from_kubeconfig(path)
    world = DemoWorld(server, kube, SandboxScheduler(server.store), path)
    try:
        yield world
    finally:
        with contextlib.suppress(Exception):
            await world.scheduler.stop()
        if world.controller is not None:
            await world.controller.stop()
        await kube.close()
        await server.stop()
        tmp.cleanup()


async def show(
    view: Timeline, *, console: Console, workers: int,
    scenario: Callable[[Callable[[], None]], Awaitable[None]],
) -> None:
    """Run ``scenario(refresh)``: a live rich view on a terminal, plain lines elsewhere (CI
    logs, pipes), then the final view."""
    if console.is_terminal:
        with Live(view.render(workers), console=console, refresh_per_second=8) as live:
            await scenario(lambda: live.update(view.render(workers)))
        return
    printed = 0

    def refresh() -> None:
        nonlocal printed
        for line in view.log[printed:]:
            console.print(line)
        printed = len(view.log)

    await scenario(refresh)
    console.print(view.render(workers))


async def run_demo(
    *, workers: int, time_limit: float, latency: float, ready_delay: float, console: Console,
    kubeconfig_out: Path | None,
) -> None:
    async with demo_world(
        crd_dirs=[crd_dir()], kubeconfig_out=kubeconfig_out, prefix="muster-demo-"
    ) as world:
        kube = world.kube
        await _seed(kube, workers=workers, latency=latency, ready_delay=ready_delay)
        view = View()
        await world.start(view)
        await show(view, console=console, workers=workers, scenario=lambda refresh: _scenario(
            kube, view, workers=workers, time_limit=time_limit, refresh=refresh))
