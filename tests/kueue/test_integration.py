"""The admission-check runner against the sandbox API server: start-up checks, the
AdmissionCheck Active condition, and Topology levels Muster's nodes would not carry."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.commands import kueue_objects as kq
from controller.common.clock import RealClock
from controller.config import KueueConfig
from controller.kube import KubeClient
from controller.kueue.integration import KueueIntegration, KueueNotInstalled
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    TOPOLOGIES,
)
from sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[2]


Connected = tuple[SandboxServer, KubeClient, tempfile.TemporaryDirectory[str]]


async def connect(kueue_crds: bool) -> Connected:
    server = SandboxServer()
    server.store.load_crd_dir(ROOT / "crds")
    if kueue_crds:
        server.store.load_crd_dir(ROOT / "e2e" / "kueue-crds")
    await server.start()
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "kubeconfig"
    server.write_kubeconfig(path)
    return server, await KubeClient.from_kubeconfig(path), tmp


@pytest.fixture
async def running() -> AsyncIterator[tuple[KubeClient, KueueIntegration]]:
    server, kube, tmp = await connect(True)
    integration = KueueIntegration(kube=kube, config=KueueConfig(enabled=True),
                                   clock=RealClock())
    await integration.start()
    try:
        yield kube, integration
    finally:
        await integration.stop()
        await kube.close()
        await server.stop()
        tmp.cleanup()


async def test_start_fails_with_a_fix_when_kueue_is_not_installed() -> None:
    server, kube, tmp = await connect(False)
    try:
        integration = KueueIntegration(kube=kube, config=KueueConfig(enabled=True),
                                       clock=RealClock())
        with pytest.raises(KueueNotInstalled, match=r"install Kueue v0\.15 or later"):
            await integration.start()
    finally:
        await kube.close()
        await server.stop()
        tmp.cleanup()


async def active(kube: KubeClient, name: str) -> dict[str, str] | None:
    for _ in range(100):
        ac = await kube.get(ADMISSION_CHECKS, name)
        for cond in (ac.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Active":
                return dict(cond)
        await asyncio.sleep(0.05)
    return None


async def test_admission_checks_get_active_only_when_ours_and_well_formed(
    running: tuple[KubeClient, KueueIntegration],
) -> None:
    kube, _ = running
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        "missing-config", controller_name="muster.dev/provisioning", config="nope"))
    bad = await active(kube, "missing-config")
    assert bad is not None and (bad["status"], bad["reason"]) == ("False", "BadParametersRef")
    assert "ProvisioningRequestConfig nope not found" in bad["message"]

    await kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "nope", class_name="atomic-provisioning.muster.dev"))
    for _ in range(100):
        fixed = await active(kube, "missing-config")
        if fixed and fixed["status"] == "True":
            break
        await asyncio.sleep(0.05)
    assert fixed is not None and (fixed["status"], fixed["reason"]) == ("True", "Active")

    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        "foreign", controller_name="example.com/other"))
    await asyncio.sleep(0.3)
    foreign = await kube.get(ADMISSION_CHECKS, "foreign")
    assert not (foreign.get("status") or {}).get("conditions"), "not Muster's to set"


async def test_topology_levels_muster_does_not_label_are_reported(
    running: tuple[KubeClient, KueueIntegration],
) -> None:
    kube, integration = running
    await kube.create(TOPOLOGIES, kq.topology(
        "ok", ["topology.muster.dev/block", "topology.muster.dev/rack",
               "kubernetes.io/hostname"]))
    await kube.create(TOPOLOGIES, kq.topology("odd", ["example.com/zone",
                                                      "topology.muster.dev/rack"]))
    for _ in range(100):
        if "odd" in integration.topology_warnings:
            break
        await asyncio.sleep(0.05)
    assert set(integration.topology_warnings) == {"odd"}
    assert "example.com/zone" in integration.topology_warnings["odd"]


async def test_pool_domains_lacking_a_topology_level_are_reported(
    running: tuple[KubeClient, KueueIntegration],
) -> None:
    from controller.commands import objects
    from controller.kube.resources import CAPACITY_POOLS

    kube, integration = running
    pool = objects.gpu_pool("flat")
    del pool["spec"]["topology"]["domains"][0]["labels"]["topology.muster.dev/block"]
    await kube.create(CAPACITY_POOLS, pool)
    await kube.create(TOPOLOGIES, kq.topology(
        "full", ["topology.muster.dev/block", "topology.muster.dev/rack",
                 "kubernetes.io/hostname"]))
    for _ in range(100):
        if "full" in integration.topology_warnings:
            break
        await asyncio.sleep(0.05)
    assert ("CapacityPool flat spec.topology.domains[0] lacks topology.muster.dev/block"
            in integration.topology_warnings["full"])


async def test_a_workload_on_an_inactive_check_waits_with_the_reason(
    running: tuple[KubeClient, KueueIntegration],
) -> None:
    from controller.kube.resources import PROVISIONING_REQUESTS
    from controller.kueue.resources import WORKLOADS

    kube, _ = running
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        "gang", controller_name="muster.dev/provisioning", config="absent"))
    wl = await kube.create(WORKLOADS, kq.workload("w", "default", queue="q", pod_sets=[
        kq.pod_set("main", 2, requests={"cpu": "1"})]), namespace="default")
    await kube.merge_patch(WORKLOADS, "w", {"status": kq.reserve_quota(
        wl, cluster_queue="cq", flavors={}, checks=["gang"], now="2026-01-01T00:00:00Z")},
        namespace="default", subresource="status")
    entry: dict[str, str] = {}
    for _ in range(100):
        got = await kube.get(WORKLOADS, "w", namespace="default")
        entry = got["status"]["admissionChecks"][0]
        if entry["message"]:
            break
        await asyncio.sleep(0.05)
    assert entry["state"] == "Pending"
    assert entry["message"] == (
        "the check is not active: ProvisioningRequestConfig absent not found")
    listing = await kube.list(PROVISIONING_REQUESTS, namespace="default")
    assert not listing.get("items"), "no request for an inactive check"
