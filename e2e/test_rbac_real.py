"""Muster under its own rights: the real RBAC authorizer, the shipped manifests
(``config/rbac``), and Muster's ServiceAccount token. What the controller needs it has (the
session's Muster process fails any test during which it met a ``Forbidden``); what it does
not need it is refused: Secrets, namespaces, writes to pods and templates, other
controllers' Leases, CRDs. (Deleting ProvisioningRequests is granted: Muster's own Kueue
admission check, config/rbac/kueue, deletes the requests it created.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import pytest

from controller.kube import ApiError, KubeClient
from controller.kube.resources import (
    CRDS,
    LEASES,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    Resource,
)

SECRETS = Resource("", "v1", "secrets", namespaced=True, kind="Secret")
CONFIG_MAPS = Resource("", "v1", "configmaps", namespaced=True, kind="ConfigMap")

pytestmark = pytest.mark.real
# Not Muster's own agent: the audit check of e2e/real.py (every request Muster's controller
# made was granted) leaves out the refusals these tests provoke on purpose.
PROBE_AGENT = "muster-e2e-rbac-probe"


@pytest.fixture
async def as_muster(muster_rbac_clean: object) -> AsyncIterator[KubeClient]:
    from e2e.cluster import default_cluster

    async with await KubeClient.from_kubeconfig(default_cluster().muster_kubeconfig,
                                               user_agent=PROBE_AGENT) as kube:
        yield kube


async def _refused(call: Awaitable[object]) -> int:
    try:
        await call
    except ApiError as exc:
        return exc.status
    return 200


async def test_muster_reads_what_it_plans_with(as_muster: KubeClient) -> None:
    for res in (NODES, PODS, POD_TEMPLATES, PROVISIONING_REQUESTS):
        listing = await as_muster.list(res)
        assert "items" in listing


async def test_muster_rereads_a_request_after_a_lost_write(as_muster: KubeClient) -> None:
    # controller/reconcilers/provisioning/service.py answers a 409 or 404 on a request write by
    # reading the request again, so Muster must be allowed that read: refused, the reconcile
    # would fail with Forbidden instead of retrying.
    assert await as_muster.get_or_none(
        PROVISIONING_REQUESTS, "no-such-request", namespace="default") is None


async def test_muster_cannot_read_secrets_or_write_outside_its_grants(
    as_muster: KubeClient,
) -> None:
    assert await _refused(as_muster.list(SECRETS)) == 403
    assert await _refused(as_muster.list(SECRETS, namespace="muster-system")) == 403
    assert await _refused(as_muster.list(CONFIG_MAPS)) == 403
    assert await _refused(as_muster.create(NAMESPACES, {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "muster-may-not"}})) == 403
    assert await _refused(as_muster.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "pause"}]}}, namespace="default")) == 403
    assert await _refused(as_muster.delete(POD_TEMPLATES, "anything", namespace="default")) == 403
    assert await _refused(as_muster.delete(CRDS, "capacitypools.muster.dev")) == 403
    # Its Lease only: another controller's Lease in its namespace is out of reach.
    assert await _refused(as_muster.merge_patch(
        LEASES, "someone-else", {"spec": {"holderIdentity": "muster"}},
        namespace="muster-system")) == 403


async def test_the_audit_log_sees_what_muster_is_refused(as_muster: KubeClient) -> None:
    # The session's check (e2e/real.py: no request of Muster's controller refused, per the
    # API server's audit log) can fail: a refusal made as Muster's ServiceAccount is there.
    from e2e import rbac_audit
    from e2e.cluster import default_cluster

    log = default_cluster().audit_log
    since = log.stat().st_size
    assert await _refused(as_muster.list(SECRETS, namespace="kube-system")) == 403
    refused: dict[rbac_audit.Right, int] = {}
    for _ in range(50):  # the audit backend writes in batches
        refused = rbac_audit.read(log, since=since, agents=(PROBE_AGENT,)).refused
        if refused:
            break
        await asyncio.sleep(0.1)
    assert refused == {rbac_audit.Right("", "secrets", "list"): 1}
