"""Fixtures for the sandbox tests: a started server, its kubeconfig and API clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from e2e.conftest import TIERS
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
                                # A real API server requires map keys to be declared,
                                # required item properties.
                                "items": {"type": "object", "required": ["type"],
                                          "properties": {"type": {"type": "string"}},
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
async def _sandbox(request: pytest.FixtureRequest) -> AsyncIterator[SandboxServer | None]:
    """The sandbox, or None where this test runs on the real tier."""
    if _tier(request) == "real":
        yield None
        return
    srv = SandboxServer(seed=1, bookmark_interval=0.2)
    srv.store.register_crd(WIDGET_CRD)
    srv.store.register_crd(GADGET_CRD)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def server(_sandbox: SandboxServer | None) -> SandboxServer:
    if _sandbox is None:
        pytest.skip("also drives or inspects the sandbox's own store, which a real API "
                    "server does not have")
    return _sandbox


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


def _tier(request: pytest.FixtureRequest) -> str:
    callspec = getattr(request.node, "callspec", None)
    return str(callspec.params.get("http", "sandbox")) if callspec else "sandbox"


@pytest.fixture(params=TIERS)
async def http(request: pytest.FixtureRequest, _sandbox: SandboxServer | None
               ) -> AsyncIterator[Http]:
    """HTTP to the sandbox, or (tier real) to the real kube-apiserver with the same
    assertions: the sandbox's fidelity, checked against the thing it imitates."""
    if _sandbox is not None:
        async with aiohttp.ClientSession() as session:
            yield Http(session, _sandbox.url)
        return
    approximation = request.node.get_closest_marker("sandbox_approximation")
    if approximation is not None:
        pytest.skip(f"a sandbox approximation (sandbox/README.md): {approximation.args[0]}")
    cluster = request.getfixturevalue("fidelity_cluster")
    async with RealHttp.session(cluster) as real:
        try:
            yield real
        finally:
            await real.cleanup()


@pytest.fixture(scope="session")
def fidelity_cluster(real_cluster: Any) -> Iterator[Any]:
    """The real control plane with the test CRDs (Widget, Gadget) installed. At the end of
    the session every test's namespace must be gone (the namespace controller takes a few
    seconds each, so this is checked once, not per test)."""
    import time

    from e2e.cluster import kubectl

    docs = json.dumps({"apiVersion": "v1", "kind": "List", "items": [WIDGET_CRD, GADGET_CRD]})
    kubectl(real_cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=docs)
    kubectl(real_cluster, "wait", "--for=condition=Established", "--timeout=60s",
            f"crd/{WIDGET_CRD['metadata']['name']}", f"crd/{GADGET_CRD['metadata']['name']}")
    yield real_cluster
    deadline = time.monotonic() + 120
    left: list[str] = []
    while time.monotonic() < deadline:
        out = kubectl(real_cluster, "get", "namespaces", "-o", "name").stdout.split()
        left = [n for n in out if n.startswith("namespace/fidelity-")]
        if not left:
            return
        time.sleep(1)
    raise AssertionError(f"fidelity namespaces left behind: {left}")


class RealHttp(Http):
    """:class:`Http` against the real API server as its admin. Each test gets its own
    namespace in place of ``default`` (paths and bodies), so lists see only its objects;
    cluster-scoped objects it creates are deleted afterwards."""

    def __init__(self, session: aiohttp.ClientSession, base: str, namespace: str) -> None:
        super().__init__(session, base)
        self.namespace = namespace
        self.created: list[str] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def session(cls, cluster: Any) -> AsyncIterator[RealHttp]:
        pki = cluster.state / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        namespace = f"fidelity-{uuid.uuid4().hex[:8]}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            real = cls(session, cluster.server, namespace)
            code, body = await Http.request(real, "POST", "/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            assert code == 201, body
            # Pods need the namespace's "default" ServiceAccount (the controller-manager
            # makes it), as on any real cluster.
            for _ in range(100):
                code, _ = await Http.request(
                    real, "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                if code == 200:
                    break
                await asyncio.sleep(0.1)
            yield real

    def _swap(self, value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("/namespaces/default/", f"/namespaces/{self.namespace}/")
        if isinstance(value, dict):
            out = {k: self._swap(v) for k, v in value.items()}
            meta = out.get("metadata")
            if isinstance(meta, dict) and meta.get("namespace") == "default":
                meta["namespace"] = self.namespace
            return out
        if isinstance(value, list):
            return [self._swap(v) for v in value]
        return value

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        path = self._swap(path)
        if path.endswith("/namespaces/default"):
            path = path[: -len("default")] + self.namespace
        if isinstance(body, dict | list):
            body = self._swap(body)
        code, got = await super().request(method, path, body, content_type=content_type,
                                          params=params)
        if method == "POST" and code == 201 and "/namespaces/" not in path:
            self.created.append(f"{path}/{got['metadata']['name']}")
        return code, got

    async def cleanup(self) -> None:
        for path in reversed(self.created):
            await Http.request(self, "DELETE", path)
        # Objects a test left with finalizers (nobody else will remove them) would hold the
        # namespace in Terminating for good.
        for kind in ("/api/v1/namespaces/{ns}/pods",
                     "/apis/example.muster.dev/v1/namespaces/{ns}/widgets"):
            base = kind.format(ns=self.namespace)
            code, listing = await Http.request(self, "GET", base)
            for item in (listing.get("items") or []) if code == 200 else []:
                if item["metadata"].get("finalizers"):
                    await Http.request(self, "PATCH", f"{base}/{item['metadata']['name']}",
                                       {"metadata": {"finalizers": None}},
                                       content_type="application/merge-patch+json")
        await Http.request(self, "DELETE", f"/api/v1/namespaces/{self.namespace}")


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
