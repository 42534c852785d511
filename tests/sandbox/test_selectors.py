"""Label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors
(metadata.name, metadata.namespace, spec.nodeName, status.phase with = and !=) on LIST, plus
limit/continue pagination."""

from __future__ import annotations

import pytest

from sandbox import ApiError, SandboxServer
from sandbox.selectors import LabelSelector
from tests.sandbox.conftest import Http, pod


@pytest.fixture
def labelled(server: SandboxServer) -> SandboxServer:
    store = server.store
    store.create("pods", pod("a", env="prod", tier="web"))
    store.create("pods", pod("b", env="dev", tier="web"))
    store.create("pods", pod("c", env="test"))
    store.create("pods", pod("d"))
    return server


@pytest.mark.parametrize(("selector", "expected"), [
    ("env=prod", ["a"]),
    ("env==prod", ["a"]),
    ("env!=prod", ["b", "c", "d"]),
    ("env in (prod, dev)", ["a", "b"]),
    ("env notin (prod,dev)", ["c", "d"]),
    ("tier", ["a", "b"]),
    ("!tier", ["c", "d"]),
    ("tier=web,env!=dev", ["a"]),
    ("", ["a", "b", "c", "d"]),
])
async def test_label_selector_operators_on_list(
    labelled: SandboxServer, http: Http, selector: str, expected: list[str],
) -> None:
    code, lst = await http.get("/api/v1/namespaces/default/pods", labelSelector=selector)
    assert code == 200
    assert [p["metadata"]["name"] for p in lst["items"]] == expected


@pytest.mark.parametrize("bad", ["env in prod", "env in (a", "=x", "a b"])
async def test_malformed_label_selector_is_400(
    labelled: SandboxServer, http: Http, bad: str,
) -> None:
    code, status = await http.get("/api/v1/pods", labelSelector=bad)
    assert code == 400 and status["reason"] == "BadRequest"


async def test_field_selectors_name_namespace_node_and_phase(
    server: SandboxServer, http: Http,
) -> None:
    store = server.store
    store.create("pods", pod("a"))
    store.create("pods", pod("b"))
    store.create("pods", pod("a", "kube-system"))
    store.bind("b", "default", "n1")
    store.patch("pods", "b", {"status": {"phase": "Running"}}, subresource="status")

    async def names(**params: str) -> list[str]:
        code, lst = await http.get("/api/v1/pods", **params)
        assert code == 200, lst
        return [f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}' for p in lst["items"]]

    assert await names(fieldSelector="metadata.name=a") == ["default/a", "kube-system/a"]
    assert await names(fieldSelector="metadata.namespace=kube-system") == ["kube-system/a"]
    assert await names(fieldSelector="metadata.namespace!=kube-system") == [
        "default/a", "default/b"]
    assert await names(fieldSelector="spec.nodeName=n1") == ["default/b"]
    assert await names(fieldSelector="spec.nodeName=") == ["default/a", "kube-system/a"]
    assert await names(fieldSelector="spec.nodeName!=") == ["default/b"]
    assert await names(fieldSelector="status.phase=Pending") == ["default/a", "kube-system/a"]
    assert await names(fieldSelector="status.phase!=Pending,metadata.namespace=default") == [
        "default/b"]
    assert await names(fieldSelector="metadata.name=a,metadata.namespace=default") == [
        "default/a"]


async def test_limit_and_continue_paginate_a_list(server: SandboxServer, http: Http) -> None:
    for i in range(5):
        server.store.create("pods", pod(f"p{i}"))
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        params = {"limit": "2"}
        if token:
            params["continue"] = token
        code, lst = await http.get("/api/v1/namespaces/default/pods", **params)
        assert code == 200
        pages += 1
        names += [p["metadata"]["name"] for p in lst["items"]]
        token = lst["metadata"].get("continue", "")
        if not token:
            break
    assert names == [f"p{i}" for i in range(5)] and pages == 3


def test_label_selector_from_metav1_dict() -> None:
    sel = LabelSelector.from_dict({
        "matchLabels": {"a": "1"},
        "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}],
    })
    assert sel.matches({"metadata": {"labels": {"a": "1", "b": "y"}}})
    assert not sel.matches({"metadata": {"labels": {"a": "1", "b": "x"}}})
    with pytest.raises(ApiError):
        LabelSelector.from_dict({"matchExpressions": [{"key": "b", "operator": "Near"}]})
