"""CustomResourceDefinitions: registering one (Python API, YAML file, directory, or POST of a
CRD object) serves its resources with the declared scope, versions and status subresource,
and discovery lists them; deleting the CRD stops serving them."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest

from sandbox import ApiError, SandboxServer, Store
from tests.sandbox.conftest import CRDS, WIDGET_CRD, Http


def test_project_crds_load_provisioning_request_with_status_and_two_versions() -> None:
    store = Store()
    types = store.load_crd_dir(CRDS)
    provreq = next(t for t in types if t.kind == "ProvisioningRequest")
    assert provreq.group == "autoscaling.x-k8s.io"
    assert provreq.versions == ("v1", "v1beta1")
    assert provreq.namespaced and provreq.status_subresource
    assert "provreq" in provreq.short_names
    crd = store.get("customresourcedefinitions", "provisioningrequests.autoscaling.x-k8s.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}


async def test_crd_posted_over_http_is_served_with_discovery(http: Http) -> None:
    crd = copy.deepcopy(WIDGET_CRD)
    crd["metadata"]["name"] = "sprockets.parts.example"
    crd["spec"]["group"] = "parts.example"
    crd["spec"]["names"] = {"plural": "sprockets", "kind": "Sprocket"}
    crd["spec"]["scope"] = "Cluster"
    code, _ = await http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert code == 201
    # A real API server publishes a new group in discovery moments after the create.
    for _ in range(100):
        code, groups = await http.get("/apis")
        code, resources = await http.get("/apis/parts.example/v1")
        if code == 200 and "parts.example" in [g["name"] for g in groups["groups"]]:
            break
        await asyncio.sleep(0.1)
    assert "parts.example" in [g["name"] for g in groups["groups"]]
    names = {r["name"]: r for r in resources["resources"]}
    assert names["sprockets"]["namespaced"] is False
    assert names["sprockets"]["kind"] == "Sprocket"
    assert "sprockets/status" in names
    code, obj = await http.post(
        "/apis/parts.example/v1/sprockets",
        {"apiVersion": "parts.example/v1", "kind": "Sprocket", "metadata": {"name": "s"}},
    )
    assert code == 201 and "namespace" not in obj["metadata"]
    code, _ = await http.delete(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/sprockets.parts.example")
    assert code == 200
    # A real API server removes the CRD's instances first, then stops serving it.
    for _ in range(100):
        code, _ = await http.get("/apis/parts.example/v1/sprockets")
        if code == 404:
            break
        await asyncio.sleep(0.1)
    assert code == 404


async def test_every_served_version_of_a_crd_shares_one_storage(
    server: SandboxServer, http: Http,
) -> None:
    server.store.load_crd_dir(CRDS)
    body = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "pr"}, "spec": {"provisioningClassName": "x", "podSets": []}}
    code, _ = await http.post(
        "/apis/autoscaling.x-k8s.io/v1/namespaces/default/provisioningrequests", body)
    assert code == 201
    code, obj = await http.get(
        "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/default/provisioningrequests/pr")
    assert code == 200 and obj["apiVersion"] == "autoscaling.x-k8s.io/v1beta1"
    code, lst = await http.get("/apis/autoscaling.x-k8s.io/v1beta1/provisioningrequests")
    assert [o["apiVersion"] for o in lst["items"]] == ["autoscaling.x-k8s.io/v1beta1"]


def test_crd_with_wrong_name_is_rejected() -> None:
    store = Store()
    crd = copy.deepcopy(WIDGET_CRD)
    crd["metadata"]["name"] = "wrong.example"
    with pytest.raises(ApiError) as info:
        store.register_crd(crd)
    assert info.value.code == 422


def test_load_crd_dir_rejects_missing_directory_and_bad_yaml(tmp_path: Path) -> None:
    store = Store()
    with pytest.raises(FileNotFoundError):
        store.load_crd_dir(tmp_path / "nope")
    (tmp_path / "bad.yaml").write_text("a: [unclosed")
    with pytest.raises(ApiError) as info:
        store.load_crd_dir(tmp_path)
    assert info.value.code == 400


async def test_discovery_endpoints_describe_core_and_groups(http: Http) -> None:
    code, version = await http.get("/version")
    assert code == 200 and version["major"] == "1"
    code, api = await http.get("/api")
    assert api["versions"] == ["v1"]
    code, core = await http.get("/api/v1")
    names = {r["name"] for r in core["resources"]}
    assert {"pods", "pods/status", "pods/binding", "nodes", "namespaces", "events",
            "podtemplates"} <= names
    code, coord = await http.get("/apis/coordination.k8s.io/v1")
    assert [r["name"] for r in coord["resources"]] == ["leases"]
    code, group = await http.get("/apis/example.muster.dev")
    assert group["preferredVersion"]["groupVersion"] == "example.muster.dev/v1"


async def test_unknown_fields_are_pruned_by_the_structural_schema(
    server: SandboxServer, http: Http,
) -> None:
    """As on a real apiserver, fields a CRD schema does not declare are dropped on write;
    x-kubernetes-preserve-unknown-fields and additionalProperties keep theirs."""
    server.store.load_crd_dir(CRDS)
    base = "/apis/autoscaling.x-k8s.io/v1/namespaces/default/provisioningrequests"
    body = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "pr", "annotations": {"kept": "yes"}},
            "spec": {"provisioningClassName": "c", "bogus": 1,
                     "parameters": {"any-key": "v"},
                     "podSets": [{"count": 1, "podTemplateRef": {"name": "t", "x": 1}}]}}
    code, obj = await http.post(base, body)
    assert code == 201
    assert obj["spec"] == {"provisioningClassName": "c", "parameters": {"any-key": "v"},
                           "podSets": [{"count": 1, "podTemplateRef": {"name": "t"}}]}
    assert obj["metadata"]["annotations"] == {"kept": "yes"}
    status = {"status": {"handler_result": {"x": 1}, "provisioningClassDetails": {"k": "v"},
                         "conditions": [{"type": "Accepted", "status": "True",
                                         "extra": "dropped"}]}}
    code, obj = await http.patch(f"{base}/pr/status", status)
    assert code == 200
    assert obj["status"] == {"provisioningClassDetails": {"k": "v"},
                             "conditions": [{"type": "Accepted", "status": "True"}]}
    # The widget CRD preserves unknown fields in spec and status.
    code, obj = await http.post(
        "/apis/example.muster.dev/v1/namespaces/default/widgets",
        {"metadata": {"name": "w"}, "spec": {"free": {"form": True}}, "extra": "top"})
    assert obj["spec"] == {"free": {"form": True}} and "extra" not in obj


async def test_deprecated_crd_version_answers_with_a_warning_header(
    server: SandboxServer,
) -> None:
    import aiohttp

    server.store.load_crd_dir(CRDS)
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{server.url}/apis/autoscaling.x-k8s.io/v1beta1/provisioningrequests") as resp:
            assert resp.status == 200
            assert resp.headers["Warning"].startswith('299 - "autoscaling.x-k8s.io/v1beta1')
        async with session.get(
            f"{server.url}/apis/autoscaling.x-k8s.io/v1/provisioningrequests") as resp:
            assert "Warning" not in resp.headers


async def test_dra_types_and_extra_builtin_types_are_served(
    server: SandboxServer, http: Http,
) -> None:
    from sandbox import ResourceType

    code, resources = await http.get("/apis/resource.k8s.io/v1")
    assert code == 200
    assert {r["name"] for r in resources["resources"]} >= {
        "deviceclasses", "resourceslices", "resourceclaims", "resourceclaims/status",
        "resourceclaimtemplates"}
    code, _ = await http.post("/apis/resource.k8s.io/v1/resourceslices", {
        "metadata": {"name": "node-1-gpus"},
        "spec": {"nodeName": "node-1", "driver": "gpu.example.com", "devices": []}})
    assert code == 201
    jobs = ResourceType(group="batch", versions=("v1",), plural="jobs", singular="job",
                        kind="Job", namespaced=True, status_subresource=True)
    assert server.store.serve(jobs) is jobs
    assert server.store.serve(jobs) is jobs
    code, obj = await http.post("/apis/batch/v1/namespaces/default/jobs",
                                {"metadata": {"name": "j"}, "spec": {}})
    assert code == 201 and obj["kind"] == "Job"
