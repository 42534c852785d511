"""Object metadata and write semantics of the sandbox, each named after the Kubernetes
behaviour it proves (status codes and metav1.Status bodies checked over HTTP)."""

from __future__ import annotations

import pytest

from sandbox import ApiError, SandboxServer
from tests.sandbox.conftest import Http, pod, widget

PODS = "/api/v1/namespaces/default/pods"
WIDGETS = "/apis/example.muster.dev/v1/namespaces/default/widgets"
_WIDGET_TYPE = {"apiVersion": "example.muster.dev/v1", "kind": "Widget"}


async def test_post_returns_201_with_server_set_uid_timestamp_generation(http: Http) -> None:
    body = pod("p1")
    body["metadata"]["uid"] = "client-chosen"
    code, obj = await http.post(PODS, body)
    assert code == 201
    meta = obj["metadata"]
    assert meta["uid"] != "client-chosen" and len(meta["uid"]) == 36
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert meta["resourceVersion"]
    assert obj["status"]["phase"] == "Pending"


async def test_generate_name_gets_a_random_suffix(http: Http) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    code, obj = await http.post(PODS, body)
    assert code == 201
    assert obj["metadata"]["name"].startswith("worker-")
    assert len(obj["metadata"]["name"]) == len("worker-") + 5


async def test_resource_version_is_monotonic_across_the_store_and_on_lists(
    http: Http, server: SandboxServer,
) -> None:
    seen = []
    for i in range(3):
        _, obj = await http.post(PODS, pod(f"p{i}"))
        seen.append(int(obj["metadata"]["resourceVersion"]))
    _, node = await http.post("/api/v1/nodes", {"metadata": {"name": "n1"}})
    seen.append(int(node["metadata"]["resourceVersion"]))
    _, patched = await http.patch(f"{PODS}/p0", {"metadata": {"labels": {"x": "y"}}})
    seen.append(int(patched["metadata"]["resourceVersion"]))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    _, lst = await http.get(PODS)
    # The list's resourceVersion is the store's newest, even when it comes from another type.
    assert int(lst["metadata"]["resourceVersion"]) == seen[-1]
    assert lst["kind"] == "PodList"
    assert server.store.resource_version == seen[-1]


async def test_generation_bumps_on_spec_change_not_on_metadata_or_status(http: Http) -> None:
    await http.post(WIDGETS, widget("w", size=1))
    _, obj = await http.patch(f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}})
    assert obj["metadata"]["generation"] == 1
    _, obj = await http.patch(f"{WIDGETS}/w/status", {"status": {"ready": True}})
    assert obj["metadata"]["generation"] == 1
    _, obj = await http.patch(f"{WIDGETS}/w", {"spec": {"size": 2}})
    assert obj["metadata"]["generation"] == 2


async def test_duplicate_create_is_409_already_exists(http: Http) -> None:
    await http.post(PODS, pod("dup"))
    code, status = await http.post(PODS, pod("dup"))
    assert code == 409
    assert status["kind"] == "Status" and status["status"] == "Failure"
    assert status["reason"] == "AlreadyExists"
    assert status["details"] == {"name": "dup", "kind": "pods"}
    assert status["message"] == 'pods "dup" already exists'


async def test_get_of_missing_object_is_404_not_found_status(http: Http) -> None:
    code, status = await http.get(f"{WIDGETS}/nope")
    assert code == 404
    assert status == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'widgets.example.muster.dev "nope" not found', "reason": "NotFound",
        "code": 404, "details": {"name": "nope", "group": "example.muster.dev", "kind": "widgets"},
    }


async def test_put_with_stale_resource_version_is_409_conflict(http: Http) -> None:
    # A Widget, not a Pod: on a real cluster the scheduler writes a pod's status at once.
    _, obj = await http.post(WIDGETS, widget("w"))
    stale = obj["metadata"]["resourceVersion"]
    obj["metadata"]["labels"] = {"v": "1"}
    code, fresh = await http.put(f"{WIDGETS}/w", obj)
    assert code == 200 and fresh["metadata"]["labels"] == {"v": "1"}
    obj["metadata"]["resourceVersion"] = stale
    code, status = await http.put(f"{WIDGETS}/w", obj)
    assert code == 409 and status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]


async def test_merge_patch_with_stale_resource_version_is_409_conflict(http: Http) -> None:
    # A Widget, not a Pod: on a real cluster the scheduler writes a pod's status at once.
    _, obj = await http.post(WIDGETS, widget("w"))
    rv = obj["metadata"]["resourceVersion"]
    code, _ = await http.patch(
        f"{WIDGETS}/w", {"metadata": {"labels": {"a": "1"}, "resourceVersion": rv}},
    )
    assert code == 200
    code, status = await http.patch(
        f"{WIDGETS}/w", {"metadata": {"labels": {"a": "2"}, "resourceVersion": rv}},
    )
    assert code == 409 and status["reason"] == "Conflict"


async def test_put_replaces_the_whole_object_and_keeps_server_fields(http: Http) -> None:
    _, obj = await http.post(WIDGETS, widget("w", size=1, color="red"))
    replacement = widget("w", size=5)
    replacement["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    code, new = await http.put(f"{WIDGETS}/w", replacement)
    assert code == 200
    assert new["spec"] == {"size": 5}
    assert new["metadata"]["uid"] == obj["metadata"]["uid"]
    assert new["metadata"]["creationTimestamp"] == obj["metadata"]["creationTimestamp"]


async def test_put_with_name_mismatch_is_400_bad_request(http: Http) -> None:
    await http.post(WIDGETS, widget("w"))
    code, status = await http.put(f"{WIDGETS}/w", widget("other"))
    assert code == 400 and status["reason"] == "BadRequest"


async def test_json_merge_patch_merges_maps_and_null_deletes(http: Http) -> None:
    await http.post(WIDGETS, widget("w", a=1, b={"c": 2, "d": 3}, items=[1, 2]))
    code, obj = await http.patch(f"{WIDGETS}/w", {"spec": {"a": None, "b": {"c": 9}, "items": [3]}})
    assert code == 200
    assert obj["spec"] == {"b": {"c": 9, "d": 3}, "items": [3]}


async def test_json_patch_rfc6902_operations(http: Http) -> None:
    await http.post(WIDGETS, widget("w", list=[1, 2], keep="x", old="y"))
    ops = [
        {"op": "add", "path": "/spec/list/-", "value": 3},
        {"op": "add", "path": "/spec/list/0", "value": 0},
        {"op": "replace", "path": "/spec/keep", "value": "z"},
        {"op": "remove", "path": "/spec/old"},
        {"op": "copy", "from": "/spec/keep", "path": "/spec/copied"},
        {"op": "move", "from": "/spec/copied", "path": "/spec/moved"},
        {"op": "test", "path": "/spec/moved", "value": "z"},
        {"op": "add", "path": "/spec/map", "value": {"a~b/c": "1"}},
    ]
    code, obj = await http.patch(f"{WIDGETS}/w", ops, "json")
    assert code == 200, obj
    assert obj["spec"] == {"list": [0, 1, 2, 3], "keep": "z", "moved": "z",
                           "map": {"a~b/c": "1"}}
    code, obj = await http.patch(
        f"{WIDGETS}/w", [{"op": "remove", "path": "/spec/map/a~0b~1c"}], "json",
    )
    assert code == 200 and obj["spec"]["map"] == {}


async def test_json_patch_failed_test_operation_is_422_and_changes_nothing(
    http: Http, server: SandboxServer,
) -> None:
    _, obj = await http.post(WIDGETS, widget("w", size=1))
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/spec/size", "value": 2},
    ]
    code, status = await http.patch(f"{WIDGETS}/w", ops, "json")
    assert code == 422 and status["kind"] == "Status"
    assert server.store.get("widgets", "w")["spec"] == {"size": 1}
    ops[0]["value"] = obj["metadata"]["resourceVersion"]
    code, obj = await http.patch(f"{WIDGETS}/w", ops, "json")
    assert code == 200 and obj["spec"]["size"] == 2


async def test_json_patch_on_missing_path_is_422(http: Http) -> None:
    await http.post(WIDGETS, widget("w"))
    code, _ = await http.patch(f"{WIDGETS}/w", [{"op": "remove", "path": "/spec/none"}], "json")
    assert code == 422


@pytest.mark.sandbox_approximation(
    "a real server puts the patch's new finalizers first; the sandbox appends them")
async def test_strategic_merge_patch_merges_containers_by_name_and_finalizers_as_set(
    http: Http,
) -> None:
    body = pod("p")
    body["spec"]["containers"].append({"name": "side", "image": "a"})
    body["metadata"]["finalizers"] = ["a.example/f"]
    await http.post(PODS, body)
    patch = {
        "metadata": {"finalizers": ["b.example/f"]},
        "spec": {"containers": [{"name": "side", "image": "b"}],
                 "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}]},
    }
    code, obj = await http.patch(f"{PODS}/p", patch, "strategic")
    assert code == 200, obj
    assert obj["metadata"]["finalizers"] == ["a.example/f", "b.example/f"]
    assert [(c["name"], c["image"]) for c in obj["spec"]["containers"]] == [
        ("main", "busybox"), ("side", "b")]
    patch = {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}
    code, obj = await http.patch(f"{PODS}/p", patch, "strategic")
    assert [c["name"] for c in obj["spec"]["containers"]] == ["main"]
    patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example/f"]}}
    code, obj = await http.patch(f"{PODS}/p", patch, "strategic")
    assert obj["metadata"]["finalizers"] == ["b.example/f"]


async def test_strategic_merge_patch_on_custom_resource_is_415(http: Http) -> None:
    await http.post(WIDGETS, widget("w"))
    code, status = await http.patch(f"{WIDGETS}/w", {"spec": {"a": 1}}, "strategic")
    assert code == 415 and status["reason"] == "UnsupportedMediaType"


async def test_server_side_apply_creates_then_merges_list_map_conditions_by_type(
    http: Http,
) -> None:
    doc = (
        "apiVersion: example.muster.dev/v1\nkind: Widget\nmetadata:\n  name: w\n"
        "spec:\n  size: 1\n"
    )
    code, obj = await http.patch(f"{WIDGETS}/w", doc, "apply", fieldManager="alice")
    assert code == 201 and obj["spec"] == {"size": 1}
    assert obj["metadata"]["managedFields"][0]["manager"] == "alice"
    cond = {**_WIDGET_TYPE, "metadata": {"name": "w"},
            "status": {"conditions": [{"type": "Accepted", "status": "True"}]}}
    code, _ = await http.patch(
        f"{WIDGETS}/w/status", cond, "apply", fieldManager="ctrl", force="true",
    )
    assert code == 200
    cond = {**_WIDGET_TYPE, "metadata": {"name": "w"},
            "status": {"conditions": [{"type": "Provisioned", "status": "False"}]}}
    code, obj = await http.patch(
        f"{WIDGETS}/w/status", cond, "apply", fieldManager="other", force="true",
    )
    assert code == 200
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Accepted", "Provisioned"]
    cond = {**_WIDGET_TYPE, "metadata": {"name": "w"},
            "status": {"conditions": [{"type": "Accepted", "status": "False"}]}}
    _, obj = await http.patch(f"{WIDGETS}/w/status", cond, "apply", fieldManager="ctrl")
    assert {c["type"]: c["status"] for c in obj["status"]["conditions"]} == {
        "Accepted": "False", "Provisioned": "False"}
    managers = sorted(e["manager"] for e in obj["metadata"]["managedFields"])
    assert managers == ["alice", "ctrl", "other"]


async def test_server_side_apply_requires_a_field_manager(http: Http) -> None:
    code, status = await http.patch(f"{WIDGETS}/w", {"spec": {}}, "apply")
    assert code == 422 and "fieldManager" in status["message"]


async def test_status_subresource_changes_only_status(http: Http) -> None:
    await http.post(WIDGETS, widget("w", size=1))
    body = {"spec": {"size": 99}, "status": {"phase": "Ready"},
            "metadata": {"labels": {"sneaky": "yes"}}}
    code, obj = await http.patch(f"{WIDGETS}/w/status", body)
    assert code == 200
    assert obj["status"] == {"phase": "Ready"}
    assert obj["spec"] == {"size": 1}
    assert "labels" not in obj["metadata"]


async def test_main_resource_ignores_status_when_status_subresource_is_declared(
    http: Http,
) -> None:
    await http.post(WIDGETS, {**widget("w", size=1), "status": {"phase": "Forged"}})
    _, obj = await http.get(f"{WIDGETS}/w")
    assert "status" not in obj
    code, obj = await http.patch(f"{WIDGETS}/w", {"spec": {"size": 2}, "status": {"x": 1}})
    assert code == 200 and obj["spec"] == {"size": 2} and "status" not in obj
    obj["status"] = {"x": 2}
    code, obj = await http.put(f"{WIDGETS}/w", obj)
    assert code == 200 and "status" not in obj


async def test_without_status_subresource_status_is_a_plain_field(http: Http) -> None:
    code, obj = await http.post(
        "/apis/example.muster.dev/v1/gadgets",
        {"apiVersion": "example.muster.dev/v1", "kind": "Gadget",
         "metadata": {"name": "g"}, "status": {"ok": True}},
    )
    assert code == 201 and obj["status"] == {"ok": True}
    code, _ = await http.patch("/apis/example.muster.dev/v1/gadgets/g/status", {"status": {}})
    assert code == 404


async def test_no_op_write_keeps_resource_version_and_emits_no_event(
    http: Http, server: SandboxServer,
) -> None:
    _, obj = await http.post(WIDGETS, widget("w", size=1))
    before = server.store.resource_version
    _, same = await http.patch(f"{WIDGETS}/w", {"spec": {"size": 1}})
    assert same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert server.store.resource_version == before


async def test_dry_run_validates_without_persisting(http: Http, server: SandboxServer) -> None:
    code, obj = await http.request("POST", PODS, pod("dry"), params={"dryRun": "All"})
    assert code == 201 and obj["metadata"]["name"] == "dry"
    code, _ = await http.get(f"{PODS}/dry")
    assert code == 404


async def test_namespaced_create_requires_an_existing_namespace(http: Http) -> None:
    code, status = await http.post("/api/v1/namespaces/missing/pods", pod("p", "missing"))
    assert code == 404 and status["message"] == 'namespaces "missing" not found'
    for ns in ("default", "kube-system"):
        code, _ = await http.get(f"/api/v1/namespaces/{ns}")
        assert code == 200


async def test_namespace_in_body_must_match_the_url(http: Http) -> None:
    code, status = await http.post(PODS, pod("p", "kube-system"))
    assert code == 400 and status["reason"] == "BadRequest"


async def test_invalid_name_is_422_invalid(http: Http) -> None:
    code, status = await http.post(PODS, pod("Not_Valid"))
    assert code == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "metadata.name"


async def test_malformed_json_body_is_400(http: Http) -> None:
    code, status = await http.request("POST", PODS, "{not json")
    assert code == 400 and status["reason"] == "BadRequest"


async def test_unknown_resource_path_is_404(http: Http) -> None:
    code, _ = await http.get("/api/v1/namespaces/default/nonsense")
    assert code == 404
    code, _ = await http.get("/apis/nope.example/v1/things")
    assert code == 404


def test_in_process_store_reports_errors_as_api_errors(server: SandboxServer) -> None:
    store = server.store
    store.create("pods", pod("p"))
    try:
        store.create("pods", pod("p"))
    except ApiError as err:
        assert err.code == 409 and err.reason == "AlreadyExists"
    else:
        raise AssertionError("duplicate create did not fail")
    copy_ = store.get("pods", "p")
    copy_["metadata"]["labels"]["mutated"] = "yes"
    assert "mutated" not in store.get("pods", "p")["metadata"]["labels"]


@pytest.mark.sandbox_approximation(
    "the sandbox decodes no protobuf and says 415; a real server decodes it and answers 400 "
    "for a malformed body")
async def test_protobuf_request_bodies_are_415_unsupported_media_type(http: Http) -> None:
    code, status = await http.request(
        "POST", PODS, b"k8s\x00...", content_type="application/vnd.kubernetes.protobuf")
    assert code == 415 and status["reason"] == "UnsupportedMediaType"


async def test_stale_resource_version_conflicts_for_every_patch_type(http: Http) -> None:
    """Optimistic concurrency also holds for strategic merge, JSON patch (replacing
    metadata.resourceVersion) and apply bodies that carry a resourceVersion."""
    _, obj = await http.post(PODS, pod("p"))
    stale = obj["metadata"]["resourceVersion"]
    await http.patch(f"{PODS}/p", {"metadata": {"labels": {"bump": "1"}}})
    code, _ = await http.patch(
        f"{PODS}/p", {"metadata": {"resourceVersion": stale, "labels": {"a": "1"}}}, "strategic")
    assert code == 409
    code, _ = await http.patch(
        f"{PODS}/p", [{"op": "replace", "path": "/metadata/resourceVersion", "value": stale}],
        "json")
    assert code == 409
    applied = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "resourceVersion": stale, "labels": {"a": "1"}}}
    code, _ = await http.patch(f"{PODS}/p", applied, "apply", fieldManager="m")
    assert code == 409


async def test_put_without_resource_version_is_an_unconditional_update(http: Http) -> None:
    # Built-in kinds allow it; a custom resource's PUT needs a resourceVersion (422) on a
    # real API server (listed in sandbox/README.md).
    cms = "/api/v1/namespaces/default/configmaps"
    await http.post(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "1"}})
    for rv in (None, ""):
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "2"}}
        if rv is not None:
            body["metadata"]["resourceVersion"] = rv
        code, obj = await http.put(f"{cms}/c", body)
        assert code == 200 and obj["data"] == {"a": "2"}
