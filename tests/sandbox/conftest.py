"""Fixtures for the sandbox tests: a started server, its kubeconfig and API clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from sandbox import SandboxServer

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.muster.dev"},
    "spec": {
        "group": "example.muster.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                  "shortNames": ["wd"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "status": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "conditions": {
                                "type": "array",
                                "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["type"],
                                "items": {"type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True},
                            },
                        },
                    },
                },
            }},
        }],
    },
}

GADGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.example.muster.dev"},
    "spec": {
        "group": "example.muster.dev",
        "scope": "Cluster",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [{"name": "v1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {
                          "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


@pytest.fixture
async def server() -> AsyncIterator[SandboxServer]:
    srv = SandboxServer(seed=1, bookmark_interval=0.2)
    srv.store.register_crd(WIDGET_CRD)
    srv.store.register_crd(GADGET_CRD)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def kubeconfig(server: SandboxServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


class Http:
    """A raw HTTP client for asserting exact status codes and metav1.Status bodies."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None
        headers = {}
        if body is not None:
            data = body if isinstance(body, (str, bytes)) else json.dumps(body)
            headers["Content-Type"] = content_type or "application/json"
        async with self.session.request(
            method, self.base + path, data=data, headers=headers, params=params,
        ) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text.startswith(("{", "[")) else text)

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("POST", path, body)

    async def put(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("PUT", path, body)

    async def patch(
        self, path: str, body: Any, kind: str = "merge", **params: str,
    ) -> tuple[int, Any]:
        ctype = {
            "merge": "application/merge-patch+json", "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "apply": "application/apply-patch+yaml",
        }[kind]
        return await self.request("PATCH", path, body, content_type=ctype, params=params or None)

    async def delete(self, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        return await self.request("DELETE", path, body, params=params or None)


@pytest.fixture
async def http(server: SandboxServer) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, server.url)


def pod(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def widget(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.muster.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec),
    }
