"""The committed CapacityPool CRD is exactly what the model generates."""

from __future__ import annotations

import yaml

from controller.api.crdgen import CRD_PATH, build_crd, render


def test_committed_crd_matches_model() -> None:
    assert CRD_PATH.read_text() == render(), "run: python3 -m controller.api.crdgen"


def test_crd_shape() -> None:
    crd = yaml.safe_load(render())
    spec = crd["spec"]
    assert spec["scope"] == "Cluster"
    assert spec["names"]["shortNames"] == ["cpool"]
    (version,) = spec["versions"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Provider", "Valid", "Nodes", "Ready", "Booked", "Free-GPUs", "Provisionable", "Max",
        "Price", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    domain = status["domains"]["items"]["properties"]
    for name in ("nodes", "readyNodes", "bookedNodes", "inFlightNodes", "free", "freeNodes",
                 "provisionableNodes", "provisionable", "availableNodes", "stockOutUntil"):
        assert name in domain, name
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert props["parameters"]["x-kubernetes-preserve-unknown-fields"] is True
    assert props["maxNodes"]["type"] == "integer"


def test_schema_is_structural() -> None:
    # Structural: every node has a type (or preserves unknown fields), no $ref/anyOf left,
    # and properties never come with additionalProperties.
    def walk(node: object) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and "anyOf" not in node
            if "properties" in node:
                assert "additionalProperties" not in node
                assert node.get("type") == "object"
                for child in node["properties"].values():
                    assert "type" in child or child.get("x-kubernetes-preserve-unknown-fields")
                    walk(child)
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    walk(node[key])
    walk(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
