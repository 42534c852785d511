"""Listings in pages (``limit``/``continue``): the client's :meth:`KubeClient.pages`, a
continue token that expired (410) starting the listing again, and the cache fed page by
page with replace semantics (what no page held is dropped, once the last page came)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from controller.kube import KubeClient, Page
from controller.kube.resources import NODES
from controller.state.cache import ClusterState
from controller.state.feeds import Feeds
from sandbox.server import SandboxServer
from tests.kube.test_watch import _until

LEVELS = ("kubernetes.io/hostname",)


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


async def test_a_listing_comes_in_pages_of_one_snapshot(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    for i in range(7):
        await kube.create(NODES, _node(f"n{i}"))
    pages = [p async for p in kube.pages(NODES, page_size=3)]
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert [(p.first, p.last) for p in pages] == [(True, False), (False, False), (False, True)]
    assert len({p.resource_version for p in pages}) == 1
    assert sorted(n for p in pages for n in _names(p.items)) == [f"n{i}" for i in range(7)]
    kube.page_size = 2
    listing = await kube.list(NODES)
    assert sorted(_names(listing["items"])) == [f"n{i}" for i in range(7)]
    assert listing["metadata"]["resourceVersion"] == pages[-1].resource_version


async def test_an_expired_continue_token_starts_the_listing_again(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    for i in range(4):
        await kube.create(NODES, _node(f"n{i}"))
    seen: list[Page] = []
    async for page in kube.pages(NODES, page_size=2):
        seen.append(page)
        if len(seen) == 1:
            # The world moves on past the server's history before the next page.
            await kube.delete(NODES, "n3")
            for i in range(6):
                await kube.create(NODES, _node(f"late-{i}"))
    assert [p.first for p in seen][:2] == [True, True], "the listing did not start again"
    again = seen[1:]
    assert again[-1].last and not any(p.first for p in again[1:])
    assert sorted(n for p in again for n in _names(p.items)) == sorted(
        [f"n{i}" for i in range(3)] + [f"late-{i}" for i in range(6)])


async def test_the_cache_replaced_page_by_page_drops_what_no_page_held(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    state = ClusterState(levels=LEVELS)
    # A view from before: "gone" was deleted while the watch was down.
    state.replace_nodes([_node("gone"), _node("n0")])
    state.synced["nodes"].clear()
    for i in range(5):
        await kube.create(NODES, _node(f"n{i}"))
    relist = state.relists["nodes"]
    starts = 0
    async for page in kube.pages(NODES, page_size=2):
        relist.page(page.items, first=page.first, last=page.last)
        starts += page.first
        if not page.last:
            # Between pages: listed nodes are in, nothing is dropped yet, not synced.
            assert state.objects.node_exists("gone") and not state.synced["nodes"].is_set()
            if starts == 1:
                await kube.delete(NODES, "n4")
                for i in range(6):  # compacts the listing's snapshot: it starts again
                    await kube.create(NODES, _node(f"late-{i}"))
    assert starts == 2
    assert sorted(state.objects.nodes()) == sorted(
        [f"n{i}" for i in range(4)] + [f"late-{i}" for i in range(6)])
    assert state.synced["nodes"].is_set()
    assert len(state.snapshot().nodes) == 10


async def test_the_watch_feeds_the_cache_in_pages_and_keeps_it_current(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    kube.page_size = 3
    for i in range(8):
        await kube.create(NODES, _node(f"n{i}"))
    state = ClusterState(levels=LEVELS)
    feeds = Feeds(kube, state)
    task = asyncio.create_task(kube.watch(NODES, *feeds._specs()[0][1:]))
    try:
        await asyncio.wait_for(state.synced["nodes"].wait(), 10)
        assert sorted(state.objects.nodes()) == [f"n{i}" for i in range(8)]
        await kube.delete(NODES, "n0")
        await kube.create(NODES, _node("n8"))
        await _until(lambda: sorted(state.objects.nodes()) == [f"n{i}" for i in range(1, 9)])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
