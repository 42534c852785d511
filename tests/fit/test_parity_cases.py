"""The seeded case generator for the differential test against the real kube-scheduler
(e2e/parity_cases.py): enough cases across every field, valid objects, stable by seed, and
Muster's answer from ``muster fit``."""

from __future__ import annotations

import json
from collections import Counter

from controller.api.node import Node
from controller.api.pod import Pod, PodTemplate
from controller.api.provisioningrequest import ProvisioningRequest
from e2e.parity_cases import FIELDS, cases, muster_answer

CASES = cases(seed=0, count=500)


def test_at_least_500_cases_over_every_field() -> None:
    assert len(CASES) == 500
    assert len({c.id for c in CASES}) == 500
    seen = Counter(f for c in CASES for f in c.fields)
    assert {f: seen[f] for f in FIELDS if seen[f] < 20} == {}


def test_same_seed_same_cases_and_cases_stand_alone() -> None:
    again = cases(seed=0, count=30)
    assert [json.dumps(c.request_documents() + c.cluster_documents()) for c in again] == [
        json.dumps(c.request_documents() + c.cluster_documents()) for c in CASES[:30]]
    other = cases(seed=1, count=30)
    assert [c.cluster_documents() for c in other] != [c.cluster_documents() for c in again]


def test_objects_are_valid_kubernetes_json() -> None:
    for case in CASES[:200]:
        for node in case.nodes():
            Node.model_validate(node)
        for pod in [*case.running(), *case.pods()]:
            Pod.model_validate(pod)
        docs = case.request_documents()
        ProvisioningRequest.model_validate(docs[0])
        for t in docs[1:]:
            PodTemplate.model_validate(t)
        assert len(case.pods()) == sum(case.counts.values())
        assert all(p["spec"]["nodeSelector"]["parity.muster.dev/case"] == case.id
                   for p in case.pods())


def test_muster_answers_every_kind_of_case() -> None:
    answers = [muster_answer(c) for c in CASES[:66]]
    assert all(a.exit_code in (0, 1) for a in answers), [a.reasons for a in answers]
    kinds = Counter("refused" if a.refused else "fits" if a.fits else "nofit" for a in answers)
    assert kinds["fits"] and kinds["nofit"] and kinds["refused"]
    for case, answer in zip(CASES, answers, strict=False):
        if answer.fits:
            assert answer.plan is not None
            placed = sum(a["pods"] for a in answer.plan["assignments"])
            assert placed == sum(case.counts.values())


def test_muster_agrees_with_an_independent_reference_scheduler() -> None:
    """tests/fit/reference_scheduler.py searches every order of placing the pods through
    the default filters. Muster must never say "fits" where no order works; a single pod set
    that some order places, Muster places too (several pod sets compete in an order Muster
    does not control, so there it may be cautious)."""
    from tests.fit.reference_scheduler import gang_fits

    wrong, cautious = [], []
    for case in CASES[:150]:
        answer = muster_answer(case)
        if answer.refused:
            continue
        reference = gang_fits(case.nodes(), case.running(), case.pods())
        assert reference is not None, case.id
        if answer.fits and not reference:
            wrong.append(case.id)
        if reference and not answer.fits and "pod-sets" not in case.fields:
            cautious.append((case.id, answer.reasons))
    assert wrong == []
    assert cautious == []


# ---------------------------------------------------------------------------- new capacity


def test_provisioning_cases_cover_every_field_and_make_valid_nodes() -> None:
    from controller.api.capacitypool import CapacityPool
    from e2e.parity_cases import PROVISION_FIELDS, provision_cases

    many = provision_cases(seed=0, count=300)
    assert len({c.id for c in many}) == 300
    seen = Counter(f for c in many for f in c.fields)
    assert {f: seen[f] for f in PROVISION_FIELDS if seen[f] < 15} == {}
    for case in many[:40]:
        for pool in case.pools:
            CapacityPool.model_validate(pool)
        answer = muster_answer(case)
        for node in case.plan_nodes(answer):
            Node.model_validate(node)
            labels = node["metadata"]["labels"]
            # as the fake provider registers them, with what every kubelet sets
            assert labels["kubernetes.io/os"] == "linux" and labels["parity.muster.dev/case"]
            assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]


def test_provisioning_cases_agree_with_the_reference_scheduler() -> None:
    """Muster plans new nodes from the case's pools; the nodes of its plan are created as
    the fake provider would, and tests/fit/reference_scheduler.py searches every order of
    placing the gang's pods on them. When Muster finds no plan, the reference gets every
    node the pools may add: placing the gang there proves a plan existed. A refusal
    (Unsupported) or a template the API server refuses (InvalidParameters) is not judged."""
    from e2e.parity_cases import PROVISION_FIELDS, provision_cases
    from tests.fit.reference_scheduler import gang_fits

    wrong, cautious, judged = [], [], 0
    for case in provision_cases(seed=0, count=6 * len(PROVISION_FIELDS)):
        answer = muster_answer(case)
        if answer.refused or answer.exit_code == 2:
            continue
        reference = gang_fits([*case.nodes(), *case.plan_nodes(answer)], case.running(),
                              case.pods(), budget=50_000)
        assert reference is not None, case.id
        judged += 1
        if answer.fits and not reference:
            wrong.append(case.id)
        if reference and not answer.fits:
            cautious.append((case.id, answer.reasons))
    assert wrong == []
    assert cautious == []
    assert judged >= 4 * len(PROVISION_FIELDS)
