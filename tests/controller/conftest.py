"""A sandbox API server and a client for controller tests that need real API semantics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.kube import KubeClient
from sandbox.server import SandboxServer

CRDS = Path(__file__).resolve().parents[2] / "crds"


@pytest.fixture
async def server() -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(crd_dir=CRDS, bookmark_interval=0.2)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
async def kube(server: SandboxServer, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(server.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield client
    finally:
        await client.close()
