"""Why Muster keeps its own watch (:meth:`controller.kube.KubeClient.watch`) instead of
``kubernetes_asyncio.watch.Watch``: the same scenarios, run against both, over real HTTP to
the API sandbox, the library used as its docs show (list, then ``Watch().stream`` of the
list call from the list's resourceVersion, applying the events to a view).

- **An expired resourceVersion (410 Gone).** The library retries the watch once with the
  same expired resourceVersion (a second 410, certain), then raises to its caller, who must
  re-list. Muster re-lists at once.
- **A server that came back with another etcd** (empty, or restored from a backup: its
  resourceVersions are behind the watch's). The library resumes from its last
  resourceVersion, which the new server never had, and waits there for events that never
  come: its view keeps deleted objects and misses new ones, with no error to tell. Muster's
  watch sees the stream end without a single event and re-lists.

These tests fail if the library is fixed; then it can replace Muster's watch loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from controller.kube import KubeClient, whole_listing
from controller.kube.resources import NODES
from sandbox.server import SandboxServer
from sandbox.store import Store
from tests.conftest import CRDS
from tests.helpers import eventually


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


class Calls:
    """``CoreV1Api.list_node`` as the library's Watch calls it, recording each call's
    resourceVersion (``Watch`` reads the wrapped docstring for the event type)."""

    def __init__(self, core: k8s.CoreV1Api) -> None:
        self.versions: list[str | None] = []

        @functools.wraps(core.list_node)
        def list_node(**kwargs: Any) -> Any:
            if kwargs.get("watch"):
                self.versions.append(kwargs.get("resource_version"))
            return core.list_node(**kwargs)

        self.list_node = list_node


async def test_the_library_retries_an_expired_resource_version_with_the_same_one(
    short_history: tuple[SandboxServer, KubeClient],
) -> None:
    _, kube = short_history
    for i in range(10):
        await kube.create(NODES, _node(f"n{i}"))
    calls = Calls(k8s.CoreV1Api(kube._api))
    with pytest.raises(ApiException) as err:
        async with k8s_watch.Watch() as w:
            async for _ in w.stream(calls.list_node, resource_version="1"):
                pass
    assert err.value.status == 410
    assert calls.versions == ["1", "1"], "the library's second try reuses the expired version"


class View:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def sync(self, items: list[dict[str, Any]]) -> None:
        self.names = {i["metadata"]["name"] for i in items}

    def event(self, type_: str, obj: dict[str, Any]) -> None:
        if type_ == "DELETED":
            self.names.discard(obj["metadata"]["name"])
        elif type_ in ("ADDED", "MODIFIED"):
            self.names.add(obj["metadata"]["name"])


async def _library_informer(core: k8s.CoreV1Api, calls: Calls, view: View) -> None:
    listing = await core.list_node(_preload_content=False)
    body = await listing.json()
    view.sync(body["items"])
    async with k8s_watch.Watch() as w:
        async for ev in w.stream(calls.list_node,
                                 resource_version=body["metadata"]["resourceVersion"]):
            view.event(ev["type"], ev["raw_object"])


async def test_after_the_server_came_back_with_another_etcd_the_library_stays_stale(
    server: SandboxServer, kube: KubeClient,
) -> None:
    await kube.create(NODES, _node("before"))
    for i in range(5):  # the old store's resourceVersions run ahead of the new one's
        await kube.create(NODES, _node(f"churn-{i}"))
        await kube.delete(NODES, f"churn-{i}")
    library, muster = View(), View()
    calls = Calls(k8s.CoreV1Api(kube._api))
    tasks = [
        asyncio.create_task(_library_informer(k8s.CoreV1Api(kube._api), calls, library)),
        asyncio.create_task(kube.watch(
            NODES, whole_listing(muster.sync), lambda ev: muster.event(ev.type, ev.object),
            server_timeout=2)),
    ]
    try:
        await eventually(lambda: _async(library.names == muster.names == {"before"}),
                         within=10, step=0.02)
        fresh = Store()
        fresh.load_crd_dir(CRDS)
        fresh.create("nodes", _node("after"))
        server.replace_store(fresh)
        await eventually(lambda: _async(muster.names == {"after"}), within=10, step=0.05)
        await asyncio.sleep(3.0)  # the library has had its chances to notice
        assert library.names == {"before"}, "the library's view: a deleted node, a new one missing"
        assert len(calls.versions) >= 2, "it resumed after the stream ended"
        assert all(int(v or 0) > 1 for v in calls.versions[1:]), (
            "resuming from a resourceVersion the new server never had", calls.versions)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _async(value: bool) -> bool:
    return value
