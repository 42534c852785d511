"""A sandbox API server and a client for controller tests that need real API semantics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.commands import objects
from controller.common.clock import ManualClock
from controller.config import MusterConfig
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, NAMESPACES, POD_TEMPLATES
from controller.operator import Controller
from providers.fake import FakeProvider
from sandbox.server import SandboxServer
from sandbox.store import Store
from tests.helpers import bounded

CRDS = Path(__file__).resolve().parents[1] / "crds"


@pytest.fixture
async def server() -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(crd_dir=CRDS, bookmark_interval=0.2)
    await bounded(srv.start(), 30, "the sandbox API server to start")
    try:
        yield srv
    finally:
        await bounded(srv.stop(), 30, "the sandbox API server to stop")


@pytest.fixture
async def kube(server: SandboxServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(server.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def short_history(tmp_path: Path) -> AsyncIterator[tuple[SandboxServer, KubeClient]]:
    """A server that keeps only 5 events per resource, like an apiserver after compaction:
    a watch's or a listing's resourceVersion falls out of its window after a few writes."""
    srv = SandboxServer(store=Store(history=5), bookmark_interval=0.1)
    await bounded(srv.start(), 30, "the sandbox API server to start")
    client = await KubeClient.from_kubeconfig(srv.write_kubeconfig(tmp_path / "kc"))
    try:
        yield srv, client
    finally:
        await client.close()
        await bounded(srv.stop(), 30, "the sandbox API server to stop")


@pytest.fixture
def muster_config() -> MusterConfig:
    """The configuration ``running`` uses: the defaults, unless a test parametrizes
    ``muster_config`` with its own."""
    return MusterConfig()


@pytest.fixture
async def running(
    kube: KubeClient, muster_config: MusterConfig
) -> AsyncIterator[tuple[Controller, ManualClock, FakeProvider]]:
    """A controller (own watch) on virtual time with the fake provider, a "gpu" pool of 8-GPU
    nodes in racks and a "workers" template (one 8-GPU pod per node, one rack) in "ns"."""
    await kube.create(NAMESPACES, {"metadata": {"name": "ns"}})
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu"))
    await kube.create(POD_TEMPLATES, objects.pod_template(
        "workers", namespace="ns", requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
    ), namespace="ns")
    # Virtual time starting now, so durations from the API server's timestamps make sense.
    clock = ManualClock(start=datetime.now(UTC))
    # The fake cloud on the same virtual time: what it reports (a queue's grant and end,
    # its nodes' heartbeats) is then comparable with the controller's clock.
    provider = FakeProvider(kube, heartbeat_seconds=3600, now=clock.now)
    controller = Controller(kube=kube, config=muster_config, clock=clock,
                            providers={"kind": provider})
    await bounded(controller.start(), 60, "the controller to start")
    try:
        yield controller, clock, provider
    finally:
        await bounded(controller.stop(), 60, "the controller to stop")

