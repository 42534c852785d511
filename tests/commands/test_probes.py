"""``/healthz`` and ``/readyz`` of ``muster run``, served in-process over HTTP for a
controller on the API sandbox: what the kubelet would see at each stage of a replica's life.

- not started yet: live, not ready;
- started: live and ready, with the counters in the body;
- a long-running task died (a watch, a reconcile worker): not live, naming the task;
- a standby (the Lease held by another replica): live and ready (so a RollingUpdate can
  proceed), not ready when it cannot reach the Lease;
- shutting down: not ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controller.commands.probes import Probes
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.client import WatchHealth
from controller.kube.resources import LEASES, NAMESPACES
from controller.operator import Controller
from controller.runtime.leader import LeaderElector
from providers.fake import FakeProvider
from tests.helpers import eventually

FAST = {"lease_duration_seconds": 2, "renew_deadline_seconds": 1, "retry_period_seconds": 0.1}


def _controller(kube: KubeClient) -> Controller:
    return Controller(kube=kube, config=MusterConfig(),
                      providers={"kind": FakeProvider(kube, heartbeat_seconds=3600)})


@pytest.fixture
async def controller(kube: KubeClient) -> AsyncIterator[Controller]:
    c = _controller(kube)
    try:
        yield c
    finally:
        await c.stop()


async def _client(probes: Probes) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(probes.app()))
    await client.start_server()
    return client


async def _get(client: TestClient[Any, Any], path: str) -> tuple[int, dict[str, Any]]:
    resp = await client.get(path)
    return resp.status, await resp.json()


async def test_ready_only_once_started_live_throughout(controller: Controller) -> None:
    probes = Probes(controller, None)
    client = await _client(probes)
    try:
        status, body = await _get(client, "/readyz")
        assert status == 503 and body["reason"].startswith("starting")
        status, body = await _get(client, "/healthz")
        assert status == 200 and body["role"] == "single"

        await controller.start()
        status, body = await _get(client, "/readyz")
        assert (status, body["reason"]) == (200, "reconciling")
        status, body = await _get(client, "/healthz")
        assert status == 200 and "requests" in body and "dead_tasks" not in body
        metrics = await (await client.get("/metrics")).text()
        assert "muster_ready 1.0\n" in metrics and "muster_leader 1.0\n" in metrics

        probes.stopping = True
        status, body = await _get(client, "/readyz")
        assert (status, body["reason"]) == (503, "shutting down")
    finally:
        await client.close()


async def test_a_stalled_watch_is_reported_by_the_threshold_it_was_judged_by(
    controller: Controller,
) -> None:
    # A failing watch is stalled after min(failing_after, stall_after): the reason must say
    # that figure, not stall_after (which is minutes).
    await controller.start()
    probes = Probes(controller, None)
    now = asyncio.get_running_loop().time()
    assert controller.failing_after < controller.stall_after
    (failing, quiet, *_) = sorted(controller.kube.watches)
    controller.kube.watches[failing] = WatchHealth(
        progress_at=now - controller.failing_after - 5, error="connection refused")
    ok, body = probes.ready()
    assert not ok and body["stalled_watches"] == [failing]
    assert body["reason"] == (
        f"watch(es) {failing} made no progress for over {controller.failing_after:.0f}s "
        f"(up to {controller.failing_after + 5:.0f}s) while their requests fail: "
        "connection refused")
    controller.kube.watches[quiet] = WatchHealth(progress_at=now - controller.stall_after - 1)
    ok, body = probes.ready()
    assert body["stalled_watches"] == sorted([failing, quiet])
    assert body["reason"].endswith(
        f"; watch(es) {quiet} made no progress for over {controller.stall_after:.0f}s "
        f"(up to {controller.stall_after + 1:.0f}s)")


@pytest.mark.parametrize("victim", ["watch-nodes", "reconcile-0", "collector"])
async def test_a_dead_task_fails_liveness_naming_it(controller: Controller, victim: str) -> None:
    await controller.start()
    probes = Probes(controller, None)
    client = await _client(probes)
    try:
        tasks = [*controller.feeds.tasks, *controller.queue.tasks]
        tasks += [t for t in asyncio.all_tasks() if t.get_name() == "collector"]
        (task,) = [t for t in tasks if t.get_name() == victim]
        task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        status, body = await _get(client, "/healthz")
        assert status == 503
        assert body["dead_tasks"] == [victim]
    finally:
        await client.close()


async def test_a_standby_is_ready_but_idle(kube: KubeClient, controller: Controller) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "muster-system"}})
    holder = LeaderElector(kube, name="muster", namespace="muster-system", identity="pod-a",
                           **FAST)
    await holder.acquire()
    standby = LeaderElector(kube, name="muster", namespace="muster-system", identity="pod-b",
                            **FAST)
    campaign = asyncio.create_task(standby.acquire())
    probes = Probes(controller, standby)
    client = await _client(probes)
    try:
        await eventually(lambda: _standing_by(standby), within=2)
        status, body = await _get(client, "/readyz")
        assert status == 200 and body["role"] == "standby" and "pod-a" in body["reason"]
        assert (await _get(client, "/healthz"))[0] == 200
        assert not controller.ready, "a standby never starts the controller"
        metrics = await (await client.get("/metrics")).text()
        assert "muster_leader 0.0\n" in metrics
    finally:
        campaign.cancel()
        await holder.release()
        await client.close()


async def test_a_standby_that_cannot_reach_the_lease_is_not_ready(
    kube: KubeClient, controller: Controller
) -> None:
    standby = LeaderElector(kube, name="muster", namespace="absent", identity="pod-b", **FAST)
    campaign = asyncio.create_task(standby.acquire())
    client = await _client(Probes(controller, standby))
    try:
        await eventually(lambda: _failing(standby), within=2)
        status, body = await _get(client, "/readyz")
        assert status == 503 and "namespace absent does not exist" in body["reason"]
        assert (await _get(client, "/healthz"))[0] == 200
    finally:
        campaign.cancel()
        await client.close()
    assert await kube.get_or_none(LEASES, "muster", namespace="absent") is None


async def _standing_by(elector: LeaderElector) -> bool:
    return elector.holder == "pod-a" and elector.last_error is None


async def _failing(elector: LeaderElector) -> bool:
    return elector.last_error is not None
