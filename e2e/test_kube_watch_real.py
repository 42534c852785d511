"""A watch that sits ahead of the API server, on the real control plane: what a controller's
watches meet when the API server comes back with another etcd (restored from a backup, or
empty), whose resourceVersions are behind theirs.

kube-apiserver answers such a watch with silence: no event, no bookmark, no error, until its
``timeoutSeconds`` ends the stream. Muster's watch reads a stream that ended without a single
event or bookmark as "the server lost the history I resume from" and re-lists
(:meth:`controller.kube.KubeClient.watch`). ``kubernetes_asyncio.watch.Watch`` resumes from
the same resourceVersion, forever: a node created meanwhile never reaches it. (The sandbox
tier's tests/kube/test_watch_library.py runs the whole etcd swap.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch as k8s_watch

from controller.commands import objects
from controller.kube import KubeClient
from controller.kube.resources import NODES
from e2e.cluster import Cluster
from e2e.conftest import RUN_LABEL

pytestmark = pytest.mark.real

SERVER_TIMEOUT = 3


async def test_a_watch_ahead_of_the_server_is_silent_muster_relists_the_library_waits(
    real_cluster: Cluster,
) -> None:
    run = uuid.uuid4().hex[:8]
    selector = f"{RUN_LABEL}={run}"
    async with await KubeClient.from_kubeconfig(real_cluster.admin_kubeconfig) as kube:
        now = int((await kube.list(NODES))["metadata"]["resourceVersion"])
        ahead = str(now + 10**7)
        library_events: list[dict[str, Any]] = []

        async def library() -> None:
            core = k8s.CoreV1Api(kube._api)
            async with k8s_watch.Watch() as w:
                async for ev in w.stream(core.list_node, label_selector=selector,
                                         resource_version=ahead, allow_watch_bookmarks=True):
                    library_events.append(ev)

        task = asyncio.create_task(library())
        name = f"watch-probe-{run}"
        try:
            started = time.monotonic()
            seen: list[str] = []
            rv, proven = await kube._watch_once(
                NODES, ahead, lambda ev: seen.append(ev.type), None, selector, SERVER_TIMEOUT)
            took = time.monotonic() - started
            # The stream ended empty: Muster's watch loop re-lists on exactly this.
            assert (rv, proven, seen) == (ahead, False, []), (rv, proven, seen)
            assert took < SERVER_TIMEOUT + 5, took
            await kube.create(NODES, objects.node(
                name, allocatable={"cpu": "1"}, labels={RUN_LABEL: run}))
            listed = await kube.list(NODES, label_selector=selector)
            assert [n["metadata"]["name"] for n in listed["items"]] == [name]
            await asyncio.sleep(2 * SERVER_TIMEOUT)
            assert not task.done(), task
            assert library_events == [], "the library's watch never hears of anything"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kube.delete(NODES, name)
