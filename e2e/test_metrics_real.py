"""Secure /metrics on the real control plane: the scraper's token is checked by the real API
server's TokenReview and its right to get /metrics by the real RBAC authorizer's
SubjectAccessReview (tests/deploy/test_run_smoke.py checks the same against the sandbox,
whose answers this project wrote). The scrapers are ServiceAccounts with tokens from the
TokenRequest API, as Prometheus in a cluster has."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest

from controller.kube import KubeClient
from controller.kube.resources import NAMESPACES
from e2e import cluster as cp
from e2e.real import MusterProcess

pytestmark = pytest.mark.real

READER = "muster-metrics-reader"  # config/rbac/metrics_reader_role.yaml


async def _token(cluster: cp.Cluster, account: str, namespace: str,
                 audience: str | None = None) -> str:
    return await asyncio.to_thread(cp.service_account_token, cluster, account, namespace,
                                   duration="10m", audience=audience)


async def _scrape(port: int, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{port}/metrics", headers=headers, ssl=False,
        timeout=aiohttp.ClientTimeout(total=30),
    ) as resp:
        return resp.status, await resp.text()


@pytest.fixture
async def scrapers(muster_rbac_clean: MusterProcess) -> AsyncIterator[dict[str, str]]:
    """Tokens by role: ``user`` (its ServiceAccount bound to the reader role by name),
    ``group`` (bound through its namespace's ServiceAccount group), ``unbound`` (no grant),
    ``audience`` (the bound account, but a token minted for another audience)."""
    cluster = cp.default_cluster()
    run = uuid.uuid4().hex[:8]
    bound, grouped = f"monitoring-{run}", f"grafana-{run}"
    async with await KubeClient.from_kubeconfig(cluster.admin_kubeconfig) as admin:
        for ns in (bound, grouped):
            await admin.create(NAMESPACES, {"metadata": {"name": ns}})
        for account, ns in (("prometheus", bound), ("nosy", bound), ("agent", grouped)):
            await asyncio.to_thread(cp.kubectl, cluster, "create", "serviceaccount", account,
                                    "-n", ns)
        await asyncio.to_thread(
            cp.kubectl, cluster, "create", "clusterrolebinding", f"{bound}-prometheus",
            f"--clusterrole={READER}", f"--serviceaccount={bound}:prometheus")
        await asyncio.to_thread(
            cp.kubectl, cluster, "create", "clusterrolebinding", f"{grouped}-all",
            f"--clusterrole={READER}", f"--group=system:serviceaccounts:{grouped}")
        try:
            yield {
                "user": await _token(cluster, "prometheus", bound),
                "group": await _token(cluster, "agent", grouped),
                "unbound": await _token(cluster, "nosy", bound),
                "audience": await _token(cluster, "prometheus", bound,
                                         "https://not-the-api-server.invalid"),
            }
        finally:
            for name in (f"{bound}-prometheus", f"{grouped}-all"):
                await asyncio.to_thread(cp.kubectl, cluster, "delete", "clusterrolebinding",
                                        name, "--ignore-not-found", check=False)
            for ns in (bound, grouped):
                await admin.delete(NAMESPACES, ns)


async def test_only_tokens_the_api_server_authenticates_and_rbac_allows_may_scrape(
    muster_rbac_clean: MusterProcess, scrapers: dict[str, str]
) -> None:
    port = muster_rbac_clean.metrics_port
    status, text = await _scrape(port, scrapers["user"])
    assert status == 200, text
    assert "muster_requests{" in text and "process_resident_memory_bytes " in text
    # Groups reach the SubjectAccessReview: a binding to the namespace's group is enough.
    status, text = await _scrape(port, scrapers["group"])
    assert status == 200, text

    status, text = await _scrape(port, scrapers["unbound"])
    assert status == 403, text
    assert "system:serviceaccount:monitoring-" in text and ":nosy" in text
    # A real token replayed from another service (another audience) is not Muster's to take.
    assert (await _scrape(port, scrapers["audience"]))[0] == 401
    assert (await _scrape(port, "not-a-token"))[0] == 401
    assert (await _scrape(port, None))[0] == 401
