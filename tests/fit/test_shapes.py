"""The per-node rule: resources, nodeSelector, required node affinity, taints/tolerations."""

from __future__ import annotations

import pytest

from controller.fit import SelectorRequirement, SelectorTerm, Taint, Toleration, pods_that_fit
from controller.fit.shapes import requirement_matches, tolerates
from tests.builders import GPU, shape, term

NS = Taint("gpu", "a100", "NoSchedule")
NE = Taint("gpu", "a100", "NoExecute")
PNS = Taint("gpu", "a100", "PreferNoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param(Toleration("gpu", "Equal", "a100", "NoSchedule"), NS, True, id="equal-match"),
        pytest.param(Toleration("gpu", "Equal", "h100", "NoSchedule"), NS, False,
                     id="equal-other-value"),
        pytest.param(Toleration("gpu", "Exists", "", "NoSchedule"), NS, True, id="exists-key"),
        pytest.param(Toleration("other", "Exists"), NS, False, id="exists-other-key"),
        pytest.param(Toleration("", "Exists"), NE, True, id="empty-key-exists-tolerates-all"),
        pytest.param(Toleration("gpu", "Exists", "", "NoExecute"), NS, False,
                     id="effect-mismatch"),
        pytest.param(Toleration("gpu", "Equal", "a100", ""), NE, True, id="empty-effect-any"),
        pytest.param(Toleration("", "Exists", "", "NoSchedule"), NE, False,
                     id="wildcard-limited-to-effect"),
    ],
)
def test_tolerates(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


@pytest.mark.parametrize(
    ("operator", "values", "label", "expected"),
    [
        pytest.param("In", ("a", "b"), "b", True, id="in-hit"),
        pytest.param("In", ("a",), "c", False, id="in-miss"),
        pytest.param("In", ("a",), None, False, id="in-absent"),
        pytest.param("NotIn", ("a",), "c", True, id="notin-other"),
        pytest.param("NotIn", ("a",), "a", False, id="notin-hit"),
        pytest.param("NotIn", ("a",), None, True, id="notin-absent-matches"),
        pytest.param("Exists", (), "", True, id="exists-empty-value"),
        pytest.param("Exists", (), None, False, id="exists-absent"),
        pytest.param("DoesNotExist", (), None, True, id="dne-absent"),
        pytest.param("DoesNotExist", (), "x", False, id="dne-present"),
        pytest.param("Gt", ("4",), "5", True, id="gt-true"),
        pytest.param("Gt", ("4",), "4", False, id="gt-equal"),
        pytest.param("Gt", ("4",), "x", False, id="gt-not-int"),
        pytest.param("Lt", ("4",), "3", True, id="lt-true"),
        pytest.param("Lt", ("4",), None, False, id="lt-absent"),
        pytest.param("Bogus", ("4",), "3", False, id="unknown-operator"),
    ],
)
def test_requirement(operator: str, values: tuple[str, ...], label: str | None,
                     expected: bool) -> None:
    assert requirement_matches(SelectorRequirement("k", operator, values), label) is expected


@pytest.mark.parametrize(
    ("pod", "free", "labels", "taints", "expected"),
    [
        pytest.param(shape(gpu=2), {GPU: 8}, {}, (), 4, id="gpu-bound"),
        pytest.param(shape(gpu=2, cpu=3000), {GPU: 8, "cpu": 7000}, {}, (), 2, id="cpu-bound"),
        pytest.param(shape(gpu=2), {GPU: 1}, {}, (), 0, id="too-small"),
        pytest.param(shape(gpu=1), {"cpu": 1}, {}, (), 0, id="resource-missing"),
        pytest.param(shape(gpu=1, selector={"zone": "a"}), {GPU: 1}, {"zone": "a"}, (), 1,
                     id="selector-match"),
        pytest.param(shape(gpu=1, selector={"zone": "a"}), {GPU: 1}, {"zone": "b"}, (), 0,
                     id="selector-mismatch"),
        pytest.param(shape(gpu=1), {GPU: 1}, {}, (NS,), 0, id="noschedule-blocks"),
        pytest.param(shape(gpu=1), {GPU: 1}, {}, (NE,), 0, id="noexecute-blocks"),
        pytest.param(shape(gpu=1), {GPU: 1}, {}, (PNS,), 1, id="prefernoschedule-ignored"),
        pytest.param(shape(gpu=1, tolerations=(Toleration("gpu", "Exists"),)), {GPU: 1}, {},
                     (NS, NE), 1, id="tolerated"),
        pytest.param(shape(gpu=1, terms=(term(("zone", "In", ("a",))),
                                         term(("zone", "In", ("b",))))),
                     {GPU: 1}, {"zone": "b"}, (), 1, id="affinity-terms-ored"),
        pytest.param(shape(gpu=1, terms=(term(("zone", "In", ("a",)), ("tier", "Exists", ())),)),
                     {GPU: 1}, {"zone": "a"}, (), 0, id="affinity-expressions-anded"),
        pytest.param(shape(gpu=1, terms=(SelectorTerm(),)), {GPU: 1}, {}, (), 0,
                     id="empty-term-matches-nothing"),
    ],
)
def test_pods_that_fit(pod: object, free: dict[str, int], labels: dict[str, str],
                       taints: tuple[Taint, ...], expected: int) -> None:
    assert pods_that_fit(pod, free, labels, taints) == expected  # type: ignore[arg-type]


def test_match_fields_on_name_never_match_a_new_node() -> None:
    pod = shape(gpu=1, terms=(SelectorTerm(match_fields=(
        SelectorRequirement("metadata.name", "In", ("n1",)),)),))
    assert pods_that_fit(pod, {GPU: 1}, {}, (), node_name="n1") == 1
    assert pods_that_fit(pod, {GPU: 1}, {}, (), node_name="n2") == 0
    assert pods_that_fit(pod, {GPU: 1}, {}, (), node_name=None) == 0
