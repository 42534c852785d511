"""Transient API trouble never stops the controller, and it says so once.

- 5xx answers during start-up (the CRD check, the first lists, the provider's start, the
  start-up collection) are retried with backoff: start-up completes.
- An API server that comes back empty (another etcd) is noticed by the watches, which
  re-list instead of waiting, from a resourceVersion it never had, for changes that never
  come.
- While the API server is down the controller keeps running, /readyz tells that its watches
  make no progress, and the log says each problem once per interval, without tracebacks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.commands import objects
from controller.commands.probes import Probes
from controller.common.clock import ManualClock
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    EVENTS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from controller.operator import Controller
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from sandbox.store import Store
from tests.cluster_objects import gpu_node
from tests.conftest import CRDS
from tests.helpers import bounded, eventually

_until = functools.partial(eventually, within=30.0, step=0.05)


async def _setup(kube: KubeClient) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")


def _controller(kube: KubeClient) -> Controller:
    return Controller(kube=kube, config=MusterConfig(), clock=ManualClock(start=datetime.now(UTC)),
                      providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})


async def _provisioned(kube: KubeClient, name: str) -> bool:
    pr = await kube.get(PROVISIONING_REQUESTS, name, namespace="ns")
    return any(c["type"] == "Provisioned" and c["status"] == "True"
               for c in (pr.get("status") or {}).get("conditions") or [])


async def test_start_up_rides_out_5xx_answers(server: SandboxServer, kube: KubeClient) -> None:
    await _setup(kube)
    server.faults.reseed(3)
    server.faults.add_errors(0.5, status=503, verbs=["list", "get"])
    controller = _controller(kube)
    try:
        await asyncio.wait_for(controller.start(), timeout=60)
        assert server.faults.injected > 0
        server.faults.clear()
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "after", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
        await _until(lambda: _provisioned(kube, "after"))
    finally:
        await controller.stop()


async def test_an_api_server_back_with_an_empty_store_is_listed_afresh(
    server: SandboxServer, kube: KubeClient,
) -> None:
    await _setup(kube)
    await kube.create(NODES, gpu_node("before"))
    controller = _controller(kube)
    await controller.start()
    try:
        async def seen(name: str) -> bool:
            return controller.state.objects.node_exists(name)

        await _until(lambda: seen("before"))
        # Every watch has had a bookmark: each resumes from its resourceVersion, which the
        # new server has not reached (a watch cut before anything arrived re-lists anyway).
        await asyncio.sleep(1.0)
        # Another etcd: fewer objects, so its resourceVersions are behind the watches'.
        fresh = Store()
        fresh.load_crd_dir(CRDS)
        fresh.create("nodes", gpu_node("after"))
        server.replace_store(fresh)

        async def current() -> bool:
            objects = controller.state.objects
            return objects.node_exists("after") and not objects.node_exists("before")

        await _until(current, within=10)
    finally:
        await controller.stop()


async def test_storage_wiped_under_a_running_api_server_fails_readyz_until_it_restarts(
    server: SandboxServer, kube: KubeClient,
) -> None:
    await _setup(kube)
    await kube.create(NODES, gpu_node("before"))
    controller = _controller(kube)
    probes = Probes(controller, None)
    await controller.start()
    try:
        async def seen_before() -> bool:
            return controller.state.objects.node_exists("before")

        await _until(seen_before)
        # Muster's own create, with the watches caught up: not a regression.
        await kube.create(NAMESPACES, {"metadata": {"name": "ordinary"}})
        assert probes.ready() == (True, {"role": "single", "reason": "reconciling"})
        # Every watch has had a bookmark at the store's resourceVersion by now.
        await asyncio.sleep(1.0)
        seen = int((await kube.list(NODES))["metadata"]["resourceVersion"])
        # etcd wiped while kube-apiserver runs: its cache (lists, watches) keeps the old
        # world, writes reach the new etcd, whose revisions start again.
        etcd = Store()
        etcd.load_crd_dir(CRDS)
        server.wipe_storage(etcd)
        # Events are not compared: they are often kept on an etcd of their own, whose
        # revisions are another count.
        etcd.create("namespaces", {"metadata": {"name": "ns"}})
        event = await kube.create(EVENTS, {
            "metadata": {"generateName": "x.", "namespace": "ns"},
            "involvedObject": {"kind": "Namespace", "name": "ns"}, "reason": "Test",
            "message": "m", "type": "Normal"}, namespace="ns")
        assert int(event["metadata"]["resourceVersion"]) < seen
        assert probes.ready()[0]
        created = await kube.create(NAMESPACES, {"metadata": {"name": "after-wipe"}})
        rv = int(created["metadata"]["resourceVersion"])
        assert rv < seen
        ok, body = probes.ready()
        assert not ok
        assert body["reason"] == (
            f"the API server's storage went back in time: creating a Namespace answered "
            f"resourceVersion {rv}, below {seen} the watches had already received (etcd was "
            "wiped or restored while kube-apiserver kept running, and its watch cache still "
            "serves the old objects); restart kube-apiserver so its cache is rebuilt from "
            "etcd, and Muster re-lists")
        assert probes.live()[1]["storage_regressed"] == body["reason"]
        # A re-list serves the same stale cache: still not ready a few streams later.
        await asyncio.sleep(1.0)
        assert not probes.ready()[0]
        assert controller.state.objects.node_exists("before")
        # kube-apiserver restarted: its cache is rebuilt from the new etcd, the watches
        # re-list from it, and Muster is ready again with the new world.
        server.replace_store(etcd)

        async def mended() -> bool:
            return probes.ready()[0] and not controller.state.objects.node_exists("before")

        await _until(mended, within=10)
    finally:
        await controller.stop()


async def test_an_api_outage_is_ridden_out_told_by_readyz_and_logged_once_per_problem(
    server: SandboxServer, kube: KubeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    await _setup(kube)
    controller = _controller(kube)
    controller.stall_after = 1.0
    probes = Probes(controller, None)
    await controller.start()
    port = server.port
    back: SandboxServer | None = None
    try:
        assert probes.ready()[0]
        caplog.set_level(logging.INFO)
        await server.stop()  # the API server goes away; its data stays (etcd)
        await asyncio.sleep(4.0)
        ready, body = probes.ready()
        assert not ready and "made no progress" in body["reason"], body
        assert probes.live()[0], "alive: a restart cannot bring the API server back"
        assert not controller.failed_tasks()

        back = SandboxServer(port=port, store=server.store)
        await back.start()
        await kube.create(PROVISIONING_REQUESTS, objects.provisioning_request(
            "after", namespace="ns", pod_sets=[("workers", 2)]), namespace="ns")
        await _until(lambda: _provisioned(kube, "after"))
        await _until(lambda: _ready(probes))
    finally:
        await controller.stop()
        if back is not None:
            await back.stop()
    during = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in during if r.exc_info], "no tracebacks for an outage"
    by_problem: dict[str, int] = {}
    for r in during:
        by_problem[r.msg] = by_problem.get(r.msg, 0) + 1
    assert all(n == 1 for n in by_problem.values()), by_problem


async def _ready(probes: Probes) -> bool:
    return probes.ready()[0]


async def test_watches_failing_for_seconds_fail_readyz_long_before_a_streams_length(
    server: SandboxServer, kube: KubeClient,
) -> None:
    """The stream-length rule alone (330 s) would leave /readyz at 200 through a one-minute
    outage: a watch whose every request fails counts as stalled after ``failing_after``."""
    await _setup(kube)
    controller = _controller(kube)
    assert controller.stall_after > 300
    controller.failing_after = 1.5
    probes = Probes(controller, None)
    # Each step bounded well under the runner's timeout, saying which one a loaded machine
    # made slow.
    await bounded(controller.start(), 60, "the controller to start")
    port = server.port
    back: SandboxServer | None = None
    try:
        assert probes.ready()[0]
        await bounded(server.stop(), 30, "the API server to stop")
        await asyncio.sleep(0.5)
        assert probes.ready()[0], "a failure or two is not yet a stall"

        async def not_ready() -> bool:
            return not probes.ready()[0]

        await _until(not_ready, what="/readyz to fail while the API server is down")
        assert "made no progress" in probes.ready()[1]["reason"]
        assert probes.live()[0]
        back = SandboxServer(port=port, store=server.store)
        await bounded(back.start(), 30, "the API server to come back")
        await _until(lambda: _ready(probes), what="/readyz to pass once the API server is back")
    finally:
        await bounded(controller.stop(), 60, "the controller to stop")
        if back is not None:
            await bounded(back.stop(), 30, "the API server to stop")
