"""Listings in pages on the real control plane: kube-apiserver's ``limit``/``continue``, its
410 for a continue token whose snapshot etcd compacted away (the client starts the listing
again), and the watch feeding Muster's cache page by page with replace semantics.

Events are listed for the 410: kube-apiserver keeps no watch cache for them, so their
continued pages are read from etcd at the listing's revision, which compacting etcd removes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller.kube import KubeClient, Page, WatchEvent
from controller.kube.resources import NAMESPACES, PODS, Resource
from controller.state.cache import ClusterState
from controller.state.object_store import object_key
from e2e import cluster as cp

pytestmark = pytest.mark.real

EVENTS = Resource("", "v1", "events", namespaced=True, kind="Event")


@pytest.fixture
async def admin(real_cluster: cp.Cluster) -> AsyncIterator[tuple[KubeClient, str]]:
    ns = f"pages-{uuid.uuid4().hex[:6]}"
    async with await KubeClient.from_kubeconfig(real_cluster.admin_kubeconfig) as kube:
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        try:
            yield kube, ns
        finally:
            await kube.delete(NAMESPACES, ns)


def _compact_etcd(cluster: cp.Cluster) -> None:
    """Compact etcd's history up to its current revision (as kube-apiserver does every
    5 minutes, to an older one)."""

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{cluster.ports.etcd}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            found: dict[str, Any] = json.loads(resp.read())
            return found

    head = call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"]
    call("/v3/kv/compaction", {"revision": head, "physical": True})


def _event(name: str, ns: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "reason": "PageProbe", "message": name, "type": "Normal",
            "involvedObject": {"kind": "Pod", "name": "nothing", "namespace": ns}}


def _pod(name: str) -> dict[str, Any]:
    # Never scheduled (no node has the label): it stays as created.
    return {"metadata": {"name": name, "labels": {"app": "pages"}},
            "spec": {"nodeSelector": {"pages.muster.dev/none": "x"},
                     "containers": [{"name": "c", "image": "none",
                                     "resources": {"requests": {"cpu": "10m"}}}]}}


def _names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items)


async def test_a_real_listing_comes_in_pages_of_one_snapshot(
    admin: tuple[KubeClient, str],
) -> None:
    kube, ns = admin
    for i in range(7):
        await kube.create(EVENTS, _event(f"e{i}", ns), namespace=ns)
    pages = [p async for p in kube.pages(EVENTS, namespace=ns, page_size=3)]
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert [(p.first, p.last) for p in pages] == [(True, False), (False, False), (False, True)]
    assert len({p.resource_version for p in pages}) == 1
    assert _names([i for p in pages for i in p.items]) == [f"e{i}" for i in range(7)]
    kube.page_size = 2
    assert _names((await kube.list(EVENTS, namespace=ns))["items"]) == [
        f"e{i}" for i in range(7)]


async def test_a_continue_token_etcd_compacted_starts_the_listing_again(
    real_cluster: cp.Cluster, admin: tuple[KubeClient, str],
) -> None:
    kube, ns = admin
    for i in range(5):
        await kube.create(EVENTS, _event(f"e{i}", ns), namespace=ns)
    seen: list[Page] = []
    async for page in kube.pages(EVENTS, namespace=ns, page_size=2):
        seen.append(page)
        if len(seen) == 1:
            await kube.delete(EVENTS, "e4", namespace=ns)
            await kube.create(EVENTS, _event("late", ns), namespace=ns)
            await asyncio.to_thread(_compact_etcd, real_cluster)
    assert [p.first for p in seen][:2] == [True, True], (
        "the server did not answer 410 to the compacted continue token, or the listing did "
        "not start again")
    again = seen[1:]
    assert again[-1].last and not any(p.first for p in again[1:])
    assert _names([i for p in again for i in p.items]) == ["e0", "e1", "e2", "e3", "late"]


async def test_the_watch_feeds_the_cache_in_pages_and_drops_what_is_gone(
    admin: tuple[KubeClient, str],
) -> None:
    kube, ns = admin
    kube.page_size = 2
    for i in range(5):
        await kube.create(PODS, _pod(f"p{i}"), namespace=ns)
    state = ClusterState(levels=("kubernetes.io/hostname",))
    state.replace_pods([{**_pod("ghost"), "metadata": {"name": "ghost", "namespace": ns}}])
    state.synced["pods"].clear()
    relist = state.relists["pods"]
    pages: list[Page] = []

    def on_page(page: Page) -> None:
        pages.append(page)
        relist.page(page.items, first=page.first, last=page.last)

    def on_event(event: WatchEvent) -> None:
        if event.type == "DELETED":
            state.delete_pod(object_key(event.object))
        else:
            state.upsert_pod(event.object)

    task = asyncio.create_task(kube.watch(PODS, on_page, on_event, namespace=ns))
    try:
        await asyncio.wait_for(state.synced["pods"].wait(), 30)
        assert [len(p.items) for p in pages] == [2, 2, 1]
        assert sorted(state.objects._pods) == [f"{ns}/p{i}" for i in range(5)]
        await kube.delete(PODS, "p0", namespace=ns)
        for _ in range(300):
            if f"{ns}/p0" not in state.objects._pods:
                break
            await asyncio.sleep(0.1)
        assert f"{ns}/p0" not in state.objects._pods
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
