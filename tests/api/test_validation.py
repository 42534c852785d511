"""The API server's rules for PodTemplates (controller.api.validation), on every path that
plans from a template: refused with the field named, never planned."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controller.api.pod import PodTemplate
from controller.api.validation import label_value, pod_template_problems, qualified_name
from controller.inputs.snapshot import InvalidTemplate, request_from_documents


def template(spec: dict[str, Any], labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t", "namespace": "ns"},
            "template": {"metadata": {"labels": labels or {}, "annotations": annotations or {}},
                         "spec": spec}}


def container(requests: dict[str, str], limits: dict[str, str] | None = None,
              **extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "resources": {"requests": requests,
                                                       "limits": limits or {}}}], **extra}


def problems(doc: dict[str, Any]) -> list[str]:
    return pod_template_problems(PodTemplate.model_validate(doc))


@pytest.mark.parametrize("spec, field", [
    (container({"nvidia.com/gpu": "1"}), "limits[nvidia.com/gpu]: must be set"),
    (container({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}),
     "requests[nvidia.com/gpu]: must be equal to the limit"),
    (container({"nvidia.com/gpu": "500m"}, {"nvidia.com/gpu": "500m"}), "must be an integer"),
    (container({"cpu": "2"}, {"cpu": "1"}), "requests[cpu]: must be less than or equal"),
    (container({"gpu": "1"}, {"gpu": "1"}), "requests[gpu]: invalid resource name"),
    (container({"hugepages-2Mi": "2Mi"}), "limits[hugepages-2Mi]: must be set"),
    (container({}, nodeSelector={"bad key!": "x"}), "nodeSelector: invalid label key"),
    (container({}, nodeSelector={"k": "-x"}), "nodeSelector: invalid label value"),
    (container({}, tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule",
                                 "tolerationSeconds": 5}]), "must be NoExecute"),
    (container({}, resourceClaims=[{"name": "gpu"}]), "exactly one of resourceClaimName"),
    ({"containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]},
     "resources.claims[0].name: 'gpu' is not one of the pod's spec.resourceClaims"),
    (container({}, topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}] * 2),
     "duplicate topologyKey zone"),
    (container({}, affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "a b"}}, "topologyKey": "h"}]}}),
     "labelSelector.matchLabels: invalid label value 'a b'"),
    # Pod-level requests below what the containers ask together, an init container's peak
    # included (found by the scheduler oracle: the API server answered 422).
    (container({"cpu": "1"}, resources={"requests": {"cpu": "500m"}}),
     "resources.requests[cpu]: 500m must be greater than or equal to the containers'"),
    (container({"cpu": "1"}, resources={"requests": {"cpu": "2"}},
               initContainers=[{"name": "i", "resources": {"requests": {"cpu": "3"}}}]),
     "aggregate requests (3000m)"),
    ({"containers": [{"name": "m"}, {"name": "m"}]},
     "template.spec.containers[1].name: Duplicate value 'm'"),
    ({"containers": [{"name": "m"}], "initContainers": [{"name": "m"}]},
     "template.spec.initContainers[0].name: Duplicate value 'm'"),
    # Overhead is the RuntimeClass admission plugin's to set: without a runtimeClassName the
    # pods are refused (found by the scheduler oracle on new capacity).
    (container({"cpu": "1"}, overhead={"cpu": "100m"}),
     "spec.overhead: set without a runtimeClassName"),
    (container({"cpu": "1"}, overhead={"gpu": "1"}, runtimeClassName="kata"),
     "spec.overhead[gpu]: invalid resource name"),
])
def test_refused_like_the_api_server(spec: dict[str, Any], field: str) -> None:
    found = problems(template(spec))
    assert any(field in p for p in found), found


def test_overhead_with_a_runtime_class_is_accepted() -> None:
    assert problems(template(container({"cpu": "1"}, overhead={"cpu": "100m"},
                                       runtimeClassName="kata"))) == []


def test_valid_template_has_no_problem() -> None:
    spec = container({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"},
                     {"cpu": "2", "nvidia.com/gpu": "8"}, nodeSelector={"a.b/c": "d"})
    assert problems(template(spec, labels={"app": "w"})) == []


def request(tpl: dict[str, Any], count: int = 4) -> list[dict[str, Any]]:
    return [{"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
             "metadata": {"name": "r", "namespace": "ns"},
             "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                      "podSets": [{"podTemplateRef": {"name": "t"}, "count": count}]}}, tpl]


@pytest.mark.parametrize("annotations, message", [
    ({"muster.dev/required-topology": "rack", "muster.dev/preferred-topology": "block"},
     "are both set"),
    ({"kueue.x-k8s.io/podset-required-topology": "rack",
      "kueue.x-k8s.io/podset-unconstrained-topology": "true"},
     "must not contain more than one topology annotation"),
    # Kueue counts an annotation present whatever its value, and reads booleans as Go does.
    ({"kueue.x-k8s.io/podset-required-topology": "rack",
      "kueue.x-k8s.io/podset-unconstrained-topology": "T"},
     "must not contain more than one topology annotation"),
    ({"kueue.x-k8s.io/podset-preferred-topology": "rack",
      "kueue.x-k8s.io/podset-unconstrained-topology": "false"},
     "must not contain more than one topology annotation"),
    ({"kueue.x-k8s.io/podset-unconstrained-topology": "yes"},
     "metadata.annotations[kueue.x-k8s.io/podset-unconstrained-topology]: must be a boolean"),
    ({"kueue.x-k8s.io/podset-unconstrained-topology": "tRuE"},
     "metadata.annotations[kueue.x-k8s.io/podset-unconstrained-topology]: must be a boolean"),
    ({"kueue.x-k8s.io/podset-required-topology": ""},
     "metadata.annotations[kueue.x-k8s.io/podset-required-topology]: must be a label name"),
    ({"kueue.x-k8s.io/podset-slice-required-topology": "rack",
      "kueue.x-k8s.io/podset-slice-size": " 2"},
     "metadata.annotations[kueue.x-k8s.io/podset-slice-size]: must be a numeric value"),
    ({"muster.dev/required-topology": "rack",
      "kueue.x-k8s.io/podset-unconstrained-topology": "1"}, "contradicts"),
    ({"muster.dev/required-topology": "rack",
      "kueue.x-k8s.io/podset-required-topology": "block"}, "contradicts"),
    ({"kueue.x-k8s.io/podset-slice-required-topology": "rack",
      "kueue.x-k8s.io/podset-slice-size": "3"}, "3 does not divide spec.podSets[0].count 4"),
])
def test_contradictory_topology_fails_with_the_field(annotations: dict[str, str],
                                                     message: str) -> None:
    with pytest.raises(InvalidTemplate, match=message.replace("[", r"\[").replace("]", r"\]")):
        request_from_documents(request(template(container({}), annotations=annotations)))


@pytest.mark.parametrize("annotations", [
    {"kueue.x-k8s.io/podset-unconstrained-topology": "1"},
    {"kueue.x-k8s.io/podset-unconstrained-topology": "F"},
    {"muster.dev/required-topology": "rack",
     "kueue.x-k8s.io/podset-unconstrained-topology": "false"},
    {"kueue.x-k8s.io/podset-required-topology": "rack",
     "kueue.x-k8s.io/podset-slice-required-topology": "rack",
     "kueue.x-k8s.io/podset-slice-size": "+2"},
])
def test_values_kueue_accepts_are_accepted(annotations: dict[str, str]) -> None:
    request_from_documents(request(template(container({}), annotations=annotations)))


def test_a_negative_quantity_is_refused_as_the_field_it_is() -> None:
    # Reading the pods' requests fails on it too; the field must be named, not that.
    spec = container({"memory": "-1Gi"})
    with pytest.raises(InvalidTemplate, match=re.escape(
            "template.spec.containers[0].resources.requests[memory]: must be greater than "
            "or equal to 0")):
        request_from_documents(request(template(spec)))


def test_files_are_read_with_strict_field_validation() -> None:
    spec = container({}, nodeSelecter={"zone": "a"})
    with pytest.raises(InvalidTemplate, match=r"template.spec.nodeSelecter: unknown field"):
        request_from_documents(request(template(spec)))
    typo = {"containers": [{"name": "c", "resources": {"request": {"cpu": "1"}}}]}
    with pytest.raises(InvalidTemplate, match=r"resources.request: unknown field"):
        request_from_documents(request(template(typo)))


def test_request_files_are_read_strictly_too() -> None:
    from controller.inputs.snapshot import SnapshotError

    docs = request(template(container({})))
    docs[0]["spec"]["parameter"] = {"noRetry": "true"}
    with pytest.raises(SnapshotError, match=r"spec.parameter: unknown field"):
        request_from_documents(docs)


def reference_value(text: str) -> bool:
    """A label value, checked character by character."""
    if text == "":
        return True
    if len(text) > 63 or not (text[0].isascii() and text[0].isalnum()):
        return False
    if not (text[-1].isascii() and text[-1].isalnum()):
        return False
    return all(c.isascii() and (c.isalnum() or c in "-_.") for c in text)


@given(st.text(alphabet="aZ09-_./ é", max_size=70))
def test_label_values_as_the_api_server(text: str) -> None:
    assert label_value(text) == reference_value(text)
    if "/" not in text:
        assert qualified_name(text) == (text != "" and reference_value(text))


def reference_subdomain(text: str) -> bool:
    """IsDNS1123Subdomain, label by label."""
    if not 0 < len(text) <= 253:
        return False
    for label in text.split("."):
        if not label or not all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in label):
            return False
        if label[0] == "-" or label[-1] == "-":
            return False
    return True


def reference_qualified_name(text: str) -> bool:
    """apimachinery's IsQualifiedName: strings.Split on "/", one or two parts, a non-empty
    DNS-subdomain prefix, a name part as a label value but non-empty."""
    parts = text.split("/")
    if len(parts) == 2:
        if not parts[0] or not reference_subdomain(parts[0]):
            return False
    elif len(parts) != 1:
        return False
    return parts[-1] != "" and reference_value(parts[-1])


@given(st.text(alphabet="aZ09-_./ é", max_size=70))
@example("/rack")
@example("a.b/")
@example("x.io/rack")
def test_qualified_names_as_the_api_server(text: str) -> None:
    assert qualified_name(text) == reference_qualified_name(text), text
