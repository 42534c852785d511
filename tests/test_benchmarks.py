"""The benchmarks still run, on both targets, and a run on a real cluster leaves it as it
found it (benchmarks/target.py): a few requests and Workloads each, not a measurement."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.target import RUN_LABEL
from controller.kube import KubeClient
from controller.kube.resources import CAPACITY_POOLS, NAMESPACES, NODES, PROVISIONING_REQUESTS
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
)
from e2e.cluster import Cluster
from e2e.real import MusterProcess

ROOT = Path(__file__).resolve().parent.parent


def bench(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_controller_bench_in_the_sandbox() -> None:
    out = bench("benchmarks.controller_bench", "--requests=5")
    assert "controller_bench requests=5 " in out


@pytest.mark.slow
def test_kueue_bench_in_the_sandbox() -> None:
    out = bench("benchmarks.kueue_bench", "--workloads=3")
    assert "kueue_bench workloads=3 " in out
    assert "path B, sandbox" in out


@pytest.fixture
def no_session_muster(real_muster: MusterProcess) -> Iterator[None]:
    """The benchmark runs its own controller and refuses to start next to another Muster:
    the session's Muster process is stopped meanwhile and started again."""
    real_muster.stop()
    try:
        yield
    finally:
        real_muster.start()


async def _leftovers(kubeconfig: Path, run: str) -> list[str]:
    async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
        left = [f"node {n['metadata']['name']}" for n in (await kube.list(
            NODES, label_selector=RUN_LABEL)).get("items") or []]
        for res in (CAPACITY_POOLS, CLUSTER_QUEUES, RESOURCE_FLAVORS, ADMISSION_CHECKS,
                    PROVISIONING_REQUEST_CONFIGS):
            left += [f"{res.plural}/{o['metadata']['name']}"
                     for o in (await kube.list(res)).get("items") or []
                     if o["metadata"]["name"].endswith(f"-{run}")]
        if await kube.get_or_none(NAMESPACES, f"bench-{run}") is not None:
            left.append(f"namespace bench-{run}")
        left += [f"request {p['metadata']['name']}" for p in (await kube.list(
            PROVISIONING_REQUESTS, namespace=f"bench-{run}")).get("items") or []]
        return left


@pytest.mark.real
def test_benchmarks_on_the_real_cluster_leave_nothing_behind(
    real_cluster: Cluster, no_session_muster: None
) -> None:
    creds = [f"--kubeconfig={real_cluster.admin_kubeconfig}",
             f"--muster-kubeconfig={real_cluster.muster_kubeconfig}"]
    for argv in (("benchmarks.controller_bench", "--requests=3"),
                 ("benchmarks.kueue_bench", "--workloads=2")):
        out = bench(*argv, *creds)
        cleanup = next(ln for ln in out.splitlines() if ln.startswith("cleanup:"))
        assert "FORCED" not in cleanup, cleanup
        m = re.search(r"namespace bench-(\w+)", cleanup)
        assert m is not None, cleanup
        assert asyncio.run(_leftovers(real_cluster.admin_kubeconfig, m[1])) == []
        assert re.search(r"(controller|kueue)_bench (requests|workloads)=[23] ", out), out
        if argv[0] == "benchmarks.controller_bench":
            assert "per request, p50/p99: created -> nodes created" in out
