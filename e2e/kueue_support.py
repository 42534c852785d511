"""Fixtures and helpers of the Kueue e2e tests: the sandbox with Muster's and the stand-in
Kueue CRDs, Muster's controller with the Kueue admission check enabled and the kind
provider, and the sandbox scheduler. No Kueue runs here: the tests play Kueue's part with
:mod:`controller.commands.kueue_objects`; the real tier runs real Kueue (e2e/test_kueue_real.py).
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.config import MusterConfig
from controller.kube import ApiError, Body, KubeClient
from controller.kube.resources import NAMESPACES
from controller.kueue.resources import WORKLOADS
from controller.operator import Controller
from e2e.conftest import TIERS, eventually
from providers.fake import FakeProvider
from sandbox.scheduler import SandboxScheduler
from sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[1]
CRD_DIRS = (ROOT / "crds", ROOT / "e2e" / "kueue-crds")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class KueueEnv:
    kube: KubeClient
    server: SandboxServer
    controller: Controller
    scheduler: SandboxScheduler
    namespace: str

    async def workload(self, name: str) -> Body:
        return await self.kube.get(WORKLOADS, name, namespace=self.namespace)

    async def update_status(
        self, name: str, change: Callable[[Body], Body], *, retries: int = 10
    ) -> Body:
        """Kueue's way of writing a Workload status: read, change, write with the
        resourceVersion, again on 409."""
        for _ in range(retries):
            wl = await self.workload(name)
            status = change(wl)
            try:
                return await self.kube.merge_patch(
                    WORKLOADS, name,
                    {"metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
                     "status": status},
                    namespace=self.namespace, subresource="status",
                )
            except ApiError as exc:
                if not exc.conflict:
                    raise
        raise AssertionError(f"Workload {name}: status write kept conflicting")

    async def check_state(self, workload: str, check: str) -> Body | None:
        wl = await self.workload(workload)
        for entry in (wl.get("status") or {}).get("admissionChecks") or []:
            if entry.get("name") == check:
                return dict(entry)
        return None

    async def wait_check(self, workload: str, check: str, state: str, *,
                         within: float = 30.0) -> Body:
        async def probe() -> Body | None:
            entry = await self.check_state(workload, check)
            return entry if entry is not None and entry.get("state") == state else None
        return await eventually(probe, within=within, what=f"{workload}: {check} {state}")


def muster_config(**overrides: Any) -> MusterConfig:
    settings: dict[str, Any] = {
        "retry": {"initial_backoff_seconds": 0.5, "max_backoff_seconds": 2, "max_attempts": 3},
        "acquisition": {"node_ready_timeout_seconds": 20, "idle_ttl_seconds": 5,
                        "orphan_grace_seconds": 1},
        "kueue": {"enabled": True},
    }
    settings.update(overrides)
    return MusterConfig(**settings)


@contextlib.asynccontextmanager
async def make_env(**config: Any) -> AsyncIterator[KueueEnv]:
    """A fresh sandbox, Muster (``config`` overrides :func:`muster_config`) and scheduler."""
    server = SandboxServer()
    for directory in CRD_DIRS:
        server.store.load_crd_dir(directory)
    await server.start()
    tmp = tempfile.TemporaryDirectory(prefix="muster-kueue-e2e-")
    path = Path(tmp.name) / "kubeconfig"
    server.write_kubeconfig(path)
    kube = await KubeClient.from_kubeconfig(path)
    namespace = f"kueue-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": namespace}})
    provider = FakeProvider(kube, heartbeat_seconds=5)
    controller = Controller(kube=kube, config=muster_config(**config),
                            providers={"kind": provider})
    scheduler = SandboxScheduler(server.store)
    await controller.start()
    await scheduler.start()
    try:
        yield KueueEnv(kube, server, controller, scheduler, namespace)
    finally:
        await scheduler.stop()
        await controller.stop()
        await kube.close()
        await server.stop()
        tmp.cleanup()


@pytest.fixture(params=TIERS)
def sandbox_only(request: pytest.FixtureRequest) -> None:
    """These tests play Kueue's controllers by hand, which a cluster running real Kueue must
    not see: on the real tier they are skipped, and e2e/test_kueue_real.py runs the same
    paths with real Kueue instead."""
    if request.param == "real":
        pytest.skip("plays Kueue by hand; on the real tier real Kueue runs these paths "
                    "(e2e/test_kueue_real.py)")


@pytest.fixture
async def kueue_env(sandbox_only: None) -> AsyncIterator[KueueEnv]:
    async with make_env() as env:
        yield env
