"""Watch semantics: events from a resourceVersion, initial ADDED events, selectors, bookmarks,
timeouts, 410 Gone for expired resourceVersions, silence ahead of the server's, and the query
spellings real clients send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox import SandboxServer, Store
from tests.sandbox.conftest import Http, pod

pytestmark = pytest.mark.timeout(20)
PODS = "/api/v1/namespaces/default/pods"


async def _stream(
    server: SandboxServer, path: str, *, count: int, within: float = 5.0, **params: str,
) -> list[dict[str, Any]]:
    """Read ``count`` watch events (or until the stream ends) from a raw HTTP watch."""
    events: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.get(
        server.url + path, params=params,
    ) as resp:
        assert resp.status == 200, await resp.text()
        async with asyncio.timeout(within):
            while len(events) < count:
                line = await resp.content.readline()
                if not line:
                    break
                events.append(json.loads(line))
    return events


async def test_watch_from_resource_version_sees_added_modified_deleted(
    server: SandboxServer, api: client.ApiClient,
) -> None:
    v1 = client.CoreV1Api(api)
    store = server.store
    store.create("pods", pod("before"))
    listed = await v1.list_namespaced_pod("default")
    rv = listed.metadata.resource_version
    store.create("pods", pod("p"))
    store.patch("pods", "p", {"metadata": {"labels": {"step": "2"}}})
    store.delete("pods", "p")
    seen = []
    async with watch.Watch().stream(
        v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1,
    ) as stream:
        async for ev in stream:
            seen.append((ev["type"], ev["object"].metadata.name))
    assert seen == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


async def test_watch_event_resource_versions_increase_and_deleted_carries_a_new_one(
    server: SandboxServer,
) -> None:
    store = server.store
    rv = str(store.resource_version)
    store.create("pods", pod("p"))
    store.delete("pods", "p")
    events = await _stream(server, PODS, count=2, watch="true", resourceVersion=rv)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs[0] < rvs[1] == store.resource_version


async def test_watch_without_resource_version_starts_with_added_for_current_objects(
    server: SandboxServer,
) -> None:
    store = server.store
    store.create("pods", pod("a"))
    store.create("pods", pod("b"))

    async def later() -> None:
        await asyncio.sleep(0.1)
        store.create("pods", pod("c"))

    task = asyncio.create_task(later())
    events = await _stream(server, PODS, count=3, watch="true")
    await task
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]


@pytest.mark.parametrize("spelling", ["true", "True", "1"])
async def test_watch_query_parameter_spellings_are_all_watches(
    server: SandboxServer, spelling: str,
) -> None:
    server.store.create("pods", pod("a"))
    events = await _stream(server, PODS, count=1, watch=spelling)
    assert events[0]["type"] == "ADDED"


async def test_watch_bookmarks_are_sent_when_allowed(server: SandboxServer) -> None:
    rv = str(server.store.resource_version)
    events = await _stream(
        server, PODS, count=1, watch="true", resourceVersion=rv, allowWatchBookmarks="true",
    )
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["kind"] == "Pod"
    assert events[0]["object"]["metadata"]["resourceVersion"] == rv


async def test_watch_send_initial_events_ends_with_an_initial_events_end_bookmark(
    server: SandboxServer,
) -> None:
    server.store.create("pods", pod("a"))
    events = await _stream(
        server, PODS, count=2, watch="true", sendInitialEvents="true",
        allowWatchBookmarks="true", resourceVersionMatch="NotOlderThan",
    )
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watch_timeout_seconds_ends_the_stream(server: SandboxServer) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    events = await _stream(server, PODS, count=10, watch="true", timeoutSeconds="1")
    assert events == []
    assert 0.9 <= loop.time() - start < 3


async def test_watch_from_expired_resource_version_is_410_gone() -> None:
    store = Store(history=5)
    async with SandboxServer(store=store) as server:
        old_rv = str(store.resource_version)
        for i in range(10):
            store.create("pods", pod(f"p{i}"))
        events = await _stream(server, PODS, count=1, watch="true", resourceVersion=old_rv)
        assert events[0]["type"] == "ERROR"
        assert events[0]["object"]["code"] == 410
        assert events[0]["object"]["reason"] == "Expired"
        # A resourceVersion still inside the retained window replays the newer events.
        recent = str(store.resource_version - 2)
        events = await _stream(server, PODS, count=2, watch="true", resourceVersion=recent)
        assert [e["object"]["metadata"]["name"] for e in events] == ["p8", "p9"]


async def test_kubernetes_asyncio_watch_raises_api_exception_410_on_expired_rv(
    tmp_path: Any,
) -> None:
    from kubernetes_asyncio import config

    store = Store(history=2)
    async with SandboxServer(store=store) as server:
        old_rv = str(store.resource_version)
        for i in range(5):
            store.create("pods", pod(f"p{i}"))
        cfg = client.Configuration()
        await config.load_kube_config(
            config_file=str(server.write_kubeconfig(tmp_path / "kc")), client_configuration=cfg,
        )
        async with client.ApiClient(cfg) as api:
            v1 = client.CoreV1Api(api)
            with pytest.raises(ApiException) as info:
                async with watch.Watch().stream(
                    v1.list_namespaced_pod, "default", resource_version=old_rv,
                    timeout_seconds=2,
                ) as stream:
                    async for _ in stream:
                        pass
            assert info.value.status == 410


async def test_watch_with_label_selector_sees_objects_enter_and_leave_the_selection(
    server: SandboxServer,
) -> None:
    store = server.store
    rv = str(store.resource_version)
    store.create("pods", pod("p", team="a"))
    store.create("pods", pod("q", team="b"))
    store.patch("pods", "q", {"metadata": {"labels": {"team": "a"}}})
    store.patch("pods", "p", {"metadata": {"labels": {"team": "c"}}})
    events = await _stream(
        server, PODS, count=3, watch="true", resourceVersion=rv, labelSelector="team=a",
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "p"), ("ADDED", "q"), ("DELETED", "p")]


async def test_watch_with_field_selector_on_node_name(server: SandboxServer) -> None:
    store = server.store
    rv = str(store.resource_version)
    store.create("pods", pod("p"))
    store.create("pods", pod("q"))
    store.bind("q", "default", "node-1")
    events = await _stream(
        server, PODS, count=1, watch="true", resourceVersion=rv,
        fieldSelector="spec.nodeName=node-1",
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "q")]


async def test_watch_of_all_namespaces_and_of_one_namespace(server: SandboxServer) -> None:
    store = server.store
    rv = str(store.resource_version)
    store.create("pods", pod("x", "kube-system"))
    store.create("pods", pod("y"))
    everywhere = await _stream(server, "/api/v1/pods", count=2, watch="true", resourceVersion=rv)
    assert {e["object"]["metadata"]["name"] for e in everywhere} == {"x", "y"}
    one = await _stream(server, PODS, count=1, watch="true", resourceVersion=rv)
    assert one[0]["object"]["metadata"]["name"] == "y"


async def test_a_slow_watcher_is_closed_instead_of_growing_without_bound() -> None:
    store = Store(watch_queue=10)
    watcher = store.watch("pods", "default", resource_version=str(store.resource_version))
    for i in range(20):
        store.create("pods", pod(f"p{i}"))
    assert watcher.closed and "overflow" in watcher.close_reason
    # The server side no longer fans out to it.
    assert watcher not in store.table(store.resolve("pods")).watchers


async def test_in_process_watch_iterates_events(server: SandboxServer) -> None:
    store = server.store
    watcher = store.watch("pods", resource_version=str(store.resource_version))
    store.create("pods", pod("a"))
    store.delete("pods", "a")
    watcher_events = []
    async for type_, obj in watcher.events():
        watcher_events.append((type_, obj["metadata"]["name"]))
        if len(watcher_events) == 2:
            watcher.close()
    assert watcher_events == [("ADDED", "a"), ("DELETED", "a")]


CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


@pytest.mark.timeout(120)  # on the real tier, the first may start the cluster
async def test_a_watch_ahead_of_the_server_is_accepted_and_silent(http: Http) -> None:
    """A client resuming from a resourceVersion the server has not reached (the server came
    back with another etcd, whose revisions start again): the apiserver's watch cache
    accepts the watch and sends nothing older than it, neither the events that happen
    meanwhile nor bookmarks, until ``timeoutSeconds`` ends the stream (the cacher's
    ``getAllEventsSinceLocked`` has no upper bound; ``cacheWatcher.process`` drops what is
    not newer)."""
    code, listing = await http.get(CONFIGMAPS)
    assert code == 200, listing
    ahead = str(int(listing["metadata"]["resourceVersion"]) + 10**7)
    watching = asyncio.create_task(http.get(
        CONFIGMAPS, watch="true", resourceVersion=ahead, allowWatchBookmarks="true",
        timeoutSeconds="3"))
    await asyncio.sleep(1)
    code, created = await http.post(CONFIGMAPS, _configmap("meanwhile"))
    assert code == 201, created
    code, body = await watching
    assert (code, body) == (200, ""), (code, body)


@pytest.mark.timeout(120)  # on the real tier, the first may start the cluster
async def test_a_read_ahead_of_the_server_times_out_too_large(http: Http) -> None:
    """A list or get at a resourceVersion the server has not reached waits for it (3 s),
    then is answered 504 Timeout with the cause ResourceVersionTooLarge
    (``storage.NewTooLargeResourceVersionError``): Muster's watch re-lists on it."""
    code, created = await http.post(CONFIGMAPS, _configmap("here"))
    assert code == 201, created
    ahead = str(int(created["metadata"]["resourceVersion"]) + 10**7)
    for path in (CONFIGMAPS, f"{CONFIGMAPS}/here"):
        started = asyncio.get_running_loop().time()
        code, status = await http.get(path, resourceVersion=ahead)
        took = asyncio.get_running_loop().time() - started
        assert code == 504, (path, code, status)
        assert status["reason"] == "Timeout", status
        assert status["message"].startswith(
            f"Timeout: Too large resource version: {ahead}, current: "), status
        assert status["details"]["causes"] == [
            {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
        assert status["details"]["retryAfterSeconds"] == 1, status
        assert 2.5 < took < 10, took
