"""Node selection as the scheduler does it: Gt/Lt parse like Go's strconv.ParseInt,
``spec.nodeName`` pins a pod to an existing node, matchFields is validated as the API
server does."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.api.pod import PodSpec
from controller.fit import GangRequest, Mode, NoFit, Plan, PodSetRequest, PodShape, plan
from controller.fit.shapes import parse_int64, pods_that_fit, requirement_matches
from controller.fit.types import SelectorRequirement, Snapshot, Taint
from controller.inputs.snapshot import shape_of
from tests.builders import LEVELS, PoolB, node


def go_parse_int(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64), written from its documented rules."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or any(c not in "0123456789" for c in body):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@pytest.mark.parametrize("text", ["1_000", " 5", "5 ", "٣", "0x10", "", "+", "9" * 20, "1.0"])
def test_values_go_rejects_never_compare(text: str) -> None:
    assert parse_int64(text) is None
    req = SelectorRequirement("gen", "Gt", ("0",))
    assert not requirement_matches(req, text)


@given(st.text(alphabet="0123456789+-_ ٣.", max_size=22))
def test_parse_int64_is_go_parse_int(text: str) -> None:
    assert parse_int64(text) == go_parse_int(text)


@given(st.integers(-(2**64), 2**64), st.integers(-(2**64), 2**64))
def test_gt_lt_compare_as_int64(have: int, bound: int) -> None:
    in_range = all(-(2**63) <= v < 2**63 for v in (have, bound))
    gt = requirement_matches(SelectorRequirement("k", "Gt", (str(bound),)), str(have))
    lt = requirement_matches(SelectorRequirement("k", "Lt", (str(bound),)), str(have))
    assert gt == (in_range and have > bound)
    assert lt == (in_range and have < bound)


def spec(**fields: object) -> PodSpec:
    return PodSpec.model_validate({"containers": [{"name": "c"}], **fields})


def test_node_name_pins_the_pod_to_that_node() -> None:
    shape = shape_of(spec(nodeName="b"))
    assert shape.node_name == "b"
    snap = Snapshot((node("a"), node("b", free_gpus=0), node("c")), (), LEVELS)
    gang = GangRequest("ns/g", (PodSetRequest("w", 2, PodShape({"cpu": 1}, node_name="b")),))
    got = plan(gang, snap, Mode.CHECK)
    assert isinstance(got, Plan)
    assert {a.node for a in got.assignments} == {"b"}


def test_node_name_never_matches_a_new_node() -> None:
    pool = PoolB("p").domain("b0", "r0", 4)
    snap = Snapshot((node("a", free_cpu=0),), (pool.build(),), LEVELS)
    gang = GangRequest("ns/g", (PodSetRequest("w", 1, PodShape({"cpu": 1}, node_name="a")),))
    assert isinstance(plan(gang, snap, Mode.PROVISION), NoFit)


def test_node_name_skips_the_scheduler_taints_but_not_no_execute() -> None:
    """A pod with nodeName is admitted by the kubelet: NoSchedule taints (and the cordon)
    do not apply to it, NoExecute ones do."""
    shape = PodShape({"cpu": 1}, node_name="a")
    no_schedule = (Taint("dedicated", "x", "NoSchedule"),
                   Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"))
    assert pods_that_fit(shape, {"cpu": 4}, {}, no_schedule, node_name="a") == 4
    no_execute = (Taint("dedicated", "x", "NoExecute"),)
    assert pods_that_fit(shape, {"cpu": 4}, {}, no_execute, node_name="a") == 0


@pytest.mark.parametrize("field, message", [
    ({"key": "metadata.uid", "operator": "In", "values": ["x"]}, "only metadata.name"),
    ({"key": "metadata.name", "operator": "Exists"}, "only In and NotIn"),
    ({"key": "metadata.name", "operator": "In", "values": ["a", "b"]}, "exactly one value"),
])
def test_match_fields_validated_like_the_api_server(field: dict[str, object], message: str) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [field]}]}}}
    with pytest.raises(ValidationError, match=re.escape(message)):
        spec(affinity=affinity)


def test_gt_value_must_parse_as_int64() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gen", "operator": "Gt", "values": ["1_0"]}]}]}}}
    with pytest.raises(ValidationError, match="integer"):
        spec(affinity=affinity)
