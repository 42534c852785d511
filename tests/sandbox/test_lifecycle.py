"""Deletion semantics: finalizers and deletionTimestamp, background garbage collection by
ownerReferences (chains, multiple owners, orphan and foreground policies), namespace deletion,
and the pods/binding subresource."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import ApiError, SandboxServer
from tests.sandbox.conftest import Http, pod, widget

WIDGETS = "/apis/example.muster.dev/v1/namespaces/default/widgets"


def _exists(server: SandboxServer, resource: str, name: str, ns: str | None = "default") -> bool:
    try:
        server.store.get(resource, name, ns)
    except ApiError as err:
        assert err.code == 404
        return False
    return True


def _owned(obj: dict[str, Any], *owners: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
         "uid": o["metadata"]["uid"]}
        for o in owners
    ]
    return obj


async def test_delete_with_finalizers_sets_deletion_timestamp_and_returns_200_object(
    server: SandboxServer, http: Http,
) -> None:
    body = widget("w")
    body["metadata"]["finalizers"] = ["a/f", "b/f"]
    await http.post(WIDGETS, body)
    rv = str(server.store.resource_version)
    code, obj = await http.delete(f"{WIDGETS}/w")
    assert code == 200
    assert obj["metadata"]["deletionTimestamp"]
    assert obj["metadata"]["finalizers"] == ["a/f", "b/f"]
    # A second DELETE changes nothing.
    code, again = await http.delete(f"{WIDGETS}/w")
    assert code == 200
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    # New finalizers cannot be added while deleting.
    code, status = await http.patch(
        f"{WIDGETS}/w", {"metadata": {"finalizers": ["a/f", "b/f", "c/f"]}},
    )
    assert code == 422 and status["reason"] == "Invalid"
    code, _ = await http.patch(f"{WIDGETS}/w", {"metadata": {"finalizers": ["b/f"]}})
    assert code == 200 and _exists(server, "widgets", "w")
    code, _ = await http.patch(f"{WIDGETS}/w", {"metadata": {"finalizers": None}})
    assert code == 200
    assert not _exists(server, "widgets", "w")
    watcher = server.store.watch("widgets", "default", resource_version=rv)
    types = [t for t, _ in watcher.queue]
    assert types == ["MODIFIED", "MODIFIED", "DELETED"]


async def test_delete_without_finalizers_removes_at_once_with_deleted_event(
    server: SandboxServer, http: Http,
) -> None:
    await http.post(WIDGETS, widget("w"))
    rv = str(server.store.resource_version)
    code, obj = await http.delete(f"{WIDGETS}/w")
    assert code == 200 and obj["metadata"]["name"] == "w"
    code, _ = await http.delete(f"{WIDGETS}/w")
    assert code == 404
    watcher = server.store.watch("widgets", "default", resource_version=rv)
    assert [(t, e.obj["metadata"]["name"]) for t, e in watcher.queue] == [("DELETED", "w")]


async def test_delete_preconditions_on_uid_and_resource_version(
    server: SandboxServer, http: Http,
) -> None:
    _, obj = await http.post(WIDGETS, widget("w"))
    code, status = await http.delete(f"{WIDGETS}/w", {"preconditions": {"uid": "other"}})
    assert code == 409 and "Precondition failed" in status["message"]
    code, _ = await http.delete(f"{WIDGETS}/w", {"preconditions": {
        "uid": obj["metadata"]["uid"], "resourceVersion": obj["metadata"]["resourceVersion"]}})
    assert code == 200


def test_garbage_collection_deletes_dependents_of_a_deleted_owner_in_chains(
    server: SandboxServer,
) -> None:
    store = server.store
    root = store.create("widgets", widget("root"))
    child = store.create("widgets", _owned(widget("child"), root))
    store.create("pods", _owned(pod("grandchild"), child))
    store.create("podtemplates", _owned(
        {"metadata": {"name": "tpl"}, "template": {"spec": {"containers": []}}}, root))
    store.create("pods", pod("unrelated"))
    store.delete("widgets", "root")
    assert not _exists(server, "widgets", "child")
    assert not _exists(server, "pods", "grandchild")
    assert not _exists(server, "podtemplates", "tpl")
    assert _exists(server, "pods", "unrelated")


def test_garbage_collection_keeps_a_dependent_while_any_owner_remains(
    server: SandboxServer,
) -> None:
    store = server.store
    a = store.create("widgets", widget("a"))
    b = store.create("widgets", widget("b"))
    store.create("pods", _owned(pod("shared"), a, b))
    store.delete("widgets", "a")
    assert _exists(server, "pods", "shared")
    store.delete("widgets", "b")
    assert not _exists(server, "pods", "shared")


def test_garbage_collection_honours_dependent_finalizers(server: SandboxServer) -> None:
    store = server.store
    owner = store.create("widgets", widget("o"))
    dep = _owned(pod("d"), owner)
    dep["metadata"]["finalizers"] = ["x/f"]
    store.create("pods", dep)
    store.delete("widgets", "o")
    assert store.get("pods", "d")["metadata"]["deletionTimestamp"]
    store.patch("pods", "d", {"metadata": {"finalizers": []}})
    assert not _exists(server, "pods", "d")


def test_dependent_of_a_missing_owner_is_collected_but_unknown_kinds_are_left_alone(
    server: SandboxServer,
) -> None:
    store = server.store
    ghost = {"apiVersion": "example.muster.dev/v1", "kind": "Widget",
             "metadata": {"name": "ghost", "uid": "00000000-0000-4000-8000-000000000000"}}
    store.create("pods", _owned(pod("orphan"), ghost))
    assert not _exists(server, "pods", "orphan")
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "uid": "11111111-0000-4000-8000-000000000000"}}
    store.create("pods", _owned(pod("job-pod"), job))
    assert _exists(server, "pods", "job-pod")


async def test_orphan_propagation_strips_owner_references(
    server: SandboxServer, http: Http,
) -> None:
    owner = server.store.create("widgets", widget("o"))
    server.store.create("pods", _owned(pod("d"), owner))
    code, _ = await http.delete(f"{WIDGETS}/o", {"propagationPolicy": "Orphan"})
    assert code == 200
    assert "ownerReferences" not in server.store.get("pods", "d")["metadata"]


async def test_foreground_propagation_deletes_dependents_before_the_owner(
    server: SandboxServer, http: Http,
) -> None:
    owner = server.store.create("widgets", widget("o"))
    server.store.create("pods", _owned(pod("d"), owner))
    rv = str(server.store.resource_version)
    code, _ = await http.delete(f"{WIDGETS}/o", propagationPolicy="Foreground")
    assert code == 200
    pods = server.store.watch("pods", resource_version=rv)
    widgets = server.store.watch("widgets", resource_version=rv)
    assert [t for t, _ in pods.queue] == ["DELETED"]
    assert [t for t, _ in widgets.queue] == ["DELETED"]
    assert pods.queue[0][1].rv < widgets.queue[0][1].rv


def test_deleting_a_namespace_deletes_its_contents(server: SandboxServer) -> None:
    store = server.store
    store.create("namespaces", {"metadata": {"name": "team"}})
    store.create("pods", pod("p", "team"))
    store.create("widgets", widget("w", "team"))
    store.create("pods", pod("p"))
    store.delete("namespaces", "team")
    assert not _exists(server, "pods", "p", "team")
    assert not _exists(server, "widgets", "w", "team")
    assert _exists(server, "pods", "p")
    assert not _exists(server, "namespaces", "team", None)


async def test_binding_subresource_sets_node_name_once(server: SandboxServer, http: Http) -> None:
    server.store.create("pods", pod("p"))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    code, status = await http.post("/api/v1/namespaces/default/pods/p/binding", binding)
    assert code == 201 and status["status"] == "Success"
    obj = server.store.get("pods", "p")
    assert obj["spec"]["nodeName"] == "n1"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True"
               for c in obj["status"]["conditions"])
    code, status = await http.post("/api/v1/namespaces/default/pods/p/binding", binding)
    assert code == 409 and status["reason"] == "Conflict"


@pytest.mark.parametrize("policy", ["Sideways"])
async def test_unknown_propagation_policy_is_422_invalid(http: Http, policy: str) -> None:
    await http.post(WIDGETS, widget("w"))
    code, status = await http.delete(f"{WIDGETS}/w", propagationPolicy=policy)
    assert code == 422 and status["reason"] == "Invalid"


async def test_delete_collection_with_label_selector(server: SandboxServer, http: Http) -> None:
    server.store.create("pods", pod("a", group="x"))
    server.store.create("pods", pod("b", group="x"))
    server.store.create("pods", pod("c", group="y"))
    code, lst = await http.delete("/api/v1/namespaces/default/pods", labelSelector="group=x")
    assert code == 200 and len(lst["items"]) == 2
    assert [p["metadata"]["name"] for p in server.store.list("pods")] == ["c"]
