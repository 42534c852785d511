"""List-then-watch keeps a complete view through dropped streams and 410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from controller.kube import ApiError, KubeClient, WatchEvent, whole_listing
from controller.kube.resources import NODES
from sandbox.server import SandboxServer


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


class View:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.syncs = 0

    def sync(self, items: list[dict[str, Any]]) -> None:
        self.syncs += 1
        self.names = {i["metadata"]["name"] for i in items}

    def event(self, ev: WatchEvent) -> None:
        name = ev.object["metadata"]["name"]
        if ev.type == "DELETED":
            self.names.discard(name)
        else:
            self.names.add(name)


async def _until(check: Any, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "view did not converge"
        await asyncio.sleep(0.02)


async def test_a_stale_resource_version_is_410(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    for i in range(10):
        await kube.create(NODES, _node(f"n{i}"))
    with pytest.raises(ApiError) as err:
        await kube._watch_once(NODES, "1", lambda ev: None, None, None, 5)
    assert err.value.gone


async def test_410_after_the_list_leads_to_a_fresh_list(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    await kube.create(NODES, _node("first"))
    view = View()

    async def sync_then_churn(items: list[dict[str, Any]]) -> None:
        view.sync(items)
        if view.syncs == 1:  # the world moves on past the server's history before we watch
            for i in range(10):
                await kube.create(NODES, _node(f"late-{i}"))

    task = asyncio.create_task(kube.watch(NODES, whole_listing(sync_then_churn), view.event))
    try:
        await _until(lambda: view.syncs >= 2 and len(view.names) == 11)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_dropped_streams_resume_without_losing_events(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    srv, kube = short_history
    srv.faults.drop_watches_every(2)
    view = View()
    task = asyncio.create_task(kube.watch(NODES, whole_listing(view.sync), view.event))
    try:
        await _until(lambda: view.syncs == 1)
        for i in range(12):
            await kube.create(NODES, _node(f"n{i}"))
        await kube.delete(NODES, "n3")
        await _until(lambda: view.names == {f"n{i}" for i in range(12)} - {"n3"})
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
