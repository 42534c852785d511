"""Kueue's admission-check rules as Muster applies them: names, flavor merging, the
condition-to-state table, podSetUpdates' additive-only rule, backoff and TAS assignments."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import ATOMIC_CLASS, CHECK_CAPACITY_CLASS, KueueConfig
from controller.kueue.decisions import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    MergeConflict,
    PodSetTarget,
    attempt_of,
    backoff_seconds,
    expand_topology_assignment,
    limit_object_name,
    merge_flavors,
    pod_set_updates,
    request_name,
    set_check_state,
    template_name,
    verdict,
)
from controller.kueue.models import AdmissionCheckState, ResourceFlavor, TopologyAssignment


def cond(type_: str, status: str = "True", message: str = "", reason: str = "R") -> dict[str, Any]:
    return {"type": type_, "status": status, "message": message, "reason": reason}


def judge(conditions: list[dict[str, Any]], **kw: Any) -> Any:
    args = {"attempt": 1, "retry_count": 0, "backoff_limit": 3, "backoff_base": 60,
            "backoff_max": 1800, "admitted": False, "active": True, "finished": False}
    args.update(kw)
    return verdict(conditions, **args)


def test_default_classes_match_the_request_reconciler() -> None:
    cfg = KueueConfig()
    assert cfg.provisioning_class == ATOMIC_CLASS
    assert cfg.check_capacity_class == CHECK_CAPACITY_CLASS


# ---------------------------------------------------------------------------- names


def test_request_and_template_names_follow_kueue() -> None:
    assert request_name("job-a-1f2e3", "muster-check", 2) == "job-a-1f2e3-muster-check-2"
    assert template_name("job-a-muster-check-1", "workers") == "ppt-job-a-muster-check-1-workers"
    assert attempt_of("job-a-muster-check-12", "job-a", "muster-check") == 12
    assert attempt_of("job-a-other-check-1", "job-a", "muster-check") is None
    assert attempt_of("job-a-muster-check-1x", "job-a", "muster-check") is None


def test_long_names_keep_247_chars_and_a_sha1_suffix() -> None:
    full = "w" * 240 + "-check-1"
    got = limit_object_name(full)
    assert len(got) == 253
    assert got == full[:247] + "-" + hashlib.sha1(full.encode()).hexdigest()[:5]
    assert limit_object_name("short") == "short"


@settings(max_examples=50)
@given(st.text(alphabet="abcdefghij-", min_size=1, max_size=400))
def test_limited_names_never_exceed_253(name: str) -> None:
    assert len(limit_object_name(name)) <= 253


# ---------------------------------------------------------------------------- templates


def flavor(name: str, labels: dict[str, str], tolerations: list[dict[str, str]] = ()) -> Any:
    return ResourceFlavor.model_validate({
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels, "tolerations": list(tolerations)},
    })


def test_flavor_labels_and_tolerations_merge_and_limits_become_requests() -> None:
    tpl = {"spec": {"nodeSelector": {"zone": "a"}, "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    out = merge_flavors(tpl, [flavor("h100", {"accel": "h100"},
                                     [{"key": "gpu", "operator": "Exists",
                                       "effect": "NoSchedule"}])], pod_set="w")
    assert out["spec"]["nodeSelector"] == {"zone": "a", "accel": "h100"}
    assert out["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert out["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert "nodeSelector" in tpl["spec"] and "tolerations" not in tpl["spec"], "input untouched"


def test_a_flavor_contradicting_the_template_selector_is_a_conflict() -> None:
    tpl = {"spec": {"nodeSelector": {"accel": "a100"}, "containers": []}}
    with pytest.raises(MergeConflict, match=r"accel=h100.*accel=a100"):
        merge_flavors(tpl, [flavor("h100", {"accel": "h100"})], pod_set="w")


# ---------------------------------------------------------------------------- states


def test_condition_table_in_kueue_order() -> None:
    assert judge([]).state == "Pending"
    accepted = [cond("Accepted"), cond("Provisioned", "False", "Acquiring 16 node(s)")]
    assert (judge(accepted).state, judge(accepted).message) == ("Pending", "Acquiring 16 node(s)")
    ready = judge([cond("Accepted"), cond("Provisioned", message="booked in rack b1-r2")])
    assert ready.state == "Ready" and ready.ready and ready.message == "booked in rack b1-r2"
    failed = judge([cond("Provisioned", "False"), cond("Failed", message="never fits")])
    assert failed.state == "Retry"
    assert failed.message == "Retrying after failure: never fits"
    assert failed.requeue_after_seconds == 60


def test_failed_after_the_backoff_limit_is_rejected_with_the_message() -> None:
    v = judge([cond("Failed", message="stock-out")], attempt=4, retry_count=3)
    assert (v.state, v.message) == ("Rejected", "stock-out")


def test_failures_no_retry_can_cure_reject_at_once_when_asked() -> None:
    conds = [cond("Failed", message="The request can never fit", reason="CapacityNeverFits")]
    assert judge(conds).state == "Retry", "Kueue's own controller retries every failure"
    v = judge(conds, reject_at_once={"CapacityNeverFits"})
    assert (v.state, v.message) == ("Rejected", "The request can never fit")
    assert judge([cond("Failed", reason="RetriesExhausted")],
                 reject_at_once={"CapacityNeverFits"}).state == "Retry"


def test_a_failed_request_of_an_attempt_already_retried_is_ignored() -> None:
    assert judge([cond("Failed")], attempt=1, retry_count=1).state == "Pending"


def test_booking_expired_retries_before_admission_and_is_ignored_after() -> None:
    conds = [cond("Provisioned"), cond("BookingExpired", message="expired")]
    before = judge(conds)
    assert before.state == "Retry" and before.message.startswith("Retrying after booking expired")
    assert judge(conds, admitted=True).state == "Ready"


def test_capacity_revoked_rejects_an_active_workload_even_when_admitted() -> None:
    conds = [cond("Provisioned"), cond("CapacityRevoked", message="nodes gone")]
    assert judge(conds, admitted=True).state == "Rejected"
    assert judge(conds, finished=True).state == "Ready"


def test_a_vanished_node_kueue_tas_placed_the_gang_on_is_left_to_kueue() -> None:
    """Kueue's TAS node-failure handling replaces the node or requeues the admitted
    Workload; before admission, Retry lets Kueue place it again. Only a vanished node:
    a revoked booking for any other reason still rejects."""
    vanished = [cond("Provisioned"), cond("CapacityRevoked", message="Booked node(s) "
                                          "disappeared: gpu-2", reason="BookedNodesVanished")]
    assert judge(vanished, admitted=True, placed_by_kueue=True).state == "Ready"
    before = judge(vanished, placed_by_kueue=True)
    assert before.state == "Retry" and before.requeue_after_seconds == 60
    assert before.message == ("Retrying after booked nodes vanished: Booked node(s) "
                              "disappeared: gpu-2")
    assert judge(vanished, attempt=4, retry_count=3, placed_by_kueue=True).state == "Rejected"
    assert judge(vanished, admitted=True).state == "Rejected", "Muster's own placement"
    stale = [cond("Provisioned"), cond("CapacityRevoked", reason="PodTemplateDeleted")]
    assert judge(stale, admitted=True, placed_by_kueue=True).state == "Rejected"
    # Drafted from an assignment naming a node that is gone: Kueue places it anew.
    gone = [cond("Failed", reason="CapacityNeverFits", message="main-2 on gpu-2: no node")]
    permanent = {"CapacityNeverFits", "InvalidParameters"}
    assert judge(gone, reject_at_once=permanent).state == "Rejected"
    assert judge(gone, reject_at_once=permanent, placed_by_kueue=True).state == "Retry"
    invalid = [cond("Failed", reason="InvalidParameters")]
    assert judge(invalid, reject_at_once=permanent, placed_by_kueue=True).state == "Rejected"


def test_a_node_kueue_tas_placed_the_gang_on_that_became_unusable_retries() -> None:
    """Tainted or cordoned is no node failure Kueue's TAS replaces: Retry, before and after
    admission, has Kueue place the gang again; Muster's own placement still rejects."""
    unusable = [cond("Provisioned"), cond("CapacityRevoked", message="gpu-2 (cordoned)",
                                          reason="BookedNodesUnusable")]
    for admitted in (False, True):
        got = judge(unusable, admitted=admitted, placed_by_kueue=True)
        assert got.state == "Retry", got
        assert got.message == "Retrying after booked nodes became unusable: gpu-2 (cordoned)"
    assert judge(unusable, admitted=True).state == "Rejected", "Muster's own placement"


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff_seconds(n, base=60, maximum=1800) for n in range(7)] == [
        60, 120, 240, 480, 960, 1800, 1800]


def test_writing_a_check_state_keeps_other_checks_entries_and_retry_count() -> None:
    other = {"name": "kueue-prov", "state": "Ready", "lastTransitionTime": "t0", "message": "ok",
             "podSetUpdates": [{"name": "main", "labels": {"a": "b"}}]}
    mine = {"name": "muster", "state": "Pending", "lastTransitionTime": "t0", "message": "",
            "retryCount": 2}
    out = set_check_state([other, mine], AdmissionCheckState(
        name="muster", state="Retry", message="x", requeueAfterSeconds=240), now="t1")
    assert out[0] == other
    assert out[1] == {"name": "muster", "state": "Retry", "lastTransitionTime": "t1",
                      "message": "x", "requeueAfterSeconds": 240, "retryCount": 2}
    same = set_check_state(out, AdmissionCheckState(
        name="muster", state="Retry", message="y", requeueAfterSeconds=240), now="t2")
    assert same[1]["lastTransitionTime"] == "t1", "only a state change moves the time"


# ---------------------------------------------------------------------------- podSetUpdates


def test_ready_updates_add_consume_annotations_selector_and_tolerations() -> None:
    tol = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    (u,) = pod_set_updates([PodSetTarget(
        name="workers", request="job-c-1", node_selector={"rack": "r2", "zone": "a"},
        tolerations=[tol], existing_selector={"zone": "a"},
    )], "atomic-provisioning.muster.dev")
    assert u.annotations == {CONSUME_ANNOTATION: "job-c-1",
                             CLASS_ANNOTATION: "atomic-provisioning.muster.dev"}
    assert u.node_selector == {"rack": "r2"}, "keys the pod set already has are not repeated"
    assert u.tolerations == [tol]


def test_an_update_changing_the_workloads_own_selector_is_a_conflict() -> None:
    with pytest.raises(MergeConflict, match=r"pod set workers: nodeSelector rack=r1"):
        pod_set_updates([PodSetTarget(name="workers", request="r", node_selector={"rack": "r2"},
                                      existing_selector={"rack": "r1"})], "c")


# ---------------------------------------------------------------------------- TAS


def test_v1beta2_topology_assignment_expands_to_domains() -> None:
    ta = TopologyAssignment.model_validate({
        "levels": ["block", "rack"],
        "slices": [{"domainCount": 2,
                    "valuesPerLevel": [{"universal": "b1"},
                                       {"individual": {"prefix": "rack-", "roots": ["1", "2"]}}],
                    "podCounts": {"individual": [4, 2]}}],
    })
    assert expand_topology_assignment(ta) == [
        ({"block": "b1", "rack": "rack-1"}, 4), ({"block": "b1", "rack": "rack-2"}, 2)]


def test_a_malformed_topology_assignment_names_the_slice() -> None:
    ta = TopologyAssignment.model_validate({
        "levels": ["rack"],
        "slices": [{"domainCount": 3, "valuesPerLevel": [{"individual": {"roots": ["1"]}}],
                    "podCounts": {"universal": 1}}],
    })
    with pytest.raises(ValueError, match=r"slice 0 level 0: 1 roots for domainCount 3"):
        expand_topology_assignment(ta)


_keys = st.sampled_from(["rack", "block", "zone", "accel"])
_vals = st.sampled_from(["a", "b", "c"])


@settings(max_examples=60)
@given(st.dictionaries(_keys, _vals), st.dictionaries(_keys, _vals))
def test_updates_only_add_or_refuse(existing: dict[str, str], domain: dict[str, str]) -> None:
    target = PodSetTarget(name="p", request="r", node_selector=domain,
                          existing_selector=existing)
    try:
        (u,) = pod_set_updates([target], "c")
    except MergeConflict:
        assert any(k in existing and existing[k] != v for k, v in domain.items())
        return
    merged = {**existing, **u.node_selector}
    assert {k: merged[k] for k in existing} == existing, "no existing key changes"
    assert {k: merged[k] for k in domain} == domain, "the pod set lands in the domain"


@settings(max_examples=60)
@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True),
       st.sampled_from(["a", "b", "c", "d"]),
       st.sampled_from(["Pending", "Ready", "Retry", "Rejected"]))
def test_a_check_write_never_touches_other_entries(names: list[str], mine: str,
                                                   state: str) -> None:
    entries = [{"name": n, "state": "Pending", "lastTransitionTime": "t0",
                "message": f"{n}'s"} for n in names]
    out = set_check_state(entries, AdmissionCheckState(name=mine, state=state),  # type: ignore[arg-type]
                          now="t1")
    assert [e for e in out if e["name"] != mine] == [e for e in entries if e["name"] != mine]
    assert [e["name"] for e in out].count(mine) == 1
