"""End-to-end fixtures: the same scenarios against the in-process sandbox or a real cluster.

By default each test gets a fresh API sandbox with Muster's CRDs, Muster's controller
(in-process, config ``e2e/muster-e2e.yaml``) with the fake provider, and the sandbox
scheduler. With ``--kubeconfig PATH`` the tests talk to that cluster instead, where Muster
must already run with the same config (see docs/testing/tiers.md); scenarios that
need to restart the controller are skipped there, saying why.

Tests isolate themselves with a per-test namespace and a per-test run label on every node,
pool and pod template, so they never see each other's capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.commands import objects
from controller.config import MusterConfig, load_config
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from e2e.cluster import HARNESS_VARIABLES
from e2e.real import note_unexpected_exit, record_failure_context

E2E_CONFIG = Path(__file__).with_name("muster-e2e.yaml")
CRD_DIR = Path(__file__).resolve().parents[1] / "crds"
RUN_LABEL = "e2e.muster.dev/run"

T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubeconfig",
        action="store",
        default=None,
        help="Run the e2e tests against this cluster (Muster must already run there with "
        "e2e/muster-e2e.yaml) instead of the in-process sandbox.",
    )


@dataclass
class Env:
    """One test's cluster, with helpers that read like the scenario."""

    kube: KubeClient
    namespace: str
    run: str
    external: bool
    config: MusterConfig
    restart: Callable[[], Awaitable[None]] | None = None
    stop_controller: Callable[[], Awaitable[None]] | None = None
    start_controller: Callable[[], Awaitable[None]] | None = None
    providers: list[Any] = field(default_factory=list)
    """The in-process controller's providers, one per (re)start (empty against a cluster)."""
    unhealthy: Callable[[], Awaitable[list[str]]] | None = None
    """What is wrong with the running Muster now (dead tasks, an exited process, a failing
    ``/healthz``); empty when healthy. None where no Muster of the test's is known."""
    kubeconfig: Path | None = None
    """An admin kubeconfig of the cluster (for clients in other processes: kubectl muster)."""
    cleanup: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)

    @property
    def provider(self) -> Any:
        """The running in-process controller's fake provider (None against a cluster)."""
        return self.providers[-1] if self.providers else None

    def provider_calls(self) -> list[Any]:
        return [call for p in self.providers for call in p.calls]

    # ---------------------------------------------------------------- objects

    @property
    def selector(self) -> dict[str, str]:
        return {RUN_LABEL: self.run}

    def name(self, base: str) -> str:
        return f"{base}-{self.run}"

    async def existing_gpu_nodes(self, count: int, *, rack: str = "b1-r1") -> list[str]:
        names = [self.name(f"gpu-{i}") for i in range(count)]
        for name in names:
            body = objects.node(
                name,
                allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
                labels={**self.selector, objects.BLOCK: rack.split("-")[0], objects.RACK: rack},
                taints=[objects.GPU_TAINT],
            )
            await self.kube.create(NODES, body)
            self.cleanup.append(lambda n=name: self.kube.delete(NODES, n))
        return names

    async def gpu_pool(self, **kwargs: Any) -> str:
        body = objects.gpu_pool(self.name("gpu"), **kwargs)
        body["spec"]["nodeTemplate"]["labels"].update(self.selector)
        await self.kube.create(CAPACITY_POOLS, body)
        self.cleanup.append(lambda: self.kube.delete(CAPACITY_POOLS, body["metadata"]["name"]))
        return str(body["metadata"]["name"])

    async def worker_template(self, name: str = "workers", *, level: str | None = objects.RACK,
                              annotations: dict[str, str] | None = None) -> Body:
        body = objects.pod_template(
            name, namespace=self.namespace,
            requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
            required_level=level, tolerations=[objects.GPU_TOLERATION],
            node_selector=self.selector,
        )
        body["template"]["metadata"]["annotations"].update(annotations or {})
        await self.kube.create(POD_TEMPLATES, body, namespace=self.namespace)
        return body

    async def request(self, name: str, pod_sets: list[tuple[str, int]], **kwargs: Any) -> None:
        body = objects.provisioning_request(
            name, pod_sets=pod_sets, namespace=self.namespace, **kwargs
        )
        await self.kube.create(PROVISIONING_REQUESTS, body, namespace=self.namespace)

    async def pods_for(self, request: str, template: Body, count: int) -> None:
        pr = await self.get(request)
        details = (pr.get("status") or {}).get("provisioningClassDetails") or {}
        selector = objects.placement_selector(details)
        for i in range(count):
            await self.kube.create(PODS, objects.consumer_pod(
                f"{request}-{i}", request=request, template=template, node_selector=selector,
            ), namespace=self.namespace)

    # ---------------------------------------------------------------- reads

    async def get(self, request: str) -> Body:
        return await self.kube.get(PROVISIONING_REQUESTS, request, namespace=self.namespace)

    async def condition(self, request: str, type_: str) -> dict[str, Any] | None:
        pr = await self.get(request)
        for cond in (pr.get("status") or {}).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return None

    async def wait_condition(
        self, request: str, type_: str, status: str = "True", *, within: float = 20.0
    ) -> dict[str, Any]:
        cond = await eventually(lambda: self._cond_is(request, type_, status), within=within)
        return cond

    async def compete(
        self, names: tuple[str, ...], pod_sets: list[tuple[str, int]], **kwargs: Any
    ) -> list[str]:
        """Create equal requests at once; once each has a Provisioned condition, their
        ``status/reason`` pairs, sorted (``True/...`` last)."""
        await asyncio.gather(*(self.request(n, pod_sets, **kwargs) for n in names))
        got: list[str] = await eventually(lambda: self.provisioned_outcomes(*names))
        return got

    async def _cond_is(self, request: str, type_: str, status: str) -> dict[str, Any] | None:
        cond = await self.condition(request, type_)
        return cond if cond is not None and cond.get("status") == status else None

    async def provisioned_outcomes(self, *requests: str) -> list[str] | None:
        """Sorted ``status/reason`` of each request's Provisioned condition, or None while
        any request has none yet (for races where only the set of outcomes is known)."""
        outcomes = []
        for request in requests:
            cond = await self.condition(request, "Provisioned")
            if cond is None:
                return None
            outcomes.append(f"{cond['status']}/{cond['reason']}")
        return sorted(outcomes)

    async def pool_nodes(self, pool: str) -> list[Body]:
        listing = await self.kube.list(NODES, label_selector=f"fake.muster.dev/pool={pool}")
        return list(listing.get("items") or [])

    async def bound_pods(self) -> int:
        listing = await self.kube.list(PODS, namespace=self.namespace)
        return sum(1 for p in listing.get("items") or [] if p["spec"].get("nodeName"))


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, within: float = 20.0, step: float = 0.1,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy and return that; fail after
    ``within`` seconds naming ``what`` and the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: T | None = None
    while True:
        try:
            last = await asyncio.wait_for(probe(), max(deadline - loop.time(), step))
        except TimeoutError:
            raise AssertionError(
                f"timed out after {within:g}s waiting for {what}: the probe did not answer "
                f"(last answer: {last!r})") from None
        if last:
            return last
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out after {within:g}s waiting for {what}; last: {last!r}"
            )
        await asyncio.sleep(step)


async def bounded(awaitable: Awaitable[T], within: float, what: str) -> T:
    """``awaitable``'s result, or the test fails after ``within`` seconds naming ``what``
    (instead of hanging until the runner's timeout, which names nothing)."""
    try:
        return await asyncio.wait_for(awaitable, within)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g}s waiting for {what}") from None


TIERS = [pytest.param("sandbox"), pytest.param("real", marks=pytest.mark.real)]


def e2e_config() -> MusterConfig:
    """Muster's config for the scenarios. load_config refuses unknown ``MUSTER_*``
    variables, so the harness's own (a cluster on other ports, another state directory)
    are set aside while it reads the environment."""
    saved = {k: os.environ.pop(k) for k in HARNESS_VARIABLES if k in os.environ}
    try:
        return load_config(E2E_CONFIG)
    finally:
        os.environ.update(saved)


@pytest.fixture(params=TIERS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    """One scenario's cluster: the in-process sandbox, or the real tier (the local control
    plane with Muster as its own process; with ``--kubeconfig``, that cluster instead)."""
    run = uuid.uuid4().hex[:8]
    namespace = f"e2e-{run}"
    config = e2e_config()
    if request.param == "sandbox":
        async with _sandbox_env(namespace, run, config) as e:
            yield e
        return
    kubeconfig = request.config.getoption("--kubeconfig")
    muster = None
    if not kubeconfig:
        muster = request.getfixturevalue("muster_rbac_clean")
        kubeconfig = str(muster.cluster.admin_kubeconfig)
        record_failure_context(request.node, muster, namespace)
    async with await KubeClient.from_kubeconfig(Path(kubeconfig)) as kube:
        e = Env(kube=kube, namespace=namespace, run=run, external=True, config=config,
                kubeconfig=Path(kubeconfig))
        if muster is not None:
            e.unhealthy = lambda: asyncio.to_thread(_process_problems, muster)
            e.stop_controller = lambda: asyncio.to_thread(muster.stop)
            e.start_controller = lambda: asyncio.to_thread(muster.start)
            e.restart = lambda: asyncio.to_thread(muster.restart)
        await _namespace(kube, namespace)
        try:
            yield e
        finally:
            if muster is not None and not muster.running:
                note_unexpected_exit(request.node, muster)
                await asyncio.to_thread(muster.start)
            await _cleanup(e)


@contextlib.asynccontextmanager
async def _sandbox_env(namespace: str, run: str, config: MusterConfig) -> AsyncIterator[Env]:
    import tempfile

    from controller.operator import Controller
    from providers.fake import FakeProvider
    from sandbox.server import SandboxServer

    server = SandboxServer(crd_dir=CRD_DIR, bookmark_interval=0.5)
    await bounded(server.start(), 30, "the sandbox API server to start")
    tmp = tempfile.TemporaryDirectory(prefix="muster-e2e-")
    path = server.write_kubeconfig(Path(tmp.name) / "kubeconfig")
    kube = await KubeClient.from_kubeconfig(path)
    scheduler = _scheduler(server)
    holder: dict[str, Any] = {"controller": None, "kube": None}
    providers: list[FakeProvider] = []

    async def start() -> None:
        # Like a restarted process: its own client (connections) and provider instance.
        own = await KubeClient.from_kubeconfig(path)
        provider = FakeProvider(own, heartbeat_seconds=config.providers.kind.heartbeat_seconds)
        providers.append(provider)
        controller = Controller(kube=own, config=config, providers={"kind": provider})
        await bounded(controller.start(), 60, "the controller to start")
        holder.update(controller=controller, kube=own)

    async def stop() -> None:
        controller, own = holder["controller"], holder["kube"]
        holder.update(controller=None, kube=None)
        if controller is not None:
            await bounded(controller.stop(), 60, "the controller to stop")
        if own is not None:
            await own.close()

    async def restart() -> None:
        await stop()
        await start()

    async def unhealthy() -> list[str]:
        controller = holder["controller"]
        if controller is None:
            return ["the controller is not running"]
        return [f"task {t} died" for t in controller.failed_tasks()]

    e = Env(kube=kube, namespace=namespace, run=run, external=False, config=config,
            restart=restart, stop_controller=stop, start_controller=start, providers=providers,
            unhealthy=unhealthy, kubeconfig=path)
    try:
        await _namespace(kube, namespace)
        await start()
        if scheduler is not None:
            await scheduler.start()
        yield e
    finally:
        if scheduler is not None:
            await scheduler.stop()
        await stop()
        await kube.close()
        await bounded(server.stop(), 30, "the sandbox API server to stop")
        tmp.cleanup()


def _process_problems(muster: Any) -> list[str]:
    """What is wrong with Muster's own process (the real tier): exited, or ``/healthz``
    not 200."""
    import urllib.error
    import urllib.request

    if not muster.running:
        return ["muster run exited"]
    url = f"http://127.0.0.1:{muster.probe_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return [] if resp.status == 200 else [f"/healthz answered {resp.status}"]
    except urllib.error.HTTPError as exc:
        return [f"/healthz answered {exc.code}: {exc.read().decode(errors='replace')}"]
    except OSError as exc:
        return [f"/healthz unreachable: {exc}"]


def _scheduler(server: Any) -> Any:
    try:
        from sandbox.scheduler import SandboxScheduler
    except ImportError:
        return None
    return SandboxScheduler(server.store)


async def _namespace(kube: KubeClient, name: str) -> None:
    with contextlib.suppress(ApiError):
        await kube.create(NAMESPACES, {"metadata": {"name": name}})


async def _cleanup(e: Env) -> None:
    """Against a shared cluster: remove what the test created (requests first, so Muster
    releases their nodes)."""
    listing = await e.kube.list(PROVISIONING_REQUESTS, namespace=e.namespace)
    for pr in listing.get("items") or []:
        await e.kube.delete(PROVISIONING_REQUESTS, pr["metadata"]["name"], namespace=e.namespace)

    async def released() -> bool:
        # Muster releases a deleted request's nodes before its finalizer goes; the pools
        # must still exist until then.
        left = await e.kube.list(PROVISIONING_REQUESTS, namespace=e.namespace)
        return not left.get("items")

    with contextlib.suppress(AssertionError):
        await eventually(released, within=15)
    for undo in reversed(e.cleanup):
        with contextlib.suppress(ApiError):
            await undo()
    with contextlib.suppress(ApiError):
        await e.kube.delete(NAMESPACES, e.namespace)

    # A scenario leaves nothing behind: the run's nodes (its own and those Muster acquired
    # for it) and its namespace (pods included) are gone, so the next run starts clean.
    async def nodes_gone() -> bool:
        # By the run's label (Muster writes it when it registers a node) and by the fake
        # cloud's own pool tag: a machine that never registered carries only the latter,
        # and a leak of one must fail the scenario that made it, not a later one.
        listing = await e.kube.list(NODES)
        return not [n for n in listing.get("items") or []
                    if (labels := n["metadata"].get("labels") or {}).get(RUN_LABEL) == e.run
                    or labels.get("fake.muster.dev/pool", "").endswith(f"-{e.run}")]

    async def namespace_gone() -> bool:
        return await e.kube.get_or_none(NAMESPACES, e.namespace) is None

    async def pools_gone() -> bool:
        left = await e.kube.list(CAPACITY_POOLS)
        return not [p for p in left.get("items") or []
                    if p["metadata"]["name"].endswith(f"-{e.run}")]

    await eventually(nodes_gone, within=30, what=f"the nodes of run {e.run} to be released")
    await eventually(pools_gone, within=15, what=f"the pools of run {e.run} to be gone")
    await eventually(namespace_gone, within=60, what=f"namespace {e.namespace} to be deleted")
