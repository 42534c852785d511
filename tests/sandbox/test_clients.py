"""Real clients against the sandbox: kubernetes_asyncio (CoreV1Api, CustomObjectsApi,
CoordinationV1Api) and the real kubectl binary, via the kubeconfig the sandbox writes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from sandbox import SandboxServer
from tests.sandbox.conftest import CRDS

pytestmark = pytest.mark.timeout(60)
KUBECTL = shutil.which("kubectl")


async def test_core_v1_api_create_list_patch_replace_delete(
    server: SandboxServer, api: client.ApiClient,
) -> None:
    v1 = client.CoreV1Api(api)
    created = await v1.create_namespaced_pod("default", {
        "metadata": {"name": "p", "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })
    assert created is not None and created.metadata.uid
    pods = await v1.list_namespaced_pod("default", label_selector="app=x")
    assert [p.metadata.name for p in pods.items] == ["p"]
    patched = await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"b": "1"}}})
    assert patched.metadata.labels == {"app": "x", "b": "1"}
    patched.metadata.labels["c"] = "2"
    replaced = await v1.replace_namespaced_pod("p", "default", patched)
    assert replaced.metadata.labels["c"] == "2"
    status = await v1.patch_namespaced_pod_status(
        "p", "default", {"status": {"phase": "Running"}})
    assert status.status.phase == "Running"
    node = await v1.create_node({"metadata": {"name": "n1"}, "status": {
        "allocatable": {"cpu": "4"}}})
    assert node.status.allocatable == {"cpu": "4"}
    await v1.delete_namespaced_pod("p", "default")
    with pytest.raises(client.exceptions.ApiException) as info:
        await v1.read_namespaced_pod("p", "default")
    assert info.value.status == 404


async def test_custom_objects_api_merge_patch_and_status(
    server: SandboxServer, api: client.ApiClient,
) -> None:
    server.store.load_crd_dir(CRDS)
    co = client.CustomObjectsApi(api)
    group, version, plural = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
    body = {"apiVersion": f"{group}/{version}", "kind": "ProvisioningRequest",
            "metadata": {"name": "pr"},
            "spec": {"provisioningClassName": "check-capacity.muster.dev",
                     "podSets": [{"count": 2, "podTemplateRef": {"name": "t"}}]}}
    created = await co.create_namespaced_custom_object(group, version, "default", plural, body)
    assert created["metadata"]["generation"] == 1
    patched = await co.patch_namespaced_custom_object_status(
        group, version, "default", plural, "pr",
        {"status": {"conditions": [{"type": "Accepted", "status": "True"}]}},
        _content_type="application/merge-patch+json",
    )
    assert patched["status"]["conditions"][0]["type"] == "Accepted"
    listed = await co.list_namespaced_custom_object(group, version, "default", plural)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["pr"]
    applied = await co.patch_namespaced_custom_object_status(
        group, version, "default", plural, "pr",
        {"apiVersion": f"{group}/{version}", "kind": "ProvisioningRequest",
         "metadata": {"name": "pr"},
         "status": {"conditions": [{"type": "Provisioned", "status": "True"}]}},
        _content_type="application/apply-patch+yaml", field_manager="muster", force=True,
    )
    assert [c["type"] for c in applied["status"]["conditions"]] == ["Accepted", "Provisioned"]


async def test_coordination_leases_create_and_renew(
    server: SandboxServer, api: client.ApiClient,
) -> None:
    coord = client.CoordinationV1Api(api)
    lease = await coord.create_namespaced_lease("kube-node-lease", {
        "metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}})
    lease.spec.renew_time = "2026-01-01T00:00:00.000000Z"
    renewed = await coord.replace_namespaced_lease("n1", "kube-node-lease", lease)
    assert renewed.metadata.resource_version != lease.metadata.resource_version


async def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> tuple[int, str]:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, *args, env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


POD_YAML = """apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: c
    image: nginx:{tag}
"""


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
async def test_kubectl_apply_get_server_side_apply_and_delete(
    server: SandboxServer, kubeconfig: Path, tmp_path: Path,
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD_YAML.replace("{tag}", "1"))
    code, out = await _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert code == 0 and "pod/web created" in out, out
    manifest.write_text(POD_YAML.replace("{tag}", "2"))
    code, out = await _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert code == 0 and "pod/web configured" in out, out
    code, out = await _kubectl(kubeconfig, "get", "pod", "web", "-o", "json")
    assert code == 0, out
    obj = json.loads(out)
    assert obj["spec"]["containers"][0]["image"] == "nginx:2"
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]
    manifest.write_text(POD_YAML.replace("{tag}", "3"))
    code, out = await _kubectl(
        kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(manifest))
    assert code == 0 and "serverside-applied" in out, out
    assert server.store.get("pods", "web")["spec"]["containers"][0]["image"] == "nginx:3"
    code, out = await _kubectl(kubeconfig, "get", "pods")
    assert code == 0 and "web" in out and "Pending" in out, out
    code, out = await _kubectl(kubeconfig, "get", "pods", "-l", "app=web", "-o", "name")
    assert out.strip() == "pod/web"
    code, out = await _kubectl(kubeconfig, "delete", "-f", str(manifest))
    assert code == 0 and 'pod "web" deleted' in out, out
    assert server.store.list("pods") == []


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
async def test_kubectl_works_with_custom_resources_and_short_names(
    server: SandboxServer, kubeconfig: Path, tmp_path: Path,
) -> None:
    server.store.load_crd_dir(CRDS)
    manifest = tmp_path / "pr.yaml"
    manifest.write_text(
        "apiVersion: autoscaling.x-k8s.io/v1\nkind: ProvisioningRequest\nmetadata:\n"
        "  name: gang\nspec:\n  provisioningClassName: check-capacity.muster.dev\n"
        "  podSets:\n  - count: 4\n    podTemplateRef: {name: worker}\n")
    code, out = await _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert code == 0 and "created" in out, out
    code, out = await _kubectl(kubeconfig, "get", "provreq", "-o", "json")
    assert code == 0, out
    assert [o["metadata"]["name"] for o in json.loads(out)["items"]] == ["gang"]
    code, out = await _kubectl(kubeconfig, "apply", "--server-side", "-f", str(manifest))
    assert code == 0, out
    code, out = await _kubectl(kubeconfig, "delete", "provisioningrequest", "gang")
    assert code == 0, out


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
async def test_kubectl_get_watch_streams_changes(
    server: SandboxServer, kubeconfig: Path,
) -> None:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "get", "pods", "-w", "--request-timeout=10s", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await asyncio.sleep(0.5)
        server.store.create("pods", {"metadata": {"name": "watched"},
                                     "spec": {"containers": []}})
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
        while b"NAME" in line:
            line = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert line.split()[0] == b"watched"
    finally:
        proc.terminate()
        await proc.wait()


async def test_dynamic_client_discovers_crds_and_patches_applies_watches(
    server: SandboxServer, api: client.ApiClient,
) -> None:
    from kubernetes_asyncio.dynamic import DynamicClient

    server.store.load_crd_dir(CRDS)
    dyn = await DynamicClient(api)
    res = await dyn.resources.get(api_version="autoscaling.x-k8s.io/v1",
                                  kind="ProvisioningRequest")
    body = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "a"},
            "spec": {"provisioningClassName": "x",
                     "podSets": [{"count": 1, "podTemplateRef": {"name": "t"}}]}}
    created = await res.create(body=body, namespace="default")
    assert created.metadata.uid
    patched = await res.patch(body={"metadata": {"labels": {"a": "b"}}}, name="a",
                              namespace="default", content_type="application/merge-patch+json")
    assert dict(patched.metadata.labels) == {"a": "b"}
    applied = await dyn.server_side_apply(
        res, body={**body, "metadata": {"name": "a", "namespace": "default",
                                        "labels": {"c": "d"}}},
        field_manager="muster", force_conflicts=True)
    assert dict(applied.metadata.labels) == {"a": "b", "c": "d"}
    nodes = await dyn.resources.get(api_version="v1", kind="Node")
    await nodes.create(body={"metadata": {"name": "n1"}})
    seen = [(ev["type"], ev["object"].metadata.name) async for ev in dyn.watch(nodes, timeout=1)]
    assert seen == [("ADDED", "n1")]
