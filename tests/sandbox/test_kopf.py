"""kopf, the framework the controller is built on, runs against the sandbox: discovery,
namespace and CRD observation, list+watch, status patches, finalizers via JSON patch with a
``test /metadata/resourceVersion`` operation, on.delete handlers and event posting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest

from sandbox import ApiError, SandboxServer
from tests.sandbox.util import eventually

pytestmark = pytest.mark.timeout(30)


async def test_kopf_operator_handles_create_status_finalizer_and_delete(
    server: SandboxServer, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    registry = kopf.OperatorRegistry()
    deleted: list[str] = []

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 10
        settings.posting.level = logging.INFO
        settings.persistence.finalizer = "example.muster.dev/finalizer"

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create("example.muster.dev", "v1", "widgets", registry=registry)
    async def created(spec: Any, patch: kopf.Patch, body: Any, **_: Any) -> None:
        patch.status["phase"] = f"sized-{spec.get('size')}"
        kopf.info(body, reason="Sized", message="widget sized")

    @kopf.on.delete("example.muster.dev", "v1", "widgets", registry=registry)
    async def on_delete(name: str, **_: Any) -> None:
        deleted.append(name)

    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(
        registry=registry, clusterwide=True, standalone=True, stop_flag=stop,
    ))
    store = server.store
    try:
        store.create("widgets", {
            "apiVersion": "example.muster.dev/v1", "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "default"}, "spec": {"size": 3},
        })

        def handled() -> bool:
            obj = store.get("widgets", "w1", "default")
            return (obj.get("status") or {}).get("phase") == "sized-3" and \
                "example.muster.dev/finalizer" in obj["metadata"].get("finalizers", [])

        await eventually(handled)
        # kopf posts a k8s Event (POST with generateName) about the object.
        await eventually(lambda: any(
            e.get("involvedObject", {}).get("name") == "w1" and e.get("reason") == "Sized"
            for e in store.list("events")))
        store.delete("widgets", "w1", "default")
        await eventually(lambda: deleted == ["w1"])

        def gone() -> bool:
            try:
                store.get("widgets", "w1", "default")
            except ApiError as err:
                return err.code == 404
            return False

        await eventually(gone)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


async def test_kopf_keeps_handling_after_watch_streams_drop_and_history_expires(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dropped streams make kopf re-watch from its last resourceVersion; once that version
    has left the retained window the sandbox answers 410 Gone and kopf re-lists."""
    from sandbox import Store
    from tests.sandbox.conftest import WIDGET_CRD

    server = SandboxServer(store=Store(history=3), seed=3)
    server.store.register_crd(WIDGET_CRD)
    await server.start()
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(kubeconfig)))
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        settings.watching.reconnect_backoff = 0.1

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create("example.muster.dev", "v1", "widgets", registry=registry, param=None)
    async def created(name: str, **_: Any) -> None:
        seen.append(name)

    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(
        registry=registry, clusterwide=True, standalone=True, stop_flag=stop,
    ))
    store = server.store
    body = {"apiVersion": "example.muster.dev/v1", "kind": "Widget", "spec": {}}
    try:
        store.create("widgets", {**body, "metadata": {"name": "first", "namespace": "default"}})
        await eventually(lambda: "first" in seen)
        # Close kopf's streams, then write more than the retained window while it reconnects.
        server.faults.add_latency(0.3, verbs="watch")
        assert server.faults.close_watches("widgets") >= 1
        for i in range(6):
            store.create("widgets",
                         {**body, "metadata": {"name": f"w{i}", "namespace": "default"}})
        await eventually(lambda: {f"w{i}" for i in range(6)} <= set(seen), within=15)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await server.stop()
