"""API models: upstream field names, limits, round-tripping, effective pod requests."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controller.api.node import Node
from controller.api.pod import PodSpec, PodTemplate
from controller.api.provisioningrequest import ProvisioningRequest


def pr(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": "tpl"}, "count": 2}],
    }
    base.update(spec)
    return {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": "r", "namespace": "ns"}, "spec": base}


def test_provisioning_request_parses_upstream_names() -> None:
    obj = ProvisioningRequest.model_validate(pr(parameters={"noRetry": "true"}))
    assert obj.spec.pod_sets[0].pod_template_ref.name == "tpl"
    assert obj.spec.pod_sets[0].count == 2
    assert obj.spec.parameters == {"noRetry": "true"}
    dumped = obj.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["podSets"][0]["podTemplateRef"]["name"] == "tpl"
    assert dumped["spec"]["provisioningClassName"].startswith("check-capacity")


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        pytest.param({"podSets": []}, ("spec", "podSets"), id="no-pod-sets"),
        pytest.param({"podSets": [{"podTemplateRef": {"name": "t"}, "count": 1}] * 33},
                     ("spec", "podSets"), id="33-pod-sets"),
        pytest.param({"podSets": [{"podTemplateRef": {"name": "t"}, "count": 0}]},
                     ("spec", "podSets", 0, "count"), id="count-zero"),
        pytest.param({"podSets": [{"podTemplateRef": {"name": "Bad_Name"}, "count": 1}]},
                     ("spec", "podSets", 0, "podTemplateRef", "name"), id="template-not-dns"),
        pytest.param({"parameters": {f"k{i}": "v" for i in range(101)}},
                     ("spec", "parameters"), id="101-parameters"),
        pytest.param({"parameters": {"k": "x" * 256}}, ("spec", "parameters"),
                     id="parameter-too-long"),
        pytest.param({"provisioningClassName": ""}, ("spec", "provisioningClassName"),
                     id="empty-class"),
    ],
)
def test_provisioning_request_limits(spec: dict[str, Any], where: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as err:
        ProvisioningRequest.model_validate(pr(**spec))
    assert err.value.errors()[0]["loc"] == where


def test_status_details_limit() -> None:
    body = pr()
    body["status"] = {"provisioningClassDetails": {f"k{i}": "v" for i in range(65)}}
    with pytest.raises(ValidationError):
        ProvisioningRequest.model_validate(body)


def test_unknown_fields_round_trip() -> None:
    body = pr()
    body["metadata"]["ownerReferences"] = [{"kind": "Workload", "name": "w"}]
    body["extra"] = {"kept": True}
    dumped = ProvisioningRequest.model_validate(body).model_dump(by_alias=True)
    assert dumped["metadata"]["ownerReferences"] == [{"kind": "Workload", "name": "w"}]
    assert dumped["extra"] == {"kept": True}


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
              restart: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "img",
                         "resources": {"requests": requests or {}, "limits": limits or {}}}
    if restart:
        c["restartPolicy"] = restart
    return c


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [container({"cpu": "1"}), container({"cpu": "500m"})]},
                     {"cpu": 1500}, id="containers-sum"),
        pytest.param({"containers": [container(limits={"nvidia.com/gpu": "8"})]},
                     {"nvidia.com/gpu": 8}, id="limits-default-requests"),
        pytest.param({"containers": [container({"cpu": "1"}, {"cpu": "4"})]},
                     {"cpu": 1000}, id="requests-win-over-limits"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "3"})]},
                     {"cpu": 3000}, id="init-container-peak"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "500m"}, restart="Always"),
                                         container({"cpu": "2"})]},
                     {"cpu": 2500}, id="sidecar-runs-beside-later-init"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "500m"}, restart="Always")]},
                     {"cpu": 1500}, id="sidecar-counts-as-regular"),
        pytest.param({"containers": [container({"memory": "1Gi"})],
                      "overhead": {"memory": "128Mi"}},
                     {"memory": 2**30 + 128 * 2**20}, id="overhead-added"),
    ],
)
def test_effective_requests(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert PodSpec.model_validate(spec).effective_requests() == expected


@pytest.mark.parametrize(
    ("affinity", "fragment"),
    [
        pytest.param({"key": "k", "operator": "In", "values": []}, "at least one value",
                     id="in-needs-values"),
        pytest.param({"key": "k", "operator": "Exists", "values": ["x"]}, "takes no values",
                     id="exists-no-values"),
        pytest.param({"key": "k", "operator": "Gt", "values": ["x"]}, "integer",
                     id="gt-needs-int"),
        pytest.param({"key": "k", "operator": "Near", "values": ["x"]}, "Input should be",
                     id="unknown-operator"),
    ],
)
def test_node_affinity_validation(affinity: dict[str, Any], fragment: str) -> None:
    spec = {"containers": [container()], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [affinity]}]}}}}
    with pytest.raises(ValidationError, match=fragment):
        PodSpec.model_validate(spec)


def test_bad_quantity_in_template_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="invalid quantity 'lots'"):
        PodTemplate.model_validate({"metadata": {"name": "t"}, "template": {"spec": {
            "containers": [container({"memory": "lots"})]}}})


@pytest.mark.parametrize(
    ("node", "schedulable"),
    [
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True,
                     id="ready"),
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False,
                     id="not-ready"),
        pytest.param({"status": {}}, False, id="no-ready-condition"),
        pytest.param({"spec": {"unschedulable": True},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, False,
                     id="cordoned"),
    ],
)
def test_node_schedulable(node: dict[str, Any], schedulable: bool) -> None:
    obj = Node.model_validate({"metadata": {"name": "n"}, **node})
    assert obj.schedulable is schedulable


def test_node_fields() -> None:
    obj = Node.model_validate({
        "metadata": {"name": "n", "labels": {"a": "b"}},
        "spec": {"providerID": "aws:///i-1", "taints": [{"key": "k", "effect": "NoExecute"}]},
        "status": {"capacity": {"cpu": "4"}, "nodeInfo": {"kernelVersion": "6"}},
    })
    assert obj.spec.provider_id == "aws:///i-1"
    assert obj.allocatable() == {"cpu": "4"}  # capacity when allocatable is missing
    assert obj.model_dump(by_alias=True)["status"]["nodeInfo"] == {"kernelVersion": "6"}


def test_a_pools_registration_budget_is_at_least_its_expected_ready_time() -> None:
    from controller.api.capacitypool import CapacityPool
    from controller.commands import objects

    body = objects.gpu_pool("gpu")
    body["spec"].update(expectedReadySeconds=300, registrationTimeoutSeconds=600)
    assert CapacityPool.model_validate(body).spec.registration_timeout_seconds == 600
    body["spec"]["registrationTimeoutSeconds"] = 60
    with pytest.raises(ValidationError, match="shorter than expectedReadySeconds"):
        CapacityPool.model_validate(body)
    del body["spec"]["registrationTimeoutSeconds"]
    assert CapacityPool.model_validate(body).spec.registration_timeout_seconds is None
