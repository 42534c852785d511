"""Server-side apply field ownership: conflicts between Apply managers (409 unless force),
force moves ownership, a manager's dropped fields are removed, list-map items keyed by their
map keys, and managedFields recorded in the apiserver's fieldsV1 format."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import SandboxServer
from tests.sandbox.conftest import Http

WIDGETS = "/apis/example.muster.dev/v1/namespaces/default/widgets"


def _cfg(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.muster.dev/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": spec}


async def test_apply_conflicts_with_another_managers_field_unless_forced(http: Http) -> None:
    code, _ = await http.patch(f"{WIDGETS}/w", _cfg(size=1, color="red"), "apply",
                               fieldManager="alice")
    assert code == 201
    # Same value: shared ownership, no conflict.
    code, _ = await http.patch(f"{WIDGETS}/w", _cfg(size=1), "apply", fieldManager="bob")
    assert code == 200
    code, status = await http.patch(f"{WIDGETS}/w", _cfg(size=2), "apply", fieldManager="bob")
    assert code == 409 and status["reason"] == "Conflict"
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"',
         "field": ".spec.size"}]
    assert "Apply failed with 1 conflict" in status["message"]
    code, obj = await http.patch(f"{WIDGETS}/w", _cfg(size=2), "apply", fieldManager="bob",
                                 force="true")
    assert code == 200 and obj["spec"] == {"size": 2, "color": "red"}
    alice = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "alice")
    assert alice["fieldsV1"] == {"f:spec": {"f:color": {}}}
    # alice lost spec.size, so re-applying her old value conflicts now with bob.
    code, _ = await http.patch(f"{WIDGETS}/w", _cfg(size=1, color="red"), "apply",
                               fieldManager="alice")
    assert code == 409


async def test_apply_removes_fields_the_manager_no_longer_applies(http: Http) -> None:
    await http.patch(f"{WIDGETS}/w", _cfg(size=1, color="red", shape="round"), "apply",
                     fieldManager="alice")
    await http.patch(f"{WIDGETS}/w", _cfg(shape="round"), "apply", fieldManager="bob")
    code, obj = await http.patch(f"{WIDGETS}/w", _cfg(size=1), "apply", fieldManager="alice")
    assert code == 200
    # color was only alice's: removed. shape is also bob's: kept.
    assert obj["spec"] == {"size": 1, "shape": "round"}


async def test_apply_owns_list_map_items_by_key(server: SandboxServer, http: Http) -> None:
    await http.post(WIDGETS, {"metadata": {"name": "w"}, "spec": {}})

    def status(*types: str) -> dict[str, Any]:
        return {"apiVersion": "example.muster.dev/v1", "kind": "Widget",
                "metadata": {"name": "w"},
                "status": {"conditions": [{"type": t, "status": "True"} for t in types]}}

    await http.patch(f"{WIDGETS}/w/status", status("A", "B"), "apply", fieldManager="ctl")
    code, obj = await http.patch(f"{WIDGETS}/w/status", status("C"), "apply",
                                 fieldManager="other")
    assert [c["type"] for c in obj["status"]["conditions"]] == ["A", "B", "C"]
    entry = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "ctl")
    assert entry["subresource"] == "status"
    assert set(entry["fieldsV1"]["f:status"]["f:conditions"]) == {
        'k:{"type":"A"}', 'k:{"type":"B"}'}
    # ctl stops applying B: its item goes, other's C stays.
    code, obj = await http.patch(f"{WIDGETS}/w/status", status("A"), "apply", fieldManager="ctl")
    assert code == 200
    assert [c["type"] for c in obj["status"]["conditions"]] == ["A", "C"]


@pytest.mark.sandbox_approximation(
    "Update operations own no fields in the sandbox (sandbox/ssa.py); on a real server a field "
    "another manager set by PATCH makes apply conflict (409) unless forced")
async def test_update_operations_do_not_block_apply(http: Http) -> None:
    await http.patch(f"{WIDGETS}/w", _cfg(size=1), "apply", fieldManager="alice")
    code, _ = await http.patch(f"{WIDGETS}/w", {"spec": {"size": 5}})
    assert code == 200
    code, obj = await http.patch(f"{WIDGETS}/w", _cfg(size=1), "apply", fieldManager="alice")
    assert code == 200 and obj["spec"]["size"] == 1


async def test_apply_yaml_keeps_timestamps_as_strings(http: Http) -> None:
    doc = ("apiVersion: example.muster.dev/v1\nkind: Widget\nmetadata:\n  name: w\n"
           "spec:\n  since: 2026-01-01T00:00:00Z\n")
    code, obj = await http.patch(f"{WIDGETS}/w", doc, "apply", fieldManager="alice")
    assert code == 201 and obj["spec"]["since"] == "2026-01-01T00:00:00Z"


async def test_apply_with_invalid_yaml_is_400(http: Http) -> None:
    code, status = await http.patch(f"{WIDGETS}/w", "a: [b", "apply", fieldManager="alice")
    assert code == 400 and status["reason"] == "BadRequest"
